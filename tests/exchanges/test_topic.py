"""Tests for exchanges.topic: the contract, RabbitMQ's wildcard semantics, the trie and its cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zope.interface.verify import verifyObject

from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IRouter
from postroom.exchanges.testing import RouterContract, RoutingExample
from postroom.exchanges.topic import MAX_HASH_WILDCARDS, TopicExchangeType, TopicRouter, split_key


class TestTopicRouter(RouterContract):
    matching_key = RoutingExample("orders.*.#", {}, "orders.eu.created.late", None)

    @pytest.fixture
    def router(self) -> IRouter:
        return TopicExchangeType().new_router({})


def reference_words(key: str) -> list[str]:
    """RabbitMQ's split_topic_key: no words for "", else split on every dot."""
    if key == "":
        return []
    words, word = [], ""
    for char in key:
        if char == ".":
            words.append(word)
            word = ""
        else:
            word += char
    words.append(word)
    return words


def reference_matches(pattern: list[str], words: list[str]) -> bool:
    """A slow, obviously correct matcher: plain recursion over both word lists."""
    if not pattern:
        return not words
    first, rest = pattern[0], pattern[1:]
    if first == "#":
        return any(reference_matches(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (first == "*" or first == words[0]) and reference_matches(rest, words[1:])


def reference_route(bindings: set[tuple[str, str]], routing_key: str) -> set[str]:
    """Destinations of every (destination, binding key) pair whose key matches."""
    words = reference_words(routing_key)
    return {
        destination for destination, binding_key in bindings if reference_matches(reference_words(binding_key), words)
    }


# A small alphabet, so that generated binding and routing keys often match. Routing keys
# use "*" and "#" too: there they are literal words.
WORDS = st.sampled_from(["a", "b", "c", "", "*", "#"])
BINDING_KEYS = st.lists(WORDS, max_size=5).map(".".join)
ROUTING_KEYS = st.lists(WORDS, max_size=6).map(".".join)
DESTINATIONS = st.sampled_from(["q1", "q2", "q3"])
OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["bind", "unbind", "unbind_all"]), DESTINATIONS, BINDING_KEYS),
    max_size=30,
)


def test_reference_matcher_agrees_with_rabbitmq_examples() -> None:
    # Guards the oracle itself (examples from the RabbitMQ tutorial 5).
    assert reference_matches(["*", "orange", "*"], ["quick", "orange", "rabbit"])
    assert reference_matches(["lazy", "#"], ["lazy", "orange", "male", "rabbit"])
    assert not reference_matches(["*", "*", "rabbit"], ["quick", "orange", "male", "rabbit"])
    assert reference_words("a..b") == ["a", "", "b"]


@pytest.mark.parametrize(
    ("binding_key", "routing_key", "routed"),
    [
        # '#' matches zero or more words.
        ("#", "", True),
        ("#", "a", True),
        ("#", "a.b.c", True),
        ("#", ".", True),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "ab", False),
        ("a.#", "b.a", False),
        ("#.a", "a", True),
        ("#.a", "b.c.a", True),
        ("#.a", "a.b", False),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.b.b.c", True),
        ("a.#.c", "a.b.b", False),
        ("#.#", "", True),
        ("#.#", "a.b", True),
        ("#.a.#", "b.a.c", True),
        ("#.a.#", "b.c", False),
        # '*' matches exactly one word, possibly empty; "" has no words.
        ("*", "", False),
        ("*", "a", True),
        ("*", "a.b", False),
        ("*", ".", False),
        ("*.*", ".", True),
        ("a.*", "a.", True),
        ("a.*", "a", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.*.c", "a.b.b.c", False),
        ("*.#", "", False),
        ("*.#", "a", True),
        ("#.*", "a", True),
        ("#.*", "", False),
        # Literal words, empty words included.
        ("", "", True),
        ("", "a", False),
        ("a", "", False),
        ("a", "a", True),
        ("a", "A", False),
        ("a..b", "a..b", True),
        ("a..b", "a.b", False),
        ("a.*.b", "a..b", True),
        ("a.", "a", False),
        ("a.", "a.", True),
        ("#.", "", False),
        ("#.", ".", True),
        ("#.", "a.", True),
        # Wildcards are whole words only, and routing-key words are always literal.
        ("a*", "ab", False),
        ("a*", "a*", True),
        ("a#", "a.b", False),
        ("*", "*", True),
        ("#", "#", True),
        ("a", "*", False),
        ("a.#", "a.#", True),
        ("ü.*", "ü.🐇", True),
    ],
)
def test_matches_as_rabbitmq(binding_key: str, routing_key: str, routed: bool) -> None:
    router = TopicRouter()
    router.bind("q", binding_key, {})
    assert set(router.route(routing_key, None)) == ({"q"} if routed else set())
    assert reference_matches(reference_words(binding_key), reference_words(routing_key)) is routed


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", []),
        ("a", ["a"]),
        (".", ["", ""]),
        ("a.", ["a", ""]),
        ("a..b", ["a", "", "b"]),
        ("#.*", ["#", "*"]),
    ],
)
def test_split_key_splits_on_every_dot_and_empty_key_is_no_words(key: str, words: list[str]) -> None:
    assert split_key(key) == words


@settings(max_examples=300, deadline=None)
@given(binding_key=BINDING_KEYS, routing_key=ROUTING_KEYS)
def test_single_binding_routes_as_the_reference_matcher(binding_key: str, routing_key: str) -> None:
    router = TopicRouter()
    router.bind("q", binding_key, {})
    expected = reference_route({("q", binding_key)}, routing_key)
    assert set(router.route(routing_key, None)) == expected


@settings(max_examples=200, deadline=None)
@given(operations=OPERATIONS, routing_keys=st.lists(ROUTING_KEYS, min_size=1, max_size=6))
def test_binding_sets_route_as_the_reference_matcher(
    operations: list[tuple[str, str, str]], routing_keys: list[str]
) -> None:
    # A tiny route cache, so that it is filled, cleared and invalidated along the way.
    router = TopicRouter(route_cache_size=4)
    model: set[tuple[str, str]] = set()
    for operation, destination, binding_key in operations:
        if operation == "bind":
            assert router.bind(destination, binding_key, {}) is ((destination, binding_key) not in model)
            model.add((destination, binding_key))
        elif operation == "unbind":
            assert router.unbind(destination, binding_key, {}) is ((destination, binding_key) in model)
            model.discard((destination, binding_key))
        else:
            doomed = {binding for binding in model if binding[0] == destination}
            assert router.unbind_all(destination) == len(doomed)
            model -= doomed
        assert len(router) == len(model)
        for routing_key in routing_keys:
            routed = list(router.route(routing_key, None))
            assert len(routed) == len(set(routed)), "a destination was routed twice"
            assert set(routed) == reference_route(model, routing_key)
    for destination, binding_key in model:
        router.unbind(destination, binding_key, {})
    assert router.node_count() == 1


def test_destination_matched_by_two_bindings_is_routed_once() -> None:
    router = TopicRouter()
    router.bind("q", "a.*", {})
    router.bind("q", "#", {})
    router.bind("q", "a.b", {})
    assert list(router.route("a.b", None)) == ["q"]


def test_hash_wildcard_limit_refuses_longer_binding_keys() -> None:
    router = TopicRouter()
    allowed = ".".join(["#"] * MAX_HASH_WILDCARDS)
    assert router.bind("q", allowed, {}) is True
    too_many = ".".join(["#"] * (MAX_HASH_WILDCARDS + 1))
    with pytest.raises(BindingInvalid) as excinfo:
        router.bind("q", too_many, {})
    assert str(MAX_HASH_WILDCARDS) in str(excinfo.value)
    assert len(router) == 1
    assert [key for _destination, key, _arguments in router.bindings()] == [allowed]


def test_hash_wildcard_limit_counts_only_whole_hash_words() -> None:
    router = TopicRouter(max_hash_wildcards=1)
    assert router.bind("q", "#.a#.#a.##", {}) is True
    with pytest.raises(BindingInvalid):
        router.bind("q", "#.a.#", {})


def test_many_hash_wildcards_do_not_backtrack_exponentially() -> None:
    # A backtracking matcher tries C(words + hashes, hashes) splits before failing here
    # (about 10**13 for these sizes) and would not finish; ours visits each state once.
    router = TopicRouter()
    router.bind("miss", ".".join(["#"] * MAX_HASH_WILDCARDS + ["never"]), {})
    router.bind("hit", ".".join(["#", "a"] * (MAX_HASH_WILDCARDS // 2) + ["#"]), {})
    routing_key = ".".join(["a"] * 200)
    assert set(router.route(routing_key, None)) == {"hit"}
    assert set(router.route("." * 255, None)) == set()


def test_unbind_removes_emptied_trie_nodes_only() -> None:
    router = TopicRouter()
    assert router.node_count() == 1
    router.bind("q1", "a.b.c", {})
    router.bind("q2", "a.b.*.#", {})
    router.bind("q1", "a.b.c", {"x-other": 1})
    with_all = router.node_count()
    assert with_all == 6  # root, a, b, c, *, #
    router.unbind("q1", "a.b.c", {})
    assert router.node_count() == with_all  # the other binding to q1 still ends at c
    assert set(router.route("a.b.c", None)) == {"q1", "q2"}
    router.unbind("q1", "a.b.c", {"x-other": 1})
    assert router.node_count() == 5
    assert set(router.route("a.b.c", None)) == {"q2"}  # through "a.b.*.#", "#" matching no words
    router.unbind_all("q2")
    assert router.node_count() == 1


def test_route_cache_is_invalidated_by_bind() -> None:
    router = TopicRouter()
    assert set(router.route("a.b", None)) == set()
    router.bind("q", "a.*", {})
    assert set(router.route("a.b", None)) == {"q"}


def test_route_cache_is_invalidated_by_unbind() -> None:
    router = TopicRouter()
    router.bind("q", "a.*", {})
    assert set(router.route("a.b", None)) == {"q"}
    router.unbind("q", "a.*", {})
    assert set(router.route("a.b", None)) == set()


def test_route_cache_is_invalidated_by_unbind_all() -> None:
    router = TopicRouter()
    router.bind("q", "a.*", {})
    assert set(router.route("a.b", None)) == {"q"}
    router.unbind_all("q")
    assert set(router.route("a.b", None)) == set()


def test_route_cache_is_bounded_in_slots() -> None:
    router = TopicRouter(route_cache_size=8)
    router.bind("q1", "#", {})
    router.bind("q2", "#", {})
    for index in range(100):
        assert set(router.route(f"key.{index}", None)) == {"q1", "q2"}
        # Each entry costs 1 + 2 destinations: never more than 8 // 3 entries.
        assert len(router._cache) <= 2


def test_route_cache_skips_results_larger_than_itself() -> None:
    router = TopicRouter(route_cache_size=2)
    for name in ("q1", "q2", "q3"):
        router.bind(name, "#", {})
    assert set(router.route("a", None)) == {"q1", "q2", "q3"}
    assert router._cache == {}


def test_route_cache_can_be_disabled() -> None:
    router = TopicRouter(route_cache_size=0)
    router.bind("q", "a", {})
    assert set(router.route("a", None)) == {"q"}
    assert router._cache == {}


def test_headers_are_ignored() -> None:
    router = TopicRouter()
    router.bind("q", "a", {})
    assert set(router.route("a", {"a": 1})) == {"q"}
    assert router.needs_headers is False


def test_exchange_type_provides_iexchangetype() -> None:
    exchange_type = TopicExchangeType()
    assert verifyObject(IExchangeType, exchange_type)
    assert exchange_type.name == "topic"
    exchange_type.validate_arguments({"anything": 1})
    assert isinstance(exchange_type.new_router({}), TopicRouter)

"""Tests for exchanges.headers: the contract and RabbitMQ's rabbit_exchange_type_headers semantics."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zope.interface.verify import verifyObject

from postroom.exchanges.headers import HeadersExchangeType, HeadersRouter
from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IRouter
from postroom.exchanges.testing import RouterContract, RoutingExample


class TestHeadersRouter(RouterContract):
    matching_key = RoutingExample("", {"x-match": "all", "format": "pdf"}, "ignored", {"format": "pdf"})

    @pytest.fixture
    def router(self) -> IRouter:
        return HeadersExchangeType().new_router({})


class TestHeadersRouterWithAny(RouterContract):
    matching_key = RoutingExample("k", {"x-match": "any", "a": 1, "b": None}, "", {"b": "present"})

    @pytest.fixture
    def router(self) -> IRouter:
        return HeadersRouter()


def routes(arguments: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """Whether one binding with ``arguments`` routes a message with ``headers``."""
    router = HeadersRouter()
    router.bind("q", "", arguments)
    return set(router.route("", headers)) == {"q"}


NOW = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize(
    ("arguments", "headers", "routed"),
    [
        # x-match all (also the default): every non-x- argument must match.
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {}, False),
        ({"a": 1}, None, False),
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
        # all with nothing left to match matches every message.
        ({}, {}, True),
        ({}, None, True),
        ({"x-match": "all"}, {"anything": 1}, True),
        # x- arguments are ignored outside the -with-x modes.
        ({"x-match": "all", "x-foo": "bar"}, {}, True),
        ({"x-foo": "bar", "a": 1}, {"a": 1}, True),
        ({"x-match": "all", "x-foo": "bar", "a": 1}, {"a": 1, "x-foo": "other"}, True),
        # x-match any: one matching argument is enough.
        ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 1}, False),
        ({"x-match": "any", "a": 1}, None, False),
        # any with nothing to match matches no message.
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": "any"}, None, False),
        ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
        # all-with-x / any-with-x: x- arguments count, x-match itself never does.
        ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
        ({"x-match": "all-with-x", "x-foo": "bar"}, {}, False),
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar", "a": 1}, True),
        ({"x-match": "all-with-x"}, {}, True),
        ({"x-match": "all-with-x"}, {"x-match": "something else"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"a": 1}, True),
        ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
        ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
        # A void argument matches the header's presence, whatever its value.
        ({"a": None}, {"a": "whatever"}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"a": False}, True),
        ({"a": None}, {}, False),
        ({"a": None}, {"b": 1}, False),
        ({"x-match": "any", "a": None, "b": 1}, {"a": 0}, True),
        ({"a": None, "b": 1}, {"a": 0, "b": 2}, False),
        ({"a": 1}, {"a": None}, False),
        ({"a": ""}, {"a": None}, False),
        # Booleans never equal numbers (Erlang atoms), unlike Python's True == 1.
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": False}, {"a": 0}, False),
        ({"a": 0}, {"a": False}, False),
        ({"a": True}, {"a": True}, True),
        ({"a": False}, {"a": False}, True),
        ({"a": True}, {"a": False}, False),
        ({"x-match": "any", "a": 1}, {"a": True}, False),
        # Numbers compare by value (Erlang ==); decimals are a type of their own.
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1.5}, {"a": 1.5}, True),
        ({"a": 2**40}, {"a": 2**40}, True),
        ({"a": Decimal("1.5")}, {"a": Decimal("1.5")}, True),
        ({"a": Decimal("1")}, {"a": 1}, False),
        ({"a": 1.5}, {"a": Decimal("1.5")}, False),
        # Strings and byte arrays are both binaries to RabbitMQ: compared by bytes.
        ({"a": "x"}, {"a": "x"}, True),
        ({"a": "x"}, {"a": "X"}, False),
        ({"a": "x"}, {"a": b"x"}, True),
        ({"a": b"x"}, {"a": bytearray(b"x")}, True),
        ({"a": "ü"}, {"a": "ü".encode()}, True),
        ({"a": "1"}, {"a": 1}, False),
        ({"a": ""}, {"a": b""}, True),
        # Timestamps, tables and arrays.
        ({"a": NOW}, {"a": NOW}, True),
        ({"a": NOW}, {"a": NOW + datetime.timedelta(seconds=1)}, False),
        ({"a": [1, "x"]}, {"a": [1, "x"]}, True),
        ({"a": [1, "x"]}, {"a": ["x", 1]}, False),
        ({"a": [1]}, {"a": [True]}, False),
        ({"a": [1]}, {"a": [1, 1]}, False),
        ({"a": {"k": 1}}, {"a": {"k": 1}}, True),
        ({"a": {"k": 1}}, {"a": {"k": True}}, False),
        ({"a": {"k": 1}}, {"a": {"k": 1, "j": 2}}, False),
        ({"a": {"k": None}}, {"a": {"k": None}}, True),
        ({"a": {"k": None}}, {"a": {"k": 1}}, False),
        ({"a": [1]}, {"a": {"0": 1}}, False),
        # Awkward values are mismatches, never errors.
        ({"a": Decimal("1")}, {"a": Decimal("sNaN")}, False),
        ({"a": float("nan")}, {"a": float("nan")}, False),
        ({"a": NOW}, {"a": NOW.replace(tzinfo=None)}, False),
        # Header names are case-sensitive.
        ({"a": 1}, {"A": 1}, False),
    ],
)
def test_matches_as_rabbitmq(arguments: dict[str, Any], headers: dict[str, Any] | None, routed: bool) -> None:
    assert routes(arguments, headers) is routed


@pytest.mark.parametrize("x_match", ["bogus", "ALL", "", " all", "all ", 1, True, None, b"all", ["all"]])
def test_invalid_x_match_is_refused(x_match: Any) -> None:
    router = HeadersRouter()
    with pytest.raises(BindingInvalid) as excinfo:
        router.bind("q", "", {"x-match": x_match, "a": 1})
    assert "x-match" in str(excinfo.value)
    assert len(router) == 0
    assert list(router.bindings()) == []


def test_invalid_x_match_is_refused_even_when_another_binding_exists() -> None:
    router = HeadersRouter()
    router.bind("q", "", {"a": 1})
    with pytest.raises(BindingInvalid):
        router.bind("q", "", {"x-match": "some", "a": 1})
    assert len(router) == 1


def test_routing_key_is_part_of_identity_but_not_of_routing() -> None:
    router = HeadersRouter()
    assert router.bind("q", "one", {"a": 1}) is True
    assert router.bind("q", "two", {"a": 1}) is True
    assert list(router.route("three", {"a": 1})) == ["q"]
    router.unbind("q", "one", {"a": 1})
    assert list(router.route("", {"a": 1})) == ["q"]
    router.unbind("q", "two", {"a": 1})
    assert list(router.route("", {"a": 1})) == []


def test_destination_matched_by_two_bindings_is_routed_once() -> None:
    router = HeadersRouter()
    router.bind("q1", "", {"a": 1})
    router.bind("q1", "", {"b": 2})
    router.bind("q2", "", {"b": 2})
    routed = list(router.route("", {"a": 1, "b": 2}))
    assert len(routed) == 2
    assert set(routed) == {"q1", "q2"}


def test_router_needs_headers() -> None:
    assert HeadersRouter().needs_headers is True


def test_exchange_type_provides_iexchangetype() -> None:
    exchange_type = HeadersExchangeType()
    assert verifyObject(IExchangeType, exchange_type)
    assert exchange_type.name == "headers"
    exchange_type.validate_arguments({"x-match": "bogus"})  # a declare argument, not a binding one
    assert isinstance(exchange_type.new_router({}), HeadersRouter)


def reference_headers_match(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    """A transliteration of RabbitMQ's headers_match/5: a merge over both tables sorted by name."""
    kind = arguments.get("x-match", "all")
    match_all = kind in ("all", "all-with-x")
    with_x = kind in ("all-with-x", "any-with-x")
    pattern = sorted(arguments.items())
    data = sorted(headers.items())
    p = d = 0
    all_match, any_match = True, False
    while True:
        if match_all and not all_match:
            return False
        if not match_all and any_match:
            return True
        if p == len(pattern):
            return all_match if match_all else any_match
        name, expected = pattern[p]
        if name == "x-match" or (name.startswith("x-") and not with_x):
            p += 1
            continue
        if d == len(data):
            all_match = False  # no more data, but still bindings
            p = len(pattern)
            continue
        header, actual = data[d]
        if name > header:
            d += 1
        elif name < header:
            all_match = False
            p += 1
        else:
            if expected is None or erlang_equal(expected, actual):
                any_match = True
            else:
                all_match = False
            p += 1
            d += 1


def erlang_equal(left: Any, right: Any) -> bool:
    """Erlang == over the generated values: booleans are atoms, numbers compare by value."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    return bool(left == right)


NAMES = st.sampled_from(["a", "b", "c", "x-a", "x-b"])
VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=0, max_value=2), st.sampled_from([1.0, "a", "b"]))
X_MATCH = st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"])
HEADERS = st.dictionaries(st.one_of(NAMES, st.just("x-match")), VALUES, max_size=5)


@st.composite
def binding_arguments(draw: st.DrawFn) -> dict[str, Any]:
    arguments = draw(st.dictionaries(NAMES, VALUES, max_size=4))
    x_match = draw(X_MATCH)
    if x_match is not None:
        arguments["x-match"] = x_match
    return arguments


@settings(max_examples=300, deadline=None)
@given(arguments=binding_arguments(), headers=HEADERS)
def test_single_binding_routes_as_rabbitmq_merge_algorithm(arguments: dict[str, Any], headers: dict[str, Any]) -> None:
    assert routes(arguments, headers) is reference_headers_match(arguments, headers)


def typed(arguments: dict[str, Any]) -> tuple[tuple[str, str, Any], ...]:
    """A binding's arguments as AMQP sees them: each value with its type (1, 1.0 and True differ)."""
    return tuple(sorted((name, type(value).__name__, value) for name, value in arguments.items()))


@settings(max_examples=200, deadline=None)
@given(
    bindings=st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3"]), binding_arguments()), max_size=8),
    unbind_count=st.integers(min_value=0, max_value=8),
    messages=st.lists(HEADERS, min_size=1, max_size=4),
)
def test_binding_sets_route_as_rabbitmq_merge_algorithm(
    bindings: list[tuple[str, dict[str, Any]]], unbind_count: int, messages: list[dict[str, Any]]
) -> None:
    router = HeadersRouter()
    model: dict[tuple[str, Any], dict[str, Any]] = {}
    for destination, arguments in bindings:
        identity = (destination, typed(arguments))
        assert router.bind(destination, "", arguments) is (identity not in model)
        model[identity] = arguments
    for destination, arguments in bindings[:unbind_count]:
        identity = (destination, typed(arguments))
        assert router.unbind(destination, "", arguments) is (identity in model)
        model.pop(identity, None)
    assert len(router) == len(model)
    remaining = [(destination, arguments) for (destination, _typed), arguments in model.items()]
    for headers in messages:
        expected = {destination for destination, arguments in remaining if reference_headers_match(arguments, headers)}
        routed = list(router.route("", headers))
        assert set(routed) == expected
        assert len(routed) == len(set(routed))

"""The x-consistent-hash exchange: weights, spread, stability when bindings are added, errors."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from nodes import client
from pamqp import commands
from zope.interface.verify import verifyObject

from postroom.broker.errors import ChannelException, ReplyCode
from postroom.broker.interfaces import PluginSettingsInvalid
from postroom.broker.tools.testing import methods, publish_frames
from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IRouter
from postroom.exchanges.testing import RouterContract, RoutingExample
from postroom.plugins.consistent_hash import (
    ConsistentHashExchangeType,
    ConsistentHashPlugin,
    ConsistentHashRouter,
    jump_hash,
)

KEYS = [f"order-{i}" for i in range(20_000)]


def spread(router: ConsistentHashRouter, keys: list[str] = KEYS) -> Counter[Any]:
    return Counter(destination for key in keys for destination in router.route(key, None))


class TestConsistentHashRouter(RouterContract):
    """The shared contract, except where a hash exchange differs by design: one destination per
    message, and binding keys that are weights."""

    matching_key = RoutingExample("1", {}, "any key", None)

    @pytest.fixture
    def router(self) -> IRouter:
        exchange_type = ConsistentHashExchangeType()
        verifyObject(IExchangeType, exchange_type)
        return exchange_type.new_router({})

    def test_bound_destination_is_routed_and_unbound_is_not(self, router: IRouter) -> None:
        router.bind("q1", "1", {})
        assert set(router.route("k", None)) == {"q1"}
        router.bind("q2", "1", {})
        assert len(list(router.route("k", None))) == 1
        assert set(spread(router)) == {"q1", "q2"}

    def test_unbind_removes_the_binding(self, router: IRouter) -> None:
        router.bind("q1", "1", {})
        router.bind("q2", "1", {})
        assert router.unbind("q1", "1", {}) is True
        assert set(spread(router)) == {"q2"}
        assert router.unbind("q2", "1", {}) is True
        assert list(router.route("k", None)) == []

    def test_unbind_of_a_missing_binding_returns_false(self, router: IRouter) -> None:
        assert router.unbind("q1", "1", {}) is False
        router.bind("q1", "1", {})
        assert router.unbind("q2", "1", {}) is False
        assert router.unbind("q1", "2", {}) is False
        assert router.unbind("q1", "1", {"x-contract": 1}) is False
        assert router.unbind("q1", "1", {}) is True

    def test_unbind_all_removes_every_binding_of_the_destination(self, router: IRouter) -> None:
        router.bind("q1", "1", {})
        router.bind("q1", "1", {"x-contract": 1})
        router.bind("q1", "3", {})
        router.bind("q2", "1", {})
        assert router.unbind_all("q1") == 3
        assert len(router) == 1
        assert set(spread(router)) == {"q2"}

    def test_bindings_round_trip(self, router: IRouter) -> None:
        bound = [("q1", "1", {}), ("q2", "5", {}), (("exchange", "e1"), "2", {"x-contract": {"a": [1]}})]
        for destination, key, arguments in bound:
            router.bind(destination, key, arguments)
        assert list(router.bindings()) == bound
        for destination, key, arguments in bound:
            assert router.unbind(destination, key, arguments) is True
        assert len(router) == 0


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("", "must be an integer"),
        ("abc", "must be an integer"),
        ("1.5", "must be an integer"),
        (" 2", "must be an integer"),
        ("1_0", "must be an integer"),
        ("0", "must be greater than 0"),
        ("-3", "must be greater than 0"),
    ],
)
def test_a_binding_key_that_is_not_a_positive_integer_is_refused(key: str, text: str) -> None:
    router = ConsistentHashRouter()
    with pytest.raises(BindingInvalid) as excinfo:
        router.bind("q1", key, {})
    assert text in str(excinfo.value)
    assert len(router) == 0


def test_equal_weights_spread_keys_evenly_within_5_percent() -> None:
    router = ConsistentHashRouter()
    for queue in ("q1", "q2", "q3", "q4"):
        router.bind(queue, "10", {})
    counts = spread(router)
    # 20,000 keys over 4 queues: 5,000 each, binomial sd 61; 5% is 250 (4 sd).
    assert all(abs(count - 5_000) <= 250 for count in counts.values()), counts
    assert len(counts) == 4


def test_weights_set_the_share_of_each_binding() -> None:
    router = ConsistentHashRouter()
    for queue, weight in (("q1", 1), ("q2", 2), ("q3", 3), ("q4", 4)):
        router.bind(queue, str(weight), {})
    counts = spread(router)
    for queue, weight in (("q1", 1), ("q2", 2), ("q3", 3), ("q4", 4)):
        expected = len(KEYS) * weight / 10
        assert abs(counts[queue] - expected) <= 0.1 * expected, counts


def test_adding_a_binding_moves_keys_only_to_the_new_destination() -> None:
    router = ConsistentHashRouter()
    for queue in ("q1", "q2", "q3", "q4"):
        router.bind(queue, "5", {})
    before = {key: next(iter(router.route(key, None))) for key in KEYS}
    router.bind("q5", "5", {})
    after = {key: next(iter(router.route(key, None))) for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert {after[key] for key in moved} == {"q5"}
    assert abs(len(moved) - len(KEYS) / 5) <= 0.05 * len(KEYS)
    router.unbind("q5", "5", {})
    assert {key: next(iter(router.route(key, None))) for key in KEYS} == before


def test_the_same_key_always_goes_to_the_same_destination() -> None:
    router = ConsistentHashRouter()
    for queue in ("q1", "q2", "q3"):
        router.bind(queue, "3", {})
    assert len({tuple(router.route("order-42", None)) for _ in range(100)}) == 1


def test_jump_hash_stays_in_range_and_moves_keys_only_to_a_new_bucket() -> None:
    for key in range(0, 2**64, 2**58 + 12345):
        buckets = [jump_hash(key, n) for n in range(1, 40)]
        assert all(0 <= bucket < n for bucket, n in zip(buckets, range(1, 40), strict=True))
        for n in range(1, 39):
            assert buckets[n] in (buckets[n - 1], n)


def test_hash_header_routes_by_that_header() -> None:
    router = ConsistentHashExchangeType().new_router({"hash-header": "tenant"})
    assert router.needs_headers
    for queue in ("q1", "q2", "q3", "q4"):
        router.bind(queue, "1", {})
    tenants = Counter(next(iter(router.route(f"key-{i}", {"tenant": f"t{i % 50}"}))) for i in range(2_000))
    by_tenant = {f"t{i}": next(iter(router.route("other", {"tenant": f"t{i}"}))) for i in range(50)}
    assert len(tenants) > 1
    for i in range(2_000):
        assert next(iter(router.route(f"key-{i}", {"tenant": f"t{i % 50}"}))) == by_tenant[f"t{i % 50}"]
    # No header: hashed as absent, so every such message goes to one destination (RabbitMQ's rule).
    assert len({next(iter(router.route(f"key-{i}", {}))) for i in range(100)}) == 1


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"hash-header": "a", "hash-property": "message_id"}, "hash-header and hash-property are mutually exclusive"),
        ({"hash-property": "reply_to"}, "Unsupported property: reply_to"),
        ({"hash-header": 5}, "hash-header must be a string"),
    ],
)
def test_bad_exchange_arguments_are_refused_with_406(clocked: Any, arguments: dict[str, Any], text: str) -> None:
    node, _ = clocked("consistent_hash")
    with pytest.raises(ChannelException) as excinfo:
        node.vhosts["/"].declare_exchange("spread", "x-consistent-hash", arguments=arguments)
    assert excinfo.value.reply_code == ReplyCode.PRECONDITION_FAILED
    assert text in excinfo.value.reply_text


def test_a_bad_weight_closes_the_channel_with_406(clocked: Any) -> None:
    node, _ = clocked("consistent_hash")
    c = client(node)
    c.call(
        1,
        commands.Exchange.Declare(exchange="spread", exchange_type="x-consistent-hash"),
        commands.Queue.Declare(queue="q1"),
    )
    reply = methods(c.call(1, commands.Queue.Bind(queue="q1", exchange="spread", routing_key="heavy")))
    assert [(m.name, m.reply_code) for m in reply] == [("Channel.Close", ReplyCode.PRECONDITION_FAILED)]
    assert "must be an integer" in reply[0].reply_text


def test_hash_property_routes_by_message_id(clocked: Any) -> None:
    node, _ = clocked("consistent_hash")
    c = client(node)
    c.call(
        1,
        commands.Exchange.Declare(
            exchange="spread", exchange_type="x-consistent-hash", arguments={"hash-property": "message_id"}
        ),
    )
    for queue in ("q1", "q2", "q3", "q4"):
        c.call(
            1, commands.Queue.Declare(queue=queue), commands.Queue.Bind(queue=queue, exchange="spread", routing_key="1")
        )
    for i in range(400):
        # Routing keys all differ; the message_id repeats every 4 messages.
        c.send(publish_frames(1, "spread", f"rk-{i}", b"x", commands.Basic.Properties(message_id=f"id-{i % 4}")))
    vhost = node.vhosts["/"]
    holders = {
        queue: {entry.message.properties.message_id for entry in vhost.queues[queue].ready_entries()}
        for queue in ("q1", "q2", "q3", "q4")
    }
    ids = [message_id for held in holders.values() for message_id in held]
    assert sorted(ids) == ["id-0", "id-1", "id-2", "id-3"]  # each id in exactly one queue
    assert sum(vhost.queues[q].message_count for q in holders) == 400


def test_the_plugin_takes_no_settings() -> None:
    with pytest.raises(PluginSettingsInvalid) as excinfo:
        ConsistentHashPlugin().check_settings({"hash": "md5"})
    assert "takes no settings, got hash" in str(excinfo.value)


def test_hash_property_also_applies_when_reached_through_an_exchange_binding(clocked: Any) -> None:
    node, _ = clocked("consistent_hash")
    c = client(node)
    c.call(
        1,
        commands.Exchange.Declare(
            exchange="spread", exchange_type="x-consistent-hash", arguments={"hash-property": "message_id"}
        ),
        commands.Exchange.Declare(exchange="front", exchange_type="fanout"),
        commands.Exchange.Bind(destination="spread", source="front"),
    )
    for queue in ("q1", "q2", "q3", "q4"):
        c.call(
            1, commands.Queue.Declare(queue=queue), commands.Queue.Bind(queue=queue, exchange="spread", routing_key="1")
        )
    for i in range(200):
        c.send(publish_frames(1, "front", f"rk-{i}", b"x", commands.Basic.Properties(message_id=f"id-{i % 8}")))
    vhost = node.vhosts["/"]
    holders = [
        {entry.message.properties.message_id for entry in vhost.queues[queue].ready_entries()}
        for queue in ("q1", "q2", "q3", "q4")
    ]
    assert sorted(message_id for held in holders for message_id in held) == [f"id-{i}" for i in range(8)]
    assert sum(1 for held in holders if held) > 1

"""The x-delayed-message exchange: delays on a Clock, declare errors, the router contract, the log."""

from __future__ import annotations

from typing import Any

import pytest
from nodes import client, plugin_node
from pamqp import commands
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.errors import ChannelException, ReplyCode
from postroom.broker.tools.testing import Client, methods, publish_frames
from postroom.broker.wal.recovery import replay
from postroom.broker.wal.segments import iter_records
from postroom.config.schema import BrokerConfig, PluginConfig
from postroom.config.values import ConfigError
from postroom.exchanges.interfaces import IExchangeType, IInterceptingRouter, IRouter
from postroom.exchanges.registry import default_registry
from postroom.exchanges.testing import RouterContract, RoutingExample
from postroom.plugins.delayed_message import (
    MAX_DELAY_MS,
    STORE_PREFIX,
    DelayedMessageExchangeType,
    DelayedMessagePlugin,
    delay_of,
)

PERSISTENT = 2


def props(delay: Any = None, delivery_mode: int = 1, **headers: Any) -> commands.Basic.Properties:
    if delay is not None:
        headers["x-delay"] = delay
    return commands.Basic.Properties(headers=headers or None, delivery_mode=delivery_mode)


def declare_delayed(c: Client, name: str = "later", kind: str = "direct", durable: bool = False) -> None:
    c.call(
        1,
        commands.Exchange.Declare(
            exchange=name, exchange_type="x-delayed-message", durable=durable, arguments={"x-delayed-type": kind}
        ),
        commands.Queue.Declare(queue="jobs", durable=durable),
        commands.Queue.Bind(queue="jobs", exchange=name, routing_key="job"),
    )


class TestDelayedRouter(RouterContract):
    matching_key = RoutingExample("orders.*", {}, "orders.created", None)

    @pytest.fixture
    def router(self) -> IRouter:
        exchange_type = DelayedMessageExchangeType(default_registry())
        verifyObject(IExchangeType, exchange_type)
        router = exchange_type.new_router({"x-delayed-type": "topic"})
        verifyObject(IInterceptingRouter, router)
        return router


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        (None, None),
        ({}, None),
        ({"x-delay": 1500}, 1500),
        ({"x-delay": 0}, None),
        ({"x-delay": -5000}, None),
        ({"x-delay": MAX_DELAY_MS}, MAX_DELAY_MS),
        ({"x-delay": MAX_DELAY_MS + 1}, None),
        ({"x-delay": "250"}, 250),
        ({"x-delay": b"250"}, 250),
        ({"x-delay": "soon"}, None),
        ({"x-delay": 2.9}, 2),
        ({"x-delay": True}, None),
        ({"x-delay": [100]}, None),
        ({"other": 100}, None),
    ],
)
def test_delay_is_read_from_the_x_delay_header_as_rabbitmq_does(headers: Any, delay: int | None) -> None:
    assert delay_of(headers) == delay


def test_a_delayed_message_is_routed_when_its_delay_ends(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    declare_delayed(c)
    c.send(publish_frames(1, "later", "job", b"in 1.5 s", props(1500)))
    queue = node.vhosts["/"].queues["jobs"]
    assert queue.message_count == 0
    clock.advance(1.499)
    assert queue.message_count == 0
    clock.advance(0.001)
    assert [entry.message.body for entry in queue.ready_entries()] == [b"in 1.5 s"]
    assert queue.ready_entries()[0].message.headers == {"x-delay": -1500}
    assert clock.getDelayedCalls() == []


def test_messages_come_out_in_order_of_their_due_time_not_of_publishing(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    declare_delayed(c)
    for body, delay in ((b"third", 3000), (b"first", 1000), (b"second", 2000), (b"now", None)):
        c.send(publish_frames(1, "later", "job", body, props(delay)))
    queue = node.vhosts["/"].queues["jobs"]
    assert [entry.message.body for entry in queue.ready_entries()] == [b"now"]
    clock.pump([1.0, 1.0, 1.0])
    assert [entry.message.body for entry in queue.ready_entries()] == [b"now", b"first", b"second", b"third"]


def test_routing_uses_the_bindings_at_the_end_of_the_delay(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    declare_delayed(c, kind="topic")
    c.send(publish_frames(1, "later", "job", b"x", props(1000)))
    c.call(
        1, commands.Queue.Declare(queue="late"), commands.Queue.Bind(queue="late", exchange="later", routing_key="#")
    )
    clock.advance(1)
    assert node.vhosts["/"].queues["late"].message_count == 1
    assert node.vhosts["/"].queues["jobs"].message_count == 1


def test_a_mandatory_delayed_publish_is_returned_at_once_and_still_delivered_later(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    declare_delayed(c)
    replies = methods(c.send(publish_frames(1, "later", "job", b"x", props(500), mandatory=True)))
    assert [(m.name, m.reply_code) for m in replies if m.name == "Basic.Return"] == [("Basic.Return", 312)]
    clock.advance(0.5)
    assert node.vhosts["/"].queues["jobs"].message_count == 1


def test_a_deleted_exchange_drops_its_waiting_messages(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    declare_delayed(c)
    c.send(publish_frames(1, "later", "job", b"x", props(500)))
    c.call(1, commands.Exchange.Delete(exchange="later"))
    declare_delayed(c)
    clock.advance(1)
    assert node.vhosts["/"].queues["jobs"].message_count == 0


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "'x-delayed-type' must be an existing exchange type"),
        ({"x-delayed-type": "nonesuch"}, "not 'nonesuch'"),
        ({"x-delayed-type": "x-delayed-message"}, "'x-delayed-type' must be an existing exchange type"),
        ({"x-delayed-type": 5}, "'x-delayed-type' must be an existing exchange type"),
    ],
)
def test_a_declare_without_a_valid_delayed_type_is_refused_with_406(
    clocked: Any, arguments: dict[str, Any], text: str
) -> None:
    node, _ = clocked("delayed_message")
    with pytest.raises(ChannelException) as excinfo:
        node.vhosts["/"].declare_exchange("later", "x-delayed-message", arguments=arguments)
    assert excinfo.value.reply_code == ReplyCode.PRECONDITION_FAILED
    assert text in excinfo.value.reply_text
    assert "later" not in node.vhosts["/"].exchanges


def test_the_delayed_type_checks_its_own_arguments_too(clocked: Any) -> None:
    node, _ = clocked("delayed_message", "consistent_hash")
    with pytest.raises(ChannelException) as excinfo:
        node.vhosts["/"].declare_exchange(
            "later",
            "x-delayed-message",
            arguments={"x-delayed-type": "x-consistent-hash", "hash-header": "a", "hash-property": "message_id"},
        )
    assert excinfo.value.reply_code == ReplyCode.PRECONDITION_FAILED
    assert "mutually exclusive" in excinfo.value.reply_text


def test_max_delay_setting_routes_longer_delays_at_once(clocked: Any) -> None:
    node, _ = clocked(PluginConfig("delayed_message", {"max_delay": "1s"}))
    c = client(node)
    declare_delayed(c)
    c.send(publish_frames(1, "later", "job", b"too long", props(1001)))
    c.send(publish_frames(1, "later", "job", b"kept", props(1000)))
    assert [e.message.body for e in node.vhosts["/"].queues["jobs"].ready_entries()] == [b"too long"]


@pytest.mark.parametrize(
    ("settings", "text"),
    [
        ({"max_delay": "soon"}, "max_delay: must be a duration"),
        ({"max_delay": "0ms"}, "max_delay: must be between 1ms"),
        ({"max_delay": "60d"}, "max_delay: must be between 1ms"),
        ({"delay": "1s"}, "unknown setting(s) delay"),
    ],
)
def test_bad_settings_are_refused_with_the_reason(settings: dict[str, Any], text: str) -> None:
    from postroom.broker.interfaces import PluginSettingsInvalid

    with pytest.raises(PluginSettingsInvalid) as excinfo:
        DelayedMessagePlugin().check_settings(settings)
    assert text in str(excinfo.value)


# -- the log -----------------------------------------------------------------------------------


def durable_plugin_node(clock: Clock, journal: Journal) -> Node:
    node, loaded = plugin_node(["delayed_message"], clock, journal)
    loaded.node_ready(node)
    return node


def test_a_persistent_delayed_message_is_confirmed_only_once_logged() -> None:
    clock = Clock()
    journal = Journal(1, clock.seconds)
    node = durable_plugin_node(clock, journal)
    c = client(node)
    declare_delayed(c, durable=True)
    c.call(1, commands.Confirm.Select())
    replies = methods(c.send(publish_frames(1, "later", "job", b"x", props(1000, PERSISTENT))))
    assert [m.name for m in replies if m.name in ("Basic.Ack", "Basic.Nack")] == []
    _data, position = journal.take()
    journal.synced_to(position)
    assert [m.name for m in methods(c.read())] == ["Basic.Ack"]


def test_a_store_queue_is_locked_to_clients() -> None:
    clock = Clock()
    node = durable_plugin_node(clock, Journal(1, clock.seconds))
    c = client(node)
    declare_delayed(c, durable=True)
    c.send(publish_frames(1, "later", "job", b"x", props(1000, PERSISTENT)))
    store = STORE_PREFIX + "later"
    reply = methods(c.call(1, commands.Basic.Get(queue=store)))
    assert [(m.name, m.reply_code) for m in reply] == [("Channel.Close", ReplyCode.RESOURCE_LOCKED)]
    c2 = client(node)
    reply = methods(c2.call(1, commands.Queue.Declare(queue=store, durable=True)))
    assert [(m.name, m.reply_code) for m in reply] == [("Channel.Close", ReplyCode.ACCESS_REFUSED)]


def test_delayed_messages_survive_a_restart_with_the_delay_that_remains() -> None:
    clock = Clock()
    clock.advance(1000)
    journal = Journal(1, clock.seconds)
    node = durable_plugin_node(clock, journal)
    c = client(node)
    declare_delayed(c, durable=True)
    c.send(publish_frames(1, "later", "job", b"10 s", props(10_000, PERSISTENT)))
    c.send(publish_frames(1, "later", "job", b"2 s", props(2_000, PERSISTENT)))
    c.send(publish_frames(1, "later", "job", b"transient", props(3_000)))
    clock.advance(2)  # "2 s" is delivered and logged as removed from the store
    assert [e.message.body for e in node.vhosts["/"].queues["jobs"].ready_entries()] == [b"2 s"]
    clock.advance(2)
    logged = [record for _, _, record in iter_records(journal.take()[0])]

    # Restart at t=1004: "10 s" has 6 s to go; the transient one is gone.
    snapshot = replay(logged)
    later = Clock()
    later.advance(1004)
    config = BrokerConfig(plugins=(PluginConfig("delayed_message"),))
    from postroom.broker.server.pluginloader import load_plugins

    loaded = load_plugins(config.plugins, later)
    restored = node_from_config(
        config, later, Journal(snapshot.max_message_id + 1, later.seconds), snapshot, registry=loaded.registry
    )
    loaded.node_ready(restored, snapshot)
    jobs = restored.vhosts["/"].queues["jobs"]
    assert [(e.message.body, e.redelivered) for e in jobs.ready_entries()] == [(b"2 s", True)]
    later.advance(5.999)
    assert jobs.message_count == 1
    later.advance(0.001)
    assert [e.message.body for e in jobs.ready_entries()] == [b"2 s", b"10 s"]
    assert jobs.ready_entries()[1].message.headers == {"x-delay": -10_000}
    assert restored.vhosts["/"].queues[STORE_PREFIX + "later"].message_count == 0


def test_an_overdue_message_is_routed_right_after_the_restart() -> None:
    clock = Clock()
    journal = Journal(1, clock.seconds)
    node = durable_plugin_node(clock, journal)
    declare_delayed(client(node), durable=True)
    client(node).send(publish_frames(1, "later", "job", b"late", props(1000, PERSISTENT)))
    snapshot = replay([record for _, _, record in iter_records(journal.take()[0])])
    later = Clock()
    later.advance(60)
    restored, loaded = plugin_node(["delayed_message"], later, Journal(snapshot.max_message_id + 1, later.seconds))
    from postroom.broker.core.definitions import restore_snapshot

    restore_snapshot(restored, snapshot)
    loaded.node_ready(restored, snapshot)
    later.advance(0)
    assert [e.message.body for e in restored.vhosts["/"].queues["jobs"].ready_entries()] == [b"late"]


def test_a_store_whose_exchange_is_gone_is_deleted_at_start() -> None:
    clock = Clock()
    journal = Journal(1, clock.seconds)
    node = durable_plugin_node(clock, journal)
    c = client(node)
    declare_delayed(c, durable=True)
    c.send(publish_frames(1, "later", "job", b"x", props(1000, PERSISTENT)))
    c.call(1, commands.Exchange.Delete(exchange="later"))
    snapshot = replay([record for _, _, record in iter_records(journal.take()[0])])
    restored, loaded = plugin_node(["delayed_message"], Clock(), Journal(snapshot.max_message_id + 1))
    from postroom.broker.core.definitions import restore_snapshot

    restore_snapshot(restored, snapshot)
    assert STORE_PREFIX + "later" in restored.vhosts["/"].queues
    loaded.node_ready(restored, snapshot)
    assert STORE_PREFIX + "later" not in restored.vhosts["/"].queues


def test_a_log_with_delayed_exchanges_needs_the_plugin_enabled() -> None:
    clock = Clock()
    journal = Journal(1, clock.seconds)
    declare_delayed(client(durable_plugin_node(clock, journal)), durable=True)
    snapshot = replay([record for _, _, record in iter_records(journal.take()[0])])
    with pytest.raises(ConfigError) as excinfo:
        node_from_config(BrokerConfig(source="broker.yaml"), Clock(), Journal(), snapshot)
    assert str(excinfo.value).splitlines()[1] == (
        "  broker.yaml: plugins: the write-ahead log holds durable exchange 'later' in vhost '/' of type "
        "'x-delayed-message', which no enabled plugin provides; enable the plugin that does"
    )


def test_a_delayed_exchange_reached_through_an_exchange_binding_delays_too(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    declare_delayed(c)
    c.call(
        1,
        commands.Exchange.Declare(exchange="front", exchange_type="fanout"),
        commands.Exchange.Bind(destination="later", source="front"),
    )
    c.send(publish_frames(1, "front", "job", b"via front", props(1000)))
    jobs = node.vhosts["/"].queues["jobs"]
    assert jobs.message_count == 0
    clock.advance(1)
    assert [e.message.body for e in jobs.ready_entries()] == [b"via front"]


def test_the_alternate_exchange_is_used_when_the_delay_ends_not_at_publish(clocked: Any) -> None:
    node, clock = clocked("delayed_message")
    c = client(node)
    c.call(
        1,
        commands.Exchange.Declare(exchange="ae", exchange_type="fanout"),
        commands.Queue.Declare(queue="unrouted"),
        commands.Queue.Bind(queue="unrouted", exchange="ae"),
        commands.Exchange.Declare(
            exchange="later",
            exchange_type="x-delayed-message",
            arguments={"x-delayed-type": "direct", "alternate-exchange": "ae"},
        ),
    )
    c.send(publish_frames(1, "later", "nobody", b"x", props(1000)))
    unrouted = node.vhosts["/"].queues["unrouted"]
    assert unrouted.message_count == 0
    clock.advance(1)
    assert unrouted.message_count == 1

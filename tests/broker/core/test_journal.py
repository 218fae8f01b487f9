"""Durable state through the journal: confirms wait for the log, and the log rebuilds the broker."""

from __future__ import annotations

import json
import random
from typing import Any

from pamqp import commands
from twisted.internet.task import Clock

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.policy import Policy
from postroom.broker.tools.testing import Client, MemorySegmentStorage, publish_frames
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.records import PolicySet, Published, QueueDeclared, QueueDeleted, Removed, StreamOffset
from postroom.broker.wal.recovery import replay
from postroom.broker.wal.segments import iter_records
from postroom.config.loader import loads
from postroom.config.schema import BrokerConfig

PERSISTENT = commands.Basic.Properties(delivery_mode=2)
TRANSIENT = commands.Basic.Properties(delivery_mode=1)


def durable_node() -> tuple[Node, Journal, Clock]:
    clock = Clock()
    journal = Journal(1, clock.seconds)
    node = Node(rng=random.Random(5), clock=clock)
    node.set_journal(journal)
    return node, journal, clock


def client(node: Node) -> Client:
    c = Client(node)
    c.handshake()
    c.open_channel(1)
    return c


def confirms(frames: list) -> list[tuple[str, int, bool]]:
    return [(v.name, v.delivery_tag, v.multiple) for _, v in frames if v.name in ("Basic.Ack", "Basic.Nack")]


def records(journal: Journal) -> list[Any]:
    data, _ = journal.take()
    return [record for _offset, _end, record in iter_records(data)]


def test_a_persistent_publish_is_confirmed_only_once_the_log_is_synced() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="jobs", durable=True), commands.Confirm.Select())
    assert confirms(c.send(publish_frames(1, "", "jobs", b"keep me", PERSISTENT))) == []
    data, position = journal.take()
    journal.synced_to(position)
    assert confirms(c.read()) == [("Basic.Ack", 1, False)]
    assert [type(r) for _, _, r in iter_records(data)][-1] is Published


def test_a_transient_publish_behind_a_waiting_one_waits_too() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="jobs", durable=True), commands.Confirm.Select())
    wire = publish_frames(1, "", "jobs", b"a", TRANSIENT) + publish_frames(1, "", "jobs", b"b", PERSISTENT)
    wire += publish_frames(1, "", "jobs", b"c", TRANSIENT)
    assert confirms(c.send(wire)) == [("Basic.Ack", 1, False)]
    _, position = journal.take()
    journal.synced_to(position)
    assert confirms(c.read()) == [("Basic.Ack", 3, True)]


def test_a_failed_write_nacks_the_publishes_it_held() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="jobs", durable=True), commands.Confirm.Select())
    c.send(publish_frames(1, "", "jobs", b"lost?", PERSISTENT) + publish_frames(1, "", "jobs", b"x", TRANSIENT))
    _, position = journal.take()
    journal.failed(position)
    # Settled together, as RabbitMQ's channel sends them: acks first, then the nack below every
    # ack and every unconfirmed publish as a multiple one.
    assert confirms(c.read()) == [("Basic.Ack", 2, False), ("Basic.Nack", 1, True)]
    c.send(publish_frames(1, "", "jobs", b"later", PERSISTENT))
    _, position = journal.take()
    journal.synced_to(position)
    assert confirms(c.read()) == [("Basic.Ack", 3, False)]


def test_confirms_settled_together_are_coalesced_as_rabbitmq_coalesces_them() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="jobs", durable=True), commands.Confirm.Select())
    wire = b"".join(
        publish_frames(1, "", "jobs", b"m", properties)
        for properties in (PERSISTENT, TRANSIENT, PERSISTENT, TRANSIENT, TRANSIENT)
    )
    c.send(wire)
    _, position = journal.take()
    journal.failed(position)
    # rabbit_channel:coalesce_and_send: acks 2, 4, 5 each alone (nack 1 is below them all), then
    # nack 1 as multiple (below every ack) and nack 3 alone.
    assert confirms(c.read()) == [
        ("Basic.Ack", 2, False),
        ("Basic.Ack", 4, False),
        ("Basic.Ack", 5, False),
        ("Basic.Nack", 1, True),
        ("Basic.Nack", 3, False),
    ]


def test_transient_messages_and_non_durable_queues_are_not_logged() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="memory"), commands.Queue.Declare(queue="disk", durable=True))
    records(journal)
    c.send(publish_frames(1, "", "memory", b"1", PERSISTENT) + publish_frames(1, "", "disk", b"2", TRANSIENT))
    assert records(journal) == []


def test_acks_returns_and_topology_are_logged_and_replay_rebuilds_the_broker() -> None:
    node, journal, clock = durable_node()
    c = client(node)
    c.call(
        1,
        commands.Exchange.Declare(exchange="orders", exchange_type="topic", durable=True),
        commands.Queue.Declare(queue="created", durable=True, arguments={"x-delivery-limit": 5}),
        commands.Queue.Bind(queue="created", exchange="orders", routing_key="order.*.created"),
    )
    for i in range(4):
        c.send(publish_frames(1, "orders", "order.eu.created", b"m%d" % i, PERSISTENT))
    first = [v for _, v in c.call(1, commands.Basic.Get(queue="created")) if v.name == "Basic.GetOk"][0]
    c.call(1, commands.Basic.Ack(delivery_tag=first.delivery_tag))
    second = [v for _, v in c.call(1, commands.Basic.Get(queue="created")) if v.name == "Basic.GetOk"][0]
    c.call(1, commands.Basic.Nack(delivery_tag=second.delivery_tag, requeue=True))
    data, _ = journal.take()
    logged = [record for _, _, record in iter_records(data)]
    assert Removed("/", "created", (1,)) in logged
    snapshot = replay(logged)
    assert snapshot.max_message_id == 4

    restored = node_from_config(BrokerConfig(), Clock(), Journal(snapshot.max_message_id + 1), snapshot)
    queue = restored.vhosts["/"].queues["created"]
    entries = list(queue.ready_entries())
    assert [(e.message.body, e.delivery_count, e.redelivered) for e in entries] == [
        (b"m1", 1, True),
        (b"m2", 0, True),
        (b"m3", 0, True),
    ]
    assert queue.settings.delivery_limit == 5
    r = client(restored)
    r.send(publish_frames(1, "orders", "order.us.created", b"routed", PERSISTENT))
    assert queue.message_count == 4
    assert clock.getDelayedCalls() == []


def test_acks_one_at_a_time_are_logged_as_one_removal_until_another_record_comes() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, *(commands.Queue.Declare(queue=name, durable=True) for name in ("a", "b")))
    for i in range(6):
        c.send(publish_frames(1, "", "a" if i < 4 else "b", b"m%d" % i, PERSISTENT))
    journal.take()

    def ack_next(queue: str) -> None:
        got = [v for _, v in c.call(1, commands.Basic.Get(queue=queue)) if v.name == "Basic.GetOk"][0]
        c.call(1, commands.Basic.Ack(delivery_tag=got.delivery_tag))

    ack_next("a")
    ack_next("a")
    before = journal.position  # reading the position closes the removal it counts
    ack_next("a")
    ack_next("b")  # another queue: a record of its own
    c.send(publish_frames(1, "", "b", b"later", PERSISTENT))  # comes after the removals
    ack_next("a")
    data, position = journal.take()
    assert before < position
    logged = [record for _offset, _end, record in iter_records(data)]
    assert [record if not isinstance(record, Published) else "published" for record in logged] == [
        Removed("/", "a", (1, 2)),
        Removed("/", "a", (3,)),
        Removed("/", "b", (5,)),
        "published",
        Removed("/", "a", (4,)),
    ]
    assert not journal.has_pending


def test_the_topology_snapshot_replays_to_the_same_durable_topology() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(
        1,
        commands.Exchange.Declare(exchange="orders", exchange_type="topic", durable=True),
        commands.Exchange.Declare(exchange="scratch", exchange_type="fanout"),
        commands.Queue.Declare(queue="kept", durable=True, arguments={"x-message-ttl": 60_000}),
        commands.Queue.Declare(queue="memory"),
        commands.Queue.Bind(queue="kept", exchange="orders", routing_key="a.#"),
        commands.Queue.Bind(queue="memory", exchange="orders", routing_key="b.#"),
        commands.Queue.Bind(queue="kept", exchange="scratch"),
    )
    from_log = replay(records(journal))
    from_snapshot = replay(record for _, _, record in iter_records(node.topology()))
    assert from_snapshot.exchanges == from_log.exchanges
    assert from_snapshot.queues == from_log.queues
    assert from_snapshot.bindings == from_log.bindings
    assert [key[1] for key in from_snapshot.exchanges] == ["orders"]
    assert [(b.source, b.destination, b.routing_key) for b in from_snapshot.bindings.values()] == [
        ("orders", "kept", "a.#")
    ]


def test_segments_stay_live_while_a_queue_holds_their_messages() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="a", durable=True), commands.Queue.Declare(queue="b", durable=True))
    c.call(1, commands.Exchange.Declare(exchange="both", exchange_type="fanout", durable=True))
    c.call(1, commands.Queue.Bind(queue="a", exchange="both"), commands.Queue.Bind(queue="b", exchange="both"))
    c.send(publish_frames(1, "both", "", b"in two queues", PERSISTENT))
    journal.take(1)
    c.send(publish_frames(1, "", "a", b"in one", PERSISTENT))
    journal.take(2)
    assert (journal.ledger.live[1], journal.ledger.live[2]) == (2, 1)
    assert journal.ledger.retirable([1, 2, 3], active=3) == []
    for queue in ("a", "b"):
        got = [v for _, v in c.call(1, commands.Basic.Get(queue=queue)) if v.name == "Basic.GetOk"][0]
        c.call(1, commands.Basic.Ack(delivery_tag=got.delivery_tag))
    assert journal.ledger.live[1] == 0
    assert journal.ledger.retirable([1, 2, 3], active=3) == [1]
    got = [v for _, v in c.call(1, commands.Basic.Get(queue="a")) if v.name == "Basic.GetOk"][0]
    c.call(1, commands.Basic.Ack(delivery_tag=got.delivery_tag))
    assert journal.ledger.retirable([1, 2, 3], active=3) == [1, 2]
    assert journal.ledger.retirable([1, 2, 3], active=2) == [1]


def test_a_message_acked_before_it_is_written_keeps_no_segment_alive() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="a", durable=True))
    c.send(publish_frames(1, "", "a", b"quick", PERSISTENT))
    c.call(1, commands.Basic.Get(queue="a", no_ack=True))
    journal.take(1)
    assert journal.ledger.live[1] == 0


def test_a_sparse_segment_is_copied_forward_with_delivery_counts_and_replays_the_same() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="q", durable=True))
    for i in range(8):
        c.send(publish_frames(1, "", "q", b"%d" % i, PERSISTENT))
    journal.take(1)
    for _ in range(7):
        got = [v for _, v in c.call(1, commands.Basic.Get(queue="q")) if v.name == "Basic.GetOk"][0]
        c.call(1, commands.Basic.Ack(delivery_tag=got.delivery_tag))
    got = [v for _, v in c.call(1, commands.Basic.Get(queue="q")) if v.name == "Basic.GetOk"][0]
    c.call(1, commands.Basic.Nack(delivery_tag=got.delivery_tag, requeue=True))
    assert (journal.ledger.live[1], journal.ledger.written[1], journal.ledger.sparse(1)) == (1, 8, True)
    assert journal.rewrite(1) == 1
    second_segment, _ = journal.take(2)
    assert (journal.ledger.live[1], journal.ledger.live[2]) == (0, 1)
    assert journal.ledger.retirable([1, 2, 3], active=3) == [1]
    # With segment 1 retired, segment 2 (after its topology snapshot) alone rebuilds the queue.
    snapshot = replay([QueueDeclared("/", "q", True, False, b"")] + [r for _, _, r in iter_records(second_segment)])
    ((message_id, stored),) = snapshot.messages[("/", "q")].items()
    assert (message_id, stored.record.body, stored.delivery_count) == (8, b"7", 1)


def test_bodies_beyond_the_memory_budget_are_paged_out_newest_first_and_read_back() -> None:
    node, journal, _ = durable_node()
    log = WriteAheadLog(MemorySegmentStorage())
    log.open()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="big", durable=True))
    bodies = [bytes([i]) * 1000 for i in range(10)]
    for body in bodies:
        c.send(publish_frames(1, "", "big", body, PERSISTENT))
    data, _ = journal.take(log.active, log.size, log.storage.read_at)
    log.append(data)
    assert journal.bodies.size == 10_000
    assert journal.bodies.page_out(budget=3_000) == 7
    entries = list(node.vhosts["/"].queues["big"].ready_entries())
    assert [e.message.resident for e in entries] == [True] * 3 + [False] * 7
    assert journal.bodies.size == 3_000
    got = []
    for _ in bodies:
        frames = c.call(1, commands.Basic.Get(queue="big", no_ack=True))
        got.append(frames[-1][1].value)
    assert got == bodies
    assert journal.bodies.size == 0


def test_deleting_a_durable_queue_records_only_its_deletion_and_frees_its_segment() -> None:
    node, journal, _ = durable_node()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="gone", durable=True))
    for i in range(3):
        c.send(publish_frames(1, "", "gone", b"%d" % i, PERSISTENT))
    journal.take(1)
    held = [v for _, v in c.call(1, commands.Basic.Get(queue="gone")) if v.name == "Basic.GetOk"][0]
    c.call(1, commands.Queue.Delete(queue="gone"))
    c.call(1, commands.Basic.Ack(delivery_tag=held.delivery_tag))
    assert [type(r).__name__ for r in records(journal)] == ["QueueDeleted"]
    assert journal.ledger.live[1] == 0


def test_policies_set_and_cleared_are_logged_and_recovered_before_the_queues_they_shape() -> None:
    node, journal, _ = durable_node()
    vhost = node.vhosts["/"]
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="orders.eu", durable=True))
    for i in range(3):
        c.send(publish_frames(1, "", "orders.eu", b"m%d" % i, PERSISTENT))
    vhost.set_policy(Policy("cap", "^orders\\.", {"max-length": 5, "dead-letter-exchange": "dlx"}, 1, "queues"))
    vhost.set_policy(Policy("limit", "^orders\\.", {"max-length": 2}, 2.5), operator=True)
    vhost.set_policy(Policy("gone", ".*", {"message-ttl": 1}))
    assert vhost.clear_policy("gone")
    # Setting one again unchanged records nothing.
    before = journal.position
    vhost.set_policy(Policy("cap", "^orders\\.", {"max-length": 5, "dead-letter-exchange": "dlx"}, 1, "queues"))
    assert journal.position == before
    logged = records(journal)
    assert [type(record).__name__ for record in logged if "Polic" in type(record).__name__] == [
        "PolicySet",
        "PolicySet",
        "PolicySet",
        "PolicyCleared",
    ]
    snapshot = replay(logged)
    restored = node_from_config(BrokerConfig(), Clock(), Journal(snapshot.max_message_id + 1), snapshot)
    policies = restored.vhosts["/"]
    assert policies.policies == {"cap": vhost.policies["cap"]}
    assert policies.operator_policies == {"limit": vhost.operator_policies["limit"]}
    queue = policies.queues["orders.eu"]
    assert (queue.policy.name, queue.operator_policy.name) == ("cap", "limit")  # type: ignore[union-attr]
    # The operator's limit dropped the head live, and the log says so: the same two remain.
    assert [e.message.body for e in queue.ready_entries()] == [b"m1", b"m2"]
    # The snapshot written at the head of each segment carries the policies too.
    from_snapshot = replay(record for _, _, record in iter_records(node.topology()))
    assert from_snapshot.policies == snapshot.policies


def test_a_configured_policy_replaces_a_recorded_one_of_its_name_at_start() -> None:
    node, journal, _ = durable_node()
    node.vhosts["/"].set_policy(Policy("ttl", "^a", {"message-ttl": 1000}))
    node.vhosts["/"].set_policy(Policy("kept", "^b", {"message-ttl": 5}))
    snapshot = replay(records(journal))
    config = loads("vhosts:\n  /:\n    policies:\n      - {name: ttl, pattern: '^a', definition: {message-ttl: 20}}\n")
    restarted = Journal(1)
    restored = node_from_config(config, Clock(), restarted, snapshot)
    assert {name: p.definition for name, p in restored.vhosts["/"].policies.items()} == {
        "ttl": {"message-ttl": 20},
        "kept": {"message-ttl": 5},
    }
    # Only the configured change is recorded: the recovered policy is in the log already.
    policies = [r for r in records(restarted) if isinstance(r, PolicySet)]
    assert [(r.name, json.loads(r.value)["definition"]) for r in policies] == [("ttl", {"message-ttl": 20})]


def test_when_durable_waits_for_the_writer_and_hears_of_a_failure() -> None:
    node, journal, _ = durable_node()
    heard: list[bool] = []
    journal.when_durable(heard.append)
    assert heard == [True]  # nothing pending
    node.vhosts["/"].set_policy(Policy("p", ".", {"max-length": 1}))
    journal.when_durable(heard.append)
    _, position = journal.take()
    assert heard == [True]
    journal.failed(position)
    assert heard == [True, False]
    node.vhosts["/"].clear_policy("p")
    journal.when_durable(heard.append)
    _, position = journal.take()
    journal.synced_to(position)
    assert heard == [True, False, True]
    assert not journal.waiters


def test_a_streams_subscriptions_are_replayed_and_go_with_the_stream() -> None:
    declared = QueueDeclared("/", "events", True, False, b"")
    state = replay(
        [
            declared,
            StreamOffset("/", "events", "billing", 300),
            StreamOffset("/", "events", "billing", 400),
            StreamOffset("/", "events", "audit", 5),
            StreamOffset("/", "gone", "billing", 1),
        ]
    )
    assert state.stream_offsets == {("/", "events"): {"billing": 400, "audit": 5}} and state.orphans == 1
    state = replay([QueueDeleted("/", "events"), declared], state)
    assert state.stream_offsets == {}


def test_a_subscriptions_offsets_between_two_writes_are_one_record() -> None:
    journal = Journal(1)
    scheduled: list[int] = []
    journal.on_pending = lambda: scheduled.append(1)
    for offset in range(1, 1001):  # a thousand acks
        journal.stream_offset("/", "events", "billing", offset)
    journal.stream_offset("/", "events", "audit", 7)
    assert journal.has_pending and scheduled == [1]
    data, position = journal.take()
    records = [record for _start, _end, record in iter_records(data)]
    assert records == [StreamOffset("/", "events", "billing", 1000), StreamOffset("/", "events", "audit", 7)]
    assert position == len(data) and not journal.has_pending


def test_offsets_stored_before_a_stream_is_deleted_are_not_written_after_it() -> None:
    journal = Journal(1)
    journal.stream_offset("/", "events", "billing", 10)
    journal.stream_offset("/", "other", "billing", 3)
    journal.queue_deleted("/", "events")
    journal.queue_declared("/", "events", False, {"x-queue-type": "stream"})
    data, _position = journal.take()
    records = [record for _start, _end, record in iter_records(data)]
    assert StreamOffset("/", "events", "billing", 10) not in records
    assert records[-1] == StreamOffset("/", "other", "billing", 3)
    assert replay(records).stream_offsets == {}  # (no QueueDeclared of "other" in this log)

"""The dead-letter event log: what is recorded when messages die and when dead letters leave."""

from __future__ import annotations

from typing import Any

from pamqp import commands

from postroom.broker.core.dead_letter_events import RUN_ID_BITS, DeadLetterLog, watch_dead_letter_queues
from postroom.broker.core.message import Message
from postroom.broker.core.node import Node
from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER
from postroom.broker.wal.records import DEAD_LETTER_PREVIEW_BYTES, DeadLettered, DeadLetterSettled
from postroom.broker.wal.segments import iter_records
from tests.broker.core.test_reliability import (
    client,
    dead_letter_setup,
    declare,
    deliveries,
    drain,
    publish,
    setup,
)

RUN = 3


def attach(node: Node) -> DeadLetterLog:
    log = DeadLetterLog(RUN, node.clock.seconds)  # type: ignore[union-attr]
    node.vhosts["/"].dead_letters = log
    return log


def events(log: DeadLetterLog) -> list[Any]:
    return [record for _start, _end, record in iter_records(log.take())]


def test_a_rejected_message_is_recorded_with_its_headers_and_x_death() -> None:
    node, clock = setup()
    clock.advance(1_795_000_000)
    log = attach(node)
    c = client(node)
    dead_letter_setup(c, "work")
    publish(c, "work", b"x" * 5000, headers={"tenant": "acme"}, message_id="order-7")
    (get, _header, _body), = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Reject(delivery_tag=get.delivery_tag, requeue=False))
    (event,) = events(log)
    assert isinstance(event, DeadLettered)
    assert event.dead_letter_id == (RUN << RUN_ID_BITS) + 1
    assert (event.vhost, event.queue, event.reason, event.delivery_count) == ("/", "work", "rejected", 0)
    assert (event.exchange, event.routing_keys) == ("", ("work",))
    assert (event.dead_letter_exchange, event.dead_letter_queues) == ("dlx", ("dlq",))
    assert event.message_id == "order-7"
    assert dict(zip(event.header_names, event.header_values, strict=True))["tenant"] == "acme"
    assert "x-death" not in event.header_names
    assert (event.death_queues, event.death_reasons, event.death_counts) == (("work",), ("rejected",), (1,))
    assert event.death_times == (1_795_000_000,)
    assert event.time == 1_795_000_000
    assert (event.body_size, len(event.body_preview)) == (5000, DEAD_LETTER_PREVIEW_BYTES)
    (_get, header, _body), = drain(c, "dlq")
    assert header.properties.headers[DEAD_LETTER_ID_HEADER] == event.dead_letter_id


def test_an_expired_dead_letter_copy_reaching_two_queues_settles_in_each_once() -> None:
    node, clock = setup()
    log = attach(node)
    c = client(node)
    dead_letter_setup(c, "work", **{"x-message-ttl": 1_000})
    declare(c, "audit")
    c.call(1, commands.Queue.Bind(queue="audit", exchange="dlx"))
    publish(c, "work", b"a")
    clock.advance(1)
    (died,) = events(log)
    assert (died.reason, set(died.dead_letter_queues)) == ("expired", {"dlq", "audit"})
    assert log.held() == 2
    drain(c, "dlq")
    drain(c, "dlq")
    assert [(e.dead_letter_id, e.queue) for e in events(log)] == [(died.dead_letter_id, "dlq")]
    c.call(1, commands.Queue.Purge(queue="audit"))
    assert [(e.dead_letter_id, e.queue) for e in events(log)] == [(died.dead_letter_id, "audit")]
    assert log.held() == 0


def test_acking_a_dead_letter_records_it_settled_and_other_queues_pay_nothing() -> None:
    node, _clock = setup()
    log = attach(node)
    c = client(node)
    dead_letter_setup(c, "work")
    declare(c, "other")
    publish(c, "work", b"a")
    publish(c, "other", b"b")
    (get, _h, _b), = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Nack(delivery_tag=get.delivery_tag, requeue=False))
    (died,) = events(log)
    vhost = node.vhosts["/"]
    assert vhost.queues["work"].dead_letter_watch is None
    assert vhost.queues["other"].dead_letter_watch is None
    drain(c, "other")
    assert events(log) == []
    drain(c, "dlq")
    assert events(log) == [DeadLetterSettled(died.dead_letter_id, "/", "dlq", node.clock.seconds())]  # type: ignore[union-attr]
    assert log.held() == 0


def test_a_recovered_dead_letter_is_known_by_its_header() -> None:
    node, _clock = setup()
    c = client(node)
    dead_letter_setup(c, "work")
    vhost = node.vhosts["/"]
    # As recovery restores it: a message of an earlier run, carrying its id in a header.
    copy = Message.build("dlx", "work", b"old", commands.Basic.Properties(headers={DEAD_LETTER_ID_HEADER: 77}))
    vhost.queues["dlq"].enqueue(copy)
    log = attach(node)
    assert watch_dead_letter_queues(log, node.vhosts.values()) == 1
    # Published later with a copied header (say, by hand): not a dead letter of the stream,
    # and settling it decodes nothing.
    publish(c, "dlq", b"forged", headers={DEAD_LETTER_ID_HEADER: 78})
    drain(c, "dlq")
    assert [(e.dead_letter_id, e.queue) for e in events(log)] == [(77, "dlq")]


def test_dead_letters_unacked_when_their_queue_is_deleted_settle_when_their_channel_closes() -> None:
    node, _clock = setup()
    log = attach(node)
    c = client(node)
    dead_letter_setup(c, "work")
    publish(c, "work", b"a")
    (get, _h, _b), = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Reject(delivery_tag=get.delivery_tag, requeue=False))
    (died,) = events(log)
    c.open_channel(2)
    c.call(2, commands.Basic.Get(queue="dlq"))  # held unacked on channel 2
    c.call(1, commands.Queue.Delete(queue="dlq"))
    assert events(log) == []  # still held by channel 2
    c.call(2, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert [(e.dead_letter_id, e.queue) for e in events(log)] == [(died.dead_letter_id, "dlq")]
    assert log.held() == 0


def test_recovered_dead_letters_are_known_in_queues_no_dead_letter_exchange_routes_to() -> None:
    node, _clock = setup()
    c = client(node)
    declare(c, "orphaned.dlq")  # the queue that dead-lettered into it was deleted before the restart
    declare(c, "plain")
    vhost = node.vhosts["/"]
    copy = Message.build("dlx", "work", b"old", commands.Basic.Properties(headers={DEAD_LETTER_ID_HEADER: 91}))
    vhost.queues["orphaned.dlq"].enqueue(copy)
    publish(c, "plain", b"p", headers={"tenant": "acme"})
    log = attach(node)
    assert watch_dead_letter_queues(log, node.vhosts.values()) == 1
    assert vhost.queues["plain"].dead_letter_watch is None  # holds no dead letter: not hooked
    drain(c, "orphaned.dlq")
    assert [(e.dead_letter_id, e.queue) for e in events(log)] == [(91, "orphaned.dlq")]


def test_nothing_is_recorded_without_a_dead_letter_log_and_no_header_is_added() -> None:
    node, _clock = setup()
    c = client(node)
    dead_letter_setup(c, "work")
    publish(c, "work", b"a")
    (get, _h, _b), = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Reject(delivery_tag=get.delivery_tag, requeue=False))
    (_get, header, _body), = drain(c, "dlq")
    assert DEAD_LETTER_ID_HEADER not in header.properties.headers


def test_pending_events_call_on_pending_once_per_batch() -> None:
    node, _clock = setup()
    log = attach(node)
    calls = []
    log.on_pending = lambda: calls.append(1)
    c = client(node)
    dead_letter_setup(c, "work", **{"x-max-length": 1})
    for body in (b"a", b"b", b"c"):
        publish(c, "work", body)
    assert len(calls) == 1
    assert [e.reason for e in events(log)] == ["maxlen", "maxlen"]
    assert not log.has_pending

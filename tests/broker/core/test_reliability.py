"""Visibility timeouts, delivery limits, dead-lettering, TTLs and length limits, on a Clock."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from twisted.internet.task import Clock

from postroom.broker.core.node import Node
from postroom.broker.errors import ReplyCode
from postroom.broker.tools.testing import Client, encode, publish_frames


def setup(clock: Clock | None = None) -> tuple[Node, Clock]:
    clock = clock or Clock()
    return Node(rng=random.Random(3), clock=clock), clock


def client(node: Node) -> Client:
    c = Client(node)
    c.handshake()
    c.open_channel(1)
    return c


def declare(c: Client, queue: str, **arguments: Any) -> None:
    c.call(1, commands.Queue.Declare(queue=queue, arguments=arguments))


def consume(c: Client, queue: str, prefetch: int = 0, tag: str = "c", **arguments: Any) -> None:
    if prefetch:
        c.call(1, commands.Basic.Qos(prefetch_count=prefetch))
    c.call(1, commands.Basic.Consume(queue=queue, consumer_tag=tag, arguments=arguments))


def publish(c: Client, routing_key: str, body: bytes, exchange: str = "", **properties: Any) -> list:
    return c.send(publish_frames(1, exchange, routing_key, body, commands.Basic.Properties(**properties)))


def deliveries(frames: list) -> list[tuple[Any, ContentHeader, bytes]]:
    """(deliver or get-ok, header, body) triples from a frame list."""
    values = [value for _, value in frames]
    found = []
    for index, value in enumerate(values):
        if isinstance(value, (commands.Basic.Deliver, commands.Basic.GetOk)):
            header = values[index + 1]
            body = b""
            if header.body_size:
                body = values[index + 2].value
            found.append((value, header, body))
    return found


def drain(c: Client, queue: str) -> list[tuple[Any, ContentHeader, bytes]]:
    """basic.get with no_ack until empty."""
    found = []
    while True:
        got = deliveries(c.call(1, commands.Basic.Get(queue=queue, no_ack=True)))
        if not got:
            return found
        found += got


def dead_letter_setup(c: Client, queue: str, dlq: str = "dlq", **arguments: Any) -> None:
    c.call(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    declare(c, dlq)
    c.call(1, commands.Queue.Bind(queue=dlq, exchange="dlx"))
    declare(c, queue, **{"x-dead-letter-exchange": "dlx", **arguments})


# -- visibility timeouts ---------------------------------------------------------------------------


def test_unacked_message_goes_to_the_next_consumer_after_its_visibility_timeout() -> None:
    node, clock = setup()
    hung, worker = client(node), client(node)
    declare(hung, "work", **{"x-visibility-timeout": 30_000})
    consume(hung, "work", prefetch=1, tag="hung")
    consume(worker, "work", prefetch=1, tag="worker")
    worker_busy = client(node)
    publish(worker_busy, "work", b"job-1")
    (first,) = deliveries(hung.read())
    assert first[0].consumer_tag == "hung"
    clock.advance(29.9)
    assert deliveries(worker.read()) == []
    clock.advance(0.1)
    (second,) = deliveries(worker.read())
    deliver, header, body = second
    assert (deliver.consumer_tag, deliver.redelivered, body) == ("worker", True, b"job-1")
    assert header.properties.headers == {"x-delivery-count": 1}
    assert node.vhosts["/"].queues["work"].visibility_timeouts == 1


def stale_first_tag() -> tuple[Node, Clock, Client, list[tuple[Any, ContentHeader, bytes]]]:
    """A consumer (prefetch 1) whose first delivery's visibility timeout ran out: tag 1 is
    stale and the message came back as tag 2 (those deliveries are returned)."""
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 1_000})
    consume(c, "work", prefetch=1)
    publish(c, "work", b"job")
    clock.advance(1.0)
    return node, clock, c, deliveries(c.read())


def test_ack_of_a_stale_tag_is_ignored_and_counted_and_later_acks_work() -> None:
    node, clock, c, redelivered = stale_first_tag()
    assert [(d.delivery_tag, d.redelivered) for d, _, _ in redelivered] == [(2, True)]
    assert c.call(1, commands.Basic.Ack(delivery_tag=1)) == []  # stale: no channel.close
    assert node.counters["stale_acks"] == 1
    assert c.call(1, commands.Basic.Ack(delivery_tag=2)) == []
    queue = node.vhosts["/"].queues["work"]
    assert (queue.message_count, queue.unacked_count) == (0, 0)
    clock.advance(5)
    assert deliveries(c.read()) == []


def test_a_stale_tag_first_among_single_acks_read_together_leaves_the_others_acked() -> None:
    node, _clock, c, _redelivered = stale_first_tag()
    for number in range(2):
        publish(c, "work", b"more %d" % number)
    acks = encode(1, *(commands.Basic.Ack(delivery_tag=tag) for tag in (1, 2)))
    got = deliveries(c.send(acks))  # the slot tag 2 held goes to the next message
    assert [(d.delivery_tag, body) for d, _, body in got] == [(3, b"more 0")]
    assert node.counters["stale_acks"] == 1
    queue = node.vhosts["/"].queues["work"]
    assert (queue.acked, queue.message_count, queue.unacked_count) == (1, 1, 1)


def test_a_twice_acked_tag_is_still_an_error() -> None:
    node, _ = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 1_000})
    consume(c, "work")
    publish(c, "work", b"job")
    c.call(1, commands.Basic.Ack(delivery_tag=1))
    (close,) = [v for _, v in c.call(1, commands.Basic.Ack(delivery_tag=1))]
    assert close.reply_code == ReplyCode.PRECONDITION_FAILED


def test_acked_deliveries_leave_no_timer_behind() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 10_000})
    consume(c, "work")
    for i in range(5):
        publish(c, "work", b"%d" % i)
    c.call(1, commands.Basic.Ack(delivery_tag=5, multiple=True))
    clock.advance(10)
    assert clock.getDelayedCalls() == []
    assert deliveries(c.read()) == []


def test_basic_get_deliveries_obey_the_visibility_timeout() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 2_000})
    publish(c, "work", b"polled")
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    assert got[0].delivery_tag == 1
    assert deliveries(c.call(1, commands.Basic.Get(queue="work"))) == []
    clock.advance(2)
    (again,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    assert (again[0].delivery_tag, again[0].redelivered, again[2]) == (2, True, b"polled")


def test_a_consumer_argument_overrides_the_queue_visibility_timeout() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 60_000})
    consume(c, "work", prefetch=1, **{"x-visibility-timeout": 5_000})
    publish(c, "work", b"job")
    c.read()
    clock.advance(5)
    assert [d.redelivered for d, _, _ in deliveries(c.read())] == [True]


def test_extending_the_lease_moves_the_deadline() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 10_000})
    consume(c, "work", prefetch=1)
    publish(c, "work", b"slow job")
    c.read()
    clock.advance(8)
    c.call(1, commands.Confirm.Select())
    frames = publish(
        c, "", b"", exchange="amq.postroom.extend", headers={"x-delivery-tag": 1, "x-visibility-timeout": 20_000}
    )
    assert [(v.name, v.delivery_tag) for _, v in frames] == [("Basic.Ack", 1)]
    clock.advance(19.9)
    assert deliveries(c.read()) == []
    clock.advance(0.1)
    assert [d.delivery_tag for d, _, _ in deliveries(c.read())] == [2]


def test_extending_a_stale_or_unknown_tag_is_nacked_and_counted() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 1_000})
    consume(c, "work", prefetch=1)
    publish(c, "work", b"job")
    clock.advance(1)
    c.read()
    c.call(1, commands.Confirm.Select())
    frames = publish(
        c, "", b"", exchange="amq.postroom.extend", headers={"x-delivery-tag": 1, "x-visibility-timeout": 5_000}
    )
    assert [(v.name, v.delivery_tag) for _, v in frames] == [("Basic.Nack", 1)]
    assert node.counters["stale_extends"] == 1


# -- delivery limits -------------------------------------------------------------------------------


def test_returns_from_every_cause_count_towards_the_delivery_limit() -> None:
    node, clock = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-delivery-limit": 3, "x-visibility-timeout": 5_000})
    publish(c, "work", b"poison", headers={"tenant": "acme"})
    # 1: nack with requeue
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Nack(delivery_tag=got[0].delivery_tag, requeue=True))
    # 2: visibility timeout
    deliveries(c.call(1, commands.Basic.Get(queue="work")))
    clock.advance(5)
    # 3: channel closed with the delivery unacked
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    assert got[1].properties.headers["x-delivery-count"] == 2
    c.call(1, commands.Channel.Close(reply_code=200, class_id=0, method_id=0))
    c.open_channel(1)
    # 4: reject with requeue: the 4th return is past the limit of 3
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    assert got[1].properties.headers["x-delivery-count"] == 3
    c.call(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=True))
    assert node.vhosts["/"].queues["work"].message_count == 0
    ((_, header, body),) = drain(c, "dlq")
    headers = header.properties.headers
    assert body == b"poison"
    assert headers["tenant"] == "acme"
    assert "x-delivery-count" not in headers
    (death,) = headers["x-death"]
    # RabbitMQ's first x-death table: these keys, in this order, count a long-long.
    assert list(death) == ["count", "reason", "queue", "time", "exchange", "routing-keys"]
    assert {k: death[k] for k in ("count", "reason", "queue", "exchange", "routing-keys")} == {
        "count": 1,
        "reason": "delivery_limit",
        "queue": "work",
        "exchange": "",
        "routing-keys": ["work"],
    }
    assert type(death["count"]).__name__ == "Int64"
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert headers["x-first-death-queue"] == "work"


def test_past_the_delivery_limit_without_a_dead_letter_exchange_the_message_is_dropped() -> None:
    node, _ = setup()
    c = client(node)
    declare(c, "work", **{"x-delivery-limit": 0})
    publish(c, "work", b"once")
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Nack(delivery_tag=got[0].delivery_tag, requeue=True))
    queue = node.vhosts["/"].queues["work"]
    assert (queue.message_count, queue.unacked_count) == (0, 0)


# -- dead-lettering --------------------------------------------------------------------------------


def test_rejected_message_is_dead_lettered_with_the_dead_letter_routing_key() -> None:
    node, _ = setup()
    c = client(node)
    c.call(1, commands.Exchange.Declare(exchange="dlx", exchange_type="direct"))
    declare(c, "dlq")
    c.call(1, commands.Queue.Bind(queue="dlq", exchange="dlx", routing_key="dead"))
    declare(c, "work", **{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"})
    publish(c, "work", b"bad")
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    c.call(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=False))
    ((deliver, header, _),) = drain(c, "dlq")
    assert (deliver.exchange, deliver.routing_key) == ("dlx", "dead")
    assert header.properties.headers["x-death"][0]["reason"] == "rejected"


def test_x_death_accumulates_across_two_hops_most_recent_first() -> None:
    node, clock = setup()
    c = client(node)
    c.call(1, commands.Exchange.Declare(exchange="dlx1", exchange_type="fanout"))
    c.call(1, commands.Exchange.Declare(exchange="dlx2", exchange_type="fanout"))
    declare(c, "first", **{"x-dead-letter-exchange": "dlx1", "x-message-ttl": 1_000})
    declare(c, "second", **{"x-dead-letter-exchange": "dlx2"})
    declare(c, "last")
    c.call(1, commands.Queue.Bind(queue="second", exchange="dlx1"))
    c.call(1, commands.Queue.Bind(queue="last", exchange="dlx2"))
    publish(c, "first", b"hop")
    clock.advance(1)
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="second")))
    c.call(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=False))
    ((_, header, _),) = drain(c, "last")
    headers = header.properties.headers
    assert [(d["queue"], d["reason"], d["exchange"]) for d in headers["x-death"]] == [
        ("second", "rejected", "dlx1"),
        ("first", "expired", ""),
    ]
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"], headers["x-first-death-exchange"]) == (
        "first",
        "expired",
        "",
    )


def test_a_repeated_death_increments_its_count_and_moves_to_the_front() -> None:
    node, _ = setup()
    c = client(node)
    c.call(1, commands.Exchange.Declare(exchange="retry", exchange_type="direct"))
    c.call(1, commands.Exchange.Declare(exchange="park", exchange_type="direct"))
    declare(c, "work", **{"x-dead-letter-exchange": "park"})
    declare(c, "parked", **{"x-dead-letter-exchange": "retry"})
    c.call(1, commands.Queue.Bind(queue="parked", exchange="park", routing_key="work"))
    c.call(1, commands.Queue.Bind(queue="work", exchange="retry", routing_key="work"))
    publish(c, "work", b"again and again")
    for queue in ("work", "parked", "work"):
        (got,) = deliveries(c.call(1, commands.Basic.Get(queue=queue)))
        c.call(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=False))
    ((_, header, _),) = drain(c, "parked")
    assert [(d["queue"], d["count"]) for d in header.properties.headers["x-death"]] == [("work", 2), ("parked", 1)]


def test_a_dead_letter_cycle_without_rejection_is_dropped() -> None:
    node, clock = setup()
    c = client(node)
    c.call(1, commands.Exchange.Declare(exchange="loop", exchange_type="fanout"))
    c.call(1, commands.Exchange.Declare(exchange="back", exchange_type="fanout"))
    declare(c, "spin", **{"x-dead-letter-exchange": "loop", "x-message-ttl": 1_000})
    declare(c, "wait", **{"x-dead-letter-exchange": "back", "x-message-ttl": 1_000})
    c.call(1, commands.Queue.Bind(queue="wait", exchange="loop"))
    c.call(1, commands.Queue.Bind(queue="spin", exchange="back"))
    publish(c, "spin", b"round")
    queues = node.vhosts["/"].queues
    clock.advance(1)  # spin -> loop -> wait
    assert (queues["spin"].message_count, queues["wait"].message_count) == (0, 1)
    clock.advance(1)  # wait -> back -> spin: spin is in x-death with no rejection since: dropped
    assert (queues["spin"].message_count, queues["wait"].message_count) == (0, 0)
    assert node.vhosts["/"].dead_letters_dropped == 1


def test_a_rejection_breaks_a_cycle() -> None:
    node, _ = setup()
    c = client(node)
    c.call(1, commands.Exchange.Declare(exchange="loop", exchange_type="fanout"))
    declare(c, "spin", **{"x-dead-letter-exchange": "loop"})
    c.call(1, commands.Queue.Bind(queue="spin", exchange="loop"))
    publish(c, "spin", b"round")
    for _ in range(3):
        (got,) = deliveries(c.call(1, commands.Basic.Get(queue="spin")))
        c.call(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=False))
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="spin", no_ack=True)))
    assert got[1].properties.headers["x-death"][0]["count"] == 3


# -- TTL -------------------------------------------------------------------------------------------


def test_expired_messages_reach_the_dlq_with_no_consumer_attached() -> None:
    node, clock = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-message-ttl": 5_000})
    publish(c, "work", b"stale")
    clock.advance(4.9)
    assert node.vhosts["/"].queues["dlq"].message_count == 0
    clock.advance(0.1)
    assert node.vhosts["/"].queues["work"].message_count == 0
    ((_, header, body),) = drain(c, "dlq")
    assert (body, header.properties.headers["x-death"][0]["reason"]) == (b"stale", "expired")


def test_a_short_per_message_ttl_expires_behind_a_long_one() -> None:
    node, clock = setup()
    c = client(node)
    dead_letter_setup(c, "work")
    publish(c, "work", b"patient", expiration="60000")
    publish(c, "work", b"hasty", expiration="1000")
    clock.advance(1)
    ((_, header, body),) = drain(c, "dlq")
    assert body == b"hasty"
    death = header.properties.headers["x-death"][0]
    assert death["original-expiration"] == "1000"
    assert header.properties.expiration is None
    assert [b for _, _, b in drain(c, "work")] == [b"patient"]


def test_ttl_zero_is_delivered_to_a_waiting_consumer_or_expires_at_once() -> None:
    node, _ = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-message-ttl": 0})
    publish(c, "work", b"nobody")
    assert [b for _, _, b in drain(c, "dlq")] == [b"nobody"]
    consume(c, "work")
    frames = publish(c, "work", b"someone")
    assert [b for _, _, b in deliveries(frames)] == [b"someone"]


def test_a_requeued_message_past_its_ttl_expires_instead() -> None:
    node, clock = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-message-ttl": 1_000})
    publish(c, "work", b"late")
    (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
    clock.advance(2)
    c.call(1, commands.Basic.Nack(delivery_tag=got[0].delivery_tag, requeue=True))
    assert [h.properties.headers["x-death"][0]["reason"] for _, h, _ in drain(c, "dlq")] == ["expired"]


def test_an_invalid_expiration_is_refused_with_406() -> None:
    node, _ = setup()
    c = client(node)
    declare(c, "work")
    (close,) = [v for _, v in publish(c, "work", b"x", expiration="soon")]
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - invalid expiration 'soon'")


# -- length limits ---------------------------------------------------------------------------------


def test_drop_head_dead_letters_the_oldest_in_order() -> None:
    node, _ = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-max-length": 2})
    for i in range(5):
        publish(c, "work", b"%d" % i)
    assert [b for _, _, b in drain(c, "dlq")] == [b"0", b"1", b"2"]
    assert [b for _, _, b in drain(c, "work")] == [b"3", b"4"]
    assert all(h.properties.headers is None for _, h, _ in drain(c, "work"))


def test_max_length_bytes_counts_ready_bodies() -> None:
    node, _ = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        publish(c, "work", body)
    assert [b for _, _, b in drain(c, "dlq")] == [b"aaaa"]
    assert [b for _, _, b in drain(c, "work")] == [b"bbbb", b"cccc"]


def test_reject_publish_nacks_the_publisher_and_keeps_the_queue() -> None:
    node, _ = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    c.call(1, commands.Confirm.Select())
    frames = publish(c, "work", b"kept") + publish(c, "work", b"refused")
    assert [(v.name, v.delivery_tag) for _, v in frames] == [("Basic.Ack", 1), ("Basic.Nack", 2)]
    assert [b for _, _, b in drain(c, "work")] == [b"kept"]
    assert drain(c, "dlq") == []


def test_reject_publish_dlx_dead_letters_the_refused_message() -> None:
    node, _ = setup()
    c = client(node)
    dead_letter_setup(c, "work", **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    publish(c, "work", b"kept")
    publish(c, "work", b"refused")
    ((_, header, body),) = drain(c, "dlq")
    assert (body, header.properties.headers["x-death"][0]["reason"]) == (b"refused", "maxlen")


# -- queue expiry ----------------------------------------------------------------------------------


def test_an_unused_queue_is_deleted_after_x_expires_and_use_restarts_the_clock() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "temp", **{"x-expires": 10_000})
    clock.advance(6)
    c.call(1, commands.Basic.Get(queue="temp"))
    clock.advance(6)
    assert "temp" in node.vhosts["/"].queues
    clock.advance(4)
    assert "temp" not in node.vhosts["/"].queues


def test_a_passive_declare_is_a_use_that_restarts_the_clock_as_in_rabbitmq() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "temp", **{"x-expires": 10_000})
    clock.advance(6)
    c.call(1, commands.Queue.Declare(queue="temp", passive=True))
    clock.advance(6)
    assert "temp" in node.vhosts["/"].queues
    clock.advance(4)
    assert "temp" not in node.vhosts["/"].queues


def test_a_consumed_queue_does_not_expire() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "temp", **{"x-expires": 1_000})
    consume(c, "temp")
    clock.advance(5)
    assert "temp" in node.vhosts["/"].queues


# -- scale -----------------------------------------------------------------------------------------


def test_ten_thousand_in_flight_deliveries_use_one_timer() -> None:
    node, clock = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 30_000})
    consume(c, "work")
    frames = b"".join(publish_frames(1, "", "work", b"m", commands.Basic.Properties()) for _ in range(10_000))
    c.connection.receive_data(frames)
    c.connection.data_to_send()
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(30)
    queue = node.vhosts["/"].queues["work"]
    assert queue.visibility_timeouts == 10_000
    while node.backlogged:  # the shell does this between reactor turns
        node.dispatch_backlogged()
    assert (queue.unacked_count, len(clock.getDelayedCalls())) == (10_000, 1)  # redelivered: timed again


def test_content_header_frames_are_unchanged_for_first_deliveries() -> None:
    node, _ = setup()
    c = client(node)
    declare(c, "work", **{"x-visibility-timeout": 30_000, "x-delivery-limit": 5})
    consume(c, "work")
    frames = publish(c, "work", b"x", content_type="text/plain")
    (_, header, body) = deliveries(frames)[0]
    assert (header.properties.content_type, header.properties.headers, body) == ("text/plain", None, b"x")
    assert isinstance([v for _, v in frames][-1], ContentBody)


@pytest.mark.parametrize("reason", ["rejected", "expired", "maxlen", "delivery_limit"])
def test_dead_lettering_through_the_default_exchange_reaches_the_queue_the_routing_key_names(reason: str) -> None:
    # The most common setup (x-dead-letter-exchange "" and the DLQ's name as routing key) lost
    # every dead letter: the default exchange is no entry of the exchange table.
    node, clock = setup()
    c = client(node)
    declare(c, "dlq")
    arguments: dict[str, Any] = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    arguments.update(
        {
            "expired": {"x-message-ttl": 1000},
            "maxlen": {"x-max-length": 1},
            "delivery_limit": {"x-delivery-limit": 0},
        }.get(reason, {})
    )
    declare(c, "work", **arguments)
    publish(c, "work", b"first")
    if reason == "maxlen":
        publish(c, "work", b"second")  # drops the head
    elif reason == "expired":
        clock.advance(2)
    else:
        (got,) = deliveries(c.call(1, commands.Basic.Get(queue="work")))
        c.call(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=reason == "delivery_limit"))
    ((get, header, body),) = drain(c, "dlq")
    assert body == b"first"
    assert get.routing_key == "dlq" and get.exchange == ""
    assert header.properties.headers["x-death"][0]["reason"] == reason

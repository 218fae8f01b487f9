"""Consumer priorities and single active consumers in the sans-IO core, as RabbitMQ 3.10 has them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pamqp import commands
from twisted.internet.task import Clock

from postroom.broker.core.node import Node
from postroom.broker.errors import ReplyCode
from postroom.broker.tools.testing import Client, publish_frames


def setup() -> tuple[Node, Clock]:
    clock = Clock()
    return Node(rng=random.Random(7), clock=clock), clock


def client(node: Node, channel: int = 1) -> Client:
    c = Client(node)
    c.handshake()
    c.open_channel(channel)
    return c


def consume(c: Client, queue: str, tag: str, prefetch: int = 0, **arguments: Any) -> list:
    if prefetch:
        c.call(1, commands.Basic.Qos(prefetch_count=prefetch))
    return c.call(1, commands.Basic.Consume(queue=queue, consumer_tag=tag, arguments=arguments))


def publish(c: Client, queue: str, *bodies: bytes) -> list:
    frames = b"".join(publish_frames(1, "", queue, body, commands.Basic.Properties()) for body in bodies)
    return c.send(frames)


def delivered(frames: list) -> list[tuple[str, bytes]]:
    """(consumer tag, body) of each basic.deliver in ``frames``."""
    values = [value for _, value in frames]
    found = []
    for index, value in enumerate(values):
        if isinstance(value, commands.Basic.Deliver):
            header = values[index + 1]
            found.append((value.consumer_tag, values[index + 2].value if header.body_size else b""))
    return found


def ack_all(c: Client, frames: list) -> list:
    tags = [value.delivery_tag for _, value in frames if isinstance(value, commands.Basic.Deliver)]
    return c.call(1, commands.Basic.Ack(delivery_tag=max(tags), multiple=True)) if tags else []


# -- consumer priorities ---------------------------------------------------------------------------


def test_the_highest_priority_consumer_gets_messages_until_its_prefetch_is_full() -> None:
    node, _ = setup()
    low, high, publisher = client(node), client(node), client(node)
    low.call(1, commands.Queue.Declare(queue="work"))
    consume(low, "work", "low", prefetch=3)
    consume(high, "work", "high", prefetch=3, **{"x-priority": 10})
    publish(publisher, "work", *(b"%d" % i for i in range(5)))
    got_high, got_low = delivered(high.read()), delivered(low.read())
    assert got_high == [("high", b"0"), ("high", b"1"), ("high", b"2")]
    assert got_low == [("low", b"3"), ("low", b"4")]


def test_equal_priorities_share_round_robin_and_a_lower_one_waits_while_they_can_take_more() -> None:
    node, _ = setup()
    a, b, background, publisher = client(node), client(node), client(node), client(node)
    a.call(1, commands.Queue.Declare(queue="work"))
    consume(background, "work", "background", **{"x-priority": -5})
    consume(a, "work", "a", prefetch=2, **{"x-priority": 1})
    consume(b, "work", "b", prefetch=2, **{"x-priority": 1})
    publish(publisher, "work", *(b"%d" % i for i in range(6)))
    assert [body for _, body in delivered(a.read())] == [b"0", b"2"]
    assert [body for _, body in delivered(b.read())] == [b"1", b"3"]
    assert [body for _, body in delivered(background.read())] == [b"4", b"5"]
    # An ack frees a high priority consumer: the next message is its, not the background's.
    a.call(1, commands.Basic.Ack(delivery_tag=1))
    publish(publisher, "work", b"6")
    assert delivered(a.read()) == [("a", b"6")]
    assert delivered(background.read()) == []


def test_when_the_last_higher_priority_consumer_leaves_the_rest_share_round_robin_again() -> None:
    node, _ = setup()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="work"))
    consume(c, "work", "x", **{"x-priority": 3})
    consume(c, "work", "y")
    consume(c, "work", "z")
    queue = node.vhosts["/"].queues["work"]
    assert queue.delivery.levels is not None
    c.call(1, commands.Basic.Cancel(consumer_tag="x"))
    assert queue.delivery.levels is None
    assert [tag for tag, _ in delivered(publish(c, "work", b"1", b"2", b"3", b"4"))] == ["y", "z", "y", "z"]


@pytest.mark.parametrize("value", ["high", 1.5, True])
def test_a_priority_that_is_not_an_integer_is_refused_with_406(value: Any) -> None:
    node, _ = setup()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="work"))
    frames = consume(c, "work", "bad", **{"x-priority": value})
    closing = [v for _, v in frames if isinstance(v, commands.Channel.Close)]
    assert closing[0].reply_code == ReplyCode.PRECONDITION_FAILED
    assert closing[0].reply_text.startswith("PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'work'")


def test_the_server_announces_consumer_priorities() -> None:
    from postroom.broker.amqp.handshake import CAPABILITIES

    assert CAPABILITIES["consumer_priorities"] is True


# -- single active consumer ------------------------------------------------------------------------


def sac_queue(c: Client, name: str = "ordered", **arguments: Any) -> None:
    c.call(1, commands.Queue.Declare(queue=name, arguments={"x-single-active-consumer": True, **arguments}))


def test_one_consumer_gets_everything_and_the_next_takes_over_in_queue_order_when_it_goes() -> None:
    node, _ = setup()
    first, second, publisher = client(node), client(node), client(node)
    sac_queue(first)
    consume(first, "ordered", "first", prefetch=3)
    consume(second, "ordered", "second", prefetch=100)
    publish(publisher, "ordered", *(b"%d" % i for i in range(10)))
    assert [body for _, body in delivered(first.read())] == [b"0", b"1", b"2"]
    assert delivered(second.read()) == []
    queue = node.vhosts["/"].queues["ordered"]
    assert queue.active_consumer.tag == "first"  # type: ignore[union-attr]
    assert queue.consumer_count == 2
    first.connection.connection_lost()
    assert [body for _, body in delivered(second.read())] == [b"%d" % i for i in range(10)]
    assert queue.active_consumer.tag == "second"  # type: ignore[union-attr]


def test_a_cancelled_active_consumer_keeps_its_unacked_and_the_next_gets_the_rest() -> None:
    node, _ = setup()
    c = client(node)
    sac_queue(c)
    consume(c, "ordered", "a", prefetch=2)
    consume(c, "ordered", "b", prefetch=2)
    assert delivered(publish(c, "ordered", b"0", b"1", b"2", b"3")) == [("a", b"0"), ("a", b"1")]
    frames = c.call(1, commands.Basic.Cancel(consumer_tag="a"))
    assert delivered(frames) == [("b", b"2"), ("b", b"3")]
    # a's deliveries are still the channel's: rejecting them with requeue puts them back first.
    requeued = c.call(1, commands.Basic.Nack(delivery_tag=2, multiple=True, requeue=True))
    assert delivered(requeued) == []  # b is full
    assert delivered(ack_all(c, frames)) == [("b", b"0"), ("b", b"1")]


def test_a_waiting_consumer_leaving_changes_nothing_and_the_order_of_registration_decides() -> None:
    node, _ = setup()
    c = client(node)
    sac_queue(c)
    for tag in ("a", "b", "c"):
        consume(c, "ordered", tag)
    c.call(1, commands.Basic.Cancel(consumer_tag="b"))
    queue = node.vhosts["/"].queues["ordered"]
    assert (queue.active_consumer.tag, queue.consumer_count) == ("a", 2)  # type: ignore[union-attr]
    c.call(1, commands.Basic.Cancel(consumer_tag="a"))
    assert delivered(publish(c, "ordered", b"m")) == [("c", b"m")]


def test_a_visibility_timeout_returns_the_message_to_the_active_consumer_only() -> None:
    node, clock = setup()
    first, second = client(node), client(node)
    sac_queue(first, **{"x-visibility-timeout": 1000})
    consume(first, "ordered", "first", prefetch=1)
    consume(second, "ordered", "second")
    assert delivered(publish(first, "ordered", b"slow", b"next")) == [("first", b"slow")]
    clock.advance(1.5)
    assert delivered(second.read()) == []
    assert delivered(first.read()) == [("first", b"slow")]  # the same consumer, again


def test_single_active_consumer_takes_part_in_redeclare_equivalence_and_must_be_a_bool() -> None:
    node, _ = setup()
    c = client(node)
    sac_queue(c)
    frames = c.call(1, commands.Queue.Declare(queue="ordered"))
    closing = [v for _, v in frames if isinstance(v, commands.Channel.Close)][0]
    assert closing.reply_code == ReplyCode.PRECONDITION_FAILED
    assert "inequivalent arg 'x-single-active-consumer'" in closing.reply_text
    c.open_channel(2)
    frames = c.call(2, commands.Queue.Declare(queue="other", arguments={"x-single-active-consumer": "yes"}))
    closing = [v for _, v in frames if isinstance(v, commands.Channel.Close)][0]
    assert closing.reply_text.endswith("{unacceptable_type,longstr}")


def test_a_single_active_consumer_with_priorities_delivery_limits_and_dead_lettering() -> None:
    node, _ = setup()
    first, second, publisher = client(node), client(node), client(node)
    first.call(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    first.call(1, commands.Queue.Declare(queue="dead"))
    first.call(1, commands.Queue.Bind(queue="dead", exchange="dlx"))
    sac_queue(first, **{"x-max-priority": 5, "x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    consume(first, "ordered", "first")
    consume(second, "ordered", "second")
    properties = [commands.Basic.Properties(priority=p) for p in (0, 5, 1)]
    publisher.send(b"".join(publish_frames(1, "", "ordered", b"p%d" % p.priority, p) for p in properties))
    frames = first.read()
    assert [body for _, body in delivered(frames)] == [b"p0", b"p5", b"p1"]  # delivered as they came
    tags = [v.delivery_tag for _, v in frames if isinstance(v, commands.Basic.Deliver)]
    # Two returns each: past the delivery limit of 1, every message dies to the dead-letter queue.
    for _ in range(2):
        requeued = first.call(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
        assert delivered(second.read()) == []
        tags = [v.delivery_tag for _, v in requeued if isinstance(v, commands.Basic.Deliver)]
        if tags:
            assert [body for _, body in delivered(requeued)] == [b"p5", b"p1", b"p0"]  # by priority now
    assert node.vhosts["/"].queues["dead"].message_count == 3


# -- x-remaining-ttl (Postroom's own) --------------------------------------------------------------


def expirations(frames: list) -> list[tuple[bytes, str | None]]:
    """(body, expiration) of each delivery in ``frames``."""
    values = [value for _, value in frames]
    return [
        (values[index + 2].value, values[index + 1].properties.expiration)
        for index, value in enumerate(values)
        if isinstance(value, commands.Basic.Deliver)
    ]


def test_a_consumer_asking_for_the_remaining_ttl_gets_it_as_each_messages_expiration() -> None:
    node, clock = setup()
    c, plain = client(node), client(node)
    c.call(1, commands.Queue.Declare(queue="aging", arguments={"x-message-ttl": 60_000}))
    c.call(1, commands.Queue.Declare(queue="ageless"))
    shorter = commands.Basic.Properties(expiration="30000", message_id="m-1")
    c.send(
        publish_frames(1, "", "aging", b"own", shorter)
        + publish_frames(1, "", "aging", b"queue's")
        + publish_frames(1, "", "ageless", b"none")
    )
    clock.advance(10.0004)
    frames = consume(c, "aging", "carried", **{"x-remaining-ttl": True})
    # The shorter of the two TTLs, less the 10 s spent here (rounded up to the millisecond);
    # every other property as published.
    assert expirations(frames) == [(b"own", "20000"), (b"queue's", "50000")]
    assert [v.properties.message_id for _, v in frames if hasattr(v, "properties")] == ["m-1", None]
    assert expirations(consume(c, "ageless", "untouched", **{"x-remaining-ttl": True})) == [(b"none", None)]
    # Requeued, then taken again later: less time left.
    c.call(1, commands.Basic.Cancel(consumer_tag="carried"))
    c.call(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
    clock.advance(5)
    assert expirations(consume(c, "aging", "again", **{"x-remaining-ttl": True})) == [
        (b"own", "15000"),
        (b"queue's", "45000"),
    ]
    c.call(1, commands.Basic.Cancel(consumer_tag="again"))
    c.call(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
    # Without the argument, the expiration is as it was published.
    assert expirations(consume(plain, "aging", "plain")) == [(b"own", "30000"), (b"queue's", None)]


def test_x_remaining_ttl_must_be_a_boolean() -> None:
    node, _ = setup()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="q"))
    frames = consume(c, "q", "c", **{"x-remaining-ttl": 1})
    closing = [v for _, v in frames if isinstance(v, commands.Channel.Close)][0]
    assert closing.reply_code == ReplyCode.PRECONDITION_FAILED
    assert closing.reply_text == "PRECONDITION_FAILED - invalid consumer arg 'x-remaining-ttl': 1"

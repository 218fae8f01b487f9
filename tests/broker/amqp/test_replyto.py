"""Direct reply-to (``amq.rabbitmq.reply-to``) in the sans-IO core, as RabbitMQ 3.10 has it."""

from __future__ import annotations

import random

from pamqp import commands

from postroom.broker.core.node import Node
from postroom.broker.errors import ReplyCode
from postroom.broker.tools.testing import Client, publish_frames

PSEUDO = "amq.rabbitmq.reply-to"


def client(node: Node) -> Client:
    c = Client(node)
    c.handshake()
    c.open_channel(1)
    return c


def of(frames: list, kind: type) -> list:
    return [value for _, value in frames if isinstance(value, kind)]


def request(c: Client, queue: str, body: bytes, reply_to: str = PSEUDO, mandatory: bool = False) -> list:
    properties = commands.Basic.Properties(reply_to=reply_to, correlation_id="42")
    return c.send(publish_frames(1, "", queue, body, properties, mandatory=mandatory))


def test_a_reply_goes_straight_to_the_requesters_channel_by_the_name_its_request_carried() -> None:
    node = Node(rng=random.Random(1))
    requester, responder = client(node), client(node)
    responder.call(1, commands.Queue.Declare(queue="rpc"))
    assert of(requester.call(1, commands.Basic.Consume(queue=PSEUDO, consumer_tag="replies", no_ack=True)),
              commands.Basic.ConsumeOk)  # fmt: skip
    request(requester, "rpc", b"2+2")
    got = responder.call(1, commands.Basic.Get(queue="rpc", no_ack=True))
    header = next(value for _, value in got if type(value).__name__ == "ContentHeader")
    reply_to = header.properties.reply_to
    assert reply_to.startswith(PSEUDO + ".") and len(reply_to) > len(PSEUDO) + 40
    assert header.properties.correlation_id == "42"  # the rest of the properties untouched
    responder.send(publish_frames(1, "", reply_to, b"4", commands.Basic.Properties(correlation_id="42")))
    frames = requester.read()
    (deliver,) = of(frames, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered, deliver.routing_key) == (
        "replies",
        1,
        False,
        reply_to,
    )
    assert frames[-1][1].value == b"4"
    # The pseudo-queue and the name declare passively (one consumer), as in RabbitMQ.
    ok = of(responder.call(1, commands.Queue.Declare(queue=reply_to, passive=True)), commands.Queue.DeclareOk)
    assert (ok[0].queue, ok[0].consumer_count) == (reply_to, 1)
    # Cancelled: the name is gone, replies to it are dropped, a mandatory one comes back.
    requester.call(1, commands.Basic.Cancel(consumer_tag="replies"))
    closing = of(responder.call(1, commands.Queue.Declare(queue=reply_to, passive=True)), commands.Channel.Close)
    assert closing[0].reply_code == ReplyCode.NOT_FOUND
    responder.open_channel(2)
    late = responder.send(publish_frames(2, "", reply_to, b"late", commands.Basic.Properties(), mandatory=True))
    assert of(late, commands.Basic.Return)[0].reply_code == ReplyCode.NO_ROUTE
    assert of(requester.read(), commands.Basic.Deliver) == []


def test_refusals_as_rabbitmq_words_them() -> None:
    node = Node(rng=random.Random(2))
    c = client(node)
    closing = of(c.call(1, commands.Basic.Consume(queue=PSEUDO)), commands.Channel.Close)[0]
    assert (closing.reply_code, closing.reply_text) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
    c.open_channel(2)
    closing = of(request_on(c, 2), commands.Channel.Close)[0]
    assert closing.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    c.open_channel(3)
    c.call(3, commands.Basic.Consume(queue=PSEUDO, no_ack=True))
    closing = of(c.call(3, commands.Basic.Consume(queue=PSEUDO, no_ack=True)), commands.Channel.Close)[0]
    assert closing.reply_text == "PRECONDITION_FAILED - reply consumer already set"
    c.open_channel(4)
    closing = of(c.call(4, commands.Queue.Declare(queue=PSEUDO + "X")), commands.Channel.Close)[0]
    assert closing.reply_text == f"NOT_FOUND - no queue '{PSEUDO}X' in vhost '/'"


def request_on(c: Client, channel: int) -> list:
    return c.send(publish_frames(channel, "", "anywhere", b"x", commands.Basic.Properties(reply_to=PSEUDO)))


def test_a_closed_channel_and_a_lost_connection_leave_no_reply_consumer_behind() -> None:
    node = Node(rng=random.Random(3))
    c = client(node)
    c.call(1, commands.Basic.Consume(queue=PSEUDO, no_ack=True))
    c.open_channel(2)
    c.call(2, commands.Basic.Consume(queue=PSEUDO, no_ack=True))
    assert len(node.replies) == 2
    c.call(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert len(node.replies) == 1
    c.connection.connection_lost()
    assert len(node.replies) == 0


def test_a_reply_published_in_a_transaction_goes_at_once_as_in_rabbitmq() -> None:
    node = Node(rng=random.Random(4))
    requester, responder = client(node), client(node)
    requester.call(1, commands.Basic.Consume(queue=PSEUDO, consumer_tag="replies", no_ack=True))
    responder.call(1, commands.Queue.Declare(queue="rpc"))
    request(requester, "rpc", b"q")
    got = responder.call(1, commands.Basic.Get(queue="rpc", no_ack=True))
    reply_to = next(value for _, value in got if type(value).__name__ == "ContentHeader").properties.reply_to
    responder.call(1, commands.Tx.Select())
    responder.send(publish_frames(1, "", reply_to, b"a", commands.Basic.Properties()))
    assert [d.consumer_tag for d in of(requester.read(), commands.Basic.Deliver)] == ["replies"]
    responder.call(1, commands.Tx.Rollback())
    assert of(requester.read(), commands.Basic.Deliver) == []

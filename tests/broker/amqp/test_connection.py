"""The sans-IO connection: handshake, frames, errors and the hot path, byte for byte where it matters."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp import encode as amqp_encode
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from postroom.broker.amqp.connection import ServerConnection
from postroom.broker.amqp.handshake import CAPABILITIES
from postroom.broker.amqp.seams import State
from postroom.broker.core.node import Limits, Node
from postroom.broker.core.users import User
from postroom.broker.errors import ReplyCode
from postroom.broker.tools.testing import Client, described, encode, methods, publish_frames
from postroom.broker.wire.codec import HEARTBEAT_FRAME, PROTOCOL_HEADER, decode_properties


def node() -> Node:
    return Node(users=[User("guest", "guest", loopback_only=True), User("app", "secret")], rng=random.Random(7))


def opened(n: Node | None = None, **handshake: object) -> Client:
    client = Client(n or node())
    client.handshake(**handshake)  # type: ignore[arg-type]
    assert client.connection.is_open
    client.open_channel(1)
    return client


def close_of_or_none(frames: list) -> commands.Connection.Close | commands.Channel.Close | None:
    closes = [v for _, v in frames if isinstance(v, (commands.Connection.Close, commands.Channel.Close))]
    return closes[0] if closes else None


def close_of(frames: list) -> commands.Connection.Close | commands.Channel.Close:
    closes = [v for _, v in frames if isinstance(v, (commands.Connection.Close, commands.Channel.Close))]
    assert len(closes) == 1, frames
    return closes[0]


# -- handshake ---------------------------------------------------------------------------------


def test_wrong_protocol_header_gets_ours_back_and_the_connection_closes() -> None:
    client = Client(node())
    client.connection.receive_data(b"AMQP\x00\x00\x08\x00")
    assert client.connection.data_to_send() == PROTOCOL_HEADER
    assert client.connection.closed


def test_http_request_is_refused_after_four_bytes() -> None:
    client = Client(node())
    client.connection.receive_data(b"GET ")
    assert client.connection.data_to_send() == PROTOCOL_HEADER
    assert client.connection.closed


def test_protocol_header_may_arrive_one_byte_at_a_time() -> None:
    client = Client(node())
    for byte in PROTOCOL_HEADER:
        client.connection.receive_data(bytes([byte]))
    (start,) = methods(client.read())
    assert isinstance(start, commands.Connection.Start)


def test_start_announces_mechanisms_and_rabbitmq_capabilities() -> None:
    client = Client(node())
    (start,) = methods(client.send(PROTOCOL_HEADER))
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms.split() == ["AMQPLAIN", "PLAIN"]  # RabbitMQ's order
    capabilities = start.server_properties["capabilities"]
    for name in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert capabilities[name] is True
    assert capabilities == CAPABILITIES


def test_handshake_tunes_and_opens() -> None:
    client = Client(node())
    frames = methods(client.handshake(heartbeat=30, frame_max=65536))
    assert [type(f) for f in frames] == [
        commands.Connection.Start,
        commands.Connection.Tune,
        commands.Connection.OpenOk,
    ]
    tune = frames[1]
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    assert (client.connection.frame_max, client.connection.heartbeat) == (65536, 30)


def test_amqplain_login_is_accepted() -> None:
    client = Client(node())
    client.send(PROTOCOL_HEADER)
    response = amqp_encode.field_table({"LOGIN": "app", "PASSWORD": "secret"})[4:].decode()
    (tune,) = methods(client.call(0, commands.Connection.StartOk(mechanism="AMQPLAIN", response=response)))
    assert isinstance(tune, commands.Connection.Tune)


def test_bad_password_is_refused_with_403_when_the_client_asks_for_it() -> None:
    client = Client(node())
    frames = client.handshake(password="wrong")
    close = close_of(frames)
    assert close.reply_code == ReplyCode.ACCESS_REFUSED
    assert "Login was refused using authentication mechanism PLAIN" in close.reply_text


def test_bad_password_without_the_capability_just_closes() -> None:
    client = Client(node())
    frames = client.handshake(password="wrong", capabilities={})
    assert [type(v) for v in methods(frames)] == [commands.Connection.Start]
    assert client.connection.closed


def test_guest_is_refused_from_a_remote_address() -> None:
    client = Client(node(), loopback=False)
    close = close_of(client.handshake())
    assert close.reply_code == ReplyCode.ACCESS_REFUSED


@pytest.mark.parametrize(
    ("channel_max", "frame_max", "reason"),
    [
        (2047, 1024, "negotiated frame_max = 1024 is lower than the minimum allowed value (4096)"),
        (2047, 0, "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
        (2047, 200000, "negotiated frame_max = 200000 is higher than the maximum allowed value (131072)"),
        (0, 131072, "negotiated channel_max = 0 (no limit) is higher than the maximum allowed value (2047)"),
        (4000, 131072, "negotiated channel_max = 4000 is higher than the maximum allowed value (2047)"),
    ],
)
def test_tune_ok_outside_the_limits_closes_the_socket_silently_after_a_delay(
    channel_max: int, frame_max: int, reason: str
) -> None:
    # RabbitMQ does not trust a client before connection.open: no connection.close, the socket
    # is closed after ?SILENT_CLOSE_DELAY (3 s); "0" is "no limit", above any server maximum.
    client = Client(node())
    client.send(PROTOCOL_HEADER)
    client.call(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest"))
    frames = client.call(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0))
    assert frames == []
    connection = client.connection
    assert connection.closed and connection.silent_close_delay == 3.0
    assert str(connection.error) == f"NOT_ALLOWED - {reason}"


def test_a_connection_over_max_connections_is_refused_with_530() -> None:
    n = Node(limits=Limits(max_connections=2))
    first, second = opened(n), opened(n)
    client = Client(n)
    close = close_of(client.handshake())
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530,
        "NOT_ALLOWED - connection refused: node connection limit (2, limits.max_connections) is reached",
        10,
        40,
    )
    first.call(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert first.connection.closed and second.connection.is_open
    assert opened(n).connection.is_open  # a place came free


def test_without_max_connections_the_open_file_limit_bounds_the_connections() -> None:
    n = Node()
    n.socket_limit = 1
    opened(n)
    close = close_of(Client(n).handshake())
    assert close.reply_text == (
        "NOT_ALLOWED - connection refused: node connection limit (1, the open file limit, less a reserve) is reached"
    )
    assert n.counters["connections_refused_node_limit"] == 1


def test_one_consumer_over_the_channel_limit_closes_the_connection_with_530() -> None:
    n = Node(limits=Limits(consumer_max_per_channel=2))
    client = opened(n)
    client.open_channel(2)
    client.call(1, commands.Queue.Declare(queue="q"))
    for tag in ("a", "b"):
        client.call(1, commands.Basic.Consume(queue="q", consumer_tag=tag))
    client.call(1, commands.Basic.Cancel(consumer_tag="a"))
    client.call(1, commands.Basic.Consume(queue="q", consumer_tag="c"))  # "a" left a place
    client.call(2, commands.Basic.Consume(queue="q", consumer_tag="other"))  # per channel
    assert n.vhosts["/"].queues["q"].consumer_count == 3
    # Checked before the queue, as RabbitMQ 3.12 checks it.
    close = close_of(client.call(1, commands.Basic.Consume(queue="missing")))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530,
        "NOT_ALLOWED - reached maximum (2) of consumers per channel",
        60,
        20,
    )
    assert client.connection.closed or client.connection.state.name == "CLOSING"


def test_unknown_vhost_is_refused_with_530() -> None:
    client = Client(node())
    close = close_of(client.handshake(vhost="/nope"))
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)


def test_client_close_is_answered_with_close_ok_and_ends_the_connection() -> None:
    client = opened()
    frames = methods(
        client.call(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    )
    assert [type(f) for f in frames] == [commands.Connection.CloseOk]
    assert client.connection.closed


def test_server_close_waits_for_close_ok_and_ignores_other_frames() -> None:
    client = opened()
    close = close_of(client.call(0, commands.Basic.Qos(prefetch_count=1)))  # a channel method on channel 0
    assert (close.reply_code, close.reply_text) == (
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
    )
    assert client.connection.state is State.CLOSING
    assert methods(client.call(1, commands.Basic.Qos(prefetch_count=1))) == []
    client.call(0, commands.Connection.CloseOk())
    assert client.connection.closed


# -- frame errors ------------------------------------------------------------------------------


def test_bad_frame_end_is_a_frame_error() -> None:
    client = opened()
    payload = frame.marshal(commands.Basic.Qos(prefetch_count=1), 1)
    close = close_of(client.send(payload[:-1] + b"\x00"))
    assert close.reply_code == ReplyCode.FRAME_ERROR


def test_frame_larger_than_frame_max_is_a_frame_error() -> None:
    client = opened(frame_max=4096)
    big = ContentBody(b"x" * 5000)
    close = close_of(client.send(frame.marshal(big, 1)[:100]))
    assert close.reply_code == ReplyCode.FRAME_ERROR


def test_a_frame_payload_of_exactly_frame_max_bytes_is_accepted_one_more_is_not() -> None:
    # RabbitMQ's ?FRAME_SIZE_FUDGE: the payload may be frame_max bytes (rabbitpy sends such frames).
    client = opened(frame_max=4096)
    client.call(1, commands.Queue.Declare(queue="q"))
    publish = encode(1, commands.Basic.Publish(exchange="", routing_key="q"), ContentHeader(0, 4096))
    assert close_of_or_none(client.send(publish + frame.marshal(ContentBody(b"x" * 4096), 1))) is None
    assert client.connection.node.vhosts["/"].queues["q"].message_count == 1
    close = close_of(client.send(publish + frame.marshal(ContentBody(b"x" * 4097), 1)))
    assert close.reply_code == ReplyCode.FRAME_ERROR


def test_channel_max_limits_how_many_channels_are_open_not_their_numbers() -> None:
    client = opened()  # channel 1 open, channel_max 2047
    reply = client.call(65535, commands.Channel.Open())
    assert [type(value) for _, value in reply] == [commands.Channel.OpenOk]


def test_method_on_an_unopened_channel_is_a_channel_error() -> None:
    client = opened()
    close = close_of(client.call(5, commands.Basic.Qos(prefetch_count=1)))
    assert close.reply_code == ReplyCode.CHANNEL_ERROR


def test_a_method_on_a_channel_not_open_fails_the_connection_after_the_rest_of_its_read() -> None:
    """A late ack on a channel the broker closed: the frames read behind it are handled first
    (RabbitMQ refuses it from a new channel process, after its reader went on), except that
    channel's own, then the connection closes with 504."""
    n = node()
    client = opened(n)
    client.open_channel(2)
    consumer_on(client, "q")
    opened(n).send(publish_frames(1, "", "q", b"job"))
    client.read()
    assert close_of(client.call(1, commands.Basic.Ack(delivery_tag=99))).reply_code == 406
    client.call(1, commands.Channel.CloseOk())
    late = encode(1, commands.Basic.Ack(delivery_tag=1), commands.Channel.Open())
    frames = client.send(late + encode(2, commands.Queue.Declare(queue="q", passive=True)))
    assert [type(value).__name__ for _channel, value in frames] == ["DeclareOk", "Close"]
    close = close_of(frames)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        504,
        "CHANNEL_ERROR - expected 'channel.open'",
        60,
        80,
    )
    assert 1 not in client.connection.channels


def test_a_publish_on_an_unopened_channel_is_refused_once_its_content_is_in() -> None:
    # RabbitMQ assembles the content on the new channel, then refuses the publish with 504.
    n = node()
    client = opened(n)
    publish = encode(5, commands.Basic.Publish(exchange="", routing_key="q"))
    assert client.send(publish) == []
    close = close_of(client.send(encode(5, ContentHeader(0, 2, commands.Basic.Properties()), ContentBody(b"hi"))))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        504,
        "CHANNEL_ERROR - expected 'channel.open'",
        60,
        40,
    )
    client.call(0, commands.Connection.CloseOk())
    assert n.counters["channels_opened"] == n.counters["channels_closed"] == 2


def test_body_without_header_is_an_unexpected_frame() -> None:
    client = opened()
    close = close_of(client.call(1, ContentBody(b"stray")))
    assert close.reply_code == ReplyCode.UNEXPECTED_FRAME


def test_method_where_content_is_due_is_an_unexpected_frame() -> None:
    client = opened()
    close = close_of(client.call(1, commands.Basic.Publish(routing_key="q"), commands.Basic.Qos(prefetch_count=1)))
    assert close.reply_code == ReplyCode.UNEXPECTED_FRAME


def test_an_unknown_method_closes_the_socket_without_a_word() -> None:
    client = opened()
    assert client.send(b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x03\xe7\xce") == []  # as RabbitMQ
    assert client.connection.closed


def test_second_channel_open_is_a_channel_error() -> None:
    client = opened()
    close = close_of(client.call(1, commands.Channel.Open()))
    assert close.reply_code == ReplyCode.CHANNEL_ERROR


@given(garbage=st.binary(max_size=300))
def test_garbage_after_the_handshake_never_raises(garbage: bytes) -> None:
    client = opened()
    client.connection.receive_data(garbage)
    client.read()


# -- the hot path ----------------------------------------------------------------------------------


def consumer_on(client: Client, queue: str, prefetch: int = 0, tag: str = "c1") -> None:
    client.call(1, commands.Queue.Declare(queue=queue))
    if prefetch:
        client.call(1, commands.Basic.Qos(prefetch_count=prefetch))
    client.call(1, commands.Basic.Consume(queue=queue, consumer_tag=tag))


def test_delivery_reuses_the_publishers_header_bytes_exactly() -> None:
    n = node()
    consumer = opened(n)
    consumer_on(consumer, "jobs")
    publisher = opened(n)
    properties = commands.Basic.Properties(
        content_type="application/json", headers={"tenant": "acme", "n": 3}, delivery_mode=2, message_id="m-1"
    )
    publisher.send(publish_frames(1, "", "jobs", b'{"x": 1}', properties))
    wire = consumer.connection.data_to_send()
    expected = (
        frame.marshal(
            commands.Basic.Deliver(
                consumer_tag="c1", delivery_tag=1, redelivered=False, exchange="", routing_key="jobs"
            ),
            1,
        )
        + frame.marshal(ContentHeader(0, 8, properties), 1)
        + frame.marshal(ContentBody(b'{"x": 1}'), 1)
    )
    assert wire == expected


def test_publishes_that_start_alike_are_read_whole_and_share_their_header() -> None:
    n = node()
    consumer = opened(n)
    consumer.call(1, commands.Queue.Declare(queue="jobs"), commands.Queue.Declare(queue="other"))
    publisher = opened(n)
    properties = commands.Basic.Properties(content_type="text/plain", delivery_mode=1)
    wire = b"".join(publish_frames(1, "", "jobs", b"body-%d" % i, properties) for i in range(3))
    wire += publish_frames(1, "", "jobs", b"longer body", properties)  # another size: another header
    wire += publish_frames(1, "", "other", b"body-9", properties)  # another routing key
    split = publish_frames(1, "", "other", b"body-8", properties)
    publisher.send(wire + split[:-3])  # the last body frame arrives in the next read
    publisher.send(split[-3:])
    jobs, other = (list(n.vhosts["/"].queues[name].ready_entries()) for name in ("jobs", "other"))
    assert [entry.message.body for entry in jobs] == [b"body-0", b"body-1", b"body-2", b"longer body"]
    assert [entry.message.body for entry in other] == [b"body-9", b"body-8"]
    assert jobs[1].message.header is jobs[0].message.header  # read once, kept once
    assert jobs[3].message.header != jobs[0].message.header
    assert [(entry.message.exchange, entry.message.routing_key) for entry in other] == [("", "other")] * 2
    for entry in jobs + other:
        assert decode_properties(entry.message.header) == properties


def test_bodies_larger_than_frame_max_are_split_on_delivery() -> None:
    n = node()
    consumer = opened(n, frame_max=4096)
    consumer_on(consumer, "big")
    publisher = opened(n)
    body = bytes(range(256)) * 40  # 10240 bytes
    publisher.send(publish_frames(1, "", "big", body))
    frames = methods(consumer.read())
    assert isinstance(frames[0], commands.Basic.Deliver)
    bodies = [f.value for f in frames[2:]]
    assert [len(b) for b in bodies] == [4088, 4088, 2064]
    assert b"".join(bodies) == body


@given(chunk=st.integers(min_value=1, max_value=97))
def test_chunking_is_invisible(chunk: int) -> None:
    def run(pieces: list[bytes]) -> bytes:
        n = node()
        consumer = opened(n)
        consumer_on(consumer, "q")
        publisher = opened(n)
        publisher.call(1, commands.Confirm.Select())
        for piece in pieces:
            publisher.connection.receive_data(piece)
        return publisher.connection.data_to_send() + consumer.connection.data_to_send()

    wire = b"".join(
        publish_frames(1, "", "q", bytes([i]) * i, commands.Basic.Properties(priority=i % 3)) for i in range(12)
    )
    whole = run([wire])
    assert run([wire[i : i + chunk] for i in range(0, len(wire), chunk)]) == whole


def test_confirms_for_a_batch_are_one_multiple_ack() -> None:
    client = opened()
    client.call(1, commands.Queue.Declare(queue="q"), commands.Confirm.Select())
    frames = methods(client.send(b"".join(publish_frames(1, "", "q", b"m") for _ in range(50))))
    assert described(frames) == [("Basic.Ack", {"delivery_tag": 50, "multiple": True})]


def test_mandatory_unroutable_is_returned_before_it_is_confirmed() -> None:
    client = opened()
    client.call(1, commands.Confirm.Select())
    frames = methods(client.send(publish_frames(1, "", "nowhere", b"lost?", mandatory=True)))
    assert isinstance(frames[0], commands.Basic.Return)
    assert (frames[0].reply_code, frames[0].reply_text, frames[0].routing_key) == (312, "NO_ROUTE", "nowhere")
    assert frames[2].value == b"lost?"
    assert described(frames[-1:]) == [("Basic.Ack", {"delivery_tag": 1, "multiple": False})]


def test_publish_to_a_missing_exchange_closes_the_channel_with_404_and_drops_its_frames() -> None:
    client = opened()
    frames = client.send(publish_frames(1, "missing", "k", b"x") + encode(1, commands.Basic.Qos(prefetch_count=3)))
    close = close_of(frames)
    assert (close.reply_code, close.class_id, close.method_id) == (404, 60, 40)
    assert "no exchange 'missing' in vhost '/'" in close.reply_text
    assert methods(client.call(1, commands.Channel.CloseOk())) == []
    client.open_channel(1)


def test_immediate_publish_closes_the_connection_with_540() -> None:
    client = opened()
    wire = encode(
        1,
        commands.Basic.Publish(routing_key="q", immediate=True),
        ContentHeader(0, 1, commands.Basic.Properties()),
        ContentBody(b"x"),
    )
    close = close_of(client.send(wire))
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == ReplyCode.NOT_IMPLEMENTED


def test_user_id_must_match_the_login() -> None:
    client = opened()
    client.call(1, commands.Queue.Declare(queue="q"))
    close = close_of(client.send(publish_frames(1, "", "q", b"x", commands.Basic.Properties(user_id="admin"))))
    assert close.reply_code == ReplyCode.PRECONDITION_FAILED
    client.call(1, commands.Channel.CloseOk())
    client.open_channel(1)
    assert methods(client.send(publish_frames(1, "", "q", b"x", commands.Basic.Properties(user_id="guest")))) == []
    assert client.connection.vhost.queues["q"].message_count == 1


def test_message_over_the_size_limit_is_refused_with_406() -> None:
    n = node()
    n.limits.max_message_bytes = 10
    client = opened(n)
    client.call(1, commands.Queue.Declare(queue="q"))
    close = close_of(client.send(publish_frames(1, "", "q", b"x" * 11)))
    assert close.reply_code == ReplyCode.PRECONDITION_FAILED
    assert n.vhosts["/"].queues["q"].message_count == 0


def test_ack_of_an_unknown_tag_closes_the_channel_with_406() -> None:
    client = opened()
    close = close_of(client.call(1, commands.Basic.Ack(delivery_tag=9)))
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 9")


def test_prefetch_limits_unacked_deliveries_and_an_ack_releases_more() -> None:
    n = node()
    consumer = opened(n)
    consumer_on(consumer, "q", prefetch=3)
    publisher = opened(n)
    publisher.send(b"".join(publish_frames(1, "", "q", b"%d" % i) for i in range(10)))
    delivered = [f for f in methods(consumer.read()) if isinstance(f, commands.Basic.Deliver)]
    assert [d.delivery_tag for d in delivered] == [1, 2, 3]
    frames = consumer.call(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    delivered = [f for f in methods(frames) if isinstance(f, commands.Basic.Deliver)]
    assert [d.delivery_tag for d in delivered] == [4, 5]
    assert n.vhosts["/"].queues["q"].message_count == 5


def consuming(messages: int, prefetch: int) -> tuple[Node, Client, list]:
    """A node with ``messages`` in queue ``q`` and a consumer on it; the consumer's first frames."""
    n = node()
    consumer = opened(n)
    consumer_on(consumer, "q", prefetch=prefetch)
    opened(n).send(b"".join(publish_frames(1, "", "q", b"%d" % i) for i in range(messages)))
    return n, consumer, methods(consumer.read())


def test_single_acks_in_one_read_settle_together_before_the_next_frame() -> None:
    n, consumer, delivered = consuming(5, prefetch=2)
    assert [f.delivery_tag for f in delivered if isinstance(f, commands.Basic.Deliver)] == [1, 2]
    acks = encode(1, commands.Basic.Ack(delivery_tag=1), commands.Basic.Ack(delivery_tag=2))
    frames = methods(consumer.send(acks + encode(1, commands.Basic.Get(queue="q"))))
    assert [type(f).__name__ for f in frames if not isinstance(f, ContentHeader)] == [
        "Deliver",
        "ContentBody",
        "Deliver",
        "ContentBody",
        "GetOk",
        "ContentBody",
    ]
    assert [f.value for f in frames if isinstance(f, ContentBody)] == [b"2", b"3", b"4"]
    queue = n.vhosts["/"].queues["q"]
    assert (queue.message_count, queue.unacked_count, queue.acked) == (0, 3, 2)


def test_an_unknown_tag_among_single_acks_closes_the_channel_after_settling_those_before_it() -> None:
    n, consumer, _delivered = consuming(3, prefetch=3)
    acks = encode(1, *(commands.Basic.Ack(delivery_tag=tag) for tag in (1, 9, 2)))
    close = close_of(consumer.send(acks))
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 80)
    queue = n.vhosts["/"].queues["q"]
    assert (queue.acked, queue.message_count, queue.unacked_count) == (1, 2, 0)  # 2 and 3 back in the queue


def consuming_on_two_channels(messages: int) -> tuple[Client, Any, Any]:
    """A client consuming queue ``a`` on channel 1 and ``b`` on channel 2, each holding
    ``messages`` deliveries (bodies ``b"0"``, ``b"1"``, …); the client and the two queues."""
    n = node()
    client = opened(n)
    client.open_channel(2)
    for channel, queue in ((1, "a"), (2, "b")):
        client.call(channel, commands.Queue.Declare(queue=queue))
        client.call(channel, commands.Basic.Consume(queue=queue, consumer_tag=queue))
    opened(n).send(b"".join(publish_frames(1, "", queue, b"%d" % i) for queue in "ab" for i in range(messages)))
    client.read()
    return client, n.vhosts["/"].queues["a"], n.vhosts["/"].queues["b"]


def test_runs_of_single_acks_end_at_a_multiple_ack_another_channel_or_the_end_of_a_read() -> None:
    """Single acks read together are taken in a run while the next frame is one for the same
    channel; a multiple ack, another channel's ack and a frame cut by the read end the run and
    are read as any frame."""
    first, a, b = consuming_on_two_channels(6)
    acks = encode(1, *(commands.Basic.Ack(delivery_tag=tag) for tag in (1, 2)))
    acks += encode(1, commands.Basic.Ack(delivery_tag=4, multiple=True))
    acks += encode(2, commands.Basic.Ack(delivery_tag=1)) + encode(1, commands.Basic.Ack(delivery_tag=5))
    acks += encode(2, *(commands.Basic.Ack(delivery_tag=tag) for tag in (2, 3)))
    cut = len(acks) - 5  # the last ack's frame ends in the next read
    assert first.send(acks[:cut]) == []
    assert (a.acked, a.unacked_count, b.acked, b.unacked_count) == (5, 1, 2, 4)
    assert first.send(acks[cut:]) == []
    assert (a.acked, a.unacked_count, b.acked, b.unacked_count) == (5, 1, 3, 3)


def test_acks_held_by_a_channel_are_settled_when_another_channels_settlement_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Acks of one read are taken from their channels before they settle: when one channel's
    settlement raises (a bug), the others' are settled as the connection ends, not lost."""
    client, a, b = consuming_on_two_channels(1)

    def broken(entries: list) -> None:
        raise RuntimeError("a bug in settling")

    monkeypatch.setattr(a, "settle", broken)
    with pytest.raises(RuntimeError):
        client.send(encode(1, commands.Basic.Ack(delivery_tag=1)) + encode(2, commands.Basic.Ack(delivery_tag=1)))
    client.connection.connection_lost()
    assert (b.acked, b.message_count, b.unacked_count) == (1, 0, 0)
    assert [type(error) for error in client.connection.teardown_errors] == []


def test_nack_with_requeue_redelivers_to_the_head_in_order() -> None:
    n = node()
    consumer = opened(n)
    consumer_on(consumer, "q", prefetch=2)
    publisher = opened(n)
    publisher.send(b"".join(publish_frames(1, "", "q", b"%d" % i) for i in range(4)))
    consumer.read()
    frames = methods(consumer.call(1, commands.Basic.Nack(delivery_tag=2, multiple=True, requeue=True)))
    delivers = [f for f in frames if isinstance(f, commands.Basic.Deliver)]
    bodies = [f.value for f in frames if isinstance(f, ContentBody)]
    assert [(d.delivery_tag, d.redelivered) for d in delivers] == [(3, True), (4, True)]
    assert bodies == [b"0", b"1"]


def test_closing_a_channel_requeues_its_unacked_deliveries() -> None:
    n = node()
    consumer = opened(n)
    consumer_on(consumer, "q")
    publisher = opened(n)
    publisher.send(b"".join(publish_frames(1, "", "q", b"%d" % i) for i in range(3)))
    consumer.read()
    consumer.call(1, commands.Channel.Close(reply_code=200, class_id=0, method_id=0))
    queue = n.vhosts["/"].queues["q"]
    assert (queue.message_count, queue.unacked_count) == (3, 0)
    assert [e.redelivered for e in queue.ready_entries()] == [True, True, True]


def test_exclusive_queue_is_removed_with_its_connection() -> None:
    n = node()
    client = opened(n)
    client.call(1, commands.Queue.Declare(queue="mine", exclusive=True))
    other = opened(n)
    close = close_of(other.call(1, commands.Queue.Declare(queue="mine", passive=True)))
    assert close.reply_code == ReplyCode.RESOURCE_LOCKED
    client.connection.connection_lost()
    assert "mine" not in n.vhosts["/"].queues


def test_exclusive_access_is_checked_before_equivalence_and_an_exclusive_queue_is_never_durable() -> None:
    n = node()
    owner = opened(n)
    owner.call(1, commands.Queue.Declare(queue="mine", exclusive=True, durable=True))
    owner.call(1, commands.Queue.Declare(queue="shared"))
    assert not n.vhosts["/"].queues["mine"].durable
    for durable in (False, True):  # the owner's exclusive redeclares match, durable or not
        (declare_ok,) = methods(owner.call(1, commands.Queue.Declare(queue="mine", exclusive=True, durable=durable)))
        assert isinstance(declare_ok, commands.Queue.DeclareOk)
    other = opened(n)
    attempts = [
        (owner, commands.Queue.Declare(queue="mine")),
        (owner, commands.Queue.Declare(queue="shared", exclusive=True, arguments={"x-max-length": 1})),
        (other, commands.Queue.Declare(queue="mine", exclusive=True, auto_delete=True)),
    ]
    for number, (client, declare) in enumerate(attempts, start=2):
        client.open_channel(number)
        close = close_of(client.call(number, declare))
        assert (close.reply_code, close.reply_text.split(" - ")[0]) == (405, "RESOURCE_LOCKED")
    owner.open_channel(9)
    close = close_of(owner.call(9, commands.Queue.Declare(queue="mine", exclusive=True, auto_delete=True)))
    assert close.reply_text.startswith("PRECONDITION_FAILED - inequivalent arg 'auto_delete'")


def test_server_named_queue_is_generated_and_becomes_the_current_queue() -> None:
    client = opened()
    (declare_ok,) = methods(client.call(1, commands.Queue.Declare(queue="", exclusive=True)))
    assert declare_ok.queue.startswith("amq.gen-") and len(declare_ok.queue) == 30
    (bind_ok,) = methods(client.call(1, commands.Queue.Bind(queue="", exchange="amq.direct", routing_key="k")))
    assert isinstance(bind_ok, commands.Queue.BindOk)


def test_tx_publishes_only_on_commit() -> None:
    client = opened()
    client.call(1, commands.Queue.Declare(queue="q"), commands.Tx.Select())
    client.send(publish_frames(1, "", "q", b"a"))
    queue = client.connection.vhost.queues["q"]
    assert queue.message_count == 0
    client.call(1, commands.Tx.Rollback())
    client.send(publish_frames(1, "", "q", b"b"))
    assert described(methods(client.call(1, commands.Tx.Commit()))) == [("Tx.CommitOk", {})]
    assert [e.message.body for e in queue.ready_entries()] == [b"b"]


def test_queue_delete_notifies_consumers_that_listen() -> None:
    n = node()
    consumer = opened(n)
    consumer_on(consumer, "q")
    other = opened(n)
    other.call(1, commands.Queue.Delete(queue="q"))
    assert described(methods(consumer.read())) == [("Basic.Cancel", {"consumer_tag": "c1", "nowait": True})]


def test_recover_requeues_unacked() -> None:
    n = node()
    client = opened(n)
    consumer_on(client, "q")
    client.send(publish_frames(1, "", "q", b"again"))
    client.read()
    frames = methods(client.call(1, commands.Basic.Recover(requeue=True)))
    assert ("Basic.RecoverOk", {}) in described(frames)
    redelivery = [f for f in frames if isinstance(f, commands.Basic.Deliver)]
    assert [(d.delivery_tag, d.redelivered) for d in redelivery] == [(2, True)]


# -- heartbeats ------------------------------------------------------------------------------------


def test_idle_tick_sends_a_heartbeat_and_four_silent_ticks_mean_a_dead_peer() -> None:
    client = opened(heartbeat=10)
    connection: ServerConnection = client.connection
    client.read()
    assert connection.tick() is True  # something was sent since the handshake: no heartbeat yet
    assert connection.data_to_send() == b""
    assert connection.tick() is True
    assert connection.data_to_send() == HEARTBEAT_FRAME
    connection.receive_data(frame.marshal(Heartbeat(), 0))
    assert connection.tick() is True  # heard from the peer in this interval
    assert [connection.tick() for _ in range(4)] == [True, True, True, False]


def test_a_heartbeat_on_channel_zero_is_taken_silently() -> None:
    client = opened()
    assert client.send(frame.marshal(Heartbeat(), 0)) == []
    assert client.connection.is_open


def test_a_heartbeat_on_another_channel_is_an_unexpected_frame() -> None:
    client = opened()
    close = close_of(client.send(b"\x08\x00\x01\x00\x00\x00\x00\xce"))
    assert (close.reply_code, close.class_id, close.method_id) == (ReplyCode.UNEXPECTED_FRAME, 0, 0)  # as RabbitMQ


_METHOD_INDEXES = sorted(commands.INDEX_MAPPING)


@given(index=st.sampled_from(_METHOD_INDEXES), arguments=st.binary(max_size=64), channel=st.sampled_from([0, 1]))
def test_any_method_with_garbage_arguments_gets_a_reply_code_not_a_crash(
    index: int, arguments: bytes, channel: int
) -> None:
    client = opened()
    payload = index.to_bytes(4, "big") + arguments
    client.connection.receive_data(
        bytes([1]) + channel.to_bytes(2, "big") + len(payload).to_bytes(4, "big") + payload + b"\xce"
    )
    for _, value in client.read():
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            assert 300 <= value.reply_code < 600


def test_a_frame_that_loses_the_framing_is_answered_then_nothing_more_is_read() -> None:
    # RabbitMQ's fatal frame error: its close, then 3 s without reading, then the socket closes.
    client = opened()
    frames = client.send(b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x28\x00")  # bad frame-end octet
    close = close_of(frames)
    assert (close.reply_code, close.reply_text) == (
        501,
        "FRAME_ERROR - type 1, all octets = <<0,20,0,40>>: {invalid_frame_end_marker,0}",
    )
    connection = client.connection
    assert connection.closed and connection.silent_close_delay == 3.0
    assert client.call(0, commands.Connection.CloseOk()) == []

"""Raw AMQP frames over a socket: protocol violations get RabbitMQ's reply codes.

Frames are built and read with pamqp, so each test says what it sends in AMQP terms; the few
malformed frames a library would refuse to build are written byte by byte.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pamqp import commands, exceptions, frame
from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

from postroom.broker.server import protocol as broker_protocol

pytestmark = pytest.mark.integration

AMQP_0_9_1_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"


class RawClient:
    """A blocking AMQP peer that sends and reads pamqp frames, every read bounded by a timeout."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, *values: Any) -> None:
        """Send frames (methods, content headers and bodies) on ``channel``."""
        self.send_raw(b"".join(frame.marshal(value, channel) for value in values))

    def read(self) -> tuple[int, Any]:
        """The next frame that is not a heartbeat, as ``(channel, frame)``.

        :raises EOFError: the broker closed the socket first.
        """
        while True:
            try:
                used, channel, value = frame.unmarshal(self._buffer)
            except exceptions.UnmarshalingException:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError(f"socket closed; unparsed bytes: {self._buffer!r}") from None
                self._buffer += chunk
                continue
            self._buffer = self._buffer[used:]
            if not isinstance(value, Heartbeat):
                return channel, value

    def expect(self, method_type: type[Frame], channel: int = 0) -> Any:
        """Read the next frame and check it is ``method_type`` on ``channel``."""
        got_channel, value = self.read()
        assert (got_channel, type(value)) == (channel, method_type), value
        return value

    def read_until_closed(self) -> bytes:
        """Everything the broker sends until it closes the socket."""
        data = self._buffer
        try:
            while chunk := self.sock.recv(65536):
                data += chunk
        except ConnectionResetError:  # a dropped (aborted) connection ends with a reset
            pass
        self._buffer = b""
        return data

    def expect_connection_close(self, reply_code: int) -> commands.Connection.Close:
        """Read ``connection.close`` with ``reply_code``, answer close-ok, and see the socket close."""
        close = self.expect(commands.Connection.Close)
        assert close.reply_code == reply_code, close.reply_text
        self.send(0, commands.Connection.CloseOk())
        assert self.read_until_closed() == b""
        return close


def handshake(client: RawClient, frame_max: int = 0, heartbeat: int = 0, channels: tuple[int, ...] = (1,)) -> RawClient:
    """Log ``client`` in as guest to vhost ``/`` and open ``channels``; returns ``client``.

    :param frame_max: the frame_max to ask for in tune-ok (0: accept the broker's)
    :param heartbeat: the heartbeat interval to ask for in tune-ok (0: none)
    """
    client.send_raw(ProtocolHeader().marshal())
    client.expect(commands.Connection.Start)
    client.send(
        0,
        commands.Connection.StartOk(
            client_properties={"product": "raw", "capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN",
            response="\x00guest\x00guest",
        ),
    )
    tune = client.expect(commands.Connection.Tune)
    client.send(
        0,
        commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=frame_max or tune.frame_max, heartbeat=heartbeat
        ),
        commands.Connection.Open(virtual_host="/"),
    )
    client.expect(commands.Connection.OpenOk)
    for channel in channels:
        client.send(channel, commands.Channel.Open())
        client.expect(commands.Channel.OpenOk, channel)
    return client


ConnectRaw = Callable[[], RawClient]


def method_frame(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    """A method frame written by hand (for methods pamqp does not know)."""
    payload = struct.pack(">HH", class_id, method_id) + arguments
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + FRAME_END


@pytest.fixture
def connect_raw(broker: Any) -> Iterator[ConnectRaw]:
    """Open raw sockets to ``broker``; all are closed after the test."""
    clients: list[RawClient] = []

    def connect() -> RawClient:
        clients.append(RawClient(broker.port))
        return clients[-1]

    yield connect
    for raw in clients:
        raw.close()


@pytest.fixture
def client(connect_raw: ConnectRaw) -> RawClient:
    """A raw client past the handshake, with channel 1 open."""
    return handshake(connect_raw())


@pytest.mark.parametrize("header", [b"AMQP\x01\x01\x00\x09", b"AMQP\x00\x00\x08\x00", b"GET / HTTP/1.1\r\n\r\n"])
def test_wrong_protocol_header_gets_ours_back_and_the_socket_closes(connect_raw: ConnectRaw, header: bytes) -> None:
    raw = connect_raw()

    raw.send_raw(header)

    assert raw.read_until_closed() == AMQP_0_9_1_HEADER


def test_bad_frame_end_closes_with_501_and_leaves_other_connections_alone(
    connect_raw: ConnectRaw, pika_connect: Any
) -> None:
    bystander = pika_connect().channel()
    bystander.queue_declare("kept")
    bystander.basic_publish("", "kept", b"before")
    raw = handshake(connect_raw())

    good = frame.marshal(commands.Queue.Declare(queue="x"), 1)
    raw.send_raw(good[:-1] + b"\x00")
    raw.expect_connection_close(501)

    bystander.basic_publish("", "kept", b"after")
    assert [bystander.basic_get("kept", auto_ack=True)[2] for _ in range(2)] == [b"before", b"after"]


def test_frames_after_connection_close_are_ignored_until_close_ok(client: RawClient) -> None:
    client.send_raw(frame.marshal(commands.Queue.Declare(queue="x"), 1)[:-1] + b"\x00")
    close = client.expect(commands.Connection.Close)

    client.send(1, commands.Queue.Declare(queue="ignored"))
    client.send(0, commands.Connection.CloseOk())

    assert close.reply_code == 501
    assert client.read_until_closed() == b""


@pytest.mark.parametrize(
    ("class_id", "method_id"),
    [
        (60, 999),  # basic class, no such method
        (999, 1),  # no such class
    ],
)
def test_an_unknown_method_drops_the_connection_without_a_word(
    client: RawClient, class_id: int, method_id: int
) -> None:
    # RabbitMQ's reader cannot name an unknown method: it closes the socket, sending nothing.
    client.send_raw(method_frame(1, class_id, method_id))

    assert client.read_until_closed() == b""


def test_frame_larger_than_negotiated_frame_max_closes_with_501(connect_raw: ConnectRaw) -> None:
    raw = handshake(connect_raw(), frame_max=4096)
    body = b"x" * 5000

    raw.send(
        1,
        commands.Basic.Publish(exchange="", routing_key="q"),
        ContentHeader(body_size=len(body)),
        ContentBody(body),
    )

    raw.expect_connection_close(501)


def test_method_on_unopened_channel_closes_with_504(client: RawClient) -> None:
    client.send(5, commands.Queue.Declare(queue="x"))

    client.expect_connection_close(504)


def test_second_channel_open_closes_with_504(client: RawClient) -> None:
    client.send(1, commands.Channel.Open())

    close = client.expect_connection_close(504)

    assert (close.class_id, close.method_id) == (20, 10)


def test_content_body_without_header_closes_with_505(client: RawClient) -> None:
    client.send(1, ContentBody(b"orphan"))

    client.expect_connection_close(505)


def test_content_header_without_publish_closes_with_505(client: RawClient) -> None:
    client.send(1, ContentHeader(body_size=3))

    client.expect_connection_close(505)


def test_method_between_publish_and_content_closes_with_505(client: RawClient) -> None:
    client.send(1, commands.Basic.Publish(exchange="", routing_key="q"), commands.Queue.Declare(queue="x"))

    client.expect_connection_close(505)


def test_immediate_publish_closes_with_540(client: RawClient) -> None:
    client.send(
        1,
        commands.Basic.Publish(exchange="", routing_key="q", immediate=True),
        ContentHeader(body_size=2),
        ContentBody(b"hi"),
    )

    close = client.expect_connection_close(540)

    assert (close.class_id, close.method_id) == (60, 40)
    assert close.reply_text == "NOT_IMPLEMENTED - immediate=true"


def test_wrong_password_with_failure_close_capability_gets_403(connect_raw: ConnectRaw) -> None:
    raw = connect_raw()
    raw.send_raw(ProtocolHeader().marshal())
    raw.expect(commands.Connection.Start)

    raw.send(
        0,
        commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN",
            response="\x00guest\x00nope",
        ),
    )

    close = raw.expect_connection_close(403)
    assert (close.class_id, close.method_id) == (10, 11)


def test_channel_error_closes_only_the_channel(client: RawClient) -> None:
    client.send(2, commands.Channel.Open())
    client.expect(commands.Channel.OpenOk, 2)

    client.send(1, commands.Queue.Declare(queue="missing", passive=True))
    close = client.expect(commands.Channel.Close, 1)
    client.send(1, commands.Channel.CloseOk())
    client.send(2, commands.Queue.Declare(queue="works"))

    assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
    assert client.expect(commands.Queue.DeclareOk, 2).queue == "works"


def test_publish_and_get_round_trip_over_raw_frames(client: RawClient) -> None:
    client.send(1, commands.Queue.Declare(queue="raw"))
    client.expect(commands.Queue.DeclareOk, 1)
    properties = commands.Basic.Properties(content_type="text/plain", headers={"k": "v"})

    client.send(
        1,
        commands.Basic.Publish(exchange="", routing_key="raw"),
        ContentHeader(body_size=5, properties=properties),
        ContentBody(b"hello"),
        commands.Basic.Get(queue="raw", no_ack=True),
    )

    get_ok = client.expect(commands.Basic.GetOk, 1)
    header = client.expect(ContentHeader, 1)
    body = client.expect(ContentBody, 1)
    assert (get_ok.delivery_tag, get_ok.routing_key, get_ok.message_count) == (1, "raw", 0)
    assert (header.body_size, header.properties.content_type, header.properties.headers) == (
        5,
        "text/plain",
        {"k": "v"},
    )
    assert body.value == b"hello"


def test_pika_still_connects_after_a_refused_header(connect_raw: ConnectRaw, pika_connect: Any) -> None:
    raw = connect_raw()
    raw.send_raw(b"XXXXXXXX")
    raw.read_until_closed()

    channel = pika_connect().channel()

    assert isinstance(channel, pika.adapters.blocking_connection.BlockingChannel)
    assert channel.queue_declare("").method.queue.startswith("amq.gen-")


def test_prefetch_size_is_not_implemented_540(client: RawClient) -> None:
    client.send(1, commands.Basic.Qos(prefetch_size=4096, prefetch_count=1))

    close = client.expect_connection_close(540)

    assert (close.class_id, close.method_id) == (60, 10)


# -- timers -----------------------------------------------------------------------------------


def test_stalled_handshake_is_dropped(connect_raw: ConnectRaw, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_protocol, "HANDSHAKE_TIMEOUT", 0.2)
    raw = connect_raw()
    raw.send_raw(ProtocolHeader().marshal())
    raw.expect(commands.Connection.Start)
    started = time.monotonic()

    rest = raw.read_until_closed()  # no start-ok: the broker gives up

    assert rest == b""
    assert 0.1 < time.monotonic() - started < 3


def test_missing_close_ok_drops_the_socket(client: RawClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_protocol, "CLOSE_TIMEOUT", 0.2)
    client.send(5, commands.Queue.Declare(queue="x"))
    close = client.expect(commands.Connection.Close)
    started = time.monotonic()

    rest = client.read_until_closed()  # never answer close-ok

    assert (close.reply_code, rest) == (504, b"")
    assert 0.1 < time.monotonic() - started < 3


def test_silent_client_gets_heartbeats_then_is_dropped(connect_raw: ConnectRaw) -> None:
    raw = handshake(connect_raw(), heartbeat=1, channels=())
    started = time.monotonic()

    received = raw.read_until_closed()  # the client never sends a heartbeat back
    elapsed = time.monotonic() - started

    heartbeat = Heartbeat().marshal()
    assert len(received) >= len(heartbeat)
    assert received == heartbeat * (len(received) // len(heartbeat))
    assert 1.5 < elapsed < 4.5  # dropped after two heartbeat intervals without a frame


# -- publisher confirms around a closing channel ----------------------------------------------


def frames_until(client: RawClient, method_type: type[Frame], channel: int) -> list[tuple[int, str]]:
    """``(channel, frame name)`` of each frame read up to and including ``method_type`` on ``channel``."""
    seen = []
    while True:
        got_channel, value = client.read()
        seen.append((got_channel, value.name))
        if (got_channel, type(value)) == (channel, method_type):
            return seen


def confirming_client(raw: RawClient) -> RawClient:
    """Log ``raw`` in with channel 1 in confirm mode, channel 2 plain, and queue ``q`` declared."""
    handshake(raw, channels=(1, 2))
    raw.send(1, commands.Confirm.Select(), commands.Queue.Declare(queue="q"))
    raw.expect(commands.Confirm.SelectOk, 1)
    raw.expect(commands.Queue.DeclareOk, 1)
    return raw


def publish_frames(exchange: str, body: bytes) -> tuple[Any, ...]:
    return (
        commands.Basic.Publish(exchange=exchange, routing_key="q"),
        ContentHeader(body_size=len(body)),
        ContentBody(body),
    )


def test_no_confirm_follows_a_channel_close_from_the_broker(connect_raw: ConnectRaw) -> None:
    raw = confirming_client(connect_raw())

    raw.send(1, *publish_frames("", b"ok"), *publish_frames("missing", b"refused"))
    seen = frames_until(raw, commands.Channel.Close, 1)
    raw.send(1, commands.Channel.CloseOk())
    raw.send(2, commands.Queue.Declare(queue="q", passive=True))
    seen += frames_until(raw, commands.Queue.DeclareOk, 2)

    on_channel_1 = [name for channel, name in seen if channel == 1]
    assert on_channel_1 in (["Basic.Ack", "Channel.Close"], ["Channel.Close"])


def test_no_confirm_follows_close_ok_when_the_client_closes_the_channel(connect_raw: ConnectRaw) -> None:
    raw = confirming_client(connect_raw())

    raw.send(
        1,
        *publish_frames("", b"ok"),
        commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
    )
    raw.send(2, commands.Queue.Declare(queue="q", passive=True))
    seen = frames_until(raw, commands.Queue.DeclareOk, 2)

    on_channel_1 = [name for channel, name in seen if channel == 1]
    assert on_channel_1 in (["Basic.Ack", "Channel.CloseOk"], ["Channel.CloseOk"])

"""Fuzzing the sans-IO cores: bytes from strangers go in, a reply code or an action comes out.

:func:`run_once` feeds one input to a fresh :class:`ServerConnection` and checks the invariant
that holds for any input: the core acts or closes with a reply code, never raises, never
closes with 541 INTERNAL_ERROR (RabbitMQ's bare 541 for content properties that do not parse
is the one 541 it sends on purpose, and is allowed), and releases what it held. The first byte
of an input chooses whether a valid session start comes first (handshake, two channels, a
queue with a consumer, confirms) and in what pieces the bytes arrive.

:func:`method_frame` builds a method frame from pamqp's method table with any argument values,
encoded by hand (pamqp refuses to marshal values a client should not send), for structured
inputs: ``tests/broker/amqp/test_fuzz_core.py`` draws them with hypothesis, and
``bench/fuzz_core.py`` seeds atheris, the coverage-guided fuzzer, with them.

:func:`stream_run_once` does the same for the stream protocol's
:class:`~broker.streams.connection.StreamConnection` (``tests/broker/test_stream_fuzz.py``,
``bench/fuzz_streams.py``): after an optional session start (a stream with messages, a
publisher, a subscription, a single-active-consumer group shared with a second connection), the
connection answers or closes, never raises, never answers 15 INTERNAL_ERROR, and once gone
leaves no publisher, subscription, group member or watcher behind.
"""

from __future__ import annotations

import gzip
import random
import struct
from collections.abc import Sequence
from typing import Any

from pamqp import commands
from pamqp.base import Frame

from postroom.broker.amqp.connection import ServerConnection
from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.stream import StreamQueue
from postroom.broker.core.users import User
from postroom.broker.storage.streams import StreamFiles
from postroom.broker.streams.connection import StreamConnection
from postroom.broker.streams.handshake import FRAME_MAX
from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.chunks import BATCH_HEAD, pack_raw_entries
from postroom.broker.wal.streamlog import StreamLog
from postroom.broker.wire import streamframes as stream_wire
from postroom.broker.wire.codec import FRAME_METHOD, PROTOCOL_HEADER
from postroom.broker.wire.table import encode_table

__all__ = [
    "SESSION_START", "STREAM_SESSION_START", "method_frame", "raw_frame", "run_once", "stream_request",
    "stream_publish", "stream_run_once", "sub_entry_batch", "mqtt_connect", "mqtt_packet", "mqtt_run_once",
    "mqtt_string", "MQTT_SESSION_START",
]  # fmt: skip

_frame_head = struct.Struct(">BHI")
_CONNECTION_CLOSE = 0x000A0032
#: RabbitMQ's bare 541 for content properties that do not parse (``rabbit_binary_parser``).
_BARE_541 = b"INTERNAL_ERROR"


def raw_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """A frame of any type, channel and payload."""
    return _frame_head.pack(frame_type, channel, len(payload)) + payload + b"\xce"


def _argument(amqp_type: str, value: Any) -> bytes:
    if amqp_type == "octet":
        return struct.pack(">B", value & 0xFF)
    if amqp_type == "short":
        return struct.pack(">H", value & 0xFFFF)
    if amqp_type == "long":
        return struct.pack(">I", value & 0xFFFFFFFF)
    if amqp_type in ("longlong", "timestamp"):
        return struct.pack(">Q", value & 0xFFFFFFFFFFFFFFFF)
    if amqp_type == "shortstr":
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        return bytes([len(data[:255])]) + data[:255]
    if amqp_type == "longstr":
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        return struct.pack(">I", len(data)) + data
    if amqp_type == "table":
        return encode_table(value)
    raise ValueError(f"no encoding for {amqp_type}")


def method_frame(channel: int, method: type[Frame], **values: Any) -> bytes:
    """``method`` on ``channel`` with ``values`` (the rest zero or empty), encoded as sent."""
    payload = struct.pack(">I", method.index)
    bits: list[bool] = []
    for name in method.__slots__:
        amqp_type = method.amqp_type(name)
        if amqp_type == "bit":
            bits.append(bool(values.get(name, False)))
            continue
        if bits:
            payload += bytes([sum(1 << index for index, bit in enumerate(bits) if bit)])
            bits = []
        default: Any = {} if amqp_type == "table" else "" if amqp_type.endswith("str") else 0
        payload += _argument(amqp_type, values.get(name, default))
    if bits:
        payload += bytes([sum(1 << index for index, bit in enumerate(bits) if bit)])
    return raw_frame(FRAME_METHOD, channel, payload)


#: A valid session start, with a queue ``q`` consumed on channel 1 and confirms on channel 2.
SESSION_START = (
    PROTOCOL_HEADER
    + method_frame(
        0,
        commands.Connection.StartOk,
        client_properties={"capabilities": {"connection.blocked": True, "consumer_cancel_notify": True}},
        mechanism="PLAIN",
        response="\x00guest\x00guest",
        locale="en_US",
    )
    + method_frame(0, commands.Connection.TuneOk, channel_max=16, frame_max=4096, heartbeat=0)
    + method_frame(0, commands.Connection.Open, virtual_host="/")
    + method_frame(1, commands.Channel.Open)
    + method_frame(1, commands.Queue.Declare, queue="q")
    + method_frame(1, commands.Basic.Consume, queue="q", consumer_tag="c")
    + method_frame(2, commands.Channel.Open)
    + method_frame(2, commands.Confirm.Select)
)


def _internal_errors(output: bytes) -> list[bytes]:
    """The reply texts of every ``connection.close`` 541 in ``output`` that is not RabbitMQ's bare one."""
    found = []
    pos = 8 if output.startswith(b"AMQP") else 0
    while len(output) - pos >= 8:
        frame_type, _channel, size = _frame_head.unpack_from(output, pos)
        payload = output[pos + 7 : pos + 7 + size]
        pos += 8 + size
        is_close = frame_type == FRAME_METHOD and len(payload) >= 7
        if is_close and struct.unpack_from(">I", payload)[0] == _CONNECTION_CLOSE:
            code = struct.unpack_from(">H", payload, 4)[0]
            text = payload[7 : 7 + payload[6]]
            if code == 541 and text != _BARE_541:
                found.append(text)
    return found


def run_once(data: bytes) -> None:
    """Feed ``data`` to a fresh connection (see the module's text).

    :raises AssertionError: the core closed with an internal error, or failed to release
    :raises Exception: whatever escaped the core: every such exception is a bug
    """
    if not data:
        return
    mode, data = data[0], data[1:]
    stream = SESSION_START + data if mode & 1 else data
    step = 1 + (mode >> 1) * 8  # 1 to 1,017 bytes per read
    node = Node(users=[User("guest", "guest")], rng=random.Random(0))
    connection = ServerConnection(node, peer="fuzz")
    for start in range(0, len(stream), step):
        connection.receive_data(stream[start : start + step])
        if connection.replies_held:  # the shell would write them first
            connection.replies_held = False
        output = connection.data_to_send()
        errors = _internal_errors(output)
        assert not errors, f"541 INTERNAL_ERROR: {errors}"
        if connection.closed:
            break
    connection.connection_lost()
    assert not node.connections, "the connection is still listed after it was lost"
    assert all(not queue.consumers for vhost in node.vhosts.values() for queue in vhost.queues.values()), (
        "a consumer outlived its connection"
    )


# -- the stream protocol -----------------------------------------------------------------------


def stream_request(key: int, correlation: int, body: bytes = b"") -> bytes:
    """A stream-protocol request frame: ``key``, its correlation id, then ``body``."""
    return stream_wire.frame(key, struct.pack(">I", correlation) + body)


def stream_publish(
    publisher: int, messages: list[tuple[int, bytes]], batches: Sequence[tuple[int, bytes]] = ()
) -> bytes:
    """A ``publish`` frame of ``(publishing id, message)`` pairs, then of ``(publishing id,
    sub-entry batch)`` pairs (:func:`sub_entry_batch`)."""
    body = struct.pack(">BI", publisher, len(messages) + len(batches))
    body += b"".join(struct.pack(">QI", number, len(data)) + data for number, data in messages)
    body += b"".join(struct.pack(">Q", number) + batch for number, batch in batches)
    return stream_wire.frame(stream_wire.PUBLISH, body)


def sub_entry_batch(messages: list[bytes], compression: int = 0) -> bytes:
    """The stream protocol's sub-entry batch of ``messages`` (osiris's: several messages as
    one entry), gzipped with ``compression`` 1, as rstream's ``send_sub_entry`` sends it."""
    data = pack_raw_entries(messages)
    stored = gzip.compress(data, mtime=0) if compression == 1 else data
    return BATCH_HEAD.pack(0x80 | compression << 4, len(messages), len(data), len(stored)) + stored


def _stream_handshake() -> bytes:
    plain = stream_wire.string("PLAIN") + struct.pack(">I", 12) + b"\0guest\0guest"
    return b"".join([
        stream_request(stream_wire.PEER_PROPERTIES, 1, stream_wire.string_map({"product": "fuzz"})),
        stream_request(stream_wire.SASL_HANDSHAKE, 2),
        stream_request(stream_wire.SASL_AUTHENTICATE, 3, plain),
        stream_wire.frame(stream_wire.TUNE | stream_wire.RESPONSE, struct.pack(">II", FRAME_MAX, 0)),
        stream_request(stream_wire.OPEN, 4, stream_wire.string("/")),
    ])  # fmt: skip


def _subscribe(correlation: int, subscription: int, properties: dict[str, str]) -> bytes:
    body = struct.pack(">B", subscription) + stream_wire.string("s") + struct.pack(">hH", stream_wire.OFFSET_FIRST, 2)
    return stream_request(stream_wire.SUBSCRIBE, correlation, body + stream_wire.string_map(properties))


#: A valid session start: stream ``s`` with two messages from publisher 1 (reference ``p``) and
#: two sub-entry batches (one gzipped),
#: subscription 1 on it from the first offset, offset ``c`` stored, and subscription 2 in
#: the single-active-consumer group ``g`` (shared with a second connection).
STREAM_SESSION_START = b"".join([
    _stream_handshake(),
    stream_request(stream_wire.CREATE_STREAM, 5, stream_wire.string("s") + stream_wire.string_map({})),
    stream_request(stream_wire.DECLARE_PUBLISHER, 6, b"\x01" + stream_wire.string("p") + stream_wire.string("s")),
    stream_publish(1, [(1, b"\x00Sw\xa1\x01a"), (2, b"\x00Sw\xa1\x01b")]),
    stream_publish(1, [], [(3, sub_entry_batch([b"\x00Sw\xa1\x01c", b"d"])), (4, sub_entry_batch([b"e"], 1))]),
    _subscribe(7, 1, {}),
    stream_wire.frame(stream_wire.STORE_OFFSET, stream_wire.string("c") + stream_wire.string("s") + bytes(8)),
    _subscribe(8, 2, {"single-active-consumer": "true", "name": "g"}),
])  # fmt: skip


class _MemoryStreams(StreamFiles):
    """Streams kept in memory (each run starts with none)."""

    def open(self, name: str, vhost_name: str, arguments: Any) -> StreamQueue:
        log = StreamLog(MemorySegmentStorage(), 64 * 1024)
        log.open()
        stream = StreamQueue(name, vhost_name, arguments, log, self.clock, store=self)
        self._paths[stream] = name
        return stream


class _NoClock:
    def seconds(self) -> float:
        return 0.0

    def callLater(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (Twisted's name)
        raise AssertionError("the stream connection set a timer")


def _write_streams(journal: Journal) -> None:
    """What the log writer does with the streams' waiting messages, and then a sync."""
    for stream, staged, dropped in journal.take_streams():
        stream.log.write(staged)
        stream.log.remove(dropped)
        stream.written(staged)
    journal.take_stream_deletions()
    journal.synced_to(journal.position)


def _internal_error_codes(out: list[bytes]) -> list[bytes]:
    """Frames in ``out`` that answer or close with 15 INTERNAL_ERROR."""
    found = []
    for frame in stream_wire.FrameReader().feed(b"".join(out)):
        key = struct.unpack_from(">H", frame)[0]
        if (key & stream_wire.RESPONSE and len(frame) >= 10 and struct.unpack_from(">H", frame, 8)[0] == 15) or (
            key == stream_wire.CLOSE and len(frame) >= 10 and struct.unpack_from(">H", frame, 8)[0] == 15
        ):
            found.append(frame)
    return found


def stream_run_once(data: bytes) -> None:
    """Feed ``data`` to a fresh stream connection (see the module's text). The first byte:
    bit 0, the session start first; bit 1, a second connection in group ``g``; the rest, the
    size of each read (1 to 505 bytes).

    :raises AssertionError: the connection answered with an internal error, or failed to release
    :raises Exception: whatever escaped the connection: every such exception is a bug
    """
    if not data:
        return
    mode, data = data[0], data[1:]
    stream = STREAM_SESSION_START + data if mode & 1 else data
    step = 1 + (mode >> 2) * 8
    journal = Journal(1)
    node = Node(users=[User("guest", "guest")], rng=random.Random(0))
    node.set_streams(_MemoryStreams("", journal, _NoClock()))
    connections = []
    if mode & 2:
        other = StreamConnection(node, "127.0.0.1:2", True, ("127.0.0.1", 5552))
        other.receive(STREAM_SESSION_START)
        _write_streams(journal)
        connections.append(other)
    connection = StreamConnection(node, "127.0.0.1:1", True, ("127.0.0.1", 5552))
    connections.append(connection)
    for start in range(0, len(stream), step):
        connection.receive(stream[start : start + step])
        _write_streams(journal)
        for each in connections:
            errors = _internal_error_codes(each.out)
            assert not errors, f"15 INTERNAL_ERROR: {errors}"
            each.out.clear()
        if connection.finished:
            break
    for each in connections:
        each.connection_lost()
    assert not node.stream_connections, "a connection is still listed after it was lost"
    for vhost in node.vhosts.values():
        for queue in vhost.queues.values():
            if isinstance(queue, StreamQueue):
                assert not queue.watchers, f"stream {queue.name!r} still has watchers"
                assert not any(queue.stream_groups.values()), f"stream {queue.name!r} still has group members"


# -- MQTT ------------------------------------------------------------------------------------


def mqtt_packet(first: int, body: bytes) -> bytes:
    """An MQTT packet: its first byte, the remaining length, ``body``."""
    length, header = len(body), bytearray([first])
    while True:
        byte, length = length & 0x7F, length >> 7
        header.append(byte | 0x80 if length else byte)
        if not length:
            return bytes(header) + body


def mqtt_string(value: str) -> bytes:
    data = value.encode("utf-8", "surrogateescape")
    return struct.pack(">H", len(data)) + data


def mqtt_connect(client_id: str, clean: bool = True, keep_alive: int = 0, level: int = 4) -> bytes:
    """A CONNECT of MQTT 3.1.1 (or with ``level`` 5, of MQTT 5.0, with no properties), no user
    name (the anonymous login)."""
    variable = mqtt_string("MQTT") + bytes([level, 0x02 if clean else 0]) + struct.pack(">H", keep_alive)
    return mqtt_packet(0x10, variable + (b"\x00" if level == 5 else b"") + mqtt_string(client_id))


#: A session's start: connected, subscribed at each QoS, a message published at each QoS
#: (one retained) and a QoS 2 exchange begun.
MQTT_SESSION_START = b"".join([
    mqtt_packet(0x82, struct.pack(">H", 1) + mqtt_string("a/#") + b"\x01" + mqtt_string("b/+") + b"\x02"),
    mqtt_packet(0x82, struct.pack(">H", 2) + mqtt_string("#") + b"\x00"),
    mqtt_packet(0x30, mqtt_string("a/x") + b"zero"),
    mqtt_packet(0x33, mqtt_string("a/y") + struct.pack(">H", 7) + b"one"),
    mqtt_packet(0x34, mqtt_string("b/z") + struct.pack(">H", 8) + b"two"),
])  # fmt: skip


def mqtt_run_once(data: bytes) -> None:
    """Feed ``data`` to a fresh MQTT connection. The first byte: bit 0, a CONNECT first (bit 1:
    a persistent session; bit 3: at MQTT 5.0) and the session start after it; bit 2, a second
    client subscribed to every topic at QoS 2, which acknowledges nothing; the rest, the size
    of each read (1 to 241 bytes). Whatever the bytes, the connection answers or ends, never raises, every packet it
    writes reads back, and once gone it is no longer listed, holds no consumer, and leaves a
    clean session nothing.

    :raises AssertionError: what it wrote does not read back, or it failed to release
    :raises Exception: whatever escaped the connection: every such exception is a bug
    """
    from postroom.broker.mqtt.connection import MqttConnection
    from postroom.broker.mqtt.registry import MqttRegistry
    from postroom.broker.wire.mqtt import PacketReader

    if not data:
        return
    mode, data = data[0], data[1:]
    level = 5 if mode & 8 else 4
    start = mqtt_connect("fuzz", clean=not mode & 2, level=level) + MQTT_SESSION_START if mode & 1 else b""
    stream = start + data
    step = 1 + (mode >> 4) * 16
    node = Node(users=[User("guest", "guest")], rng=random.Random(0))
    registry = MqttRegistry(node)
    other = None
    if mode & 4:
        other = MqttConnection(registry, "127.0.0.1:2", True)
        other.receive(mqtt_connect("other") + mqtt_packet(0x82, struct.pack(">H", 1) + mqtt_string("#") + b"\x02"))
    connection = MqttConnection(registry, "127.0.0.1:1", True)
    for at in range(0, len(stream), step):
        connection.receive(stream[at : at + step])
        PacketReader().feed(connection.take_output())  # (it raises on what does not read back)
        if connection.finished:
            break
    connection.connection_lost()
    if other is not None:
        PacketReader().feed(other.take_output())
        other.connection_lost()
    assert not node.mqtt_connections and not registry.clients, "a connection is still listed after it was lost"
    for vhost in node.vhosts.values():
        for queue in vhost.queues.values():
            assert not list(queue.consumers), f"a consumer of {queue.name} outlived its connection"
            if queue.name.endswith(("fuzzqos0", "fuzzqos1")) and not mode & 2:
                raise AssertionError(f"a clean session left {queue.name}")

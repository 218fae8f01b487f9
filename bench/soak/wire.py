"""AMQP 0-9-1 on the wire, for the soak tools: frame splitting, a field-table scanner, a raw client.

The fuzzer (``fuzz.py``) works on recorded client byte streams: :func:`split_session` cuts
one into the protocol header and whole frames, and :func:`find_tables` finds the field
tables inside a frame's payload (with the offsets of their length fields and type tags),
so that mutations can aim at them and keep the enclosing lengths right when they want the
damage to reach the decoder rather than the framer. :class:`ReplyReader` follows what the
server answers and picks out its ``connection.close`` and ``channel.close`` reply codes.

The soak tool (``soak.py``) needs a client that can stop reading its socket, reset it in
the middle of a frame or go silent with heartbeats negotiated: :class:`RawClient`, a
blocking socket plus pamqp for encoding and decoding, and nothing else.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

#: AMQP 0-9-1 §4.2.2: the eight bytes a client sends first.
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
#: Frame header (type, channel, payload size) and frame-end around every payload.
FRAME_OVERHEAD = 8
FRAME_HEAD = struct.Struct(">BHI")
#: The broker's default ``frame_max`` (docs/configuration.md); the clients here tune to it.
FRAME_MAX = 131072

#: Field-value type tags RabbitMQ accepts (its ``rabbit_binary_parser``), with fixed widths.
#: ``None`` marks the tags whose value carries its own 32-bit length (strings, arrays, tables).
TAG_WIDTHS: dict[int, int | None] = {
    ord("t"): 1,
    ord("b"): 1,
    ord("B"): 1,
    ord("s"): 2,
    ord("u"): 2,
    ord("I"): 4,
    ord("i"): 4,
    ord("l"): 8,
    ord("L"): 8,
    ord("f"): 4,
    ord("d"): 8,
    ord("D"): 5,
    ord("T"): 8,
    ord("V"): 0,
    ord("S"): None,
    ord("x"): None,
    ord("A"): None,
    ord("F"): None,
}

#: Frames larger than this are not scanned for tables: the scan tries every offset, and the
#: recorded frames are all far smaller (a grown frame is one a mutation already blew up).
SCAN_LIMIT = 16384

#: Nesting deeper than this is not followed by the scanner (it only has to find targets).
SCAN_DEPTH = 32

_u32 = struct.Struct(">I")


# -- sessions and frames ------------------------------------------------------------------------


def split_session(data: bytes) -> tuple[bytes, list[bytes]]:
    """Cut a client byte stream into its protocol header and its whole frames.

    :raises ValueError: the stream does not start with the protocol header or does not end on
        a frame boundary, or a frame does not end with the frame-end octet.
    """
    if not data.startswith(PROTOCOL_HEADER):
        raise ValueError("the stream does not start with the AMQP 0-9-1 protocol header")
    frames = []
    offset = len(PROTOCOL_HEADER)
    while offset < len(data):
        if len(data) - offset < FRAME_OVERHEAD:
            raise ValueError(f"{len(data) - offset} stray bytes at offset {offset}")
        _type, _channel, size = FRAME_HEAD.unpack_from(data, offset)
        end = offset + FRAME_OVERHEAD + size
        if end > len(data) or data[end - 1] != FRAME_END:
            raise ValueError(f"frame at offset {offset} is cut short or lacks its frame-end")
        frames.append(data[offset:end])
        offset = end
    return PROTOCOL_HEADER, frames


def frame_bytes(frame_type: int, channel: int, payload: bytes) -> bytes:
    """One frame around ``payload``."""
    return FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + bytes((FRAME_END,))


def describe_frame(data: bytes) -> str:
    """A short human name for a (possibly mutated) frame: ``1/ch1 queue.declare`` and so on."""
    if len(data) < 7:
        return f"fragment({data.hex()})"
    frame_type, channel, _size = FRAME_HEAD.unpack_from(data)
    name = {FRAME_METHOD: "method", FRAME_HEADER: "header", FRAME_BODY: "body", FRAME_HEARTBEAT: "heartbeat"}
    label = name.get(frame_type, f"type{frame_type}")
    if frame_type == FRAME_METHOD and len(data) >= 11:
        index = _u32.unpack_from(data, 7)[0]
        method = commands.INDEX_MAPPING.get(index)
        label = method.name if method is not None else f"method {index >> 16}/{index & 0xFFFF}"
    return f"ch{channel} {label}"


# -- field tables ---------------------------------------------------------------------------------


@dataclass
class TableSpan:
    """One field table (or array) found in a payload.

    :ivar length_at: offset of its 32-bit length field
    :ivar end: offset just past its last byte
    :ivar tags: offsets of the type tags of its values (its own, not its children's)
    :ivar lengths: ``(offset, width)`` of every length field inside it: key lengths (1 byte)
        and value lengths (4 bytes), its children's included
    :ivar array: an array (``A``) rather than a table
    """

    length_at: int
    end: int
    tags: list[int] = field(default_factory=list)
    lengths: list[tuple[int, int]] = field(default_factory=list)
    array: bool = False


def _parse_value(
    data: bytes, offset: int, limit: int, depth: int, owner: TableSpan, spans: list[TableSpan]
) -> int | None:
    """Parse one tagged value of ``owner`` at ``offset``; return the offset past it, or ``None``."""
    if offset >= limit:
        return None
    tag = data[offset]
    if tag not in TAG_WIDTHS:
        return None
    width = TAG_WIDTHS[tag]
    offset += 1
    if width is not None:
        return offset + width if offset + width <= limit else None
    if offset + 4 > limit:
        return None
    if tag in (ord("F"), ord("A")):
        if depth >= SCAN_DEPTH:
            return None
        return _parse_container(data, offset, limit, depth + 1, tag == ord("A"), owner, spans)
    size = _u32.unpack_from(data, offset)[0]
    owner.lengths.append((offset, 4))
    end = offset + 4 + size
    return end if end <= limit else None


def _parse_container(
    data: bytes, length_at: int, limit: int, depth: int, array: bool, parent: TableSpan | None, spans: list[TableSpan]
) -> int | None:
    """Parse a table or array whose length field is at ``length_at``; return its end or ``None``."""
    size = _u32.unpack_from(data, length_at)[0]
    start = length_at + 4
    end = start + size
    if end > limit:
        return None
    span = TableSpan(length_at, end, array=array)
    spans.append(span)
    offset = start
    while offset < end:
        if not array:
            key_size = data[offset]
            if key_size == 0 or offset + 1 + key_size > end:
                return None
            span.lengths.append((offset, 1))
            offset += 1 + key_size
        span.tags.append(offset)
        after = _parse_value(data, offset, end, depth, span, spans)
        if after is None:
            return None
        offset = after
    if offset != end:
        return None
    if parent is not None:
        parent.lengths.append((length_at, 4))
        parent.lengths.extend(span.lengths)
    return end


def find_tables(payload: bytes, base: int = 0) -> list[TableSpan]:
    """Every well-formed, non-empty field table in ``payload``, outermost first by offset.

    A table is recognised wherever a 32-bit length is followed by exactly that many bytes of
    ``key, tag, value`` entries with RabbitMQ's type tags; nested tables and arrays come back
    as spans of their own. Offsets are relative to ``payload``, plus ``base``. The scan is a
    heuristic (a shortstr can look like a table), which is all a fuzzer needs.
    """
    if len(payload) > SCAN_LIMIT:
        return []
    found: list[TableSpan] = []
    covered_until = -1
    for offset in range(len(payload) - 5):
        if offset < covered_until:
            continue
        size = _u32.unpack_from(payload, offset)[0]
        if size < 3 or offset + 4 + size > len(payload):
            continue
        spans: list[TableSpan] = []
        if _parse_container(payload, offset, len(payload), 0, False, None, spans) is None:
            continue
        for span in spans:
            span.length_at += base
            span.end += base
            span.tags = [tag + base for tag in span.tags]
            span.lengths = [(at + base, width) for at, width in span.lengths]
        found.extend(spans)
        covered_until = offset + 4 + size
    return found


def shortstr_offsets(payload: bytes, base: int = 0) -> list[int]:
    """Offsets of bytes that look like short-string lengths: ``n`` followed by ``n`` printable bytes."""
    offsets = []
    for offset, size in enumerate(payload):
        chunk = payload[offset + 1 : offset + 1 + size]
        if size and len(chunk) == size and all(32 <= byte < 127 for byte in chunk):
            offsets.append(offset + base)
    return offsets


def table_entry(key: bytes, tag: bytes, value: bytes) -> bytes:
    """One encoded table entry: short-string key, type tag, value bytes."""
    return bytes((len(key),)) + key + tag + value


def nested(depth: int, array: bool = False) -> bytes:
    """A field value (tag included) nesting ``depth`` tables (or arrays) inside each other."""
    value = b"F" + _u32.pack(0)
    for _ in range(depth - 1):
        if array:
            value = b"A" + _u32.pack(len(value)) + value
        else:
            entry = table_entry(b"n", value[:1], value[1:])
            value = b"F" + _u32.pack(len(entry)) + entry
    return value


# -- what the server answers --------------------------------------------------------------------


@dataclass
class ReplyReader:
    """Follows the server's byte stream and notes its ``connection.close``/``channel.close`` codes."""

    closes: list[tuple[int, int, str]] = field(default_factory=list)
    received: int = 0
    #: The server has said its last word: ``connection.close``, ``connection.close-ok`` or a
    #: protocol header of its own. (Like RabbitMQ, it then waits for the client to close the
    #: socket rather than closing it, so EOF does not come by itself.)
    finished: bool = False
    _buffer: bytearray = field(default_factory=bytearray)

    #: (class, method) ids of connection.close and channel.close.
    _CLOSES = {0x000A0032, 0x00140028}
    _CONNECTION_CLOSE = 0x000A0032
    _CONNECTION_CLOSE_OK = 0x000A0033

    def feed(self, data: bytes) -> None:
        """Take more bytes from the server."""
        self.received += len(data)
        self._buffer += data
        while len(self._buffer) >= FRAME_OVERHEAD:
            if self._buffer.startswith(b"AMQP"):  # a protocol header: the server refused ours
                self.closes.append((0, 0, "protocol header " + bytes(self._buffer[:8]).hex()))
                self.finished = True
                del self._buffer[:8]
                continue
            frame_type, channel, size = FRAME_HEAD.unpack_from(self._buffer)
            if len(self._buffer) < size + FRAME_OVERHEAD:
                return
            payload = bytes(self._buffer[7 : 7 + size])
            del self._buffer[: size + FRAME_OVERHEAD]
            index = _u32.unpack_from(payload)[0] if frame_type == FRAME_METHOD and len(payload) >= 4 else None
            if index in (self._CONNECTION_CLOSE, self._CONNECTION_CLOSE_OK):
                self.finished = True
            if index in self._CLOSES and len(payload) >= 7:
                code = struct.unpack_from(">H", payload, 4)[0]
                text_size = payload[6]
                text = payload[7 : 7 + text_size].decode("utf-8", "replace")
                self.closes.append((channel, code, text))


# -- a raw blocking client ----------------------------------------------------------------------


class ProtocolFailure(Exception):
    """The server answered something the raw client did not expect (or closed the socket)."""


class RawClient:
    """A blocking AMQP client over a plain socket that does only what it is told.

    :param port: the broker's port on 127.0.0.1
    :param heartbeat: the heartbeat to ask for in ``connection.tune-ok``
    :param receive_buffer: ``SO_RCVBUF`` to set before connecting (small: the server's
        output backs up sooner when we stop reading)
    :param timeout: seconds any one socket operation may block
    """

    def __init__(self, port: int, heartbeat: int = 0, receive_buffer: int | None = None, timeout: float = 10.0) -> None:
        self.port = port
        self.heartbeat = heartbeat
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.local_port: int = self.sock.getsockname()[1]
        self._buffer = bytearray()

    # -- sending ------------------------------------------------------------------------------

    def send(self, channel: int, *values: Any) -> None:
        """Encode ``values`` (methods, content headers, bodies) with pamqp and send them."""
        self.sock.sendall(b"".join(frame.marshal(value, channel) for value in values))

    def frames_of(self, channel: int, *values: Any) -> bytes:
        """The encoded frames of ``values``, not sent (to send a part of them)."""
        return b"".join(frame.marshal(value, channel) for value in values)

    def publish_frames(self, channel: int, exchange: str, routing_key: str, body: bytes, persistent: bool) -> bytes:
        """The frames of one ``basic.publish`` with its content, split at :data:`FRAME_MAX`."""
        properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
        parts: list[Any] = [
            commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
            ContentHeader(0, len(body), properties),
        ]
        chunk = FRAME_MAX - FRAME_OVERHEAD
        parts += [ContentBody(body[start : start + chunk]) for start in range(0, len(body), chunk)]
        return self.frames_of(channel, *parts)

    # -- receiving ----------------------------------------------------------------------------

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ProtocolFailure("the server closed the connection")
        self._buffer += data

    def read_frame(self) -> tuple[int, Any]:
        """The next frame as ``(channel, value)``; heartbeats are skipped."""
        while True:
            while len(self._buffer) < FRAME_OVERHEAD:
                self._fill()
            _type, _channel, size = FRAME_HEAD.unpack_from(self._buffer)
            while len(self._buffer) < size + FRAME_OVERHEAD:
                self._fill()
            consumed, channel, value = frame.unmarshal(bytes(self._buffer[: size + FRAME_OVERHEAD]))
            del self._buffer[:consumed]
            if value.name != "Heartbeat":
                return channel, value

    def expect(self, *names: str) -> Any:
        """Read frames up to the first one named in ``names`` (pamqp names, e.g. ``Queue.DeclareOk``).

        Deliveries and their content met on the way are skipped.

        :raises ProtocolFailure: the server closed the connection or a channel instead
        """
        while True:
            _channel, value = self.read_frame()
            if value.name in names:
                return value
            if value.name in ("Connection.Close", "Channel.Close"):
                raise ProtocolFailure(f"{value.name} {value.reply_code} {value.reply_text}")

    def call(self, channel: int, method: Any, reply: str) -> Any:
        """Send ``method`` and read up to its ``reply``."""
        self.send(channel, method)
        return self.expect(reply)

    def read_some(self, size: int) -> bytes:
        """Read at most ``size`` raw bytes (leaving the frame reader behind: for endings only)."""
        return self.sock.recv(size)

    def iter_deliveries(self, count: int) -> Iterator[int]:
        """Read ``count`` deliveries (method, header, bodies); yield each delivery tag."""
        for _ in range(count):
            deliver = self.expect("Basic.Deliver")
            header = self.expect("ContentHeader")
            received = 0
            while received < header.body_size:
                received += len(self.expect("ContentBody").value)
            yield deliver.delivery_tag

    # -- life cycle ---------------------------------------------------------------------------

    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> None:
        """Protocol header through ``connection.open-ok``, with SASL PLAIN."""
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect("Connection.Start")
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "postroom-soak", "capabilities": {"consumer_cancel_notify": True}},
                mechanism="PLAIN",
                response=f"\x00{user}\x00{password}",
            ),
        )
        tune = self.expect("Connection.Tune")
        self.send(
            0,
            # RabbitMQ refuses channel_max 0 ("no limit") when it proposed a limit: take its values.
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=min(tune.frame_max, FRAME_MAX), heartbeat=self.heartbeat
            ),
            commands.Connection.Open(virtual_host=vhost),
        )
        self.expect("Connection.OpenOk")

    def open_channel(self, channel: int = 1) -> None:
        """``channel.open`` and its ok."""
        self.call(channel, commands.Channel.Open(), "Channel.OpenOk")

    def reset(self) -> None:
        """Close with a TCP RST (``SO_LINGER`` 0): the server sees ECONNRESET, not EOF."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()

    def close(self) -> None:
        """Close the socket (a FIN, or a RST if the kernel still holds unread bytes)."""
        self.sock.close()

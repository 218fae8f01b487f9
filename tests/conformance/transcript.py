"""Differential transcripts: raw AMQP 0-9-1 frames over loopback, and what the broker answers.

A scenario opens raw TCP connections to a broker, writes frames byte for byte (pipelined where
the scenario says so) and reads the answers until a stop condition: a given method arrives,
the server closes the socket, or the line goes quiet for a moment. Every frame the server sent
is decoded here, without pamqp's validation or its lossy conversions, into an :class:`Entry`,
so that the same scenario run against RabbitMQ and against Postroom gives two lists that
compare by value, and :func:`assert_same_transcript` shows a readable diff when they do not.

What must legitimately differ between two brokers is normalized and nothing else: the values in
``connection.start``'s ``server_properties`` that name the server (:data:`SERVER_NAMING`; their
keys, types and order, and the whole ``capabilities`` table, are compared), server-generated
queue names and consumer tags (``amq.gen-…``, ``amq.ctag-…``: numbered by first appearance, so
"the same tag again" still shows), and, only where a scenario asks for it, the text after the
reply code's name in a ``reply-text``. Content header tables are shown entry by entry as ``(key,
type, raw hex)`` so that a broker re-encoding ``I`` as ``l`` or a float as a double is visible.

Field types are RabbitMQ's (the AMQP 0-9-1 errata, https://www.rabbitmq.com/amqp-0-9-1-errata.html):
``s`` is a signed 16-bit integer, not a short string, and ``x`` is a byte array.

Reads are bounded by :data:`SAFETY_TIMEOUT` as a safety net only: a broker that never answers
shows as a ``NO-ANSWER`` entry in its transcript instead of hanging the run.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import re
import socket
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest
from pamqp import commands, encode, frame
from pamqp.base import Frame as MethodFrame

from postroom.broker.tools.testing import RabbitMQMissing, rabbitmq_node, wait_for_port

#: The AMQP 0-9-1 protocol header (AMQP 0-9-1 §4.2.2).
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

#: The octet that ends every frame (AMQP 0-9-1 §4.2.3).
FRAME_END = 0xCE

#: Seconds any one read may wait before the transcript records ``NO-ANSWER``. A safety net:
#: every scenario stops on what it reads, and a healthy broker answers in milliseconds.
SAFETY_TIMEOUT = 10.0

#: Seconds of silence that end a :func:`quiet` read. Long enough for a broker on a loaded
#: two-core machine to have sent what it was going to send in answer to frames it has read;
#: RabbitMQ's own timers here are 30 s, far beyond it.
QUIET_PERIOD = 1.0

#: RabbitMQ 3.10's defaults, which Postroom shares: the client asks for exactly these, so both
#: brokers split bodies the same way and neither refuses the tune-ok.
FRAME_MAX = 131072
CHANNEL_MAX = 2047

#: Client capabilities as a stock client (pika, amqp) announces them.
CLIENT_PROPERTIES = {
    "product": "postroom-conformance",
    "capabilities": {
        "authentication_failure_close": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "publisher_confirms": True,
    },
}

#: Bodies up to this many bytes appear verbatim in a transcript; longer ones by size and digest.
BODY_SHOWN = 64

_FRAME_METHOD, _FRAME_HEADER, _FRAME_BODY, _FRAME_HEARTBEAT = 1, 2, 3, 8

#: Server-generated names (RabbitMQ's form, which Postroom copies): queue names and consumer tags.
_GENERATED = re.compile(r"amq\.(gen|ctag)-[A-Za-z0-9_-]+")

#: Sizes of the fixed-width field values, by type octet (RabbitMQ's field types).
_FIXED_SIZES = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "l": 8, "f": 4, "d": 8, "D": 5, "T": 8, "V": 0}
#: Field values that carry a 32-bit length before their bytes.
_SIZED = {"S", "A", "F", "x"}


# -- transcript entries ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing a client observed: a decoded frame, the end of the stream, or a scenario's note.

    :ivar channel: the frame's channel (0 for the connection and for non-frame entries)
    :ivar kind: a method's name in pamqp's spelling (``Basic.GetOk``), ``ContentHeader``,
        ``ContentBody``, ``Heartbeat``, ``ProtocolHeader``, or one of ``CLOSED`` (the server
        closed or reset the socket), ``NO-ANSWER`` (nothing within
        :data:`SAFETY_TIMEOUT`), ``TRUNCATED`` (bytes left over at the end of the stream),
        ``BAD-FRAME`` (a frame that does not decode) and ``note`` (written by the scenario)
    :ivar fields: the frame's arguments (or properties) in wire order, as ``(name, value)``
    """

    channel: int
    kind: str
    fields: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        """The entry as transcript lines: one, plus one per entry of a content header's table."""
        if self.kind == "note":
            return f"-- {self.fields[0][1]}"
        arguments, tables = [], []
        for name, value in self.fields:
            if isinstance(value, tuple):
                arguments.append(f"{name}=<{len(value)} entries>")
                tables += [f"    {name}[{key!r}] {type_char} {raw}" for key, type_char, raw in value]
            else:
                arguments.append(f"{name}={value!r}")
        return "\n".join([f"{self.channel} {self.kind} {' '.join(arguments)}".rstrip(), *tables])

    def get(self, name: str) -> Any:
        """The value of field ``name``.

        :raises KeyError: the entry has no such field
        """
        for key, value in self.fields:
            if key == name:
                return value
        raise KeyError(name)


def note(text: str) -> Entry:
    """A line of the scenario's own in a transcript (which connection follows, what was sent)."""
    return Entry(0, "note", (("text", text),))


# -- stop conditions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stop:
    """When a read ends (besides the end of the stream, which always ends it).

    :ivar kinds: entry kinds that end the read once received
    :ivar channel: when set, only entries on this channel count
    :ivar quiet: when set, the read also ends after this many seconds without a byte
    """

    kinds: frozenset[str] = frozenset()
    channel: int | None = None
    quiet: float | None = None

    def matches(self, entry: Entry) -> bool:
        """Whether ``entry`` ends the read."""
        return entry.kind in self.kinds and (self.channel is None or entry.channel == self.channel)


#: Closes end a read by default: after one, the answer being waited for will not come.
CLOSES = frozenset({"Channel.Close", "Connection.Close"})


def until(*kinds: str, channel: int | None = None, or_close: bool = True) -> Stop:
    """Read until an entry of one of ``kinds`` (or, unless ``or_close`` is false, a close)."""
    return Stop(frozenset(kinds) | (CLOSES if or_close else frozenset()), channel)


#: Read until the server closes the socket.
AT_EOF = Stop()


def quiet(seconds: float = QUIET_PERIOD) -> Stop:
    """Read until nothing arrives for ``seconds`` (or the server closes the socket).

    For the few observations that are about the absence of an answer; everything else stops
    on what it reads.
    """
    return Stop(quiet=seconds)


# -- building frames ---------------------------------------------------------------------------


def frames(channel: int, *values: Any) -> bytes:
    """pamqp's encoding of methods, content headers and bodies on ``channel`` (validated by pamqp)."""
    return b"".join(frame.marshal(value, channel) for value in values)


def raw_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """One frame around ``payload``, byte for byte (AMQP 0-9-1 §4.2.3)."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([FRAME_END])


def shortstr(value: str | bytes) -> bytes:
    """A short string: one length octet, then the bytes (str is encoded as UTF-8)."""
    data = value.encode() if isinstance(value, str) else value
    return struct.pack(">B", len(data)) + data


def longstr(value: str | bytes) -> bytes:
    """A long string: a 32-bit length, then the bytes (str is encoded as UTF-8)."""
    data = value.encode() if isinstance(value, str) else value
    return struct.pack(">I", len(data)) + data


def field(key: str | bytes, type_char: str, payload: bytes) -> bytes:
    """One field-table entry: the key, the type octet and the value's bytes, exactly as given."""
    return shortstr(key) + type_char.encode("ascii") + payload


def table(*fields: bytes) -> bytes:
    """A field table (with its length) of entries built by :func:`field`, in this order."""
    return longstr(b"".join(fields))


def array(*values: tuple[str, bytes]) -> bytes:
    """A field array (with its length) of ``(type, payload)`` values, in this order."""
    return longstr(b"".join(type_char.encode("ascii") + payload for type_char, payload in values))


def method(channel: int, cls: type[MethodFrame], **values: Any) -> bytes:
    """A method frame encoded from pamqp's argument list, without pamqp's validation.

    For the inputs pamqp refuses to build (names that are not valid UTF-8, names with ``%``,
    ``*`` or Cyrillic letters, ``channel_max`` 0). Arguments not given take pamqp's defaults.
    A string argument may be ``bytes``, sent as is; a table argument may be ``bytes`` from
    :func:`table`, sent as is, or a dict that pamqp encodes.
    """
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    unknown = set(values) - set(cls.__slots__)
    if unknown:
        raise TypeError(f"{cls.name} has no arguments {sorted(unknown)}")
    payload = struct.pack(">I", cls.index)
    bits: list[bool] = []
    for name in cls.__slots__:
        amqp_type = cls.amqp_type(name)
        value = values.get(name, defaults.get(name))
        if amqp_type == "bit":
            bits.append(bool(value))
            continue
        if bits:
            payload += _pack_bits(bits)
            bits = []
        payload += _encode_argument(amqp_type, value)
    if bits:
        payload += _pack_bits(bits)
    return raw_frame(_FRAME_METHOD, channel, payload)


def _pack_bits(bits: list[bool]) -> bytes:
    """Consecutive bit arguments, eight to an octet, first bit lowest (AMQP 0-9-1 §4.2.5.2)."""
    octets = b""
    for start in range(0, len(bits), 8):
        octets += bytes([sum(1 << index for index, bit in enumerate(bits[start : start + 8]) if bit)])
    return octets


def _encode_argument(amqp_type: str, value: Any) -> bytes:
    """One non-bit method argument."""
    if amqp_type == "shortstr":
        return shortstr(value or b"")
    if amqp_type == "longstr":
        return longstr(value or b"")
    if amqp_type == "table":
        return value if isinstance(value, bytes) else encode.field_table(value or {})
    formats = {"octet": ">B", "short": ">H", "long": ">I", "longlong": ">Q", "timestamp": ">Q"}
    return struct.pack(formats[amqp_type], value or 0)


def content(channel: int, body: bytes, properties: bytes = b"\x00\x00", frame_max: int = FRAME_MAX) -> bytes:
    """A content header and body frames for ``body``, the body split at ``frame_max``.

    :param properties: the property flags and property list exactly as sent (no properties by
        default); :func:`headers_properties` builds one carrying a raw headers table
    """
    header = struct.pack(">HHQ", commands.Basic.frame_id, 0, len(body)) + properties
    chunk = frame_max - 8
    bodies = b"".join(raw_frame(_FRAME_BODY, channel, body[at : at + chunk]) for at in range(0, len(body), chunk))
    return raw_frame(_FRAME_HEADER, channel, header) + bodies


def headers_properties(headers: bytes) -> bytes:
    """Basic properties holding only a headers table, given as its raw bytes from :func:`table`."""
    return struct.pack(">H", commands.Basic.Properties.flags["headers"]) + headers


def publish(
    channel: int, exchange: str | bytes, routing_key: str, body: bytes, properties: bytes = b"\x00\x00", **flags: bool
) -> bytes:
    """A ``basic.publish`` with its content; ``exchange`` may be any bytes."""
    return method(channel, commands.Basic.Publish, exchange=exchange, routing_key=routing_key, **flags) + content(
        channel, body, properties
    )


def connection_close() -> bytes:
    """A client's ``connection.close`` (200, ``bye``), as a client closes when it is done."""
    return frames(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))


def channel_close(channel: int) -> bytes:
    """A client's ``channel.close`` (200, ``client closing``) on ``channel``."""
    return frames(channel, commands.Channel.Close(reply_code=200, reply_text="client closing", class_id=0, method_id=0))


def handshake(
    channel_max: int = CHANNEL_MAX,
    frame_max: int = FRAME_MAX,
    heartbeat: int = 0,
    vhost: str = "/",
    user: str = "guest",
    password: str = "guest",
    client_properties: dict[str, Any] | None = None,
) -> bytes:
    """Everything a client sends to open a connection (as guest by default), pipelined:
    protocol header, start-ok (PLAIN), tune-ok and open."""
    return (
        PROTOCOL_HEADER
        + frames(
            0,
            commands.Connection.StartOk(
                client_properties=CLIENT_PROPERTIES if client_properties is None else client_properties,
                mechanism="PLAIN",
                response=f"\x00{user}\x00{password}",
                locale="en_US",
            ),
        )
        + method(0, commands.Connection.TuneOk, channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
        + frames(0, commands.Connection.Open(virtual_host=vhost))
    )


# -- decoding what the server sent -------------------------------------------------------------


class FrameDecoder:
    """Splits the server's byte stream into :class:`Entry` values, across reads.

    Unlike pamqp's unmarshalling this never raises and never converts lossily: strings that are
    not UTF-8 stay ``bytes``, tables are ``(key, type, hex)`` triples, and a frame that does
    not decode becomes a ``BAD-FRAME`` entry holding its bytes.
    """

    def __init__(self) -> None:
        self._buffer = b""

    @property
    def pending(self) -> bytes:
        """Bytes received that do not (yet) make a whole frame."""
        return self._buffer

    def feed(self, data: bytes) -> list[Entry]:
        """Decode every complete frame in what was left over plus ``data``."""
        self._buffer += data
        entries = []
        while len(self._buffer) >= 8:
            if self._buffer.startswith(b"AMQP"):
                entries.append(Entry(0, "ProtocolHeader", (("bytes", self._buffer[:8]),)))
                self._buffer = self._buffer[8:]
                continue
            frame_type, channel, size = struct.unpack_from(">BHI", self._buffer)
            if len(self._buffer) < size + 8:
                break
            payload, end = self._buffer[7 : 7 + size], self._buffer[7 + size]
            self._buffer = self._buffer[size + 8 :]
            if end != FRAME_END:
                entries.append(
                    Entry(channel, "BAD-FRAME", (("type", frame_type), ("end", end), ("hex", payload.hex())))
                )
                continue
            entries.append(_decode_frame(frame_type, channel, payload))
        return entries


def _decode_frame(frame_type: int, channel: int, payload: bytes) -> Entry:
    """One whole frame's payload as an entry (``BAD-FRAME`` when it does not decode)."""
    try:
        if frame_type == _FRAME_METHOD:
            return _decode_method(channel, payload)
        if frame_type == _FRAME_HEADER:
            return _decode_content_header(channel, payload)
        if frame_type == _FRAME_BODY:
            return Entry(channel, "ContentBody", _describe_body(payload))
        if frame_type == _FRAME_HEARTBEAT and not payload:
            return Entry(channel, "Heartbeat")
    except (struct.error, IndexError, ValueError, KeyError):
        pass
    return Entry(channel, "BAD-FRAME", (("type", frame_type), ("hex", payload.hex())))


def _describe_body(body: bytes) -> tuple[tuple[str, Any], ...]:
    """A body's fields: small ones verbatim, large ones by size and SHA-256 prefix."""
    if len(body) <= BODY_SHOWN:
        return (("size", len(body)), ("bytes", body))
    return (("size", len(body)), ("sha256", hashlib.sha256(body).hexdigest()[:16]))


class _Reader:
    """Reads AMQP values from a payload, front to back."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def take(self, size: int) -> bytes:
        """The next ``size`` bytes.

        :raises ValueError: fewer are left
        """
        if self.offset + size > len(self.data):
            raise ValueError(f"needs {size} bytes at {self.offset}, has {len(self.data) - self.offset}")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def unpack(self, fmt: str) -> Any:
        """One struct-packed value."""
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self, length_format: str) -> str | bytes:
        """A short or long string: ``str`` when it is UTF-8, else the bytes."""
        data = self.take(self.unpack(length_format))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data

    def field_table(self) -> tuple[tuple[str | bytes, str, str], ...]:
        """A field table as ``(key, type, raw value hex)`` triples in wire order."""
        return table_entries(self.take(self.unpack(">I")))


def table_entries(data: bytes) -> tuple[tuple[str | bytes, str, str], ...]:
    """The entries of a field table's content (without its length) as ``(key, type, hex)``.

    Nested tables and arrays stay raw (their hex includes their length): the point is to see
    exactly what the broker wrote.

    :raises ValueError: the table does not parse
    """
    reader = _Reader(data)
    entries = []
    while reader.offset < len(data):
        key = reader.string(">B")
        type_char = chr(reader.take(1)[0])
        if type_char in _FIXED_SIZES:
            raw = reader.take(_FIXED_SIZES[type_char])
        elif type_char in _SIZED:
            size = reader.take(4)
            raw = size + reader.take(int.from_bytes(size, "big"))
        else:
            raise ValueError(f"unknown field type {type_char!r}")
        entries.append((key, type_char, raw.hex()))
    return tuple(entries)


def _decode_arguments(reader: _Reader, cls: type[Any]) -> tuple[tuple[str, Any], ...]:
    """The arguments (or properties) named in ``cls.__slots__`` in order, typed by pamqp."""
    fields: list[tuple[str, Any]] = []
    bit_octet, bit_index = 0, 8
    for name in cls.__slots__:
        amqp_type = cls.amqp_type(name)
        if amqp_type == "bit":
            if bit_index == 8:
                bit_octet, bit_index = reader.take(1)[0], 0
            fields.append((name, bool(bit_octet >> bit_index & 1)))
            bit_index += 1
            continue
        bit_index = 8
        fields.append((name, _decode_value(reader, amqp_type)))
    return tuple(fields)


def _decode_value(reader: _Reader, amqp_type: str) -> Any:
    """One non-bit argument or property."""
    if amqp_type == "shortstr":
        return reader.string(">B")
    if amqp_type == "longstr":
        return reader.string(">I")
    if amqp_type == "table":
        return reader.field_table()
    formats = {"octet": ">B", "short": ">H", "long": ">I", "longlong": ">Q", "timestamp": ">Q"}
    return reader.unpack(formats[amqp_type])


def _decode_method(channel: int, payload: bytes) -> Entry:
    """A method frame's payload; an unknown method keeps its ids and hex."""
    reader = _Reader(payload)
    index = reader.unpack(">I")
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        return Entry(channel, f"Method({index >> 16},{index & 0xFFFF})", (("hex", payload[4:].hex()),))
    fields = _decode_arguments(reader, cls)
    if reader.offset != len(payload):
        fields += (("trailing", payload[reader.offset :].hex()),)
    return Entry(channel, cls.name, fields)


def _decode_content_header(channel: int, payload: bytes) -> Entry:
    """A content header: class, body size and the properties present, in wire order."""
    reader = _Reader(payload)
    class_id, weight, body_size = reader.unpack(">H"), reader.unpack(">H"), reader.unpack(">Q")
    flags, shift = 0, 16
    while True:
        word = reader.unpack(">H")
        flags |= (word & 0xFFFE) << (shift - 16)
        shift += 16
        if not word & 1:
            break
    properties = commands.Basic.Properties
    fields: list[tuple[str, Any]] = [("class_id", class_id), ("weight", weight), ("body_size", body_size)]
    for name in properties.__slots__:
        if flags & properties.flags[name]:
            fields.append((name, _decode_value(reader, properties.amqp_type(name))))
    if reader.offset != len(payload):
        fields.append(("trailing", payload[reader.offset :].hex()))
    return Entry(channel, "ContentHeader", tuple(fields))


# -- normalizing -------------------------------------------------------------------------------


#: ``server_properties`` entries whose values name the server, so differ by right: a broker
#: is not RabbitMQ, is not VMware's, and does not run on Erlang/OTP.
SERVER_NAMING = frozenset({"product", "version", "cluster_name", "platform", "copyright", "information"})


def _server_properties(table: Any) -> Any:
    """``table`` with the values of :data:`SERVER_NAMING` replaced by ``'<names the server>'``."""
    if not isinstance(table, tuple):
        return table
    return tuple(
        (key, type_char, "<names the server>" if key in SERVER_NAMING else raw) for key, type_char, raw in table
    )


def normalize(entries: Iterable[Entry]) -> list[Entry]:
    """What differs between brokers by right, made equal.

    In ``connection.start``'s ``server_properties`` the values of :data:`SERVER_NAMING` become
    ``'<names the server>'`` (keys, types, order and the capabilities stay), and each
    server-generated name (``amq.gen-…``, ``amq.ctag-…``), wherever it appears in a string,
    becomes ``amq.gen-<n>``/``amq.ctag-<n>`` numbered by first appearance in the transcript.
    """
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in names:
            count = sum(1 for name in names.values() if name.startswith(f"amq.{match.group(1)}-"))
            names[found] = f"amq.{match.group(1)}-<{count + 1}>"
        return names[found]

    def value(field_value: Any) -> Any:
        if isinstance(field_value, str):
            return _GENERATED.sub(rename, field_value)
        if isinstance(field_value, tuple):
            return tuple(value(item) for item in field_value)
        return field_value

    normalized = []
    for entry in entries:
        fields = tuple((name, value(field_value)) for name, field_value in entry.fields)
        if entry.kind == "Connection.Start":
            fields = tuple(
                (name, _server_properties(field_value) if name == "server_properties" else field_value)
                for name, field_value in fields
            )
        normalized.append(replace(entry, fields=fields))
    return normalized


def loose_reply_text(entry: Entry) -> Entry:
    """``entry`` with the text after the reply code's name in its ``reply_text`` replaced by ``…``.

    For the closes whose explanation a scenario says may differ (``NOT_FOUND - no exchange
    '\\xff\\xfe' …`` becomes ``NOT_FOUND - …``). Other entries come back unchanged.
    """
    if entry.kind not in CLOSES:
        return entry
    text = entry.get("reply_text")
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    name = text.split(" - ", 1)[0]
    return replace(entry, fields=tuple((k, f"{name} - …" if k == "reply_text" else v) for k, v in entry.fields))


#: Reply-code names whose texts in RabbitMQ quote Erlang terms or an internal reason
#: (``FRAME_ERROR - type 2, all octets = <<>>: {frame_too_short,…}``).
ERLANG_TEXTS = frozenset({"FRAME_ERROR", "SYNTAX_ERROR", "COMMAND_INVALID", "UNEXPECTED_FRAME", "INTERNAL_ERROR"})


def loose_erlang_text(entry: Entry) -> Entry:
    """``entry`` loosened as :func:`loose_reply_text` does when it is a close whose code is one of
    :data:`ERLANG_TEXTS`; any other entry (every other reply text, whole) unchanged."""
    if entry.kind in CLOSES:
        text = entry.get("reply_text")
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if text.split(" - ", 1)[0] in ERLANG_TEXTS:
            return loose_reply_text(entry)
    return entry


def without_header(entries: Iterable[Entry], key: str, drop_emptied: bool = False) -> list[Entry]:
    """``entries`` with the header ``key`` removed from every content header's headers table.

    For the one header Postroom adds on purpose (``x-delivery-count`` on redeliveries), so
    that everything else is compared exactly.

    :param drop_emptied: also remove a headers property that held only ``key`` (Postroom adds
        the table to a message published without one); otherwise the emptied table stays,
        and shows
    """
    cleaned = []
    for entry in entries:
        if entry.kind == "ContentHeader":
            fields = []
            for name, value in entry.fields:
                if name == "headers":
                    kept = tuple(item for item in value if item[0] != key)
                    if drop_emptied and value and not kept:
                        continue
                    value = kept
                fields.append((name, value))
            entry = replace(entry, fields=tuple(fields))
        cleaned.append(entry)
    return cleaned


def _lines(entries: list[Entry]) -> list[str]:
    """A transcript as text lines, for diffs."""
    return [line for entry in entries for line in str(entry).splitlines()]


def assert_same_transcript(expected: list[Entry], actual: list[Entry], names: tuple[str, str]) -> None:
    """Fail with a unified diff, one line per entry, unless the transcripts are equal.

    :param names: what the two sides are, for the diff's headings (``("rabbitmq", "postroom")``)
    """
    if expected == actual:
        return
    diff = difflib.unified_diff(_lines(expected), _lines(actual), *names, n=50, lineterm="")
    raise AssertionError("transcripts differ:\n" + "\n".join(diff))


# -- talking to a broker -----------------------------------------------------------------------


class Client:
    """One raw TCP connection to a broker on 127.0.0.1, recording into a :class:`Transcript`.

    :param port: the broker's port
    :param transcript: where everything read is recorded
    :param rcvbuf: ``SO_RCVBUF`` to set before connecting (so the advertised window is small)
    """

    def __init__(self, port: int, transcript: Transcript, rcvbuf: int | None = None) -> None:
        self._transcript = transcript
        self._decoder = FrameDecoder()
        self._pending: deque[Entry] = deque()
        self._ended = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(SAFETY_TIMEOUT)
        self.sock.connect(("127.0.0.1", port))

    def send(self, *parts: bytes) -> None:
        """Write ``parts`` as one ``sendall`` (so the broker may read them in one go).

        Once the server has closed the socket nothing is sent, and a send that fails because it
        just did is not recorded: whether it fails depends on timing, and the next read records
        the end of the stream anyway.
        """
        if self._ended:
            return
        try:
            self.sock.sendall(b"".join(parts))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def read(self, stop: Stop, loose_reply_texts: bool = False) -> list[Entry]:
        """Read until ``stop`` (or the end of the stream); record and return what was read.

        Frames that arrived after the stopping one stay queued for the next read.

        :param loose_reply_texts: record closes through :func:`loose_reply_text`
        """
        got: list[Entry] = []

        def record(entry: Entry) -> None:
            if loose_reply_texts:
                entry = loose_reply_text(entry)
            got.append(entry)
            self._transcript.entries.append(entry)

        while True:
            while self._pending:
                entry = self._pending.popleft()
                record(entry)
                if stop.matches(entry):
                    return got
            if self._ended:
                return got
            self.sock.settimeout(stop.quiet if stop.quiet is not None else SAFETY_TIMEOUT)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                if stop.quiet is None:
                    record(Entry(0, "NO-ANSWER", (("seconds", SAFETY_TIMEOUT),)))
                return got
            except ConnectionResetError:
                # RabbitMQ's listeners close with SO_LINGER 0 (a reset); Postroom closes with FIN,
                # so that queued output is never thrown away. Clients see the same end either way.
                self._end(record, "CLOSED")
                return got
            if not data:
                self._end(record, "CLOSED")
                return got
            self._pending.extend(self._decoder.feed(data))

    def _end(self, record: Callable[[Entry], None], kind: str) -> None:
        """The stream ended: record leftover bytes, if any, then ``kind``."""
        self._ended = True
        for entry in self._decoder.feed(b""):
            record(entry)
        if self._decoder.pending:
            record(Entry(0, "TRUNCATED", (("hex", self._decoder.pending.hex()),)))
        record(Entry(0, kind))

    def hang_up(self) -> None:
        """Close the socket without ``connection.close``: FIN in both directions."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already reset by the server
        self.sock.close()

    def reset(self) -> None:
        """Close the socket with an RST (``SO_LINGER`` on with a zero timeout)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.sock.close()


class Transcript:
    """Everything the clients of one scenario run observed, in order."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def note(self, text: str) -> None:
        """Record a line of the scenario's own."""
        self.entries.append(note(text))

    @contextmanager
    def connect(self, port: int, rcvbuf: int | None = None) -> Iterator[Client]:
        """A :class:`Client` recording here, whose socket is closed on leaving the block."""
        client = Client(port, self, rcvbuf=rcvbuf)
        try:
            yield client
        finally:
            client.close()

    def normalized(self) -> list[Entry]:
        """The entries through :func:`normalize`."""
        return normalize(self.entries)


def ending(entries: list[Entry]) -> str:
    """How a read ended: the kind of the last entry it read (``CLOSED`` if it read none, which
    happens when the stream had already ended)."""
    return entries[-1].kind if entries else "CLOSED"


def open_connection(client: Client, *channels: int) -> None:
    """Run the handshake (pipelined) and open ``channels``, reading each answer."""
    client.send(handshake())
    client.read(until("Connection.OpenOk"))
    for channel in channels:
        client.send(frames(channel, commands.Channel.Open()))
        client.read(until("Channel.OpenOk", channel=channel))


def close_connection(client: Client) -> None:
    """Send ``connection.close`` and read until ``close-ok``."""
    client.send(connection_close())
    client.read(until("Connection.CloseOk", or_close=False))


def delete_queues(port: int, *queues: str | bytes, exchanges: Iterable[str] = ()) -> None:
    """Delete ``queues`` and ``exchanges`` (those that exist) over a connection of its own,
    recording nothing.

    Scenarios share one RabbitMQ node for the session; each cleans up after itself.
    """
    deletes: list[tuple[type[MethodFrame], dict[str, Any]]] = [(commands.Queue.Delete, {"queue": q}) for q in queues]
    deletes += [(commands.Exchange.Delete, {"exchange": exchange}) for exchange in exchanges]
    scratch = Transcript()
    with scratch.connect(port) as client:
        client.send(handshake())
        client.read(until("Connection.OpenOk"))
        # One channel each: a refused delete (another connection's exclusive queue) closes only its own.
        for channel, (cls, arguments) in enumerate(deletes, start=1):
            client.send(frames(channel, commands.Channel.Open()), method(channel, cls, **arguments))
            client.read(until("Queue.DeleteOk", "Exchange.DeleteOk", channel=channel))
        close_connection(client)


def wait_for(check: Callable[[], bool], seconds: float = SAFETY_TIMEOUT) -> bool:
    """Poll ``check`` until it is true or ``seconds`` pass; whether it became true.

    For state that settles asynchronously in both brokers (a dropped connection's cleanup):
    the scenario waits for the condition, not for a fixed time.
    """
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def unique_prefix() -> str:
    """A fresh name prefix, shared by a scenario's two runs, unique on the shared RabbitMQ node."""
    return f"conformance-{uuid.uuid4().hex[:8]}"


@contextmanager
def oracle(config: str = "", plugins: Iterable[str] = (), also: Iterable[int] = ()) -> Iterator[int]:
    """A RabbitMQ node (see :func:`broker.tools.testing.rabbitmq_node`) once it listens on its AMQP
    port and on the ports ``also`` names; its AMQP port. The test is skipped, saying why, when
    there is no RabbitMQ here or it does not start."""
    node = rabbitmq_node(config, plugins)
    try:
        port, _pid = node.__enter__()
        for other in also:
            wait_for_port(other, 60)
    except RabbitMQMissing as missing:
        pytest.skip(f"no RabbitMQ to compare with: {missing}")
    except TimeoutError as stuck:
        node.__exit__(None, None, None)
        pytest.skip(f"RabbitMQ is installed but did not start here: {stuck}")
    try:
        yield port
    finally:
        node.__exit__(None, None, None)


# -- management API objects -----------------------------------------------------------------


def api_fields(value: Any, leave_out: Container[str], sort_lists: bool = False) -> Any:
    """A management API answer without the fields named in ``leave_out`` and the rates
    (``*_details``), at any depth; with ``sort_lists``, lists in a set order (by ``repr``)."""
    if isinstance(value, (list, tuple)):
        items = [api_fields(item, leave_out, sort_lists) for item in value]
        if isinstance(value, tuple):
            return tuple(items)
        return sorted(items, key=repr) if sort_lists else items
    if isinstance(value, dict):
        return {
            key: api_fields(item, leave_out, sort_lists)
            for key, item in sorted(value.items())
            if key not in leave_out and not key.endswith("_details")
        }
    return value


def field_paths(value: Any, path: str = "", opaque: Container[str] = ()) -> set[str]:
    """Every key in a management API answer, as a dotted path (list items share their list's);
    the keys inside the fields named in ``opaque`` are left out."""
    if isinstance(value, (list, tuple)):
        return {key for item in value for key in field_paths(item, path, opaque)}
    if isinstance(value, dict):
        return {f"{path}{key}" for key in value} | {
            k for key, item in value.items() if key not in opaque for k in field_paths(item, f"{path}{key}.", opaque)
        }
    return set()

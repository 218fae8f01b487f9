"""RabbitMQ's stream protocol (port 5552) on the wire: frames, the types they are made of,
and the commands a server reads and writes (``deps/rabbitmq_stream/docs/PROTOCOL.adoc``).

A frame is ``size:uint32`` then ``size`` bytes: ``key:uint16 version:uint16`` and the
command's fields. A key's top bit says a response. Strings are ``int16`` length and UTF-8
bytes (-1: null), byte strings ``int32`` length and bytes, arrays ``int32`` count and items;
every integer is big-endian.

:class:`FrameReader` cuts frames out of what the socket gives; :func:`parse_request` turns
one into its command (:data:`Command`: a frozen dataclass per command, its fields named and
typed), as RabbitMQ 3.10's ``rabbit_stream_core:parse_request`` reads it (what it does not
match is :data:`UNKNOWN`); the ``*_response`` functions build frames.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

#: Command keys (``rabbit_stream.hrl``).
DECLARE_PUBLISHER = 1
PUBLISH = 2
PUBLISH_CONFIRM = 3
PUBLISH_ERROR = 4
QUERY_PUBLISHER_SEQUENCE = 5
DELETE_PUBLISHER = 6
SUBSCRIBE = 7
DELIVER = 8
CREDIT = 9
STORE_OFFSET = 10
QUERY_OFFSET = 11
UNSUBSCRIBE = 12
CREATE_STREAM = 13
DELETE_STREAM = 14
METADATA = 15
METADATA_UPDATE = 16
PEER_PROPERTIES = 17
SASL_HANDSHAKE = 18
SASL_AUTHENTICATE = 19
TUNE = 20
OPEN = 21
CLOSE = 22
HEARTBEAT = 23
ROUTE = 24
PARTITIONS = 25
CONSUMER_UPDATE = 26
EXCHANGE_COMMAND_VERSIONS = 27
STREAM_STATS = 28
CREATE_SUPER_STREAM = 29
DELETE_SUPER_STREAM = 30

RESPONSE = 0x8000

#: Response codes.
OK = 1
STREAM_DOES_NOT_EXIST = 2
SUBSCRIPTION_ID_ALREADY_EXISTS = 3
SUBSCRIPTION_ID_DOES_NOT_EXIST = 4
STREAM_ALREADY_EXISTS = 5
STREAM_NOT_AVAILABLE = 6
SASL_MECHANISM_NOT_SUPPORTED = 7
AUTHENTICATION_FAILURE = 8
SASL_ERROR = 9
SASL_CHALLENGE = 10
SASL_AUTHENTICATION_FAILURE_LOOPBACK = 11
VHOST_ACCESS_FAILURE = 12
UNKNOWN_FRAME = 13
FRAME_TOO_LARGE = 14
INTERNAL_ERROR = 15
ACCESS_REFUSED = 16
PRECONDITION_FAILED = 17
PUBLISHER_DOES_NOT_EXIST = 18
NO_OFFSET = 19

#: Each error code's name, as RabbitMQ names its counter (``rabbitmq_global_stream_error_*``).
ERROR_NAMES = {
    STREAM_DOES_NOT_EXIST: "stream_does_not_exist",
    SUBSCRIPTION_ID_ALREADY_EXISTS: "subscription_id_already_exists",
    SUBSCRIPTION_ID_DOES_NOT_EXIST: "subscription_id_does_not_exist",
    STREAM_ALREADY_EXISTS: "stream_already_exists",
    STREAM_NOT_AVAILABLE: "stream_not_available",
    SASL_MECHANISM_NOT_SUPPORTED: "sasl_mechanism_not_supported",
    AUTHENTICATION_FAILURE: "authentication_failure",
    SASL_ERROR: "sasl_error",
    SASL_CHALLENGE: "sasl_challenge",
    SASL_AUTHENTICATION_FAILURE_LOOPBACK: "sasl_authentication_failure_loopback",
    VHOST_ACCESS_FAILURE: "vhost_access_failure",
    UNKNOWN_FRAME: "unknown_frame",
    FRAME_TOO_LARGE: "frame_too_large",
    INTERNAL_ERROR: "internal_error",
    ACCESS_REFUSED: "access_refused",
    PRECONDITION_FAILED: "precondition_failed",
    PUBLISHER_DOES_NOT_EXIST: "publisher_does_not_exist",
}

#: Offset specifications of ``subscribe``.
OFFSET_FIRST = 1
OFFSET_LAST = 2
OFFSET_NEXT = 3
OFFSET_OFFSET = 4
OFFSET_TIMESTAMP = 5

_u8 = struct.Struct(">B")
_u16 = struct.Struct(">H")
_i16 = struct.Struct(">h")
_u32 = struct.Struct(">I")
_i32 = struct.Struct(">i")
_u64 = struct.Struct(">Q")
_i64 = struct.Struct(">q")
_head = struct.Struct(">HH")  # key, version
_request = struct.Struct(">HHI")  # key, version, correlation id
_publish_head = struct.Struct(">HHBI")  # key, version, publisher id, message count
_credit_frame = struct.Struct(">HHBh")  # key, version, subscription id, credit
_response = struct.Struct(">IHHIH")  # size, key, version, correlation id, code


class Malformed(ValueError):
    """A frame's fields do not add up to its size (RabbitMQ's parser matches nothing)."""


class FrameReader:
    """Frames out of a byte stream: :meth:`feed` what arrived, take whole frames back."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The whole frames (without their size) now in, in order; the rest waits. Each
        frame's bytes are copied once (from ``data`` when nothing was waiting)."""
        buffer = self._buffer
        if buffer:
            buffer += data
            with memoryview(buffer) as view:
                frames, at = _frames(view)
            del buffer[:at]
        else:
            frames, at = _frames(data)
            buffer += data[at:]
        return frames


def _frames(data: bytes | memoryview) -> tuple[list[bytes], int]:
    """The whole frames at the start of ``data`` (each copied out), and where they end."""
    frames = []
    at = 0
    end = len(data)
    while end - at >= 4:
        size = _u32.unpack_from(data, at)[0]
        if end - at - 4 < size:
            break
        frames.append(bytes(data[at + 4 : at + 4 + size]))
        at += 4 + size
    return frames, at


# -- commands -----------------------------------------------------------------------------------

#: The kinds of offset specification.
OffsetKind = Literal["first", "last", "next", "offset", "timestamp"]


@dataclass(frozen=True, slots=True)
class Offset:
    """An offset specification (``subscribe``'s, or a ``consumer_update`` answer's): ``first``,
    ``last``, ``next``, ``offset`` (``value``, an offset) or ``timestamp`` (``value``, in
    milliseconds since the epoch)."""

    kind: OffsetKind
    value: int = 0


@dataclass(frozen=True, slots=True)
class PeerProperties:
    correlation: int
    properties: dict[str, str]


@dataclass(frozen=True, slots=True)
class SaslHandshake:
    correlation: int


@dataclass(frozen=True, slots=True)
class SaslAuthenticate:
    correlation: int
    mechanism: str
    #: The mechanism's response (empty for a null one).
    response: bytes


@dataclass(frozen=True, slots=True)
class Tune:
    """The client's ``tune``: as a response to the server's, or as a request."""

    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class Open:
    correlation: int
    vhost: str


@dataclass(frozen=True, slots=True)
class Close:
    correlation: int
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class DeclarePublisher:
    correlation: int
    publisher_id: int
    #: The publisher's name for deduplication (empty: none).
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class Publish:
    """``publish``: ``count`` messages, as the frame holds them after the count (a view of it,
    not copied; each ``publishing id:uint64`` then a message or a sub-entry batch)."""

    publisher_id: int
    count: int
    messages: memoryview


@dataclass(frozen=True, slots=True)
class QueryPublisherSequence:
    correlation: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class DeletePublisher:
    correlation: int
    publisher_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    correlation: int
    subscription_id: int
    stream: str
    offset: Offset
    credit: int
    properties: dict[str, str]


@dataclass(frozen=True, slots=True)
class Credit:
    subscription_id: int
    credit: int


@dataclass(frozen=True, slots=True)
class StoreOffset:
    reference: str
    stream: str
    offset: int


@dataclass(frozen=True, slots=True)
class QueryOffset:
    correlation: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    correlation: int
    subscription_id: int


@dataclass(frozen=True, slots=True)
class CreateStream:
    correlation: int
    stream: str
    arguments: dict[str, str]


@dataclass(frozen=True, slots=True)
class DeleteStream:
    correlation: int
    stream: str


@dataclass(frozen=True, slots=True)
class Metadata:
    correlation: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Route:
    correlation: int
    routing_key: str
    super_stream: str


@dataclass(frozen=True, slots=True)
class Partitions:
    correlation: int
    super_stream: str


@dataclass(frozen=True, slots=True)
class StreamStats:
    correlation: int
    stream: str


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersions:
    correlation: int
    #: ``(key, least version, most version)`` of each command the client reads.
    versions: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class CreateSuperStream:
    correlation: int
    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    arguments: dict[str, str]


@dataclass(frozen=True, slots=True)
class DeleteSuperStream:
    correlation: int
    name: str


@dataclass(frozen=True, slots=True)
class ConsumerUpdateResponse:
    """The client's answer to ``consumer_update``: where the subscription reads from (``None``:
    no offset, or a kind there is not)."""

    correlation: int
    code: int
    offset: Offset | None


@dataclass(frozen=True, slots=True)
class Response:
    """A client's response to a server's request ``key`` (other than ``tune`` and
    ``consumer_update``)."""

    key: int


@dataclass(frozen=True, slots=True)
class Unknown:
    """A frame RabbitMQ 3.10 does not read (another key or version, fields that do not add up)."""


#: What :func:`parse_request` gives for a frame it does not read.
UNKNOWN = Unknown()

#: The commands a client sends.
Command = (
    PeerProperties | SaslHandshake | SaslAuthenticate | Tune | Open | Close | Heartbeat
    | DeclarePublisher | Publish | QueryPublisherSequence | DeletePublisher
    | Subscribe | Credit | StoreOffset | QueryOffset | Unsubscribe
    | CreateStream | DeleteStream | Metadata | Route | Partitions | StreamStats | ExchangeCommandVersions
    | CreateSuperStream | DeleteSuperStream | ConsumerUpdateResponse | Response | Unknown
)  # fmt: skip


# -- reading fields ------------------------------------------------------------------------------


class _Fields:
    """A cursor over one frame's fields; every read checks that the bytes are there."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at

    def _take(self, shape: struct.Struct) -> int:
        if self.at + shape.size > len(self.data):
            raise Malformed("short")
        value: int = shape.unpack_from(self.data, self.at)[0]
        self.at += shape.size
        return value

    def u8(self) -> int:
        return self._take(_u8)

    def u16(self) -> int:
        return self._take(_u16)

    def i16(self) -> int:
        return self._take(_i16)

    def u32(self) -> int:
        return self._take(_u32)

    def i32(self) -> int:
        return self._take(_i32)

    def u64(self) -> int:
        return self._take(_u64)

    def i64(self) -> int:
        return self._take(_i64)

    def raw_string(self) -> bytes:
        """A string's bytes (``int16`` length). A null (length -1) does not read, as RabbitMQ's
        ``?STRING`` match takes non-negative lengths only."""
        size = self.i16()
        if size < 0 or self.at + size > len(self.data):
            raise Malformed("string")
        value = self.data[self.at : self.at + size]
        self.at += size
        return value

    def string(self) -> str:
        return self.raw_string().decode("utf-8", "surrogateescape")

    def rest(self) -> bytes:
        value = self.data[self.at :]
        self.at = len(self.data)
        return value

    def end(self) -> None:
        if self.at != len(self.data):
            raise Malformed("trailing bytes")

    def string_map(self) -> dict[str, str]:
        """``[key:string value:string]`` to the end of the frame (the count is not checked,
        as RabbitMQ's ``parse_map`` reads pairs while bytes are left)."""
        pairs: dict[str, str] = {}
        while self.at < len(self.data):
            key = self.string()
            pairs[key] = self.string()
        return pairs


def parse_request(frame: bytes) -> Command:
    """One frame from a client as its command, or :data:`UNKNOWN` for one RabbitMQ 3.10 does
    not read (another key or version, fields that do not add up).

    Responses a client sends are :class:`Tune`, :class:`ConsumerUpdateResponse`, and
    :class:`Response` for any other.
    """
    size = len(frame)
    if size < 4:
        return UNKNOWN
    key, version = _head.unpack_from(frame)
    if version != 1:
        return UNKNOWN
    # (the most frequent, read at once)
    if key == PUBLISH:
        if size < _publish_head.size:
            return UNKNOWN
        publisher, count = _publish_head.unpack_from(frame)[2:]
        return Publish(publisher, count, memoryview(frame)[_publish_head.size :])  # (the messages: not copied)
    if key == CREDIT:
        if size != _credit_frame.size:
            return UNKNOWN
        subscription, credit = _credit_frame.unpack_from(frame)[2:]
        return Credit(subscription, credit)
    fields = _Fields(frame, 4)
    try:
        if key & RESPONSE:
            command = key & ~RESPONSE
            if command == TUNE:
                return _tune(fields)
            if command == CONSUMER_UPDATE:
                # (an offset follows for the kinds that have one, as RabbitMQ reads it: it
                # passes over what follows the others)
                correlation, code, kind = fields.u32(), fields.u16(), fields.u16()
                offset = 0
                if kind in (OFFSET_OFFSET, OFFSET_TIMESTAMP):
                    offset = fields.u64()
                    fields.end()
                return ConsumerUpdateResponse(correlation, code, offset_spec(kind, offset))
            return Response(command)
        return _REQUESTS[key](fields)
    except (KeyError, Malformed):
        return UNKNOWN


def _store_offset(f: _Fields) -> StoreOffset:
    reference, stream, offset = f.string(), f.string(), f.u64()
    f.end()
    return StoreOffset(reference, stream, offset)


def _heartbeat(f: _Fields) -> Heartbeat:
    f.end()
    return Heartbeat()


def _declare_publisher(f: _Fields) -> DeclarePublisher:
    correlation, publisher, reference, stream = f.u32(), f.u8(), f.string(), f.string()
    f.end()
    return DeclarePublisher(correlation, publisher, reference, stream)


def _query_publisher_sequence(f: _Fields) -> QueryPublisherSequence:
    correlation, reference, stream = f.u32(), f.string(), f.string()
    f.end()
    return QueryPublisherSequence(correlation, reference, stream)


def _one_id(make: Callable[[int, int], Command]) -> Callable[[_Fields], Command]:
    """The parser of a request of a correlation id and a publisher's or subscription's id."""

    def parse(f: _Fields) -> Command:
        correlation, which = f.u32(), f.u8()
        f.end()
        return make(correlation, which)

    return parse


def offset_spec(kind: int, value: int = 0) -> Offset | None:
    """The offset specification of ``kind`` (``subscribe``'s, or a ``consumer_update``
    answer's) at ``value``; ``None`` for a kind there is not."""
    if kind == OFFSET_OFFSET:
        return Offset("offset", value)
    if kind == OFFSET_TIMESTAMP:
        return Offset("timestamp", value)
    return _PLAIN_SPECS.get(kind)


_PLAIN_SPECS = {OFFSET_FIRST: Offset("first"), OFFSET_LAST: Offset("last"), OFFSET_NEXT: Offset("next")}


def _subscribe(f: _Fields) -> Subscribe:
    correlation, subscription, stream, kind = f.u32(), f.u8(), f.string(), f.i16()
    value = f.u64() if kind == OFFSET_OFFSET else f.i64() if kind == OFFSET_TIMESTAMP else 0
    offset = offset_spec(kind, value)
    if offset is None:
        raise Malformed("offset type")
    credit = f.u16()
    properties: dict[str, str] = {}
    if f.at < len(f.data):
        if len(f.data) - f.at >= 4:
            f.u32()
            properties = f.string_map()
        else:
            f.rest()  # (RabbitMQ logs "incorrect binary for subscription properties" and goes on)
    return Subscribe(correlation, subscription, stream, offset, credit, properties)


def _query_offset(f: _Fields) -> QueryOffset:
    correlation, reference, stream = f.u32(), f.string(), f.string()
    f.end()
    return QueryOffset(correlation, reference, stream)


def _create_stream(f: _Fields) -> CreateStream:
    correlation, stream = f.u32(), f.string()
    f.u32()
    return CreateStream(correlation, stream, f.string_map())


def _named(make: Callable[[int, str], Command]) -> Callable[[_Fields], Command]:
    """The parser of a request of a correlation id and a name (a stream's, a super stream's)."""

    def parse(f: _Fields) -> Command:
        correlation, stream = f.u32(), f.string()
        f.end()
        return make(correlation, stream)

    return parse


def _metadata(f: _Fields) -> Metadata:
    correlation = f.u32()
    f.u32()
    streams = []
    while f.at < len(f.data):
        streams.append(f.string())
    return Metadata(correlation, tuple(streams))


def _peer_properties(f: _Fields) -> PeerProperties:
    correlation = f.u32()
    f.u32()
    return PeerProperties(correlation, f.string_map())


def _sasl_handshake(f: _Fields) -> SaslHandshake:
    correlation = f.u32()
    f.end()
    return SaslHandshake(correlation)


def _sasl_authenticate(f: _Fields) -> SaslAuthenticate:
    correlation, mechanism = f.u32(), f.string()
    size = f.i32()
    if size == -1:
        response = b""
    elif size < 0 or f.at + size != len(f.data):
        raise Malformed("sasl data")
    else:
        response = f.rest()
    f.end()
    return SaslAuthenticate(correlation, mechanism, response)


def _tune(f: _Fields) -> Tune:
    frame_max, heartbeat = f.u32(), f.u32()
    f.end()
    return Tune(frame_max, heartbeat)


def _open(f: _Fields) -> Open:
    correlation, vhost = f.u32(), f.string()
    f.end()
    return Open(correlation, vhost)


def _close(f: _Fields) -> Close:
    correlation, code, reason = f.u32(), f.u16(), f.string()
    f.end()
    return Close(correlation, code, reason)


def _string_array(f: _Fields) -> tuple[str, ...]:
    count = f.i32()
    if count < 0:
        raise Malformed("array")
    return tuple(f.string() for _ in range(count))


def _create_super_stream(f: _Fields) -> CreateSuperStream:
    correlation, name = f.u32(), f.string()
    partitions, keys = _string_array(f), _string_array(f)
    f.u32()
    return CreateSuperStream(correlation, name, partitions, keys, f.string_map())


def _exchange_command_versions(f: _Fields) -> ExchangeCommandVersions:
    correlation, count = f.u32(), f.i32()
    if count < 0:
        raise Malformed("array")
    versions = tuple((f.u16(), f.u16(), f.u16()) for _ in range(count))
    f.end()
    return ExchangeCommandVersions(correlation, versions)


def _route(f: _Fields) -> Route:
    correlation, key, stream = f.u32(), f.string(), f.string()
    f.end()
    return Route(correlation, key, stream)


_REQUESTS: dict[int, Callable[[_Fields], Command]] = {
    STORE_OFFSET: _store_offset,
    HEARTBEAT: _heartbeat,
    DECLARE_PUBLISHER: _declare_publisher,
    QUERY_PUBLISHER_SEQUENCE: _query_publisher_sequence,
    DELETE_PUBLISHER: _one_id(DeletePublisher),
    SUBSCRIBE: _subscribe,
    QUERY_OFFSET: _query_offset,
    UNSUBSCRIBE: _one_id(Unsubscribe),
    CREATE_STREAM: _create_stream,
    DELETE_STREAM: _named(DeleteStream),
    METADATA: _metadata,
    PEER_PROPERTIES: _peer_properties,
    SASL_HANDSHAKE: _sasl_handshake,
    SASL_AUTHENTICATE: _sasl_authenticate,
    TUNE: _tune,
    OPEN: _open,
    CLOSE: _close,
    ROUTE: _route,
    PARTITIONS: _named(Partitions),
    STREAM_STATS: _named(StreamStats),
    EXCHANGE_COMMAND_VERSIONS: _exchange_command_versions,
    CREATE_SUPER_STREAM: _create_super_stream,
    DELETE_SUPER_STREAM: _named(DeleteSuperStream),
}


# -- writing -----------------------------------------------------------------------------------


def string(value: str | bytes) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return _i16.pack(len(raw)) + raw


def string_map(pairs: Mapping[str, str]) -> bytes:
    return _u32.pack(len(pairs)) + b"".join(string(k) + string(v) for k, v in pairs.items())


def frame(key: int, body: bytes) -> bytes:
    """A frame of ``key`` (version 1) with ``body`` after the key and version."""
    return _u32.pack(4 + len(body)) + _head.pack(key, 1) + body


def response(key: int, correlation: int, code: int, extra: bytes = b"") -> bytes:
    """The response to request ``key``: its correlation id, ``code``, then ``extra``."""
    if not extra:
        return _response.pack(10, key | RESPONSE, 1, correlation, code)
    return _response.pack(10 + len(extra), key | RESPONSE, 1, correlation, code) + extra


def tune(frame_max: int, heartbeat: int) -> bytes:
    return frame(TUNE, _u32.pack(frame_max) + _u32.pack(heartbeat))


def close(correlation: int, code: int, reason: str) -> bytes:
    return frame(CLOSE, _u32.pack(correlation) + _u16.pack(code) + string(reason))


HEARTBEAT_FRAME = frame(HEARTBEAT, b"")


def strings(values: Iterable[str]) -> bytes:
    items = list(values)
    return _u32.pack(len(items)) + b"".join(string(v) for v in items)


def metadata_response(
    correlation: int, brokers: list[tuple[int, str, int]], streams: list[tuple[str, int, int, list[int]]]
) -> bytes:
    """``metadata``'s answer: brokers ``(reference, host, port)``, then per stream its name,
    code, leader reference and replica references."""
    body = [_u32.pack(correlation), _u32.pack(len(brokers))]
    for reference, host, port in brokers:
        body += (_u16.pack(reference), string(host), _u32.pack(port))
    body.append(_u32.pack(len(streams)))
    for name, code, leader, replicas in streams:
        body += (string(name), _u16.pack(code), _u16.pack(leader), _u32.pack(len(replicas)))
        body += [_u16.pack(replica) for replica in replicas]
    return frame(METADATA | RESPONSE, b"".join(body))


def metadata_update(code: int, stream: str) -> bytes:
    return frame(METADATA_UPDATE, _u16.pack(code) + string(stream))


def u64(value: int) -> bytes:
    return _u64.pack(value)


def u16(value: int) -> bytes:
    return _u16.pack(value)


def u32(value: int) -> bytes:
    return _u32.pack(value)

"""The write-ahead log's on-disk record format: segment headers, framed records, scanning.

This module is pure (bytes in, records out) and uses the standard library only: ``spark/``
imports it on executors to read archived segments without the broker's dependencies.
``docs/wal-format.md`` describes the format byte by byte; the layout in brief:

* A segment file starts with a 16-byte header: :data:`MAGIC` (whose last byte is the format
  version) and the segment number as a big-endian u64.
* Then records, each ``length u32 | crc32 u32 | type u8 | payload[length]`` (big-endian).
  The CRC (``zlib.crc32``) covers the type byte and the payload, so a record whose type
  byte flipped does not decode as another type.

The framing follows LevelDB's log format (``doc/log_format.md``: a checksum, a length and a
type in front of each payload) without its 32 KiB blocks: a damaged record is skipped by
scanning forward for the next place where a header, a sane length and a matching CRC line up.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from enum import IntEnum
from types import MappingProxyType
from typing import Protocol, Union

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "SEGMENT_HEADER_BYTES",
    "RECORD_HEADER_BYTES",
    "MAX_RECORD_BYTES",
    "WALCorruption",
    "RecordType",
    "ExchangeDeclared",
    "ExchangeDeleted",
    "QueueDeclared",
    "QueueDeleted",
    "Bound",
    "Unbound",
    "Published",
    "Removed",
    "DeliveryCounted",
    "Snapshot",
    "DeadLettered",
    "DeadLetterSettled",
    "PolicySet",
    "PolicyCleared",
    "STREAM_CHUNK_HEAD",
    "STREAM_CHUNK_OVERHEAD",
    "STREAM_CHUNK_TYPES",
    "STREAM_TRACKED_TYPES",
    "TRACKING_SEQUENCE",
    "TRACKING_SNAPSHOT",
    "pack_tracking",
    "unpack_tracking",
    "crc32_before",
    "StreamTrackedChunk",
    "StreamTrackedRawChunk",
    "StreamTrackedBatchChunk",
    "RAW",
    "BATCHED",
    "StreamChunk",
    "StreamRawChunk",
    "StreamBatchChunk",
    "StreamOffset",
    "pack_stream_entries",
    "pack_stream_messages",
    "unpack_stream_entries",
    "unpack_stream_messages",
    "pack_raw_entries",
    "unpack_raw_messages",
    "unpack_batched_messages",
    "BATCH_HEAD",
    "batch_records",
    "count_entries",
    "split_entries",
    "crc32_shifted",
    "stream_entries_crc",
    "as_entries",
    "DEAD_LETTER_RECORDS",
    "DEAD_LETTER_PREVIEW_BYTES",
    "DEAD_LETTER_HEADER_VALUE_BYTES",
    "Record",
    "RECORD_CLASSES",
    "ScanResult",
    "segment_header",
    "parse_segment_header",
    "encode",
    "encode_stream_chunk",
    "stream_chunk_pieces",
    "decode",
    "iter_records",
    "scan",
]

#: Version of the record format; the last byte of :data:`MAGIC`. A reader refuses other versions
#: rather than guess: a newer writer may have changed any payload.
FORMAT_VERSION = 1

#: The first 8 bytes of every segment file: "PRWAL", two zero bytes, the format version.
MAGIC = b"PRWAL\x00\x00" + bytes((FORMAT_VERSION,))

_SEGMENT_HEADER = struct.Struct(">8sQ")

#: Size of a segment file's header (magic and segment number).
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size

_RECORD_HEADER = struct.Struct(">IIB")

#: Size of a record's frame header: length u32, crc32 u32, type u8.
RECORD_HEADER_BYTES = _RECORD_HEADER.size

#: The largest payload a record may have; a larger length field means corruption.
#: Why this number: the biggest record is a ``Published``, whose body is at most the broker's
#: message size limit (16 MiB by default, configurable up to 64 MiB, RabbitMQ's
#: ``max_message_size`` ceiling); 1 MiB more covers its content header (properties, bounded by
#: ``frame_max``) and names (shortstrs). Recovery never allocates more than this for one record
#: on the word of a length field that may be garbage.
MAX_RECORD_BYTES = 64 * 1024 * 1024 + 1024 * 1024


class WALCorruption(Exception):
    """The log holds bytes that are not a valid segment header or record.

    :param reason: what is wrong, e.g. ``"bad crc"``
    :param segment: the segment number, when known
    :param offset: the byte offset in the segment file (or buffer), when known
    """

    def __init__(self, reason: str, segment: int | None = None, offset: int | None = None) -> None:
        # All three go to Exception.args so the exception pickles (Spark ships it between
        # processes) and unpickles into an equal one.
        super().__init__(reason, segment, offset)
        self.reason = reason
        self.segment = segment
        self.offset = offset

    def __str__(self) -> str:
        where = []
        if self.segment is not None:
            where.append(f"segment {self.segment}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{' '.join(where)}: {self.reason}" if where else self.reason


class RecordType(IntEnum):
    """The type byte of a record. Values are on disk: never renumber, only add."""

    EXCHANGE_DECLARED = 1
    EXCHANGE_DELETED = 2
    QUEUE_DECLARED = 3
    QUEUE_DELETED = 4
    BOUND = 5
    UNBOUND = 6
    PUBLISHED = 7
    REMOVED = 8
    DELIVERY_COUNTED = 9
    SNAPSHOT = 10
    DEAD_LETTERED = 11
    DEAD_LETTER_SETTLED = 12
    POLICY_SET = 13
    POLICY_CLEARED = 14
    STREAM_CHUNK = 15
    STREAM_OFFSET = 16
    DEFINED = 17
    UNDEFINED = 18
    STREAM_RAW_CHUNK = 19
    STREAM_BATCH_CHUNK = 20
    STREAM_TRACKED_CHUNK = 21
    STREAM_TRACKED_RAW_CHUNK = 22
    STREAM_TRACKED_BATCH_CHUNK = 23


# Field order in each class below is the order on disk: do not reorder. ``arguments``,
# ``header`` and ``body`` are opaque here (the broker encodes AMQP tables and properties).


@dataclass(frozen=True, slots=True)
class ExchangeDeclared:
    """A durable exchange was declared."""

    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: bytes


@dataclass(frozen=True, slots=True)
class ExchangeDeleted:
    """An exchange was deleted."""

    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    """A durable queue was declared."""

    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: bytes


@dataclass(frozen=True, slots=True)
class QueueDeleted:
    """A queue was deleted (its messages with it)."""

    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class Bound:
    """A binding from exchange ``source`` to a queue or exchange ``destination`` was added."""

    vhost: str
    source: str
    destination: str
    destination_is_queue: bool
    routing_key: str
    arguments: bytes


@dataclass(frozen=True, slots=True)
class Unbound:
    """A binding was removed; the fields identify it as in :class:`Bound`."""

    vhost: str
    source: str
    destination: str
    destination_is_queue: bool
    routing_key: str
    arguments: bytes


@dataclass(frozen=True, slots=True)
class Published:
    """A persistent message was routed to durable ``queues``.

    ``message_id`` is the broker's own id (unique within the log), not the AMQP property.
    ``header`` is the encoded content header (properties), ``body`` the body; ``timestamp`` is
    seconds since the epoch, from the broker's clock.
    """

    message_id: int
    vhost: str
    queues: tuple[str, ...]
    exchange: str
    routing_key: str
    timestamp: float
    header: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class Removed:
    """Messages left ``queue`` for good: acked, dead-lettered, expired or dropped."""

    vhost: str
    queue: str
    message_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeliveryCounted:
    """A message's delivery count in ``queue`` rose to ``delivery_count`` (for ``x-delivery-limit``)."""

    vhost: str
    queue: str
    message_id: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Brackets the topology snapshot at the head of a segment: ``begin=True`` before, ``False`` after."""

    begin: bool


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A message was dead-lettered: it died in ``queue`` and reached ``dead_letter_queues``.

    Written to the dead-letter event stream (``<storage.dir>/deadletters``), never to the
    write-ahead log. Everything the Spark job needs is a plain field here, so a reader needs this
    module only (no AMQP codec): ``header_names``/``header_values`` are the message's headers
    other than ``x-death`` as text (each value at most :data:`DEAD_LETTER_HEADER_VALUE_BYTES`),
    and the ``death_*`` tuples are its ``x-death`` history, most recent first, one item per
    entry. ``time`` is seconds since the epoch; ``death_times`` are whole seconds, as
    ``x-death`` holds them. ``body_preview`` is the first :data:`DEAD_LETTER_PREVIEW_BYTES`
    bytes of a body of ``body_size`` bytes. ``dead_letter_id`` is unique within the stream and
    travels with the dead-lettered copy as its ``x-postroom-dead-letter-id`` header.
    """

    dead_letter_id: int
    vhost: str
    queue: str
    reason: str
    delivery_count: int
    time: float
    exchange: str
    routing_keys: tuple[str, ...]
    dead_letter_exchange: str
    dead_letter_queues: tuple[str, ...]
    message_id: str
    header_names: tuple[str, ...]
    header_values: tuple[str, ...]
    death_queues: tuple[str, ...]
    death_reasons: tuple[str, ...]
    death_exchanges: tuple[str, ...]
    death_counts: tuple[int, ...]
    death_times: tuple[int, ...]
    body_size: int
    body_preview: bytes


@dataclass(frozen=True, slots=True)
class DeadLetterSettled:
    """The copy of dead letter ``dead_letter_id`` in dead-letter queue ``queue`` left it for good.

    Acked by a consumer, or rejected, expired, dropped or purged there; until this record, the
    dead letter is pending in that queue. Written to the dead-letter event stream only.
    """

    dead_letter_id: int
    vhost: str
    queue: str
    time: float


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A policy (an operator policy with ``operator``) was set, or replaced one of that name.

    ``value`` is the policy as RabbitMQ's management API shows it, in UTF-8 JSON: an object
    with ``pattern``, ``apply-to``, ``priority`` and ``definition``. JSON keeps the definition's
    values and a priority that is any JSON number exactly as they were set.
    """

    vhost: str
    name: str
    operator: bool
    value: bytes


@dataclass(frozen=True, slots=True)
class PolicyCleared:
    """A policy (an operator policy with ``operator``) was cleared."""

    vhost: str
    name: str
    operator: bool


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """Messages appended to a stream together (one group commit), in a stream's own segments.

    The messages are at offsets ``first_offset`` to ``first_offset + count - 1``; ``timestamp``
    is when the chunk was appended (seconds since the epoch, the broker's clock). ``entries``
    holds each message's exchange, routing key, content header and body, packed by
    :func:`pack_stream_entries`.
    """

    first_offset: int
    timestamp: float
    count: int
    entries: bytes


@dataclass(frozen=True, slots=True)
class StreamRawChunk:
    """Messages published over the stream protocol and appended to a stream together, kept as
    their clients encoded them (AMQP 1.0): ``entries`` is each one as a simple entry of
    RabbitMQ's chunk format (osiris's), its size (u32) then its bytes, so that a chunk goes to
    the protocol's readers as it is stored (:func:`pack_raw_entries`). The other fields are
    :class:`StreamChunk`'s."""

    first_offset: int
    timestamp: float
    count: int
    entries: bytes


@dataclass(frozen=True, slots=True)
class StreamBatchChunk:
    """A :class:`StreamRawChunk` that holds sub-entry batches too: the stream protocol's
    publishers may send several messages as one entry (osiris's sub-entry batch, compressed or
    not), kept as it came. ``count`` is the chunk's messages (its offsets), not its entries: a
    batch of ``n`` messages takes ``n`` offsets. :func:`unpack_batched_messages` reads it."""

    first_offset: int
    timestamp: float
    count: int
    entries: bytes


@dataclass(frozen=True, slots=True)
class StreamTrackedChunk:
    """A :class:`StreamChunk` with a trailer after its entries: osiris's tracking entries
    (:func:`pack_tracking`), the last publishing id of each stream-protocol publisher with
    messages in the chunk, and in a chunk that opens a segment, those of the stream's other
    publishers too. Written with the messages, so a publisher's deduplication holds for what
    reached the disk whatever happened after."""

    first_offset: int
    timestamp: float
    count: int
    entries: bytes
    trailer: bytes


@dataclass(frozen=True, slots=True)
class StreamTrackedRawChunk(StreamTrackedChunk):
    """A :class:`StreamRawChunk` with a trailer (see :class:`StreamTrackedChunk`)."""


@dataclass(frozen=True, slots=True)
class StreamTrackedBatchChunk(StreamTrackedChunk):
    """A :class:`StreamBatchChunk` with a trailer (see :class:`StreamTrackedChunk`)."""


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """A stream's subscription ``name`` (a consumer's ``x-stream-consumer-name``) reads on from
    ``offset``: every offset below it was acknowledged (or passed over) by that subscription."""

    vhost: str
    stream: str
    name: str
    offset: int


@dataclass(frozen=True, slots=True)
class Defined:
    """A definition of the node was set, or replaced the one of that ``kind`` and ``key``:
    a user (``kind`` ``user``, ``key`` its name), a vhost (``vhost``), a global parameter
    (``global``) or the node's first-start mark (``node``).

    ``value`` is the definition in UTF-8 JSON, as ``broker.core.admin`` writes and reads it:
    an object, so later versions can add keys that earlier ones skip.
    """

    kind: str
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Undefined:
    """The definition of ``kind`` and ``key`` was deleted (a user, a vhost)."""

    kind: str
    key: str


#: The first bytes of a dead letter's body kept in its :class:`DeadLettered` record: enough to
#: recognise a payload (a JSON object's first keys, a protobuf's first fields) without copying
#: whole bodies (up to 64 MiB) into the event stream.
DEAD_LETTER_PREVIEW_BYTES = 1024

#: The longest header value (as text, in UTF-8 bytes) kept in a :class:`DeadLettered` record;
#: the analysis counts the most common values, and long ones are payloads, not labels.
DEAD_LETTER_HEADER_VALUE_BYTES = 256

#: Any record.
Record = Union[
    ExchangeDeclared,
    ExchangeDeleted,
    QueueDeclared,
    QueueDeleted,
    Bound,
    Unbound,
    Published,
    Removed,
    DeliveryCounted,
    Snapshot,
    DeadLettered,
    DeadLetterSettled,
    PolicySet,
    PolicyCleared,
    StreamChunk,
    StreamOffset,
    Defined,
    Undefined,
    StreamRawChunk,
    StreamBatchChunk,
    StreamTrackedChunk,
    StreamTrackedRawChunk,
    StreamTrackedBatchChunk,
]

_CLASSES: dict[RecordType, type] = {
    RecordType.EXCHANGE_DECLARED: ExchangeDeclared,
    RecordType.EXCHANGE_DELETED: ExchangeDeleted,
    RecordType.QUEUE_DECLARED: QueueDeclared,
    RecordType.QUEUE_DELETED: QueueDeleted,
    RecordType.BOUND: Bound,
    RecordType.UNBOUND: Unbound,
    RecordType.PUBLISHED: Published,
    RecordType.REMOVED: Removed,
    RecordType.DELIVERY_COUNTED: DeliveryCounted,
    RecordType.SNAPSHOT: Snapshot,
    RecordType.DEAD_LETTERED: DeadLettered,
    RecordType.DEAD_LETTER_SETTLED: DeadLetterSettled,
    RecordType.POLICY_SET: PolicySet,
    RecordType.POLICY_CLEARED: PolicyCleared,
    RecordType.STREAM_CHUNK: StreamChunk,
    RecordType.STREAM_OFFSET: StreamOffset,
    RecordType.DEFINED: Defined,
    RecordType.UNDEFINED: Undefined,
    RecordType.STREAM_RAW_CHUNK: StreamRawChunk,
    RecordType.STREAM_BATCH_CHUNK: StreamBatchChunk,
    RecordType.STREAM_TRACKED_CHUNK: StreamTrackedChunk,
    RecordType.STREAM_TRACKED_RAW_CHUNK: StreamTrackedRawChunk,
    RecordType.STREAM_TRACKED_BATCH_CHUNK: StreamTrackedBatchChunk,
}

#: The record types of the dead-letter event stream (the write-ahead log holds none of them).
DEAD_LETTER_RECORDS = frozenset({RecordType.DEAD_LETTERED, RecordType.DEAD_LETTER_SETTLED})

#: The class of each record type.
RECORD_CLASSES: Mapping[RecordType, type] = MappingProxyType(_CLASSES)

# ---------------------------------------------------------------------------------------------
# Field encodings. Each field's kind comes from its annotation, so the dataclasses above are the
# one statement of each payload's layout.

_STR, _BYTES, _INT, _FLOAT, _BOOL, _STRS, _INTS = range(7)
_KINDS = {
    "str": _STR,
    "bytes": _BYTES,
    "int": _INT,
    "float": _FLOAT,
    "bool": _BOOL,
    "tuple[str, ...]": _STRS,
    "tuple[int, ...]": _INTS,
}

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")

# Names, routing keys and vhosts are AMQP shortstrs (at most 255 bytes), so u16 lengths are
# plenty; surrogateescape lets a name that arrived as invalid UTF-8 round-trip byte for byte.
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"

# zlib.crc32 of each possible type byte: the CRC of a record is crc32(payload, _TYPE_CRC[type]),
# which equals crc32(type byte + payload) without building that concatenation.
_TYPE_CRC = [zlib.crc32(bytes((value,))) for value in range(256)]
_PUBLISHED_TYPE = int(RecordType.PUBLISHED)
_PUBLISHED_CRC = _TYPE_CRC[_PUBLISHED_TYPE]

_Spec = tuple[tuple[str, int], ...]
_SPECS: dict[type, _Spec] = {
    cls: tuple((field.name, _KINDS[str(field.type)]) for field in fields(cls)) for cls in _CLASSES.values()
}


def _encode_fields(record: object, spec: _Spec) -> bytes:
    """The payload of ``record``: its fields in order, bools packed into one flags octet.

    The flags octet sits where the first bool field is; bool number ``i`` (in field order) is
    bit ``i``. Cost O(fields + total string and bytes length).
    """
    parts: list[bytes] = []
    flags = 0
    bit = 0
    flags_at = -1
    for name, kind in spec:
        value = getattr(record, name)
        if kind == _STR:
            data = value.encode(_ENCODING, _ERRORS)
            parts += (_U16.pack(len(data)), data)
        elif kind == _BYTES:
            parts += (_U32.pack(len(value)), value)
        elif kind == _INT:
            parts.append(_U64.pack(value))
        elif kind == _FLOAT:
            parts.append(_F64.pack(value))
        elif kind == _BOOL:
            if flags_at < 0:
                flags_at = len(parts)
                parts.append(b"")
            if value:
                flags |= 1 << bit
            bit += 1
        elif kind == _STRS:
            parts.append(_U16.pack(len(value)))
            for item in value:
                data = item.encode(_ENCODING, _ERRORS)
                parts += (_U16.pack(len(data)), data)
        else:  # _INTS
            parts.append(struct.pack(f">I{len(value)}Q", len(value), *value))
    if flags_at >= 0:
        parts[flags_at] = bytes((flags,))
    return b"".join(parts)


_PUBLISHED_HEAD = struct.Struct(">QH")  # message_id, len(vhost)
_U16_U16 = struct.Struct(">HH")  # count of queues, len(first queue)
_F64_U32 = struct.Struct(">dI")  # timestamp, len(header)
#: A record's header (length, CRC, type) and, for a ``Published`` one, its message id.
_HEAD_AND_ID = struct.Struct(">IIBQ")


def _encode_published(record: Published) -> bytes:
    """:func:`_encode_fields` unrolled for :class:`Published` (see :func:`published_payload`)."""
    return published_payload(
        record.message_id,
        record.vhost,
        record.queues,
        record.exchange,
        record.routing_key,
        record.timestamp,
        record.header,
        record.body,
    )


def published_payload(
    message_id: int,
    vhost: str,
    queues: tuple[str, ...],
    exchange: str,
    routing_key: str,
    timestamp: float,
    header: bytes,
    body: bytes,
) -> bytes:
    """The payload of a :class:`Published` record, from its fields.

    Same bytes as the generic encoder (a test checks), in about half the time: fixed fields
    are packed together and the common single-queue case takes one pack.
    """
    vhost_bytes = vhost.encode(_ENCODING, _ERRORS)
    exchange_bytes = exchange.encode(_ENCODING, _ERRORS)
    routing_key_bytes = routing_key.encode(_ENCODING, _ERRORS)
    if len(queues) == 1:
        queue = queues[0].encode(_ENCODING, _ERRORS)
        parts = [_PUBLISHED_HEAD.pack(message_id, len(vhost_bytes)), vhost_bytes, _U16_U16.pack(1, len(queue)), queue]
    else:
        parts = [_PUBLISHED_HEAD.pack(message_id, len(vhost_bytes)), vhost_bytes, _U16.pack(len(queues))]
        for name in queues:
            queue = name.encode(_ENCODING, _ERRORS)
            parts += (_U16.pack(len(queue)), queue)
    parts += (
        _U16.pack(len(exchange_bytes)),
        exchange_bytes,
        _U16.pack(len(routing_key_bytes)),
        routing_key_bytes,
        _F64_U32.pack(timestamp, len(header)),
        header,
        _U32.pack(len(body)),
        body,
    )
    return b"".join(parts)


def published_prefix(message_id: int, vhost: str, queues: tuple[str, ...], exchange: str, routing_key: str) -> bytes:
    """The start of a :class:`Published` payload, up to its timestamp: what records of messages
    that came the same way share (see :func:`encode_published_after`)."""
    return published_payload(message_id, vhost, queues, exchange, routing_key, 0.0, b"", b"")[:-16]


def encode_published_after(prefix: bytes, timestamp: float, header: bytes, body: bytes) -> bytes:
    """:func:`encode_published` of a record whose payload starts with ``prefix``
    (:func:`published_prefix`), without encoding its names again.

    :raises ValueError: as :func:`encode`
    """
    try:
        payload = b"".join((prefix, _F64_U32.pack(timestamp, len(header)), header, _U32.pack(len(body)), body))
    except struct.error as err:
        raise ValueError(f"Published does not fit the WAL format: {err}") from err
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"Published payload of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    return _RECORD_HEADER.pack(len(payload), zlib.crc32(payload, _PUBLISHED_CRC), _PUBLISHED_TYPE) + payload


def encode_published(
    message_id: int,
    vhost: str,
    queues: tuple[str, ...],
    exchange: str,
    routing_key: str,
    timestamp: float,
    header: bytes,
    body: bytes,
) -> bytes:
    """The framed :class:`Published` record, without building the dataclass (the broker's hot path).

    :raises ValueError: as :func:`encode`
    """
    try:
        payload = published_payload(message_id, vhost, queues, exchange, routing_key, timestamp, header, body)
    except struct.error as err:
        raise ValueError(f"Published does not fit the WAL format: {err}") from err
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"Published payload of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    kind = int(RecordType.PUBLISHED)
    return _RECORD_HEADER.pack(len(payload), zlib.crc32(payload, _TYPE_CRC[kind]), kind) + payload


def _generic(spec: _Spec) -> Callable[[object], bytes]:
    return lambda record: _encode_fields(record, spec)


_ENCODERS: dict[type, tuple[int, Callable[[object], bytes]]] = {
    cls: (int(record_type), _generic(_SPECS[cls])) for record_type, cls in _CLASSES.items()
}
_ENCODERS[Published] = (int(RecordType.PUBLISHED), _encode_published)  # type: ignore[assignment]


def encode(record: Record) -> bytes:
    """The framed record: ``length | crc32 | type | payload``, ready to append to a segment.

    :param record: one of the record classes of this module
    :raises TypeError: ``record`` is not a record
    :raises ValueError: a value does not fit its encoding (a string over 65535 bytes in UTF-8, a
        negative or over-64-bit integer, a string with a surrogate that ``surrogateescape``
        cannot encode), or the payload exceeds :data:`MAX_RECORD_BYTES`
    """
    try:
        record_type, encoder = _ENCODERS[type(record)]
    except KeyError:
        raise TypeError(f"not a WAL record: {record!r}") from None
    try:
        payload = encoder(record)
    except struct.error as err:
        # A try block costs nothing on the fast path (Python 3.11 zero-cost exceptions).
        raise ValueError(f"{type(record).__name__} does not fit the WAL format: {err}") from err
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"{type(record).__name__} payload of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    return _RECORD_HEADER.pack(len(payload), zlib.crc32(payload, _TYPE_CRC[record_type]), record_type) + payload


#: A :class:`StreamChunk` payload's head: first_offset, timestamp, count, then its entries' length.
STREAM_CHUNK_HEAD = struct.Struct(">QdQI")
#: A stream chunk's kind, as :class:`~broker.wal.streamlog.Chunk` keeps it (0: a
#: :class:`StreamChunk`): a :class:`StreamRawChunk`, a :class:`StreamBatchChunk`.
RAW, BATCHED = 1, 2
#: The record type of each kind of stream chunk.
STREAM_CHUNK_TYPES = (
    int(RecordType.STREAM_CHUNK),
    int(RecordType.STREAM_RAW_CHUNK),
    int(RecordType.STREAM_BATCH_CHUNK),
)
#: The record type of each kind of stream chunk with a trailer (:class:`StreamTrackedChunk`).
STREAM_TRACKED_TYPES = (
    int(RecordType.STREAM_TRACKED_CHUNK),
    int(RecordType.STREAM_TRACKED_RAW_CHUNK),
    int(RecordType.STREAM_TRACKED_BATCH_CHUNK),
)
#: Bytes a :class:`StreamChunk` record takes besides its packed entries.
STREAM_CHUNK_OVERHEAD = _RECORD_HEADER.size + STREAM_CHUNK_HEAD.size

#: osiris's tracking entry type of a publisher's last publishing id (``TRK_TYPE_SEQUENCE``),
#: and the bit that marks one of a segment's opening snapshot (a publisher without messages
#: in the chunk: not part of the trailer RabbitMQ's chunk would carry).
TRACKING_SEQUENCE = 0
TRACKING_SNAPSHOT = 0x80
_TRACKING_ID = struct.Struct(">BB")
_TRACKING_VALUE = struct.Struct(">Q")


def pack_tracking(sequences: Iterable[tuple[str, int]], snapshot: bool = False) -> bytes:
    """osiris's tracking entries (``type u8, id size u8, id, value u64``) of publishers'
    last publishing ids, in the order given; with ``snapshot``, marked
    :data:`TRACKING_SNAPSHOT`. References longer than 255 bytes are left out (the stream
    protocol takes up to 255)."""
    kind = TRACKING_SEQUENCE | (TRACKING_SNAPSHOT if snapshot else 0)
    parts: list[bytes] = []
    for reference, sequence in sequences:
        name = reference.encode("utf-8", "surrogateescape")
        if len(name) < 256:
            parts += (_TRACKING_ID.pack(kind, len(name)), name, _TRACKING_VALUE.pack(sequence))
    return b"".join(parts)


def unpack_tracking(data: bytes | memoryview) -> list[tuple[int, str, int]]:
    """``(type, reference, value)`` of each of :func:`pack_tracking`'s entries in ``data``.

    :raises WALCorruption: they do not add up
    """
    found, at, end = [], 0, len(data)
    while at < end:
        if end - at < 2:
            raise WALCorruption(f"stream chunk trailer cut short at byte {at} of {end}")
        kind, size = _TRACKING_ID.unpack_from(data, at)
        stop = at + 2 + size + 8
        if stop > end:
            raise WALCorruption(f"stream chunk trailer cut short at byte {at} of {end}")
        name = bytes(data[at + 2 : at + 2 + size]).decode("utf-8", "surrogateescape")
        found.append((kind, name, _TRACKING_VALUE.unpack_from(data, at + 2 + size)[0]))
        at = stop
    return found


def encode_stream_chunk(
    first_offset: int, timestamp: float, count: int, entries: bytes | list[bytes], kind: int = 0, trailer: bytes = b""
) -> bytes:
    """:func:`stream_chunk_pieces`, joined."""
    return b"".join(stream_chunk_pieces(first_offset, timestamp, count, entries, kind, trailer))


def stream_chunk_pieces(
    first_offset: int, timestamp: float, count: int, entries: bytes | list[bytes], kind: int = 0, trailer: bytes = b""
) -> list[bytes]:
    """``encode(StreamChunk(first_offset, timestamp, count, entries))`` (of a
    :class:`StreamRawChunk` for the kind :data:`RAW`, a :class:`StreamBatchChunk` for
    :data:`BATCHED`; with a ``trailer``, of the same kind of :class:`StreamTrackedChunk`) in
    pieces, for a write that takes them so (``writev``): its header and head, then ``entries``
    (which may come in pieces), not copied (the CRC runs over them without the GIL), then the
    trailer. A chunk is most of what a stream writes.

    :raises ValueError: as :func:`encode`
    """
    record_type = STREAM_TRACKED_TYPES[kind] if trailer else STREAM_CHUNK_TYPES[kind]
    pieces = [entries] if isinstance(entries, bytes) else entries
    size = sum(map(len, pieces))
    if trailer:
        pieces = [*pieces, _U32.pack(len(trailer)) + trailer]
    payload_bytes = STREAM_CHUNK_HEAD.size + size + (4 + len(trailer) if trailer else 0)
    if payload_bytes > MAX_RECORD_BYTES:
        raise ValueError(f"StreamChunk payload of {payload_bytes} bytes is over {MAX_RECORD_BYTES}")
    try:
        head = STREAM_CHUNK_HEAD.pack(first_offset, timestamp, count, size)
    except struct.error as err:
        raise ValueError(f"StreamChunk does not fit the WAL format: {err}") from err
    crc = zlib.crc32(head, _TYPE_CRC[record_type])
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return [_RECORD_HEADER.pack(payload_bytes, crc, record_type) + head, *pieces]


def _gf2_times(matrix: list[int], vector: int) -> int:
    total = at = 0
    while vector:
        if vector & 1:
            total ^= matrix[at]
        vector >>= 1
        at += 1
    return total


@functools.cache
def _zero_bytes_operators() -> list[list[int]]:
    """For each ``k``, the linear map that runs a CRC-32 register over ``2**k`` zero bytes
    (zlib's ``crc32_combine``'s matrices), built once, when first needed (about 2 ms)."""
    operator = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    operators = []
    for step in range(34):
        operator = [_gf2_times(operator, row) for row in operator]  # twice as many
        if step >= 2:  # eight bits on
            operators.append(operator)
    return operators


def crc32_shifted(crc: int, length: int) -> int:
    """What ``crc`` becomes run over ``length`` zero bytes, less what 0 does: for any ``data``
    of that length, ``zlib.crc32(data, crc) ^ crc32_shifted(crc, length) == zlib.crc32(data)``.
    Costs about 20 µs, however long ``length`` is."""
    operators = _zero_bytes_operators()
    at = 0
    while length:
        if length & 1:
            crc = _gf2_times(operators[at], crc)
        length >>= 1
        at += 1
    return crc


def stream_entries_crc(record_crc: int, record_type: int, head: bytes, length: int) -> int:
    """The CRC-32 of a stream chunk record's ``length`` bytes of entries alone (as osiris's
    chunk head carries it), from the record's own CRC (over its type, its ``head`` and the
    entries), without reading the entries. Damage to them since the record was written then
    shows in the reader's check of the chunk."""
    return record_crc ^ crc32_shifted(zlib.crc32(head, _TYPE_CRC[record_type]), length)


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()
#: The index of each CRC table entry by its top byte (unique in CRC-32's table).
_CRC_BY_TOP = {entry >> 24: index for index, entry in enumerate(_CRC_TABLE)}


def crc32_before(crc: int, suffix: bytes) -> int:
    """``zlib.crc32(data)`` from ``zlib.crc32(data + suffix)`` (``crc``) and ``suffix``: the
    CRC run back over the suffix's bytes, the last first (each step of CRC-32 can be undone
    from its input byte). For a short suffix: a Python step per byte."""
    crc ^= 0xFFFFFFFF
    for byte in reversed(suffix):
        index = _CRC_BY_TOP[crc >> 24]
        crc = (((crc ^ _CRC_TABLE[index]) << 8) & 0xFFFFFFFF) | (index ^ byte)
    return crc ^ 0xFFFFFFFF


class _Malformed(Exception):
    """A payload is too short or inconsistent; :func:`decode` turns it into :exc:`WALCorruption`."""


_Buffer = Union[bytes, bytearray, memoryview]


def _decode_fields(cls: type, spec: _Spec, data: bytes) -> Record:
    """Decode a payload laid out by :func:`_encode_fields`. Cost O(payload bytes).

    Works on ``bytes``: slicing bytes and ``bytes.decode`` are faster than going through a
    memoryview, and the payload is copied out of the segment once anyway.
    """
    size = len(data)
    values: list[object] = []
    pos = 0
    flags = 0
    bit = 0  # bools decoded so far; the flags octet is read at the first one
    name = ""
    try:
        for name, kind in spec:  # noqa: B007 (the except clauses below name the field that failed)
            if kind == _STR:
                (length,) = _U16.unpack_from(data, pos)
                pos += 2
                end = pos + length
                if end > size:
                    raise _Malformed("runs past the end")
                values.append(data[pos:end].decode(_ENCODING, _ERRORS))
                pos = end
            elif kind == _BYTES:
                (length,) = _U32.unpack_from(data, pos)
                pos += 4
                end = pos + length
                if end > size:
                    raise _Malformed("runs past the end")
                values.append(data[pos:end])
                pos = end
            elif kind == _INT:
                values.append(_U64.unpack_from(data, pos)[0])
                pos += 8
            elif kind == _FLOAT:
                values.append(_F64.unpack_from(data, pos)[0])
                pos += 8
            elif kind == _BOOL:
                if bit == 0:
                    if pos >= size:
                        raise _Malformed("runs past the end")
                    flags = data[pos]
                    pos += 1
                values.append(bool(flags >> bit & 1))
                bit += 1
            elif kind == _STRS:
                (count,) = _U16.unpack_from(data, pos)
                pos += 2
                items = []
                for _ in range(count):
                    (length,) = _U16.unpack_from(data, pos)
                    pos += 2
                    end = pos + length
                    if end > size:
                        raise _Malformed("runs past the end")
                    items.append(data[pos:end].decode(_ENCODING, _ERRORS))
                    pos = end
                values.append(tuple(items))
            else:  # _INTS
                (count,) = _U32.unpack_from(data, pos)
                pos += 4
                # Checked before unpacking so a garbage count cannot build a huge format string.
                if pos + 8 * count > size:
                    raise _Malformed("runs past the end")
                values.append(struct.unpack_from(f">{count}Q", data, pos))
                pos += 8 * count
    except struct.error:
        raise WALCorruption(f"{cls.__name__}.{name} runs past the end of the payload") from None
    except _Malformed as err:
        raise WALCorruption(f"{cls.__name__}.{name} {err}") from None
    # Strict: unused flag bits and trailing bytes are not what we write, so this is not our format.
    if flags >> bit:
        raise WALCorruption(f"{cls.__name__} has unknown flag bits set: {flags:#04x}")
    if pos != size:
        raise WALCorruption(f"{cls.__name__} has {size - pos} trailing bytes")
    return cls(*values)  # type: ignore[no-any-return]


#: The names (vhost, queues, exchange, routing key) of the last ``Published`` payload decoded,
#: as ``(their bytes, (vhost, queues, exchange, routing_key))``: a log's messages mostly came
#: the same way, and those that do are decoded without their names.
_last_names: tuple[bytes, tuple[str, tuple[str, ...], str, str]] = (b"\xff", ("", (), "", ""))


def _decode_published(data: bytes) -> Published:
    """:func:`_decode_fields` unrolled for :class:`Published`, the bulk of any log (about 2x faster).

    Raises :exc:`struct.error` or :exc:`_Malformed` on a bad payload; :func:`decode` then runs
    the generic decoder, which names the bad field, so both paths report the same error.
    """
    global _last_names
    size = len(data)
    (message_id,) = _U64.unpack_from(data, 0)
    names, decoded = _last_names  # (one read: another thread may replace it)
    if data.startswith(names, 8):
        pos = 8 + len(names)
        vhost, queues, exchange, routing_key = decoded
    else:
        vhost, queues, exchange, routing_key, pos = _decode_published_names(data, size)
        _last_names = (data[8:pos], (vhost, queues, exchange, routing_key))
    timestamp, length = _F64_U32.unpack_from(data, pos)
    start = pos + 12
    pos = start + length
    if pos > size:
        raise _Malformed
    header = data[start:pos]
    (length,) = _U32.unpack_from(data, pos)
    start = pos + 4
    pos = start + length
    if pos != size:
        raise _Malformed
    return Published(message_id, vhost, queues, exchange, routing_key, timestamp, header, data[start:pos])


def _decode_published_names(data: bytes, size: int) -> tuple[str, tuple[str, ...], str, str, int]:
    """The names of a ``Published`` payload, and where its timestamp starts."""
    (length,) = _U16.unpack_from(data, 8)
    pos = 10 + length
    if pos > size:
        raise _Malformed
    vhost = data[10:pos].decode(_ENCODING, _ERRORS)
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    queues = []
    for _ in range(count):
        (length,) = _U16.unpack_from(data, pos)
        start = pos + 2
        pos = start + length
        if pos > size:
            raise _Malformed
        queues.append(data[start:pos].decode(_ENCODING, _ERRORS))
    (length,) = _U16.unpack_from(data, pos)
    start = pos + 2
    pos = start + length
    if pos > size:
        raise _Malformed
    exchange = data[start:pos].decode(_ENCODING, _ERRORS)
    (length,) = _U16.unpack_from(data, pos)
    start = pos + 2
    pos = start + length
    if pos > size:
        raise _Malformed
    routing_key = data[start:pos].decode(_ENCODING, _ERRORS)
    return vhost, tuple(queues), exchange, routing_key, pos


def _decode_strs(data: bytes, pos: int, size: int) -> tuple[tuple[str, ...], int]:
    """A ``tuple[str, ...]`` at ``pos``, and the position after it."""
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    items = []
    for _ in range(count):
        (length,) = _U16.unpack_from(data, pos)
        start = pos + 2
        pos = start + length
        if pos > size:
            raise _Malformed
        items.append(data[start:pos].decode(_ENCODING, _ERRORS))
    return tuple(items), pos


def _decode_str(data: bytes, pos: int, size: int) -> tuple[str, int]:
    (length,) = _U16.unpack_from(data, pos)
    start = pos + 2
    pos = start + length
    if pos > size:
        raise _Malformed
    return data[start:pos].decode(_ENCODING, _ERRORS), pos


def _decode_ints(data: bytes, pos: int, size: int) -> tuple[tuple[int, ...], int]:
    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    end = pos + 8 * count
    if end > size:
        raise _Malformed
    return struct.unpack_from(f">{count}Q", data, pos), end


_U64_F64 = struct.Struct(">Qd")  # delivery_count, time


def _decode_dead_lettered(data: bytes) -> DeadLettered:
    """:func:`_decode_fields` unrolled for :class:`DeadLettered`, the bulk of the dead-letter
    stream (about 3x faster: the Spark job and the export decode millions of them).

    Raises :exc:`struct.error` or :exc:`_Malformed` on a bad payload, as :func:`_decode_published`.
    """
    size = len(data)
    (dead_letter_id,) = _U64.unpack_from(data, 0)
    vhost, pos = _decode_str(data, 8, size)
    queue, pos = _decode_str(data, pos, size)
    reason, pos = _decode_str(data, pos, size)
    delivery_count, time = _U64_F64.unpack_from(data, pos)
    exchange, pos = _decode_str(data, pos + 16, size)
    routing_keys, pos = _decode_strs(data, pos, size)
    dead_letter_exchange, pos = _decode_str(data, pos, size)
    dead_letter_queues, pos = _decode_strs(data, pos, size)
    message_id, pos = _decode_str(data, pos, size)
    header_names, pos = _decode_strs(data, pos, size)
    header_values, pos = _decode_strs(data, pos, size)
    death_queues, pos = _decode_strs(data, pos, size)
    death_reasons, pos = _decode_strs(data, pos, size)
    death_exchanges, pos = _decode_strs(data, pos, size)
    death_counts, pos = _decode_ints(data, pos, size)
    death_times, pos = _decode_ints(data, pos, size)
    (body_size,) = _U64.unpack_from(data, pos)
    (length,) = _U32.unpack_from(data, pos + 8)
    start = pos + 12
    if start + length != size:
        raise _Malformed
    return DeadLettered(
        dead_letter_id,
        vhost,
        queue,
        reason,
        delivery_count,
        time,
        exchange,
        routing_keys,
        dead_letter_exchange,
        dead_letter_queues,
        message_id,
        header_names,
        header_values,
        death_queues,
        death_reasons,
        death_exchanges,
        death_counts,
        death_times,
        body_size,
        data[start:],
    )


_FAST_DECODERS: dict[type, Callable[[bytes], Record]] = {
    Published: _decode_published,
    DeadLettered: _decode_dead_lettered,
}

_DECODERS: dict[int, tuple[type, _Spec, Callable[[bytes], Record] | None]] = {
    int(t): (cls, _SPECS[cls], _FAST_DECODERS.get(cls)) for t, cls in _CLASSES.items()
}


def decode(record_type: int, payload: _Buffer) -> Record:
    """The record of type ``record_type`` whose payload is ``payload`` (no frame header).

    :param record_type: a :class:`RecordType` value
    :param payload: the payload bytes exactly (no more, no less)
    :raises WALCorruption: unknown type, or the payload does not decode as that type (too
        short, trailing bytes, unknown flag bits); ``offset`` and ``segment`` are not set
    """
    try:
        cls, spec, fast = _DECODERS[record_type]
    except KeyError:
        raise WALCorruption(f"unknown record type {record_type}") from None
    data = payload if type(payload) is bytes else bytes(payload)
    if fast is not None:
        try:
            return fast(data)
        except (struct.error, _Malformed):
            pass  # the generic decoder says exactly what is wrong
    return _decode_fields(cls, spec, data)


def segment_header(number: int) -> bytes:
    """The 16-byte header of segment ``number``.

    :raises ValueError: ``number`` is negative or over 64 bits
    """
    try:
        return _SEGMENT_HEADER.pack(MAGIC, number)
    except struct.error as err:
        raise ValueError(f"bad segment number {number}: {err}") from err


def parse_segment_header(data: _Buffer) -> int:
    """The segment number in the header at the start of ``data``.

    :raises WALCorruption: ``data`` is shorter than a header, or does not start with
        :data:`MAGIC` (not a segment, or another format version)
    """
    if len(data) < SEGMENT_HEADER_BYTES:
        raise WALCorruption("truncated segment header", offset=0)
    magic, number = _SEGMENT_HEADER.unpack_from(data, 0)
    if magic[:7] == MAGIC[:7] and magic != MAGIC:
        raise WALCorruption(f"unsupported format version {magic[7]} (this reader knows {FORMAT_VERSION})", offset=0)
    if magic != MAGIC:
        raise WALCorruption(f"bad magic {magic!r}", offset=0)
    return int(number)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What :func:`scan` found.

    ``records`` are ``(offset, end_offset, record)``; ``end`` is where valid data stops. When
    ``end`` is before the end of the data, ``problem`` says why and ``resync`` is the offset of
    the next valid record, or None when none follows (a torn tail, if this is the last segment).
    """

    records: list[tuple[int, int, Record]]
    end: int
    problem: str | None
    resync: int | None


def _walk(data: bytes, start: int) -> Generator[tuple[int, int, Record], None, tuple[int, str | None]]:
    """Yield the valid records from ``start``; return ``(offset, problem)`` where they stop.

    Cost O(bytes): one CRC pass and one decode pass over each record.
    """
    size = len(data)
    pos = start
    while pos < size:
        if size - pos < RECORD_HEADER_BYTES:
            return pos, "truncated header"
        length, crc, record_type = _RECORD_HEADER.unpack_from(data, pos)
        # Checked before the payload is touched: a garbage length must not make us read (or, in
        # a streaming reader, allocate) up to 4 GiB.
        if length > MAX_RECORD_BYTES:
            return pos, "length over limit"
        payload_at = pos + RECORD_HEADER_BYTES
        end = payload_at + length
        if end > size:
            return pos, "truncated payload"
        payload = data[payload_at:end]
        if zlib.crc32(payload, _TYPE_CRC[record_type]) != crc:
            return pos, "bad crc"
        try:
            record = decode(record_type, payload)
        except WALCorruption as err:
            return pos, f"malformed payload: {err.reason}"
        yield pos, end, record
        pos = end
    return pos, None


def published_content(data: bytes, pos: int, length: int) -> tuple[int, bytes, bytes, bytes, bytes] | None:
    """What a delivery needs of the ``Published`` record that starts at ``pos`` in ``data`` and
    is ``length`` bytes long: ``(message_id, exchange, routing_key, header, body)``, names as
    UTF-8 bytes. ``None`` unless exactly such a valid record (CRC checked) is there.

    Reads only those fields (the vhost and queue names are skipped, nothing is copied but the
    results): bringing spooled messages back is a drain's hot path.
    """
    end = pos + length
    if pos < 0 or len(data) < end or length < RECORD_HEADER_BYTES:
        return None
    size, crc, record_type = _RECORD_HEADER.unpack_from(data, pos)
    if size != length - RECORD_HEADER_BYTES or record_type != _PUBLISHED_TYPE:
        return None
    at = pos + RECORD_HEADER_BYTES
    # A small payload is cheaper to copy than to view.
    payload = data[at:end] if size < 4096 else memoryview(data)[at:end]
    try:
        if zlib.crc32(payload, _PUBLISHED_CRC) != crc:
            return None
        message_id, skip = _PUBLISHED_HEAD.unpack_from(data, at)
        at += 10 + skip
        (count,) = _U16.unpack_from(data, at)
        at += 2
        for _ in range(count):
            at += 2 + _U16.unpack_from(data, at)[0]
        (skip,) = _U16.unpack_from(data, at)
        exchange = data[at + 2 : at + 2 + skip]
        at += 2 + skip
        (skip,) = _U16.unpack_from(data, at)
        routing_key = data[at + 2 : at + 2 + skip]
        at += 2 + skip
        (skip,) = _U32.unpack_from(data, at + 8)
        header = data[at + 12 : at + 12 + skip]
        at += 12 + skip
        (skip,) = _U32.unpack_from(data, at)
        at += 4
    except struct.error:
        return None
    if at + skip != end or len(exchange) > 255 or len(routing_key) > 255:
        return None
    return message_id, exchange, routing_key, header, data[at:end]


class _Placed(Protocol):
    @property
    def offset(self) -> int: ...

    @property
    def length(self) -> int: ...


@functools.lru_cache(maxsize=64)
def _tail(header_size: int) -> Callable[[bytes, int], tuple[float, int, bytes, int]]:
    """Unpacks what follows a ``Published`` payload's names when its header is ``header_size``
    bytes long: timestamp, header length, header, body length."""
    return struct.Struct(f">dI{header_size}sI").unpack_from


def published_contents(
    data: bytes, base: int, places: Iterable[_Placed]
) -> list[tuple[int, bytes, bytes, bytes, bytes] | None]:
    """:func:`published_content` of each ``Published`` record of ``places`` (its ``offset`` and
    ``length``; ``data`` holds the bytes from offset ``base`` on), ``None`` for one that is not
    exactly such a valid record.

    A span of a deep queue's records mostly came the same way: once one's names (vhost, queues,
    exchange, routing key) are read, a record whose bytes there are the same is read without
    parsing them again.
    """
    contents: list[tuple[int, bytes, bytes, bytes, bytes] | None] = []
    append = contents.append
    unpack_head = _HEAD_AND_ID.unpack_from
    crc32 = zlib.crc32
    names = b""
    exchange = routing_key = b""
    # The timestamp, header and body length of records whose header has the last one's length.
    header_size = 0
    unpack_tail = _tail(0)
    for place in places:
        pos = place.offset - base
        length = place.length
        end = pos + length
        if pos < 0 or len(data) < end or length < _HEAD_AND_ID.size:
            append(None)
            continue
        size, crc, record_type, message_id = unpack_head(data, pos)
        at = pos + RECORD_HEADER_BYTES
        if (
            size != length - RECORD_HEADER_BYTES
            or record_type != _PUBLISHED_TYPE
            or crc32(data[at:end] if size < 4096 else memoryview(data)[at:end], _PUBLISHED_CRC) != crc
        ):
            append(None)
            continue
        try:
            if names and data.startswith(names, at + 8):
                at += 8 + len(names)
            else:
                content = published_content(data, pos, length)
                if content is None:
                    append(None)
                    continue
                _id, exchange, routing_key, _header, body = content
                # The names end where the timestamp, the header's length and the header start.
                names_end = end - len(body) - 16 - len(_header)
                names = data[at + 8 : names_end]
                at = names_end
            try:
                _timestamp, found, header, body_size = unpack_tail(data, at)
            except struct.error:  # (the data ends before a header of the last one's length would)
                found = -1
            if found != header_size:
                (header_size,) = _U32.unpack_from(data, at + 8)
                unpack_tail = _tail(header_size)
                _timestamp, _found, header, body_size = unpack_tail(data, at)
            at += 16 + header_size
        except struct.error:
            append(None)
            continue
        if at + body_size != end:
            append(None)
            continue
        append((message_id, exchange, routing_key, header, data[at:end]))
    return contents


def iter_records(data: _Buffer, start: int = 0) -> Iterator[tuple[int, int, Record]]:
    """Yield ``(offset, end_offset, record)`` for each valid record from ``start``.

    Stops, without raising, at the first position where no complete valid record starts (the
    end of the data, a torn tail or damage); :func:`scan` says which.

    :param data: segment bytes (pass ``start=SEGMENT_HEADER_BYTES`` for a whole segment file);
        anything but ``bytes`` is copied once
    :param start: offset of the first record
    """
    yield from _walk(data if type(data) is bytes else bytes(data), start)


# A record can only start where the length's top byte fits MAX_RECORD_BYTES and the type byte
# is a known type; this lookahead finds such positions in C, so resynchronising over a 64 MiB
# segment of garbage does not run a Python loop per byte.
_CANDIDATE = re.compile(
    b"(?=[\\x00-%c][\\x00-\\xff]{7}[%c-%c])" % (MAX_RECORD_BYTES >> 24, min(RecordType), max(RecordType)),
)


def _is_record_at(data: bytes, pos: int) -> bool:
    """Whether a complete valid record (header, sane length, matching CRC, decodable) starts at ``pos``."""
    size = len(data)
    if size - pos < RECORD_HEADER_BYTES:
        return False
    length, crc, record_type = _RECORD_HEADER.unpack_from(data, pos)
    end = pos + RECORD_HEADER_BYTES + length
    if length > MAX_RECORD_BYTES or end > size:
        return False
    payload = data[pos + RECORD_HEADER_BYTES : end]
    if zlib.crc32(payload, _TYPE_CRC[record_type]) != crc:
        return False
    try:
        decode(record_type, payload)
    except WALCorruption:
        return False
    return True


def _resync(data: bytes, bad: int) -> int | None:
    """The offset of the first valid record after the damaged one at ``bad``, or None.

    First tries where the damaged record claims to end: bit rot in a payload leaves the length
    right, and then the next record is there (and no search runs through the damaged payload).
    Otherwise scans forward byte by byte. Cost O(n) candidate tests for n bytes left, each
    O(1) unless its length and CRC need checking; worst case O(n * record size), paid only
    when the log is damaged.
    """
    size = len(data)
    if size - bad >= RECORD_HEADER_BYTES:
        length: int = _U32.unpack_from(data, bad)[0]
        claimed = bad + RECORD_HEADER_BYTES + length
        if length <= MAX_RECORD_BYTES and claimed < size and _is_record_at(data, claimed):
            return claimed
    for match in _CANDIDATE.finditer(data, bad + 1):
        if _is_record_at(data, match.start()):
            return match.start()
    return None


def scan(data: _Buffer, start: int = 0) -> ScanResult:
    """Read the valid records from ``start`` and explain where and why they stop.

    A bad record followed by no valid record is a torn tail (if this is the last segment);
    one followed by a valid record (``resync``) is corruption in the middle. Call again with
    ``start=resync`` to read past the damage.

    :param data: segment bytes; anything but ``bytes`` is copied once
    :param start: offset of the first record
    """
    if type(data) is not bytes:
        data = bytes(data)
    records: list[tuple[int, int, Record]] = []
    walk = _walk(data, start)
    while True:
        try:
            records.append(next(walk))
        except StopIteration as stop:
            end, problem = stop.value
            break
    resync = _resync(data, end) if problem is not None else None
    return ScanResult(records, end, problem, resync)


_STREAM_ENTRY = struct.Struct(">BB")  # lengths of the exchange name and the routing key (shortstrs)
_STREAM_SIZES = struct.Struct(">II")  # lengths of the content header and the body


def pack_stream_entries(entries: Iterable[tuple[bytes, bytes, bytes, bytes]]) -> bytes:
    """A :class:`StreamChunk`'s ``entries``: for each message its exchange name and routing key
    (shortstrs, as the AMQP method carried them), content header and body, in order:
    ``len u8 | exchange | len u8 | routing key | len u32 | header | len u32 | body``.

    :raises ValueError: a name longer than 255 bytes
    """
    parts: list[bytes] = []
    for exchange, routing_key, header, body in entries:
        if len(exchange) > 255 or len(routing_key) > 255:
            raise ValueError("an exchange name or routing key over 255 bytes")
        parts += (bytes((len(exchange),)), exchange, bytes((len(routing_key),)), routing_key)
        parts += (_STREAM_SIZES.pack(len(header), len(body)), header, body)
    return b"".join(parts)


def pack_stream_messages(messages: Iterable[tuple[bytes, bytes, bytes]]) -> bytes:
    """:func:`pack_stream_entries` of messages given as ``(names, header, body)``: ``names`` is
    the exchange name and routing key as the ``basic.publish`` carried them (two shortstrs,
    which is how an entry starts), so nothing is split or checked again."""
    parts: list[bytes] = []
    sizes = _STREAM_SIZES.pack
    for names, header, body in messages:
        parts += (names, sizes(len(header), len(body)), header, body)
    return b"".join(parts)


def unpack_stream_messages(data: bytes, start: int, count: int) -> list[tuple[bytes, bytes, bytes]]:
    """The ``count`` messages packed in ``data`` from ``start`` to its end, as
    :func:`pack_stream_messages` takes them: ``(names, header, body)``, ``names`` being the
    exchange and routing key as two shortstrs (how ``basic.deliver`` carries them).

    :raises WALCorruption: as :func:`unpack_stream_entries`
    """
    messages = []
    pos = start
    size = len(data)
    sizes = _STREAM_SIZES.unpack_from
    try:
        for _ in range(count):
            end = pos + 1 + data[pos]
            end += 1 + data[end]
            names = data[pos:end]
            header_size, body_size = sizes(data, end)
            pos = end + 8
            header = data[pos : pos + header_size]
            pos += header_size
            body = data[pos : pos + body_size]
            pos += body_size
            if pos > size:
                raise IndexError(pos)
            messages.append((names, header, body))
    except (IndexError, struct.error):
        raise WALCorruption(f"stream chunk entries cut short at byte {pos - start} of {size - start}") from None
    if pos != size:
        raise WALCorruption(f"{size - pos} bytes after the stream chunk's {count} entries")
    return messages


_RAW_SIZE = struct.Struct(">I")
#: The names a message published over the stream protocol has among AMQP 0-9-1's (two empty
#: shortstrs), and its content header (none: that marks it).
_RAW_NAMES = b"\x00\x00"


def pack_raw_entries(messages: Iterable[bytes]) -> bytes:
    """A :class:`StreamRawChunk`'s ``entries``: each message as a simple entry (size, bytes)."""
    size = _RAW_SIZE.pack
    return b"".join([part for message in messages for part in (size(len(message)), message)])


def unpack_raw_messages(data: bytes, start: int, count: int) -> list[tuple[bytes, bytes, bytes]]:
    """The ``count`` messages of a :class:`StreamRawChunk`'s entries in ``data`` from ``start``,
    as :func:`unpack_stream_messages` gives a stream's messages: ``(names, header, body)`` with
    empty names and no content header (a message published over the stream protocol).

    :raises WALCorruption: the entries do not add up
    """
    messages = []
    pos, size = start, len(data)
    unpack = _RAW_SIZE.unpack_from
    try:
        for _ in range(count):
            length = unpack(data, pos)[0]
            pos += 4
            messages.append((_RAW_NAMES, b"", data[pos : pos + length]))
            pos += length
            if pos > size:
                raise IndexError(pos)
    except (IndexError, struct.error):
        raise WALCorruption(f"stream chunk entries cut short at byte {pos - start} of {size - start}") from None
    if pos != size:
        raise WALCorruption(f"{size - pos} bytes after the stream chunk's {count} entries")
    return messages


#: A sub-entry batch's head: its flags (1, compression u3, reserved u4), how many messages it
#: holds, their size uncompressed, and its size (the messages, compressed or not, follow).
BATCH_HEAD = struct.Struct(">BHII")


def batch_records(entry: bytes | memoryview) -> int:
    """How many messages (offsets) one entry of a :class:`StreamBatchChunk` holds: 1 for a
    simple entry, its count for a sub-entry batch (whose first bit is set)."""
    return 1 if entry[0] < 0x80 else entry[1] << 8 | entry[2]


def count_entries(data: bytes | memoryview, start: int) -> int:
    """How many entries (simple entries and sub-entry batches) a :class:`StreamBatchChunk`'s
    entries in ``data`` from ``start`` are.

    :raises WALCorruption: they do not add up
    """
    pos, size, entries = start, len(data), 0
    unpack = _RAW_SIZE.unpack_from
    try:
        while pos < size:
            word = unpack(data, pos)[0]
            pos += 4 + word if word < 0x80000000 else BATCH_HEAD.size + unpack(data, pos + 7)[0]
            entries += 1
    except struct.error:
        pos = -1
    if pos != size:
        raise WALCorruption(f"stream chunk entries do not add up ({size - start} bytes)")
    return entries


def split_entries(data: bytes | memoryview, entries: int, size: int | None = None) -> tuple[int, int]:
    """Where the first ``entries`` entries (simple entries and sub-entry batches) of ``data``
    end, and how many messages (offsets) they hold. With ``size``, every entry is a simple
    entry of a message of ``size`` bytes (nothing is read).

    :raises WALCorruption: ``data`` holds fewer entries, or they do not add up
    """
    if size is not None:
        return entries * (4 + size), entries
    pos, end, messages = 0, len(data), 0
    unpack = _RAW_SIZE.unpack_from
    try:
        for _ in range(entries):
            word = unpack(data, pos)[0]
            if word < 0x80000000:
                pos += 4 + word
                messages += 1
            else:
                messages += data[pos + 1] << 8 | data[pos + 2]
                pos += BATCH_HEAD.size + unpack(data, pos + 7)[0]
    except (IndexError, struct.error):
        pos = end + 1
    if pos > end:
        raise WALCorruption(f"stream entries end before entry {entries} ({end} bytes)")
    return pos, messages


def unpack_batched_messages(data: bytes, start: int, count: int) -> list[tuple[bytes, bytes, bytes] | None]:
    """The ``count`` messages of a :class:`StreamBatchChunk`'s entries in ``data`` from
    ``start``, one for each offset, as :func:`unpack_raw_messages` gives them: an uncompressed
    sub-entry batch's messages each on its own, ``None`` for each of a compressed one's (the
    stream protocol's clients read those; RabbitMQ's AMQP readers pass over them too).

    :raises WALCorruption: the entries do not add up
    """
    messages: list[tuple[bytes, bytes, bytes] | None] = []
    pos, size = start, len(data)
    unpack = _RAW_SIZE.unpack_from
    try:
        while pos < size:
            word = unpack(data, pos)[0]
            if word < 0x80000000:
                pos += 4
                messages.append((_RAW_NAMES, b"", data[pos : pos + word]))
                pos += word
                continue
            flags, records, _uncompressed, length = BATCH_HEAD.unpack_from(data, pos)
            pos += BATCH_HEAD.size
            end = pos + length
            if end > size:
                break
            if flags & 0x70:
                messages += [None] * records
            else:
                messages += unpack_raw_messages(data[pos:end], 0, records)
            pos = end
    except struct.error:
        pos = -1
    if pos != size or len(messages) != count:
        raise WALCorruption(f"stream chunk entries do not add up to its {count} messages")
    return messages


def unpack_stream_entries(data: bytes, count: int) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """The ``count`` messages :func:`pack_stream_entries` packed into ``data``.

    :raises WALCorruption: ``data`` does not hold exactly ``count`` of them
    """
    return as_entries(unpack_stream_messages(data, 0, count))


def as_entries(messages: list[tuple[bytes, bytes, bytes]]) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """Messages as :func:`unpack_stream_messages` gives them, each with its names split into
    the exchange and the routing key (as :func:`pack_stream_entries` takes them)."""
    return [(names[1 : 1 + names[0]], names[2 + names[0] :], header, body) for names, header, body in messages]

"""The write-ahead log's record types: what each record holds, field by field.

Each record is a frozen dataclass whose fields, in order and by annotation, are the one
statement of its payload's layout (:mod:`broker.wal.codec` derives its encoder and decoder from
them); :class:`RecordType` is the type byte that tells them apart on disk. Also here: the error
a log that does not hold valid records raises, :exc:`WALCorruption`.

Standard library only, as every module of the record format (``records``, ``crc``, ``codec``,
``segments``, ``chunks``): ``spark/`` imports them on executors to read archived segments
without the broker's dependencies. ``docs/wal-format.md`` describes the format byte by byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType
from typing import Union

__all__ = [
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
    "StreamChunk",
    "StreamRawChunk",
    "StreamBatchChunk",
    "StreamTrackedChunk",
    "StreamTrackedRawChunk",
    "StreamTrackedBatchChunk",
    "StreamOffset",
    "Defined",
    "Undefined",
    "DEAD_LETTER_RECORDS",
    "DEAD_LETTER_PREVIEW_BYTES",
    "DEAD_LETTER_HEADER_VALUE_BYTES",
    "Record",
    "RECORD_CLASSES",
]


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

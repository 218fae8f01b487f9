"""Stream queues: an append-only log that each consumer reads at its own offset.

A stream (``x-queue-type: stream``, RabbitMQ's stream queues over AMQP 0-9-1) keeps every
message it is given, in the order given, each at an offset (0, 1, 2 ...), in its own
:class:`~broker.wal.streamlog.StreamLog`. Reading removes nothing: every consumer has a reader
that starts where its ``x-stream-offset`` says (:func:`offset_spec`) and moves on as it reads.
``docs/rabbitmq-streams.md`` gives RabbitMQ 3.10's rules, which these follow.

Messages arrive in the broker's thread (:meth:`StreamQueue.enqueue`) and wait until the next
chunk is staged (:meth:`StreamQueue.stage`, one chunk per group commit); the log's writer
writes it, and once it is written (:meth:`StreamQueue.written`) its messages are readable and
go to the consumers. Deliveries are whole chunks, as RabbitMQ's: a consumer's credit is its
prefetch less its unacknowledged deliveries, and while it is above 0 the reader delivers the
next chunk whole (the credit may go below 0). An ack gives credit back and removes nothing.

Each delivery carries the message's offset as the header ``x-stream-offset`` (a long-long),
set where an entry of that name stood, the table's entries sorted by name as RabbitMQ sorts
them; the rest of the publisher's content header comes back as it was sent.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from twisted.logger import Logger

from postroom.broker.core.dead_lettering import DeadLetterReason
from postroom.broker.core.entry import Consumer, Entry, QueueObserver
from postroom.broker.core.message import Message
from postroom.broker.core.policy import effective_definition
from postroom.broker.core.settings import QueueSettings
from postroom.broker.errors import ChannelCrash, ChannelException, ReplyCode
from postroom.broker.wal.chunks import BATCHED, RAW, pack_stream_messages, pack_tracking, split_entries
from postroom.broker.wal.records import WALCorruption
from postroom.broker.wal.streamlog import DEFAULT_STREAM_SEGMENT_BYTES, Chunk, Staged, StreamLog
from postroom.broker.wire.amqp10 import delivered_as_amqp091
from postroom.broker.wire.codec import split_names
from postroom.broker.wire.content import ContentError, headers_content, with_headers_content
from postroom.broker.wire.table import Int64, TableError, encode_entry, iter_table
from postroom.config.policies import STREAM_KEYS
from postroom.exchanges.partitions import partition_order

_log = Logger()

#: The delivery header that says a message's offset.
OFFSET_HEADER = "x-stream-offset"
_OFFSET_KEY = OFFSET_HEADER.encode()

#: Seconds in each unit of an interval (``x-max-age``, an ``x-stream-offset`` string), as
#: RabbitMQ counts them (``rabbit_amqqueue:check_max_age``): a year is 365 days, a month 30.
INTERVAL_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_INTERVAL = re.compile(r"([0-9]*)(.*)", re.DOTALL)

#: The consumer argument that names a durable subscription, and the one that makes consumers
#: of one name a failover group (one reads at a time).
CONSUMER_NAME = "x-stream-consumer-name"
SINGLE_ACTIVE = "x-single-active-consumer"

#: Where a stream-protocol publisher's last publishing id is kept among the stored offsets
#: (a name no subscription has: it starts with a NUL).
PUBLISHER_PREFIX = "\x00publisher:"

#: What marks :meth:`StreamQueue.append_raw`'s blocks among the messages waiting for a chunk
#: (of simple entries only; with sub-entry batches among them).
_RAW_BLOCK, _BATCH_BLOCK = object(), object()


#: Body bytes past which the messages waiting for a chunk go into the next one.
CHUNK_BYTES = 1 << 20

#: The fewest and the most entries a chunk is given room for: RabbitMQ's stream writer takes
#: its messages in batches of gen_batch_server's (0.8.7) sizes, one chunk a batch, starting at
#: 32 entries, doubling after a batch that filled, halving after one that did not, never past
#: 8192 (so a chunk head's 16-bit count of entries never overflows).
MIN_CHUNK_ENTRIES = 32
MAX_CHUNK_ENTRIES = 8192


class NoLeadingDigit(ValueError):
    """An interval with no digits in front: RabbitMQ 3.10's channel crashes on it (541)."""


def interval_seconds(text: str) -> float:
    """The seconds in ``text``: digits, then exactly one of ``Y M D h m s`` (``7D``, ``12h``).

    :raises NoLeadingDigit: ``text`` does not start with a digit
    :raises ValueError: the rest is not one unit, or the number is 0
    """
    match = _INTERVAL.fullmatch(text)
    assert match is not None  # the pattern matches anything
    digits, unit = match.groups()
    if not digits:
        raise NoLeadingDigit(text)
    if unit not in INTERVAL_UNITS or int(digits) <= 0:
        raise ValueError(text)
    return int(digits) * INTERVAL_UNITS[unit]


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a consumer starts: ``first``, ``last``, ``next``, ``offset`` (at ``value``) or
    ``timestamp`` (the first chunk appended at ``value`` seconds since the epoch or later)."""

    kind: str
    value: float = 0


def offset_spec(value: object, now: float, queue: str, where: str) -> OffsetSpec:
    """The ``x-stream-offset`` consumer argument, read as RabbitMQ 3.10 reads it
    (``rabbit_stream_queue:parse_offset_arg``).

    :param value: the argument as decoded (``None``: absent, which is ``next``)
    :param now: the time, for an interval (``"10m"``: from ten minutes ago)
    :param queue: the queue's name and ``where`` (``in vhost '/'``), for the refusal's text
    :raises ChannelException: 406 for a string that starts with a digit and is no interval
    :raises ChannelCrash: 541 INTERNAL_ERROR where RabbitMQ's channel crashes: another
        string, or a value of a type it takes no offset from (boolean, float, void, table)
    """
    if value is None:
        return OffsetSpec("next")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return OffsetSpec(value)
        try:
            return OffsetSpec("timestamp", now - interval_seconds(value))
        except NoLeadingDigit:
            raise ChannelCrash() from None
        except ValueError:
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{OFFSET_HEADER}' for queue '{queue}' {where}: "
                f'{{invalid_stream_offset_arg,{{longstr,<<"{value}">>}}}}',
            ) from None
    if isinstance(value, datetime):
        return OffsetSpec("timestamp", value.timestamp())
    if isinstance(value, int) and not isinstance(value, bool):
        return OffsetSpec("offset", int(value))
    raise ChannelCrash()


#: A content header's flags, and the first properties (content-type, content-encoding: short
#: strings), which come before the headers table.
_FLAGS = struct.Struct(">H")
_HEADERS_FLAG = 0x2000
_BEFORE_HEADERS = (0x8000, 0x4000)
#: The table that holds only the offset: its length, the name and ``l``; the value follows.
_ALONE_HEAD = struct.pack(">IB", 1 + len(_OFFSET_KEY) + 1 + 8, len(_OFFSET_KEY)) + _OFFSET_KEY + b"l"
_OFFSET_VALUE = struct.Struct(">q")


def around_offset(header: bytes) -> tuple[bytes, bytes] | None:
    """For a header without a headers table (most messages): the bytes :func:`with_offset`
    puts before the offset's eight and after them (the flags then say there is a table, which
    goes after content-type and content-encoding and holds only ``x-stream-offset``).
    ``None`` for a header with a table, or one that does not parse."""
    if len(header) < 14:
        return None
    flags = _FLAGS.unpack_from(header, 12)[0]
    if flags & _HEADERS_FLAG:
        return None
    at = 14
    for flag in _BEFORE_HEADERS:
        if flags & flag:
            if at >= len(header):
                return None
            at += 1 + header[at]
    if at > len(header):
        return None
    return b"".join((header[:12], _FLAGS.pack(flags | _HEADERS_FLAG), header[14:at], _ALONE_HEAD)), header[at:]


def with_offset(header: bytes, offset: int) -> bytes:
    """``header`` with ``x-stream-offset`` set to ``offset`` (a long-long) and its headers
    table's entries sorted by name (byte order), as RabbitMQ delivers from a stream. (A header
    that does not parse, which a publish never lets in, is returned as it is.)"""
    around = around_offset(header)
    if around is not None:
        return b"".join((around[0], _OFFSET_VALUE.pack(offset), around[1]))
    if len(header) >= 14 and not _FLAGS.unpack_from(header, 12)[0] & _HEADERS_FLAG:
        return header
    entry = encode_entry(_OFFSET_KEY, Int64(offset))
    try:
        content = headers_content(header)
        entries = [] if content is None else list(iter_table(content, 0, len(content)))
    except (ContentError, TableError):
        return header
    if content is None or not entries:
        return with_headers_content(header, entry)
    parts = [(name, content[start - 2 - len(name) : end]) for name, _tag, start, end in entries if name != _OFFSET_KEY]
    parts.append((_OFFSET_KEY, entry))
    parts.sort(key=lambda part: part[0])
    return with_headers_content(header, b"".join(data for _name, data in parts))


class StreamStore(Protocol):
    """Where streams keep their messages (``broker.storage.streams.StreamFiles``)."""

    def pending(self, stream: StreamQueue, size: int, count: int = 1) -> None:
        """``stream`` has ``count`` messages of ``size`` body bytes in all waiting: write them
        with the next write."""

    def offset_stored(self, stream: StreamQueue, name: str, offset: int) -> None:
        """``stream``'s subscription ``name`` reads on from ``offset``: record it with the next write."""


class _Reader:
    """Where one consumer is in the stream."""

    __slots__ = ("chunk", "next_offset", "skip_below", "spec", "name", "group", "active", "unacked", "acked")

    def __init__(self, spec: OffsetSpec, name: str | None, group: bool) -> None:
        #: The last chunk it was given (its successor comes next), or ``None``: it waits for
        #: the chunk holding :attr:`next_offset`.
        self.chunk: Chunk | None = None
        self.next_offset = 0
        #: Offsets below this are not delivered (a numeric ``x-stream-offset``, a stored offset).
        self.skip_below = 0
        #: Where it starts when nothing is stored for its subscription.
        self.spec = spec
        #: Its subscription (``x-stream-consumer-name``), and whether it is in that name's
        #: single-active-consumer group.
        self.name = name
        self.group = group
        #: Whether it is given chunks (a group's waiting members are not).
        self.active = False
        #: A subscription's deliveries not yet acknowledged, by offset in delivery order, and
        #: those acknowledged out of order (the stored offset stops at the oldest unacknowledged).
        self.unacked: deque[int] = deque()
        self.acked: set[int] = set()


class StreamQueue:
    """One stream (see the module's docstring).

    :param log: its opened log
    :param clock: anything with ``seconds()`` (the reactor), for timestamps and intervals
    """

    #: Its kind, as ``x-queue-type`` names it.
    kind = "stream"
    durable = True
    auto_delete = False
    owner: object | None = None
    exclusive = False
    max_priority = None
    #: What a work queue has and a stream has not: no single active consumer, nothing in
    #: memory to page.
    active_consumer = None
    memory_use = (0, 0)

    def __init__(
        self,
        name: str,
        vhost_name: str,
        arguments: Mapping[str, Any],
        log: StreamLog,
        clock: Any,
        store: StreamStore | None = None,
    ) -> None:
        self.name = name
        self.vhost_name = vhost_name
        self.arguments = dict(arguments)
        #: No TTLs, limits or dead-lettering apply to a stream (RabbitMQ refuses them).
        self.settings = QueueSettings()
        self.log = log
        self.clock = clock
        #: Told when messages wait for a chunk (it has them written); ``None``: the caller stages.
        self.store = store
        #: Offsets below this are written and readable.
        self.committed = log.next_offset
        #: Messages waiting for the next chunk: the publish's names, the header and the body of
        #: each AMQP 0-9-1 message, and :meth:`append_raw`'s blocks (a marker, ``(messages,
        #: entries, entry size or None, publisher reference or "", publishing ids or None)``,
        #: the block).
        self._pending: list[tuple[Any, Any, bytes]] = []
        #: The most entries the next chunk takes (see :data:`MAX_CHUNK_ENTRIES`).
        self.chunk_entries = MIN_CHUNK_ENTRIES
        #: Each named publisher's last publishing id among the chunks staged (``None`` until
        #: first needed: then the ones recovered), for a segment's first chunk's trailer.
        self._staged_sequences: dict[str, int] | None = None
        #: Chunks staged and not yet written, oldest first.
        self._staged: deque[Staged] = deque()
        self._readers: dict[Consumer, _Reader] = {}
        #: Each subscription's stored offset: where a consumer of that name reads on from.
        self.subscriptions: dict[str, int] = {}
        #: Each single-active-consumer group's members, in the order they came, and the member
        #: that reads for it (or finishes its deliveries before the next one reads).
        self._groups: dict[str, list[Consumer]] = {}
        self._holders: dict[str, Consumer] = {}
        self.deleted = False
        #: Exchanges with a binding to it; the vhost it tells of what happens (unused yet).
        self.sources: set[Any] = set()
        self.observer: QueueObserver | None = None
        #: The policy and the operator policy that apply to it (``broker.core.policy``).
        self.policy: Any = None
        self.operator_policy: Any = None
        self.seq = 0
        self.published = 0
        self.delivered = 0
        self.delivered_no_ack = self.got = self.got_no_ack = self.got_empty = 0
        self.acked = 0
        self.redelivered = 0
        self.visibility_timeouts = 0
        self.dead_lettered: dict[DeadLetterReason, int] = {}
        #: Deliveries are not sampled for latency on a stream (the channel reads this).
        self.latency_samples: dict[Entry, float] = {}
        #: Called with the stream when chunks were written (the stream protocol's readers).
        self.watchers: set[Any] = set()
        #: The stream protocol's single-active-consumer groups: their members by group name,
        #: in the order they came.
        self.stream_groups: dict[str, list[Any]] = {}

    # -- what it holds ------------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        """Messages held: every offset written and not removed by retention."""
        return self.committed - self.log.first_offset

    @property
    def consumer_count(self) -> int:
        return len(self._readers)

    @property
    def consumers(self) -> Iterable[Consumer]:
        return list(self._readers)

    @property
    def unacked_count(self) -> int:
        """Nothing is held unacknowledged by a stream (RabbitMQ counts 0): a delivery is only credit."""
        return 0

    @unacked_count.setter
    def unacked_count(self, _count: int) -> None:
        """Channels count their deliveries in; a stream keeps no such count."""

    @property
    def queued_bytes(self) -> int:
        """Bytes of the stream's segments."""
        return self.log.size

    def ready_entries(self) -> list[Entry]:
        """A stream holds no entries in memory (its messages are read from its files)."""
        return []

    def now(self) -> float:
        return float(self.clock.seconds())

    def touch(self) -> None:
        """Used: a stream has no ``x-expires`` to restart."""

    def cancel_timers(self) -> None:
        """A stream has no timers."""

    def apply_settings(self, settings: QueueSettings) -> None:
        """Its policies changed (none of a work queue's settings apply to a stream): a new
        segment size applies to the next segment, retention from the next roll."""
        size = self.effective_arguments().get("x-stream-max-segment-size-bytes")
        valid = isinstance(size, int) and not isinstance(size, bool) and size > 0
        self.log.segment_bytes = size if valid else DEFAULT_STREAM_SEGMENT_BYTES  # type: ignore[assignment]

    def effective_arguments(self) -> dict[str, Any]:
        """Its arguments with its policies' stream keys in their place: a policy's value wins
        over the argument, as RabbitMQ's ``rabbit_stream_queue:policy_precedence`` has it (an
        operator policy's ``max-length-bytes`` lowers the policy's)."""
        arguments = dict(self.arguments)
        definition = effective_definition(self.policy, self.operator_policy)
        for key, argument in STREAM_KEYS.items():
            if key in definition:
                arguments[argument] = definition[key]
        return arguments

    def purge(self) -> int:
        """Nothing is purged from a stream (``queue.purge`` is refused before it gets here)."""
        return 0

    def refusal(self, operation: str) -> ChannelException:
        """RabbitMQ's 540 for what a stream does not do (``basic.get``, ``queue.purge`` ...); a
        hard error, so the connection closes."""
        return ChannelException(
            ReplyCode.NOT_IMPLEMENTED,
            f"{operation} not supported by stream queues queue '{self.name}' in vhost '{self.vhost_name}'",
        )

    def get(self) -> Entry | None:
        """``basic.get`` takes nothing from a stream.

        :raises ChannelException: 540, as RabbitMQ answers
        """
        raise self.refusal("basic.get")

    # -- appending ----------------------------------------------------------------------------

    def append_raw(
        self,
        block: bytes,
        count: int,
        batched: bool = False,
        entries: int | None = None,
        size: int | None = None,
        publisher: tuple[str, list[int]] | None = None,
    ) -> int:
        """Take messages published over the stream protocol for the next chunk: ``block`` is
        ``count`` of them, each as a simple entry of RabbitMQ's chunk format (its size, then the
        message as its client encoded it: AMQP 1.0), which is how a
        :class:`~broker.wal.records.StreamRawChunk` keeps them. Kept whole, as one piece of the
        chunk: nothing here looks at each message.

        With ``batched``, sub-entry batches may be among the entries (several messages as one
        entry, :data:`~broker.wal.chunks.BATCH_HEAD`), ``entries`` of them, and ``count`` is the
        messages they hold in all: kept as they are, in a
        :class:`~broker.wal.records.StreamBatchChunk`. ``size``, when given, is the size of
        every message (a block that has to be split across chunks is then not read).
        ``publisher``: the named publisher that sent them, and the publishing id of each entry
        (rising), for the trailer of the chunk that holds them. Returns ``count``."""
        reference, ids = publisher if publisher is not None else ("", None)
        shape = (count, count if entries is None else entries, size, reference, ids)
        self._pending.append((_BATCH_BLOCK if batched else _RAW_BLOCK, shape, block))
        if self.store is not None and count:
            self.store.pending(self, len(block), count)
        self.published += count
        return count

    def publisher_sequence(self, reference: str) -> int | None:
        """The last publishing id the stream protocol's publisher ``reference`` wrote here
        (a message with an id not above it is a resend: confirmed, not written again)."""
        return self.subscriptions.get(PUBLISHER_PREFIX + reference)

    def set_publisher_sequence(self, reference: str, sequence: int) -> None:
        """Publisher ``reference`` wrote up to ``sequence``: kept with the stored offsets (in
        the log, with the write that holds the messages; the chunk holding them has it in its
        trailer too)."""
        self._sequences_staged()
        self.store_offset(PUBLISHER_PREFIX + reference, sequence)

    def _sequences_staged(self) -> dict[str, int]:
        """Each named publisher's last publishing id in the chunks staged: at first, those it
        had when the stream was opened (before any publish moved them)."""
        if self._staged_sequences is None:
            prefix = len(PUBLISHER_PREFIX)
            self._staged_sequences = {
                name[prefix:]: value for name, value in self.subscriptions.items() if name.startswith(PUBLISHER_PREFIX)
            }
        return self._staged_sequences

    def recover_offsets(self, offsets: Mapping[str, int]) -> None:
        """The stored offsets (and publishers' sequences) the log held, with the publishers'
        sequences found in the stream's own trailers (the later where both have one: chunks
        are written before the log's records of the same write)."""
        self.subscriptions.update(offsets)
        for reference, sequence in self.log.tracking.items():
            name = PUBLISHER_PREFIX + reference
            if sequence > self.subscriptions.get(name, -1):
                self.subscriptions[name] = sequence

    def store_offset(self, name: str, offset: int) -> None:
        """Subscription ``name`` reads on from ``offset``: kept, and recorded in the log with
        its next write when it moved."""
        if self.subscriptions.get(name) != offset:
            self.subscriptions[name] = offset
            if self.store is not None:
                self.store.offset_stored(self, name, offset)

    def enqueue(self, message: Message) -> bool:
        """Take ``message`` for the next chunk (readable once that chunk is written)."""
        self._pending.append((message.names, message.header, message.body))
        self.published += 1
        if self.store is not None:
            self.store.pending(self, message.size)
        return True

    def stage(self) -> tuple[list[Staged], list[int]]:
        """Place the messages waiting as chunks for the writer. A chunk ends once it holds
        :attr:`chunk_entries` entries (which then doubles, up to :data:`MAX_CHUNK_ENTRIES`; a
        publish frame's block is split there), once it holds :data:`CHUNK_BYTES` of bodies
        (with the message or the block that reached it), where stream-protocol messages (kept
        as simple entries, sent to that protocol's readers as stored) meet AMQP 0-9-1's, and
        with the last message waiting (:attr:`chunk_entries` then halves, down to
        :data:`MIN_CHUNK_ENTRIES`): RabbitMQ's writer's batches. Returns every chunk not
        written yet, oldest first, and, when one opens a segment, the segments retention drops
        (``x-max-length-bytes``, ``x-max-age``, evaluated as RabbitMQ does: at a segment's
        roll), for the writer to remove."""
        pending, self._pending = self._pending, []
        now = self.now()
        rolled = False
        room = self.chunk_entries
        run: list[tuple[Any, Any, bytes]] = []
        raw = False
        entries = size = 0

        sequences = self._sequences_staged()

        def close() -> None:
            nonlocal rolled, entries, size
            # The trailer: the last publishing id of each named publisher with messages in the
            # chunk (osiris's order: the references last first); a chunk that opens a segment
            # also has every other publisher's (a snapshot: recovery reads the last segment only).
            own = {shape[3]: shape[4][-1] for _m, shape, _b in run if shape[3] and shape[4]} if raw else {}
            trailer = pack_tracking(sorted(own.items(), reverse=True)) if own else b""
            sequences.update(own)

            def snapshot() -> bytes:
                others = sorted(((name, last) for name, last in sequences.items() if name not in own), reverse=True)
                return pack_tracking(others, snapshot=True)

            if raw:
                kind = BATCHED if any([marker is _BATCH_BLOCK for marker, _shape, _block in run]) else RAW
                blocks = [block for _marker, _shape, block in run]
                messages = sum([shape[0] for _m, shape, _b in run])
                staged = self.log.stage_packed(blocks, messages, now, kind, trailer, snapshot)
            else:
                staged = self.log.stage_packed(pack_stream_messages(run), len(run), now, 0, b"", snapshot)
            rolled = rolled or staged.roll
            self._staged.append(staged)
            run.clear()
            entries = size = 0

        at = 0
        while at < len(pending):
            item = pending[at]
            marker = item[0]
            block = marker is _RAW_BLOCK or marker is _BATCH_BLOCK
            if run and block != raw:
                close()
            raw = block
            if block:
                count, held, uniform, reference, ids = item[1]
                if held > room - entries:
                    # The block fills the chunk: its first entries end it, the rest go on.
                    take = room - entries
                    cut, messages = split_entries(item[2], take, uniform)
                    head, rest = (ids[:take], ids[take:]) if ids is not None else (None, None)
                    run.append((marker, (messages, take, uniform, reference, head), item[2][:cut]))
                    pending[at] = (marker, (count - messages, held - take, uniform, reference, rest), item[2][cut:])
                    close()
                    room = min(room * 2, MAX_CHUNK_ENTRIES)
                    continue
                entries += held
            else:
                entries += 1
            run.append(item)
            size += len(item[2])
            at += 1
            if entries >= room:
                close()
                room = min(room * 2, MAX_CHUNK_ENTRIES)
            elif size >= CHUNK_BYTES:
                close()
        if run:
            close()
            room = max(room // 2, MIN_CHUNK_ENTRIES)
        self.chunk_entries = room
        dropped: list[int] = []
        if rolled:
            max_bytes, max_age = self.retention()
            if max_bytes is not None or max_age is not None:
                dropped = self.log.retain(max_bytes, max_age, now)
        return list(self._staged), dropped

    def retention(self) -> tuple[int | None, float | None]:
        """The stream's ``x-max-length-bytes`` and ``x-max-age`` (in seconds), each ``None`` when
        unset, its policies applied."""
        arguments = self.effective_arguments() if self.policy or self.operator_policy else self.arguments
        max_bytes = arguments.get("x-max-length-bytes")
        max_age = arguments.get("x-max-age")
        if isinstance(max_age, bytes):
            max_age = max_age.decode("utf-8", "surrogateescape")
        return (
            max_bytes if isinstance(max_bytes, int) and not isinstance(max_bytes, bool) else None,
            interval_seconds(max_age) if isinstance(max_age, str) else None,
        )

    def written(self, staged: Iterable[Staged]) -> None:
        """The writer wrote (and synced) ``staged``: their messages are readable."""
        for item in staged:
            if self._staged and self._staged[0] is item:
                self._staged.popleft()
            self.committed = max(self.committed, item.chunk.next_offset)
        self.dispatch()
        for watcher in list(self.watchers):
            watcher(self)

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(
        self, consumer: Consumer, spec: OffsetSpec, name: str | None = None, single_active: bool = False
    ) -> None:
        """Attach ``consumer`` and deliver what it may take.

        It starts where ``spec`` says (see ``docs/rabbitmq-streams.md``, 4.3), or, with a
        subscription ``name`` that has an offset stored, right there. With ``single_active``,
        it joins ``name``'s group, which one member reads for at a time (:meth:`_rebalance`).
        """
        reader = self._readers[consumer] = _Reader(spec, name, single_active and name is not None)
        if reader.group:
            assert name is not None
            self._groups.setdefault(name, []).append(consumer)
            self._rebalance(name)
        else:
            self._start(reader)
        self.dispatch()

    def _start(self, reader: _Reader) -> None:
        """Place ``reader`` at its subscription's stored offset, or where its spec says, and let it read."""
        stored = self.subscriptions.get(reader.name) if reader.name is not None else None
        spec = OffsetSpec("offset", stored) if stored is not None else reader.spec
        log = self.log
        first, end = log.first_offset, self.committed
        start, skip_below = end, 0
        if spec.kind == "first":
            start = first
        elif spec.kind == "last":
            last = self._last_written()
            start = last.first_offset if last is not None else end
        elif spec.kind == "offset":
            offset = int(spec.value)
            start = min(max(offset, first), end)
            skip_below = offset
        elif spec.kind == "timestamp" and first < end:
            chunk = log.locate_time(spec.value)
            if chunk is not None and chunk.first_offset < end:
                start = chunk.first_offset
        reader.chunk = None
        reader.next_offset = start
        reader.skip_below = skip_below
        reader.unacked.clear()
        reader.acked.clear()
        reader.active = True

    def _last_written(self) -> Chunk | None:
        """The newest written chunk."""
        if self.committed == self.log.first_offset:
            return None
        return self.log.locate(self.committed - 1)

    def remove_consumer(self, consumer: Consumer) -> None:
        reader = self._readers.pop(consumer, None)
        if reader is not None and reader.group:
            assert reader.name is not None
            members = self._groups[reader.name]
            members.remove(consumer)
            if not members:
                del self._groups[reader.name]
            self._rebalance(reader.name)
            self.dispatch()

    def has_exclusive_consumer(self) -> bool:
        return False

    def partition_of(self) -> dict[str, Any] | None:
        """The partitioned stream it belongs to: ``{"exchange": ..., "order": ...}``, or ``None``."""
        for exchange in self.sources:
            for destination, _key, arguments in exchange.router.bindings():
                order = partition_order(arguments) if destination is self else None
                if order is not None:
                    return {"exchange": exchange.name, "order": order}
        return None

    def partition(self) -> int:
        """The stream's place in a partitioned stream (its binding's
        ``x-stream-partition-order``), 0 when it is in none."""
        place = self.partition_of()
        return place["order"] if place is not None else 0

    def _rebalance(self, name: str) -> None:
        """Give group ``name`` the reader RabbitMQ's rule for single active consumers of super
        streams picks: member ``p mod n`` of the ``n`` members in the order they came, for the
        stream at place ``p`` of its partitioned stream (the first member of a lone stream).

        A member that stops reading for the group first finishes its deliveries (until they are
        acknowledged, or it leaves); the next then reads on from the group's stored offset, so
        no two members ever hold the same partition's messages at once.
        """
        members = self._groups.get(name, [])
        wanted = members[self.partition() % len(members)] if members else None
        holder = self._holders.get(name)
        if holder is not None:
            reader = self._readers.get(holder)
            if reader is not None and holder is wanted:
                reader.active = True
                return
            if reader is not None:
                reader.active = False
                if reader.unacked:
                    return  # it finishes first (see settle)
            del self._holders[name]
        if wanted is not None:
            self._holders[name] = wanted
            self._start(self._readers[wanted])

    def dispatch(self) -> None:
        """Give each consumer with credit the written chunks it has not had, a chunk at a time.

        A chunk that cannot be read (the storage failed, the file is damaged) stops that reader
        only, said once in the log: this runs for acks and publishes, after their confirms, and
        must not fail them.
        """
        for consumer, reader in list(self._readers.items()):
            if not reader.active:
                continue
            while consumer.credit() > 0 and self._readers.get(consumer) is reader and reader.active:
                try:
                    chunk = self._next_chunk(reader)
                    if chunk is None:
                        break
                    entries = self._entries(chunk, reader.skip_below)
                except (OSError, WALCorruption) as error:
                    reader.active = False
                    _log.error(
                        "stream {stream!r} in vhost {vhost!r}: reading offset {offset} failed ({error});"
                        " consumer {tag!r} gets nothing more from it",
                        stream=self.name,
                        vhost=self.vhost_name,
                        offset=reader.next_offset,
                        error=str(error),
                        tag=consumer.tag,
                    )
                    break
                reader.chunk = chunk
                reader.next_offset = chunk.next_offset
                if reader.name is not None:
                    reader.unacked.extend(entry.seq for entry in entries)
                if entries:
                    consumer.channel.deliver_entries(consumer, entries)

    def _next_chunk(self, reader: _Reader) -> Chunk | None:
        """The written chunk after the reader's, or holding its next offset; ``None`` at the end."""
        if reader.next_offset >= self.committed:
            return None
        if reader.chunk is not None:
            chunk = self.log.next_chunk(reader.chunk)
        else:
            chunk = self.log.locate(reader.next_offset)
        if chunk is None or chunk.first_offset >= self.committed:
            return None
        return chunk

    def _entries(self, chunk: Chunk, skip_below: int) -> list[Entry]:
        """The chunk's messages as entries to deliver, each with its offset in its header."""
        entries = []
        decoded: dict[bytes, tuple[str, str]] = {}  # names: the exchange and routing key
        arounds: dict[bytes, tuple[bytes, bytes] | None] = {}  # header: see around_offset
        pack = _OFFSET_VALUE.pack
        messages = self.log.read_messages(chunk)
        first = max(0, skip_below - chunk.first_offset)
        for offset, message in enumerate(messages[first:], chunk.first_offset + first):
            if message is None:  # in a compressed sub-entry batch: the stream protocol's clients read it
                continue
            names, header, body = message
            if not header:  # published over the stream protocol: its AMQP 0-9-1 form
                names, header, body = delivered_as_amqp091(body, self.name)
            strings = decoded.get(names)
            if strings is None:
                strings = decoded[names] = split_names(names)
            entry = Entry(Message(strings[0], strings[1], names, header, body), self)
            entry.seq = offset
            if header in arounds:
                around = arounds[header]
            else:
                around = arounds[header] = around_offset(header)
            entry.header = with_offset(header, offset) if around is None else around[0] + pack(offset) + around[1]
            entries.append(entry)
        return entries

    # -- what deliveries come back as -----------------------------------------------------------

    def track_delivery(self, entry: Entry, deadline: float, timeout: float) -> None:
        """A stream takes nothing back: its deliveries have no visibility timeout."""

    def observe_latency(self, entry: Entry) -> None:
        """Deliveries are not sampled for latency on a stream (:attr:`latency_samples` stays empty)."""

    def settle(self, entries: Iterable[Entry]) -> None:
        """Acked: nothing leaves a stream (the credit came back with the ack). A subscription's
        stored offset moves past what its consumer has acknowledged without a gap."""
        for entry in entries:
            reader = self._readers.get(entry.consumer)  # type: ignore[arg-type]
            if reader is None or reader.name is None:
                continue
            unacked = reader.unacked
            if unacked and unacked[0] == entry.seq:
                unacked.popleft()
                while unacked and unacked[0] in reader.acked:
                    reader.acked.discard(unacked.popleft())
            else:
                reader.acked.add(entry.seq)
            stored = unacked[0] if unacked else reader.next_offset
            name = reader.name
            if not reader.group or self._holders.get(name) is entry.consumer:
                self.store_offset(name, stored)
            if reader.group and not reader.active and not unacked:
                self._rebalance(name)  # it has finished: the next member reads on

    def reset(self, name: str, spec: OffsetSpec) -> int:
        """Move subscription ``name`` to where ``spec`` says (``first``, ``last``, ``next``, an
        offset, a timestamp); its consumers start again from there. Returns the offset."""
        probe = _Reader(spec, None, False)
        self._start(probe)
        self.store_offset(name, probe.next_offset if spec.kind != "offset" else probe.skip_below)
        for reader in self._readers.values():
            if reader.name == name and reader.active:
                self._start(reader)
        self.dispatch()
        return self.subscriptions[name]

    def subscription_view(self) -> list[dict[str, Any]]:
        """Each subscription: its stored offset (where it reads on from), its lag, how many
        consumers it has now and, for a group, the tag of the member reading."""
        consumers: dict[str, int] = {}
        for reader in self._readers.values():
            if reader.name is not None:
                consumers[reader.name] = consumers.get(reader.name, 0) + 1
        names = sorted(
            name for name in set(self.subscriptions) | set(consumers) if not name.startswith(PUBLISHER_PREFIX)
        )
        return [
            {
                "name": name,
                "offset": self.subscriptions.get(name),
                "lag": self.lag(name),
                "consumers": consumers.get(name, 0),
                "active": holder.tag if (holder := self._holders.get(name)) is not None else None,
            }
            for name in names
        ]

    def lag(self, name: str) -> int:
        """Messages held past subscription ``name``'s stored offset."""
        stored = self.subscriptions.get(name, self.log.first_offset)
        return max(0, self.committed - max(stored, self.log.first_offset))

    def return_entries(self, entries: Iterable[Entry]) -> None:
        """Unacknowledged when their channel closed: nothing goes back (readers go on)."""
        self.dispatch()

    def reject(self, entries: Iterable[Entry]) -> None:
        """Nothing leaves a stream (``basic.nack`` and ``basic.reject`` are refused before)."""

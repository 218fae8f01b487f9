"""The broker's side of the write-ahead log: what to record, and when confirms may go out.

The model (virtual hosts, queues, channels) tells the :class:`Journal` about durable changes:
topology of durable exchanges, queues and bindings; persistent messages entering durable
queues; their removal (ack, reject, expiry, overflow, purge); returns that change a delivery
count. The journal encodes each as a log record into a pending buffer and moves its
*position* (bytes encoded so far) forward. The shell hands the pending bytes to a writer
thread, which appends and fsyncs them (one fsync for everything pending: a group commit),
then reports the position that is now durable with :meth:`Journal.synced_to`. Channels
waiting to confirm publishes up to that position are released then, never before.

Messages get ids 1, 2, 3 ... (continuing after recovery); a message routed to several
durable queues is one ``Published`` record naming them all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

from postroom.broker.core.entry_spool import IN_LOG, SpoolRecord
from postroom.broker.core.ledger import SegmentLedger
from postroom.broker.core.resident import ResidentBodies
from postroom.broker.wal.codec import encode, encode_published
from postroom.broker.wal.records import (
    Bound,
    Defined,
    DeliveryCounted,
    ExchangeDeclared,
    ExchangeDeleted,
    PolicyCleared,
    PolicySet,
    QueueDeclared,
    QueueDeleted,
    Removed,
    StreamOffset,
    Unbound,
    Undefined,
)
from postroom.broker.wire.codec import encode_table

if TYPE_CHECKING:
    from postroom.broker.core.entry import Entry, Queue
    from postroom.broker.core.message import Message
    from postroom.broker.core.policy import Policy
    from postroom.broker.wal.streamlog import Staged, StreamLog

#: Ids gathered into one ``Removed`` record at most.
REMOVAL_IDS = 4096

#: A :class:`SpoolRecord`'s log segment.
_SEGMENT = itemgetter(2)


class ConfirmWaiter(Protocol):
    """A channel with publisher confirms waiting for the log."""

    def release_confirms(self, position: int) -> None:
        """Confirm every publish whose records are at or before ``position``."""

    def refuse_confirms(self, position: int) -> None:
        """Nack every waiting publish whose records are at or before ``position`` (the write failed)."""


class StagedStream(Hashable, Protocol):
    """A stream whose messages wait for the log's writer (``broker.core.stream.StreamQueue``),
    as the journal and the writer see it."""

    name: str
    deleted: bool
    #: Its own log of chunks, which the writer appends to.
    log: StreamLog

    def stage(self) -> tuple[list[Staged], list[int]]:
        """Its waiting messages as chunks to write, and the segments its retention dropped."""
        ...

    def written(self, staged: Iterable[Staged]) -> None:
        """``staged`` chunks are written: their messages are readable."""


class _Durable:
    """Calls ``callback(True)`` once the log is durable up to ``position``, or
    ``callback(False)`` if writing that far failed (see :meth:`Journal.when_durable`)."""

    def __init__(self, journal: Journal, position: int, callback: Callable[[bool], None]) -> None:
        self.journal, self.position, self.callback = journal, position, callback

    def release_confirms(self, position: int) -> None:
        if position >= self.position:
            self._done(True)

    def refuse_confirms(self, position: int) -> None:
        if position >= self.position:
            self._done(False)

    def _done(self, durable: bool) -> None:
        self.journal.waiters.pop(self, None)
        self.callback(durable)


def policy_record(vhost: str, policy: Policy, operator: bool) -> PolicySet:
    """The record of ``policy`` set in ``vhost`` (an operator policy with ``operator``)."""
    value = json.dumps(policy.value(), separators=(",", ":"), ensure_ascii=False)
    return PolicySet(vhost, policy.name, operator, value.encode("utf-8", "surrogateescape"))


def arguments_table(arguments: Mapping[str, Any]) -> bytes:
    """Declaration or binding ``arguments`` as a record holds them (an encoded table)."""
    return encode_table(dict(arguments)) if arguments else b""


class Journal:
    """Pending log records, message ids, and the encoded/durable positions; with the segment
    ledger (:attr:`ledger`) and the resident bodies (:attr:`bodies`) it keeps up to date.

    :param next_message_id: the first id to hand out (after recovery: the largest seen + 1)
    """

    def __init__(self, next_message_id: int = 1, clock: Callable[[], float] | None = None) -> None:
        self._pending: list[bytes] = []
        #: Messages recorded in the pending data, with where their record ends in it.
        self._pending_messages: list[tuple[Message, int, int]] = []
        #: Bytes waiting in :meth:`take` (:attr:`pending_bytes` with the open removal).
        self._pending_bytes = 0
        #: Streams with messages waiting for the next write (an ordered set), and their bytes.
        self._streams: dict[StagedStream, None] = {}
        self._stream_bytes = 0
        #: Directories of streams deleted, to remove after the next write.
        self._stream_deletions: list[str] = []
        #: Segments retention dropped in a write that failed, to remove with the next.
        self._stream_dropped: dict[StagedStream, list[int]] = {}
        #: Subscriptions' offsets stored since the last write, by (vhost, stream, name): one
        #: record each per write, however many acks moved them.
        self._offsets: dict[tuple[str, str, str], int] = {}
        #: The removal being gathered: ``(vhost, queue)`` and the ids acked since, encoded as one
        #: ``Removed`` record when another record comes, or when anything reads the position or
        #: what is pending (a consumer's acks one at a time cost one record per write).
        self._removing: tuple[str, str] | None = None
        self._removing_ids: list[int] = []
        #: Which log segments hold live messages (``broker.core.ledger``).
        self.ledger = SegmentLedger()
        #: Logged messages whose bodies are in memory (``broker.core.resident``).
        self.bodies = ResidentBodies()
        #: Messages copied forward out of sparse segments so far.
        self.rewritten = 0
        self._next_id = next_message_id
        self._clock = clock or (lambda: 0.0)
        #: Bytes encoded so far (:attr:`position` with the open removal).
        self._position = 0
        #: Position the writer has made durable (or written, with ``fsync: never``).
        self.synced = 0
        #: Called when records become pending and none were before (the shell schedules a write).
        self.on_pending: Callable[[], None] | None = None
        #: Channels with confirms waiting for :attr:`synced` to move, in the order they began
        #: to wait (so confirms go out in the order their publishes came).
        self.waiters: dict[ConfirmWaiter, None] = {}
        #: While recovering, nothing is recorded (the records are already in the log).
        self.replaying = False
        #: Pending bytes past which :attr:`on_backlog` is called (publishes are then paused).
        self.max_backlog = 1 << 62
        #: Called when :attr:`backlog_bytes` passes :attr:`max_backlog` (the shell pauses publishers).
        self.on_backlog: Callable[[], None] | None = None

    @property
    def next_message_id(self) -> int:
        """The id the next message recorded gets."""
        return self._next_id

    # -- recording ------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Bytes encoded so far: a publish is durable once :attr:`synced` reaches its position."""
        if self._removing is not None:
            self._close_removal()
        return self._position

    @property
    def recorded(self) -> int:
        """What :attr:`position` counts, an open removal left open: a publish that moved it
        recorded something (a persistent message, a stream's message) that its confirm waits for."""
        return self._position

    @property
    def pending_bytes(self) -> int:
        """Bytes of records waiting for :meth:`take`."""
        if self._removing is not None:
            self._close_removal()
        return self._pending_bytes

    @property
    def backlog_bytes(self) -> int:
        """Bytes waiting for the writer: records, and the bodies of stream messages."""
        return self.pending_bytes + self._stream_bytes

    def _close_removal(self) -> None:
        (vhost, queue), ids = self._removing, self._removing_ids  # type: ignore[misc]
        self._removing, self._removing_ids = None, []
        self._add(encode(Removed(vhost, queue, tuple(ids))))

    def _add(self, data: bytes) -> None:
        if self.replaying:
            return
        if self._removing is not None:
            self._close_removal()
        first = not self._pending
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._position += len(data)
        if first and self.on_pending is not None:
            self.on_pending()
        if self._pending_bytes + self._stream_bytes > self.max_backlog and self.on_backlog is not None:
            self.on_backlog()

    def stream_published(self, stream: StagedStream, size: int, count: int = 1) -> None:
        """``count`` messages of ``size`` body bytes in all wait for ``stream``'s next chunk:
        they are written with the next write, and their confirms wait for :attr:`position`
        as it is now."""
        if self.replaying:
            return
        if self._removing is not None:
            self._close_removal()
        streams = self._streams
        first = not streams and not self.has_pending  # (a stream waiting: something is pending)
        streams[stream] = None
        self._position += size + count
        self._stream_bytes += size
        if first and self.on_pending is not None:
            self.on_pending()
        if self._pending_bytes + self._stream_bytes > self.max_backlog and self.on_backlog is not None:
            self.on_backlog()

    def stream_retry(self, stream: StagedStream, dropped: list[int]) -> None:
        """A write of ``stream``'s chunks failed: write them (and remove the segments retention
        ``dropped``) with the next write."""
        self._streams[stream] = None
        self._stream_dropped.setdefault(stream, []).extend(dropped)

    def stream_deleted(self, path: str) -> None:
        """A stream was deleted: the writer removes its directory, ``path``, after what it writes next."""
        first = not self.has_pending
        self._stream_deletions.append(path)
        if first and self.on_pending is not None:
            self.on_pending()

    def stream_offset(self, vhost: str, stream: str, name: str, offset: int) -> None:
        """Subscription ``name`` of ``stream`` reads on from ``offset``: recorded with the next
        write (a later offset of the same subscription before then replaces it)."""
        if self.replaying:
            return
        first = not self.has_pending
        self._offsets[(vhost, stream, name)] = offset
        if first and self.on_pending is not None:
            self.on_pending()

    def take_stream_deletions(self) -> list[str]:
        """The directories of streams deleted since the last write."""
        deletions, self._stream_deletions = self._stream_deletions, []
        return deletions

    def take_streams(self) -> list[tuple[StagedStream, list[Staged], list[int]]]:
        """What the next write does for streams: for each with messages waiting, its chunks to
        write (those staged now, after any staged before and not written: a failed write) and
        the segments its retention dropped (their files go once the chunks are written)."""
        streams, self._streams = self._streams, {}
        self._stream_bytes = 0
        retried, self._stream_dropped = self._stream_dropped, {}
        taken = []
        for stream in streams:
            if not stream.deleted:
                staged, dropped = stream.stage()
                taken.append((stream, staged, retried.get(stream, []) + dropped))
        return taken

    def published(self, message: Message, vhost: str, queues: Iterable[str]) -> int:
        """Record a persistent message entering durable ``queues``; return its id."""
        if message.wal_id:
            message_id = message.wal_id
        else:
            message_id = message.wal_id = self._next_id
            self._next_id += 1
        queues = tuple(queues)
        message.wal_vhost = vhost
        message.wal_queues += queues
        record = self._published_record(message, queues)
        self._add(record)
        self._pending_messages.append((message, self._pending_bytes, len(record)))
        return message_id

    def _published_record(self, message: Message, queues: tuple[str, ...]) -> bytes:
        return encode_published(
            message.wal_id,
            message.wal_vhost,
            queues,
            message.exchange,
            message.routing_key,
            self._clock(),
            message.header,
            message.body,
        )

    def removed(self, queue: Queue, entries: Iterable[Entry]) -> None:
        """Record that entries of journaled messages left ``queue`` for good."""
        ids = []
        for entry in entries:
            message = entry.message
            if message.wal_id:
                ids.append(message.wal_id)
                self._release(message, queue.name)
        if ids and not self.replaying:
            key = (queue.vhost_name, queue.name)
            if self._removing == key:
                self._removing_ids += ids
                if len(self._removing_ids) >= REMOVAL_IDS:
                    self._close_removal()
            else:
                if self._removing is not None:
                    self._close_removal()
                first = not self._pending
                self._removing, self._removing_ids = key, ids
                if first and self.on_pending is not None:
                    self.on_pending()  # the shell schedules a write, which closes it

    def refused(self, queue: Queue, message: Message) -> None:
        """Record that ``queue`` refused a message already recorded as entering it (it was full)."""
        if message.wal_id:
            self._release(message, queue.name)
            self._add(encode(Removed(queue.vhost_name, queue.name, (message.wal_id,))))

    def forget(self, entries: Iterable[Entry]) -> None:
        """Entries left a deleted queue: no record is needed (``QueueDeleted`` says it), only accounting."""
        for entry in entries:
            if entry.message.wal_id:
                self._release(entry.message, entry.queue.name)

    def _release(self, message: Message, queue: str) -> None:
        try:
            message.wal_queues.remove(queue)
        except ValueError:
            return
        if not message.wal_queues:
            if message.wal_counted:
                self.bodies.uncount(message)
            elif not message.resident and message.wal_location is not None:
                self.ledger.pin(message)
        segment = message.wal_segment
        if segment:
            self.ledger.release(message, segment)

    def rewrite(self, segment: int) -> int:
        """Record again every message still live in ``segment`` (with its delivery counts), so the
        segment can be retired once the copies are written. Returns how many were copied.

        Recovery keeps each queue's messages in id order, so the copies do not reorder queues.
        """
        messages = self.ledger.take_for_rewrite(segment)
        for message in messages:
            record = self._published_record(message, tuple(message.wal_queues))
            self._add(record)
            self._pending_messages.append((message, self._pending_bytes, len(record)))
            for queue, count in (message.wal_counts or {}).items():
                self._add(encode(DeliveryCounted(message.wal_vhost, queue, message.wal_id, count)))
        self.rewritten += len(messages)
        return len(messages)

    def delivery_counted(self, queue: Queue, entry: Entry) -> None:
        """Record a return that raised an entry's delivery count."""
        message = entry.message
        if message.wal_id:
            if message.wal_counts is None:
                message.wal_counts = {}
            message.wal_counts[queue.name] = entry.delivery_count
            self._add(encode(DeliveryCounted(queue.vhost_name, queue.name, entry.message.wal_id, entry.delivery_count)))

    def exchange_declared(
        self,
        vhost: str,
        name: str,
        type_name: str,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
    ) -> None:
        """Record a new durable exchange."""
        self._add(
            encode(ExchangeDeclared(vhost, name, type_name, True, auto_delete, internal, arguments_table(arguments)))
        )

    def exchange_deleted(self, vhost: str, name: str) -> None:
        """Record the deletion of a durable exchange (its bindings go with it)."""
        self._add(encode(ExchangeDeleted(vhost, name)))

    def queue_declared(self, vhost: str, name: str, auto_delete: bool, arguments: Mapping[str, Any]) -> None:
        """Record a new durable queue."""
        self._add(encode(QueueDeclared(vhost, name, True, auto_delete, arguments_table(arguments))))

    def queue_deleted(self, vhost: str, name: str) -> None:
        """Record the deletion of a durable queue (its messages and bindings go with it, and a
        stream's subscriptions: offsets stored since the last write are not written after it)."""
        if self._offsets:
            self._offsets = {key: offset for key, offset in self._offsets.items() if key[:2] != (vhost, name)}
        self._add(encode(QueueDeleted(vhost, name)))

    def bound(
        self, vhost: str, source: str, destination: str, to_queue: bool, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        """Record a binding between durable ends."""
        self._add(encode(Bound(vhost, source, destination, to_queue, routing_key, arguments_table(arguments))))

    def unbound(
        self, vhost: str, source: str, destination: str, to_queue: bool, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        """Record the removal of a binding between durable ends."""
        self._add(encode(Unbound(vhost, source, destination, to_queue, routing_key, arguments_table(arguments))))

    def policy_set(self, vhost: str, policy: Policy, operator: bool) -> None:
        """Record a policy (an operator policy with ``operator``) set or replaced."""
        self._add(encode(policy_record(vhost, policy, operator)))

    def policy_cleared(self, vhost: str, name: str, operator: bool) -> None:
        """Record a policy cleared."""
        self._add(encode(PolicyCleared(vhost, name, operator)))

    def defined(self, kind: str, key: str, value: bytes | None) -> None:
        """Record a definition of the node set (a user, a vhost: see ``broker.core.admin``),
        or deleted with ``value`` ``None``."""
        self._add(encode(Defined(kind, key, value) if value is not None else Undefined(kind, key)))

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(True)`` once everything recorded so far is durable (at once if it
        is already), or ``callback(False)`` if writing it failed."""
        if self.synced >= self.position:
            callback(True)
            return
        self.waiters[_Durable(self, self.position, callback)] = None

    # -- the writer's side ----------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        """Whether records (or stream messages) wait to be written."""
        return (
            bool(self._pending)
            or self._removing is not None
            or bool(self._streams or self._stream_deletions or self._offsets)
        )

    def take(
        self, segment: int = 0, base: int = 0, read: Callable[[int, int, int], bytes] | None = None
    ) -> tuple[bytes, int]:
        """Everything pending, and the position it reaches once written.

        :param segment: the log segment the data will be appended to; messages recorded in it
            count as live there until every queue holding them has let them go
        :param base: the offset in that segment where the data will start
        :param read: reads bytes back from a segment; given, the bodies written here may be
            paged out later (:meth:`page_out`)
        """
        if self._removing is not None:
            self._close_removal()
        if self._offsets:
            offsets, self._offsets = self._offsets, {}
            for (vhost, stream, name), offset in offsets.items():
                record = encode(StreamOffset(vhost, stream, name, offset))
                self._pending.append(record)
                self._position += len(record)
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        place = self.ledger.place
        bodies = self.bodies
        for message, end, length in self._pending_messages:
            place(message, segment, len(message.wal_queues))
            message.wal_start = base + end - length
            if read is not None and message.wal_queues:
                # The body is the last field of the Published record that ends at ``end``.
                message.wal_location = (read, segment, base + end - message.size)
                if not message.wal_counted and message.resident:
                    bodies.add(message)
        self._pending_messages.clear()
        bodies.drop_gone()
        return data, self._position

    def restored(
        self,
        message: Message,
        segment: int,
        vhost: str,
        queue: str,
        delivery_count: int,
        location: tuple[Callable[[int, int, int], bytes], int] | None = None,
    ) -> None:
        """A message rebuilt from the log at start is held by one more queue.

        :param location: ``(read, end offset of its record)``, so its body can be paged out again
        """
        message.wal_vhost = vhost
        message.wal_queues.append(queue)
        if location is not None and message.wal_location is None and location[1]:
            read, end = location
            message.wal_location = (read, segment, end - message.size)
            self.bodies.add(message)
        if delivery_count:
            if message.wal_counts is None:
                message.wal_counts = {}
            message.wal_counts[queue] = delivery_count
        self.ledger.place(message, segment, 1)

    # -- spooled messages (``broker.core.entry_spool``) -----------------------------------------------

    def spooled(self, messages: Iterable[Message], queue: str) -> None:
        """``queue`` holds ``messages`` as spool records now, not as objects; each record points
        at its ``Published`` record, so the reference to that segment stays live."""
        ledger = self.ledger
        refs = ledger.spooled_refs
        by_segment = ledger.holders
        stale = 0
        for message in messages:
            queues = message.wal_queues
            try:
                queues.remove(queue)
            except ValueError:
                continue
            segment = message.wal_segment
            refs[segment] += 1
            if message.wal_counts is not None:
                message.wal_counts.pop(queue, None)
            if not queues:
                if message.wal_counted:
                    self.bodies.uncount(message)
                    stale += 1
                holders = by_segment.get(segment)
                if holders is not None:
                    holders.discard(message)
        if stale:
            self.bodies.note_stale(stale)

    def unspooled_all(self, messages: list[Message], records: list[SpoolRecord], vhost: str, queue: str) -> None:
        """Spool records of ``queue`` were read back as ``messages`` (their ``wal_location``
        set): they are held as objects again, counted in :attr:`resident_bytes`."""
        by_segment = self.ledger.holders
        size = 0
        last = -1
        holders: set[Message] = set()
        for message, record in zip(messages, records, strict=True):
            segment = record[2]  # SpoolRecord.segment
            message.wal_vhost = vhost
            message.wal_queues.append(queue)
            message.wal_segment = segment
            message.wal_counted = True
            size += message.size
            if record[5]:  # SpoolRecord.delivery_count
                message.wal_counts = {queue: record[5]}
            if segment != last:  # (records read back at once mostly point into one segment)
                last = segment
                holders = by_segment.get(segment)  # type: ignore[assignment]
                if holders is None:
                    holders = by_segment[segment] = set()
            holders.add(message)
        self.bodies.add_all(messages, size)
        unspool = self.ledger.unspool
        for segment, count in Counter(map(_SEGMENT, records)).items():
            unspool(segment, count)

    def spool_removed(self, queue: Queue, records: Iterable[SpoolRecord]) -> None:
        """Spool records of ``queue`` left it for good (a purge), or with it (``queue.deleted``:
        ``QueueDeleted`` says so, no record is needed)."""
        records = [record for record in records if record.flags & IN_LOG]
        self.ledger.spool_dropped(records)
        if records and not queue.deleted:
            self._add(encode(Removed(queue.vhost_name, queue.name, tuple(record.message_id for record in records))))

    def synced_to(self, position: int) -> None:
        """The log is durable up to ``position``: release the confirms waiting for it."""
        self.synced = max(self.synced, position)
        for waiter in list(self.waiters):
            waiter.release_confirms(self.synced)

    def failed(self, position: int) -> None:
        """Writing up to ``position`` failed: refuse the confirms waiting for it."""
        for waiter in list(self.waiters):
            waiter.refuse_confirms(position)

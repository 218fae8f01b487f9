"""A deep queue's tail out of memory: its messages as fixed-size records on disk.

A queue keeps its next messages to deliver in memory (its *window*: :class:`~broker.core.queue.Entry`
objects). Once the window is full, what arrives behind it goes to the queue's :class:`Spool`:

* first into :attr:`Spool.waiting` (entries still, in arrival order), because a persistent
  message's content becomes readable from the write-ahead log only once the log is written
  past its record;
* then, in batches, each becomes a :data:`RECORD_BYTES`-byte record (:class:`SpoolRecord`) in
  the queue's spool storage: where its content is (its ``Published`` record in the log, or for
  any other message a copy in the page store), its size, delivery count and expiry. The
  message object itself is dropped: a spooled message costs no memory.

As the window empties, :meth:`Spool.take` gives back the oldest messages (as many as the
window has room for, in messages and in body bytes): records read back and loaded (content
read, CRC checked, decoded) into new entries, then waiting entries as they are. Order is
kept: records are older than anything waiting, and nothing is spooled while the spool is
empty and the window has room.

The content is read and written by a :class:`SpoolLocator` (the shell's: the log's and the page
store's files); the records go to a :class:`SpoolStorage` (a file per queue, or memory in tests).
Nothing here does I/O itself.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import struct
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from postroom.broker.core.entry import Entry
    from postroom.broker.core.message import Message

__all__ = [
    "IN_LOG",
    "RECORD_BYTES",
    "REDELIVERED",
    "MemorySpoolStorage",
    "Spool",
    "SpoolLocator",
    "SpoolRecord",
    "SpoolStorage",
    "pack_record",
    "unpack_records",
]

#: :class:`SpoolRecord`'s fields: message id, content offset, content segment, content length,
#: body size, delivery count, flags, expiry (seconds since the epoch; 0: none). Little-endian.
_RECORD = struct.Struct("<QQIIIIId")
RECORD_BYTES = _RECORD.size
#: Packs a record's fields (a :class:`SpoolRecord`, or a plain tuple of its fields).
pack_record = _RECORD.pack

#: The content is the message's ``Published`` record in the write-ahead log (else: a copy in
#: the page store).
IN_LOG = 1
#: The message was delivered before (recovered from the log after a restart).
REDELIVERED = 2

#: Records gathered before they are appended to storage (one write per this many), and read
#: back at once.
BATCH = 1024

#: Body bytes of waiting entries past which they are recorded without waiting for a full batch.
BATCH_BYTES = 4 << 20

#: Most entries recorded at once (what waited in memory is recorded this many at a time).
RECORD_MAX = 8 * BATCH


class SpoolRecord(NamedTuple):
    """One spooled message: where its content is, and its state in the queue (fields in their
    on-disk order)."""

    message_id: int
    offset: int
    segment: int
    length: int
    size: int
    delivery_count: int = 0
    flags: int = 0
    expires_at: float = 0.0

    def pack(self) -> bytes:
        return _RECORD.pack(*self)


#: Makes a :class:`SpoolRecord` of a tuple of its fields, without checking their number
#: (``SpoolRecord._make`` without its cost: records are read back by the thousand).
_make_record: Callable[[tuple[Any, ...]], SpoolRecord] = functools.partial(tuple.__new__, SpoolRecord)


#: A record's body size.
_body_size = operator.itemgetter(4)

#: Where a packed record's flags start (their low byte holds :data:`IN_LOG` and :data:`REDELIVERED`).
_FLAGS_AT = struct.calcsize("<QQIIII")
#: Byte translations of that low byte: to its :data:`IN_LOG` bit; with :data:`REDELIVERED` set.
_IN_LOG_BIT = bytes(value & IN_LOG for value in range(256))
_WITH_REDELIVERED = bytes(value | REDELIVERED for value in range(256))


def unpack_records(data: bytes | bytearray) -> list[SpoolRecord]:
    """The records packed in ``data`` (a whole number of them)."""
    return list(map(_make_record, _RECORD.iter_unpack(data)))


class SpoolStorage(Protocol):
    """Where one queue's records go: an append-only byte stream read from the front."""

    def append(self, data: bytes) -> None:
        """Append ``data`` at the end.

        :raises OSError: it could not be written (nothing of it counts as written)
        """

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (counted from the first byte ever appended)."""

    def release(self, offset: int) -> None:
        """Nothing before ``offset`` will be read again: its space may be freed."""

    def close(self) -> None:
        """The spool is gone: free everything."""


class SpoolLocator(Protocol):
    """Reads and writes spooled messages' content (the shell's: the log and the page store)."""

    def locatable(self, entry: Entry) -> bool:
        """Whether ``entry``'s content can be recorded now (not while its log record is being
        copied forward)."""

    def locate(self, entries: list[Entry]) -> list[SpoolRecord]:
        """Records for ``entries``, in order (:class:`SpoolRecord` or plain tuples of its
        fields); those whose content is not in the log are copied to the page store first
        (one write for all).

        :raises OSError: the page store could not be written (no entry has been spooled)
        """

    def load(self, records: list[SpoolRecord]) -> list[Message]:
        """The messages ``records`` point at, read back and decoded, in order.

        :raises OSError: the content could not be read, or is damaged
        """

    def released(self, records: list[SpoolRecord]) -> None:
        """These records' content will not be read again (they were loaded or purged)."""

    def dropped(self, records: list[SpoolRecord]) -> None:
        """These records (adopted from a checkpoint) were removed since: they are not loaded."""


class Spool:
    """One queue's spooled messages, oldest first (see the module).

    :param storage: where the records go
    :param locator: reads and writes the messages' content
    :param synced: the log position written so far (the journal's), or ``None`` without a log
    :param on_error: called when a batch cannot be recorded, once until one can again (what
        was not recorded stays in memory and is tried again with the next batch)
    """

    def __init__(
        self,
        storage: SpoolStorage,
        locator: SpoolLocator,
        synced: Callable[[], int] | None = None,
        on_error: Callable[[OSError], None] | None = None,
    ) -> None:
        self.storage = storage
        self.locator = locator
        self._synced = synced
        self._on_error = on_error
        #: Entries not yet recorded, oldest first, with the log position their record ends at
        #: (0: nothing to wait for).
        self.waiting: deque[tuple[Entry, int]] = deque()
        self._written = 0  # bytes appended to storage
        self._read = 0  # bytes of storage taken back
        self._buffer: list[bytes] = []  # packed records not yet appended
        self._readahead: deque[SpoolRecord] = deque()
        self._adopted = 0  # bytes of storage adopted from a checkpoint
        self._removed: set[int] = set()  # ids among them removed since (see adopt)
        self._counts: dict[int, int] = {}
        self._waiting_bytes = 0
        #: Messages spooled (waiting or recorded) and their body bytes.
        self.count = 0
        self.bytes = 0
        #: Recorded messages whose content is a copy in the page store (not in the log), and
        #: their body bytes.
        self.copies = self.copy_bytes = 0
        #: Recorded messages whose content is in the log, by log segment.
        self.refs: Counter[int] = Counter()
        #: Why the last batch could not be recorded (``None``: it was).
        self.error: OSError | None = None
        #: Waiting entries, and their body bytes, at which the next batch is recorded.
        self._try_at, self._try_bytes = BATCH, BATCH_BYTES
        #: Whether what waits is recorded as batches gather (see :meth:`hold`).
        self.recording = True
        #: Whether the last :meth:`record` stopped at :data:`RECORD_MAX` with more ready.
        self._backlog = False

    @property
    def recorded_count(self) -> int:
        """Messages held as records (in storage, the buffer or read ahead)."""
        return self.count - len(self.waiting)

    @property
    def waiting_bytes(self) -> int:
        """Body bytes of the waiting entries (they are in memory)."""
        return self._waiting_bytes

    def hold(self) -> None:
        """Keep what arrives in memory, as waiting entries, until :meth:`resume` (memory is not
        short): only the records already written are read back from storage."""
        self.recording = False

    def record_batch(self) -> None:
        """Record a batch of what waits now, if a batch's worth does."""
        if len(self.waiting) >= BATCH:
            self._attempt(self.record)

    def resume(self) -> None:
        """Record what waits (a batch now, the rest a batch at a time), and what arrives from now
        on, as batches gather."""
        self.recording = True
        if self.waiting:
            self._attempt(self.record)

    def push(self, entry: Entry, position: int = 0) -> None:
        """Spool ``entry`` behind everything else; ``position``: where its log record ends
        (its content is readable once the log is written that far)."""
        self.waiting.append((entry, position))
        self.count += 1
        size = entry.message.size
        self.bytes += size
        self._waiting_bytes += size
        if (len(self.waiting) >= self._try_at or self._waiting_bytes >= self._try_bytes) and self.recording:
            self._attempt(self.record)

    def push_record(self, record: SpoolRecord) -> None:
        """Spool a message already recorded (recovered from the log) behind everything else.

        :raises RuntimeError: entries are waiting (they would be overtaken)
        """
        if self.waiting:
            raise RuntimeError("a record cannot overtake waiting entries")
        self._buffer.append(_RECORD.pack(*record))
        if record[6] & IN_LOG:
            self.refs[record[2]] += 1
        else:
            self._count((record,), 1)
        self.count += 1
        self.bytes += record.size
        if len(self._buffer) >= BATCH:
            self._attempt(self._flush)

    def _attempt(self, write: Callable[[], object]) -> None:
        """Run ``write``; on an error what it had not written stays waiting or buffered, and the
        next batch tries again."""
        try:
            write()
        except OSError as error:
            if self.error is None and self._on_error is not None:
                self._on_error(error)
            self.error = error
            # Not again at every push: once another batch has gathered.
            self._try_at = len(self.waiting) + BATCH
            self._try_bytes = self._waiting_bytes + BATCH_BYTES
        else:
            self.error = None
            if self._backlog:
                # More is ready than one call records (held in memory until now): the next
                # batch once another has gathered, so the backlog goes between other work.
                self._try_at = len(self.waiting) + BATCH
                self._try_bytes = self._waiting_bytes + BATCH_BYTES
            else:
                self._try_at, self._try_bytes = BATCH, BATCH_BYTES

    def record(self) -> int:
        """Turn the oldest waiting entries whose content is readable, :data:`RECORD_MAX` at
        most, into records; returns how many.

        :raises OSError: writing their content or records failed; they stay waiting
        """
        waiting = self.waiting
        synced = self._synced() if self._synced is not None else 0
        entries: list[Entry] = []
        locatable = self.locator.locatable
        for entry, position in waiting:
            if position > synced or not locatable(entry) or len(entries) == RECORD_MAX:
                break
            entries.append(entry)
        self._backlog = len(entries) == RECORD_MAX
        if not entries:
            return 0
        records = self.locator.locate(entries)
        pack = _RECORD.pack
        self._buffer += [pack(*record) for record in records]
        self._count(records, 1)
        for _ in range(len(entries)):
            waiting.popleft()
        self._waiting_bytes -= sum(entry.message.size for entry in entries)
        if len(self._buffer) >= BATCH:
            self._flush()
        return len(entries)

    def _flush(self) -> None:
        if self._buffer:
            data = b"".join(self._buffer)
            self.storage.append(data)
            self._buffer.clear()
            self._written += len(data)

    def _next_records(self, count: int) -> list[SpoolRecord]:
        """Up to ``count`` records, oldest first (all of them when ``count`` is every recorded
        one: adopted records removed since are read too, to be dropped)."""
        readahead = self._readahead
        everything = count >= self.recorded_count
        while (len(readahead) < count or everything) and self._read < self._written:
            length = min(self._written - self._read, max(count, BATCH) * RECORD_BYTES)
            data = self.storage.read(self._read, length)
            if len(data) != length:
                raise OSError(f"spool read cut short: {len(data)} of {length} bytes at {self._read}")
            if self._read < self._adopted:
                records = self._recovered(data, (self._adopted - self._read) // RECORD_BYTES)
            else:
                records = unpack_records(data)
            self._read += length
            readahead.extend(records)
            self.storage.release(self._read)
        if len(readahead) < count and self._buffer:
            readahead.extend(unpack_records(b"".join(self._buffer)))
            self._buffer.clear()
        return [readahead.popleft() for _ in range(min(count, len(readahead)))]

    def _recovered(self, data: bytes, adopted: int) -> list[SpoolRecord]:
        """The records in ``data``, whose first ``adopted`` came from a checkpoint: those marked
        redelivered, as recovery marks messages, with the delivery counts logged after it, and
        without those the log removed after it (they are dropped here), nor copies of messages
        that were not logged (their content went with the last run; they were never counted)."""
        removed, counts = self._removed, self._counts
        head = adopted * RECORD_BYTES
        if not removed and not counts:  # (the usual case: nothing changed since the checkpoint)
            packed = bytearray(data)
            flags = packed[_FLAGS_AT:head:RECORD_BYTES]  # (the low byte of each one's flags)
            if 0 not in flags.translate(_IN_LOG_BIT):  # every one is logged: marked in place
                packed[_FLAGS_AT:head:RECORD_BYTES] = flags.translate(_WITH_REDELIVERED)
                return unpack_records(packed)
        records = unpack_records(data)
        make = _make_record
        kept, dropped = [], []
        for record in records[:adopted]:
            if not record.flags & IN_LOG:
                continue
            message_id = record.message_id
            if message_id in removed:
                removed.discard(message_id)
                dropped.append(record)
                continue
            count = counts.pop(message_id, record[5]) if counts else record[5]
            kept.append(make((message_id, *record[1:5], count, record[6] | REDELIVERED, record[7])))
        if dropped:
            self.bytes -= sum(record.size for record in dropped)
            self._count(dropped, -1)
            self.locator.dropped(dropped)
        return kept + records[adopted:]

    def take(
        self, count: int, make: Callable[[Message, SpoolRecord], Entry], max_bytes: int | None = None
    ) -> list[Entry]:
        """Up to ``count`` of the oldest messages, as entries: records loaded with ``make``,
        then waiting entries (once no record is left: they come after).

        :param max_bytes: the most body bytes the records loaded may come to (the first one is
            loaded whatever its size; ``None``: no bound); waiting entries are in memory already
        :raises OSError: a record or its content could not be read (nothing was taken)
        """
        taken: list[Entry] = []
        recorded = self.recorded_count
        if recorded:
            records = self._next_records(count)
            if max_bytes is not None:
                records = self._within(records, max_bytes)
            recorded -= len(records)
            try:
                messages = self.locator.load(records)
            except OSError:
                self._readahead.extendleft(reversed(records))
                raise
            self.locator.released(records)
            self._count(records, -1)
            taken = [make(message, record) for message, record in zip(messages, records, strict=True)]
        while len(taken) < count and self.waiting and not recorded:
            entry = self.waiting.popleft()[0]
            self._waiting_bytes -= entry.message.size
            taken.append(entry)
        self.count -= len(taken)
        self.bytes -= sum([entry.message.size for entry in taken])
        return taken

    def _within(self, records: list[SpoolRecord], max_bytes: int) -> list[SpoolRecord]:
        """The first of ``records`` whose bodies come to ``max_bytes`` at most (one at least);
        the others go back to be read first next time."""
        ends = list(itertools.accumulate(map(_body_size, records)))
        if not ends or ends[-1] <= max_bytes:
            return records
        fit = max(bisect.bisect_right(ends, max_bytes), 1)
        self._readahead.extendleft(reversed(records[fit:]))
        return records[:fit]

    def drain_records(self) -> list[SpoolRecord]:
        """Every record, oldest first, taken out of the spool (a purge); waiting entries stay.

        :raises OSError: the records could not be read; they are taken out all the same (what
            they point at stays where it is until the next start)
        """
        try:
            records = self._next_records(self.recorded_count)
        except OSError:
            self._readahead.clear()
            self._buffer.clear()
            self._read = self._written
            self.count, self.bytes = len(self.waiting), self._waiting_bytes
            self.copies = self.copy_bytes = 0
            self.refs.clear()
            raise
        self.locator.released(records)
        self._count(records, -1)
        self.count -= len(records)
        self.bytes -= sum(record.size for record in records)
        return records

    def close(self) -> list[Entry]:
        """The queue is gone: free the storage; returns the entries still waiting."""
        entries = [entry for entry, _position in self.waiting]
        records = self._next_records(self.recorded_count)
        self.locator.released(records)
        self.waiting.clear()
        self.count = self.bytes = self._waiting_bytes = self.copies = self.copy_bytes = 0
        self.refs.clear()
        self.storage.close()
        return entries

    def _count(self, records: Sequence[SpoolRecord], sign: int) -> None:
        """Count ``records`` in (``sign`` 1) or out (-1) of :attr:`copies` and :attr:`refs`."""
        in_log = Counter([record[2] for record in records if record[6] & IN_LOG])
        logged = in_log.total()
        if logged != len(records):
            self.copies += sign * (len(records) - logged)
            self.copy_bytes += sign * sum(record[4] for record in records if not record[6] & IN_LOG)
        if sign > 0:
            self.refs.update(in_log)
        else:
            self.refs.subtract(in_log)

    @property
    def adopted_changes(self) -> tuple[set[int], dict[int, int]]:
        """Ids among the adopted records not read yet that were removed since, and their new
        delivery counts (see :meth:`adopt`): a checkpoint that links those records carries them."""
        return self._removed, self._counts

    def checkpoint_parts(self) -> tuple[list[SpoolRecord], tuple[int, int], list[SpoolRecord], list[Entry]]:
        """Everything spooled, oldest first, for a checkpoint, without changing anything: the
        records read ahead, the range ``(start, end)`` of storage not read yet, the records not
        appended yet, and the waiting entries."""
        buffered = unpack_records(b"".join(self._buffer))
        return list(self._readahead), (self._read, self._written), buffered, [entry for entry, _ in self.waiting]

    def adopt(
        self,
        length: int,
        count: int,
        size: int,
        refs: Mapping[int, int],
        removed: set[int] | None = None,
        counts: dict[int, int] | None = None,
    ) -> None:
        """``storage`` already holds ``length`` bytes of records (a checkpoint's) for ``count``
        messages of ``size`` body bytes, all in the log: take them as recorded. They were
        recovered, so they come back marked redelivered, as recovery marks them.

        :param refs: how many of them point into each log segment
        :param removed: ids among them that the log removed after the checkpoint: they are
            not counted, and are dropped when read (their body bytes count until then)
        :param counts: delivery counts the log recorded after the checkpoint, by id
        :raises RuntimeError: the spool is not empty
        """
        if self.count or self._written:
            raise RuntimeError("only an empty spool adopts records")
        self._written = self._adopted = length
        self._removed = removed or set()
        self._counts = counts or {}
        self.count = count - len(self._removed)
        self.bytes = size
        self.refs = Counter(refs)


class MemorySpoolStorage:
    """:class:`SpoolStorage` in memory (tests)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.base = 0  # offset of data[0]
        self.closed = False
        self.fail_appends = False

    def append(self, data: bytes) -> None:
        if self.fail_appends:
            raise OSError("no space left on device")
        self.data += data

    def read(self, offset: int, length: int) -> bytes:
        start = offset - self.base
        return bytes(self.data[start : start + length])

    def release(self, offset: int) -> None:
        del self.data[: offset - self.base]
        self.base = offset

    def close(self) -> None:
        self.closed = True
        self.data.clear()

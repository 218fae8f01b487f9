"""A queue's ready line: the messages waiting for a consumer, next to be delivered first.

The line is a window of :class:`~broker.core.entry.Entry` objects in memory and, once a deep
queue spools, a :class:`~broker.core.entry_spool.Spool` of records on disk behind it (what arrives
goes there, and the window is refilled from it as it empties). The window keeps enqueue order
(:attr:`Entry.seq`), so a returned message goes back to its place. Two marks tell the queue's
pager and spooler when to look: :attr:`ReadyLine.page_at` (ready bytes past which bodies may
go to disk, counted in :attr:`ReadyLine.paged_bytes`) and :attr:`ReadyLine.spool_at` (ready
entries past which what arrives is spooled).

Entries that expire where they stand stay in the window, counted in :attr:`ReadyLine.gone`,
and are skipped when they come up.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from postroom.broker.core.dead_lettering import with_delivery_count
from postroom.broker.core.entry import READY, Entry, Queue
from postroom.broker.core.entry_spool import REDELIVERED, Spool, SpoolRecord
from postroom.broker.core.message import Message
from postroom.broker.core.recording import QueueJournal
from postroom.broker.core.timers import EXPIRY, Deadlines

#: :attr:`ReadyLine.page_at` when no pager is to be asked: more bytes than any queue holds.
NEVER = 1 << 62

# What a queue was doing when its spool failed (:meth:`ReadyLine.spool_failed`).
WRITE = "spool messages"
READ_BACK = "read spooled messages back"


class LineOwner(Queue, Protocol):
    """The queue a ready line belongs to (``broker.core.queue.WorkQueue``), as the line uses it."""

    deadlines: Deadlines
    journal: QueueJournal | None

    def update_plain(self) -> None:
        """The spool came or went: say again which path enqueue takes."""


#: The kind of queue that owns a line, as its pager and spooler see it (they act on the queue).
Owner = TypeVar("Owner", bound=LineOwner)
_Owner_contra = TypeVar("_Owner_contra", bound=LineOwner, contravariant=True)


class BodyPager(Protocol[_Owner_contra]):
    """What keeps the messages of deep queues within the memory budget (``broker.storage.body_paging.Pager``)."""

    def watch(self, queue: _Owner_contra) -> None:
        """``queue`` holds more ready bytes than its :attr:`ReadyLine.page_at`: look at it soon."""

    def spool_now(self, queue: _Owner_contra) -> int:
        """``queue`` holds :attr:`ReadyLine.spool_at` ready messages: watch it, and say whether it
        is to spool what arrives now (0), or else at how many ready messages to ask again."""

    def spool_failed(self, queue: _Owner_contra, error: OSError, doing: str, then: str) -> None:
        """``queue``'s messages could not be spooled or read back: ``error`` while ``doing``,
        with the consequence ``then`` (the shell logs it)."""


class SpoolMaker(Protocol[_Owner_contra]):
    """What makes the spools of deep queues (``broker.storage.spool_files.Spooler``)."""

    #: Ready entries a queue keeps in memory before it spools what arrives.
    window: int
    #: Body bytes a queue's window is refilled to at most (large messages: fewer than :attr:`window`).
    window_bytes: int

    def spool(self, queue: _Owner_contra, storage: Any = None) -> Spool:
        """A new spool for ``queue``, on ``storage`` (a checkpoint's records) or on new storage."""
        ...


class _PriorityReady:
    """Ready entries of a priority queue: one FIFO per priority level, highest served first."""

    __slots__ = ("_levels", "_max", "_count")

    def __init__(self, max_priority: int) -> None:
        self._levels: list[deque[Entry]] = [deque() for _ in range(max_priority + 1)]
        self._max = max_priority
        self._count = 0

    def _level(self, entry: Entry) -> deque[Entry]:
        return self._levels[min(entry.message.priority, self._max)]

    def append(self, entry: Entry) -> None:
        self._level(entry).append(entry)
        self._count += 1

    def appendleft(self, entry: Entry) -> None:
        self._level(entry).appendleft(entry)
        self._count += 1

    def put_back(self, entries: list[Entry]) -> None:
        """Returned entries back at their places, each in its priority level (see :func:`_put_back`)."""
        levels: dict[int, list[Entry]] = {}
        for entry in entries:
            levels.setdefault(min(entry.message.priority, self._max), []).append(entry)
        for level, group in levels.items():
            _put_back(self._levels[level], group)
        self._count += len(entries)

    def popleft(self) -> Entry:
        for level in reversed(self._levels):
            if level:
                self._count -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def clear(self) -> None:
        for level in self._levels:
            level.clear()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Entry]:
        for level in reversed(self._levels):
            yield from level

    @property
    def levels(self) -> list[deque[Entry]]:
        """The FIFOs, lowest priority (served last) first."""
        return self._levels


_seq = operator.attrgetter("seq")


def _put_back(ready: deque[Entry], entries: list[Entry]) -> None:
    """Put returned entries back where they stood, as RabbitMQ's classic queues do.

    ``ready`` is in enqueue order (:attr:`Entry.seq`): new entries go to the tail, so keeping
    returns in that order keeps the invariant. Returned entries were delivered from the head,
    so only the ready entries older than the newest of them move: O(returned + those), usually
    O(returned), whatever order the client returned them in.
    """
    entries.sort(key=_seq)
    newest = entries[-1].seq
    older: list[Entry] = []
    while ready and ready[0].seq < newest:
        older.append(ready.popleft())
    if older:
        entries = list(heapq.merge(older, entries, key=_seq))
    ready.extendleft(reversed(entries))


class ReadyLine(Generic[Owner]):
    """The ready messages of one queue, in delivery order (see the module's docstring).

    :param queue: the queue it belongs to (spools, pagers and new entries name it)
    :param max_priority: ``x-max-priority`` (one FIFO per level, never spooled), or ``None``
    """

    def __init__(self, queue: Owner, max_priority: int | None) -> None:
        self.queue = queue
        #: The window: entries in memory, next to be delivered first.
        self.entries: deque[Entry] | _PriorityReady = deque() if max_priority is None else _PriorityReady(max_priority)
        #: Entries in :attr:`entries` that expired where they stood; skipped when they come up.
        self.gone = 0
        #: Body bytes of the ready entries, and of those the bodies of which are on disk.
        self.ready_bytes = 0
        self.paged_bytes = 0
        #: Where bodies go when memory is short (``None``: they stay), and the ready bytes past
        #: which the line asks it to look (:data:`NEVER` while it is watched or there is none).
        self.pager: BodyPager[Owner] | None = None
        self.page_at = NEVER
        #: A deep queue's spool (``broker.core.entry_spool``): what arrived once :attr:`spool_at` ready
        #: entries were in memory, as records on disk; ``None`` while everything is in memory.
        self.spool: Spool | None = None
        #: Makes the spool (``broker.storage.spool_files.Spooler``); ``None``: this queue never spools.
        self.spooler: SpoolMaker[Owner] | None = None
        #: Ready entries in memory at which the line asks its pager whether to spool (while it
        #: does not: :meth:`start_spool`), or past which what arrives is spooled and under which
        #: the spool refills them (while it does); :data:`NEVER`: never.
        self.spool_at = NEVER
        self.refill_at = 0

    @property
    def count(self) -> int:
        """Ready messages, spooled ones included."""
        spool = self.spool
        return len(self.entries) - self.gone + (spool.count if spool is not None else 0)

    @property
    def queued_bytes(self) -> int:
        """Body bytes of the ready messages, spooled ones included."""
        spool = self.spool
        return self.ready_bytes + (spool.bytes if spool is not None else 0)

    @property
    def memory_use(self) -> tuple[int, int]:
        """Ready messages in memory (in the window and waiting behind the spool) and their body
        bytes in memory."""
        count = len(self.entries) - self.gone
        size = self.ready_bytes - self.paged_bytes
        spool = self.spool
        if spool is not None:
            count += len(spool.waiting)
            size += spool.waiting_bytes
        return count, size

    def live(self) -> list[Entry]:
        """The ready entries in memory, next to be delivered first."""
        return [entry for entry in self.entries if entry.state == READY]

    def tail_first(self) -> Iterator[Entry]:
        """The ready entries in memory, last to be delivered first."""
        entries = self.entries
        if type(entries) is _PriorityReady:
            for level in entries.levels:
                yield from reversed(level)
        else:
            yield from reversed(entries)  # type: ignore[arg-type]

    def to_page(self, window: int) -> list[Entry]:
        """Ready entries whose bodies should go to disk, last to be delivered first: those behind
        the first ``window`` bytes of ready bodies still in memory, back to the first entry whose
        body is already on disk (so each look costs what arrived since the last one).
        """
        keep = self.ready_bytes - self.paged_bytes
        chosen = []
        for entry in self.tail_first():
            if keep <= window or entry.paged:
                break
            if entry.state == READY:
                chosen.append(entry)
                keep -= entry.message.size
        return chosen

    def mark_paged(self, entries: Iterable[Entry]) -> None:
        """The bodies of these ready entries are on disk now (they count in :attr:`paged_bytes`)."""
        for entry in entries:
            if not entry.paged:
                entry.paged = True
                self.paged_bytes += entry.message.size

    def newest(self, count: int) -> list[Entry]:
        """The last ``count`` ready entries in memory (expired ones too), newest first."""
        return list(itertools.islice(self.tail_first(), count))

    def peek(self, count: int) -> list[Entry]:
        """The first ``count`` ready entries, without taking them (the rest are not visited)."""
        return list(itertools.islice((entry for entry in self.entries if entry.state == READY), count))

    # -- in and out ---------------------------------------------------------------------------

    def append(self, entry: Entry) -> None:
        """``entry`` waits at the tail of the window (the caller knows the queue does not spool)."""
        entries = self.entries
        entries.append(entry)
        self.ready_bytes += entry.message.size
        if self.ready_bytes > self.page_at:
            self.pager.watch(self.queue)  # type: ignore[union-attr]
        if len(entries) >= self.spool_at:
            self.start_spool()

    def pop(self) -> Entry | None:
        """The next live ready entry, skipping expired ones; ``None`` when there is none."""
        entries = self.entries
        while entries or (self.spool is not None and self.refill()):
            entry = entries.popleft()
            if entry.state != READY:
                self.gone -= 1
                continue
            self.ready_bytes -= entry.message.size
            if entry.paged:
                entry.paged = False
                self.paged_bytes -= entry.message.size
            return entry
        return None

    def take(self, count: int) -> list[Entry]:
        """Up to ``count`` live ready entries from the head of the window (``count`` at most its length)."""
        if self.gone or self.paged_bytes:
            batch: list[Entry] = []
            while len(batch) < count:
                entry = self.pop()
                if entry is None:
                    break
                batch.append(entry)
            return batch
        popleft = self.entries.popleft
        batch = [popleft() for _ in range(count)]
        self.ready_bytes -= sum([entry.message.size for entry in batch])
        return batch

    def put_back(self, entries: list[Entry]) -> None:
        """Returned entries go back to their places in the window (by :attr:`Entry.seq`)."""
        ready = self.entries
        if type(ready) is _PriorityReady:
            ready.put_back(entries)
        else:
            _put_back(ready, entries)  # type: ignore[arg-type]
        self.ready_bytes += sum(entry.message.size for entry in entries)

    def expired(self, entries: list[Entry]) -> None:
        """``entries`` of the window expired where they stand (they are skipped when they come up)."""
        for entry in entries:
            self.ready_bytes -= entry.message.size
            if entry.paged:
                entry.paged = False
                self.paged_bytes -= entry.message.size
        self.gone += len(entries)
        if self.gone == len(self.entries):
            self.entries.clear()
            self.gone = 0
        if self.spool is not None and len(self.entries) - self.gone < self.refill_at:
            self.refill()  # the spooled messages' expiries are looked at as they come back

    def clear(self) -> list[Entry]:
        """Empty the window; returns the live entries it held (the spool stays)."""
        live = self.live()
        self.entries.clear()
        self.gone = 0
        self.ready_bytes = self.paged_bytes = 0
        return live

    # -- the spool ----------------------------------------------------------------------------

    def attach_spooler(self, spooler: SpoolMaker[Owner]) -> None:
        """Let the queue spool what arrives once ``spooler.window`` ready entries are in memory
        and its pager finds memory short, or at once without a pager (not a priority queue: its
        levels are kept in memory)."""
        if type(self.entries) is _PriorityReady:
            return
        self.spooler = spooler
        self.spool_at = spooler.window
        self.refill_at = spooler.window // 2
        if len(self.entries) >= self.spool_at:
            self.start_spool()

    def start_spool(self) -> None:
        """The window is full: spool what arrives if the pager says memory is short (or
        there is no pager); else go on in memory, and ask again at the count it names."""
        if self.spool is not None or self.spooler is None:
            return
        if self.pager is not None:
            again = self.pager.spool_now(self.queue)
            if again:
                self.spool_at = again
                return
        self.spool_behind(self.spooler.window)

    def spool_behind(self, keep: int) -> None:
        """Spool what arrives from now on, behind the ready entries in memory (they stay: moving
        them would hold the reactor for as long as they take to record), until the spool is
        empty again (or :meth:`Spool.hold` keeps arrivals in memory); the spool refills the
        window once fewer than ``keep / 2`` are ready."""
        assert self.spooler is not None and not isinstance(self.entries, _PriorityReady)
        self.spool_at = keep
        self.refill_at = keep // 2
        if self.spool is None:
            self.spool = self.spooler.spool(self.queue)
            self.queue.update_plain()
        else:
            self.spool.resume()

    def hold_spool(self) -> None:
        """Memory is not short: what arrives waits in memory behind the spool's records, and
        once those are read back the queue is all in memory again (see :meth:`refill`)."""
        if self.spool is not None:
            self.spool.hold()

    def adopt_spool(self, storage: Any, *adopted: Any) -> None:
        """Take ``storage`` (a checkpoint's records) as this empty line's spool; they come into
        memory as it is consumed. ``adopted``: as :meth:`Spool.adopt` takes them."""
        assert self.spooler is not None and self.spool is None and not self.entries
        self.spool = self.spooler.spool(self.queue, storage)
        self.spool.adopt(*adopted)
        self.spool_at = self.spooler.window
        self.refill_at = self.spool_at // 2
        self.queue.update_plain()
        if self.pager is not None:
            self.pager.watch(self.queue)  # it holds what arrives in memory while memory allows

    def spool_entry(self, entry: Entry) -> None:
        """``entry`` goes behind the spool's records (the caller knows the queue spools)."""
        message = entry.message
        queue = self.queue
        journal = queue.journal
        if journal is not None and message.wal_id and queue.name in message.wal_queues:
            position = journal.position  # its Published record ends there at most
        else:
            position = 0
        self.spool.push(entry, position)  # type: ignore[union-attr]

    def refill(self) -> int:
        """Bring spooled messages back into memory up to the window; returns how many came."""
        spool = self.spool
        if spool is None:
            return 0
        # Held in memory with no record left: all of it comes back, and the spool goes.
        count = spool.count if not spool.recording and not spool.recorded_count else self.spool_at - len(self.entries)
        # Records come back up to the window's bytes too (one at least into an empty window).
        room = self.spooler.window_bytes - (self.ready_bytes - self.paged_bytes)  # type: ignore[union-attr]
        if room <= 0:
            if len(self.entries) > self.gone:
                return 0
            room = 1
        try:
            entries = spool.take(count, self.unspooled, room)
        except OSError as error:
            self.spool_failed(error, READ_BACK, "they stay spooled")
            return 0
        ready = self.entries
        queue = self.queue
        push = queue.deadlines.push
        for entry in entries:
            # In spool order, after everything in memory (a return finds its place by it).
            queue.seq += 1
            entry.seq = queue.seq
            ready.append(entry)
            self.ready_bytes += entry.message.size
            if entry.expires_at is not None:
                push(entry.expires_at, EXPIRY, entry)
        if not spool.count:
            spool.close()
            self.spool = None
            queue.update_plain()
            if self.ready_bytes > self.page_at:
                self.pager.watch(queue)  # type: ignore[union-attr]
        return len(entries)

    def drop_spool(self) -> Spool | None:
        """Detach the spool (a purge empties it); ``None`` if there is none."""
        spool = self.spool
        if spool is not None:
            self.spool = None
            self.queue.update_plain()
        return spool

    def spool_failed(self, error: OSError, doing: str, then: str) -> None:
        """Spooling failed while ``doing`` (:data:`WRITE`, :data:`READ_BACK`), with the
        consequence ``then``: tell the shell."""
        if self.pager is not None:
            self.pager.spool_failed(self.queue, error, doing, then)

    def unspooled(self, message: Message, record: SpoolRecord) -> Entry:
        """The entry for ``message``, read back from the spool's ``record``."""
        entry = Entry(message, self.queue)
        entry.redelivered = bool(record.flags & REDELIVERED)
        entry.delivery_count = count = record.delivery_count
        if count:
            entry.header = with_delivery_count(message, count)
        if record.expires_at:
            entry.expires_at = record.expires_at
        return entry

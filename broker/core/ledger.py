"""The log's segment ledger: which segments of the write-ahead log still hold live messages,
which are pinned, spooled into or needed by a checkpoint, and which may be rewritten or retired.

The journal (``broker.core.journal``) tells the ledger where each message's ``Published``
record went (:meth:`SegmentLedger.place`) and when a queue lets a message go
(:meth:`SegmentLedger.release`); the shell's log writer asks it which segments to copy forward
(:meth:`SegmentLedger.sparse`) and which to delete (:meth:`SegmentLedger.retirable`).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from postroom.broker.core.entry_spool import IN_LOG, SpoolRecord

if TYPE_CHECKING:
    from postroom.broker.core.message import Message

#: A segment is rewritten (its live messages copied forward) once no more than 1/4 of the
#: message references written to it are still live: at most a third more writing, to free it.
SPARSE_RATIO = 4


class _Pin:
    """Reads a log segment for messages whose bodies are on disk there and that no durable queue
    holds any more (a copy routed to a transient queue too): while one is alive, the segment is
    not retired. Messages hold it in their :attr:`Message.wal_location`."""

    __slots__ = ("read", "__weakref__")

    def __init__(self, read: Callable[[int, int, int], bytes]) -> None:
        self.read = read

    def __call__(self, segment: int, offset: int, size: int) -> bytes:
        return self.read(segment, offset, size)


class SegmentLedger:
    """Live message references per log segment, and what keeps a segment from being retired."""

    def __init__(self) -> None:
        #: Live message references per log segment (a message in two queues counts twice).
        #: A segment whose count is 0, with every older one at 0 too, can be retired.
        self.live: Counter[int] = Counter()
        #: References ever written to each segment (what :meth:`sparse` compares against).
        self.written: Counter[int] = Counter()
        #: The messages held as objects whose ``Published`` record is in each segment.
        self.holders: dict[int, set[Message]] = {}
        #: References per segment held by spool records (``broker.core.entry_spool``), not by message
        #: objects: such a segment is not rewritten (the records point into it), only retired.
        self.spooled_refs: Counter[int] = Counter()
        #: What the latest checkpoint needs (``broker.storage.checkpoint``): the log from this segment
        #: on (it is read from there after a crash), and these segments (its records point into
        #: them, so they are never rewritten).
        self.protected_from = 1 << 62
        self.protected: frozenset[int] = frozenset()
        #: Segments that paged-out messages outside durable queues still read from (see :class:`_Pin`).
        self._pins: dict[int, weakref.ref[_Pin]] = {}

    @property
    def messages_in_memory(self) -> int:
        """Logged messages held as objects (in queues or unacknowledged), not as spool records."""
        return sum(map(len, self.holders.values()))

    def place(self, message: Message, segment: int, references: int) -> None:
        """``message``'s ``Published`` record is in ``segment``, for ``references`` queues."""
        message.wal_segment = segment
        if references:
            self.live[segment] += references
            self.written[segment] += references
            holders = self.holders.get(segment)
            if holders is None:
                holders = self.holders[segment] = set()
            holders.add(message)

    def release(self, message: Message, segment: int) -> None:
        """A queue let ``message`` (recorded in ``segment``) go."""
        self.live[segment] -= 1
        if not message.wal_queues:
            holders = self.holders.get(segment)
            if holders is not None:
                holders.discard(message)

    def take_for_rewrite(self, segment: int) -> list[Message]:
        """The messages still live in ``segment``, in id order, no longer counted there: they are
        recorded again (recovery keeps each queue's messages in id order, so the copies do not
        reorder queues)."""
        messages = sorted(self.holders.pop(segment, set()), key=lambda m: m.wal_id)
        for message in messages:
            self.live[segment] -= len(message.wal_queues)
            message.wal_segment = 0
        return messages

    def pin(self, message: Message) -> None:
        """``message`` left its last durable queue with its body on disk: another queue may still
        hold it, so its segment stays until the message is gone."""
        read, segment, offset = message.wal_location  # type: ignore[misc]
        if isinstance(read, _Pin):
            return
        ref = self._pins.get(segment)
        pin = ref() if ref is not None else None
        if pin is None:
            pin = _Pin(read)
            self._pins[segment] = weakref.ref(pin)
        message.wal_location = (pin, segment, offset)

    def _pinned(self, segment: int) -> bool:
        ref = self._pins.get(segment)
        if ref is None:
            return False
        if ref() is None:
            del self._pins[segment]
            return False
        return True

    def sparse(self, segment: int) -> bool:
        """Whether ``segment`` still holds messages but at most 1/:data:`SPARSE_RATIO` of those written
        to it, none of them spooled or in a checkpoint: copying them forward is cheap next to
        what retiring it frees."""
        live = self.live.get(segment, 0)
        return (
            live > 0
            and live * SPARSE_RATIO <= self.written.get(segment, 0)
            and not self.spooled_refs.get(segment)
            and segment not in self.protected
        )

    def protect(self, first: int, segments: Iterable[int], keep: bool = True) -> None:
        """A checkpoint needs the log from segment ``first`` on, and ``segments``; with ``keep``,
        so does the one before it (until this one is written)."""
        if keep:
            self.protected_from = min(self.protected_from, first)
            self.protected = self.protected.union(segments)
        else:
            self.protected_from, self.protected = first, frozenset(segments)

    def retirable(self, segments: Iterable[int], active: int) -> list[int]:
        """The oldest segments, before ``active``, that hold no live message (a prefix only:
        a later segment may record the removal of messages in an earlier one)."""
        result = []
        for segment in sorted(segments):
            if (
                segment >= active
                or segment >= self.protected_from
                or self.live.get(segment, 0) > 0
                or self._pinned(segment)
            ):
                break
            result.append(segment)
        return result

    # -- spooled messages (``broker.core.entry_spool``) -----------------------------------------------

    def restored_spooled(self, segment: int, count: int = 1) -> None:
        """``count`` messages recovered at start went straight to a spool, as records pointing
        into ``segment``."""
        self.live[segment] += count
        self.written[segment] += count
        self.spooled_refs[segment] += count

    def unspool(self, segment: int, count: int = 1) -> None:
        """``count`` spool records pointing into ``segment`` were read back as objects, or dropped."""
        left = self.spooled_refs[segment] - count
        if left:
            self.spooled_refs[segment] = left
        else:
            del self.spooled_refs[segment]

    def spool_dropped(self, records: Iterable[SpoolRecord]) -> None:
        """Spool records that point into the log are gone (already recorded as removed)."""
        for record in records:
            if record.flags & IN_LOG:
                self.unspool(record.segment)
                self.live[record.segment] -= 1

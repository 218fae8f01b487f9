"""A queue's timers: visibility timeouts, message TTLs and ``x-expires``, behind one
``callLater`` armed at the earliest deadline.

Deadlines of deliveries with the same timeout arrive in order, so they sit in a FIFO per
timeout value (O(1) per delivery); extended leases and per-message TTLs go to a heap. Records
are ``(deadline, entry)`` snapshots, valid only while the entry is still in the state and at the
deadline they were made for, so acks and requeues cost nothing here: stale records are skipped
when they come up, and the FIFOs are compacted when stale records outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from postroom.broker.core.entry import READY, UNACKED, Entry

#: After a timer fires, the next one waits at least this long (seconds), so a burst of
#: deadlines microseconds apart is handled in a few batches rather than one callLater each.
#: The first deadline of a quiet period is still met exactly.
TIMER_SLACK = 0.01

#: Stale timer records tolerated before a FIFO is compacted (and only when they also
#: outnumber the live ones), so compaction is O(1) amortised per record.
COMPACT_AFTER = 1024

#: What a heap record is for (:meth:`Deadlines.push`): take a delivery back, or expire a ready entry.
TAKEBACK = 0
EXPIRY = 1


class Scheduler(Protocol):
    """The part of a reactor the queues use: what time it is, and a call later."""

    def seconds(self) -> float:
        """The current time in seconds."""

    def callLater(self, delay: float, callable: Callable[..., Any], *args: Any) -> Any:  # noqa: N802
        """Call ``callable`` after ``delay`` seconds; return something with ``cancel()``."""


class Deadlines:
    """A queue's deadlines, and the one timer armed at the earliest of them.

    Visibility timeouts of deliveries wait in a FIFO per timeout length (deadlines of one length
    come in order), message TTLs in a FIFO when the queue has one TTL for all, and everything
    else (per-message expirations, extended leases) in a heap. Records are not removed when an
    entry is acked or requeued: they go stale (the entry's state or deadline no longer match)
    and are skipped, and the FIFOs are compacted once stale records outnumber live ones.
    What to do when deadlines pass is the queue's (:meth:`WorkQueue.deadlines_passed`).

    :param clock: the reactor's time and calls (``None``: nothing is ever armed)
    :param fire: called when the timer goes off
    """

    __slots__ = ("clock", "fire", "inflight", "stale", "ttl_fifo", "heap", "_sequence", "timer", "timer_at")

    def __init__(self, clock: Scheduler | None, fire: Callable[[], None]) -> None:
        self.clock = clock
        self.fire = fire
        self.inflight: dict[float, deque[tuple[float, Entry]]] = {}
        #: Records in :attr:`inflight` whose delivery was settled or returned since.
        self.stale = 0
        self.ttl_fifo: deque[tuple[float, Entry]] = deque()
        self.heap: list[tuple[float, int, int, Entry]] = []  # (deadline, seq, kind, entry)
        self._sequence = itertools.count()
        self.timer: Any = None
        self.timer_at = 0.0

    def track_delivery(self, entry: Entry, deadline: float, timeout: float) -> None:
        """Start the visibility timeout of a delivery."""
        entry.deadline = deadline
        fifo = self.inflight.get(timeout)
        if fifo is None:
            fifo = self.inflight[timeout] = deque()
        fifo.append((deadline, entry))
        if self.timer is None or deadline < self.timer_at:
            self.arm(deadline)

    def expire_in_order(self, entry: Entry, expires_at: float) -> None:
        """``entry`` expires at ``expires_at``, after every entry before it (the queue's one TTL)."""
        self.ttl_fifo.append((expires_at, entry))
        self.arm(expires_at)

    def push(self, deadline: float, kind: int, entry: Entry) -> None:
        """A deadline in no order: ``kind`` is :data:`TAKEBACK` or :data:`EXPIRY`."""
        heapq.heappush(self.heap, (deadline, next(self._sequence), kind, entry))
        self.arm(deadline)

    def compact(self) -> None:
        """Drop the stale records of the FIFOs, once they outnumber the live ones."""
        live = sum(len(fifo) for fifo in self.inflight.values()) - self.stale
        if self.stale < live:
            return
        for timeout, fifo in list(self.inflight.items()):
            kept = deque(record for record in fifo if record[1].state == UNACKED and record[1].deadline == record[0])
            if kept:
                self.inflight[timeout] = kept
            else:
                del self.inflight[timeout]
        self.stale = 0

    def arm(self, deadline: float) -> None:
        """Have the timer go off at ``deadline`` at the latest."""
        clock = self.clock
        if clock is None:
            return
        if self.timer is not None:
            if deadline >= self.timer_at:
                return
            self.timer.cancel()
        self.timer_at = deadline
        self.timer = clock.callLater(max(0.0, deadline - clock.seconds()), self.fire)

    def next_deadline(self) -> float | None:
        """The earliest live deadline (stale records at the heads of the FIFOs are dropped)."""
        candidates = []
        for fifo in self.inflight.values():
            while fifo and not (fifo[0][1].state == UNACKED and fifo[0][1].deadline == fifo[0][0]):
                fifo.popleft()
                self.stale = max(0, self.stale - 1)
            if fifo:
                candidates.append(fifo[0][0])
        ttl = self.ttl_fifo
        while ttl and not (ttl[0][1].state == READY and ttl[0][1].expires_at == ttl[0][0]):
            ttl.popleft()
        if ttl:
            candidates.append(ttl[0][0])
        if self.heap:
            candidates.append(self.heap[0][0])
        return min(candidates) if candidates else None

    def due(self, now: float) -> tuple[list[Entry], list[Entry]]:
        """Take the deadlines passed at ``now``: the deliveries whose visibility timeout ran
        out, and the ready entries that expired."""
        taken: list[Entry] = []
        expired: list[Entry] = []
        for fifo in list(self.inflight.values()):
            while fifo and fifo[0][0] <= now:
                deadline, entry = fifo.popleft()
                if entry.state == UNACKED and entry.deadline == deadline:
                    taken.append(entry)
                else:
                    self.stale = max(0, self.stale - 1)
        ttl = self.ttl_fifo
        while ttl and ttl[0][0] <= now:
            deadline, entry = ttl.popleft()
            if entry.state == READY and entry.expires_at == deadline:
                expired.append(entry)
        heap = self.heap
        while heap and heap[0][0] <= now:
            deadline, _seq, kind, entry = heapq.heappop(heap)
            if kind == TAKEBACK and entry.state == UNACKED and entry.deadline == deadline:
                taken.append(entry)
            elif kind == EXPIRY and entry.state == READY and entry.expires_at == deadline:
                expired.append(entry)
        return taken, expired

    def cancel(self) -> None:
        """Stop the timer."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

"""A queue's delivery: its consumers, whose turn it is, and the dispatch of ready entries to them.

Dispatch is synchronous: enqueueing a message, adding a consumer or giving a consumer credit
(an ack, a prefetch change, a writable socket) dispatches, handing ready entries to the next
consumer that can take one. Consumers take turns (RabbitMQ's round-robin); a consumer that is
full is skipped and keeps its place. While consumers' priorities differ (``x-priority``), the
highest priority that can take a delivery gets it, in turns within each level. With
``x-single-active-consumer`` one consumer is delivered to and the others wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from postroom.broker.core.entry import DISPATCH_BATCH, Consumer, Entry
from postroom.broker.core.ready import ReadyLine


class Delivery:
    """The consumers of one queue, in turn order, and the dispatch of its ready line to them."""

    __slots__ = ("ring", "levels", "waiting")

    def __init__(self) -> None:
        #: The consumers deliveries go to, next in turn first (with a single active consumer:
        #: the active one only). Always the same deque (the queue's hot path holds it).
        self.ring: deque[Consumer] = deque()
        #: While consumers' priorities differ: the same consumers by priority, highest first,
        #: each level in turn order (``None`` otherwise, so equal priorities cost nothing).
        self.levels: list[deque[Consumer]] | None = None
        #: ``x-single-active-consumer``: the consumers waiting to become the active one.
        self.waiting: deque[Consumer] = deque()

    @property
    def count(self) -> int:
        """Consumers (with a single active consumer: the waiting ones too, as RabbitMQ counts)."""
        return len(self.ring) + len(self.waiting)

    @property
    def consumers(self) -> Iterable[Consumer]:
        """The consumers, next in turn first (the active one, then those waiting)."""
        return [*self.ring, *self.waiting] if self.waiting else self.ring

    def add(self, consumer: Consumer, single_active: bool) -> bool:
        """Add ``consumer`` at the end of the turns of its priority; with ``single_active`` and
        another consumer active, it waits. Returns whether it is delivered to now."""
        ring = self.ring
        if single_active and ring:
            self.waiting.append(consumer)
            return False
        ring.append(consumer)
        levels = self.levels
        if levels is not None:
            _join_level(levels, consumer)
        elif consumer.priority != ring[0].priority:
            self.levels = levels = []
            for each in ring:
                _join_level(levels, each)
        return True

    def remove(self, consumer: Consumer) -> bool:
        """Remove ``consumer``. When the active one of a single active consumer goes, the
        waiting one of the highest priority (the first subscribed among equals, RabbitMQ's
        choice) becomes active. Returns whether one did (it is to be dispatched to)."""
        try:
            self.ring.remove(consumer)
        except ValueError:  # a waiting one (or one already gone): nothing else changes
            if consumer in self.waiting:
                self.waiting.remove(consumer)
            return False
        levels = self.levels
        if levels is not None:
            for level in levels:
                if consumer in level:
                    level.remove(consumer)
                    if not level:
                        levels.remove(level)
                    break
            if len(levels) == 1:  # equal priorities again: back to the plain round robin
                self.ring.clear()
                self.ring.extend(levels[0])
                self.levels = None
        waiting = self.waiting
        if waiting and not self.ring:
            successor = max(waiting, key=lambda each: each.priority)
            waiting.remove(successor)
            self.ring.append(successor)
            return True
        return False

    def last_in_turn(self, consumer: Consumer) -> None:
        """``consumer`` goes to the end of the turns (its delivery timed out: the next one gets it)."""
        ring = self.ring
        if len(ring) > 1 and consumer in ring:
            ring.remove(consumer)
            ring.append(consumer)

    def has_exclusive(self) -> bool:
        """Whether a consumer holds the queue exclusively."""
        return any(consumer.exclusive for consumer in self.consumers)

    def next_consumer(self) -> Consumer | None:
        """The next consumer in turn that can take a delivery (it goes to the end of its turns,
        as in RabbitMQ; while priorities differ, of the highest priority that can); ``None`` if none can."""
        levels = self.levels
        for turns in levels if levels is not None else (self.ring,):
            for _ in range(len(turns)):
                consumer = turns[0]
                turns.rotate(-1)
                if consumer.can_accept():
                    return consumer
        return None

    def deliver_one(self, entry: Entry) -> bool:
        """Deliver ``entry`` to the next consumer in turn that can take it; ``False`` if none can."""
        consumer = self.next_consumer()
        if consumer is None:
            return False
        consumer.channel.deliver_entries(consumer, (entry,))
        return True

    def dispatch(self, line: ReadyLine[Any]) -> int:
        """Deliver entries of ``line``'s window to consumers that can take them, in turns.

        With one consumer, its whole credit goes out as one batch. With several, each delivery
        goes to the next consumer in turn that can accept. At most :data:`DISPATCH_BATCH`
        deliveries are made; returns how many were.
        """
        ready = line.entries
        ring = self.ring
        if not ready or not ring:
            return 0
        if len(ring) == 1:
            consumer = ring[0]
            count = min(consumer.credit(), len(ready))
            if count <= 0:
                return 0
            batch = line.take(count)
            if batch:
                consumer.channel.deliver_entries(consumer, batch)
            return len(batch)
        delivered = 0
        slow = line.gone or line.paged_bytes
        while ready and delivered < DISPATCH_BATCH:
            consumer = self.next_consumer()  # type: ignore[assignment]
            if consumer is None:
                return delivered
            if slow:
                entry = line.pop()
                if entry is None:
                    return delivered
            else:
                entry = ready.popleft()
                line.ready_bytes -= entry.message.size
            consumer.channel.deliver_entries(consumer, (entry,))
            delivered += 1
        return delivered


def _join_level(levels: list[deque[Consumer]], consumer: Consumer) -> None:
    """Put ``consumer`` at the end of its priority's level (levels highest first)."""
    for index, level in enumerate(levels):
        priority = level[0].priority
        if priority == consumer.priority:
            level.append(consumer)
            return
        if priority < consumer.priority:
            levels.insert(index, deque((consumer,)))
            return
    levels.append(deque((consumer,)))

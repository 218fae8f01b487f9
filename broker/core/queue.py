"""Work queues: ready messages, competing consumers in round-robin order, prefetch.

A queue holds :class:`Entry` objects (a message plus this queue's delivery state for it: one
message routed to three queues has three entries). Unacknowledged entries are held by the
channel that received them, keyed by delivery tag; the queue only counts them.

Dispatch is synchronous: enqueueing a message, adding a consumer or giving a consumer credit
(an ack, a prefetch change, a writable socket) calls :meth:`WorkQueue.dispatch`, which hands
ready entries to the next consumer that can take one. Consumers take turns (RabbitMQ's
round-robin); a consumer that is full is skipped and keeps its place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.message import Message

if TYPE_CHECKING:
    from broker.core.vhost import Exchange

#: Most deliveries one dispatch makes before yielding. A consumer without a prefetch limit
#: (or with no_ack) on a long queue would otherwise have the whole queue written into its
#: output buffer at once; in batches, the socket's back-pressure pauses it in between.
DISPATCH_BATCH = 2000

#: RabbitMQ's largest x-max-priority; each level is one deque, so the cap bounds memory per queue.
MAX_PRIORITY = 255


class DeliverySink(Protocol):
    """What a consumer delivers to: the channel that registered it."""

    active: bool
    prefetch_global: int
    unacked_count: int

    def deliver_entries(self, consumer: Consumer, entries: Iterable[Entry]) -> None:
        """Send ``entries`` to ``consumer`` (a ``basic.deliver`` and the content for each)."""


class Entry:
    """A message in one queue, with that queue's delivery state for it."""

    __slots__ = ("message", "queue", "redelivered", "consumer", "tag")

    def __init__(self, message: Message, queue: WorkQueue, redelivered: bool = False) -> None:
        self.message = message
        self.queue = queue
        self.redelivered = redelivered
        #: The consumer it was delivered to (``None`` while ready or after basic.get).
        self.consumer: Consumer | None = None
        #: Its delivery tag on the channel that holds it, while unacknowledged.
        self.tag = 0


class Consumer:
    """A ``basic.consume`` subscription.

    :param channel: where deliveries go
    :param tag: the consumer tag
    :param prefetch: at most this many unacked deliveries (0: no limit)
    """

    __slots__ = ("channel", "queue", "tag", "tag_bytes", "no_ack", "exclusive", "prefetch", "unacked", "arguments")

    def __init__(
        self,
        channel: DeliverySink,
        queue: WorkQueue,
        tag: str,
        tag_bytes: bytes,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: Mapping[str, Any],
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.tag_bytes = tag_bytes
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def credit(self) -> int:
        """How many deliveries the consumer can take now (:data:`DISPATCH_BATCH` when unlimited)."""
        channel = self.channel
        if not channel.active:
            return 0
        if self.no_ack:
            return DISPATCH_BATCH
        credit = self.prefetch - self.unacked if self.prefetch else DISPATCH_BATCH
        if channel.prefetch_global:
            credit = min(credit, channel.prefetch_global - channel.unacked_count)
        return credit

    def can_accept(self) -> bool:
        """Whether one more delivery fits within the channel's state and both prefetch limits."""
        channel = self.channel
        if not channel.active:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not (channel.prefetch_global and channel.unacked_count >= channel.prefetch_global)


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


class WorkQueue:
    """A named queue with competing consumers.

    :param name: the queue name, unique in its virtual host
    :param owner: the connection that owns an exclusive queue, else ``None``
    :param max_priority: ``x-max-priority``; ``None`` for a plain FIFO queue
    """

    def __init__(
        self,
        name: str,
        vhost_name: str = "/",
        durable: bool = False,
        owner: object | None = None,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        max_priority: int | None = None,
    ) -> None:
        self.name = name
        self.vhost_name = vhost_name
        self.durable = durable
        self.owner = owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.max_priority = max_priority
        self._ready: deque[Entry] | _PriorityReady = deque() if max_priority is None else _PriorityReady(max_priority)
        self._consumers: deque[Consumer] = deque()
        self.unacked_count = 0
        self.had_consumers = False
        self.deleted = False
        #: Exchanges with a binding to this queue, so deleting the queue can remove them.
        self.sources: set[Exchange] = set()
        #: Called when a dispatch stopped at its batch limit with entries left to deliver.
        self.on_backlog: Callable[[WorkQueue], None] | None = None

    @property
    def exclusive(self) -> bool:
        """Whether the queue belongs to one connection."""
        return self.owner is not None

    @property
    def message_count(self) -> int:
        """Ready messages (as ``queue.declare-ok`` reports them: unacked ones are not counted)."""
        return len(self._ready)

    @property
    def consumer_count(self) -> int:
        """Active consumers."""
        return len(self._consumers)

    @property
    def consumers(self) -> Iterable[Consumer]:
        """The consumers, next in turn first."""
        return self._consumers

    def ready_entries(self) -> Iterable[Entry]:
        """The ready entries, next to be delivered first."""
        return self._ready

    # -- messages -----------------------------------------------------------------------------

    def enqueue(self, message: Message) -> None:
        """Add a message at the tail and deliver what can be delivered."""
        entry = Entry(message, self)
        consumers = self._consumers
        if consumers and not self._ready:
            # Nothing waiting: hand the entry straight to the next consumer that can take it.
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    consumer.channel.deliver_entries(consumer, (entry,))
                    return
        self._ready.append(entry)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Put entries back at the head, in the given order, marked redelivered.

        :param entries: entries of this queue, oldest first (as their delivery tags run)
        """
        ready = self._ready
        for entry in reversed(list(entries)):
            entry.redelivered = True
            entry.consumer = None
            ready.appendleft(entry)
        if self._consumers:
            self.dispatch()

    def get(self) -> Entry | None:
        """Take the next ready entry for ``basic.get``, or ``None`` if there is none."""
        if not self._ready:
            return None
        return self._ready.popleft()

    def purge(self) -> int:
        """Drop every ready message; return how many (unacked ones stay, as in RabbitMQ)."""
        count = len(self._ready)
        self._ready.clear()
        return count

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Add a consumer at the end of the round-robin order and deliver to it."""
        self._consumers.append(consumer)
        self.had_consumers = True
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Remove a consumer (its unacked deliveries stay with its channel)."""
        try:
            self._consumers.remove(consumer)
        except ValueError:
            pass

    def has_exclusive_consumer(self) -> bool:
        """Whether a consumer holds the queue exclusively."""
        return any(consumer.exclusive for consumer in self._consumers)

    def dispatch(self) -> None:
        """Deliver ready entries to consumers that can take them, in round-robin order.

        With one consumer, its whole credit goes out as one batch. With several, each
        delivery goes to the next consumer in turn that can accept; a full consumer is skipped
        and keeps its place. At most :data:`DISPATCH_BATCH` deliveries are made per call; when
        entries remain after that, :attr:`on_backlog` is called so the rest is dispatched later.
        """
        ready = self._ready
        consumers = self._consumers
        if not ready or not consumers:
            return
        if len(consumers) == 1:
            consumer = consumers[0]
            count = min(consumer.credit(), len(ready))
            if count <= 0:
                return
            popleft = ready.popleft
            consumer.channel.deliver_entries(consumer, [popleft() for _ in range(count)])
            delivered = count
        else:
            delivered = 0
            while ready and delivered < DISPATCH_BATCH:
                for _ in range(len(consumers)):
                    consumer = consumers[0]
                    consumers.rotate(-1)
                    if consumer.can_accept():
                        break
                else:
                    return
                consumer.channel.deliver_entries(consumer, (ready.popleft(),))
                delivered += 1
        if ready and delivered >= DISPATCH_BATCH and self.on_backlog is not None:
            self.on_backlog(self)

    def __repr__(self) -> str:
        return f"<WorkQueue {self.name!r} ready={len(self._ready)} unacked={self.unacked_count}>"

"""Work queues: ready messages, competing consumers, prefetch, and the reliability rules.

A queue holds :class:`Entry` objects (a message plus this queue's delivery state for it: one
message routed to three queues has three entries). Unacknowledged entries are held by the
channel that received them, keyed by delivery tag; the queue only counts them.

Dispatch is synchronous: enqueueing a message, adding a consumer or giving a consumer credit
(an ack, a prefetch change, a writable socket) calls :meth:`WorkQueue.dispatch`, which hands
ready entries to the next consumer that can take one. Consumers take turns (RabbitMQ's
round-robin); a consumer that is full is skipped and keeps its place.

Reliability (``../shared/CONTRACT.md``, Queues):

* **visibility timeout** (SQS's rule): a delivery left unacked longer than its timeout is
  taken back from its channel (its tag goes stale), counted as a return and put back where
  it stood (at the head, unless older returns are ahead of it);
* **delivery limit**: every return (nack/reject with requeue, visibility timeout, channel
  closed with the delivery unacked, ``basic.recover``) adds one to the entry's delivery count;
  past ``x-delivery-limit`` the entry is dead-lettered with reason ``delivery_limit``;
* **TTL**: ``x-message-ttl`` and per-message ``expiration``; a ready message that expires is
  dead-lettered at once (reason ``expired``), wherever it is in the queue;
* **length limits**: ``x-max-length``/``x-max-length-bytes`` over ready messages, with
  ``x-overflow`` drop-head (dead-letter the head, reason ``maxlen``), reject-publish or
  reject-publish-dlx;
* **x-expires**: a queue unused for that long (no consumers, no ``basic.get``, no
  redeclaration) is deleted.

Timers: a queue has at most one pending ``callLater``, for its earliest deadline. Deadlines of
deliveries with the same timeout arrive in order, so they sit in a FIFO per timeout value
(O(1) per delivery); extended leases and per-message TTLs go to a heap. Records are
``(deadline, entry)`` snapshots, valid only while the entry is still in the state and at the
deadline they were made for, so acks and requeues cost nothing here: stale records are
skipped when they come up, and the FIFOs are compacted when stale records outnumber live ones.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import operator
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.deadletter import DeadLetterReason, with_delivery_count
from broker.core.message import Message
from broker.core.spool import IN_LOG, REDELIVERED, Spool, SpoolRecord
from broker.wire.codec import FLAG_EXPIRATION

if TYPE_CHECKING:
    from broker.core.journal import Journal
    from broker.core.vhost import Exchange
    from broker.wal.recovery import StoredMessage

#: Most deliveries one dispatch makes before yielding. A consumer without a prefetch limit
#: (or with no_ack) on a long queue would otherwise have the whole queue written into its
#: output buffer at once; in batches, the socket's back-pressure pauses it in between.
DISPATCH_BATCH = 2000

#: RabbitMQ's largest x-max-priority; each level is one deque, so the cap bounds memory per queue.
MAX_PRIORITY = 255

#: After a timer fires, the next one waits at least this long (seconds), so a burst of
#: deadlines microseconds apart is handled in a few batches rather than one callLater each.
#: The first deadline of a quiet period is still met exactly.
TIMER_SLACK = 0.01

#: Stale timer records tolerated before a FIFO is compacted (and only when they also
#: outnumber the live ones), so compaction is O(1) amortised per record.
COMPACT_AFTER = 1024

#: One message in this many per queue has its publish-to-deliver latency measured: a
#: histogram of samples shows the shape without a clock reading for every message.
LATENCY_SAMPLE_EVERY = 1024

#: Sampled entries waiting for their delivery, per queue, before the table is cleared.
MAX_LATENCY_SAMPLES = 64

#: :attr:`WorkQueue.page_at` when no pager is to be asked: more bytes than any queue holds.
NEVER = 1 << 62

# Entry states.
READY = 0  # in the ready list (or about to be)
UNACKED = 1  # delivered, waiting for an ack
GONE = 2  # acked, dead-lettered, expired or dropped

# What a queue was doing when its spool failed (:meth:`WorkQueue.spool_failed`).
WRITE = "spool messages"
READ_BACK = "read spooled messages back"


class CheckpointRefused(Exception):
    """A queue's messages cannot be written to a checkpoint as they stand; the reason says why."""


@dataclass(slots=True)
class QueueCheckpoint:
    """A durable queue's logged messages in order, as spool records (:meth:`WorkQueue.checkpoint`):
    ``head``, then the ``span`` ``(start, end)`` of its spool's storage, then ``tail``.

    :ivar copies: records in the span that point at page-store copies (messages not logged
        here): a start leaves them out
    :ivar span_bytes: body bytes of the span's other messages
    :ivar span_refs: how many of the span's records point into each log segment
    """

    head: list[SpoolRecord]
    spool: Spool | None
    span: tuple[int, int]
    copies: int
    span_bytes: int
    span_refs: Counter[int]
    tail: list[SpoolRecord]
    #: Adopted records in the span removed since, and delivery counts changed since.
    removed: set[int] = dataclasses.field(default_factory=set)
    counts: dict[int, int] = dataclasses.field(default_factory=dict)


class Scheduler(Protocol):
    """The part of a reactor the queues use: what time it is, and a call later."""

    def seconds(self) -> float:
        """The current time in seconds."""

    def callLater(self, delay: float, callable: Callable[..., Any], *args: Any) -> Any:  # noqa: N802
        """Call ``callable`` after ``delay`` seconds; return something with ``cancel()``."""


class Overflow(Enum):
    """``x-overflow``: what a full queue does with one more message."""

    DROP_HEAD = "drop-head"
    REJECT_PUBLISH = "reject-publish"
    REJECT_PUBLISH_DLX = "reject-publish-dlx"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's reliability settings, from its (already validated) declare arguments.

    Durations are in seconds.
    """

    message_ttl: float | None = None
    expires: float | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = Overflow.DROP_HEAD
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    delivery_limit: int | None = None
    visibility_timeout: float | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> QueueSettings:
        """Read the ``x-`` arguments RabbitMQ (and Postroom) define for queues."""

        def ms(key: str) -> float | None:
            value = arguments.get(key)
            return None if value is None else value / 1000.0

        def text(key: str) -> str | None:
            value = arguments.get(key)
            return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value

        return cls(
            message_ttl=ms("x-message-ttl"),
            expires=ms("x-expires"),
            max_length=arguments.get("x-max-length"),
            max_length_bytes=arguments.get("x-max-length-bytes"),
            overflow=Overflow(arguments.get("x-overflow", "drop-head")),
            dead_letter_exchange=text("x-dead-letter-exchange"),
            dead_letter_routing_key=text("x-dead-letter-routing-key"),
            delivery_limit=arguments.get("x-delivery-limit"),
            visibility_timeout=ms("x-visibility-timeout"),
            max_priority=arguments.get("x-max-priority"),
            single_active_consumer=arguments.get("x-single-active-consumer") is True,
        )


class DeliverySink(Protocol):
    """What a consumer delivers to: the channel that registered it."""

    active: bool
    prefetch_global: int
    unacked_count: int

    def deliver_entries(self, consumer: Consumer, entries: Sequence[Entry]) -> None:
        """Send ``entries`` to ``consumer`` (a ``basic.deliver`` and the content for each)."""

    def take_back(self, entry: Entry) -> bool:
        """Forget an unacked delivery whose visibility timeout passed (its tag becomes stale).

        :returns: ``False`` when the channel no longer holds it (acked in an open transaction).
        """


class BodyPager(Protocol):
    """What keeps the messages of deep queues within the memory budget (``broker.storage.paging.Pager``)."""

    def watch(self, queue: WorkQueue) -> None:
        """``queue`` holds more ready bytes than its :attr:`WorkQueue.page_at`: look at it soon."""

    def spool_now(self, queue: WorkQueue) -> int:
        """``queue`` holds :attr:`WorkQueue.spool_at` ready messages: watch it, and say whether it
        is to spool what arrives now (0), or else at how many ready messages to ask again."""

    def spool_failed(self, queue: WorkQueue, error: OSError, doing: str, then: str) -> None:
        """``queue``'s messages could not be spooled or read back: ``error`` while ``doing``,
        with the consequence ``then`` (the shell logs it)."""


class QueueObserver(Protocol):
    """What a queue tells the one that holds it (``broker.core.vhost.VirtualHost``)."""

    def backlog(self, queue: WorkQueue) -> None:
        """A dispatch stopped at its batch limit with entries left to deliver: dispatch later."""

    def dead_letter(self, queue: WorkQueue, entries: list[Entry], reason: DeadLetterReason) -> None:
        """``entries`` are dead-lettered (publish them to the queue's dead-letter exchange)."""

    def expired(self, queue: WorkQueue) -> None:
        """``x-expires`` found ``queue`` unused: delete it."""

    def waited(self, seconds: float) -> None:
        """A sampled message waited ``seconds`` from its arrival to its delivery."""


class DeadLetterWatch(Protocol):
    """What records dead letters leaving a queue that holds some (``broker.core.deadlog.DeadLetterLog``)."""

    def spooled(self, queue: WorkQueue, entries: Iterable[Entry]) -> None:
        """``entries`` are about to be spooled."""

    def settled(self, queue: WorkQueue, entries: Iterable[Entry]) -> None:
        """``entries`` left ``queue`` for good."""


class SpoolMaker(Protocol):
    """What makes the spools of deep queues (``broker.storage.spooling.Spooler``)."""

    #: Ready entries a queue keeps in memory before it spools what arrives.
    window: int

    def spool(self, queue: WorkQueue, storage: Any = None) -> Spool:
        """A new spool for ``queue``, on ``storage`` (a checkpoint's records) or on new storage."""
        ...


class Entry:
    """A message in one queue, with that queue's delivery state for it."""

    __slots__ = (
        "message",
        "queue",
        "redelivered",
        "consumer",
        "tag",
        "channel",
        "state",
        "delivery_count",
        "deadline",
        "expires_at",
        "header",
        "seq",
        "paged",
    )

    def __init__(self, message: Message, queue: WorkQueue) -> None:
        self.message = message
        self.queue = queue
        #: Its place in the queue's order (enqueue order): a return puts it back there.
        queue.seq += 1
        self.seq = queue.seq
        self.redelivered = False
        #: The consumer it was delivered to (``None`` while ready or after basic.get).
        self.consumer: Consumer | None = None
        #: Its delivery tag on the channel that holds it, while unacknowledged.
        self.tag = 0
        #: The channel that holds it while unacknowledged.
        self.channel: DeliverySink | None = None
        self.state = READY
        #: Returns so far (nack/reject with requeue, visibility timeouts, channel closes).
        self.delivery_count = 0
        #: When its visibility timeout ends, while unacknowledged (``None``: no timeout).
        self.deadline: float | None = None
        #: When it expires while ready (``None``: never).
        self.expires_at: float | None = None
        #: Its content header with ``x-delivery-count`` once it has been returned, else ``None``.
        self.header: bytes | None = None
        #: Whether its body counts in the queue's :attr:`WorkQueue.paged_bytes` (ready, on disk).
        self.paged = False


class Consumer:
    """A ``basic.consume`` subscription.

    :param channel: where deliveries go
    :param tag: the consumer tag
    :param prefetch: at most this many unacked deliveries (0: no limit)
    :param visibility_timeout: overrides the queue's (seconds), from the consumer argument
    :param priority: the consumer's ``x-priority`` (RabbitMQ's consumer priorities)
    """

    __slots__ = (
        "channel",
        "queue",
        "tag",
        "tag_bytes",
        "no_ack",
        "exclusive",
        "prefetch",
        "unacked",
        "arguments",
        "visibility_timeout",
        "priority",
    )

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
        visibility_timeout: float | None = None,
        priority: int = 0,
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
        self.visibility_timeout = visibility_timeout if visibility_timeout else queue.settings.visibility_timeout
        #: ``x-priority``: deliveries go to the highest priority consumers that can take them.
        self.priority = priority

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
        """Whether one more delivery fits (see :meth:`credit`)."""
        return self.credit() > 0


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
        """A deadline in no order: ``kind`` is :data:`_TAKEBACK` or :data:`_EXPIRY`."""
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
            if kind == _TAKEBACK and entry.state == UNACKED and entry.deadline == deadline:
                taken.append(entry)
            elif kind == _EXPIRY and entry.state == READY and entry.expires_at == deadline:
                expired.append(entry)
        return taken, expired

    def cancel(self) -> None:
        """Stop the timer."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class WorkQueue:
    """A named queue with competing consumers and the reliability rules of its settings.

    :param name: the queue name, unique in its virtual host
    :param owner: the connection that owns an exclusive queue, else ``None``
    :param settings: TTLs, limits, dead-lettering, visibility timeout, priorities
    :param clock: time and timers (needed when any setting has a duration)
    """

    def __init__(
        self,
        name: str,
        vhost_name: str = "/",
        durable: bool = False,
        owner: object | None = None,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        settings: QueueSettings | None = None,
        clock: Scheduler | None = None,
    ) -> None:
        self.name = name
        self.vhost_name = vhost_name
        self.durable = durable
        self.owner = owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.settings = settings = settings or QueueSettings.from_arguments(self.arguments)
        self.clock = clock
        self.max_priority = settings.max_priority
        self._ready: deque[Entry] | _PriorityReady = (
            deque() if settings.max_priority is None else _PriorityReady(settings.max_priority)
        )
        #: Entries in ``_ready`` that expired where they stood; skipped when they come up.
        self._gone_in_ready = 0
        #: The last :attr:`Entry.seq` given out: ``_ready`` is kept in this order, so a returned
        #: message goes back to its place (RabbitMQ's classic queues), whatever the return order.
        self.seq = 0
        self._track_bytes = settings.max_length_bytes is not None
        #: Body bytes of the ready entries, and of those the bodies of which are on disk.
        self.ready_bytes = 0
        self.paged_bytes = 0
        #: Where bodies go when memory is short (``None``: they stay), and the ready bytes past
        #: which the queue asks it to look (:data:`NEVER` while it is watched or there is none).
        self.pager: BodyPager | None = None
        self.page_at = NEVER
        #: A deep queue's spool (``broker.core.spool``): what arrived once :attr:`spool_at` ready
        #: entries were in memory, as records on disk; ``None`` while everything is in memory.
        self.spool: Spool | None = None
        #: Makes the spool (``broker.storage.spooling.Spooler``); ``None``: this queue never spools.
        self.spooler: SpoolMaker | None = None
        #: Ready entries in memory at which the queue asks its pager whether to spool (while it
        #: does not: :meth:`_start_spool`), or past which what arrives is spooled and under which
        #: the spool refills them (while it does); :data:`NEVER`: never.
        self.spool_at = NEVER
        self._refill_at = 0
        #: Enqueue can take the short path: no TTL, no length limit, consumers of one priority.
        self._plain = True
        #: The same while spooling: what arrives goes straight to the spool.
        self._spool_plain = False
        #: The consumers deliveries go to, next in turn first (with a single active consumer:
        #: the active one only).
        self._consumers: deque[Consumer] = deque()
        #: While consumers' priorities differ: the same consumers by priority, highest first,
        #: each level in turn order (``None`` otherwise, so equal priorities cost nothing).
        self._levels: list[deque[Consumer]] | None = None
        #: ``x-single-active-consumer``: the consumers waiting to become the active one.
        self._waiting: deque[Consumer] = deque()
        self._update_plain()
        self.unacked_count = 0
        self.deleted = False
        #: Exchanges with a binding to this queue, so deleting the queue can remove them.
        self.sources: set[Exchange] = set()
        #: Told of backlogs, dead letters, expiry and latency (the vhost); ``None``: nobody.
        self.observer: QueueObserver | None = None
        #: The write-ahead log's journal, for a durable queue on a broker with a log; else ``None``.
        self.journal: Journal | None = None
        #: Told of entries spooled and settled, on queues that hold dead letters (the dead-letter
        #: event log records them); ``None`` elsewhere, so other queues pay nothing.
        self.dead_letter_watch: DeadLetterWatch | None = None
        #: Visibility timeouts, TTLs and expirations, and the timer armed at the earliest.
        self.deadlines = Deadlines(clock, self.deadlines_passed)
        self._last_used = clock.seconds() if clock is not None else 0.0
        # Counters, read by metrics at scrape time (one integer add per message, no callbacks).
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.visibility_timeouts = 0
        self.redelivered = 0
        #: Publish-to-deliver latency is sampled: one message in :data:`LATENCY_SAMPLE_EVERY`
        #: is stamped when it arrives (entry -> clock reading) and observed when delivered.
        self.latency_samples: dict[Entry, float] = {}
        self._until_sample = LATENCY_SAMPLE_EVERY
        self.dead_lettered: dict[DeadLetterReason, int] = {}
        #: The policy and the operator policy that apply to it (``broker.core.policy``).
        self.policy: Any = None
        self.operator_policy: Any = None
        if settings.expires is not None:
            self.deadlines.arm(self._last_used + settings.expires)

    def apply_settings(self, settings: QueueSettings) -> None:
        """Settings changed by a policy, applied to the running queue as RabbitMQ applies them:
        a TTL counts for messages that arrive from now on (those queued keep their expiry), a
        lower length limit drops the head at once (dead-lettered ``maxlen``), a dead-letter
        exchange applies to the next dead-lettering, and ``x-expires`` starts counting again.
        ``x-max-priority`` is the declaration's own and stays."""
        settings = dataclasses.replace(settings, max_priority=self.settings.max_priority)
        self.settings = settings
        self._track_bytes = settings.max_length_bytes is not None
        self._update_plain()
        if settings.overflow is Overflow.DROP_HEAD and (settings.max_length is not None or self._track_bytes):
            self._drop_head_while_full()
        self.touch()

    def _update_plain(self) -> None:
        settings = self.settings
        self._plain = (
            settings.message_ttl is None
            and settings.max_length is None
            and not self._track_bytes
            and self._levels is None
            and self.spool is None
        )
        self._spool_plain = (
            self.spool is not None
            and settings.message_ttl is None
            and settings.max_length is None
            and not self._track_bytes
            and self._levels is None
        )

    @property
    def exclusive(self) -> bool:
        """Whether the queue belongs to one connection."""
        return self.owner is not None

    @property
    def message_count(self) -> int:
        """Ready messages (as ``queue.declare-ok`` reports them: unacked ones are not counted)."""
        spool = self.spool
        return len(self._ready) - self._gone_in_ready + (spool.count if spool is not None else 0)

    @property
    def queued_bytes(self) -> int:
        """Body bytes of the ready messages, spooled ones included (``x-max-length-bytes``)."""
        spool = self.spool
        return self.ready_bytes + (spool.bytes if spool is not None else 0)

    @property
    def consumer_count(self) -> int:
        """Consumers (with a single active consumer: the waiting ones too, as RabbitMQ counts)."""
        return len(self._consumers) + len(self._waiting)

    @property
    def consumers(self) -> Iterable[Consumer]:
        """The consumers, next in turn first (the active one, then those waiting)."""
        return [*self._consumers, *self._waiting] if self._waiting else self._consumers

    @property
    def active_consumer(self) -> Consumer | None:
        """With ``x-single-active-consumer``: the one consumer deliveries go to (else ``None``)."""
        return self._consumers[0] if self.settings.single_active_consumer and self._consumers else None

    def ready_entries(self) -> Iterable[Entry]:
        """The ready entries, next to be delivered first."""
        return [entry for entry in self._ready if entry.state == READY]

    def tail_first(self) -> Iterator[Entry]:
        """The ready entries, last to be delivered first."""
        ready = self._ready
        if type(ready) is _PriorityReady:
            for level in ready.levels:
                yield from reversed(level)
        else:
            yield from reversed(ready)  # type: ignore[arg-type]

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
        return list(itertools.islice((entry for entry in self._ready if entry.state == READY), count))

    def now(self) -> float:
        """The queue's clock reading (0 without a clock)."""
        return self.clock.seconds() if self.clock is not None else 0.0

    # -- messages -----------------------------------------------------------------------------

    def enqueue(self, message: Message) -> bool:
        """Add a message at the tail and deliver what can be delivered.

        :returns: ``False`` when the queue refused it (full, with ``x-overflow`` reject-publish
            or reject-publish-dlx), else ``True``
        """
        self.published += 1
        self._until_sample -= 1
        if not self._until_sample:
            self._until_sample = LATENCY_SAMPLE_EVERY
            return self._enqueue_sampled(message)
        if not self._plain or self._gone_in_ready or message.flags & FLAG_EXPIRATION:
            if self._spool_plain and not message.flags & FLAG_EXPIRATION:
                # Spooling, and nothing to check: straight behind the rest.
                entry = Entry(message, self)
                self._spool_entry(entry)
                return True
            return self._enqueue_checked(message)
        entry = Entry(message, self)
        consumers = self._consumers
        if consumers and not self._ready:
            # Nothing waiting: hand the entry to the next consumer that can take it. This is
            # _deliver_now inlined: one call less per message on the hot path.
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    consumer.channel.deliver_entries(consumer, (entry,))
                    return True
        ready = self._ready
        ready.append(entry)
        self.ready_bytes += message.size
        if self.ready_bytes > self.page_at:
            self.pager.watch(self)  # type: ignore[union-attr]
        if len(ready) >= self.spool_at:
            self._start_spool()
        return True

    def _enqueue_sampled(self, message: Message) -> bool:
        """Enqueue a message whose publish-to-deliver latency is measured (see :meth:`observe_latency`)."""
        if len(self.latency_samples) >= MAX_LATENCY_SAMPLES:
            # Sampled entries that left without a delivery (expired, purged, dropped) are never
            # observed; forget them rather than let the table grow.
            self.latency_samples.clear()
        return self._enqueue_checked(message, stamp=True)

    def observe_latency(self, entry: Entry) -> None:
        """A sampled entry is being delivered: report the seconds since it arrived."""
        stamped = self.latency_samples.pop(entry, None)
        if stamped is not None and self.observer is not None:
            self.observer.waited(self.now() - stamped)

    def _enqueue_checked(self, message: Message, stamp: bool = False) -> bool:
        settings = self.settings
        if settings.overflow is not Overflow.DROP_HEAD and self._full(extra=message.size):
            if self.journal is not None:
                self.journal.refused(self, message)
            if settings.overflow is Overflow.REJECT_PUBLISH_DLX:
                entry = Entry(message, self)
                entry.state = GONE
                self._dead_letter([entry], DeadLetterReason.MAXLEN)
            return False
        entry = Entry(message, self)
        if stamp:
            self.latency_samples[entry] = self.now()
        ttl = settings.message_ttl
        per_message = _expiration(message)
        if per_message is not None and (ttl is None or per_message < ttl):
            ttl, fifo = per_message, False
        else:
            fifo = True
        if ttl is not None:
            now = self.now()
            entry.expires_at = now + ttl
            if ttl <= 0 and not self._deliver_now(entry):
                # TTL 0: delivered straight away or not at all (RabbitMQ's rule).
                self.settle((entry,))
                self._dead_letter([entry], DeadLetterReason.EXPIRED)
                return True
            if entry.state == READY:
                if self.spool is not None:
                    self._spool_entry(entry)  # its expiry is looked at when it comes back
                else:
                    self._append_ready(entry)
                    if fifo:
                        self.deadlines.expire_in_order(entry, entry.expires_at)
                    else:
                        self.deadlines.push(entry.expires_at, _EXPIRY, entry)
        elif not self._deliver_now(entry):
            if self.spool is not None:
                self._spool_entry(entry)
            else:
                self._append_ready(entry)
        if settings.overflow is Overflow.DROP_HEAD and (settings.max_length is not None or self._track_bytes):
            self._drop_head_while_full()
        if self._consumers and self._ready:
            self.dispatch()
        return True

    def restore(self, message: Message, delivery_count: int, published_at: float) -> None:
        """Put back a message recovered from the log, at the tail, marked redelivered.

        Its TTL still counts from ``published_at``; one already past expires at the next tick.
        """
        entry = Entry(message, self)
        entry.redelivered = True
        entry.delivery_count = delivery_count
        if delivery_count:
            entry.header = with_delivery_count(message, delivery_count)
        ttl = self._ttl(message)
        if ttl is not None:
            entry.expires_at = published_at + ttl
        if self.spool is not None:
            self._spool_entry(entry)  # behind what is spooled; its expiry is looked at when it comes back
            return
        self._append_ready(entry)
        if entry.expires_at is not None:
            self.deadlines.push(entry.expires_at, _EXPIRY, entry)

    def _ttl(self, message: Message) -> float | None:
        """The TTL of ``message`` here: the queue's, or its own ``expiration`` when shorter."""
        ttl = self.settings.message_ttl
        per_message = _expiration(message)
        return per_message if per_message is not None and (ttl is None or per_message < ttl) else ttl

    def restore_spooled(self, item: StoredMessage) -> None:
        """Put back a message recovered from the log straight into the spool (the window is
        full): a record pointing at its ``Published`` record, with its TTL counted as
        :meth:`restore` counts it."""
        record = item.record
        header = record.header
        if header[12] & (FLAG_EXPIRATION >> 8):  # (the property flags' first octet)
            ttl = self._ttl(Message(record.exchange, record.routing_key, b"", header, b""))
        else:
            ttl = self.settings.message_ttl
        self.spool.push_record(  # type: ignore[union-attr]
            SpoolRecord(
                record.message_id,
                item.start,
                item.segment,
                item.end - item.start,
                len(record.body),
                item.delivery_count,
                REDELIVERED | IN_LOG,
                record.timestamp + ttl if ttl is not None else 0.0,
            )
        )

    def checkpoint(self, unacked: Sequence[Entry] = ()) -> QueueCheckpoint:
        """This durable queue's logged messages, in delivery order, as records pointing at the
        log (a checkpoint; see ``broker.storage.checkpoint``). Changes nothing.

        Messages that are not logged here (not persistent) are left out, as a restart from the
        log leaves them out. Every one is marked redelivered, as recovery marks it.

        :param unacked: its unacknowledged deliveries (they come back at a start, in their place)
        :raises CheckpointRefused: some unacknowledged ones are not in ``unacked`` (held by a
            plugin, say: only the log says what becomes of them), or a logged one's place in
            the log is not known
        """
        if len(unacked) != self.unacked_count:
            held = self.unacked_count - len(unacked)
            raise CheckpointRefused(f"queue {self.name!r} has {held} message(s) held by no channel")
        entries = [entry for entry in self._ready if entry.state == READY]
        if unacked:
            entries = sorted([*entries, *unacked], key=_seq)
        head = self._logged_records(entries)
        tail: list[SpoolRecord] = []
        spool = self.spool
        span, copies, span_bytes, span_refs = (0, 0), 0, 0, Counter[int]()
        if spool is not None:
            ahead, span, buffered, waiting = spool.checkpoint_parts()
            recorded = [record for record in [*ahead, *buffered] if record.flags & IN_LOG]
            head += [record for record in ahead if record.flags & IN_LOG]
            tail = [record for record in buffered if record.flags & IN_LOG]
            tail += self._logged_records(waiting)
            copies = spool.copies - (len(ahead) + len(buffered) - len(recorded))
            span_bytes = (
                spool.bytes
                - spool.copy_bytes
                - sum(record.size for record in recorded)
                - sum(entry.message.size for entry in waiting)
            )
            span_refs = +spool.refs
            span_refs.subtract(record.segment for record in recorded)
        removed, counts = spool.adopted_changes if spool is not None else (set(), {})
        return QueueCheckpoint(head, spool, span, copies, span_bytes, +span_refs, tail, set(removed), dict(counts))

    def _logged_records(self, entries: Iterable[Entry]) -> list[SpoolRecord]:
        """Those of ``entries`` logged here, as spool records pointing at their ``Published``
        records (plain tuples of a :class:`SpoolRecord`'s fields: a checkpoint makes one for
        every message in memory, on the reactor thread)."""
        name = self.name
        flags = IN_LOG | REDELIVERED
        records: list[Any] = []
        append = records.append
        for entry in entries:
            message = entry.message
            if not message.wal_id or name not in message.wal_queues:
                continue
            location = message.wal_location
            start = message.wal_start
            if location is None or not message.wal_segment or not start:
                raise CheckpointRefused(f"the place in the log of message {message.wal_id} is not known")
            size = message.size
            append(
                (
                    message.wal_id,
                    start,
                    message.wal_segment,
                    location[2] + size - start,
                    size,
                    entry.delivery_count,
                    flags,
                    entry.expires_at or 0.0,
                )
            )
        return records

    def adopt_spool(self, storage: Any, *adopted: Any) -> None:
        """Take ``storage`` (a checkpoint's records) as this empty queue's spool; they come into
        memory as it is consumed. ``adopted``: as :meth:`Spool.adopt` takes them."""
        assert self.spooler is not None and self.spool is None and not self._ready
        self.spool = self.spooler.spool(self, storage)
        self.spool.adopt(*adopted)
        self.spool_at = self.spooler.window
        self._refill_at = self.spool_at // 2
        self._update_plain()
        if self.pager is not None:
            self.pager.watch(self)  # it holds what arrives in memory while memory allows

    def restore_loaded(self, message: Message, record: SpoolRecord) -> None:
        """Put back at the tail a message a checkpoint's ``record`` described, read back as
        ``message`` (a queue that does not spool: it holds every message in memory)."""
        entry = self._unspooled(message, record)
        self._append_ready(entry)
        if entry.expires_at is not None:
            self.deadlines.push(entry.expires_at, _EXPIRY, entry)

    def _deliver_now(self, entry: Entry) -> bool:
        """Deliver ``entry`` at once, to the next consumer in turn, if nothing is waiting and one can take it."""
        consumers = self._consumers
        if consumers and not self.message_count:
            if self._levels is not None:
                consumer = self._next_consumer()
                if consumer is None:
                    return False
                consumer.channel.deliver_entries(consumer, (entry,))
                return True
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    consumer.channel.deliver_entries(consumer, (entry,))
                    return True
        return False

    def _append_ready(self, entry: Entry) -> None:
        ready = self._ready
        ready.append(entry)
        self.ready_bytes += entry.message.size
        if self.ready_bytes > self.page_at:
            self.pager.watch(self)  # type: ignore[union-attr]
        if len(ready) >= self.spool_at:
            self._start_spool()

    # -- the spool ----------------------------------------------------------------------------

    def attach_spooler(self, spooler: SpoolMaker) -> None:
        """Let this queue spool what arrives once ``spooler.window`` ready entries are in memory
        and its pager finds memory short, or at once without a pager (not a priority queue: its
        levels are kept in memory)."""
        if self.max_priority is not None:
            return
        self.spooler = spooler
        self.spool_at = spooler.window
        self._refill_at = spooler.window // 2
        if len(self._ready) >= self.spool_at:
            self._start_spool()

    def _start_spool(self) -> None:
        """The window is full: spool what arrives if the pager says memory is short (or
        there is no pager); else go on in memory, and ask again at the count it names."""
        if self.spool is not None or self.spooler is None:
            return
        if self.pager is not None:
            again = self.pager.spool_now(self)
            if again:
                self.spool_at = again
                return
        self.spool_behind(self.spooler.window)

    def spool_behind(self, keep: int) -> None:
        """Spool what arrives from now on, behind the ready entries in memory (they stay: moving
        them would hold the reactor for as long as they take to record), until the spool is
        empty again (or :meth:`Spool.hold` keeps arrivals in memory); the spool refills the
        window once fewer than ``keep / 2`` are ready."""
        assert self.spooler is not None and not isinstance(self._ready, _PriorityReady)
        self.spool_at = keep
        self._refill_at = keep // 2
        if self.spool is None:
            self.spool = self.spooler.spool(self)
            self._update_plain()
        else:
            self.spool.resume()

    def hold_spool(self) -> None:
        """Memory is not short: what arrives waits in memory behind the spool's records, and
        once those are read back the queue is all in memory again (see :meth:`_refill`)."""
        if self.spool is not None:
            self.spool.hold()

    @property
    def memory_use(self) -> tuple[int, int]:
        """Ready messages in memory (in the window and waiting behind the spool) and their body
        bytes in memory."""
        count = len(self._ready) - self._gone_in_ready
        size = self.ready_bytes - self.paged_bytes
        spool = self.spool
        if spool is not None:
            count += len(spool.waiting)
            size += spool.waiting_bytes
        return count, size

    def _spool_entry(self, entry: Entry) -> None:
        message = entry.message
        journal = self.journal
        if journal is not None and message.wal_id and self.name in message.wal_queues:
            position = journal.position  # its Published record ends there at most
        else:
            position = 0
        self.spool.push(entry, position)  # type: ignore[union-attr]

    def _refill(self) -> int:
        """Bring spooled messages back into memory up to the window; returns how many came."""
        spool = self.spool
        if spool is None:
            return 0
        # Held in memory with no record left: all of it comes back, and the spool goes.
        count = spool.count if not spool.recording and not spool.recorded_count else self.spool_at - len(self._ready)
        try:
            entries = spool.take(count, self._unspooled)
        except OSError as error:
            self.spool_failed(error, READ_BACK, "they stay spooled")
            return 0
        ready = self._ready
        for entry in entries:
            # In spool order, after everything in memory (a return finds its place by it).
            self.seq += 1
            entry.seq = self.seq
            ready.append(entry)
            self.ready_bytes += entry.message.size
            if entry.expires_at is not None:
                self.deadlines.push(entry.expires_at, _EXPIRY, entry)
        if not spool.count:
            spool.close()
            self.spool = None
            self._update_plain()
            if self.ready_bytes > self.page_at:
                self.pager.watch(self)  # type: ignore[union-attr]
        return len(entries)

    def spool_failed(self, error: OSError, doing: str, then: str) -> None:
        """Spooling failed while ``doing`` (:data:`WRITE`, :data:`READ_BACK`), with the
        consequence ``then``: tell the shell."""
        if self.pager is not None:
            self.pager.spool_failed(self, error, doing, then)

    def _unspooled(self, message: Message, record: SpoolRecord) -> Entry:
        entry = Entry(message, self)
        entry.redelivered = bool(record.flags & REDELIVERED)
        entry.delivery_count = count = record.delivery_count
        if count:
            entry.header = with_delivery_count(message, count)
        if record.expires_at:
            entry.expires_at = record.expires_at
        return entry

    def _full(self, extra: int = 0) -> bool:
        settings = self.settings
        if settings.max_length is not None and self.message_count >= settings.max_length:
            return True
        return settings.max_length_bytes is not None and self.queued_bytes + extra > settings.max_length_bytes

    def _over(self) -> bool:
        settings = self.settings
        if settings.max_length is not None and self.message_count > settings.max_length:
            return True
        return settings.max_length_bytes is not None and self.queued_bytes > settings.max_length_bytes

    def _drop_head_while_full(self) -> None:
        dropped = []
        while self._over():
            entry = self._pop_ready()
            if entry is None:
                break
            dropped.append(entry)
        if dropped:
            self.settle(dropped)
            self._dead_letter(dropped, DeadLetterReason.MAXLEN)

    def _pop_ready(self) -> Entry | None:
        """The next live ready entry, skipping expired ones; ``None`` when there is none."""
        ready = self._ready
        while ready or (self.spool is not None and self._refill()):
            entry = ready.popleft()
            if entry.state != READY:
                self._gone_in_ready -= 1
                continue
            self.ready_bytes -= entry.message.size
            if entry.paged:
                entry.paged = False
                self.paged_bytes -= entry.message.size
            return entry
        return None

    def return_entries(self, entries: Iterable[Entry]) -> None:
        """Take back entries that were delivered and not acked: each counts as a return.

        Entries past ``x-delivery-limit`` are dead-lettered (reason ``delivery_limit``), or
        dropped without a dead-letter exchange; expired ones are dead-lettered as ``expired``;
        the rest go back to the head in the given order, marked redelivered.

        :param entries: entries of this queue, oldest delivery first
        """
        if self.deleted:  # nowhere to go back to: they are gone for good
            self.settle(list(entries))
            return
        limit = self.settings.delivery_limit
        now = self.now() if self.clock is not None else 0.0
        back: list[Entry] = []
        over: list[Entry] = []
        expired: list[Entry] = []
        for entry in entries:
            entry.delivery_count += 1
            if entry.deadline is not None:
                entry.deadline = None
                self.deadlines.stale += 1
            entry.consumer = None
            entry.channel = None
            if limit is not None and entry.delivery_count > limit:
                entry.state = GONE
                over.append(entry)
            elif entry.expires_at is not None and entry.expires_at <= now:
                entry.state = GONE
                expired.append(entry)
            else:
                entry.state = READY
                entry.redelivered = True
                entry.header = with_delivery_count(entry.message, entry.delivery_count)
                back.append(entry)
        if back:
            ready = self._ready
            if type(ready) is _PriorityReady:
                ready.put_back(back)
            else:
                _put_back(ready, back)  # type: ignore[arg-type]
            self.ready_bytes += sum(entry.message.size for entry in back)
        self.redelivered += len(back)
        journal = self.journal
        if journal is not None:
            for entry in back:
                journal.delivery_counted(self, entry)
            if over or expired:
                journal.removed(self, over + expired)
        if over:
            self._dead_letter(over, DeadLetterReason.DELIVERY_LIMIT)
        if expired:
            self._dead_letter(expired, DeadLetterReason.EXPIRED)
        if back and self.settings.overflow is Overflow.DROP_HEAD:
            self._drop_head_while_full()
        if self._consumers:
            self.dispatch()

    def settle(self, entries: Iterable[Entry]) -> None:
        """Entries were acked (or delivered without ack, or dropped): they are gone for good."""
        for entry in entries:
            entry.state = GONE
            if entry.deadline is not None:
                entry.deadline = None
                self.deadlines.stale += 1
        if self.deadlines.stale > COMPACT_AFTER:
            self.deadlines.compact()
        if self.dead_letter_watch is not None:
            self.dead_letter_watch.settled(self, entries)
        if self.journal is not None:
            if self.deleted:  # QueueDeleted already says it: no record, only accounting
                self.journal.forget(entries)
            else:
                self.journal.removed(self, entries)

    def reject(self, entries: list[Entry]) -> None:
        """Nack/reject without requeue: dead-letter (reason ``rejected``) or drop."""
        self.settle(entries)
        if not self.deleted:
            self._dead_letter(entries, DeadLetterReason.REJECTED)

    def _dead_letter(self, entries: list[Entry], reason: DeadLetterReason) -> None:
        self.dead_lettered[reason] = self.dead_lettered.get(reason, 0) + len(entries)
        if self.observer is not None and self.settings.dead_letter_exchange is not None:
            self.observer.dead_letter(self, entries, reason)

    def get(self) -> Entry | None:
        """Take the next ready entry for ``basic.get``, or ``None`` if there is none."""
        self.touch()
        if self.spool is not None and len(self._ready) < self._refill_at:
            self._refill()
        if self._gone_in_ready or self.paged_bytes:
            return self._pop_ready()
        if not self._ready:
            return None
        entry = self._ready.popleft()
        self.ready_bytes -= entry.message.size
        return entry

    def purge(self) -> int:
        """Drop every ready message; return how many (unacked ones stay, as in RabbitMQ)."""
        count = self.message_count
        self.settle([entry for entry in self._ready if entry.state == READY])
        self._ready.clear()
        self._gone_in_ready = 0
        self.ready_bytes = self.paged_bytes = 0
        spool = self.spool
        if spool is not None:
            if self.dead_letter_watch is not None:
                # Dead letters: the event log knows them by their headers, so they are read back.
                self._settle_spooled(spool)
            try:
                records = spool.drain_records()  # (what could not be read goes without its events)
            except OSError as error:
                self.spool_failed(error, READ_BACK, "they are dropped (their files go at the next start)")
                records = []
            if self.journal is not None:
                self.journal.spool_removed(self, records)
            self.spool = None
            self._update_plain()
            self.settle(spool.close())
        return count

    def _settle_spooled(self, spool: Spool) -> None:
        """Read every record back and settle it, until one cannot be read."""
        while spool.recorded_count:
            try:
                entries = spool.take(min(spool.recorded_count, 4 * self.spool_at), self._unspooled)
            except OSError as error:
                self.spool_failed(error, READ_BACK, "they go without their dead-letter events")
                return
            self.settle(entries)

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Add a consumer at the end of the round-robin order of its priority and deliver to it.

        With ``x-single-active-consumer``, a consumer added while another is active waits.
        """
        self.touch()
        if self.settings.single_active_consumer and self._consumers:
            self._waiting.append(consumer)
            return
        consumers = self._consumers
        consumers.append(consumer)
        levels = self._levels
        if levels is not None:
            _join_level(levels, consumer)
        elif consumer.priority != consumers[0].priority:
            self._levels = levels = []
            for each in consumers:
                _join_level(levels, each)
            self._update_plain()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Remove a consumer (its unacked deliveries stay with its channel). With
        ``x-single-active-consumer``, when the active one goes the waiting one of the highest
        priority (the first subscribed among equals) becomes active and is delivered to at
        once, ready messages included (RabbitMQ 3.10.8 stalls there, see docs/rabbitmq-compatibility.md)."""
        try:
            self._consumers.remove(consumer)
        except ValueError:  # a waiting one (or one already gone): nothing else changes
            if consumer in self._waiting:
                self._waiting.remove(consumer)
            return
        levels = self._levels
        if levels is not None:
            for level in levels:
                if consumer in level:
                    level.remove(consumer)
                    if not level:
                        levels.remove(level)
                    break
            if len(levels) == 1:  # equal priorities again: back to the plain round robin
                self._consumers = levels[0]
                self._levels = None
                self._update_plain()
        waiting = self._waiting
        if waiting and not self._consumers:
            # RabbitMQ's choice: the highest priority waiting, the first registered among equals.
            successor = max(waiting, key=lambda each: each.priority)
            waiting.remove(successor)
            self._consumers.append(successor)
            self.dispatch()
        if not self._consumers:
            self.touch()

    def _next_consumer(self) -> Consumer | None:
        """While priorities differ: the next consumer in turn, of the highest priority, that can
        take a delivery (it goes to the end of its level, as in RabbitMQ); ``None`` if none can."""
        for level in self._levels:  # type: ignore[union-attr]
            for _ in range(len(level)):
                consumer = level[0]
                level.rotate(-1)
                if consumer.can_accept():
                    return consumer
        return None

    def has_exclusive_consumer(self) -> bool:
        """Whether a consumer holds the queue exclusively."""
        return any(consumer.exclusive for consumer in self.consumers)

    def touch(self) -> None:
        """The queue was used (consume, get, declare): restart its ``x-expires`` idle time."""
        expires = self.settings.expires
        if expires is not None:
            self._last_used = self.now()
            self.deadlines.arm(self._last_used + expires)

    def dispatch(self) -> None:
        """Deliver ready entries to consumers that can take them, in round-robin order.

        With one consumer, its whole credit goes out as one batch. With several, each
        delivery goes to the next consumer in turn that can accept; a full consumer is skipped
        and keeps its place. At most :data:`DISPATCH_BATCH` deliveries are made per call; when
        entries remain after that, :attr:`observer` is told of the backlog, so the rest is dispatched later.
        """
        if self.spool is None:
            self._dispatch_window()
            return
        # Spooling: refill the window as it empties, until the consumers are full, the spool
        # is empty or a batch's worth went out.
        delivered = 0
        while self._consumers and delivered < DISPATCH_BATCH:
            if self.spool is not None and len(self._ready) < self._refill_at:
                self._refill()
            before = len(self._ready)
            if not before:
                return
            self._dispatch_window()
            if len(self._ready) == before:
                return
            delivered += before - len(self._ready)
        if delivered >= DISPATCH_BATCH and self.message_count and self.observer is not None:
            self.observer.backlog(self)

    def _dispatch_window(self) -> None:
        """:meth:`dispatch` over the ready entries in memory."""
        ready = self._ready
        consumers = self._consumers
        if not ready or not consumers:
            return
        slow = self._gone_in_ready or self.paged_bytes
        if len(consumers) == 1:
            consumer = consumers[0]
            count = min(consumer.credit(), len(ready))
            if count <= 0:
                return
            if slow:
                batch: list[Entry] = []
                while len(batch) < count:
                    entry = self._pop_ready()
                    if entry is None:
                        break
                    batch.append(entry)
                if not batch:
                    return
            else:
                popleft = ready.popleft
                batch = [popleft() for _ in range(count)]
                self.ready_bytes -= sum([entry.message.size for entry in batch])
            consumer.channel.deliver_entries(consumer, batch)
            delivered = len(batch)
        else:
            delivered = 0
            levels = self._levels
            while ready and delivered < DISPATCH_BATCH:
                if levels is not None:
                    consumer = self._next_consumer()  # type: ignore[assignment]
                    if consumer is None:
                        return
                else:
                    for _ in range(len(consumers)):
                        consumer = consumers[0]
                        consumers.rotate(-1)
                        if consumer.can_accept():
                            break
                    else:
                        return
                if slow:
                    entry = self._pop_ready()
                    if entry is None:
                        return
                else:
                    entry = ready.popleft()
                    self.ready_bytes -= entry.message.size
                consumer.channel.deliver_entries(consumer, (entry,))
                delivered += 1
        if ready and delivered >= DISPATCH_BATCH and self.observer is not None:
            self.observer.backlog(self)

    # -- timers -------------------------------------------------------------------------------

    def track_delivery(self, entry: Entry, deadline: float, timeout: float) -> None:
        """Start the visibility timeout of a delivery (the channel calls this as it delivers)."""
        self.deadlines.track_delivery(entry, deadline, timeout)

    def extend(self, entry: Entry, seconds: float) -> None:
        """Move a delivery's visibility deadline to ``seconds`` from now (``amq.postroom.extend``)."""
        deadline = self.now() + seconds
        entry.deadline = deadline
        self.deadlines.push(deadline, _TAKEBACK, entry)

    def _next_deadline(self) -> float | None:
        deadline = self.deadlines.next_deadline()
        if self.settings.expires is not None and not self._consumers:
            unused = self._last_used + self.settings.expires
            return unused if deadline is None else min(deadline, unused)
        return deadline

    def cancel_timers(self) -> None:
        """Stop this queue's timer (the queue is being deleted)."""
        self.deadlines.cancel()

    def deadlines_passed(self) -> None:
        """The timer went off: expire what expired, take back what ran out of visibility time,
        delete the queue if ``x-expires`` found it unused, and arm the timer again."""
        deadlines = self.deadlines
        deadlines.timer = None
        if self.deleted:
            return
        now = self.now()
        taken, expired = deadlines.due(now)
        if expired:
            for entry in expired:
                self.ready_bytes -= entry.message.size
                if entry.paged:
                    entry.paged = False
                    self.paged_bytes -= entry.message.size
            self.settle(expired)
            self._gone_in_ready += len(expired)
            self._dead_letter(expired, DeadLetterReason.EXPIRED)
            if self._gone_in_ready == len(self._ready):
                self._ready.clear()
                self._gone_in_ready = 0
            if self.spool is not None and len(self._ready) - self._gone_in_ready < self._refill_at:
                self._refill()  # the spooled messages' expiries are looked at as they come back
        if taken:
            self.visibility_timeouts += len(taken)
            taken.sort(key=lambda entry: entry.deadline or 0.0)
            returned = []
            consumers = self._consumers
            for entry in taken:
                channel = entry.channel
                if channel is None or channel.take_back(entry):
                    returned.append(entry)
                    holder = entry.consumer
                    if holder is not None and len(consumers) > 1 and holder in consumers:
                        # The next consumer in turn gets it: the one that timed out goes last.
                        consumers.remove(holder)
                        consumers.append(holder)
                else:
                    # Acked inside an open transaction: look again once it has committed or not.
                    entry.deadline = now + TIMER_SLACK
                    deadlines.push(entry.deadline, _TAKEBACK, entry)
            self.return_entries(returned)
        expires = self.settings.expires
        if expires is not None and not self._consumers and now >= self._last_used + expires:
            if self.observer is not None:
                self.observer.expired(self)
            return
        next_deadline = self._next_deadline()
        if next_deadline is not None and not self.deleted:
            deadlines.arm(max(next_deadline, now + TIMER_SLACK))

    def __repr__(self) -> str:
        return f"<WorkQueue {self.name!r} ready={self.message_count} unacked={self.unacked_count}>"


_TAKEBACK = 0
_EXPIRY = 1


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


def _expiration(message: Message) -> float | None:
    """The per-message TTL in seconds from the ``expiration`` property, or ``None``."""
    if not message.flags & FLAG_EXPIRATION:
        return None
    value = message.expiration
    try:
        milliseconds = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return max(milliseconds, 0) / 1000.0

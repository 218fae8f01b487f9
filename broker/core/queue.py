"""Work queues: ready messages, competing consumers, prefetch, and the reliability rules.

A queue holds :class:`~broker.core.entry.Entry` objects (a message plus this queue's delivery
state for it: one message routed to three queues has three entries). Unacknowledged entries
are held by the channel that received them, keyed by delivery tag; the queue only counts them.

A :class:`WorkQueue` has three parts, each in its module: its ready line (``broker.core.ready``:
the window in memory, the spool behind it, the paging marks), its delivery
(``broker.core.delivery``: consumers, turns, dispatch) and its deadlines
(``broker.core.timers``: one timer for visibility timeouts, TTLs and ``x-expires``). What
becomes of a message is the queue's own, by these rules (``docs/configuration.md``):

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
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from postroom.broker.core.dead_lettering import DeadLetterReason, with_delivery_count
from postroom.broker.core.delivery import Delivery
from postroom.broker.core.entry import DISPATCH_BATCH, GONE, READY, Consumer, Entry, QueueObserver
from postroom.broker.core.entry_spool import IN_LOG, REDELIVERED, Spool, SpoolRecord
from postroom.broker.core.message import Message
from postroom.broker.core.ready import READ_BACK, ReadyLine
from postroom.broker.core.recording import QueueJournal
from postroom.broker.core.settings import Overflow, QueueSettings
from postroom.broker.core.timers import COMPACT_AFTER, EXPIRY, TAKEBACK, TIMER_SLACK, Deadlines, Scheduler
from postroom.broker.wire.codec import FLAG_EXPIRATION

if TYPE_CHECKING:
    from postroom.broker.core.exchange import Exchange
    from postroom.broker.wal.recovery import StoredMessage

#: RabbitMQ's largest x-max-priority; each level is one deque, so the cap bounds memory per queue.
MAX_PRIORITY = 255

#: One message in this many per queue has its publish-to-deliver latency measured: a
#: histogram of samples shows the shape without a clock reading for every message.
LATENCY_SAMPLE_EVERY = 1024

#: Sampled entries waiting for their delivery, per queue, before the table is cleared.
MAX_LATENCY_SAMPLES = 64


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


class DeadLetterWatch(Protocol):
    """What records dead letters leaving a queue that holds some (``broker.core.dead_letter_events.DeadLetterLog``)."""

    def spooled(self, queue: WorkQueue, entries: Iterable[Entry]) -> None:
        """``entries`` are about to be spooled."""

    def settled(self, queue: WorkQueue, entries: Iterable[Entry]) -> None:
        """``entries`` left ``queue`` for good."""


class WorkQueue:
    """A named queue with competing consumers and the reliability rules of its settings.

    Its parts: :attr:`ready` (the ready line: window, spool, paging marks), :attr:`delivery`
    (consumers, turns and dispatch) and :attr:`deadlines` (timers). The queue decides what
    happens to a message: where it goes when it arrives or comes back, when it expires, is
    dropped or dead-lettered.

    :param name: the queue name, unique in its virtual host
    :param owner: the connection that owns an exclusive queue, else ``None``
    :param settings: TTLs, limits, dead-lettering, visibility timeout, priorities
    :param clock: time and timers (needed when any setting has a duration)
    """

    #: Its kind, as ``x-queue-type`` names it (quorum declarations get one too).
    kind = "classic"

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
        #: The last :attr:`Entry.seq` given out: the ready line is kept in this order, so a returned
        #: message goes back to its place (RabbitMQ's classic queues), whatever the return order.
        self.seq = 0
        #: The ready messages, and the consumers they go to.
        self.ready: ReadyLine[WorkQueue] = ReadyLine(self, settings.max_priority)
        self.delivery = Delivery()
        # The hot path's handles on both (the same objects for the queue's whole life).
        self._window = self.ready.entries
        self._ring = self.delivery.ring
        self._track_bytes = settings.max_length_bytes is not None
        #: Enqueue can take the short path: no TTL, no length limit, consumers of one priority.
        self._plain = True
        #: The same while spooling: what arrives goes straight to the spool.
        self._spool_plain = False
        self.update_plain()
        self.unacked_count = 0
        self.deleted = False
        #: Exchanges with a binding to this queue, so deleting the queue can remove them.
        self.sources: set[Exchange] = set()
        #: Told of backlogs, dead letters, expiry and latency (the vhost); ``None``: nobody.
        self.observer: QueueObserver | None = None
        #: The write-ahead log's journal, for a durable queue on a broker with a log; else ``None``.
        self.journal: QueueJournal | None = None
        #: Told of entries spooled and settled, on queues that hold dead letters (the dead-letter
        #: event log records them); ``None`` elsewhere, so other queues pay nothing.
        self.dead_letter_watch: DeadLetterWatch | None = None
        #: Visibility timeouts, TTLs and expirations, and the timer armed at the earliest.
        self.deadlines = Deadlines(clock, self.deadlines_passed)
        self._last_used = clock.seconds() if clock is not None else 0.0
        # Counters, read by metrics at scrape time (one integer add per message, no callbacks).
        self.published = 0
        self.delivered = 0
        #: Of those deliveries: to consumers without acks, and by ``basic.get`` with and
        #: without acks; and the gets that found the queue empty.
        self.delivered_no_ack = self.got = self.got_no_ack = self.got_empty = 0
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
        self.update_plain()
        if settings.overflow is Overflow.DROP_HEAD and (settings.max_length is not None or self._track_bytes):
            self._drop_head_while_full()
        self.touch()

    def update_plain(self) -> None:
        """Settings, the spool or consumers' priorities changed: say again which path enqueue takes."""
        settings = self.settings
        plain = (
            settings.message_ttl is None
            and settings.max_length is None
            and not self._track_bytes
            and self.delivery.levels is None
        )
        spooling = self.ready.spool is not None
        self._plain = plain and not spooling
        self._spool_plain = plain and spooling

    @property
    def exclusive(self) -> bool:
        """Whether the queue belongs to one connection."""
        return self.owner is not None

    @property
    def message_count(self) -> int:
        """Ready messages (as ``queue.declare-ok`` reports them: unacked ones are not counted)."""
        return self.ready.count

    @property
    def queued_bytes(self) -> int:
        """Body bytes of the ready messages, spooled ones included (``x-max-length-bytes``)."""
        return self.ready.queued_bytes

    @property
    def memory_use(self) -> tuple[int, int]:
        """Ready messages in memory and their body bytes in memory (see :attr:`ReadyLine.memory_use`)."""
        return self.ready.memory_use

    @property
    def consumer_count(self) -> int:
        """Consumers (with a single active consumer: the waiting ones too, as RabbitMQ counts)."""
        return self.delivery.count

    @property
    def consumers(self) -> Iterable[Consumer]:
        """The consumers, next in turn first (the active one, then those waiting)."""
        return self.delivery.consumers

    @property
    def active_consumer(self) -> Consumer | None:
        """With ``x-single-active-consumer``: the one consumer deliveries go to (else ``None``)."""
        ring = self._ring
        return ring[0] if self.settings.single_active_consumer and ring else None

    def ready_entries(self) -> list[Entry]:
        """The ready entries in memory, next to be delivered first."""
        return self.ready.live()

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
        if not self._plain or self.ready.gone or message.flags & FLAG_EXPIRATION:
            if self._spool_plain and not message.flags & FLAG_EXPIRATION:
                # Spooling, and nothing to check: straight behind the rest.
                self.ready.spool_entry(Entry(message, self))
                return True
            return self._enqueue_checked(message)
        entry = Entry(message, self)
        consumers = self._ring
        if consumers and not self._window:
            # Nothing waiting: hand the entry to the next consumer that can take it (one
            # priority: Delivery.deliver_one's round robin, inlined on the hot path).
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.can_accept():
                    consumer.channel.deliver_entries(consumer, (entry,))
                    return True
        self.ready.append(entry)
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
        ready = self.ready
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
                if ready.spool is not None:
                    ready.spool_entry(entry)  # its expiry is looked at when it comes back
                else:
                    ready.append(entry)
                    if fifo:
                        self.deadlines.expire_in_order(entry, entry.expires_at)
                    else:
                        self.deadlines.push(entry.expires_at, EXPIRY, entry)
        elif not self._deliver_now(entry):
            if ready.spool is not None:
                ready.spool_entry(entry)
            else:
                ready.append(entry)
        if settings.overflow is Overflow.DROP_HEAD and (settings.max_length is not None or self._track_bytes):
            self._drop_head_while_full()
        if self._ring and self._window:
            self.dispatch()
        return True

    def _deliver_now(self, entry: Entry) -> bool:
        """Deliver ``entry`` at once, to the next consumer in turn, if nothing is waiting and one can take it."""
        return bool(self._ring) and not self.message_count and self.delivery.deliver_one(entry)

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
        if self.ready.spool is not None:
            self.ready.spool_entry(entry)  # behind what is spooled; its expiry is looked at when it comes back
            return
        self.ready.append(entry)
        if entry.expires_at is not None:
            self.deadlines.push(entry.expires_at, EXPIRY, entry)

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
        self.ready.spool.push_record(  # type: ignore[union-attr]
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

    def restore_loaded(self, message: Message, record: SpoolRecord) -> None:
        """Put back at the tail a message a checkpoint's ``record`` described, read back as
        ``message`` (a queue that does not spool: it holds every message in memory)."""
        entry = self.ready.unspooled(message, record)
        self.ready.append(entry)
        if entry.expires_at is not None:
            self.deadlines.push(entry.expires_at, EXPIRY, entry)

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
        entries = self.ready.live()
        if unacked:
            entries = sorted([*entries, *unacked], key=operator.attrgetter("seq"))
        head = self._logged_records(entries)
        tail: list[SpoolRecord] = []
        spool = self.ready.spool
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
            entry = self.ready.pop()
            if entry is None:
                break
            dropped.append(entry)
        if dropped:
            self.settle(dropped)
            self._dead_letter(dropped, DeadLetterReason.MAXLEN)

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
            self.ready.put_back(back)
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
        if self._ring:
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
        ready = self.ready
        if ready.spool is not None and len(self._window) < ready.refill_at:
            ready.refill()
        return ready.pop()

    def purge(self) -> int:
        """Drop every ready message; return how many (unacked ones stay, as in RabbitMQ)."""
        count = self.message_count
        ready = self.ready
        self.settle(ready.clear())
        spool = ready.drop_spool()
        if spool is not None:
            if self.dead_letter_watch is not None:
                # Dead letters: the event log knows them by their headers, so they are read back.
                self._settle_spooled(spool)
            try:
                records = spool.drain_records()  # (what could not be read goes without its events)
            except OSError as error:
                ready.spool_failed(error, READ_BACK, "they are dropped (their files go at the next start)")
                records = []
            if self.journal is not None:
                self.journal.spool_removed(self, records)
            self.settle(spool.close())
        return count

    def _settle_spooled(self, spool: Spool) -> None:
        """Read every record back and settle it, until one cannot be read."""
        ready = self.ready
        while spool.recorded_count:
            try:
                entries = spool.take(min(spool.recorded_count, 4 * ready.spool_at), ready.unspooled)
            except OSError as error:
                ready.spool_failed(error, READ_BACK, "they go without their dead-letter events")
                return
            self.settle(entries)

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Add a consumer at the end of the round-robin order of its priority and deliver to it.

        With ``x-single-active-consumer``, a consumer added while another is active waits.
        """
        self.touch()
        if self.delivery.add(consumer, self.settings.single_active_consumer):
            self.update_plain()
            self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Remove a consumer (its unacked deliveries stay with its channel). With
        ``x-single-active-consumer``, when the active one goes the waiting one of the highest
        priority (the first subscribed among equals) becomes active and is delivered to at
        once, ready messages included (RabbitMQ 3.10.8 stalls there, see docs/rabbitmq-compatibility.md)."""
        ring = self._ring
        if consumer not in ring:  # a waiting one (or one already gone): nothing else changes
            self.delivery.remove(consumer)
            return
        promoted = self.delivery.remove(consumer)
        self.update_plain()
        if promoted:
            self.dispatch()
        if not ring:
            self.touch()

    def has_exclusive_consumer(self) -> bool:
        """Whether a consumer holds the queue exclusively."""
        return self.delivery.has_exclusive()

    def touch(self) -> None:
        """The queue was used (consume, get, declare): restart its ``x-expires`` idle time."""
        expires = self.settings.expires
        if expires is not None:
            self._last_used = self.now()
            self.deadlines.arm(self._last_used + expires)

    def dispatch(self) -> None:
        """Deliver ready entries to consumers that can take them (see ``broker.core.delivery``).

        At most :data:`DISPATCH_BATCH` deliveries are made per call; when entries remain after
        that, :attr:`observer` is told of the backlog, so the rest is dispatched later.
        """
        ready = self.ready
        if ready.spool is None:
            if self.delivery.dispatch(ready) >= DISPATCH_BATCH and self._window and self.observer is not None:
                self.observer.backlog(self)
            return
        # Spooling: refill the window as it empties, until the consumers are full, the spool
        # is empty or a batch's worth went out.
        window = self._window
        delivered = 0
        while self._ring and delivered < DISPATCH_BATCH:
            if ready.spool is not None and len(window) < ready.refill_at:
                ready.refill()
            before = len(window)
            if not before:
                return
            self.delivery.dispatch(ready)
            if len(window) == before:
                return
            delivered += before - len(window)
        if delivered >= DISPATCH_BATCH and self.message_count and self.observer is not None:
            self.observer.backlog(self)

    # -- timers -------------------------------------------------------------------------------

    def track_delivery(self, entry: Entry, deadline: float, timeout: float) -> None:
        """Start the visibility timeout of a delivery (the channel calls this as it delivers)."""
        self.deadlines.track_delivery(entry, deadline, timeout)

    def extend(self, entry: Entry, seconds: float) -> None:
        """Move a delivery's visibility deadline to ``seconds`` from now (``amq.postroom.extend``)."""
        deadline = self.now() + seconds
        entry.deadline = deadline
        self.deadlines.push(deadline, TAKEBACK, entry)

    def _next_deadline(self) -> float | None:
        deadline = self.deadlines.next_deadline()
        if self.settings.expires is not None and not self._ring:
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
            self.settle(expired)
            self.ready.expired(expired)
            self._dead_letter(expired, DeadLetterReason.EXPIRED)
        if taken:
            self.visibility_timeouts += len(taken)
            taken.sort(key=lambda entry: entry.deadline or 0.0)
            returned = []
            for entry in taken:
                channel = entry.channel
                if channel is None or channel.take_back(entry):
                    returned.append(entry)
                    holder = entry.consumer
                    if holder is not None:
                        # The next consumer in turn gets it: the one that timed out goes last.
                        self.delivery.last_in_turn(holder)
                else:
                    # Acked inside an open transaction: look again once it has committed or not.
                    entry.deadline = now + TIMER_SLACK
                    deadlines.push(entry.deadline, TAKEBACK, entry)
            self.return_entries(returned)
        expires = self.settings.expires
        if expires is not None and not self._ring and now >= self._last_used + expires:
            if self.observer is not None:
                self.observer.expired(self)
            return
        next_deadline = self._next_deadline()
        if next_deadline is not None and not self.deleted:
            deadlines.arm(max(next_deadline, now + TIMER_SLACK))

    def __repr__(self) -> str:
        return f"<WorkQueue {self.name!r} ready={self.message_count} unacked={self.unacked_count}>"


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

"""What a queue holds and whom it delivers to: an :class:`Entry` per message in one queue (the
message and that queue's delivery state for it), a :class:`Consumer` per ``basic.consume``,
and :class:`Queue`, what every kind of queue is to them and to the rest of the broker.

Entries and consumers are plain slotted records on the hot path; the queue
(``broker.core.queue``), its ready line (``broker.core.ready``) and its delivery
(``broker.core.delivery``) change them. Both kinds of queue, work queues
(``broker.core.queue.WorkQueue``) and streams (``broker.core.stream.StreamQueue``), are a
:class:`Queue`; code that needs one kind's own parts asks for that kind by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from postroom.broker.core.dead_lettering import DeadLetterReason
from postroom.broker.core.message import Message
from postroom.broker.core.settings import QueueSettings

#: Most deliveries one dispatch makes before yielding. A consumer without a prefetch limit
#: (or with no_ack) on a long queue would otherwise have the whole queue written into its
#: output buffer at once; in batches, the socket's back-pressure pauses it in between.
DISPATCH_BATCH = 2000

# Entry states.
READY = 0  # in the ready list (or about to be)
UNACKED = 1  # delivered, waiting for an ack
GONE = 2  # acked, dead-lettered, expired or dropped


class DeliverySink(Protocol):
    """What a consumer delivers to: the channel that registered it."""

    active: bool
    prefetch_global: int
    unacked_count: int

    def deliver_entries(self, consumer: Consumer, entries: Sequence[Entry]) -> None:
        """Send ``entries`` to ``consumer`` (a ``basic.deliver`` and the content for each)."""

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """``consumer``'s queue is gone: tell the client (``basic.cancel``) and forget it."""

    def take_back(self, entry: Entry) -> bool:
        """Forget an unacked delivery whose visibility timeout passed (its tag becomes stale).

        :returns: ``False`` when the channel no longer holds it (acked in an open transaction).
        """


class QueueObserver(Protocol):
    """What a queue tells the one that holds it (``broker.core.vhost.VirtualHost``)."""

    def backlog(self, queue: Queue) -> None:
        """A dispatch stopped at its batch limit with entries left to deliver: dispatch later."""

    def dead_letter(self, queue: Queue, entries: list[Entry], reason: DeadLetterReason) -> None:
        """``entries`` are dead-lettered (publish them to the queue's dead-letter exchange)."""

    def expired(self, queue: Queue) -> None:
        """``x-expires`` found ``queue`` unused: delete it."""

    def waited(self, seconds: float) -> None:
        """A sampled message waited ``seconds`` from its arrival to its delivery."""


class Queue(Protocol):
    """A queue of either kind, as its entries, its consumers, its virtual host, the journal,
    the dead-letter log and the channels see it."""

    #: Its kind, as ``x-queue-type`` names it (``classic``, ``quorum``, ``stream``).
    kind: str
    name: str
    vhost_name: str
    durable: bool
    auto_delete: bool
    owner: object | None
    arguments: dict[str, Any]
    settings: QueueSettings
    #: The last :attr:`Entry.seq` given out.
    seq: int
    deleted: bool
    #: Deliveries held unacknowledged by channels (a stream holds none: it keeps no count).
    unacked_count: int
    #: The policy and the operator policy that apply to it (``broker.core.policy``).
    policy: Any
    operator_policy: Any
    #: Exchanges with a binding to it (``broker.core.exchange.Exchange``).
    sources: set[Any]
    #: Told of backlogs, dead letters, expiry and latency (its virtual host); ``None``: nobody.
    observer: QueueObserver | None
    #: Counters, read by metrics and the management API.
    published: int
    delivered: int
    delivered_no_ack: int
    got: int
    got_no_ack: int
    got_empty: int
    acked: int
    redelivered: int
    visibility_timeouts: int
    dead_lettered: dict[DeadLetterReason, int]
    #: Sampled entries waiting for their delivery, with when they came.
    latency_samples: dict[Entry, float]

    def __hash__(self) -> int:
        """Queues are kept in sets and as keys (by identity)."""

    @property
    def exclusive(self) -> bool:
        """Whether it belongs to one connection."""

    @property
    def message_count(self) -> int:
        """Ready messages (a stream: every offset it holds)."""

    @property
    def queued_bytes(self) -> int:
        """Bytes of its messages."""

    @property
    def memory_use(self) -> tuple[int, int]:
        """Ready messages in memory and their body bytes in memory."""

    @property
    def consumer_count(self) -> int:
        """Its consumers."""

    @property
    def consumers(self) -> Iterable[Consumer]:
        """Its consumers, next in turn first."""

    @property
    def active_consumer(self) -> Consumer | None:
        """With a single active consumer: the one deliveries go to."""

    def now(self) -> float:
        """Its clock's reading."""

    def enqueue(self, message: Message) -> bool:
        """Take ``message``; ``False`` if it was refused (a full queue that rejects publishes)."""

    def remove_consumer(self, consumer: Consumer) -> None:
        """Stop delivering to ``consumer``."""

    def has_exclusive_consumer(self) -> bool:
        """Whether a consumer holds it exclusively."""

    def dispatch(self) -> None:
        """Deliver what its consumers can take."""

    def settle(self, entries: Iterable[Entry]) -> None:
        """``entries`` were acknowledged."""

    def track_delivery(self, entry: Entry, deadline: float, timeout: float) -> None:
        """``entry`` was delivered with a visibility timeout of ``timeout`` seconds, ending at ``deadline``."""

    def observe_latency(self, entry: Entry) -> None:
        """A sampled entry (in :attr:`latency_samples`) is being delivered."""

    def return_entries(self, entries: Iterable[Entry]) -> None:
        """``entries`` come back unacknowledged (requeued)."""

    def reject(self, entries: list[Entry]) -> None:
        """``entries`` were rejected without requeueing."""

    def get(self) -> Entry | None:
        """``basic.get``: the next ready entry, taken out of the line."""

    def purge(self) -> int:
        """Drop its ready messages; returns how many."""

    def touch(self) -> None:
        """Used now (``x-expires`` counts from here)."""

    def cancel_timers(self) -> None:
        """Stop its timers (it is being deleted)."""

    def apply_settings(self, settings: QueueSettings) -> None:
        """Its policies changed: apply what they now say."""

    def ready_entries(self) -> list[Entry]:
        """The ready entries in memory, next to be delivered first."""


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

    def __init__(self, message: Message, queue: Queue) -> None:
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
        #: Whether its body counts in the queue's :attr:`ReadyLine.paged_bytes` (ready, on disk).
        self.paged = False


#: The consumer argument asking for each delivery's remaining TTL as its ``expiration``.
REMAINING_TTL = "x-remaining-ttl"


class Consumer:
    """A ``basic.consume`` subscription.

    :param channel: where deliveries go
    :param tag: the consumer tag
    :param prefetch: at most this many unacked deliveries (0: no limit)
    :param visibility_timeout: overrides the queue's (seconds), from the consumer argument
    :param priority: the consumer's ``x-priority`` (RabbitMQ's consumer priorities)
    :param remaining_ttl: the consumer's ``x-remaining-ttl`` (Postroom's own)
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
        "remaining_ttl",
    )

    def __init__(
        self,
        channel: DeliverySink,
        queue: Queue,
        tag: str,
        tag_bytes: bytes,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: Mapping[str, Any],
        visibility_timeout: float | None = None,
        priority: int = 0,
        remaining_ttl: bool = False,
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
        #: ``x-remaining-ttl``: a delivery with a TTL here carries the time it has left as its
        #: ``expiration`` (how a shovel out of Postroom carries it to the next broker).
        self.remaining_ttl = remaining_ttl

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

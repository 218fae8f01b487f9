"""What a queue holds and whom it delivers to: an :class:`Entry` per message in one queue (the
message and that queue's delivery state for it), and a :class:`Consumer` per ``basic.consume``.

Both are plain slotted records on the hot path; the queue (``broker.core.queue``), its ready
line (``broker.core.ready``) and its delivery (``broker.core.delivery``) change them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.message import Message

if TYPE_CHECKING:
    from broker.core.queue import WorkQueue

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

    def take_back(self, entry: Entry) -> bool:
        """Forget an unacked delivery whose visibility timeout passed (its tag becomes stale).

        :returns: ``False`` when the channel no longer holds it (acked in an open transaction).
        """


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
        queue: WorkQueue,
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

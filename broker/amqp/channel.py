"""One AMQP channel: content assembly, delivery tags, prefetch, publishing, transactions.

Publisher confirms are kept by :class:`broker.amqp.confirms.Confirms`, and the exchange and
queue methods are handled in :mod:`broker.amqp.topology`.

A channel turns methods into operations on its virtual host and writes the replies and
deliveries into its connection's outgoing buffer. It never blocks and never waits: every
method is handled to completion when it arrives.

Invariants:

* delivery tags run 1, 2, 3 ... per channel; ``_unacked`` holds the unacknowledged ones in
  tag order, so ``multiple`` acks pop from the front (O(1) each);
* ``unacked_count`` equals ``len(_unacked)``; each consumer's ``unacked`` counts its share;
* publisher confirms are sequence numbers 1, 2, 3 ...; acks for a run of accepted publishes
  are coalesced into one ``basic.ack multiple=true`` per batch of incoming data (``confirms``).
"""

from __future__ import annotations

import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame

from broker.amqp import topology
from broker.amqp.confirms import Confirms
from broker.core.entry import UNACKED, Consumer, Entry
from broker.core.message import Message
from broker.core.queue import WorkQueue
from broker.core.replyto import PREFIX, PSEUDO_QUEUE, ReplyConsumer
from broker.core.seal import DEAD_LETTER_ID_HEADER, SEAL_HEADER, UNSEALED, without_entries
from broker.core.vhost import EXTEND_EXCHANGE, REDRIVE_EXCHANGE
from broker.errors import AMQPError, ChannelException, ConnectionException, ReplyCode
from broker.wire.codec import (
    BASIC_CLASS,
    BASIC_DELIVER,
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_USER_ID,
    FRAME_BODY,
    FRAME_END,
    FRAME_END_BYTE,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    content_body_size,
    content_frames,
    deliver_frames,
    encode_method,
    get_ok_method,
    return_method,
    shortstr,
)
from broker.wire.content import (
    FIXED_LENGTHS,
    REPLY_TO,
    ContentError,
    check_properties,
    property_value,
    replace_property,
)

if TYPE_CHECKING:
    from broker.amqp.connection import ServerConnection

#: ``amq.rabbitmq.reply-to`` as a ``reply-to`` property holds it.
PSEUDO_QUEUE_BYTES = PSEUDO_QUEUE.encode()

#: Stale delivery tags remembered per channel. An ack of an older stale tag than this is
#: answered as an unknown tag (406); a million covers a consumer that fell behind by that many
#: timed-out deliveries, at about 60 MB.
MAX_STALE_TAGS = 1_000_000

_deliver_head = struct.Struct(">BHII")  # frame header and method index of basic.deliver
_tag_redelivered = struct.Struct(">QB")
_queue_of = attrgetter("queue")
_consumer_of = attrgetter("consumer")
_frame_end_then_header = struct.Struct(">BBHI")  # frame-end octet, then the next frame's header

#: Bodies up to this size are delivered with their frames packed in one piece (copied once
#: more than a larger body, which goes to the socket as it is).
SMALL_BODY = 16 << 10
#: Packs of a delivery's three frames, by (consumer tag, names, header, body) lengths.
_DELIVERY_PACKS: dict[tuple[int, int, int, int], Callable[..., bytes]] = {}


def _delivery_pack(shape: tuple[int, int, int, int]) -> Callable[..., bytes]:
    """Packs ``basic.deliver``, its content header and its one body frame of these lengths."""
    if len(_DELIVERY_PACKS) >= 4096:
        _DELIVERY_PACKS.clear()
    tag, names, header, body = shape
    pack = _DELIVERY_PACKS[shape] = struct.Struct(f">BHII{tag}sQB{names}sBBHI{header}sBBHI{body}sB").pack
    return pack


#: Methods that carry content (AMQP 0-9-1 §4.2.6).
CONTENT_METHODS = frozenset(
    {commands.Basic.Publish, commands.Basic.Return, commands.Basic.Deliver, commands.Basic.GetOk}
)
#: Methods whose empty queue name means the channel's last declared queue (RabbitMQ expands
#: it before anything else, on a channel in any state).
QUEUE_SHORTCUT_METHODS = frozenset(
    {
        commands.Basic.Get,
        commands.Basic.Consume,
        commands.Queue.Delete,
        commands.Queue.Purge,
        commands.Queue.Bind,
        commands.Queue.Unbind,
    }
)
#: Exchanges a channel remembers as writable before it starts again.
WRITABLE_MEMO = 1_000
#: The publish arguments of content that will be refused once it is in (see ``refuse_content``).
_REFUSED = ("", "", False, False, b"")


class ChannelState:
    """The server side of one open channel.

    :param connection: the connection the channel belongs to
    :param channel_id: its number (1 .. channel_max)
    """

    def __init__(self, connection: ServerConnection, channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.vhost = connection.vhost
        self.closing = False
        #: Whether consumers on this channel may receive deliveries now (read on every dispatch).
        self.active = connection.writable
        self.prefetch_consumer = 0
        self.prefetch_global = 0
        self.unacked_count = 0
        self._unacked: OrderedDict[int, Entry] = OrderedDict()
        self._delivery_tag = 0
        self.consumers: dict[str, Consumer] = {}
        self.last_queue: str | None = None
        #: Exchanges this channel has been allowed to publish to (see ``_check_writable``);
        #: ``None`` when the user's permissions allow everything. (The user's permissions
        #: themselves are ``connection.access``: a channel keeps at most 30 attributes, past
        #: which CPython stops sharing instance dictionary keys and every attribute read slows.)
        self._writable: set[str] | None = None if connection.access is None else set()
        # Content being assembled: publish arguments, header payload, expected size, parts.
        self._publish: tuple[str, str, bool, bool, bytes] | None = None
        self._header: bytes | None = None
        self._body_size = 0
        self._body: list[bytes] = []
        self._received = 0
        self._refusal: AMQPError | None = None
        #: Publisher confirms, once ``confirm.select`` asked for them (``None``: not in confirm mode).
        self.confirms: Confirms | None = None
        self.transactional = False
        self._tx_ops: list[Callable[[], object]] = []
        #: Delivery tags taken back by visibility timeouts, oldest first (see MAX_STALE_TAGS).
        self._stale: dict[int, bool] = {}
        #: Deliveries acked or rejected inside the open transaction (put back on rollback).
        self._tx_taken: list[Entry] = []
        self._max_message_bytes = connection.node.limits.max_message_bytes
        #: Plugins' message hooks; ``None`` (the usual case) costs the hot path one test.
        self._hooks = connection.node.hooks
        #: Deliveries acked in the read being handled, not settled yet (see :meth:`hold_ack`).
        self._held_acks: list[Entry] = []

    # -- state --------------------------------------------------------------------------------

    def update_active(self) -> None:
        """Recompute :attr:`active` and, when deliveries may resume, dispatch to the consumers."""
        was = self.active
        self.active = self.connection.writable and not self.closing
        if self.active and not was:
            self._kick(consumer.queue for consumer in list(self.consumers.values()))

    @staticmethod
    def _kick(queues: Iterable[WorkQueue]) -> None:
        for queue in set(queues):
            if not queue.deleted:
                queue.dispatch()

    @property
    def expecting_content(self) -> bool:
        """Whether a content header or body frame is due next on this channel."""
        return self._publish is not None

    @property
    def expecting_body(self) -> bool:
        """Whether a content body frame is due next on this channel (the header has come)."""
        return self._header is not None

    def send(self, method: Frame) -> None:
        self.connection.out.append(encode_method(self.id, method))

    # -- methods ------------------------------------------------------------------------------

    def handle_method(self, method: Frame) -> None:
        """Handle one method decoded by pamqp (everything but the hot-path basic methods).

        :raises AMQPError: with RabbitMQ's reply code for anything the method may not do.
        """
        handler = _HANDLERS.get(type(method))
        if handler is None:  # a method only servers send (channel.open-ok ...): RabbitMQ's 503
            error = ConnectionException(
                ReplyCode.COMMAND_INVALID, "unimplemented method", method.index >> 16, method.index & 0xFFFF
            )
            if type(method) in CONTENT_METHODS:  # basic.deliver ...: refused once its content is in
                self.refuse_content(error)
                return
            raise error
        handler(self, method)

    def _flow(self, method: commands.Channel.Flow) -> None:
        """``channel.flow``: RabbitMQ answers ``active=true`` and refuses to stop a channel.

        :raises ConnectionException: 540 NOT_IMPLEMENTED for ``active=false``, as RabbitMQ
            (clients' own test suites expect exactly this)
        """
        if not method.active:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, "active=false", 20, 20)
        self.send(commands.Channel.FlowOk(active=True))

    # the current queue (AMQP's empty name)

    def readable_queue(self, name: str) -> str:
        """The queue named (see :meth:`current_queue`), which the user must be allowed to read."""
        name = self.current_queue(name)
        access = self.connection.access
        if access is not None:
            access.check("read", "queue", name)
        return name

    def current_queue(self, name: str) -> str:
        """AMQP's "current queue": an empty name means the last queue declared on this channel."""
        if name:
            return name
        if self.last_queue is None:
            raise ChannelException(ReplyCode.NOT_FOUND, "no previously declared queue")
        return self.last_queue

    # basic class: subscriptions

    def _qos(self, method: commands.Basic.Qos) -> None:
        if method.prefetch_size:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.prefetch_global = method.prefetch_count
        else:
            self.prefetch_consumer = method.prefetch_count
        self.send(commands.Basic.QosOk())
        self._kick(consumer.queue for consumer in self.consumers.values())

    def _consume(self, method: commands.Basic.Consume) -> None:
        # As RabbitMQ: the tag and the channel's consumer limit are checked before the queue.
        if method.consumer_tag in self.consumers:
            raise ConnectionException(ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{method.consumer_tag}'")
        if (method.queue or self.last_queue) == PSEUDO_QUEUE:
            self._consume_replies(method)
            return
        limit = self.connection.node.limits.consumer_max_per_channel
        if limit is not None and len(self.consumers) >= limit:
            raise ConnectionException(ReplyCode.NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel")
        queue = self.vhost.queue(self.readable_queue(method.queue), self.connection)
        tag = method.consumer_tag or self.connection.node.random_tag("amq.ctag-")
        exclusive = method.exclusive and (queue.consumer_count or queue.settings.single_active_consumer)
        if exclusive or queue.has_exclusive_consumer():  # a single-active-consumer queue: never
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED, f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use"
            )
        try:
            tag_bytes = shortstr(tag)
        except ValueError:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "consumer tag longer than 255 bytes") from None
        arguments = method.arguments or {}
        timeout = arguments.get("x-visibility-timeout")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED, f"invalid consumer arg 'x-visibility-timeout': {timeout!r}"
            )
        consumer = Consumer(
            self,
            queue,
            tag,
            tag_bytes,
            no_ack=method.no_ack,
            exclusive=method.exclusive,
            prefetch=self.prefetch_consumer,
            arguments=arguments,
            visibility_timeout=timeout / 1000.0 if timeout else None,
            priority=self.vhost.consumer_priority(queue, arguments),
        )
        self.consumers[tag] = consumer
        if not method.nowait:
            self.send(commands.Basic.ConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def _consume_replies(self, method: commands.Basic.Consume) -> None:
        """``basic.consume`` from ``amq.rabbitmq.reply-to``: no-ack only, one per channel; no
        read permission is needed (RabbitMQ checks none), and it is no queue's consumer."""
        if not method.no_ack:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        replies = self.connection.node.replies
        if replies.of(self) is not None:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "reply consumer already set")
        tag = method.consumer_tag or self.connection.node.random_tag("amq.ctag-")
        replies.consume(self, tag)
        if not method.nowait:
            self.send(commands.Basic.ConsumeOk(consumer_tag=tag))

    def deliver_reply(self, consumer: ReplyConsumer, message: Message) -> None:
        """Write a reply to this channel's reply consumer, as RabbitMQ 3.10 does: with the
        channel's next delivery tag, which is not used up (nothing is acked), never redelivered."""
        connection = self.connection
        connection.out += deliver_frames(
            self.id,
            consumer.tag_bytes,
            self._delivery_tag + 1,
            False,
            message.names,
            message.header,
            message.body,
            connection.frame_max,
        )
        if not connection.dirty:
            connection.dirty = True
            connection.node.mark_dirty(connection)

    def _cancel(self, method: commands.Basic.Cancel) -> None:
        replies = self.connection.node.replies
        reply = replies.of(self)
        if reply is not None and reply.tag == method.consumer_tag:
            replies.cancel(self)
            if not method.nowait:
                self.send(commands.Basic.CancelOk(consumer_tag=method.consumer_tag))
            return
        consumer = self.consumers.pop(method.consumer_tag, None)  # type: ignore[arg-type]  # decoded: a str
        if consumer is not None:
            self._remove_consumer(consumer)
        if not method.nowait:
            self.send(commands.Basic.CancelOk(consumer_tag=method.consumer_tag))

    def _remove_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        queue.remove_consumer(consumer)
        if queue.auto_delete and not queue.consumer_count and not queue.deleted:
            self.vhost.remove_queue(queue)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The broker cancelled ``consumer`` (its queue was deleted): tell the client if it listens."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.connection.capabilities.get("consumer_cancel_notify"):
            self.send(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
            self.connection.node.mark_dirty(self.connection)

    # basic class: delivery

    def unacked_entries(self) -> Iterable[Entry]:
        """The deliveries this channel holds unacknowledged."""
        return self._unacked.values()

    def deliver_entries(self, consumer: Consumer, entries: Sequence[Entry]) -> None:
        """Write a ``basic.deliver`` and the content of each entry for ``consumer``.

        The caller has checked the consumer's credit. Frames are built from the stored bytes:
        a small message's three frames with one ``struct`` pack (one per shape: consumer tag,
        names, header and body lengths), a larger one's with four packs, its body not copied
        (see :func:`broker.wire.codec.deliver_frames`).
        """
        connection = self.connection
        out = connection.out
        channel_id = self.id
        consumer_tag = consumer.tag_bytes
        tag_length = 13 + len(consumer_tag)
        single_frame = connection.frame_max - FRAME_OVERHEAD
        track = not consumer.no_ack
        unacked = self._unacked
        tag = self._delivery_tag
        count = 0
        queue = consumer.queue
        sampled = queue.latency_samples
        packs = _DELIVERY_PACKS
        for entry in entries:
            tag += 1
            count += 1
            if sampled and entry in sampled:
                queue.observe_latency(entry)
            message = entry.message
            body = message._body
            if body is None:  # paged out to the log
                body = message.body
            header = message.header if entry.header is None else entry.header
            size = len(body)
            if 0 < size <= SMALL_BODY and size <= single_frame:
                names = message.names
                shape = (len(consumer_tag), len(names), len(header), size)
                pack = packs.get(shape) or _delivery_pack(shape)
                out.append(
                    pack(
                        FRAME_METHOD,
                        channel_id,
                        tag_length + len(names),
                        BASIC_DELIVER,
                        consumer_tag,
                        tag,
                        entry.redelivered,
                        names,
                        FRAME_END,
                        FRAME_HEADER,
                        channel_id,
                        len(header),
                        header,
                        FRAME_END,
                        FRAME_BODY,
                        channel_id,
                        size,
                        body,
                        FRAME_END,
                    )
                )
            elif 0 < size <= single_frame:
                names = message.names
                out += (
                    _deliver_head.pack(FRAME_METHOD, channel_id, tag_length + len(names), BASIC_DELIVER),
                    consumer_tag,
                    _tag_redelivered.pack(tag, entry.redelivered),
                    names,
                    _frame_end_then_header.pack(FRAME_END, FRAME_HEADER, channel_id, len(header)),
                    header,
                    _frame_end_then_header.pack(FRAME_END, FRAME_BODY, channel_id, len(body)),
                    body,
                    FRAME_END_BYTE,
                )
            else:
                out += deliver_frames(
                    channel_id, consumer_tag, tag, entry.redelivered, message.names, header, body, connection.frame_max
                )
            if track:
                entry.consumer = consumer
                entry.channel = self
                entry.tag = tag
                entry.state = UNACKED
                unacked[tag] = entry
        self._delivery_tag = tag
        queue.delivered += count
        if not track:
            queue.settle(entries)
        elif count:
            consumer.unacked += count
            self.unacked_count += count
            queue.unacked_count += count
            timeout = consumer.visibility_timeout
            if timeout:
                deadline = queue.now() + timeout
                for entry in entries:
                    queue.track_delivery(entry, deadline, timeout)
        if self._hooks is not None:
            self._hooks.delivered(consumer.queue, entries)
        if not connection.dirty:
            connection.dirty = True
            connection.node.mark_dirty(connection)

    def _get(self, method: commands.Basic.Get) -> None:
        queue = self.vhost.queue(self.readable_queue(method.queue), self.connection)
        entry = queue.get()
        if entry is None:
            self.vhost.gets_empty += 1
            self.send(commands.Basic.GetEmpty())
            return
        self.vhost.gets += 1
        self._delivery_tag = tag = self._delivery_tag + 1
        queue.delivered += 1
        if queue.latency_samples:
            queue.observe_latency(entry)
        message = entry.message
        out = self.connection.out
        header = message.header if entry.header is None else entry.header
        out.append(get_ok_method(self.id, tag, entry.redelivered, message.names, queue.message_count))
        out += content_frames(self.id, header, message.body, self.connection.frame_max)
        self.connection.replied_bytes += len(message.body)
        if self._hooks is not None:
            self._hooks.delivered(queue, (entry,))
        if method.no_ack:
            queue.settle((entry,))
            return
        entry.tag = tag
        entry.channel = self
        entry.state = UNACKED
        self._unacked[tag] = entry
        self.unacked_count += 1
        queue.unacked_count += 1
        timeout = queue.settings.visibility_timeout
        if timeout:
            queue.track_delivery(entry, queue.now() + timeout, timeout)

    # basic class: acknowledgements

    def _take(self, delivery_tag: int, multiple: bool) -> list[Entry]:
        """Remove and return the unacked entries an ack/nack/reject names.

        A tag whose delivery was taken back by a visibility timeout is stale: naming it is
        not an error, it is counted and takes nothing (for ``multiple``, the unacked ones up
        to it are still taken).

        :raises ChannelException: 406 PRECONDITION_FAILED for an unknown delivery tag.
        """
        unacked = self._unacked
        if not multiple:
            entry = unacked.pop(delivery_tag, None)
            if entry is None:
                self._unacked_miss(delivery_tag)
                return []
            self._uncount(entry)
            return [entry]
        if delivery_tag == 0:
            delivery_tag = self._delivery_tag
        elif delivery_tag not in unacked and not self._is_stale(delivery_tag):
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
        count = 0
        for tag in unacked:  # in delivery order
            if tag > delivery_tag:
                break
            count += 1
        pop = unacked.popitem
        taken = [pop(False)[1] for _ in range(count)]
        self.unacked_count -= len(taken)
        for queue, count in Counter(map(_queue_of, taken)).items():
            queue.unacked_count -= count
        for consumer, count in Counter(map(_consumer_of, taken)).items():
            if consumer is not None:
                consumer.unacked -= count
        return taken

    def _uncount(self, entry: Entry) -> None:
        """``entry`` is no longer unacknowledged here: count it out of the channel, its queue
        and its consumer."""
        self.unacked_count -= 1
        entry.queue.unacked_count -= 1
        if entry.consumer is not None:
            entry.consumer.unacked -= 1

    def _unacked_miss(self, delivery_tag: int) -> None:
        """A single ack, nack or reject named a tag that is not unacknowledged here.

        :raises ChannelException: 406 PRECONDITION_FAILED unless it was taken back (stale)
        """
        if not self._is_stale(delivery_tag):
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")

    def _is_stale(self, delivery_tag: int) -> bool:
        """Whether ``delivery_tag`` was taken back (counted once as a stale ack)."""
        if self._stale.pop(delivery_tag, None) is None:
            return False
        self.connection.node.counters["stale_acks"] += 1
        return True

    def take_back(self, entry: Entry) -> bool:
        """Forget an unacked delivery whose visibility timeout passed; its tag becomes stale.

        :returns: ``False`` when the delivery is not held here any more (acked inside an open
            transaction), so the queue must not return it.
        """
        if self._unacked.pop(entry.tag, None) is None:
            return False
        self._uncount(entry)
        stale = self._stale
        stale[entry.tag] = True
        if len(stale) > MAX_STALE_TAGS:
            del stale[next(iter(stale))]
        return True

    def on_ack(self, delivery_tag: int, multiple: bool) -> None:
        """``basic.ack`` from the client (hot path: called with decoded fields)."""
        entries = self._take(delivery_tag, multiple)
        if self.transactional:
            self._tx_taken += entries
            self._tx_ops.append(lambda: self._acked(entries))
            return
        self._acked(entries)

    def hold_ack(self, delivery_tag: int) -> bool:
        """A single ``basic.ack`` (not transactional) among others of one read: its delivery is
        taken now (an unknown tag fails here, in order), and settled with the others by
        :meth:`settle_held` before the connection handles any other frame. Returns whether it
        is the first one held.

        :raises ChannelException: as :meth:`_take`
        """
        entry = self._unacked.pop(delivery_tag, None)
        if entry is None:
            self._unacked_miss(delivery_tag)  # stale (nothing taken) or unknown (raises)
            return False
        self._uncount(entry)
        held = self._held_acks
        held.append(entry)
        return len(held) == 1

    def settle_held(self) -> None:
        """Settle the acks :meth:`hold_ack` took: each queue settles its share and dispatches
        once, as for one ``multiple`` ack."""
        entries = self._held_acks
        if entries:
            self._held_acks = []
            self._acked(entries)

    def _acked(self, entries: list[Entry]) -> None:
        if not entries:
            return
        if self._hooks is not None:
            self._hooks.acked(entries)
        if len(entries) == 1:
            entry = entries[0]
            queue = entry.queue
            queue.acked += 1
            queue.settle(entries)
            if entry.consumer is not None and not queue.deleted:
                queue.dispatch()
            if self.prefetch_global:  # the freed slot is the channel's: any consumer's queue may use it
                self._kick(c.queue for c in self.consumers.values())
            return
        groups = _by_queue(entries)
        for queue, group in groups.items():
            queue.acked += len(group)
            queue.settle(group)
        self._kick(groups)
        if self.prefetch_global:
            self._kick(c.queue for c in self.consumers.values())

    def _untake(self, entries: list[Entry]) -> None:
        """Put taken deliveries back as unacknowledged (a rolled-back transaction's acks)."""
        if not entries:
            return
        unacked = self._unacked
        merged = sorted([*unacked.items(), *((entry.tag, entry) for entry in entries)], key=lambda item: item[0])
        unacked.clear()
        unacked.update(merged)
        self.unacked_count += len(entries)
        for entry in entries:
            entry.queue.unacked_count += 1
            if entry.consumer is not None:
                entry.consumer.unacked += 1

    def on_nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        """``basic.nack`` (and ``basic.reject`` with ``multiple=False``) from the client."""
        entries = self._take(delivery_tag, multiple)
        if self.transactional:
            self._tx_taken += entries
            self._tx_ops.append(lambda: self._rejected(entries, requeue))
            return
        self._rejected(entries, requeue)

    def _rejected(self, entries: list[Entry], requeue: bool) -> None:
        if requeue:
            self._requeue(entries)
            return
        for queue, group in _by_queue(entries).items():
            queue.reject(group)
        self._kick(entry.queue for entry in entries if entry.consumer is not None)

    @staticmethod
    def _requeue(entries: Iterable[Entry]) -> None:
        """Return entries to their queues (each counts as a return), oldest delivery first."""
        for queue, group in _by_queue(entries).items():
            queue.return_entries(group)

    def _recover(self, method: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if not method.requeue:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, "requeue=false")
        self._requeue(self._take(0, True))
        if isinstance(method, commands.Basic.Recover):
            self.send(commands.Basic.RecoverOk())

    # basic class: publishing

    def refuse_content(self, error: AMQPError) -> None:
        """A method with content that this channel cannot take: read its content, then raise
        ``error`` (RabbitMQ assembles the content before the channel sees the method)."""
        self._publish = _REFUSED
        self._header = None
        self._refusal = error

    def on_publish(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool, names: bytes) -> None:
        """``basic.publish``: remember the arguments until the content has arrived."""
        self._publish = (exchange, routing_key, mandatory, immediate, names)
        self._header = None

    def on_header(self, payload: bytes) -> None:
        """A content header frame.

        :raises ConnectionException: 505 UNEXPECTED_FRAME when no publish is waiting for one, when
            one came already, or for another class or a non-zero weight (RabbitMQ's texts and ids);
            501 FRAME_ERROR when it is shorter than its fixed fields.
        :raises ChannelException: 406 when the announced body exceeds the message size limit.
        """
        if self._publish is None:
            raise ConnectionException(ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        if self._header is not None:
            raise ConnectionException(
                ReplyCode.UNEXPECTED_FRAME, "expected content body, got non content body frame instead", BASIC_CLASS, 40
            )
        class_id, weight, body_size = content_body_size(payload)
        if weight:
            raise ConnectionException(
                ReplyCode.UNEXPECTED_FRAME,
                "expected content header for class 60, got non content header frame instead",
                BASIC_CLASS,
                40,
            )
        if class_id != BASIC_CLASS:
            raise ConnectionException(
                ReplyCode.UNEXPECTED_FRAME,
                f"expected content header for class 60, got one for class {class_id} instead",
                BASIC_CLASS,
                40,
            )
        limit = self.connection.node.limits.max_message_bytes
        if body_size > limit:
            self._publish = None
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {limit}",
                BASIC_CLASS,
                40,
            )
        self._header = payload
        self._body_size = body_size
        if body_size == 0:
            self._complete(b"")
        else:
            self._body = []
            self._received = 0

    def on_body(self, payload: bytes) -> None:
        """A content body frame.

        :raises ConnectionException: 505 UNEXPECTED_FRAME without a header, or when the body
            grows past the size the header announced.
        """
        if self._header is None:
            if self._publish is None:
                raise ConnectionException(
                    ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
                )
            raise ConnectionException(
                ReplyCode.UNEXPECTED_FRAME,
                "expected content header for class 60, got non content header frame instead",
                BASIC_CLASS,
                40,
            )
        received = self._received + len(payload)
        if received == self._body_size and not self._body:
            self._complete(payload)
            return
        if received > self._body_size:
            # RabbitMQ waits for a remaining size that went below zero: the message is never
            # complete, and the channel takes only body frames from now on. Nothing is kept.
            self._body = []
            self._received = received
            return
        self._body.append(payload)
        self._received = received
        if received == self._body_size:
            body = b"".join(self._body)
            self._body = []
            self._complete(body)

    def _complete(self, body: bytes) -> None:
        publish = self._publish
        header = self._header
        assert publish is not None and header is not None
        if publish is _REFUSED:
            assert self._refusal is not None
            raise self._refusal
        self._publish = None
        self._header = None
        exchange_name, routing_key, mandatory, immediate, names = publish
        self.publish(exchange_name, routing_key, mandatory | immediate << 1, names, header, body)

    def publish(
        self, exchange_name: str, routing_key: str, bits: int, names: bytes, header: bytes, body: bytes
    ) -> None:
        """A complete published message: check it, route it, enqueue it, confirm it.

        :param bits: ``mandatory`` (1) and ``immediate`` (2) from ``basic.publish``
        :param names: the exchange and routing key short strings as sent
        :param header: the content header payload, passed on to consumers unchanged
        :raises ChannelException: 404 for a missing exchange, 403 for an internal one, 406 for a
            ``user_id`` that is not the login or a body over the size limit.
        :raises ConnectionException: 540 NOT_IMPLEMENTED for ``immediate``.
        """
        message = Message(exchange_name, routing_key, names, header, body)
        expected = FIXED_LENGTHS.get(message.flags)
        if expected is None or len(header) != expected:
            _check_content(header)
        confirms = self.confirms
        if confirms is not None:
            confirms.seq += 1
        if bits & 2:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, "immediate=true", BASIC_CLASS, 40)
        if len(body) > self._max_message_bytes:
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"message size {len(body)} is larger than configured max size {self._max_message_bytes}",
                BASIC_CLASS,
                40,
            )
        if self._writable is not None and exchange_name not in self._writable:
            self._check_writable(exchange_name, routing_key)
        if exchange_name == REDRIVE_EXCHANGE:
            redriven = self._redriven(message)  # None: refused, by _route like any refusal
            if redriven is not None:
                message, exchange_name, routing_key = redriven, "", redriven.routing_key
        elif message.flags & FLAG_USER_ID:
            user_id = message.properties.user_id
            if user_id != self.connection.user_name:
                raise ChannelException(
                    ReplyCode.PRECONDITION_FAILED,
                    f"user_id property set to '{user_id}' but authenticated user was '{self.connection.user_name}'",
                    BASIC_CLASS,
                    40,
                )
        if message.flags & FLAG_EXPIRATION:
            _check_expiration(message.expiration)
        if message.flags & REPLY_TO and property_value(header, REPLY_TO) == PSEUDO_QUEUE_BYTES:
            message = self._with_reply_name(message, exchange_name)
        self.vhost.published += 1
        if self._hooks is not None:
            self._hooks.published(self.vhost, exchange_name, message)
        if self.transactional:
            self._check_exchange(exchange_name)
            if exchange_name == "" and routing_key.startswith(PREFIX) and routing_key not in self.vhost.queues:
                self._reply(message, routing_key)  # as RabbitMQ: at once, and a rollback keeps it
            self._tx_ops.append(lambda: self._route(message, exchange_name, bits & 1))
            return
        if exchange_name == "":
            queue = self.vhost.queues.get(routing_key)
            if queue is not None:
                journal = queue.journal
                if journal is not None and message.flags & FLAG_DELIVERY_MODE and message.persistent:
                    journal.published(message, self.vhost.name, (queue.name,))
                accepted = queue.enqueue(message)
            else:
                accepted = True
                if not (routing_key.startswith(PREFIX) and self._reply(message, routing_key)):
                    self.vhost.unroutable += 1
                if bits & 1:
                    self._return(message)  # a reply too, delivered or not, as RabbitMQ returns it
            if self._hooks is not None:
                self._hooks.routed(self.vhost, "", message, [queue] if queue is not None else [])
        else:
            accepted = self._route(message, exchange_name, bits & 1)
        if confirms is not None:
            if message.wal_id or confirms.waits:
                position = self.vhost.journal.position if message.wal_id else 0  # type: ignore[union-attr]
                confirms.wait(confirms.seq, position, accepted)
            elif accepted:
                confirms.accepted()
            else:
                confirms.nack_last()

    def _with_reply_name(self, message: Message, exchange_name: str) -> Message:
        """A request whose ``reply-to`` is ``amq.rabbitmq.reply-to``, with this channel's reply
        consumer's name there instead (the one property rewritten, every other byte kept).

        :raises ChannelException: the exchange's 404 or 403 first, as RabbitMQ checks it first;
            406 when the channel has no reply consumer
        """
        self._check_exchange(exchange_name)
        reply = self.connection.node.replies.of(self)
        if reply is None:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "fast reply consumer does not exist", BASIC_CLASS, 40)
        header = replace_property(message.header, REPLY_TO, shortstr(reply.name))
        return Message(message.exchange, message.routing_key, message.names, header, message.body)

    def _reply(self, message: Message, routing_key: str) -> bool:
        """Deliver a reply to the reply consumer named ``routing_key``; whether one took it (a
        reply to a consumer that is gone is dropped, as in RabbitMQ)."""
        reply = self.connection.node.replies.find(routing_key)
        if reply is None or reply.channel.closing:
            return False
        reply.channel.deliver_reply(reply, message)
        return True

    def _check_writable(self, exchange_name: str, routing_key: str) -> None:
        """Publishing needs write permission on the exchange, and on a topic exchange with
        topic permissions, on the routing key too. An exchange without those is remembered by
        the channel, so that the next publish pays one set lookup.

        :raises ChannelException: 403, with ``basic.publish``'s ids
        """
        access, writable = self.connection.access, self._writable
        assert access is not None and writable is not None
        try:
            access.check("write", "exchange", exchange_name)
            if exchange_name in access.topics:
                if self.is_topic(exchange_name):
                    access.check_topic("write", exchange_name, routing_key)
                return  # checked at each publish: the routing key changes
        except ChannelException as refused:
            refused.class_id, refused.method_id = BASIC_CLASS, 40
            raise
        if len(writable) >= WRITABLE_MEMO:
            writable.clear()
        writable.add(exchange_name)

    def is_topic(self, exchange_name: str) -> bool:
        exchange = self.vhost.exchanges.get(exchange_name)
        return exchange is not None and exchange.type_name == "topic"

    def _check_exchange(self, exchange_name: str) -> Any:
        vhost = self.vhost
        if exchange_name == "":
            return None
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            raise ChannelException(
                ReplyCode.NOT_FOUND, f"no exchange '{exchange_name}' in vhost '{vhost.name}'", BASIC_CLASS, 40
            )
        if exchange.internal:
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED,
                f"cannot publish to internal exchange '{exchange_name}' in vhost '{vhost.name}'",
                BASIC_CLASS,
                40,
            )
        return exchange

    def _route(self, message: Message, exchange_name: str, mandatory: int) -> bool:
        """Route and enqueue; ``False`` when a queue refused the message (or a lease extension failed)."""
        exchange = self._check_exchange(exchange_name)
        if exchange_name == EXTEND_EXCHANGE:
            return self._extend(message)
        if exchange_name == REDRIVE_EXCHANGE:
            return False  # its seal did not hold (see _redriven)
        queues = self.vhost.route(exchange, message)
        if self._hooks is not None:
            self._hooks.routed(self.vhost, exchange_name, message, queues)
        journal = self.vhost.journal
        if journal is not None and queues and message.flags & FLAG_DELIVERY_MODE and message.persistent:
            durable = [queue.name for queue in queues if queue.journal is not None]
            if durable:
                journal.published(message, self.vhost.name, durable)
        accepted = True
        for queue in queues:
            if not queue.enqueue(message):
                accepted = False
        if not queues:
            self.vhost.unroutable += 1
            if mandatory:
                self._return(message)
        return accepted

    def _extend(self, message: Message) -> bool:
        """A publish to ``amq.postroom.extend``: move the visibility deadline of a delivery.

        Headers ``x-delivery-tag`` (a delivery on this channel) and ``x-visibility-timeout``
        (milliseconds from now). Nothing is routed. A stale or unknown tag is counted and
        refused (a nack in confirm mode); so are missing or malformed headers.
        """
        headers = message.headers or {}
        tag = headers.get("x-delivery-tag")
        timeout = headers.get("x-visibility-timeout")
        entry = self._unacked.get(tag) if isinstance(tag, int) else None
        if entry is None or not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            self.connection.node.counters["stale_extends"] += 1
            return False
        entry.queue.extend(entry, timeout / 1000.0)
        return True

    def _redriven(self, message: Message) -> Message | None:
        """A publish to ``amq.postroom.redrive``: a dead letter this broker sealed, as it goes
        back to the queue it died in (through the default exchange), without the seal, its
        dead-letter id and ``x-delivery-count``; ``None`` when the seal does not hold (see
        :mod:`broker.core.seal`). The user needs write permission on that queue. The message's
        ``user_id`` was checked when it was first published.

        :raises ChannelException: 403 without write permission on the queue; 406 for a seal
            that does not hold, outside confirm mode (in confirm mode: ``None``, a nack)
        """
        vhost = self.vhost
        sealer = vhost.dead_letters.sealer if vhost.dead_letters is not None else None
        queue = None
        if sealer is not None:
            queue = sealer.verify(vhost.name, message.header, message.lenient_headers(), message.body)
        if queue is None:
            self.connection.node.counters["redrives_refused"] += 1
            if self.confirms is not None:
                return None
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"not a dead letter sealed by this broker in vhost '{vhost.name}': '{SEAL_HEADER}' does not match",
                BASIC_CLASS,
                40,
            )
        access = self.connection.access
        if access is not None:
            try:
                access.check("write", "queue", queue)
            except ChannelException as refused:
                refused.class_id, refused.method_id = BASIC_CLASS, 40
                raise
        header = without_entries(message.header, (*UNSEALED, DEAD_LETTER_ID_HEADER.encode()))
        return Message("", queue, shortstr("") + shortstr(queue), header, message.body)

    def _return(self, message: Message) -> None:
        """Send an unroutable mandatory message back with ``basic.return`` 312 NO_ROUTE."""
        self.vhost.returned += 1
        out = self.connection.out
        out.append(return_method(self.id, ReplyCode.NO_ROUTE, "NO_ROUTE", message.names))
        out += content_frames(self.id, message.header, message.body, self.connection.frame_max)
        self.connection.replied_bytes += len(message.body)

    # confirm and tx classes

    def _confirm_select(self, method: commands.Confirm.Select) -> None:
        if self.transactional:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = Confirms(self.id, self.connection, self.vhost)
        if not method.nowait:
            self.send(commands.Confirm.SelectOk())

    def _tx_select(self, method: commands.Tx.Select) -> None:
        if self.confirms is not None:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self.transactional = True
        self.send(commands.Tx.SelectOk())

    def _tx_commit(self, method: commands.Tx.Commit) -> None:
        if not self.transactional:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        ops, self._tx_ops = self._tx_ops, []
        self._tx_taken = []
        for op in ops:
            op()
        self.send(commands.Tx.CommitOk())

    def _tx_rollback(self, method: commands.Tx.Rollback) -> None:
        if not self.transactional:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        self._tx_ops = []
        taken, self._tx_taken = self._tx_taken, []
        self._untake(taken)
        self.send(commands.Tx.RollbackOk())

    # -- closing ------------------------------------------------------------------------------

    def release(self) -> None:
        """Let go of everything the channel holds: cancel its consumers, requeue unacked deliveries.

        Called when the channel closes, either side, and when the connection goes away. Each
        consumer and each queue's returns is a step of its own: one that raises (a bug) is
        recorded in the connection's ``teardown_errors`` and the others still run, so no
        delivery is left held by a channel that no longer exists.
        """
        self.closing = True
        self.active = False
        self.connection.node.replies.cancel(self)
        errors = self.connection.teardown_errors
        confirms = self.confirms
        try:
            if confirms is not None:
                confirms.flush()
        except Exception as error:
            errors.append(error)
        try:
            self.settle_held()  # acks taken and left unsettled (another channel's settlement raised)
        except Exception as error:
            errors.append(error)
        if confirms is not None:
            confirms.forget()
        self._tx_ops = []
        taken, self._tx_taken = self._tx_taken, []
        self._untake(taken)
        self._publish = None
        consumers, self.consumers = list(self.consumers.values()), {}
        entries = self._take(0, True) if self._unacked else []
        # Returns first, then the consumers: a single active consumer's successor then finds
        # the returned messages back in their places and gets them in queue order.
        for queue, group in _by_queue(entries).items():
            try:
                queue.return_entries(group)
            except Exception as error:
                errors.append(error)
        for consumer in consumers:
            try:
                self._remove_consumer(consumer)
            except Exception as error:
                errors.append(error)


def _check_content(header: bytes) -> None:
    """RabbitMQ decodes every content header at publish: one that does not parse closes the
    connection with a bare 541 INTERNAL_ERROR, and nothing malformed is stored or delivered.

    :raises ConnectionException: 541, as RabbitMQ words it (no text after the code's name)
    """
    try:
        check_properties(header)
    except ContentError as error:
        raise ConnectionException(ReplyCode.INTERNAL_ERROR, "", 0, 0) from error


def _check_expiration(value: object) -> None:
    """RabbitMQ's rule for the ``expiration`` property: a non-negative integer, as a string.

    :raises ChannelException: 406 PRECONDITION_FAILED otherwise.
    """
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    if not text.isdigit():
        raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"invalid expiration '{text}'", BASIC_CLASS, 40)


def _by_queue(entries: Iterable[Entry]) -> dict[WorkQueue, list[Entry]]:
    """Entries grouped by their queue, in their original order."""
    groups: dict[WorkQueue, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.queue, []).append(entry)
    return groups


_HANDLERS: dict[type, Callable[[ChannelState, Any], None]] = {
    commands.Channel.Flow: ChannelState._flow,
    commands.Exchange.Declare: topology.exchange_declare,
    commands.Exchange.Delete: topology.exchange_delete,
    commands.Exchange.Bind: topology.exchange_bind,
    commands.Exchange.Unbind: topology.exchange_unbind,
    commands.Queue.Declare: topology.queue_declare,
    commands.Queue.Bind: topology.queue_bind,
    commands.Queue.Unbind: topology.queue_unbind,
    commands.Queue.Purge: topology.queue_purge,
    commands.Queue.Delete: topology.queue_delete,
    commands.Basic.Qos: ChannelState._qos,
    commands.Basic.Consume: ChannelState._consume,
    commands.Basic.Cancel: ChannelState._cancel,
    commands.Basic.Get: ChannelState._get,
    commands.Basic.Recover: ChannelState._recover,
    commands.Basic.RecoverAsync: ChannelState._recover,
    commands.Confirm.Select: ChannelState._confirm_select,
    commands.Tx.Select: ChannelState._tx_select,
    commands.Tx.Commit: ChannelState._tx_commit,
    commands.Tx.Rollback: ChannelState._tx_rollback,
}

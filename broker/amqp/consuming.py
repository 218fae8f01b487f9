"""A channel's consuming side: its consumers, what it delivered, and the acknowledgements.

``basic.qos``, ``basic.consume`` and ``basic.cancel`` (the reply-to pseudo-queue's consumer
too), ``basic.get``, deliveries and their tags, ``basic.ack``, ``basic.nack``,
``basic.reject`` and ``basic.recover``. :class:`Consuming` is what the channel's consumers
deliver to (``broker.core.entry.DeliverySink``).

Invariants:

* delivery tags run 1, 2, 3 ... per channel; ``_unacked`` holds the unacknowledged ones in
  tag order, so ``multiple`` acks pop from the front (O(1) each);
* ``unacked_count`` equals ``len(_unacked)``; each consumer's ``unacked`` counts its share.
"""

from __future__ import annotations

import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from pamqp import commands

from postroom.broker.core.entry import REMAINING_TTL, UNACKED, Consumer, Entry, Queue
from postroom.broker.core.kinds import STREAM_TYPE_NAME
from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.replyto import PSEUDO_QUEUE, ReplyConsumer
from postroom.broker.core.stream import CONSUMER_NAME, OFFSET_HEADER, SINGLE_ACTIVE, StreamQueue, offset_spec
from postroom.broker.errors import ChannelCrash, ChannelException, ConnectionException, ReplyCode
from postroom.broker.wire.codec import (
    BASIC_DELIVER,
    FRAME_BODY,
    FRAME_END,
    FRAME_END_BYTE,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    content_frames,
    deliver_frames,
    get_ok_method,
    shortstr,
)
from postroom.broker.wire.content import with_remaining_ttl

if TYPE_CHECKING:
    from postroom.broker.amqp.seams import Channel

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


class Consuming:
    """The consuming side of one channel.

    :param channel: the channel (replies go out on it; its transaction holds acks until commit)
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.connection = connection = channel.connection
        self.vhost = channel.vhost
        self.id = channel.id
        #: Whether consumers on this channel may receive deliveries now (read on every dispatch).
        self.active = connection.writable
        self.prefetch_consumer = 0
        self.prefetch_global = 0
        self.unacked_count = 0
        self._unacked: OrderedDict[int, Entry] = OrderedDict()
        #: The last delivery tag given out.
        self.delivery_tag = 0
        #: What the channel's consumers and gets took, for the management API's
        #: ``message_stats``: deliveries without acks, gets with and without acks, gets that
        #: found nothing, acks, and deliveries of redelivered messages (deliveries with acks
        #: are the rest of :attr:`delivery_tag`, which numbers them all).
        self.delivered_no_ack = self.got = self.got_no_ack = self.got_empty = 0
        self.acked = self.redelivered = 0
        self.consumers: dict[str, Consumer] = {}
        #: Delivery tags taken back by visibility timeouts, oldest first (see MAX_STALE_TAGS).
        self._stale: dict[int, bool] = {}
        #: Deliveries acked or rejected inside the open transaction (put back on rollback).
        self.tx_taken: list[Entry] = []
        #: Plugins' message hooks; ``None`` (the usual case) costs the hot path one test.
        self._hooks = connection.node.hooks
        #: Deliveries acked in the read being handled, not settled yet (see :meth:`hold_ack`).
        self._held_acks: list[Entry] = []

    @property
    def closing(self) -> bool:
        """Whether the channel is closing (nothing is delivered to it any more)."""
        return self.channel.closing

    def update_active(self) -> None:
        """Recompute :attr:`active` and, when deliveries may resume, dispatch to the consumers."""
        was = self.active
        self.active = self.connection.writable and not self.channel.closing
        if self.active and not was:
            self._kick(consumer.queue for consumer in list(self.consumers.values()))

    @staticmethod
    def _kick(queues: Iterable[Queue]) -> None:
        for queue in set(queues):
            if not queue.deleted:
                queue.dispatch()

    # -- subscriptions ------------------------------------------------------------------------

    def qos(self, method: commands.Basic.Qos) -> None:
        if method.prefetch_size:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.prefetch_global = method.prefetch_count
        else:
            self.prefetch_consumer = method.prefetch_count
        self.channel.send(commands.Basic.QosOk())
        self._kick(consumer.queue for consumer in self.consumers.values())

    def consume(self, method: commands.Basic.Consume) -> None:
        # As RabbitMQ: the tag and the channel's consumer limit are checked before the queue.
        if method.consumer_tag in self.consumers:
            raise ConnectionException(ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{method.consumer_tag}'")
        if (method.queue or self.channel.last_queue) == PSEUDO_QUEUE:
            self._consume_replies(method)
            return
        limit = self.connection.node.limits.consumer_max_per_channel
        if limit is not None and len(self.consumers) >= limit:
            raise ConnectionException(ReplyCode.NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel")
        queue = self.vhost.queue(self.channel.readable_queue(method.queue), self.connection)
        if isinstance(queue, StreamQueue):
            self._consume_stream(method, queue)
            return
        assert isinstance(queue, WorkQueue)  # (the other kind)
        exclusive = method.exclusive and (queue.consumer_count or queue.settings.single_active_consumer)
        if exclusive or queue.has_exclusive_consumer():  # a single-active-consumer queue: never
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED, f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use"
            )
        tag, tag_bytes = self._new_tag(method)
        arguments = method.arguments or {}
        timeout = arguments.get("x-visibility-timeout")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED, f"invalid consumer arg 'x-visibility-timeout': {timeout!r}"
            )
        remaining_ttl = arguments.get(REMAINING_TTL, False)
        if not isinstance(remaining_ttl, bool):
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED, f"invalid consumer arg '{REMAINING_TTL}': {remaining_ttl!r}"
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
            remaining_ttl=remaining_ttl,
        )
        self.consumers[tag] = consumer
        if not method.nowait:
            self.channel.send(commands.Basic.ConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def _new_tag(self, method: commands.Basic.Consume) -> tuple[str, bytes]:
        """The consumer's tag (the client's, or a new ``amq.ctag-``), and as a shortstr.

        :raises ChannelException: 406 for a tag longer than 255 bytes
        """
        tag = method.consumer_tag or self.connection.node.random_tag("amq.ctag-")
        try:
            return tag, shortstr(tag)
        except ValueError:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "consumer tag longer than 255 bytes") from None

    def _consume_stream(self, method: commands.Basic.Consume, stream: StreamQueue) -> None:
        """``basic.consume`` from a stream, checked as RabbitMQ 3.10 checks it: ``x-stream-offset``,
        then the arguments of other queue types, then the prefetch (a stream's credit), no-ack and
        a global prefetch. ``exclusive`` is taken and not enforced, as RabbitMQ does."""
        where = f"in vhost '{self.vhost.name}'"
        arguments = method.arguments or {}
        spec = offset_spec(arguments.get(OFFSET_HEADER), stream.now(), stream.name, where)
        for key in arguments:
            if key in ("x-priority", "x-cancel-on-ha-failover"):
                raise ChannelException(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid arg '{key}' for queue '{stream.name}' {where} of queue type {STREAM_TYPE_NAME}",
                )
        named = f"queue '{stream.name}' {where}"
        if not self.prefetch_consumer:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"consumer prefetch count is not set for '{named}'")
        if method.no_ack:
            raise ConnectionException(
                ReplyCode.NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream queues {named}"
            )
        if self.prefetch_global:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, f"{named} does not support global qos")
        name, single_active = _subscription(arguments, named)
        tag, tag_bytes = self._new_tag(method)
        consumer = Consumer(
            self,
            stream,
            tag,
            tag_bytes,
            no_ack=False,
            exclusive=method.exclusive,
            prefetch=self.prefetch_consumer,
            arguments=arguments,
        )
        self.consumers[tag] = consumer
        if not method.nowait:
            self.channel.send(commands.Basic.ConsumeOk(consumer_tag=tag))
        stream.add_consumer(consumer, spec, name, single_active)

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
            self.channel.send(commands.Basic.ConsumeOk(consumer_tag=tag))

    def deliver_reply(self, consumer: ReplyConsumer, message: Message) -> None:
        """Write a reply to this channel's reply consumer, as RabbitMQ 3.10 does: with the
        channel's next delivery tag, which is not used up (nothing is acked), never redelivered."""
        connection = self.connection
        connection.out += deliver_frames(
            self.id,
            consumer.tag_bytes,
            self.delivery_tag + 1,
            False,
            message.names,
            message.header,
            message.body,
            connection.frame_max,
        )
        if not connection.dirty:
            connection.dirty = True
            connection.node.mark_dirty(connection)

    def cancel(self, method: commands.Basic.Cancel) -> None:
        replies = self.connection.node.replies
        reply = replies.of(self)
        if reply is not None and reply.tag == method.consumer_tag:
            replies.cancel(self)
            if not method.nowait:
                self.channel.send(commands.Basic.CancelOk(consumer_tag=method.consumer_tag))
            return
        consumer = self.consumers.pop(method.consumer_tag, None)  # type: ignore[arg-type]  # decoded: a str
        if consumer is not None:
            self._remove_consumer(consumer)
        if not method.nowait:
            self.channel.send(commands.Basic.CancelOk(consumer_tag=method.consumer_tag))

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
            self.channel.send(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
            self.connection.node.mark_dirty(self.connection)

    # -- deliveries ---------------------------------------------------------------------------

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
        tag = self.delivery_tag
        count = redelivered = 0
        queue = consumer.queue
        sampled = queue.latency_samples
        packs = _DELIVERY_PACKS
        now = queue.now() if consumer.remaining_ttl else None
        for entry in entries:
            tag += 1
            count += 1
            redelivered += entry.redelivered
            if sampled and entry in sampled:
                queue.observe_latency(entry)
            message = entry.message
            body = message._body
            if body is None:  # paged out to the log
                body = message.body
            header = message.header if entry.header is None else entry.header
            if now is not None and entry.expires_at is not None:
                header = with_remaining_ttl(header, entry.expires_at - now)
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
        self.delivery_tag = tag
        queue.delivered += count
        if redelivered:
            self.redelivered += redelivered
        if not track:
            self.delivered_no_ack += count
            queue.delivered_no_ack += count
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

    def get(self, method: commands.Basic.Get) -> None:
        queue = self.vhost.queue(self.channel.readable_queue(method.queue), self.connection)
        entry = queue.get()  # (a stream refuses)
        if entry is None:
            self.vhost.gets_empty += 1
            self.got_empty += 1
            queue.got_empty += 1
            self.channel.send(commands.Basic.GetEmpty())
            return
        self.vhost.gets += 1
        self.delivery_tag = tag = self.delivery_tag + 1
        queue.delivered += 1
        self.redelivered += entry.redelivered
        if method.no_ack:
            self.got_no_ack += 1
            queue.got_no_ack += 1
        else:
            self.got += 1
            queue.got += 1
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

    # -- acknowledgements ---------------------------------------------------------------------

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
            delivery_tag = self.delivery_tag
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
        if self.channel.transactional:
            self.tx_taken += entries
            self.channel.tx_ops.append(lambda: self._acked(entries))
            self.channel.tx_acks += len(entries)
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
        self.acked += len(entries)
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

    def untake(self, entries: list[Entry]) -> None:
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
        for entry in entries:
            if isinstance(entry.queue, StreamQueue):
                raise entry.queue.refusal("basic.nack and basic.reject")
        if self.channel.transactional:
            self.tx_taken += entries
            self.channel.tx_ops.append(lambda: self._rejected(entries, requeue))
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

    def recover(self, method: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if not method.requeue:
            raise ConnectionException(ReplyCode.NOT_IMPLEMENTED, "requeue=false")
        if any(entry.queue.kind == "stream" for entry in self._unacked.values()):
            raise ChannelCrash()  # RabbitMQ's channel crashes requeueing a stream's deliveries
        self._requeue(self._take(0, True))
        if isinstance(method, commands.Basic.Recover):
            self.channel.send(commands.Basic.RecoverOk())

    def unacked(self, tag: object) -> Entry | None:
        """The unacknowledged delivery of ``tag``, if there is one."""
        return self._unacked.get(tag) if isinstance(tag, int) else None

    def release(self, errors: list[BaseException]) -> None:
        """The channel closes: stop delivering, put back what the transaction took, return every
        unacknowledged delivery and cancel the consumers (each step on its own: one that raises
        is added to ``errors`` and the others still run)."""
        self.active = False
        self.connection.node.replies.cancel(self)
        try:
            self.settle_held()  # acks taken and left unsettled (another channel's settlement raised)
        except Exception as error:
            errors.append(error)
        taken, self.tx_taken = self.tx_taken, []
        self.untake(taken)
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


def _subscription(arguments: Mapping[str, Any], named: str) -> tuple[str | None, bool]:
    """A stream consumer's subscription: its ``x-stream-consumer-name`` and whether it joins that
    name's single-active-consumer group (``x-single-active-consumer``).

    :raises ChannelException: 406 for a name that is not a string, a group flag that is not a
        boolean, or a group without a name
    """
    name = arguments.get(CONSUMER_NAME)
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    if name is not None and (not isinstance(name, str) or not name):
        raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"invalid arg '{CONSUMER_NAME}' for {named}: {name!r}")
    single_active = arguments.get(SINGLE_ACTIVE, False)
    if not isinstance(single_active, bool):
        raise ChannelException(
            ReplyCode.PRECONDITION_FAILED, f"invalid arg '{SINGLE_ACTIVE}' for {named}: {single_active!r}"
        )
    if single_active and name is None:
        raise ChannelException(
            ReplyCode.PRECONDITION_FAILED, f"'{SINGLE_ACTIVE}' on {named} needs '{CONSUMER_NAME}' (the group's name)"
        )
    return name, single_active


def _by_queue(entries: Iterable[Entry]) -> dict[Queue, list[Entry]]:
    """Entries grouped by their queue, in their original order."""
    groups: dict[Queue, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.queue, []).append(entry)
    return groups

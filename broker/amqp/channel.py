"""One AMQP channel: content assembly, publishing, transactions.

Publisher confirms are kept by :class:`broker.amqp.confirms.Confirms`, the exchange and queue
methods are handled in :mod:`broker.amqp.topology`, and consumers, deliveries and
acknowledgements in :mod:`broker.amqp.consuming`.

A channel turns methods into operations on its virtual host and writes the replies and
deliveries into its connection's outgoing buffer. It never blocks and never waits: every
method is handled to completion when it arrives.

Publisher confirms are sequence numbers 1, 2, 3 ...; acks for a run of accepted publishes are
coalesced into one ``basic.ack multiple=true`` per batch of incoming data (``confirms``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame

from postroom.broker.amqp import topology
from postroom.broker.amqp.confirms import Confirms
from postroom.broker.amqp.consuming import Consuming
from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.replyto import PREFIX, PSEUDO_QUEUE
from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER, SEAL_HEADER, UNSEALED, without_entries
from postroom.broker.core.vhost import EXTEND_EXCHANGE, REDRIVE_EXCHANGE
from postroom.broker.errors import AMQPError, ChannelException, ConnectionException, ReplyCode
from postroom.broker.wire.codec import (
    BASIC_CLASS,
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_USER_ID,
    content_body_size,
    content_frames,
    encode_method,
    return_method,
    shortstr,
)
from postroom.broker.wire.content import (
    FIXED_LENGTHS,
    REPLY_TO,
    ContentError,
    check_properties,
    property_value,
    replace_property,
)

if TYPE_CHECKING:
    from postroom.broker.amqp.seams import Link

#: ``amq.rabbitmq.reply-to`` as a ``reply-to`` property holds it.
PSEUDO_QUEUE_BYTES = PSEUDO_QUEUE.encode()

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

    def __init__(self, connection: Link, channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.vhost = connection.vhost
        self.closing = False
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
        #: What the open transaction does at commit (publishes, acks, rejects), in order.
        self.tx_ops: list[Callable[[], object]] = []
        #: Publishes and acks in the open transaction (RabbitMQ's ``messages_uncommitted`` and
        #: ``acks_uncommitted``).
        self.tx_messages = self.tx_acks = 0
        #: What the channel did, for the management API's ``message_stats``: messages
        #: published, returned as unroutable (mandatory), and dropped as unroutable.
        self.published = self.returned = self.dropped = 0
        self._max_message_bytes = connection.node.limits.max_message_bytes
        #: Plugins' message hooks; ``None`` (the usual case) costs the hot path one test.
        self._hooks = connection.node.hooks
        #: Consumers, deliveries and acknowledgements (``broker.amqp.consuming``).
        self.consuming = Consuming(self)

    # -- state --------------------------------------------------------------------------------

    def update_active(self) -> None:
        """The connection's writability changed (see :meth:`Consuming.update_active`)."""
        self.consuming.update_active()

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
        if self._hooks is not None:
            self._hooks.published(self.vhost, exchange_name, message)
        if self.transactional:
            self._check_exchange(exchange_name)
            if exchange_name == "" and routing_key.startswith(PREFIX) and routing_key not in self.vhost.queues:
                self._reply(message, routing_key)  # as RabbitMQ: at once, and a rollback keeps it
            self.tx_ops.append(lambda: self._route(message, exchange_name, bits & 1))
            self.tx_messages += 1
            return
        self.published += 1
        self.vhost.published += 1
        log = self.vhost.journal
        recorded = log.recorded if confirms is not None and log is not None else 0
        if exchange_name == "":
            queue = self.vhost.queues.get(routing_key)
            if queue is not None:
                journal = queue.journal if type(queue) is WorkQueue else None
                if journal is not None and message.flags & FLAG_DELIVERY_MODE and message.persistent:
                    journal.published(message, self.vhost.name, (queue.name,))
                accepted = queue.enqueue(message)
            else:
                accepted = True
                if not (routing_key.startswith(PREFIX) and self._reply(message, routing_key)):
                    self.vhost.unroutable += 1
                    self.vhost.tallies.default_unroutable += 1
                    if not bits & 1:
                        self.dropped += 1
                if bits & 1:
                    self._return(message)  # a reply too, delivered or not, as RabbitMQ returns it
            if self._hooks is not None:
                self._hooks.routed(self.vhost, "", message, [queue] if queue is not None else [])
        else:
            accepted = self._route(message, exchange_name, bits & 1)
        if confirms is not None:
            # Logged: a persistent message's record, or a stream's message, waits for the log.
            logged = message.wal_id or (log is not None and log.recorded != recorded)
            if logged or confirms.waits:
                position = log.position if logged else 0  # type: ignore[union-attr]
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
        reply = self.connection.node.replies.of(self.consuming)
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

    def access_changed(self) -> None:
        """The user's permissions changed (``connection.access``): forget the exchanges this
        channel was allowed to publish to, so the next publish to each is checked again."""
        self._writable = None if self.connection.access is None else set()

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
        vhost = self.vhost
        try:
            exchange = self._check_exchange(exchange_name)
        except ChannelException:
            # (counted as published when it came, or at its transaction's commit: it was not)
            self.published -= 1
            vhost.published -= 1
            raise
        if exchange is not None:
            exchange.published_in += 1
        if exchange_name == EXTEND_EXCHANGE:
            return self._extend(message)
        if exchange_name == REDRIVE_EXCHANGE:
            return False  # its seal did not hold (see _redriven)
        queues = vhost.route(exchange, message)
        if exchange is not None:
            exchange.published_out += len(queues)
        elif not queues:  # the default exchange (a transaction's publishes to it come here)
            vhost.tallies.default_unroutable += 1
        if self._hooks is not None:
            self._hooks.routed(self.vhost, exchange_name, message, queues)
        accepted = self.vhost.enqueue_routed(queues, message)
        if not queues:
            self.vhost.unroutable += 1
            if mandatory:
                self._return(message)
            else:
                self.dropped += 1
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
        entry = self.consuming.unacked(tag)
        # (a stream's delivery has no visibility timeout to extend)
        if (
            entry is None
            or not isinstance(entry.queue, WorkQueue)
            or not isinstance(timeout, int)
            or isinstance(timeout, bool)
            or timeout <= 0
        ):
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
        self.returned += 1
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
        ops, self.tx_ops = self.tx_ops, []
        # (as RabbitMQ: a transaction's publishes count once committed)
        self.published += self.tx_messages
        self.vhost.published += self.tx_messages
        self.tx_messages = self.tx_acks = 0
        self.consuming.tx_taken = []
        for op in ops:
            op()
        self.send(commands.Tx.CommitOk())

    def _tx_rollback(self, method: commands.Tx.Rollback) -> None:
        if not self.transactional:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
        self.tx_ops = []
        self.tx_messages = self.tx_acks = 0
        consuming = self.consuming
        taken, consuming.tx_taken = consuming.tx_taken, []
        consuming.untake(taken)
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
        errors = self.connection.teardown_errors
        confirms = self.confirms
        try:
            if confirms is not None:
                confirms.flush()
        except Exception as error:
            errors.append(error)
        self.consuming.release(errors)
        if confirms is not None:
            confirms.forget()
        self.tx_ops = []
        self._publish = None


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


def _consuming(handler: Callable[[Consuming, Any], None]) -> Callable[[ChannelState, Any], None]:
    """A method handled by the channel's consuming side."""
    return lambda channel, method: handler(channel.consuming, method)


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
    commands.Basic.Qos: _consuming(Consuming.qos),
    commands.Basic.Consume: _consuming(Consuming.consume),
    commands.Basic.Cancel: _consuming(Consuming.cancel),
    commands.Basic.Get: _consuming(Consuming.get),
    commands.Basic.Recover: _consuming(Consuming.recover),
    commands.Basic.RecoverAsync: _consuming(Consuming.recover),
    commands.Confirm.Select: ChannelState._confirm_select,
    commands.Tx.Select: ChannelState._tx_select,
    commands.Tx.Commit: ChannelState._tx_commit,
    commands.Tx.Rollback: ChannelState._tx_rollback,
}

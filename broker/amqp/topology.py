"""The exchange and queue classes of a channel: declaring, binding and deleting topology.

Each handler takes the channel (:class:`broker.amqp.channel.ChannelState`) and the method, asks
the vhost (``broker.core.vhost``) after the channel's user's permissions, and answers. Nothing
here is on the path of a message; the channel keeps deliveries, acks, publishes, confirms and
transactions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

from postroom.broker.core.replyto import PSEUDO_QUEUE
from postroom.broker.core.stream import StreamQueue
from postroom.broker.errors import ChannelException, ReplyCode
from postroom.broker.wire.codec import declare_ok_method

if TYPE_CHECKING:
    from postroom.broker.amqp.seams import Channel


def exchange_declare(channel: Channel, method: commands.Exchange.Declare) -> None:
    """``exchange.declare``, active or passive."""
    channel.vhost.declare_exchange(
        method.exchange,
        method.exchange_type,
        passive=method.passive,
        durable=method.durable,
        auto_delete=method.auto_delete,
        internal=method.internal,
        arguments=method.arguments or {},
        access=channel.connection.access,
    )
    if not method.nowait:
        channel.send(commands.Exchange.DeclareOk())


def exchange_delete(channel: Channel, method: commands.Exchange.Delete) -> None:
    """``exchange.delete``: ``configure`` on the exchange, unless its name is reserved (refused after)."""
    access = channel.connection.access
    if access is not None and method.exchange and not method.exchange.startswith("amq."):
        access.check("configure", "exchange", method.exchange)  # after the reserved names
    channel.vhost.delete_exchange(method.exchange, if_unused=method.if_unused)
    if not method.nowait:
        channel.send(commands.Exchange.DeleteOk())


def exchange_bind(channel: Channel, method: commands.Exchange.Bind) -> None:
    """``exchange.bind`` (RabbitMQ's extension)."""
    _check_binding(channel, "exchange", method.destination, method.source, method.routing_key)
    channel.vhost.bind_exchange(method.destination, method.source, method.routing_key, method.arguments or {})
    if not method.nowait:
        channel.send(commands.Exchange.BindOk())


def exchange_unbind(channel: Channel, method: commands.Exchange.Unbind) -> None:
    """``exchange.unbind``."""
    _check_binding(channel, "exchange", method.destination, method.source, method.routing_key)
    channel.vhost.unbind_exchange(method.destination, method.source, method.routing_key, method.arguments or {})
    if not method.nowait:
        channel.send(commands.Exchange.UnbindOk())


def _check_binding(channel: Channel, kind: str, destination: str, source: str, routing_key: str) -> None:
    """A binding's permissions: write on its destination, read on its source exchange
    (unless either is the default exchange, which the binding itself refuses), and read
    on the routing key where the source is a topic exchange with topic permissions."""
    access = channel.connection.access
    if access is not None:
        access.check("write", kind, destination)
        if destination and source:
            access.check("read", "exchange", source)
            if source in access.topics and channel.is_topic(source):
                access.check_topic("read", source, routing_key)


def queue_declare(channel: Channel, method: commands.Queue.Declare) -> None:
    """``queue.declare``: the queue becomes the channel's current queue, and the connection's
    own when exclusive."""
    connection = channel.connection
    name = method.queue
    if name.startswith(PSEUDO_QUEUE):
        _declare_replies(channel, name, method.nowait)
        return
    if method.passive and not name:
        name = channel.current_queue(name)
    queue = channel.vhost.declare_queue(
        name,
        connection,
        passive=method.passive,
        durable=method.durable,
        exclusive=method.exclusive,
        auto_delete=method.auto_delete,
        arguments=method.arguments or {},
        access=channel.connection.access,
    )
    if not method.passive:
        channel.vhost.tallies.queues_declared += 1
    if queue.owner is connection and queue not in connection.exclusive_queues:
        connection.exclusive_queues.append(queue)
    channel.last_queue = queue.name
    if not method.nowait:
        # A stream's declare-ok counts no consumers, as RabbitMQ 3.10's (rabbit_stream_queue:stat).
        consumers = 0 if queue.kind == "stream" else queue.consumer_count
        connection.out.append(declare_ok_method(channel.id, queue.name, queue.message_count, consumers))


def _declare_replies(channel: Channel, name: str, nowait: bool) -> None:
    """``queue.declare`` of ``amq.rabbitmq.reply-to`` (or of a reply consumer's name): as in
    RabbitMQ, passive whatever it asks, ``declare-ok`` with one consumer for the pseudo-queue
    and for a reply consumer that exists, 404 for any other name."""
    if name != PSEUDO_QUEUE and channel.connection.node.replies.find(name) is None:
        raise ChannelException(ReplyCode.NOT_FOUND, f"no queue '{name}' in vhost '{channel.vhost.name}'")
    channel.last_queue = name
    if not nowait:
        channel.connection.out.append(declare_ok_method(channel.id, name, 0, 1))


def queue_bind(channel: Channel, method: commands.Queue.Bind) -> None:
    """``queue.bind``."""
    queue = channel.current_queue(method.queue)
    _check_binding(channel, "queue", queue, method.exchange, method.routing_key)
    channel.vhost.bind_queue(queue, method.exchange, method.routing_key, method.arguments or {}, channel.connection)
    if not method.nowait:
        channel.send(commands.Queue.BindOk())


def queue_unbind(channel: Channel, method: commands.Queue.Unbind) -> None:
    """``queue.unbind`` (which has no ``nowait``)."""
    queue = channel.current_queue(method.queue)
    _check_binding(channel, "queue", queue, method.exchange, method.routing_key)
    channel.vhost.unbind_queue(queue, method.exchange, method.routing_key, method.arguments or {}, channel.connection)
    channel.send(commands.Queue.UnbindOk())


def queue_purge(channel: Channel, method: commands.Queue.Purge) -> None:
    """``queue.purge``: ``read`` on the queue."""
    queue = channel.vhost.queue(channel.readable_queue(method.queue), channel.connection)
    if isinstance(queue, StreamQueue):
        raise queue.refusal("queue.purge")
    count = queue.purge()
    if not method.nowait:
        channel.send(commands.Queue.PurgeOk(message_count=count))


def queue_delete(channel: Channel, method: commands.Queue.Delete) -> None:
    """``queue.delete``: ``configure`` on the queue; an exclusive one leaves its connection's list."""
    name = channel.current_queue(method.queue)
    access = channel.connection.access
    if access is not None:
        access.check("configure", "queue", name)
    queue, count = channel.vhost.delete_queue(
        name, channel.connection, if_unused=method.if_unused, if_empty=method.if_empty
    )
    if queue is not None and queue.owner is not None:
        owner = queue.owner
        if queue in owner.exclusive_queues:  # type: ignore[attr-defined]
            owner.exclusive_queues.remove(queue)  # type: ignore[attr-defined]
    if not method.nowait:
        channel.send(commands.Queue.DeleteOk(message_count=count))

"""Super streams and single-active-consumer groups over the stream protocol.

A super stream is a direct exchange (``x-super-stream``) whose partitions are the streams bound
to it, each with its binding key and its place (:func:`super_stream_bindings`):
``create_super_stream`` and ``delete_super_stream`` (RabbitMQ 3.13's), ``partitions`` and
``route`` (:class:`SuperStreams`). A subscription with ``single-active-consumer`` joins its
group on its stream, of which one member is active at a time, as RabbitMQ's coordinator
chooses it (:func:`_rebalance`); the members are told with ``consumer_update``, and the active
one answers where it reads from (:class:`ConsumerGroups`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from postroom.broker.core.stream import StreamQueue
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.errors import ChannelCrash, ChannelException
from postroom.broker.streams.session import Session
from postroom.broker.streams.topology import clean_name, stream_arguments
from postroom.broker.wire import streamframes as wire
from postroom.exchanges.partitions import PARTITION_ORDER, SUPER_STREAM, partition_order

if TYPE_CHECKING:
    from postroom.broker.core.entry import Queue

#: The most partitions ``create_super_stream`` makes (a partitioned stream's in the YAML).
MAX_SUPER_STREAM_PARTITIONS = 1024


def super_stream_bindings(vhost: VirtualHost, name: str) -> list[tuple[str, str, int | None]] | None:
    """The streams bound to exchange ``name``: ``(stream, binding key, partition order)``
    each, in their partition order (those without one last); ``None``: no such exchange."""
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        return None
    bound = []
    for index, (destination, key, arguments) in enumerate(exchange.router.bindings()):
        if isinstance(destination, StreamQueue):
            order = partition_order(arguments)
            bound.append((order is None, order or 0, index, destination.name, key, order))
    return [(stream, key, order) for *_, stream, key, order in sorted(bound)]


def partition_index(vhost: VirtualHost, stream: StreamQueue, super_stream: str | None) -> int:
    """``stream``'s place in super stream ``super_stream`` (a subscription's property), as
    RabbitMQ 3.11 finds it (``rabbit_stream_manager``'s ``partition_index``): its binding's
    partition order, else the number after the last ``-`` of its name, else -1 (its group
    then follows a lone stream's rules), -1 as well without such a super stream or binding."""
    bound = super_stream_bindings(vhost, super_stream) if super_stream is not None else None
    orders = [order for name, _key, order in bound or () if name == stream.name]
    if not orders:
        return -1
    if orders[0] is not None:
        return orders[0]
    suffix = stream.name.rpartition("-")[2] if "-" in stream.name else ""
    return int(suffix) if suffix.isascii() and suffix.isdigit() else -1


class SuperStreams:
    """The commands of ``session`` on super streams."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def create(self, command: wire.CreateSuperStream) -> None:
        """RabbitMQ 3.13's ``create_super_stream``: a direct exchange (``x-super-stream``) and
        its partitions, each bound with its key and its place; all or nothing."""
        session, partitions, keys = self.session, command.partitions, command.binding_keys

        def answer(code: int) -> None:
            session.answer(wire.CREATE_SUPER_STREAM, command.correlation, code)

        name = clean_name(command.name)
        if not name or name.startswith("amq."):
            answer(wire.PRECONDITION_FAILED)
            return
        allowed = (
            session.permitted("configure", name, "exchange")
            and session.permitted("read", name, "exchange")
            and all(session.permitted("configure", p) and session.permitted("write", p) for p in partitions)
        )
        if not allowed:
            answer(wire.ACCESS_REFUSED)
            return
        valid = all(p and not p.startswith("amq.") for p in partitions) and len(set(partitions)) == len(partitions)
        if not partitions or len(partitions) != len(keys) or not valid or len(partitions) > MAX_SUPER_STREAM_PARTITIONS:
            answer(wire.PRECONDITION_FAILED)
            return
        vhost = session.opened_vhost
        if name in vhost.exchanges or any(p in vhost.queues for p in partitions):
            answer(wire.STREAM_ALREADY_EXISTS)
            return
        declared = stream_arguments(session, name, command.arguments)
        if declared is None:
            return
        made: list[Queue] = []
        try:
            vhost.declare_exchange(name, "direct", durable=True, arguments={SUPER_STREAM: True})
            for order, (partition, key) in enumerate(zip(partitions, keys, strict=True)):
                made.append(vhost.declare_queue(partition, session, durable=True, arguments=declared))
                vhost.bind_queue(partition, name, key, {PARTITION_ORDER: order}, session)
        except (ChannelException, ChannelCrash):
            for queue in made:  # (RabbitMQ rolls back what it made, in the same way)
                vhost.remove_queue(queue)
            vhost.delete_exchange(name)
            answer(wire.PRECONDITION_FAILED)
            return
        answer(wire.OK)

    def delete(self, command: wire.DeleteSuperStream) -> None:
        """RabbitMQ 3.13's ``delete_super_stream``: the exchange and its partitions' streams."""
        session, correlation, name = self.session, command.correlation, command.name
        vhost = session.opened_vhost
        partitions = super_stream_bindings(vhost, name)
        allowed = session.permitted("configure", name, "exchange") and (
            partitions is None
            or all(
                session.permitted("configure", p) and session.permitted("write", p) for p, _key, _order in partitions
            )
        )
        if not allowed:
            session.answer(wire.DELETE_SUPER_STREAM, correlation, wire.ACCESS_REFUSED)
            return
        if partitions is None:
            session.answer(wire.DELETE_SUPER_STREAM, correlation, wire.STREAM_DOES_NOT_EXIST)
            return
        session.answer(wire.DELETE_SUPER_STREAM, correlation, wire.OK)
        vhost.delete_exchange(name)
        for partition, _key, _order in partitions:
            stream = vhost.queues.get(partition)
            if isinstance(stream, StreamQueue):
                vhost.remove_queue(stream)

    def route(self, command: wire.Route) -> None:
        """``route``: the partitions whose binding key is the routing key (as RabbitMQ routes it
        through the super stream's direct exchange); answered in the protocol's list form."""
        bound = super_stream_bindings(self.session.opened_vhost, command.super_stream)
        if bound is None:
            self.session.answer(wire.ROUTE, command.correlation, wire.STREAM_DOES_NOT_EXIST, wire.strings([]))
            return
        streams = list(dict.fromkeys(stream for stream, key, _ in bound if key == command.routing_key))
        self.session.answer(wire.ROUTE, command.correlation, wire.OK, wire.strings(streams))

    def partitions(self, command: wire.Partitions) -> None:
        bound = super_stream_bindings(self.session.opened_vhost, command.super_stream)
        if bound is None:
            self.session.answer(wire.PARTITIONS, command.correlation, wire.STREAM_DOES_NOT_EXIST, wire.strings([]))
            return
        streams = list(dict.fromkeys(stream for stream, _, _ in bound))
        self.session.answer(wire.PARTITIONS, command.correlation, wire.OK, wire.strings(streams))


class Member(Protocol):
    """A subscription in a single-active-consumer group, as its group sees it
    (``broker.streams.subscriptions.Member``)."""

    id: int
    stream: StreamQueue
    #: Its group (``None``: none), its stream's place in the super stream the group is over
    #: (-1: none), and whether it waits (not its group's active member).
    group: str | None
    partition: int
    waiting: bool
    #: Where it subscribed from.
    spec: wire.Offset
    #: Its connection's groups.
    groups: ConsumerGroups[Any]


#: The kind of member a connection's groups hold.
M = TypeVar("M", bound=Member)


class ConsumerGroups(Generic[M]):
    """The ``consumer_update`` requests of ``session`` to its subscriptions in groups, and the
    client's answers; ``restart`` has a member made active read on from an offset."""

    def __init__(self, session: Session, restart: Callable[[M, wire.Offset], None]) -> None:
        self.session = session
        self._restart = restart
        #: ``consumer_update`` requests sent and not answered yet, by correlation id.
        self.pending: dict[int, tuple[M, bool]] = {}
        self._updates = 0

    def join(self, reader: M, group: str, super_stream: str | None) -> None:
        """``reader`` joins ``group`` on its stream (over the partition of ``super_stream``
        that its stream is, when it names one): it waits until it is told it is active."""
        stream = reader.stream
        reader.group, reader.waiting = group, True
        reader.partition = partition_index(self.session.opened_vhost, stream, super_stream)
        stream.stream_groups.setdefault(group, []).append(reader)
        _rebalance(stream, group)

    def consumer_update(self, reader: M, active: bool) -> None:
        """Tell the client ``reader`` becomes its group's active member (it answers where to
        read from) or stops being it."""
        self._updates += 1
        self.pending[self._updates] = (reader, active)
        body = wire.u32(self._updates) + bytes((reader.id, 1 if active else 0))
        self.session.out.append(wire.frame(wire.CONSUMER_UPDATE, body))
        self.session.wake()

    def answered(self, command: wire.ConsumerUpdateResponse) -> None:
        """The client's answer to ``consumer_update``. A member made active reads from where it
        says, unless it was told to step down since; one that stepped down lets its group's next
        member be made active (RabbitMQ's reader: ``activate_consumer``)."""
        pending = self.pending.pop(command.correlation, None)
        if pending is None:
            return  # (its subscription went, or its stream)
        reader, active = pending
        group = reader.group or ""
        if reader not in reader.stream.stream_groups.get(group, []):
            return
        if not active:
            _rebalance(reader.stream, group)
        elif _activating(reader) is None:
            # (whatever the code, as RabbitMQ's reader, which logs one that is not OK)
            # (an answer of no offset, or one of no kind there is: where it subscribed from)
            self._restart(reader, command.offset or reader.spec)

    def released(self, readers: list[M]) -> None:
        """The connection of ``readers`` is gone: they leave their groups, whose next members
        are told (on their own connections) once all of them left."""
        for reader in readers:
            leave(reader, rebalance=False)
        for reader in readers:
            if reader.group is not None:
                _rebalance(reader.stream, reader.group)


def leave(reader: Member, rebalance: bool = True) -> None:
    """``reader`` leaves its group (unsubscribed, or its connection gone), and what it was asked
    and did not answer with it: the next member is made active if it was the active one or was
    stepping down (as RabbitMQ's reader does for a subscription gone meanwhile), or the active
    one steps down if the group's change moves the partition (with ``rebalance``)."""
    if reader.group is None:
        return
    members = reader.stream.stream_groups.get(reader.group, [])
    if reader in members:
        members.remove(reader)
        pending = reader.groups.pending
        for correlation in [key for key, (asked, _) in pending.items() if asked is reader]:
            del pending[correlation]
        if rebalance:
            _rebalance(reader.stream, reader.group)


def _rebalance(stream: StreamQueue, group: str) -> None:
    """Give ``group`` the active member RabbitMQ's coordinator gives it
    (``rabbit_stream_sac_coordinator``): over the partition at place ``p`` of a super stream,
    member ``p mod n`` of the ``n`` members in the order they came; on a lone stream, the active
    member while it stays, then the first to have come. An active member that should no longer
    be is told to step down, and the next one is told it is active only once it answered (or
    left), so that it reads on from where the last stopped."""
    members: list[Member] | None = stream.stream_groups.get(group)
    if not members:
        stream.stream_groups.pop(group, None)
        return
    asked = [_activating(member) for member in members]
    active = next((m for m, told in zip(members, asked, strict=True) if not m.waiting or told), None)
    if active is not None:
        if members[0].partition >= 0 and active is not _chosen(members):
            active.waiting = True  # (sent nothing more: it answers once it handled what it has)
            active.groups.consumer_update(active, False)
        return
    if False in asked:
        return  # (a member steps down: the next is made active once it answered, or left)
    chosen = _chosen(members)
    chosen.groups.consumer_update(chosen, True)


def _chosen(members: list[Member]) -> Member:
    """The member a group of ``members`` should have active (see :func:`_rebalance`)."""
    if members[0].partition >= 0:
        return members[members[0].partition % len(members)]
    return members[0]


def _activating(member: Member) -> bool | None:
    """What ``member`` was last asked and has not answered yet: ``True``, to become its group's
    active member; ``False``, to step down; ``None``: nothing."""
    asked = None
    for reader, active in member.groups.pending.values():  # (in the order asked)
        if reader is member:
            asked = active
    return asked

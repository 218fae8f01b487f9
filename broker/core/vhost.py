"""A virtual host: its exchanges, queues and the bindings between them, and routing.

Errors are raised where they are detected, with RabbitMQ's reply code and wording
(``NOT_FOUND - no queue 'x' in vhost '/'``); the connection turns them into ``channel.close``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from postroom.broker.core.access import Access
from postroom.broker.core.dead_lettering import DeadLetterReason, dead_lettered, is_cycle
from postroom.broker.core.entry import Entry, Queue
from postroom.broker.core.exchange import Exchange
from postroom.broker.core.histogram import Histogram
from postroom.broker.core.journal import arguments_table, policy_record
from postroom.broker.core.kinds import STREAM, QueueKind, describe, is_int, kind_of, not_an_integer
from postroom.broker.core.message import Message
from postroom.broker.core.policy import Policy, alternate_exchange, choose, queue_arguments
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.settings import QueueSettings
from postroom.broker.core.stores import QueuePager, StreamStorage
from postroom.broker.core.stream import StreamQueue
from postroom.broker.core.timers import Scheduler
from postroom.broker.errors import ChannelException, ReplyCode
from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import Bound, ExchangeDeclared, QueueDeclared, StreamOffset
from postroom.broker.wire.codec import FLAG_DELIVERY_MODE
from postroom.exchanges.interfaces import BindingInvalid
from postroom.exchanges.registry import ExchangeTypeRegistry, InvalidExchangeType, default_registry

if TYPE_CHECKING:
    from postroom.broker.core.dead_letter_events import DeadLetterLog
    from postroom.broker.core.hooks import HookChain
    from postroom.broker.core.journal import Journal

#: The exchanges every virtual host has, as in RabbitMQ.
STANDARD_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
    ("amq.postroom.extend", "direct"),
    ("amq.postroom.redrive", "direct"),
)

#: Publishing here extends a delivery's visibility timeout (``docs/configuration.md``, lease extension).
EXTEND_EXCHANGE = "amq.postroom.extend"
#: Publishing a sealed dead letter here sends it back to the queue it died in (``broker.core.seal``).
REDRIVE_EXCHANGE = "amq.postroom.redrive"

#: Bound on exchange-to-exchange hops for one publish: a cycle of bindings is legal, so
#: routing keeps a visited set; this caps the work a deep (acyclic) chain can cause.
MAX_ROUTING_HOPS = 64


def recorded(queue: Queue) -> bool:
    """Whether ``queue``'s declaration and bindings are in the log: a durable queue on a broker
    with a log (its messages are then recorded too), or a stream (which keeps its own)."""
    return isinstance(queue, StreamQueue) or (isinstance(queue, WorkQueue) and queue.journal is not None)


class Tallies:
    """A vhost's counts for the management API that the hot path does not touch, kept apart:
    CPython keeps an object's attributes in a shared-key table only up to 30 names, and a
    :class:`VirtualHost` over that reads each of them more slowly."""

    __slots__ = ("queues_declared", "queues_created", "queues_deleted", "default_unroutable", "gone_published_in")

    def __init__(self) -> None:
        #: Queues created and deleted (by clients, definitions, auto-delete or expiry).
        self.queues_created = 0
        self.queues_deleted = 0
        #: Declarations of queues by clients (``queue.declare``, not passive; the management API's).
        self.queues_declared = 0
        #: Messages published to the default exchange that no queue took.
        self.default_unroutable = 0
        #: Messages deleted exchanges had taken (see :meth:`VirtualHost.default_exchange_counts`).
        self.gone_published_in = 0


class VirtualHost:
    """Exchanges, queues and bindings of one virtual host.

    :param name: the vhost name, e.g. ``"/"``
    :param registry: the exchange types that ``exchange.declare`` may name
    :param rng: source of server-generated queue names (injected so tests are repeatable)
    :param clock: time and timers for TTLs, visibility timeouts and queue expiry
    """

    def __init__(
        self,
        name: str = "/",
        registry: ExchangeTypeRegistry | None = None,
        rng: random.Random | None = None,
        clock: Scheduler | None = None,
    ) -> None:
        self.name = name
        self.registry = registry or default_registry()
        self._rng = rng or random.Random()
        self.clock = clock
        #: The write-ahead log's journal (``None``: nothing is persisted).
        self.journal: Journal | None = None
        #: What pages the bodies of deep queues to disk (``broker.storage.body_paging.Pager``; ``None``: nothing).
        self.pager: QueuePager | None = None
        #: Where stream queues keep their messages (``broker.core.stream.StreamStore``); ``None``:
        #: this broker has no storage, and a stream's declaration is refused.
        self.streams: StreamStorage | None = None
        #: The dead-letter event log (``None``: dead letters are not recorded for analysis).
        self.dead_letters: DeadLetterLog | None = None
        #: Dead-lettered messages dropped: no such dead-letter exchange, or a cycle.
        self.dead_letters_dropped = 0
        #: The queues dead letters reached in this run, with how many each took.
        self.dead_letter_queues: Counter[str] = Counter()
        #: Messages published by clients into this vhost, and those no queue took (for metrics).
        self.published = 0
        self.unroutable = 0
        #: Unroutable mandatory messages returned; basic.get answered with a message, without one.
        self.returned = 0
        #: Publishes confirmed (basic.ack) to publishers in confirm mode.
        self.confirmed = 0
        self.gets = 0
        self.gets_empty = 0
        #: RabbitMQ's vhost limits (``None``: none): open connections, queues.
        self.max_connections: int | None = None
        self.max_queues: int | None = None
        #: RabbitMQ's vhost metadata: what operators note about it (``PUT /api/vhosts/NAME``).
        self.description = ""
        self.tags: tuple[str, ...] = ()
        #: Policies and operator policies by name (see ``broker.core.policy``).
        self.policies: dict[str, Policy] = {}
        self.operator_policies: dict[str, Policy] = {}
        #: Connections open on this vhost now.
        self.connection_count = 0
        #: Publish-to-deliver seconds of sampled messages, for every queue of this vhost.
        self.latency = Histogram()
        #: The node's message hooks (``None``: no plugin added any).
        self.hooks: HookChain | None = None
        #: Counts of the management API's that no message's path reads (:class:`Tallies`).
        self.tallies = Tallies()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        #: Given to every queue: called when a dispatch left entries for later (see WorkQueue.dispatch).
        self.on_backlog: Callable[[Queue], None] | None = None
        for exchange_name, type_name in STANDARD_EXCHANGES:
            self._add_exchange(exchange_name, type_name, True, False, False, {})

    def default_exchange_counts(self) -> tuple[int, int]:
        """Messages published to the default exchange, and the queues they reached (each reaches
        one or none). Counted from what the others took, so that its publishes cost nothing
        more: every publish is in :attr:`published`, and every one to a named exchange (deleted
        since or not) in that exchange's ``published_in``."""
        tallies = self.tallies
        named = tallies.gone_published_in + sum(exchange.published_in for exchange in self.exchanges.values())
        published = self.published - named
        return published, published - tallies.default_unroutable

    # -- lookups ------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"in vhost '{self.name}'"

    def exchange(self, name: str) -> Exchange:
        """The exchange called ``name``.

        :raises ChannelException: 404 NOT_FOUND.
        """
        try:
            return self.exchanges[name]
        except KeyError:
            raise ChannelException(ReplyCode.NOT_FOUND, f"no exchange '{name}' {self._where()}") from None

    def queue(self, name: str, connection: object | None = None) -> Queue:
        """The queue called ``name``, checking exclusive ownership when ``connection`` is given.

        :raises ChannelException: 404 NOT_FOUND, or 405 RESOURCE_LOCKED for another
            connection's exclusive queue.
        """
        try:
            queue = self.queues[name]
        except KeyError:
            raise ChannelException(ReplyCode.NOT_FOUND, f"no queue '{name}' {self._where()}") from None
        if connection is not None and queue.owner is not None and queue.owner is not connection:
            raise self._locked(name)
        return queue

    def _locked(self, name: str) -> ChannelException:
        return ChannelException(
            ReplyCode.RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{name}' {self._where()}. It could be "
            "originally declared on another connection or the exclusive property value does not "
            "match that of the original declaration.",
        )

    # -- exchanges ----------------------------------------------------------------------------

    def _add_exchange(
        self, name: str, type_name: str, durable: bool, auto_delete: bool, internal: bool, arguments: Mapping[str, Any]
    ) -> Exchange:
        exchange_type = self.registry.get(type_name)
        exchange = Exchange(
            name, type_name, exchange_type.new_router(arguments), durable, auto_delete, internal, arguments
        )
        self.exchanges[name] = exchange
        if self.policies:
            self._apply_exchange_policy(exchange)
        return exchange

    # -- policies -----------------------------------------------------------------------------

    def set_policy(self, policy: Policy, operator: bool = False) -> None:
        """Add or replace a policy (an operator policy with ``operator``), record it in the
        write-ahead log, and apply the policies to every queue and exchange at once."""
        table = self.operator_policies if operator else self.policies
        if table.get(policy.name) == policy:  # the same again: nothing changes, as in RabbitMQ
            return
        table[policy.name] = policy
        if self.journal is not None:
            self.journal.policy_set(self.name, policy, operator)
        self.apply_policies()

    def clear_policy(self, name: str, operator: bool = False) -> bool:
        """Remove a policy (recorded) and apply what is left; whether there was one of that name."""
        if (self.operator_policies if operator else self.policies).pop(name, None) is None:
            return False
        if self.journal is not None:
            self.journal.policy_cleared(self.name, name, operator)
        self.apply_policies()
        return True

    def apply_policies(self) -> None:
        """Choose again the policies of every exchange and queue; a queue whose policies changed
        takes its new settings at once (``WorkQueue.apply_settings``)."""
        for exchange in list(self.exchanges.values()):
            self._apply_exchange_policy(exchange)
        for queue in list(self.queues.values()):
            policy, operator = self._queue_policies(queue.name, kind_of(queue.arguments))
            if policy != queue.policy or operator != queue.operator_policy:
                queue.policy, queue.operator_policy = policy, operator
                queue.apply_settings(QueueSettings.from_arguments(queue_arguments(queue.arguments, policy, operator)))

    def _queue_policies(self, name: str, kind: QueueKind) -> tuple[Policy | None, Policy | None]:
        unsupported = kind.unsupported_policies
        return (
            choose(self.policies.values(), "queue", name, unsupported),
            choose(self.operator_policies.values(), "queue", name, unsupported),
        )

    def _apply_exchange_policy(self, exchange: Exchange) -> None:
        exchange.policy = choose(self.policies.values(), "exchange", exchange.name)
        exchange.alternate = alternate_exchange(exchange.arguments, exchange.policy) or None

    def declare_exchange(
        self,
        name: str,
        type_name: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        access: Access | None = None,
    ) -> Exchange:
        """``exchange.declare``: create an exchange, or check an existing one is equivalent.

        :raises ChannelException: 404 (passive, missing), 403 (reserved name), 406 (inequivalent
            redeclaration, unknown type, bad arguments).
        """
        arguments = arguments or {}
        if passive:
            if name == "":
                raise ChannelException(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange")
            return self.exchange(name)
        existing = self.exchanges.get(name)
        if access is not None and name:
            access.check("configure", "exchange", name)
        if name == "" or (name.startswith("amq.") and existing is None):
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED,
                f"exchange name '{name}' contains reserved prefix 'amq.*'"
                if name
                else "operation not permitted on the default exchange",
            )
        if existing is not None:
            for field, current, received in (
                ("type", existing.type_name, type_name),
                ("durable", existing.durable, durable),
                ("auto_delete", existing.auto_delete, auto_delete),
                ("internal", existing.internal, internal),
                (
                    "alternate-exchange",
                    existing.arguments.get("alternate-exchange"),
                    arguments.get("alternate-exchange"),
                ),
            ):
                if current != received:
                    raise ChannelException(
                        ReplyCode.PRECONDITION_FAILED,
                        f"inequivalent arg '{field}' for exchange '{name}' {self._where()}: "
                        f"received '{describe(received)}' but current is '{describe(current)}'",
                    )
            return existing
        try:
            exchange_type = self.registry.get(type_name)
        except InvalidExchangeType:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"invalid exchange type '{type_name}'") from None
        try:
            exchange_type.validate_arguments(arguments)
        except BindingInvalid as err:
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED, f"invalid arguments for exchange '{name}': {err}"
            ) from err
        alternate = arguments.get("alternate-exchange")
        if alternate is not None and not isinstance(alternate, str):
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED, f"invalid arg 'alternate-exchange' for exchange '{name}': not a string"
            )
        if access is not None and alternate is not None:
            access.check("read", "exchange", name)
            access.check("write", "exchange", alternate)
        exchange = self._add_exchange(name, type_name, durable, auto_delete, internal, arguments)
        if durable and self.journal is not None:
            self.journal.exchange_declared(self.name, name, type_name, auto_delete, internal, arguments)
        return exchange

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        """``exchange.delete``: remove an exchange and every binding to or from it.

        Deleting a missing exchange succeeds, as in RabbitMQ 3.x.

        :raises ChannelException: 403 for the default and ``amq.*`` exchanges, 406 when
            ``if_unused`` and it has bindings.
        """
        if name == "" or name.startswith("amq."):
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED,
                f"exchange name '{name}' contains reserved prefix 'amq.*'"
                if name
                else "operation not permitted on the default exchange",
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and len(exchange.router):
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"exchange '{name}' {self._where()} in use")
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        self.tallies.gone_published_in += exchange.published_in
        if exchange.durable and self.journal is not None:
            self.journal.exchange_deleted(self.name, exchange.name)
        for destination, _key, _arguments in list(exchange.router.bindings()):
            cast("Queue | Exchange", destination).sources.discard(exchange)
        for source in list(exchange.sources):
            source.router.unbind_all(exchange)
            self._maybe_auto_delete(source)
        exchange.sources.clear()

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not len(exchange.router) and exchange.name in self.exchanges:
            self._remove_exchange(exchange)

    # -- bindings -----------------------------------------------------------------------------

    def _source(self, name: str) -> Exchange:
        if name == "":
            raise ChannelException(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange")
        return self.exchange(name)

    def _bind(
        self, source: Exchange, destination: Queue | Exchange, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        try:
            new = source.router.bind(destination, routing_key, arguments)
        except BindingInvalid as err:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, str(err)) from err
        destination.sources.add(source)
        if new:
            self._journal_binding(True, source, destination, routing_key, arguments)

    def _journal_binding(
        self, bound: bool, source: Exchange, destination: Any, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        """Record a binding whose ends are both durable (RabbitMQ's rule for durable bindings)."""
        journal = self.journal
        to_queue = isinstance(destination, (WorkQueue, StreamQueue))
        durable_end = recorded(destination) if to_queue else destination.durable
        if journal is None or not source.durable or not durable_end:
            return
        record = journal.bound if bound else journal.unbound
        record(self.name, source.name, destination.name, to_queue, routing_key, arguments)

    def _unbind(
        self, source: Exchange, destination: Queue | Exchange, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        if source.router.unbind(destination, routing_key, arguments):
            self._journal_binding(False, source, destination, routing_key, arguments)
        if not any(bound is destination for bound, _k, _a in source.router.bindings()):
            destination.sources.discard(source)
        self._maybe_auto_delete(source)

    def bind_queue(
        self, queue_name: str, exchange_name: str, routing_key: str, arguments: Mapping[str, Any], connection: object
    ) -> None:
        """``queue.bind``.

        :raises ChannelException: 404 for a missing queue or exchange, 403 for the default
            exchange, 405 for another connection's exclusive queue, 406 for an invalid binding.
        """
        queue = self.queue(queue_name, connection)
        self._bind(self._source(exchange_name), queue, routing_key, arguments)

    def unbind_queue(
        self, queue_name: str, exchange_name: str, routing_key: str, arguments: Mapping[str, Any], connection: object
    ) -> None:
        """``queue.unbind``; unbinding what is not bound, or a queue or an exchange that does not
        exist, succeeds, as in RabbitMQ (its unbind is idempotent; fixture teardowns rely on it)."""
        if queue_name not in self.queues or (exchange_name and exchange_name not in self.exchanges):
            return
        queue = self.queue(queue_name, connection)
        self._unbind(self._source(exchange_name), queue, routing_key, arguments)

    def bind_exchange(
        self, destination_name: str, source_name: str, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        """``exchange.bind`` (RabbitMQ's exchange-to-exchange bindings)."""
        destination = self._source(destination_name)
        self._bind(self._source(source_name), destination, routing_key, arguments)

    def unbind_exchange(
        self, destination_name: str, source_name: str, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        """``exchange.unbind``; as ``queue.unbind``, idempotent."""
        if any(name and name not in self.exchanges for name in (destination_name, source_name)):
            return
        destination = self._source(destination_name)
        self._unbind(self._source(source_name), destination, routing_key, arguments)

    # -- queues -------------------------------------------------------------------------------

    def new_queue_name(self) -> str:
        """A server-generated queue name in RabbitMQ's form (``amq.gen-`` and 22 characters)."""
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        while True:
            name = "amq.gen-" + "".join(self._rng.choice(alphabet) for _ in range(22))
            if name not in self.queues:
                return name

    def consumer_priority(self, queue: Queue, arguments: Mapping[str, Any]) -> int:
        """A ``basic.consume``'s ``x-priority`` (0 when absent), checked as RabbitMQ checks it.

        :raises ChannelException: 406, for a value that is not an integer
        """
        priority = arguments.get("x-priority", 0)
        if not is_int(priority):
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg 'x-priority' for queue '{queue.name}' {self._where()}: {not_an_integer(priority)}",
            )
        return cast(int, priority)

    def declare_queue(
        self,
        name: str,
        connection: object,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        access: Access | None = None,
    ) -> Queue:
        """``queue.declare``: create a queue, or check an existing one is equivalent.

        :param name: the name; ``""`` asks for a server-generated one
        :param connection: the declaring connection (owner of an exclusive queue)
        :raises ChannelException: 404 (passive, missing), 403 (``amq.`` prefix), 405 (an exclusive
            queue declared by another connection or without ``exclusive``, or a shared one
            declared with it), 406 (inequivalent redeclaration, bad arguments).
        """
        arguments = arguments or {}
        if passive:
            queue = self.queue(name, connection)
            queue.touch()  # as RabbitMQ's: a passive declare is a use too (its idle time restarts)
            return queue
        if name.startswith("amq.") and connection is not None:
            # Only clients are kept out of 'amq.': the broker itself (connection None: recovery,
            # plugins) may hold queues there, e.g. a delayed-message exchange's store.
            raise ChannelException(ReplyCode.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
        kind = kind_of(arguments)
        if name == "":
            if not kind.server_named:
                raise ChannelException(
                    ReplyCode.PRECONDITION_FAILED, f"Cannot declare a server-named queue for type {kind.type_name}"
                )
            name = self.new_queue_name()
        if access is not None:
            access.check("configure", "queue", name)
        # As RabbitMQ's: an exclusive queue is never durable, whatever the declare says.
        durable = durable and not exclusive
        existing = self.queues.get(name)
        if existing is not None:
            # RabbitMQ checks exclusive access first, strictly: the queue's owner must be the
            # one this declare names (this connection if exclusive, else none).
            if existing.owner is not (connection if exclusive else None):
                raise self._locked(name)
            kind_of(existing.arguments).check_equivalent(existing, self._where(), durable, auto_delete, arguments)
            existing.touch()
            return existing
        # RabbitMQ checks the limit for new queues only, before their arguments.
        if self.max_queues is not None and 0 <= self.max_queues <= len(self.queues):  # (negative: none)
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"cannot declare queue '{name}': queue limit in vhost '{self.name}' ({self.max_queues}) is reached",
            )
        kind.check_arguments(name, self._where(), arguments)
        if kind.properties is not None:
            kind.properties(name, self._where(), durable, exclusive, auto_delete, arguments)
        if access is not None and "x-dead-letter-exchange" in arguments:
            access.check("read", "queue", name)
            access.check("write", "exchange", str(arguments["x-dead-letter-exchange"]))
        policy, operator = self._queue_policies(name, kind) if self.policies or self.operator_policies else (None, None)
        queue = kind.create(  # a WorkQueue or a StreamQueue (see kinds.py)
            name,
            self.name,
            durable=durable,
            owner=connection if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
            settings=QueueSettings.from_arguments(queue_arguments(arguments, policy, operator)),
            clock=self.clock,
            streams=self.streams,
        )
        queue.policy, queue.operator_policy = policy, operator
        if kind is STREAM:
            queue.apply_settings(queue.settings)  # its policy's stream keys
        queue.observer = self
        if self.pager is not None and isinstance(queue, WorkQueue):
            self.pager.attach(queue)
        self.tallies.queues_created += 1
        self.queues[name] = queue
        if durable and self.journal is not None:
            if isinstance(queue, WorkQueue):  # (a stream keeps its own log)
                queue.journal = self.journal
            self.journal.queue_declared(self.name, name, auto_delete, arguments)
        return queue

    def set_queue_expiry(self, queue: WorkQueue, expires: int | None) -> None:
        """A new ``x-expires`` (milliseconds; ``None``: none) for ``queue``, as an MQTT 5.0
        session's new expiry interval sets it (RabbitMQ's ``update_session_expiry_interval``):
        applied at once with its policies, its idle time counted again, and its declaration
        written to the log again (recovery keeps a queue's last)."""
        arguments = dict(queue.arguments)
        if expires is None:
            arguments.pop("x-expires", None)
        else:
            arguments["x-expires"] = expires
        if arguments == queue.arguments:
            return
        queue.arguments = arguments
        if queue.durable and self.journal is not None:
            self.journal.queue_declared(self.name, queue.name, queue.auto_delete, arguments)
        effective = queue_arguments(arguments, queue.policy, queue.operator_policy)
        queue.apply_settings(QueueSettings.from_arguments(effective))

    def delete_queue(
        self, name: str, connection: object, if_unused: bool = False, if_empty: bool = False
    ) -> tuple[Queue | None, int]:
        """``queue.delete``: remove a queue, its bindings and its consumers.

        Deleting a missing queue succeeds with a count of 0, as in RabbitMQ 3.x.

        :returns: the removed queue (or ``None``) and how many ready messages it held
        :raises ChannelException: 406 when ``if_unused``/``if_empty`` do not hold, 405 for
            another connection's exclusive queue.
        """
        if name not in self.queues:
            return None, 0
        queue = self.queue(name, connection)
        if queue.kind == "stream":
            # RabbitMQ 3.10 deletes a stream whatever if-unused and if-empty say, and counts 0.
            self.remove_queue(queue)
            return queue, 0
        if if_unused and queue.consumer_count:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"queue '{name}' {self._where()} in use")
        if if_empty and queue.message_count:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"queue '{name}' {self._where()} is not empty")
        count = queue.message_count
        self.remove_queue(queue)
        return queue, count

    def remove_queue(self, queue: Queue) -> None:
        """Remove ``queue`` with its bindings; its consumers are cancelled by their channels."""
        if self.queues.get(queue.name) is not queue:
            return
        del self.queues[queue.name]
        self.tallies.queues_deleted += 1
        queue.deleted = True
        queue.cancel_timers()
        if recorded(queue) and self.journal is not None:
            self.journal.queue_deleted(self.name, queue.name)
        for source in list(queue.sources):
            source.router.unbind_all(queue)
            self._maybe_auto_delete(source)
        queue.sources.clear()
        queue.purge()
        if isinstance(queue, StreamQueue) and self.streams is not None:
            self.streams.delete(queue)
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
            consumer.channel.consumer_cancelled(consumer)
        if isinstance(queue, StreamQueue):  # last: the stream protocol's publishers and readers are told
            for watcher in list(queue.watchers):
                watcher(queue)

    def snapshot_records(self) -> list[bytes]:
        """Every policy, durable exchange, recorded queue (a stream's subscriptions with it) and
        binding between recorded ends, as log records: what rebuilds this vhost's durable state
        (the node's :meth:`~broker.core.node.Node.topology`)."""
        name = self.name
        parts = []
        for operator, policies in ((False, self.policies), (True, self.operator_policies)):
            parts += [encode(policy_record(name, policy, operator)) for policy in policies.values()]
        for exchange in self.exchanges.values():
            if exchange.durable and exchange.name and not exchange.name.startswith("amq."):
                table = arguments_table(exchange.arguments)
                declared = ExchangeDeclared(
                    name, exchange.name, exchange.type_name, True, exchange.auto_delete, exchange.internal, table
                )
                parts.append(encode(declared))
        for queue in self.queues.values():
            if recorded(queue):
                table = arguments_table(queue.arguments)
                parts.append(encode(QueueDeclared(name, queue.name, True, queue.auto_delete, table)))
                if isinstance(queue, StreamQueue):
                    for subscription, offset in queue.subscriptions.items():
                        parts.append(encode(StreamOffset(name, queue.name, subscription, offset)))
        for exchange in self.exchanges.values():
            if not exchange.durable:
                continue
            for destination, routing_key, arguments in exchange.router.bindings():
                end: Queue | Exchange
                if isinstance(destination, Exchange):
                    end, to_queue, durable = destination, False, destination.durable
                else:
                    end = cast(Queue, destination)
                    to_queue, durable = True, recorded(end)
                if durable:
                    table = arguments_table(arguments)
                    parts.append(encode(Bound(name, exchange.name, end.name, to_queue, routing_key, table)))
        return parts

    def delete_everything(self) -> None:
        """The vhost is being deleted: remove every queue (with its messages) and exchange, and
        clear its policies, each recorded as when a client removes it."""
        for queue in list(self.queues.values()):
            self.remove_queue(queue)
        for exchange in list(self.exchanges.values()):
            if self.exchanges.get(exchange.name) is exchange:
                self._remove_exchange(exchange)
        for operator, table in ((False, self.policies), (True, self.operator_policies)):
            for name in list(table):
                self.clear_policy(name, operator)

    # -- dead-lettering -----------------------------------------------------------------------

    # -- what queues tell their vhost (``broker.core.queue.QueueObserver``) ----------------------

    def backlog(self, queue: Queue) -> None:
        """``queue`` has more to deliver than one dispatch makes: the node dispatches it later."""
        if self.on_backlog is not None:
            self.on_backlog(queue)

    def expired(self, queue: Queue) -> None:
        """``x-expires`` found ``queue`` unused: it is deleted."""
        self.remove_queue(queue)

    def waited(self, seconds: float) -> None:
        """A sampled message of this vhost waited ``seconds`` to be delivered."""
        self.latency.observe(seconds)

    def dead_letter(self, queue: Queue, entries: list[Entry], reason: DeadLetterReason) -> None:
        """Publish dead-lettered entries of ``queue`` to its dead-letter exchange.

        A missing exchange drops them (as RabbitMQ does); so does a cycle with no rejection.
        The default exchange ``""`` (the most common setup: ``x-dead-letter-routing-key`` names
        the dead-letter queue) routes to the queue named by the routing key.
        """
        settings = queue.settings
        name = settings.dead_letter_exchange or ""
        exchange = self.exchanges.get(name) if name else None
        if name and exchange is None:
            self.dead_letters_dropped += len(entries)
            return
        now = queue.now()
        events = self.dead_letters
        for entry in entries:
            dead_letter_id = events.next_id() if events is not None else 0
            try:
                message = dead_lettered(
                    entry.message,
                    queue.name,
                    reason,
                    now,
                    name,
                    settings.dead_letter_routing_key,
                    entry.delivery_count,
                    dead_letter_id,
                    events.sealer if events is not None else None,
                    self.name,
                )
            except ValueError:  # a copy that cannot be addressed (a dead-letter routing key past 255 bytes)
                self.dead_letters_dropped += 1
                continue
            if self.hooks is not None:
                self.hooks.dead_lettered(queue, message, reason.value)
            targets = [target for target in self.route(exchange, message) if not is_cycle(message, target.name, reason)]
            if not targets:
                self.dead_letters_dropped += 1
            elif events is not None:
                events.dead_lettered(
                    dead_letter_id, self.name, queue.name, reason, entry.delivery_count, message, targets
                )
            for target in targets:
                self.dead_letter_queues[target.name] += 1
            self.enqueue_routed(targets, message)

    # -- routing ------------------------------------------------------------------------------

    def enqueue_routed(self, queues: list[Queue], message: Message) -> bool:
        """Put ``message`` in each of ``queues`` (what :meth:`route` gave), recorded in the log
        first for the durable ones when it is persistent; whether every queue took it."""
        journal = self.journal
        if journal is not None and queues and message.flags & FLAG_DELIVERY_MODE and message.persistent:
            durable = [queue.name for queue in queues if type(queue) is WorkQueue and queue.journal is not None]
            if durable:
                journal.published(message, self.name, durable)
        accepted = True
        for queue in queues:
            if not queue.enqueue(message):
                accepted = False
        return accepted

    def route(self, exchange: Exchange | None, message: Message) -> list[Queue]:
        """The queues a message published to ``exchange`` (``None``: the default exchange) goes
        to, each once.

        Follows exchange-to-exchange bindings (a cycle is visited once) and alternate
        exchanges (used when an exchange routes the message nowhere). An exchange whose
        router intercepts messages (delayed messages) may take it: then it goes nowhere now.
        """
        if exchange is None:  # the default exchange: the queue the routing key names
            queue = self.queues.get(message.routing_key)
            return [queue] if queue is not None else []
        intercept = exchange.intercept
        if intercept is not None and intercept(self, exchange, message):
            return []
        routing_key = message.routing_key
        router = exchange.router
        destinations = router.route(routing_key, message.headers if router.needs_headers else None)
        queues: list[Queue] = []
        pending: list[Exchange] = []
        for destination in destinations:
            if type(destination) is Exchange:
                pending.append(destination)
            else:
                queues.append(cast(Queue, destination))
        if not pending and exchange.alternate is None:
            return queues if len(queues) < 2 else list(dict.fromkeys(queues))
        return self._route_slow(exchange, message, queues, pending)

    def _route_slow(
        self, exchange: Exchange, message: Message, queues: list[Queue], pending: list[Exchange]
    ) -> list[Queue]:
        visited = {exchange.name}
        if not queues and not pending and exchange.alternate is not None:
            alternate = self.exchanges.get(exchange.alternate)
            if alternate is not None:
                pending.append(alternate)
        hops = 0
        while pending and hops < MAX_ROUTING_HOPS:
            current = pending.pop()
            if current.name in visited:
                continue
            visited.add(current.name)
            hops += 1
            if current.intercept is not None and current.intercept(self, current, message):
                continue  # taken aside (a delayed exchange reached through a binding)
            router = current.router
            found = False
            for destination in router.route(message.routing_key, message.headers if router.needs_headers else None):
                found = True
                if type(destination) is Exchange:
                    pending.append(destination)
                else:
                    queues.append(cast(Queue, destination))
            if not found and current.alternate is not None:
                alternate = self.exchanges.get(current.alternate)
                if alternate is not None:
                    pending.append(alternate)
        return list(dict.fromkeys(queues))

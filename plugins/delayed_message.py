"""``delayed_message``: the ``x-delayed-message`` exchange type, as RabbitMQ's plugin of that name.

Declare an exchange of type ``x-delayed-message`` with the argument ``x-delayed-type`` (the
type that routes once the delay is over: ``direct``, ``topic`` ...), then publish with the
header ``x-delay`` (milliseconds). Behaviour, as in ``rabbitmq-delayed-message-exchange``:

* ``x-delay`` greater than 0 and at most 2^32-1 ms (Erlang's timer limit) delays the message;
  a missing, zero, negative, larger or unparsable delay routes it at once. Integers of any
  width are taken; strings of digits are parsed; floats are truncated;
* when the delay ends the message is routed by the ``x-delayed-type`` rules with the
  exchange's bindings *as they are then*, and its ``x-delay`` header becomes ``-delay`` (so
  that an exchange further on does not delay it again, and consumers can tell);
* a delayed message is not routed at publish time, so a ``mandatory`` publish comes back
  with 312 NO_ROUTE straight away (RabbitMQ: "the mandatory flag is not supported"), while
  the message is still delivered when its delay ends;
* a missing or unknown ``x-delayed-type`` refuses the declare with 406 PRECONDITION_FAILED;
* a delayed exchange reached through an exchange-to-exchange binding delays as well.

Where Postroom differs: RabbitMQ hands a delayed message to the exchange's
``alternate-exchange`` at publish time (its router returned no queues); Postroom does not,
and applies the alternate exchange when the delay ends and the message finds no queue.
RabbitMQ keeps every delayed message on disk; Postroom logs persistent ones sent to durable
exchanges (what its other queues keep, too) and holds the rest in memory.

Durability: persistent messages (``delivery_mode`` 2) published to a *durable* delayed
exchange are written to the write-ahead log before they are confirmed, in a store queue
``amq.postroom.delayed.<exchange>`` that only the broker may touch (clients get 405 on it;
it shows in queue listings with the number of messages waiting). At start they are
recovered and rescheduled with the delay that remains (at once when it has passed).
Transient messages, and messages to a transient exchange, wait in memory only.

Settings: ``max_delay`` (a duration string such as ``1h``; default and ceiling 2^32-1 ms):
delays beyond it are routed at once, as RabbitMQ does beyond its ceiling.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from postroom.broker.core.entry import Entry
from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.interfaces import IBrokerPlugin, IPluginContext, PluginSettingsInvalid
from postroom.broker.wire.content import with_header_entry
from postroom.broker.wire.table import Int32, Int64
from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IInterceptingRouter, IRouter
from postroom.exchanges.registry import ExchangeTypeRegistry, InvalidExchangeType

#: The exchange type name clients declare.
TYPE_NAME = "x-delayed-message"
#: The declare argument naming the type that routes once the delay is over.
TYPE_ARGUMENT = "x-delayed-type"
#: The message header with the delay in milliseconds.
DELAY_HEADER = "x-delay"
#: The longest delay RabbitMQ's plugin accepts: Erlang's timer limit, 2^32-1 ms (49.7 days).
MAX_DELAY_MS = 2**32 - 1
#: Store queues of durable delayed exchanges are named this plus the exchange name.
STORE_PREFIX = "amq.postroom.delayed."
#: Arguments of a store queue: nothing may enter it by publishing (a default-exchange publish
#: to its name is refused: nacked in confirm mode); the plugin adds and removes entries itself.
STORE_ARGUMENTS = {"x-max-length": 0, "x-overflow": "reject-publish"}

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class _StoreOwner:
    """Owns every store queue: a connection never is this object, so clients get 405 on them."""

    def __repr__(self) -> str:
        return "<delayed-message store>"


STORE_OWNER = _StoreOwner()


def delay_of(headers: Mapping[str, Any] | None, max_delay: int = MAX_DELAY_MS) -> int | None:
    """The delay in ms a message's headers ask for, or ``None`` to route it at once.

    As RabbitMQ: integers as they are, strings parsed as integers, floats truncated; anything
    else, or a delay outside ``1 .. max_delay``, means no delay.
    """
    if not headers:
        return None
    value = headers.get(DELAY_HEADER)
    if isinstance(value, bool):
        return None
    if isinstance(value, (bytes, str)):
        try:
            value = int(value)
        except ValueError:
            return None
    elif isinstance(value, float):
        value = int(value)
    elif not isinstance(value, int):
        return None
    if 0 < value <= max_delay:
        return value
    return None


def undelayed(message: Message, delay: int) -> Message:
    """A copy of ``message`` to route now: its bytes, with ``x-delay`` set to ``-delay``.

    As the RabbitMQ plugin: the entry is replaced where it stands, a signed 32-bit integer
    (a 64-bit one past that range); every other byte the publisher sent is kept.
    """
    value = Int32(-delay) if -delay >= -(2**31) else Int64(-delay)
    header = with_header_entry(message.header, DELAY_HEADER, value)
    return Message(message.exchange, message.routing_key, message.names, header, message.body)


class _Pending:
    """A delayed message waiting for its time."""

    __slots__ = ("due", "message", "delay", "entry")

    def __init__(self, due: float, message: Message, delay: int, entry: Entry | None) -> None:
        self.due = due
        self.message = message
        self.delay = delay
        #: Its entry in the store queue when it is in the log, else ``None``.
        self.entry = entry


@implementer(IInterceptingRouter)
class DelayedRouter:
    """The bindings of one delayed exchange (kept by the ``x-delayed-type`` router), and its
    waiting messages with one timer for the earliest.

    :param inner: the router of the ``x-delayed-type``
    :param max_delay: the longest delay honoured, in ms
    """

    def __init__(self, inner: IRouter, max_delay: int = MAX_DELAY_MS) -> None:
        self.inner = inner
        self.max_delay = max_delay
        self.needs_headers = inner.needs_headers
        self._heap: list[tuple[float, int, _Pending]] = []
        self._sequence = itertools.count()
        self._timer: Any = None
        self._timer_at = 0.0
        self._vhost: Any = None
        self._exchange: Any = None

    # -- IRouter: the inner type's bindings and routing ----------------------------------------

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Bind through the ``x-delayed-type`` router."""
        return self.inner.bind(destination, routing_key, arguments)

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Unbind through the ``x-delayed-type`` router."""
        return self.inner.unbind(destination, routing_key, arguments)

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to ``destination``."""
        return self.inner.unbind_all(destination)

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """Route as the ``x-delayed-type`` does (for messages that are not delayed, or no longer)."""
        return self.inner.route(routing_key, headers)

    def bindings(self) -> Iterable[tuple[Hashable, str, Mapping[str, Any]]]:
        """Every binding."""
        return self.inner.bindings()

    def __len__(self) -> int:
        return len(self.inner)

    # -- delaying -----------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Messages waiting for their delay to end."""
        return len(self._heap)

    def intercept(self, vhost: Any, exchange: Any, message: Message) -> bool:
        """Take a message whose ``x-delay`` asks for a delay; leave others to :meth:`route`.

        A persistent message to a durable exchange is recorded in the log (in the exchange's
        store queue) before this returns, so the publisher's confirm waits for it.
        """
        if not message.flags & _FLAG_HEADERS:
            return False
        delay = delay_of(message.headers, self.max_delay)
        if delay is None or vhost.clock is None:
            return False
        entry = None
        if exchange.durable and vhost.journal is not None and message.persistent:
            store = store_queue(vhost, exchange.name)
            vhost.journal.published(message, vhost.name, (store.name,))
            entry = Entry(message, store)
        self.schedule(vhost, exchange, message, delay, vhost.clock.seconds() + delay / 1000.0, entry)
        return True

    def schedule(
        self, vhost: Any, exchange: Any, message: Message, delay: int, due: float, entry: Entry | None
    ) -> None:
        """Route ``message`` (published with ``x-delay: delay``) through ``exchange`` at ``due``."""
        self._vhost = vhost
        self._exchange = exchange
        heapq.heappush(self._heap, (due, next(self._sequence), _Pending(due, message, delay, entry)))
        self._arm(due)

    def _arm(self, due: float) -> None:
        clock = self._vhost.clock
        if self._timer is not None:
            if due >= self._timer_at and self._timer.active():
                return
            if self._timer.active():
                self._timer.cancel()
        self._timer_at = due
        self._timer = clock.callLater(max(0.0, due - clock.seconds()), self._fire)

    def cancel(self) -> None:
        """Stop the timer (shutdown); waiting messages stay, in the log when they were persistent."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _fire(self) -> None:
        self._timer = None
        vhost, exchange = self._vhost, self._exchange
        now = vhost.clock.seconds()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _due, _seq, pending = heapq.heappop(heap)
            self._release(vhost, exchange, pending)
        if heap:
            self._arm(heap[0][0])
        elif vhost.exchanges.get(exchange.name) is not exchange:
            drop_store_if_orphaned(vhost, exchange.name)

    def _release(self, vhost: Any, exchange: Any, pending: _Pending) -> None:
        """The delay is over: route the message as ``x-delayed-type`` would, then let its
        stored copy go (in that order: a crash in between duplicates, never loses)."""
        if vhost.exchanges.get(exchange.name) is exchange:
            message = undelayed(pending.message, pending.delay)
            queues = vhost.route(exchange, message)
            if vhost.hooks is not None:
                vhost.hooks.routed(vhost, exchange.name, message, queues)
            vhost.enqueue_routed(queues, message)
        # else: the exchange was deleted meanwhile; its waiting messages go with it.
        entry = pending.entry
        if entry is not None and not entry.queue.deleted:
            entry.queue.settle((entry,))


_FLAG_HEADERS = 1 << 13  # the headers bit of the first property-flags word (AMQP 0-9-1 §4.2.6.1)


def store_queue(vhost: Any, exchange_name: str) -> WorkQueue:
    """The store queue of a durable delayed exchange, declared (and logged) on first use."""
    name = STORE_PREFIX + exchange_name
    queue = vhost.queues.get(name)
    if queue is None:
        queue = vhost.declare_queue(name, None, durable=True, arguments=STORE_ARGUMENTS)
    queue.owner = STORE_OWNER
    return queue


def drop_store_if_orphaned(vhost: Any, exchange_name: str) -> None:
    """Delete the store queue of an exchange that no longer exists (or is no delayed one)."""
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is not None and isinstance(exchange.router, DelayedRouter):
        return
    queue = vhost.queues.get(STORE_PREFIX + exchange_name)
    if queue is not None and queue.owner is STORE_OWNER and not queue.message_count:
        vhost.remove_queue(queue)


def recover(node: Any, snapshot: Any) -> int:
    """Reschedule the messages the log held in store queues, with the delay that remains.

    Each message's publish time is its log record's timestamp; one whose time has passed is
    routed at the next reactor turn. A store whose exchange is gone is deleted with its
    messages. Returns how many messages were rescheduled.
    """
    rescheduled = 0
    for vhost in node.vhosts.values():
        for name, queue in list(vhost.queues.items()):
            if not name.startswith(STORE_PREFIX):
                continue
            queue.owner = STORE_OWNER
            exchange = vhost.exchanges.get(name[len(STORE_PREFIX) :])
            if exchange is None or not isinstance(exchange.router, DelayedRouter):
                vhost.remove_queue(queue)
                continue
            stored = snapshot.messages.get((vhost.name, name), {}) if snapshot is not None else {}
            router = exchange.router
            now = vhost.clock.seconds()
            while True:
                entry = queue.get()
                if entry is None:
                    break
                # Restored entries may carry a TTL timer from their `expiration`; it is the
                # destination queue's business, not the store's.
                entry.expires_at = None
                message = entry.message
                record = stored.get(message.wal_id)
                published_at = record.record.timestamp if record is not None else now
                delay = delay_of(message.headers, MAX_DELAY_MS) or 0
                router.schedule(vhost, exchange, message, delay, published_at + delay / 1000.0, entry)
                rescheduled += 1
            queue.cancel_timers()
    return rescheduled


@implementer(IExchangeType)
class DelayedMessageExchangeType:
    """``x-delayed-message``: routes by ``x-delayed-type`` after each message's ``x-delay``.

    :param registry: where ``x-delayed-type`` is looked up
    """

    name = TYPE_NAME

    def __init__(self, registry: ExchangeTypeRegistry, max_delay: int = MAX_DELAY_MS) -> None:
        self._registry = registry
        self.max_delay = max_delay

    def _inner(self, arguments: Mapping[str, Any]) -> IExchangeType:
        type_name = arguments.get(TYPE_ARGUMENT)
        if isinstance(type_name, bytes):
            type_name = type_name.decode("utf-8", "replace")
        if not isinstance(type_name, str) or type_name == TYPE_NAME:
            raise BindingInvalid(f"Invalid argument, '{TYPE_ARGUMENT}' must be an existing exchange type")
        try:
            return self._registry.get(type_name)
        except InvalidExchangeType:
            raise BindingInvalid(
                f"Invalid argument, '{TYPE_ARGUMENT}' must be an existing exchange type, not '{type_name}'"
            ) from None

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """``x-delayed-type`` must name a registered type, which checks the arguments too.

        :raises BindingInvalid: (406 PRECONDITION_FAILED) it is missing, unknown or itself.
        """
        self._inner(arguments).validate_arguments(arguments)

    def new_router(self, arguments: Mapping[str, Any]) -> DelayedRouter:
        """A router delaying messages in front of a router of the ``x-delayed-type``."""
        return DelayedRouter(self._inner(arguments).new_router(arguments), self.max_delay)


def _duration_ms(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise PluginSettingsInvalid(f"max_delay: must be a duration such as 500ms, 30s, 1h or 7d, not {value!r}")
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


@implementer(IPlugin, IBrokerPlugin)
class DelayedMessagePlugin:
    """The bundled ``delayed_message`` plugin."""

    name = "delayed_message"
    description = "x-delayed-message exchange type: routes each message after its x-delay (ms)"
    requires: tuple[str, ...] = ()

    def check_settings(self, settings: Mapping[str, Any]) -> int:
        """Settings: ``max_delay`` only. Returns the longest delay in ms.

        :raises PluginSettingsInvalid: an unknown key, or ``max_delay`` not in 1 ms .. 2^32-1 ms.
        """
        unknown = sorted(set(settings) - {"max_delay"})
        if unknown:
            raise PluginSettingsInvalid(f"unknown setting(s) {', '.join(unknown)} (expected: max_delay)")
        if "max_delay" not in settings:
            return MAX_DELAY_MS
        max_delay = _duration_ms(settings["max_delay"])
        if not 1 <= max_delay <= MAX_DELAY_MS:
            raise PluginSettingsInvalid(f"max_delay: must be between 1ms and {MAX_DELAY_MS}ms, not {max_delay}ms")
        return max_delay

    def install(self, context: IPluginContext, settings: int) -> None:
        """Register the exchange type, and reschedule logged messages once the node is up."""
        context.add_exchange_type(DelayedMessageExchangeType(context.registry, settings))
        context.when_ready(self._ready)

    def _ready(self, node: Any, snapshot: Any) -> None:
        recover(node, snapshot)


plugin = DelayedMessagePlugin()

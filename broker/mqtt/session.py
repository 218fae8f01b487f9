"""An MQTT session: a client id's subscriptions and the messages in flight to and from it,
which outlive a connection when the client asked for a persistent session (``CleanSession``
0), as MQTT 3.1.1 section 4.1 asks.

Subscriptions are queues bound to the MQTT exchange (``amq.topic``), named and declared as
RabbitMQ 3.10's plugin declares them: QoS 0 subscriptions on ``mqtt-subscription-<id>qos0``,
QoS 1 and 2 ones on ``mqtt-subscription-<id>qos1``, durable, deleted with a clean session and
expiring after ``subscription_ttl`` without a consumer otherwise. (RabbitMQ's QoS 0 queue is
transient and goes with the connection, so a persistent session loses its QoS 0
subscriptions; here it is declared as the QoS 1 one is, so it keeps them, as the
specification asks.) A QoS 2 subscription's binding carries ``x-mqtt-subscription-qos: 2``,
so that a session found again after a restart knows what was granted.

The session is the :class:`~broker.core.entry.DeliverySink` of its two consumers: a delivery
at QoS 1 or 2 waits in :attr:`MqttSession.inflight` under its packet identifier until the
client's PUBACK (QoS 1) or PUBREC (QoS 2) settles it; a QoS 2 one then waits for PUBCOMP in
:attr:`MqttSession.released`. A persistent session keeps both while the client is away and
sends them again, with the same identifiers and DUP set, when it comes back [MQTT-4.4.0-1],
so a QoS 2 message is delivered once across reconnects. Inbound, :attr:`MqttSession.received`
holds the identifiers of QoS 2 publishes answered with PUBREC and not yet released: a PUBLISH
sent again with one of them is not routed again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from postroom.broker.core.access import Access
from postroom.broker.core.entry import UNACKED, Consumer, Entry, Queue
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.mqtt.content import is_plain, published_qos
from postroom.broker.mqtt.properties import mqtt_properties
from postroom.broker.wire import mqtt as wire
from postroom.broker.wire import mqtt5

#: The binding argument that marks a QoS 2 subscription on the QoS 1 queue.
QOS_ARGUMENT = "x-mqtt-subscription-qos"
#: The binding arguments that keep MQTT 5.0's subscription options and identifier.
NO_LOCAL = "x-mqtt-no-local"
RETAIN_AS_PUBLISHED = "x-mqtt-retain-as-published"
IDENTIFIER = "x-mqtt-subscription-identifier"
#: Routing keys whose subscribed QoS a session remembers (cleared when full).
_KEYS_KEPT = 4096


def queue_names(client_id: str) -> tuple[str, str]:
    """The QoS 0 and QoS 1 subscription queues of ``client_id`` (``rabbit_mqtt_util``)."""
    base = "mqtt-subscription-" + client_id
    return base + "qos0", base + "qos1"


class Link(Protocol):
    """The connection a session writes to while the client is connected."""

    out: list[bytes]

    @property
    def agreed(self) -> Any:
        """At MQTT 5.0, what the client agreed (``broker.mqtt.connection.Agreed``); else ``None``."""

    def wrote(self) -> None:
        """Something was added to :attr:`out` (outside a read, the shell must write it)."""


class MqttSession:
    """One client id's session in one vhost (see the module's docstring).

    :param exchange: the exchange subscriptions are bound to
    :param prefetch: deliveries at QoS 1 or 2 in flight at once (RabbitMQ's ``mqtt.prefetch``)
    :param ttl: milliseconds a persistent session's queues live without a consumer (``None``: for ever)
    """

    def __init__(
        self,
        vhost: VirtualHost,
        client_id: str,
        clean: bool,
        exchange: str,
        prefetch: int,
        ttl: int | None,
    ) -> None:
        self.vhost = vhost
        self.client_id = client_id
        self.clean = clean
        self.exchange = exchange
        self.prefetch = prefetch
        self.ttl = ttl
        self.names = queue_names(client_id)
        #: Topic filter -> the QoS granted.
        self.filters: dict[str, int] = {}
        #: MQTT 5.0's subscription options: topic filter -> (No Local, Retain As Published).
        self.options: dict[str, tuple[bool, bool]] = {}
        #: MQTT 5.0's Subscription Identifiers, by topic filter.
        self.identifiers: dict[str, int] = {}
        #: Packet id -> the delivery waiting for its PUBACK or PUBREC (``None``: a retained
        #: message's, which is no queue's), in the order they were sent; and the QoS of each.
        self.inflight: dict[int, Entry | None] = {}
        self.inflight_qos: dict[int, int] = {}
        #: Packet ids of QoS 2 deliveries released (PUBREL sent), waiting for PUBCOMP, in order.
        self.released: dict[int, None] = {}
        #: Packet ids of QoS 2 publishes received (PUBREC sent), waiting for the client's PUBREL.
        self.received: set[int] = set()
        self._last_id = 0
        self.link: Link | None = None
        self.consumers: list[Consumer | None] = [None, None]
        #: Read by the queues' dispatch (``DeliverySink``).
        self.active = False
        self.prefetch_global = 0
        self.unacked_count = 0
        #: Deliveries settled by PUBACK or PUBREC in the read being handled (see :meth:`settle_acked`).
        self._acked: list[Entry] = []
        self._qos: dict[tuple[str, int], int | None] = {}
        self._topics: dict[str, tuple[str, bytes]] = {}
        #: Messages delivered to the client, and acknowledged by it (for the management API).
        self.delivered = self.acked = 0
        #: When its client left (``None``: connected, or not known).
        self.away_since: float | None = None

    # -- the connection ---------------------------------------------------------------------

    def attach(self, link: Link) -> None:
        """The client is connected on ``link``: send again what is in flight (DUP set, same
        packet ids), then PUBRELs waiting for PUBCOMP, then deliver from its queues."""
        self.link = link
        out = link.out
        too_large: list[Entry] = []
        for packet_id, entry in list(self.inflight.items()):
            if entry is not None:
                topic, field = self._topic(entry.message.routing_key)
                qos = self.inflight_qos[packet_id]
                if link.agreed is None:
                    out.append(wire.publish_packet(field, entry.message.body, qos, False, True, packet_id))
                    continue
                entry.redelivered = True
                written, retain = self._properties5(entry, topic, 1)
                packet = link.agreed.publish(topic, entry.message.body, qos, retain, True, packet_id, written)
                if packet is None:  # larger than this client takes now: gone [MQTT-3.1.2-25]
                    del self.inflight[packet_id], self.inflight_qos[packet_id]
                    self._uncount(entry)
                    too_large.append(entry)
                else:
                    out.append(packet)
        for holder, group in _by_queue(too_large).items():
            holder.settle(group)
        for packet_id in self.released:
            out.append(wire.acknowledgement(wire.PUBREL, packet_id))
        self.active = True
        for qos, name in enumerate(self.names):
            queue = self.vhost.queues.get(name)
            if queue is not None and self.consumers[qos] is None:
                self._consume(qos, queue)

    def detach(self) -> list[BaseException]:
        """The client is gone: stop delivering. A clean session returns what was in flight
        and deletes its queues; a persistent one keeps both. Returns the errors of steps that
        failed (the others still ran)."""
        errors: list[BaseException] = []
        self.active = False
        self.link = None
        try:
            self.settle_acked()
        except Exception as error:
            errors.append(error)
        for qos, consumer in enumerate(self.consumers):
            if consumer is None:
                continue
            self.consumers[qos] = None
            try:
                consumer.queue.remove_consumer(consumer)
            except Exception as error:
                errors.append(error)
        if self.clean:
            errors += self.end()
        return errors

    def end(self) -> list[BaseException]:
        """The session ends (a clean one at its connection's end, a persistent one replaced by
        a clean one): what was in flight goes back to its queues, then the queues go."""
        errors: list[BaseException] = []
        entries = [entry for entry in self.inflight.values() if entry is not None]
        self.inflight.clear()
        self.inflight_qos.clear()
        self.released.clear()
        self.received.clear()
        for queue, group in _by_queue(entries).items():
            try:
                for entry in group:
                    self._uncount(entry)
                queue.return_entries(group)
            except Exception as error:
                errors.append(error)
        for name in self.names:
            found = self.vhost.queues.get(name)
            if found is not None:
                try:
                    self.vhost.remove_queue(found)
                except Exception as error:
                    errors.append(error)
        self.filters.clear()
        return errors

    # -- subscriptions ----------------------------------------------------------------------

    def recover_filters(self) -> None:
        """Read the subscriptions of a session found again from its queues' bindings."""
        exchange = self.vhost.exchanges.get(self.exchange)
        if exchange is None:
            return
        for qos, name in enumerate(self.names):
            queue = self.vhost.queues.get(name)
            if queue is None:
                continue
            for destination, key, arguments in exchange.router.bindings():
                if destination is queue:
                    found = arguments or {}
                    topic_filter = wire.to_mqtt(key)
                    self.filters[topic_filter] = 2 if qos and found.get(QOS_ARGUMENT) == 2 else qos
                    self.set_options(topic_filter, found.get(NO_LOCAL) is True, found.get(RETAIN_AS_PUBLISHED) is True)
                    if isinstance(found.get(IDENTIFIER), int):
                        self.identifiers[topic_filter] = found[IDENTIFIER]
        self._qos.clear()

    def _arguments(self, topic_filter: str) -> dict[str, Any]:
        """The binding arguments that keep a subscription's QoS 2, MQTT 5.0 options and
        identifier with it (so that a session found again after a restart has them)."""
        arguments: dict[str, Any] = {}
        if self.filters.get(topic_filter) == 2:
            arguments[QOS_ARGUMENT] = 2
        no_local, retain_as_published = self.options.get(topic_filter, (False, False))
        if no_local:
            arguments[NO_LOCAL] = True
        if retain_as_published:
            arguments[RETAIN_AS_PUBLISHED] = True
        if topic_filter in self.identifiers:
            arguments[IDENTIFIER] = self.identifiers[topic_filter]
        return arguments

    def subscribe(
        self,
        topic_filter: str,
        qos: int,
        access: Access | None,
        no_local: bool = False,
        retain_as_published: bool = False,
        identifier: int | None = None,
    ) -> None:
        """Subscribe to ``topic_filter`` at ``qos`` (replacing a subscription to the same
        filter), with MQTT 5.0's options and identifier, and with the permissions a client's
        ``queue.declare`` and ``queue.bind`` need: configure on a new queue, write on the
        queue, read on the exchange and, with topic permissions on it, read on the routing key.

        :raises ChannelException: the queue or the binding was refused (permissions, limits)
        """
        vhost = self.vhost
        previous = self.filters.get(topic_filter)
        before = self._arguments(topic_filter) if previous is not None else {}
        key = wire.to_amqp(topic_filter)
        queue = self._queue(min(qos, 1), access)
        if access is not None:
            _check_binding(access, queue.name, self.exchange, key)
        self.filters[topic_filter] = qos
        self.set_options(topic_filter, no_local, retain_as_published)
        if identifier is None:
            self.identifiers.pop(topic_filter, None)
        else:
            self.identifiers[topic_filter] = identifier
        arguments = self._arguments(topic_filter)
        vhost.bind_queue(queue.name, self.exchange, key, arguments, None)
        if previous is not None and (min(previous, 1) != min(qos, 1) or before != arguments):
            vhost.unbind_queue(self.names[min(previous, 1)], self.exchange, key, before, None)
        self._qos.clear()

    def set_options(self, topic_filter: str, no_local: bool, retain_as_published: bool) -> None:
        """MQTT 5.0's options of the subscription to ``topic_filter``."""
        if no_local or retain_as_published:
            self.options[topic_filter] = (no_local, retain_as_published)
        else:
            self.options.pop(topic_filter, None)

    def identifiers_for(self, topic: str, queue_qos: int) -> list[int]:
        """The Subscription Identifiers of the subscriptions on the queue that match ``topic``
        [MQTT-3.3.4-3]."""
        if not self.identifiers:
            return []
        return sorted(
            number
            for f, number in self.identifiers.items()
            if (self.filters.get(f, 0) > 0) == bool(queue_qos) and wire.matches(f, topic)
        )

    @property
    def no_local(self) -> bool:
        """Whether a subscription of this session asked not to get its own publishes."""
        return any(no_local for no_local, _rap in self.options.values())

    def not_local(self, queues: list[Queue], topic: str) -> list[Queue]:
        """``queues`` less this session's own, where every subscription of the queue that
        matches ``topic`` has No Local set [MQTT-3.8.3-3]."""
        kept = []
        for queue in queues:
            if queue.name in self.names:
                group = self.names.index(queue.name)
                matching = [f for f, q in self.filters.items() if (q > 0) == bool(group) and wire.matches(f, topic)]
                if matching and all(self.options.get(f, (False, False))[0] for f in matching):
                    continue
            kept.append(queue)
        return kept

    def retain_as_published(self, topic: str, queue_qos: int) -> bool:
        """Whether a subscription on the queue that matches ``topic`` asked for RETAIN as published."""
        return any(
            rap and (self.filters.get(f, 0) > 0) == bool(queue_qos) and wire.matches(f, topic)
            for f, (_no_local, rap) in self.options.items()
        )

    def unsubscribe(self, topic_filter: str, access: Access | None) -> None:
        """Remove the subscription to ``topic_filter`` (none: nothing happens), with the
        permissions a client's ``queue.unbind`` needs.

        :raises ChannelException: the user may not unbind it
        """
        qos = self.filters.get(topic_filter)
        if qos is None:
            return
        if access is not None:
            _check_binding(access, self.names[min(qos, 1)], self.exchange, wire.to_amqp(topic_filter))
        arguments = self._arguments(topic_filter)
        del self.filters[topic_filter]
        self.options.pop(topic_filter, None)
        self.identifiers.pop(topic_filter, None)
        self.vhost.unbind_queue(self.names[min(qos, 1)], self.exchange, wire.to_amqp(topic_filter), arguments, None)
        self._qos.clear()

    def expired(self, now: float) -> bool:
        """Whether the session is over at ``now``: its client away for longer than its expiry,
        and its queues gone (by their ``x-expires``, or deleted)."""
        if self.link is not None or self.away_since is None or self.ttl is None:
            return False
        if now < self.away_since + self.ttl / 1000:
            return False
        return not any(name in self.vhost.queues for name in self.names)

    def set_ttl(self, ttl: int | None) -> None:
        """The session's expiry changed (milliseconds; ``None``: never): its queues' ``x-expires``
        follow, as RabbitMQ 3.13 updates them at a CONNECT that finds the session and at a
        DISCONNECT that gives a new interval."""
        self.ttl = ttl
        if self.clean:
            return
        for name in self.names:
            queue = self.vhost.queues.get(name)
            if isinstance(queue, WorkQueue):
                self.vhost.set_queue_expiry(queue, ttl)

    def _queue(self, qos: int, access: Access | None) -> Queue:
        """The subscription queue for ``qos`` (0 or 1), declared and consumed from if it is not yet."""
        name = self.names[qos]
        queue = self.vhost.queues.get(name)
        if queue is None:
            arguments: dict[str, Any] = {}
            if not self.clean and self.ttl is not None:
                arguments["x-expires"] = self.ttl
            queue = self.vhost.declare_queue(
                name, None, durable=True, auto_delete=self.clean, arguments=arguments, access=access
            )
        if self.consumers[qos] is None and self.active:
            self._consume(qos, queue)
        return queue

    def _consume(self, qos: int, queue: Queue) -> None:
        tag = f"mqtt-{self.client_id}-qos{qos}"
        consumer = Consumer(
            self, queue, tag, b"", no_ack=not qos, exclusive=False, prefetch=self.prefetch, arguments={}
        )
        self.consumers[qos] = consumer
        if isinstance(queue, WorkQueue):
            queue.add_consumer(consumer)

    def subscribed_qos(self, topic: str, queue_qos: int) -> int | None:
        """The highest QoS granted to a subscription of this session that matches ``topic``,
        among those on the QoS 0 queue (``queue_qos`` 0) or the QoS 1 queue; ``None`` when none
        matches (a topic starting with ``$`` that a filter starting with a wildcard reached
        through the exchange [MQTT-4.7.2-1])."""
        cache = (topic, queue_qos)
        found = self._qos.get(cache, -1)
        if found != -1:
            return found
        best: int | None = None
        for topic_filter, qos in self.filters.items():
            if (qos > 0) == bool(queue_qos) and wire.matches(topic_filter, topic) and (best is None or qos > best):
                best = qos
        if len(self._qos) >= _KEYS_KEPT:
            self._qos.clear()
        self._qos[cache] = best
        return best

    # -- deliveries (DeliverySink) -----------------------------------------------------------

    def _topic(self, routing_key: str) -> tuple[str, bytes]:
        """The topic of a message routed with ``routing_key``, and as PUBLISH carries it."""
        found = self._topics.get(routing_key)
        if found is None:
            if len(self._topics) >= _KEYS_KEPT:
                self._topics.clear()
            topic = wire.to_mqtt(routing_key)
            found = self._topics[routing_key] = (topic, wire.topic_field(topic))
        return found

    def next_packet_id(self) -> int:
        """A packet identifier not in use by a delivery in flight or released [MQTT-2.3.1-4]."""
        packet_id = self._last_id
        inflight, released = self.inflight, self.released
        for _ in range(65535):
            packet_id = packet_id % 65535 + 1
            if packet_id not in inflight and packet_id not in released:
                self._last_id = packet_id
                return packet_id
        raise RuntimeError("no packet identifier is free")  # (prefetch bounds what is in flight)

    def deliver_entries(self, consumer: Consumer, entries: Sequence[Entry]) -> None:
        link = self.link
        assert link is not None  # (delivered to while active only)
        out = link.out
        queue = consumer.queue
        queue_qos = 0 if consumer is self.consumers[0] else 1
        settled: list[Entry] = []
        sent = 0
        publish = wire.publish_packet
        agreed = link.agreed
        for entry in entries:
            message = entry.message
            topic, field = self._topic(message.routing_key)
            granted = self.subscribed_qos(topic, queue_qos)
            if granted is None:
                settled.append(entry)
                continue
            qos = min(granted, published_qos(message)) if granted else 0
            body = message._body
            if body is None:
                body = message.body
            packet_id = self.next_packet_id() if qos else None
            dup = entry.redelivered and qos > 0  # [MQTT-3.3.1-2]
            if agreed is None:
                out.append(publish(field, body, qos, False, dup, packet_id))
            else:  # (MQTT 5.0: the properties, a topic alias, and the client's largest packet)
                written, retain = self._properties5(entry, topic, queue_qos)
                packet = agreed.publish(topic, body, qos, retain, dup, packet_id, written)
                if packet is None:  # not sent, and gone [MQTT-3.1.2-25]
                    settled.append(entry)
                    continue
                out.append(packet)
            sent += 1
            if packet_id is None:
                settled.append(entry)
                continue
            self.inflight[packet_id] = entry
            self.inflight_qos[packet_id] = qos
            entry.consumer = consumer
            entry.channel = self
            entry.tag = packet_id
            entry.state = UNACKED
            consumer.unacked += 1
            self.unacked_count += 1
            queue.unacked_count += 1
            timeout = consumer.visibility_timeout
            if timeout:
                queue.track_delivery(entry, queue.now() + timeout, timeout)
        queue.delivered += len(entries)
        self.delivered += sent
        if settled:
            if consumer.no_ack:
                queue.delivered_no_ack += len(settled)
            queue.settle(settled)
        link.wrote()

    def _properties5(self, entry: Entry, topic: str, queue_qos: int) -> tuple[bytes, bool]:
        """A delivery's properties at MQTT 5.0 (written), and its RETAIN: as published where asked."""
        message = entry.message
        identifiers = self.identifiers_for(topic, queue_qos)
        if is_plain(message):
            extra = {mqtt5.SUBSCRIPTION_IDENTIFIER: identifiers} if identifiers else None
            return mqtt5.properties(wire.PUBLISH, extra), False
        remaining = None
        if entry.expires_at is not None:
            remaining = max(0.0, entry.expires_at - entry.queue.now()) * 1000
        written, retained = mqtt_properties(message, remaining, identifiers)
        return written, retained and self.retain_as_published(topic, queue_qos)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue was deleted (by an operator, or its ``x-expires``): its subscriptions go."""
        for qos, held in enumerate(self.consumers):
            if held is consumer:
                self.consumers[qos] = None
                self.filters = {f: q for f, q in self.filters.items() if (q > 0) != (qos == 0)}
                self._qos.clear()

    def take_back(self, entry: Entry) -> bool:
        """A delivery's visibility timeout passed: forget it (its packet id is free again)."""
        if self.inflight.get(entry.tag) is not entry:
            return False
        del self.inflight[entry.tag]
        self.inflight_qos.pop(entry.tag, None)
        self._uncount(entry)
        return True

    def _uncount(self, entry: Entry) -> None:
        self.unacked_count -= 1
        entry.queue.unacked_count -= 1
        if entry.consumer is not None:
            entry.consumer.unacked -= 1

    # -- the client's acknowledgements -----------------------------------------------------

    def acknowledged(self, kind: int, packet_id: int) -> None:
        """The client's PUBACK, PUBREC or PUBCOMP for a delivery. One for an identifier not in
        flight (sent again after a reconnect, or by a confused client) is ignored, as
        RabbitMQ and Mosquitto ignore it."""
        if kind == wire.PUBCOMP:
            self.released.pop(packet_id, None)
            return
        expected = self.inflight_qos.get(packet_id)
        if expected is None or (expected == 2) != (kind == wire.PUBREC):
            return
        entry = self.inflight.pop(packet_id)
        del self.inflight_qos[packet_id]
        if kind == wire.PUBREC:
            self.released[packet_id] = None
            if self.link is not None:
                self.link.out.append(wire.acknowledgement(wire.PUBREL, packet_id))
        self.acked += 1
        if entry is not None:
            self._uncount(entry)
            self._acked.append(entry)

    def settle_acked(self) -> None:
        """Settle the deliveries acknowledged in the read being handled, each queue once."""
        entries = self._acked
        if not entries:
            return
        self._acked = []
        for queue, group in _by_queue(entries).items():
            queue.acked += len(group)
            queue.settle(group)
            if not queue.deleted:
                queue.dispatch()

    def dispatch(self) -> None:
        """Deliver again after the socket drained."""
        for consumer in self.consumers:
            if consumer is not None and not consumer.queue.deleted:
                consumer.queue.dispatch()

    def held(self) -> Iterable[Entry]:
        """The deliveries in flight."""
        return (entry for entry in self.inflight.values() if entry is not None)


def _check_binding(access: Access, queue: str, exchange: str, key: str) -> None:
    """What ``queue.bind`` and ``queue.unbind`` check (``broker.amqp.topology``)."""
    access.check("write", "queue", queue)
    access.check("read", "exchange", exchange)
    access.check_topic("read", exchange, key)


def _by_queue(entries: Iterable[Entry]) -> dict[Queue, list[Entry]]:
    groups: dict[Queue, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.queue, []).append(entry)
    return groups


__all__ = ["Link", "MqttSession", "QOS_ARGUMENT", "queue_names"]

"""One MQTT 3.1.1 (and 3.1) or MQTT 5.0 client connection, sans-IO, served as RabbitMQ's MQTT
plugin serves it (3.10's for 3.1.1, 3.13's for 5.0) where it follows the specification, and
as the specification asks where it does not (see ``docs/mqtt.md``). At level 5 the packets are
read by ``broker.wire.mqtt5``, what CONNECT agreed is kept in :class:`Agreed`, publishes carry
their properties to the AMQP message (``broker.mqtt.properties``), and an error ends the
connection with a DISCONNECT that gives its reason code.

Bytes come in through :meth:`MqttConnection.receive`; packets to write collect in
:attr:`MqttConnection.out`, and :attr:`MqttConnection.wake` tells the shell when some were
added outside a read (a login checked later, deliveries, acknowledgements that waited for the
log). The shell (``broker.server.mqttprotocol``) runs the keep-alive timer and calls
:meth:`MqttConnection.connection_lost`.

The first packet must be CONNECT [MQTT-3.1.0-1]; it is answered once the login is checked
(packets that come meanwhile wait). Then:

* PUBLISH is routed through the MQTT exchange (``amq.topic``) as an AMQP publish of the topic
  as routing key (``broker.mqtt.content``). QoS 1 is answered with PUBACK, QoS 2 with PUBREC,
  once the message is in the log when a durable queue took it, and in the order the publishes
  came [MQTT-4.6.0-2]. A QoS 2 publish is routed once: sent again (DUP) before its PUBREL, it
  is answered and not routed [MQTT-4.3.3-2]. RabbitMQ 3.10 answers QoS 2 with PUBACK, which
  a client waiting for PUBREC never completes.
* SUBSCRIBE and UNSUBSCRIBE change the session's queues and bindings
  (``broker.mqtt.session``); retained messages matching a new subscription follow its SUBACK,
  wildcard subscriptions included (RabbitMQ 3.10 sends them to exact topics only).
* A packet that breaks the specification closes the connection [MQTT-4.8.0-1], as does one
  the user may not do (a refused publish, as RabbitMQ closes it); a refused subscription is
  answered with 0x80 in its SUBACK [MQTT-3.9.3], where RabbitMQ closes the connection.

The will is published when the connection ends other than by DISCONNECT [MQTT-3.1.2-8].
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from postroom.broker.core.access import Access
from postroom.broker.core.message import Message
from postroom.broker.core.node import Node
from postroom.broker.core.retained import recordable
from postroom.broker.core.sockets import SocketDetails
from postroom.broker.core.users import User
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.errors import ChannelException, ReplyCode
from postroom.broker.mqtt.content import content_header
from postroom.broker.mqtt.properties import amqp_header, mqtt_properties
from postroom.broker.mqtt.registry import MqttRegistry
from postroom.broker.mqtt.session import MqttSession, queue_names
from postroom.broker.wire import mqtt as wire
from postroom.broker.wire import mqtt5
from postroom.broker.wire.codec import shortstr

#: Human names of the protocol levels, as RabbitMQ's management API shows them.
VERSIONS = {3: "3.1.0", 4: "3.1.1", 5: "5-0"}
#: Topics whose routing keys a connection remembers (cleared when full).
_TOPICS_KEPT = 1024


class Phase(Enum):
    """Where a connection is."""

    CONNECTING = "connecting"  # waiting for CONNECT
    AUTHENTICATING = "authenticating"  # the login is checked; packets wait
    OPEN = "open"
    CLOSED = "closed"


class MqttConnection:
    """One MQTT client (see the module's docstring).

    :param registry: the node's MQTT side (settings, client ids, sessions, retained messages)
    :param peer: the client's address, ``host:port``
    :param loopback: whether it connects from a loopback address
    :param certificate_name: over TLS, what names the client's certificate
    """

    def __init__(
        self,
        registry: MqttRegistry,
        peer: str,
        loopback: bool,
        certificate_name: Callable[[], str | None] | None = None,
    ) -> None:
        self.registry = registry
        self.node: Node = registry.node
        self.settings = registry.settings
        self.peer = peer
        self.loopback = loopback
        self.certificate_name = certificate_name
        self.reader = wire.PacketReader()
        #: Packets to write, in order.
        self.out: list[bytes] = []
        #: Set when the socket is to be closed once :attr:`out` is written.
        self.finished = False
        #: Why the connection ended, for the log (empty: the client's DISCONNECT or hang-up).
        self.reason = ""
        #: Whether the node was told this connection has output (see :meth:`wake`).
        self.dirty = False
        #: Whether the socket takes more now (the shell says); deliveries wait while it does not.
        self.writable = True
        self.phase = Phase.CONNECTING
        #: Packets read while the login is checked, or while an alarm blocks publishing.
        self._held: deque[tuple[int, int, bytes]] = deque()
        self.protocol_level = 4
        self.client_id = ""
        self.clean_session = True
        #: Seconds the client may be silent (0: no limit); the shell allows one and a half times it.
        self.keep_alive = 0
        self.will: wire.Will | mqtt5.Will | None = None
        self.user: User | None = None
        self.user_name = ""
        self.vhost: VirtualHost | None = None
        self.access: Access | None = None
        self.session: MqttSession | None = None
        self.auth_mechanism = "PLAIN"
        #: Blocked by an alarm at a PUBLISH: nothing more is read until it clears.
        self.blocked = False
        #: Acknowledgements of publishes, in the order the publishes came: each waits for the
        #: log when its message was written there (``[packet, ready]``).
        self._acks: deque[list[Any]] = deque()
        self._waiting_log = False
        self._keys: dict[str, tuple[str, bytes]] = {}
        #: Topics this connection published to, by their UTF-8 (see :meth:`_publish_known`).
        self._valid_topics: dict[bytes, str] = {}
        #: When it connected (milliseconds since the epoch), what the shell counts of its socket
        #: and the socket's details, for the management API.
        self.connected_at = 0
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.socket: SocketDetails | None = None
        #: Messages published by the client.
        self.published = 0
        #: Errors of teardown steps (the shell logs them).
        self.teardown_errors: list[BaseException] = []
        #: AMQP's view of a connection's channels, for a user's channel count (MQTT opens none).
        self.channels: dict[int, Any] = {}
        #: At protocol level 5: what the client and the server agreed (``None`` below it).
        self.v5: Agreed | None = None

    # -- input --------------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Bytes from the client: act on every complete packet in them."""
        if self.finished or self.phase is Phase.CLOSED:
            return
        try:
            packets = self.reader.feed(data)
        except wire.MalformedPacket as error:
            self._fail(str(error))
            return
        if self._held or self.phase is Phase.AUTHENTICATING or self.blocked:
            self._held.extend(packets)
            return
        self._handle(packets)

    def _handle(self, packets: Any) -> None:
        for index, (kind, flags, body) in enumerate(packets):
            if self.finished:
                break
            if self.phase is Phase.AUTHENTICATING or (kind == wire.PUBLISH and self._blocks()):
                self._held.extend(packets[index:])
                break
            if kind != wire.PUBLISH or not self._publish_known(flags, body):
                self._packet(kind, flags, body)
        if self.session is not None:
            self.session.settle_acked()
        self._await_log()

    def _blocks(self) -> bool:
        """Whether an alarm blocks a publish now (then nothing more is read until it clears,
        as RabbitMQ blocks a publishing connection)."""
        if self.node.alarms:
            self.blocked = True
        return self.blocked

    def alarm_changed(self) -> None:
        """The node's alarms changed: once none is left, a blocked connection goes on."""
        if self.blocked and not self.node.alarms:
            self.blocked = False
            self.resume()

    def resume(self) -> None:
        """Act on the packets that waited (for the login, or an alarm)."""
        held, self._held = list(self._held), deque()
        if held:
            self._handle(held)
        self.wake()

    def _packet(self, kind: int, flags: int, body: bytes) -> None:
        if self.v5 is not None:
            self._packet5(kind, flags, body)
            return
        try:
            packet = wire.parse(kind, flags, body)
        except wire.MalformedPacket as error:
            self._fail(str(error), mqtt5.MALFORMED_PACKET)
            return
        if self.phase is Phase.CONNECTING:
            if not isinstance(packet, wire.Connect):
                self._fail("the first packet is not CONNECT [MQTT-3.1.0-1]")
                return
            if (packet.protocol_name, packet.protocol_level) == ("MQTT", 5):
                try:
                    connect = mqtt5.parse(kind, flags, body)
                except mqtt5.Problem as problem:
                    self.out.append(mqtt5.connack(False, problem.code))
                    self.phase = Phase.CLOSED
                    self._fail(str(problem))
                    return
                assert isinstance(connect, mqtt5.Connect)
                self._connect5(connect)
                return
            self._connect(packet)
            return
        try:
            match packet:
                case wire.Publish():
                    if len(self._valid_topics) >= _TOPICS_KEPT:
                        self._valid_topics.clear()
                    self._valid_topics[wire.topic_field(packet.topic)[2:]] = packet.topic
                    self._publish(
                        packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id or 0
                    )
                case wire.Acknowledgement(kind=wire.PUBREL):
                    self._released(packet.packet_id)
                case wire.Acknowledgement():
                    assert self.session is not None
                    self.session.acknowledged(packet.kind, packet.packet_id)
                case wire.Subscribe():
                    self._subscribe(packet)
                case wire.Unsubscribe():
                    self._unsubscribe(packet)
                case wire.PingReq():
                    self.out.append(wire.pingresp())
                case wire.Disconnect():
                    self.will = None  # [MQTT-3.14.4-3]
                    self.finished = True
                case wire.Connect():
                    self._fail("a second CONNECT [MQTT-3.1.0-2]")
        except ChannelException as refused:
            self._fail(refused.reply_text)

    def _fail(self, reason: str, code: int = mqtt5.UNSPECIFIED_ERROR) -> None:
        """End the connection for ``reason`` (its will is published); at level 5, once open,
        with a DISCONNECT that gives ``code`` (section 4.13)."""
        if self.v5 is not None and self.phase is Phase.OPEN and not self.finished:
            self.out.append(mqtt5.disconnect(code))
        self.reason = self.reason or reason
        self.finished = True

    # -- CONNECT ------------------------------------------------------------------------------

    def _connect(self, packet: wire.Connect) -> None:
        if wire.PROTOCOLS.get(packet.protocol_level) != packet.protocol_name:
            if packet.protocol_name not in wire.PROTOCOLS.values():
                self._fail(f"protocol name {packet.protocol_name!r} [MQTT-3.1.2-1]")
                return
            self._refuse(wire.UNACCEPTABLE_PROTOCOL_VERSION, f"protocol level {packet.protocol_level}")
            return
        self.protocol_level = packet.protocol_level
        if not packet.client_id and not packet.clean_session:
            self._refuse(wire.IDENTIFIER_REJECTED, "an empty client id with a persistent session [MQTT-3.1.3-8]")
            return
        self.client_id = packet.client_id or _generated_id(self.node)
        self.clean_session = packet.clean_session
        self.keep_alive = packet.keep_alive
        self.will = packet.will
        settings = self.settings
        password: str | None
        certified = self.certificate_name() if settings.ssl_cert_login and self.certificate_name else None
        if packet.username is not None and packet.password is not None:
            username, password = packet.username, packet.password.decode("utf-8", "surrogateescape")
        elif packet.username is not None:
            self._refuse(wire.BAD_USERNAME_OR_PASSWORD, f"user '{packet.username}' sent no password")
            return
        elif certified:
            # The verified certificate's common name, no password (RabbitMQ's ssl_cert_login).
            username, password = certified, None
            self.auth_mechanism = "EXTERNAL"
        elif settings.allow_anonymous:
            username, password = settings.default_user, settings.default_pass
        else:
            self._refuse(wire.BAD_USERNAME_OR_PASSWORD, "no credentials, and anonymous logins are off")
            return
        vhost_name, username = self._vhost_and_user(username)
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is None:
            self._refuse(wire.BAD_USERNAME_OR_PASSWORD, f"vhost '{vhost_name}' does not exist")
            return
        self.phase = Phase.AUTHENTICATING
        self.node.login(
            username,
            password,
            self.loopback,
            self.peer.rpartition(":")[0],
            lambda user, reason: self._login_done(vhost, username, user, reason),
        )

    def _vhost_and_user(self, username: str) -> tuple[str, str]:
        """The vhost and the user a CONNECT's user name names: ``vhost:user``, split at the
        last colon, unless colons are part of names (``ignore_colons_in_username``); else the
        configured vhost."""
        if not self.settings.ignore_colons_in_username and ":" in username:
            vhost, _, user = username.rpartition(":")
            return vhost, user
        return self.settings.vhost, username

    def _login_done(self, vhost: VirtualHost, username: str, user: User | None, reason: str) -> None:
        if self.finished or self.phase is not Phase.AUTHENTICATING:
            return
        self.user_name = username
        if user is None:
            loopback_only = reason.endswith("can only connect via localhost")
            self._refuse(wire.NOT_AUTHORIZED if loopback_only else wire.BAD_USERNAME_OR_PASSWORD, reason)
        elif not user.may_open(vhost.name):
            self._refuse(wire.NOT_AUTHORIZED, f"access to vhost '{vhost.name}' refused for user '{username}'")
        elif (limit := self._limit_reached(vhost, user)) is not None:
            self._refuse(wire.SERVER_UNAVAILABLE if limit.startswith("node") else wire.NOT_AUTHORIZED, limit)
        else:
            self.user = user
            self.vhost = vhost
            self.access = user.access_with(vhost.name, {"client_id": self.client_id})
            self._open()
        self.resume()

    def _limit_reached(self, vhost: VirtualHost, user: User) -> str | None:
        """Which connection limit this connection would pass, in words; ``None``: none."""
        node = self.node
        reached = node.connection_limit_reached()
        if reached is not None:
            return reached
        vhost_limit = vhost.max_connections
        if vhost_limit is not None and 0 <= vhost_limit <= vhost.connection_count:
            return f"vhost '{vhost.name}' connection limit ({vhost_limit}) is reached"
        own = node.user_connections.get(user.name)
        if user.max_connections is not None and 0 <= user.max_connections <= len(own or ()):
            return f"user '{user.name}' connection limit ({user.max_connections}) is reached"
        return None

    def _refuse(self, code: int, reason: str) -> None:
        """Answer CONNECT with ``code`` (3.1.1's: level 5 gets its reason code) and end the
        connection [MQTT-3.2.2-5]."""
        if self.v5 is not None:
            limit = code == wire.SERVER_UNAVAILABLE or "limit" in reason
            self.out.append(mqtt5.connack(False, mqtt5.QUOTA_EXCEEDED if limit else _V5_REFUSALS[code]))
        else:
            self.out.append(wire.connack(False, code))
        self.phase = Phase.CLOSED
        self.will = None
        self._fail(f"refused ({code}): {reason}")

    def _open(self) -> None:
        node, registry, vhost = self.node, self.registry, self.vhost
        assert vhost is not None and self.user is not None
        client_id = self.client_id
        if not recordable(vhost.name, client_id):
            self._refuse(wire.IDENTIFIER_REJECTED, "a client id too long for the log's records")
            return
        if self.will is not None and self.will.retain and not recordable(vhost.name, self.will.topic):
            self._refuse(wire.SERVER_UNAVAILABLE, "a retained will whose topic is too long for the log's records")
            return
        previous = registry.clients.get(client_id)
        if previous is not None:
            previous.taken_over()
        self._cancel_delayed_will()
        key = (vhost.name, client_id)
        session = registry.sessions.pop(key, None)
        if self.clean_session:
            present = False
            try:
                if session is not None:
                    self.teardown_errors += session.end()
                else:
                    self._delete_queues(vhost)
            except ChannelException as refused:
                self._refuse(wire.SERVER_UNAVAILABLE, f"the earlier session's queues stay: {refused.reply_text}")
                return
            session = None
        else:
            present = session is not None or any(name in vhost.queues for name in queue_names(client_id))
        settings, agreed = self.settings, self.v5
        ttl = None if settings.subscription_ttl is None else int(settings.subscription_ttl * 1000)
        prefetch = settings.prefetch
        ends = self.clean_session
        if agreed is not None:  # the session lasts as long as the Session Expiry Interval says
            ttl = None if agreed.session_expiry is None else agreed.session_expiry * 1000
            prefetch = min(prefetch, agreed.receive_maximum)
            ends = agreed.session_expiry == 0
        if session is None:
            session = MqttSession(vhost, client_id, ends, settings.exchange, prefetch, ttl)
            if present:
                session.recover_filters()
            if not ends:  # (after a restart: the QoS 2 publishes it had answered with PUBREC)
                session.received = node.awaiting_release.get(vhost.name, client_id)
        if ends:
            node.awaiting_release.set(vhost.name, client_id, ())
        session.clean, session.prefetch = ends, prefetch
        session.set_ttl(ttl)
        session.away_since = None
        registry.keep(key, session)
        registry.clients[client_id] = self
        self.session = session
        self.phase = Phase.OPEN
        node.mqtt_connections.add(self)
        vhost.connection_count += 1
        node.user_connections.setdefault(self.user_name, set()).add(self)
        node.counters["connections_opened"] += 1
        if agreed is not None:
            self.out.append(mqtt5.connack(present, mqtt5.SUCCESS, agreed.connack_properties()))
        else:
            self.out.append(wire.connack(present, wire.ACCEPTED))
        session.attach(self)

    def _delete_queues(self, vhost: VirtualHost) -> None:
        """A clean session's start: the queues of an earlier persistent one go (configure
        permission needed, as RabbitMQ's ``queue.delete``)."""
        for name in queue_names(self.client_id):
            queue = vhost.queues.get(name)
            if queue is None:
                continue
            if self.access is not None:
                self.access.check("configure", "queue", name)
            vhost.remove_queue(queue)

    def taken_over(self) -> None:
        """Another connection took this one's client id [MQTT-3.1.4-2]: it ends now (its
        session passes to the new one), and its will is published, as it sent no DISCONNECT
        [MQTT-3.1.2-10] (as Mosquitto does; RabbitMQ 3.10 drops it)."""
        self._fail("another connection took its client id over", mqtt5.SESSION_TAKEN_OVER)
        self._release()
        self.wake()

    # -- PUBLISH ------------------------------------------------------------------------------

    def _publish_known(self, flags: int, body: bytes) -> bool:
        """A PUBLISH to a topic this connection published to before (so known to be valid),
        read without :func:`~broker.wire.mqtt.parse` (most publishes); ``False``: anything
        else, for the full reading."""
        if self.phase is not Phase.OPEN or len(body) < 2 or self.v5 is not None:
            return False
        qos = flags >> 1 & 3
        end = 2 + (body[0] << 8 | body[1])
        topic = self._valid_topics.get(body[2:end])
        if topic is None or qos == 3 or (flags & 8 and not qos):
            return False
        if qos:
            if len(body) < end + 2 or not (packet_id := body[end] << 8 | body[end + 1]):
                return False
            self._publish(topic, body[end + 2 :], qos, bool(flags & 1), bool(flags & 8), packet_id)
        else:
            self._publish(topic, body[end:], 0, bool(flags & 1), False, 0)
        return True

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int) -> None:
        session = self.session
        assert session is not None
        if retain and not self._retainable(topic):
            return
        if qos == 2 and packet_id in session.received:
            self._acknowledge(wire.PUBREC, packet_id, False)  # sent again: routed once [MQTT-4.3.3-2]
            return
        journal = self.node.journal
        recorded = journal.recorded if journal is not None else 0
        logged = self._route(topic, payload, qos, dup)[0]
        self.published += 1
        if retain:
            self.node.retained.retain(self.vhost.name, topic, payload, qos)  # type: ignore[union-attr]
            logged = logged or (journal is not None and journal.recorded != recorded)
        if qos == 1:
            self._acknowledge(wire.PUBACK, packet_id, logged)
        elif qos == 2:
            logged = self._received(packet_id) or logged
            self._acknowledge(wire.PUBREC, packet_id, logged)

    def _route(self, topic: str, payload: bytes, qos: int, dup: bool, header: bytes | None = None) -> tuple[bool, int]:
        """Publish ``payload`` to ``topic``'s routing key on the MQTT exchange (with the content
        header ``header``, when an MQTT 5.0 publish's properties give one); whether the message
        was written to the log (its acknowledgement then waits for the write), and to how many
        queues it went.

        :raises ChannelException: the user may not publish there (403), the exchange is gone
            (404), the message is over the size limit or a queue refused it (406)
        """
        vhost, node = self.vhost, self.node
        assert vhost is not None
        exchange_name = self.settings.exchange
        found = self._keys.get(topic)
        if found is None:
            if len(self._keys) >= _TOPICS_KEPT:
                self._keys.clear()
            key = wire.to_amqp(topic)
            found = self._keys[topic] = (key, shortstr(exchange_name) + shortstr(key[:255]))
        key, names = found
        access = self.access
        if access is not None:
            access.check("write", "exchange", exchange_name)
            access.check_topic("write", exchange_name, key)
        if len(payload) > node.limits.max_message_bytes:
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED,
                f"message size {len(payload)} is larger than configured max size {node.limits.max_message_bytes}",
            )
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            raise ChannelException(ReplyCode.NOT_FOUND, f"no exchange '{exchange_name}' in vhost '{vhost.name}'")
        if header is None:
            header = content_header(qos, dup, len(payload))
        message = Message(exchange_name, key, names, header, payload)
        hooks = node.hooks
        if hooks is not None:
            hooks.published(vhost, exchange_name, message)
        exchange.published_in += 1
        vhost.published += 1
        queues = vhost.route(exchange, message)
        if self.v5 is not None and self.session is not None and self.session.no_local:
            queues = self.session.not_local(queues, topic)
        exchange.published_out += len(queues)
        if hooks is not None:
            hooks.routed(vhost, exchange_name, message, queues)
        if not queues:
            vhost.unroutable += 1
        journal = vhost.journal
        recorded = journal.recorded if journal is not None else 0
        if not vhost.enqueue_routed(queues, message) and qos:
            raise ChannelException(ReplyCode.PRECONDITION_FAILED, f"a queue refused a message to '{topic}'")
        return bool(message.wal_id) or (journal is not None and journal.recorded != recorded), len(queues)

    def _acknowledge(self, kind: int, packet_id: int, logged: bool, code: int = 0) -> None:
        """PUBACK or PUBREC for a publish, once its message is in the log (``logged``), and
        after those of earlier publishes [MQTT-4.6.0-2]; at level 5 with reason ``code``."""
        packet = mqtt5.acknowledgement(kind, packet_id, code) if code else wire.acknowledgement(kind, packet_id)
        acks = self._acks
        if not acks and not logged:
            self.out.append(packet)
            return
        acks.append([packet, not logged])
        if logged:
            self._waiting_log = True

    def _await_log(self) -> None:
        """Ask the log to say when what this read wrote is on disk (once per read)."""
        if not self._waiting_log:
            return
        self._waiting_log = False
        journal = self.vhost.journal if self.vhost is not None else None
        waiting = [item for item in self._acks if not item[1]]
        if journal is None:
            self._logged(waiting, True)
            return
        journal.when_durable(lambda durable: self._logged(waiting, durable))

    def _logged(self, items: list[list[Any]], durable: bool) -> None:
        if self.phase is not Phase.OPEN:
            return
        if not durable:
            self._fail("the log could not write a message")
            self.wake()
            return
        for item in items:
            item[1] = True
        acks, out = self._acks, self.out
        while acks and acks[0][1]:
            out.append(acks.popleft()[0])
        self.wake()

    def _received(self, packet_id: int) -> bool:
        """A QoS 2 publish was routed: it waits for PUBREL, recorded in the log for a
        persistent session (``broker.core.releases``); whether anything was written."""
        session, vhost = self.session, self.vhost
        assert session is not None and vhost is not None
        session.received.add(packet_id)
        journal = self.node.journal
        if session.clean or journal is None:
            return False
        recorded = journal.recorded
        self.node.awaiting_release.set(vhost.name, self.client_id, session.received)
        return journal.recorded != recorded

    def _released(self, packet_id: int) -> None:
        """The client's PUBREL: the QoS 2 publish is complete [MQTT-4.3.3-2]."""
        assert self.session is not None and self.vhost is not None
        known = packet_id in self.session.received
        self.session.received.discard(packet_id)
        if known and not self.session.clean:
            self.node.awaiting_release.set(self.vhost.name, self.client_id, self.session.received)
        if self.v5 is not None and not known:
            packet = mqtt5.acknowledgement(wire.PUBCOMP, packet_id, mqtt5.PACKET_IDENTIFIER_NOT_FOUND)
        else:
            packet = wire.acknowledgement(wire.PUBCOMP, packet_id)
        if self._acks:
            self._acks.append([packet, True])
        else:
            self.out.append(packet)

    # -- MQTT 5.0 -----------------------------------------------------------------------------

    def _connect5(self, packet: mqtt5.Connect) -> None:
        """CONNECT at level 5: what the client asks for is agreed (:class:`Agreed`), then the
        login goes as at 3.1.1 (a refusal with level 5's reason codes)."""
        found = packet.properties
        if found.get(mqtt5.AUTHENTICATION_METHOD) is not None:
            self.out.append(mqtt5.connack(False, mqtt5.BAD_AUTHENTICATION_METHOD))
            self.phase = Phase.CLOSED
            self._fail("extended authentication is not served")
            return
        self.v5 = Agreed(
            session_expiry=self._session_expiry(found.get(mqtt5.SESSION_EXPIRY_INTERVAL, 0)),
            receive_maximum=found.get(mqtt5.RECEIVE_MAXIMUM, 65535),
            maximum_packet=found.get(mqtt5.MAXIMUM_PACKET_SIZE, wire.MAX_REMAINING_LENGTH + 5),
            alias_limit=min(found.get(mqtt5.TOPIC_ALIAS_MAXIMUM, 0), TOPIC_ALIAS_MAXIMUM),
            assigned=None if packet.client_id else _generated_id(self.node),
        )
        legacy = wire.Connect(
            "MQTT", 4, packet.clean_start, packet.keep_alive, packet.client_id or self.v5.assigned or "", None,
            packet.username, packet.password,
        )  # fmt: skip
        if packet.password is not None and packet.username is None:
            self._refuse(wire.BAD_USERNAME_OR_PASSWORD, "a password without a user name")
            return
        self._connect(legacy)
        self.protocol_level = 5
        self.will = packet.will

    def _packet5(self, kind: int, flags: int, body: bytes) -> None:
        try:
            packet = mqtt5.parse(kind, flags, body)
        except mqtt5.Problem as problem:
            self._fail(str(problem), problem.code)
            return
        session = self.session
        assert session is not None
        try:
            match packet:
                case mqtt5.Publish():
                    self._publish5(packet)
                case mqtt5.Acknowledgement(kind=wire.PUBREL):
                    self._released(packet.packet_id)
                case mqtt5.Acknowledgement():
                    session.acknowledged(packet.kind, packet.packet_id)
                case mqtt5.Subscribe():
                    self._subscribe5(packet)
                case mqtt5.Unsubscribe():
                    self._unsubscribe5(packet)
                case wire.PingReq():
                    self.out.append(wire.pingresp())
                case mqtt5.Disconnect():
                    self._disconnected5(packet)
                case mqtt5.Auth():
                    self._fail("AUTH without an authentication method [MQTT-4.12.0-1]", mqtt5.PROTOCOL_ERROR)
                case mqtt5.Connect():
                    self._fail("a second CONNECT [MQTT-3.1.0-2]", mqtt5.PROTOCOL_ERROR)
        except ChannelException as refused:
            code = mqtt5.NOT_AUTHORIZED if refused.reply_code == 403 else mqtt5.UNSPECIFIED_ERROR
            self._fail(refused.reply_text, code)

    def _publish5(self, packet: mqtt5.Publish) -> None:
        agreed, session = self.v5, self.session
        assert agreed is not None and session is not None
        topic, found = packet.topic, packet.properties
        alias = found.get(mqtt5.TOPIC_ALIAS)
        if alias is not None:
            if alias > TOPIC_ALIAS_MAXIMUM:
                self._fail(f"Topic Alias {alias}, over {TOPIC_ALIAS_MAXIMUM} [MQTT-3.3.2-9]", mqtt5.TOPIC_ALIAS_INVALID)
                return
            if topic:
                agreed.aliases[alias] = topic
            elif (topic := agreed.aliases.get(alias, "")) == "":
                self._fail(f"Topic Alias {alias} names no topic yet [MQTT-3.3.4-1]", mqtt5.PROTOCOL_ERROR)
                return
        if packet.retain and not self._retainable(topic):
            return
        qos, packet_id = packet.qos, packet.packet_id or 0
        if qos == 2 and packet_id in session.received:
            self._acknowledge(wire.PUBREC, packet_id, False)
            return
        journal = self.node.journal
        recorded = journal.recorded if journal is not None else 0
        header = amqp_header(qos, packet.dup, packet.retain, len(packet.payload), found)
        logged, routed = self._route(topic, packet.payload, qos, packet.dup, header)
        self.published += 1
        if packet.retain:
            now = self.node.clock.seconds() if self.node.clock is not None else 0.0
            plain = header if found is not mqtt5.NONE else None
            self.node.retained.retain(self.vhost.name, topic, packet.payload, qos, plain, now)  # type: ignore[union-attr]
            logged = logged or (journal is not None and journal.recorded != recorded)
        code = mqtt5.SUCCESS if routed else mqtt5.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            self._acknowledge(wire.PUBACK, packet_id, logged, code)
        elif qos == 2:
            logged = self._received(packet_id) or logged
            self._acknowledge(wire.PUBREC, packet_id, logged, code)

    def _subscribe5(self, packet: mqtt5.Subscribe) -> None:
        session = self.session
        assert session is not None
        identifier = packet.properties.get(mqtt5.SUBSCRIPTION_IDENTIFIER)
        codes, fresh = [], []
        for option in packet.subscriptions:
            topic_filter = option.topic_filter
            new = topic_filter not in session.filters
            if topic_filter.startswith("$share/"):
                code = mqtt5.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
            elif wire.filter_problem(topic_filter):
                code = mqtt5.TOPIC_FILTER_INVALID
            else:
                try:
                    session.subscribe(
                        topic_filter, option.qos, self.access, option.no_local, option.retain_as_published, identifier
                    )
                    code = option.qos
                except ChannelException as refused:
                    code = mqtt5.NOT_AUTHORIZED if refused.reply_code == 403 else mqtt5.UNSPECIFIED_ERROR
            codes.append(code)
            fresh.append(new)
        self.out.append(mqtt5.suback(packet.packet_id, codes))
        for option, code, new in zip(packet.subscriptions, codes, fresh, strict=True):
            # Retain Handling: 0 sends them, 1 for a new subscription only, 2 never (3.8.3.1).
            if code < 0x80 and (option.retain_handling == 0 or (option.retain_handling == 1 and new)):
                self._send_retained(option.topic_filter, code, identifier)

    def _unsubscribe5(self, packet: mqtt5.Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = []
        for topic_filter in packet.filters:
            existed = topic_filter in session.filters
            try:
                session.unsubscribe(topic_filter, self.access)
                codes.append(mqtt5.SUCCESS if existed else mqtt5.NO_SUBSCRIPTION_EXISTED)
            except ChannelException:
                codes.append(mqtt5.NOT_AUTHORIZED)
        self.out.append(mqtt5.suback(packet.packet_id, codes, wire.UNSUBACK))

    def _session_expiry(self, requested: int) -> int | None:
        """The seconds a session lasts for a Session Expiry Interval of ``requested`` (``None``:
        for ever): at most ``mqtt.subscription_ttl``, which 0xFFFFFFFF asks for."""
        cap = self.settings.subscription_ttl
        if requested == 0xFFFFFFFF:
            return None if cap is None else int(cap)
        return requested if cap is None else min(requested, int(cap))

    def _disconnected5(self, packet: mqtt5.Disconnect) -> None:
        """The client's DISCONNECT: the will goes unless its reason is 0 [MQTT-3.14.4-3]; a
        new Session Expiry Interval applies, but not one from 0 [MQTT-3.14.2-2]."""
        agreed, session = self.v5, self.session
        assert agreed is not None and session is not None
        expiry = packet.properties.get(mqtt5.SESSION_EXPIRY_INTERVAL)
        if expiry is not None:
            if agreed.session_expiry == 0 and expiry:
                self._fail("a Session Expiry Interval after CONNECT's 0 [MQTT-3.14.2-2]", mqtt5.PROTOCOL_ERROR)
                return
            agreed.session_expiry = self._session_expiry(expiry)
            session.clean = expiry == 0
            session.set_ttl(None if agreed.session_expiry is None else agreed.session_expiry * 1000)
        if packet.code == mqtt5.SUCCESS:
            self.will = None
        self.finished = True

    # -- SUBSCRIBE, UNSUBSCRIBE --------------------------------------------------------------

    def _subscribe(self, packet: wire.Subscribe) -> None:
        session, vhost = self.session, self.vhost
        assert session is not None and vhost is not None
        codes = []
        for topic_filter, qos in packet.filters:
            problem = wire.filter_problem(topic_filter)
            if problem is None:
                try:
                    session.subscribe(topic_filter, qos, self.access)
                except ChannelException as refused:
                    problem = refused.reply_text
            codes.append(wire.SUBSCRIPTION_FAILURE if problem else qos)
        self.out.append(wire.suback(packet.packet_id, codes))
        for (topic_filter, _qos), code in zip(packet.filters, codes, strict=True):
            if code != wire.SUBSCRIPTION_FAILURE:
                self._send_retained(topic_filter, code)

    def _send_retained(self, topic_filter: str, granted: int, identifier: int | None = None) -> None:
        """The retained messages ``topic_filter`` matches, at the lower of the two QoS (as
        RabbitMQ and Mosquitto choose), with RETAIN set [MQTT-3.3.1-8]."""
        session = self.session
        assert session is not None and self.vhost is not None
        for topic, retained in self.node.retained.matching(self.vhost.name, topic_filter):
            written = b"\x00"
            if retained.header is not None:  # (an MQTT 5.0 message's properties, and its expiry)
                message = Message("", "", b"", retained.header, retained.payload)
                remaining = None
                if message.expiration is not None:
                    now = self.node.clock.seconds() if self.node.clock is not None else retained.at
                    remaining = int(message.expiration) - (now - retained.at) * 1000
                    if remaining <= 0:
                        continue  # expired [MQTT-3.3.2-5]
                if self.v5 is not None:
                    written = mqtt_properties(message, remaining, [identifier] if identifier else None)[0]
            elif self.v5 is not None:
                written = mqtt5.properties(wire.PUBLISH, {mqtt5.SUBSCRIPTION_IDENTIFIER: identifier})
            qos = min(granted, retained.qos)
            packet_id = session.next_packet_id() if qos else None
            if self.v5 is not None:  # (with the subscription's identifier [MQTT-3.3.4-3])
                packet = self.v5.publish(topic, retained.payload, qos, True, False, packet_id, written)
                if packet is None:
                    continue  # larger than the client takes [MQTT-3.1.2-25]
            else:
                packet = wire.publish(topic, retained.payload, qos, True, False, packet_id)
            if packet_id is not None:
                session.inflight[packet_id] = None
                session.inflight_qos[packet_id] = qos
            self.out.append(packet)

    def _unsubscribe(self, packet: wire.Unsubscribe) -> None:
        session = self.session
        assert session is not None
        for topic_filter in packet.filters:
            session.unsubscribe(topic_filter, self.access)
        self.out.append(wire.acknowledgement(wire.UNSUBACK, packet.packet_id))

    # -- the end ------------------------------------------------------------------------------

    def timed_out(self) -> None:
        """The client was silent for one and a half keep-alive periods [MQTT-3.1.2-24]."""
        silent = f"no packet for {self.keep_alive * 1.5:g} seconds (keep-alive {self.keep_alive} s)"
        self._fail(silent, mqtt5.KEEP_ALIVE_TIMEOUT)

    def close(self, code: int, text: str) -> None:
        """End the connection from the broker's side (an operator, a user deleted)."""
        self._fail(text, mqtt5.ADMINISTRATIVE_ACTION)
        self._release()
        self.wake()

    def set_access(self, access: Access | None) -> None:
        """The user's permissions changed: checks follow them from now on (with its
        ``{client_id}`` in the topic permissions)."""
        user, vhost = self.user, self.vhost
        if access is not None and user is not None and vhost is not None and user.may_open(vhost.name):
            access = user.access_with(vhost.name, {"client_id": self.client_id}) or access
        self.access = access

    def connection_lost(self) -> None:
        """The socket is gone: publish the will unless the client said DISCONNECT, then let
        the session go (a persistent one is kept for the client's return)."""
        self._release()

    def _release(self) -> None:
        if self.phase is not Phase.OPEN:
            self.phase = Phase.CLOSED
            return
        self.phase = Phase.CLOSED
        node, vhost, session = self.node, self.vhost, self.session
        assert vhost is not None and session is not None
        will, self.will = self.will, None
        if will is not None:
            delay = self._will_delay(will, session)
            if delay:
                self._delay_will(will, delay)
            else:
                self._publish_will(will)
        self.teardown_errors += session.detach()
        registry = self.registry
        if registry.clients.get(self.client_id) is self:
            del registry.clients[self.client_id]
        key = (vhost.name, self.client_id)
        if session.clean and registry.sessions.get(key) is session:
            del registry.sessions[key]
            node.awaiting_release.set(vhost.name, self.client_id, ())  # (a DISCONNECT's expiry 0)
        elif node.clock is not None:
            session.away_since = node.clock.seconds()
        node.mqtt_connections.discard(self)
        node.counters["connections_closed"] += 1
        vhost.connection_count -= 1
        own = node.user_connections.get(self.user_name)
        if own is not None:
            own.discard(self)
            if not own:
                del node.user_connections[self.user_name]
        self._acks.clear()

    def _retainable(self, topic: str) -> bool:
        """Whether a retained publish to ``topic`` can be kept in the log; one that cannot ends
        the connection, nothing routed (0x90 at level 5)."""
        assert self.vhost is not None
        if recordable(self.vhost.name, topic):
            return True
        self._fail("a retained topic too long for the log's records", mqtt5.TOPIC_NAME_INVALID)
        return False

    def _publish_will(self, will: wire.Will | mqtt5.Will) -> None:
        vhost = self.vhost
        assert vhost is not None
        header = None
        if isinstance(will, mqtt5.Will):
            header = amqp_header(will.qos, False, will.retain, len(will.message), will.properties)
        try:
            self._route(will.topic, will.message, will.qos, False, header)
            if will.retain:
                self.node.retained.retain(vhost.name, will.topic, will.message, will.qos)
        except ChannelException as refused:
            self.reason = self.reason or f"its will was refused: {refused.reply_text}"
        except Exception as error:
            self.teardown_errors.append(error)

    def _will_delay(self, will: wire.Will | mqtt5.Will, session: MqttSession) -> float:
        """Seconds the will waits: its Will Delay Interval, at most until the session ends
        (section 3.1.3.2.2); 0 below level 5, or without a clock to wait on."""
        if not isinstance(will, mqtt5.Will) or self.node.clock is None or self.v5 is None:
            return 0.0
        delay = float(will.properties.get(mqtt5.WILL_DELAY_INTERVAL, 0))
        expiry = self.v5.session_expiry
        return min(delay, float(expiry)) if expiry is not None else delay

    def _delay_will(self, will: wire.Will | mqtt5.Will, delay: float) -> None:
        """Publish ``will`` in ``delay`` seconds, unless the client id connects again first."""
        clock = self.node.clock
        assert clock is not None
        registry, client_id = self.registry, self.client_id

        def publish() -> None:
            if registry.delayed_wills.pop(client_id, None) is not None:
                self._publish_will(will)
                self.wake()

        registry.delayed_wills[client_id] = clock.callLater(delay, publish)

    def _cancel_delayed_will(self) -> None:
        """The client id connected again: a will waiting for its delay is not published
        [MQTT-3.1.3-9]."""
        call = self.registry.delayed_wills.pop(self.client_id, None)
        if call is not None and call.active():
            call.cancel()

    # -- output ---------------------------------------------------------------------------------

    def wake(self) -> None:
        """Something was added to :attr:`out`: the node's list of connections with output
        has this one (the shell writes them after the read in hand, or soon)."""
        if not self.dirty:
            self.dirty = True
            self.node.mark_dirty(self)

    wrote = wake

    @property
    def agreed(self) -> Agreed | None:
        """What a session sees of :attr:`v5`."""
        return self.v5

    def take_output(self) -> bytes:
        """What is to be written (then forgotten)."""
        self.dirty = False
        out = self.out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        return data

    def set_writable(self, writable: bool) -> None:
        """The socket's buffer filled (``False``) or drained: deliveries stop, or go on."""
        self.writable = writable
        session = self.session
        if session is not None and session.link is self:
            session.active = writable
            if writable:
                session.dispatch()

    @property
    def protocol(self) -> str:
        """The protocol as RabbitMQ's management API names it (``MQTT 3.1.1``)."""
        return "MQTT " + VERSIONS.get(self.protocol_level, "N/A")


def _generated_id(node: Node) -> str:
    """A client id for a client that sent none (RabbitMQ's: 16 random bytes in base64)."""
    return base64.b64encode(node.rng.randbytes(16)).decode()


#: The topic aliases a client may use (RabbitMQ 3.13's ``mqtt.topic_alias_maximum``).
TOPIC_ALIAS_MAXIMUM = 16
#: The largest packet the server takes, as CONNACK says at level 5.
MAXIMUM_PACKET_SIZE = wire.MAX_REMAINING_LENGTH

#: 3.1.1's CONNACK return codes as level 5's reason codes.
_V5_REFUSALS = {
    wire.UNACCEPTABLE_PROTOCOL_VERSION: mqtt5.UNSUPPORTED_PROTOCOL_VERSION,
    wire.IDENTIFIER_REJECTED: mqtt5.CLIENT_IDENTIFIER_NOT_VALID,
    wire.SERVER_UNAVAILABLE: mqtt5.SERVER_UNAVAILABLE,
    wire.BAD_USERNAME_OR_PASSWORD: mqtt5.BAD_USER_NAME_OR_PASSWORD,
    wire.NOT_AUTHORIZED: mqtt5.NOT_AUTHORIZED,
}


@dataclass(slots=True)
class Agreed:
    """What a client at protocol level 5 and the server agreed at CONNECT.

    :param session_expiry: seconds the session outlives the connection (``None``: for ever)
    :param receive_maximum: the client's deliveries in flight at once, at most
    :param maximum_packet: the largest packet the client takes
    :param assigned: the client id the server gave a client that sent none
    :param alias_limit: topic aliases the server may give the client (its Topic Alias Maximum,
        at most :data:`TOPIC_ALIAS_MAXIMUM`)
    """

    session_expiry: int | None = 0
    receive_maximum: int = 65535
    maximum_packet: int = MAXIMUM_PACKET_SIZE
    assigned: str | None = None
    alias_limit: int = 0
    #: The client's topic aliases, by number.
    aliases: dict[int, str] = field(default_factory=dict)
    #: The topic aliases given to the client, by topic.
    outbound: dict[str, int] = field(default_factory=dict)

    def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None, props: bytes
    ) -> bytes | None:
        """A PUBLISH to the client, or ``None`` when it is larger than the client takes (it is
        then not sent [MQTT-3.1.2-25]). As RabbitMQ 3.13 gives topic aliases: the next one to
        each new topic while any are left, none to a topic of one byte (an alias saves nothing
        there), never one taken back; a topic that has one is sent empty, with its alias. An
        alias is only taken when the PUBLISH that tells the client of it is sent."""
        known = self.outbound.get(topic)
        alias = known
        if known is None and len(self.outbound) < self.alias_limit and len(topic.encode()) > 1:
            alias = len(self.outbound) + 1
        if alias is not None:
            props = mqtt5.with_topic_alias(props, alias)
        packet = mqtt5.publish("" if known else topic, payload, qos, retain, dup, packet_id, props)
        if len(packet) > self.maximum_packet:
            return None
        if alias is not None and known is None:
            self.outbound[topic] = alias
        return packet

    def connack_properties(self) -> dict[int, Any]:
        """CONNACK's properties: as RabbitMQ 3.13 sends them (Session Expiry Interval always,
        Topic Alias Maximum, Maximum Packet Size, no shared subscriptions), but QoS 2 served."""
        expiry = 0xFFFFFFFF if self.session_expiry is None else self.session_expiry
        return {
            mqtt5.SESSION_EXPIRY_INTERVAL: expiry,
            mqtt5.ASSIGNED_CLIENT_IDENTIFIER: self.assigned,
            mqtt5.TOPIC_ALIAS_MAXIMUM: TOPIC_ALIAS_MAXIMUM,
            mqtt5.MAXIMUM_PACKET_SIZE: MAXIMUM_PACKET_SIZE,
            mqtt5.SHARED_SUBSCRIPTION_AVAILABLE: 0,
        }

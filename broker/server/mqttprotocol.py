"""The Twisted shell around the MQTT connection (``listen.mqtt``, ``listen.mqtt_tls``).

:class:`MqttServerProtocol` moves bytes between a transport and a
:class:`~broker.mqtt.connection.MqttConnection`. It joins the AMQP factory's connections, so
that one flush after each read writes every connection that has output (deliveries made for
other clients included), a shutdown closes MQTT clients too, and a cluster node that no longer
leads drops them. Its timers run on the injected clock: CONNECT must come within
:data:`CONNECT_TIMEOUT` seconds, and once connected, a client silent for one and a half times
its keep-alive is disconnected, its will published [MQTT-3.1.2-24].

A client that does not read costs a bounded amount: the shell is the transport's producer, and
deliveries stop while the socket's buffer is full. An alarm that blocks a publisher stops
reading from it until it clears.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, ISSLTransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from postroom.broker.mqtt.connection import MqttConnection, Phase
from postroom.broker.mqtt.registry import MqttRegistry
from postroom.broker.server.alarms import ResourceMonitor
from postroom.broker.server.protocol import (
    AMQPServerFactory,
    certificate_common_names,
    is_loopback,
    log_teardown_errors,
    pace_reads,
    socket_reader,
)
from postroom.broker.server.sockets import SocketTransport, socket_details, socket_of
from postroom.broker.text import printable

_log = Logger()

#: Seconds a client has to send CONNECT once its socket is open.
CONNECT_TIMEOUT = 10.0


class MqttServerProtocol(Protocol):
    """One MQTT client (see the module's docstring)."""

    def __init__(self, factory: MqttServerFactory) -> None:
        self.factory = factory
        self.connection: MqttConnection | None = None
        self._timer: IDelayedCall | None = None
        #: When the client was last heard from (the clock's seconds).
        self._heard = 0.0
        self._reading_stopped = False
        self._reader: Any = None

    #: The transport, typed as the socket it is; set once connected.
    _socket: SocketTransport

    def connectionMade(self) -> None:
        factory = self.factory
        self._socket = socket_of(self)
        peer = self._socket.getPeer()
        host = getattr(peer, "host", "")
        connection = MqttConnection(
            factory.registry,
            f"{host}:{getattr(peer, 'port', 0)}",
            is_loopback(host),
            certificate_name=self._certificate_name if ISSLTransport.providedBy(self.transport) else None,
        )
        connection.connected_at = int(factory.clock.seconds() * 1000)
        connection.socket = socket_details(self.transport)
        self.connection = connection
        factory.amqp.protocols[connection] = self  # (see the module's docstring)
        self._reader = socket_reader(self.transport)
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            no_delay(True)  # deliveries and acknowledgements are small, latency-bound writes
        self._socket.registerProducer(self, True)
        self._heard = factory.clock.seconds()
        self._timer = factory.clock.callLater(CONNECT_TIMEOUT, self._connect_expired)

    def _certificate_name(self) -> str | None:
        return certificate_common_names(ISSLTransport(self.transport).getPeerCertificate())

    def dataReceived(self, data: bytes) -> None:
        connection = self.connection
        if connection is None:
            return
        factory = self.factory
        amqp = factory.amqp
        if amqp.leading is not None and not amqp.leading():
            amqp.fence()
            return
        connection.recv_oct += len(data)
        connection.recv_cnt += 1
        self._heard = factory.clock.seconds()
        if factory.monitor is not None:
            factory.monitor.note_read(len(data))
        phase = connection.phase
        amqp.in_io = True
        try:
            connection.receive(data)
        except Exception:
            _log.failure("bug while handling packets from MQTT client {peer}", peer=connection.peer)
            connection.close(0, "internal error")
        finally:
            amqp.in_io = False
        if connection.phase is not phase and connection.phase is Phase.OPEN:
            self._arm_keep_alive()
        amqp.flush()
        self.flush()
        pace_reads(self._reader, amqp.node)

    def flush(self) -> None:
        """Write what the connection has queued; close the socket once it is over."""
        connection = self.connection
        if connection is None:
            return
        self._log_teardown_errors()
        if connection.phase is Phase.OPEN and self._timer is not None and connection.keep_alive == 0:
            self._cancel_timer()
        data = connection.take_output()
        if data:
            self._socket.write(data)
            connection.send_oct += len(data)
            connection.send_cnt += 1
        if connection.blocked != self._reading_stopped and not connection.finished:
            self._reading_stopped = connection.blocked
            if connection.blocked:
                self._socket.pauseProducing()
            else:
                self._socket.resumeProducing()
        if connection.finished:
            self._cancel_timer()
            if connection.reason:
                _log.info(
                    "closing MQTT connection {peer} ({client}): {reason}",
                    peer=connection.peer,
                    client=printable(connection.client_id),
                    reason=printable(connection.reason),
                )
                connection.reason = ""
            self._socket.unregisterProducer()
            self._socket.loseConnection()

    def _log_teardown_errors(self) -> None:
        log_teardown_errors(_log, self.connection, "MQTT connection")

    # -- timers -------------------------------------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _connect_expired(self) -> None:
        self._timer = None
        connection = self.connection
        if connection is not None and connection.phase is Phase.CONNECTING:
            self._drop(f"no CONNECT within {CONNECT_TIMEOUT:g} s")

    def _arm_keep_alive(self) -> None:
        self._cancel_timer()
        connection = self.connection
        if connection is not None and connection.keep_alive:
            self._timer = self.factory.clock.callLater(connection.keep_alive * 1.5, self._keep_alive)

    def _keep_alive(self) -> None:
        """One and a half keep-alive periods after the client was last heard from: end it, or
        look again when that time comes."""
        self._timer = None
        connection = self.connection
        if connection is None or connection.finished:
            return
        allowed = connection.keep_alive * 1.5
        silent = self.factory.clock.seconds() - self._heard
        if silent < allowed:
            self._timer = self.factory.clock.callLater(allowed - silent, self._keep_alive)
            return
        connection.timed_out()
        connection.connection_lost()  # (the will goes out now, not when the socket is gone)
        self.factory.amqp.flush()
        self.flush()

    def _drop(self, why: str) -> None:
        connection = self.connection
        _log.info("dropping MQTT connection {peer}: {why}", peer=connection.peer if connection else "?", why=why)
        self._cancel_timer()
        self._socket.unregisterProducer()
        self._socket.abortConnection()

    # -- the transport's producer -------------------------------------------------------------

    def pauseProducing(self) -> None:  # noqa: N802 (IPushProducer)
        if self.connection is not None:
            self.connection.set_writable(False)

    def resumeProducing(self) -> None:  # noqa: N802 (IPushProducer)
        if self.connection is not None:
            self.connection.set_writable(True)
            self.factory.amqp.flush()

    def stopProducing(self) -> None:  # noqa: N802 (IPushProducer)
        pass

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_timer()
        connection = self.connection
        if connection is None:
            return
        amqp = self.factory.amqp
        amqp.protocols.pop(connection, None)
        try:
            connection.connection_lost()
        except Exception:
            _log.failure("bug while releasing MQTT connection {peer}", peer=connection.peer)
        self._log_teardown_errors()
        amqp.flush()
        if not amqp.protocols:
            amqp.all_closed()


class MqttServerFactory(Factory):
    """MQTT connections to the node of ``amqp`` (the AMQP factory, whose connections they join).

    :param registry: the node's MQTT side
    :param monitor: told of the bytes read from clients (``None``: nothing is)
    """

    def __init__(
        self,
        registry: MqttRegistry,
        amqp: AMQPServerFactory,
        clock: IReactorTime,
        monitor: ResourceMonitor | None = None,
    ) -> None:
        self.registry = registry
        self.amqp = amqp
        self.clock = clock
        self.monitor = monitor

    def buildProtocol(self, addr: IAddress | None) -> Any:
        return MqttServerProtocol(self)

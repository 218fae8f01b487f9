"""The Twisted shell around the sans-IO AMQP core.

:class:`AMQPServerProtocol` moves bytes between a transport and a :class:`ServerConnection`
and runs the connection's timers (handshake timeout, heartbeats, close timeout) on the
injected clock. :class:`AMQPServerFactory` owns the :class:`Node` and writes every connection
with pending output once per batch: after each ``dataReceived``, after each timer, and after a
connection is lost (its unacked deliveries may go to other consumers).

Flow control: the protocol registers itself as a streaming producer. When a client's socket
buffer fills, Twisted calls ``pauseProducing`` and deliveries to that connection stop
(its consumers are skipped) until ``resumeProducing``. Replies do not stop there, so what a
client that does not read can cost is bounded apart: past :data:`OUTPUT_BOUND` bytes written
to its full buffer, or when the core held input back at its bound on replies
(``replies_held``), nothing more is read from it until it has read its output. A resource
alarm stops reading from a publisher the same way (``ServerConnection.blocked``).

Closing: the producer is unregistered before the socket is closed (Twisted's
``loseConnection`` otherwise waits for a paused producer forever, and the socket stays in
CLOSE-WAIT), and every wait has a timer: for ``close-ok`` after our ``connection.close``, for
the output to drain after we close, and for the client to hang up after our ``close-ok``
(RabbitMQ keeps reading until then, and so do we).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, ISSLTransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from postroom.broker.amqp.connection import ServerConnection
from postroom.broker.amqp.seams import State
from postroom.broker.core.node import Node
from postroom.broker.errors import ReplyCode
from postroom.broker.server.alarms import ResourceMonitor
from postroom.broker.server.sockets import SocketTransport, socket_details, socket_of
from postroom.broker.text import printable

#: Bytes written to a client whose socket buffer is full before nothing more is read from it:
#: deliveries stop at the full buffer, but replies do not (a loop of ``basic.get`` and
#: ``basic.recover`` on a large message, unroutable mandatory publishes), so their sum is bounded.
OUTPUT_BOUND = 8 << 20

#: Bytes read from a client at a time: Twisted's default, and while the node is in flow
#: (``Node.flow``: a queue with consumers is far behind), a sixteenth of it, so that reading
#: publishes cedes the reactor to deliveries and acks.
READ_BYTES = 65536
FLOW_READ_BYTES = 4096

#: Seconds a client has to finish the handshake (RabbitMQ's handshake_timeout is 10 s).
HANDSHAKE_TIMEOUT = 10.0
#: Seconds we wait for connection.close-ok after sending connection.close before dropping the socket,
#: and for queued output to drain once we close the socket ourselves.
CLOSE_TIMEOUT = 3.0
#: At most this many seconds after our connection.close-ok the socket stays open for the client to
#: hang up (RabbitMQ's ?CLOSING_TIMEOUT; less when the heartbeat interval is shorter).
LINGER_TIMEOUT = 30.0
#: What RabbitMQ tells every client when the node shuts down; clients treat it as a clean
#: shutdown and reconnect.
SHUTDOWN_TEXT = "broker forced connection closure with reason 'shutdown'"
#: Seconds shutdown waits for clients to answer connection.close before the sockets are dropped.
SHUTDOWN_GRACE = 1.0


def socket_reader(transport: Any) -> Any:
    """What reads ``transport``'s socket (under TLS, the transport beneath it), whose
    ``bufferSize`` is the most one read takes (see :data:`READ_BYTES`); ``None``: none."""
    reader = transport
    while not hasattr(reader, "bufferSize") and hasattr(reader, "transport"):
        reader = reader.transport
    return reader if hasattr(reader, "bufferSize") else None


def pace_reads(reader: Any, node: Node) -> None:
    """Read less at a time while the node is in flow (a queue with consumers far behind), so
    that reading publishes cedes the reactor to deliveries and acknowledgements."""
    if reader is not None:
        size = FLOW_READ_BYTES if node.flow else READ_BYTES
        if reader.bufferSize != size:
            reader.bufferSize = size


def log_teardown_errors(log: Logger, connection: Any, what: str) -> None:
    """Log, once each, the errors the teardown steps of ``connection`` (one of ``what``)
    collected in its ``teardown_errors``: the other steps still ran."""
    if connection is None or not connection.teardown_errors:
        return
    errors, connection.teardown_errors = connection.teardown_errors, []
    for error in errors:
        log.failure(
            "bug while releasing {what} {peer}",
            Failure(error, type(error), error.__traceback__),
            what=what,
            peer=connection.peer,
        )


def certificate_common_names(certificate: Any) -> str | None:
    """The common names in a client's certificate (an OpenSSL ``X509``), joined by commas as
    RabbitMQ joins them (``""``: it has none); ``None`` when it presented none."""
    from cryptography.x509.oid import NameOID

    if certificate is None:
        return None
    subject = certificate.to_cryptography().subject
    return ",".join(str(attribute.value) for attribute in subject.get_attributes_for_oid(NameOID.COMMON_NAME))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, or an IPv4-mapped loopback)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class AMQPServerProtocol(Protocol):
    """One client connection: a thin shell over :class:`ServerConnection`."""

    _log = Logger()
    def __init__(self, factory: AMQPServerFactory) -> None:
        self.factory = factory
        self.connection: ServerConnection | None = None
        self._handshake_timer: IDelayedCall | None = None
        self._heartbeat_timer: IDelayedCall | None = None
        self._close_timer: IDelayedCall | None = None
        self._closing_socket = False
        #: Whether the transport was told to stop reading for a resource alarm.
        self._blocked = False
        #: Whether the transport's buffer is full (deliveries stop), and the bytes written
        #: since: over :data:`OUTPUT_BOUND`, nothing more is read from the client until it
        #: has read what it was sent (replies to ``basic.get``, returns, recoveries).
        self._output_full = False
        self._written_while_full = 0
        self._reading_held = False
        self._reading = True
        #: What reads the socket, with its ``bufferSize`` (``None``: nothing to set).
        self._reader: Any = None

    #: The transport, typed as the socket it is; set once connected (looked up on every write).
    _socket: SocketTransport

    def connectionMade(self) -> None:
        self._socket = socket_of(self)
        peer = self._socket.getPeer()
        host = getattr(peer, "host", "")
        self.connection = ServerConnection(
            self.factory.node,
            loopback=is_loopback(host),
            peer=f"{host}:{getattr(peer, 'port', '')}",
            certificate_name=self._certificate_name if ISSLTransport.providedBy(self.transport) else None,
        )
        self.factory.protocols[self.connection] = self
        self.connection.socket = socket_details(self.transport)
        self.connection.connected_at = int(self.factory.clock.seconds() * 1000)
        self._reader = socket_reader(self.transport)
        if self.factory.leading is not None and self._reader is not None:
            self._fence_writes(self._reader)
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            # Deliveries and confirms are latency-bound small writes: never wait for Nagle.
            no_delay(True)
        self._socket.registerProducer(self, True)
        self._handshake_timer = self.factory.clock.callLater(HANDSHAKE_TIMEOUT, self._handshake_expired)

    def _fence_writes(self, socket: Any) -> None:
        """A cluster's leader checks its lease each time the socket takes what waits to be
        written, before it does: a process paused past its lease writes nothing once it
        resumes, not even what it had queued before the pause (the reactor may find a socket
        writable before any timer runs). Once per turn of the reactor with output, and only in
        a cluster."""
        factory = self.factory
        write = socket.doWrite

        def doWrite() -> Any:
            if factory.leading is not None and not factory.leading():
                factory.fence()
                return None
            return write()

        socket.doWrite = doWrite

    def _certificate_name(self) -> str | None:
        """The common names in the client's certificate (:func:`certificate_common_names`).
        Asked only after the handshake: the client's first bytes come after it."""
        return certificate_common_names(ISSLTransport(self.transport).getPeerCertificate())

    def dataReceived(self, data: bytes) -> None:
        connection = self.connection
        assert connection is not None
        connection.recv_oct += len(data)
        connection.recv_cnt += 1
        factory = self.factory
        if factory.leading is not None and not factory.leading():
            factory.fence()
            return
        monitor = factory.monitor
        if monitor is not None:  # (memory is read again after enough is read: see note_read)
            monitor.note_read(len(data))
        factory.in_io = True
        try:
            connection.receive_data(data)
        except Exception:
            self._log.failure("bug while handling frames from {peer}", peer=connection.peer)
            try:
                connection.close(ReplyCode.INTERNAL_ERROR, "internal error")
            except Exception:
                self._log.failure("bug while closing connection {peer}", peer=connection.peer)
                connection.closed = True
        finally:
            factory.in_io = False
        factory.flush()
        self.flush()
        pace_reads(self._reader, factory.node)

    def flush(self) -> None:
        """Write what the connection has queued, and close the socket if the connection is over."""
        connection = self.connection
        if connection is None:
            return
        self._log_teardown_errors()
        if self._handshake_timer is not None and connection.is_open:
            self._handshake_timer.cancel()
            self._handshake_timer = None
            if connection.heartbeat:
                self._schedule_heartbeat()
        if connection.blocked != self._blocked:
            self._follow_alarm(connection)
        data = connection.data_to_send()
        if data:
            self._socket.write(data)
            connection.send_oct += len(data)
            connection.send_cnt += 1
            if self._output_full:
                self._written_while_full += len(data)
                if self._written_while_full > OUTPUT_BOUND and not self._reading_held:
                    self._reading_held = True
                    self._update_reading()
        if connection.replies_held and not self._reading_held and not connection.closed:
            # The core stopped at its bound on replies: go on once they are written.
            self._reading_held = True
            self._update_reading()
            if not self._output_full:
                self.factory.clock.callLater(0, self._release_reading)
        if connection.closed:
            if connection.error is not None:
                self._log_closing(connection)
                connection.error = None
            if connection.state is State.LINGERING:
                if self._close_timer is None:
                    self._cancel_timers()
                    heartbeat = connection.heartbeat
                    linger = min(heartbeat, LINGER_TIMEOUT) if heartbeat else LINGER_TIMEOUT
                    self._close_timer = self.factory.clock.callLater(linger, self._close_socket)
            elif connection.silent_close_delay:
                delay, connection.silent_close_delay = connection.silent_close_delay, 0.0
                self._cancel_timers()
                self._socket.pauseProducing()  # stop reading: nothing more from this client is read
                self._close_timer = self.factory.clock.callLater(delay, self._close_socket)
            elif not self._closing_socket:
                self._close_socket()
        elif connection.state is State.CLOSING and self._close_timer is None:
            if connection.error is not None:
                self._log_closing(connection)
            self._close_timer = self.factory.clock.callLater(CLOSE_TIMEOUT, self._drop, "no connection.close-ok")

    def _update_reading(self) -> None:
        """Read from the client unless a resource alarm blocked it or its output is over its bound."""
        reading = not self._blocked and not self._reading_held
        if reading != self._reading:
            self._reading = reading
            if reading:
                self._socket.resumeProducing()
            else:
                self._socket.pauseProducing()

    def _follow_alarm(self, connection: ServerConnection) -> None:
        """Stop reading from a connection a resource alarm blocked; once it is unblocked, read
        again, starting with the bytes it held back."""
        self._blocked = connection.blocked
        self._update_reading()
        if not connection.blocked:
            self._take_held_input(connection)
            self._blocked = connection.blocked  # blocked again by what it held
            self._update_reading()

    def _release_reading(self) -> None:
        """The client read what it was sent: read from it again, starting with what was held."""
        connection = self.connection
        if not self._reading_held or connection is None or connection.closed:
            return
        self._reading_held = False
        self._update_reading()
        if connection.replies_held:
            connection.replies_held = False
            self._take_held_input(connection)
            self.flush()

    def _take_held_input(self, connection: ServerConnection) -> None:
        """Act on the bytes the connection held back (read before the shell stopped reading)."""
        factory = self.factory
        factory.in_io = True
        try:
            connection.receive_data(b"")
        except Exception:
            self._log.failure("bug while handling frames from {peer}", peer=connection.peer)
            connection.close(ReplyCode.INTERNAL_ERROR, "internal error")
        finally:
            factory.in_io = False
        if factory.node.dirty:  # what its frames did for other connections (deliveries)
            factory._schedule_flush()

    def _close_socket(self) -> None:
        """Close the socket once the output is written; drop it if that takes too long."""
        self._cancel_timers()
        self._closing_socket = True
        self._socket.unregisterProducer()
        self._socket.loseConnection()
        self._close_timer = self.factory.clock.callLater(CLOSE_TIMEOUT, self._drop, "output not drained")

    def _log_teardown_errors(self) -> None:
        log_teardown_errors(self._log, self.connection, "connection")

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_timers()
        connection = self.connection
        if connection is None:
            return
        factory = self.factory
        factory.protocols.pop(connection, None)
        try:
            connection.connection_lost()
        except Exception:
            self._log.failure("bug while releasing connection {peer}", peer=connection.peer)
        self._log_teardown_errors()
        factory.flush()
        if not factory.protocols:
            factory.all_closed()  # after the release: its returns are in the queues (and the log)

    # -- timers ---------------------------------------------------------------------------------

    def _cancel_timers(self) -> None:
        for name in ("_handshake_timer", "_heartbeat_timer", "_close_timer"):
            timer = getattr(self, name)
            if timer is not None and timer.active():
                timer.cancel()
            setattr(self, name, None)

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        self._drop(f"handshake not completed within {HANDSHAKE_TIMEOUT:g} s")

    def _schedule_heartbeat(self) -> None:
        assert self.connection is not None
        self._heartbeat_timer = self.factory.clock.callLater(self.connection.heartbeat / 2, self._heartbeat)

    def _heartbeat(self) -> None:
        connection = self.connection
        assert connection is not None
        self._heartbeat_timer = None
        if not connection.tick():
            self._drop(f"missed heartbeats from client, timeout: {connection.heartbeat}s")
            return
        self.flush()
        self._schedule_heartbeat()

    def _log_closing(self, connection: ServerConnection) -> None:
        """Log why ``connection`` closes: its error's text may quote what the client sent (a
        user, vhost or queue name), so its control characters are escaped."""
        error = printable(str(connection.error))
        self._log.info("closing connection {peer}: {error}", peer=connection.peer, error=error)

    def _drop(self, why: str) -> None:
        connection = self.connection
        peer = connection.peer if connection else "?"
        self._log.info("dropping connection {peer}: {why}", peer=peer, why=printable(why))
        self._cancel_timers()
        self._socket.unregisterProducer()
        self._socket.abortConnection()

    # -- IPushProducer: the transport tells us when its buffer is full ---------------------------

    def pauseProducing(self) -> None:
        self._output_full = True
        if self.connection is not None:
            self.connection.set_writable(False)

    def resumeProducing(self) -> None:
        self._output_full = False
        self._written_while_full = 0
        if self.connection is not None:
            self.connection.set_writable(True)
        self._release_reading()
        if self.connection is not None:
            self.factory.flush()

    def stopProducing(self) -> None:
        pass


class AMQPServerFactory(Factory):
    """Makes :class:`AMQPServerProtocol` instances over one shared :class:`Node`.

    :param node: the broker node
    :param clock: the reactor (or a ``Clock`` in tests) for timers
    :param monitor: told of the bytes read from clients (memory is read again once enough
        came in); ``None``: nothing is
    """

    protocol = AMQPServerProtocol

    def __init__(self, node: Node, clock: IReactorTime, monitor: ResourceMonitor | None = None) -> None:
        self.node = node
        self.clock = clock
        self.monitor = monitor
        if node.clock is None:
            node.set_clock(clock)
        self.protocols: dict[ServerConnection, AMQPServerProtocol] = {}
        self.in_io = False
        #: Fired (once) when the last connection is gone (see :meth:`close_all`).
        self.closed_waiters: list[Deferred[None]] = []
        #: In a cluster's leader: whether this node may still serve (its lease in etcd surely
        #: holds). Once it may not, nothing more is read or written: see :meth:`fence`.
        self.leading: Callable[[], bool] | None = None
        self._flush_call: IDelayedCall | None = None
        self._backlog_call: IDelayedCall | None = None
        node.on_dirty = self._schedule_flush
        if hasattr(clock, "getThreadPool"):
            node.run_blocking = self._run_in_thread

    def _run_in_thread(self, fn: Callable[[], Any], callback: Callable[[Any], None]) -> None:
        """The node's ``run_blocking`` (a password hash): ``fn`` in the reactor's thread pool,
        ``callback`` with its result back on the reactor."""
        reactor: Any = self.clock  # (a reactor with threads, see __init__: no one interface says so)
        done = deferToThreadPool(reactor, reactor.getThreadPool(), fn)
        done.addCallback(callback)
        done.addErrback(lambda failure: AMQPServerProtocol._log.failure("bug while checking a login", failure))

    def buildProtocol(self, addr: IAddress | None) -> AMQPServerProtocol:
        return AMQPServerProtocol(self)

    def _schedule_flush(self) -> None:
        """Output appeared outside ``dataReceived`` (a timer, a lost connection): write it soon."""
        if not self.in_io and self._flush_call is None:
            self._flush_call = self.clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Write every connection that has output waiting."""
        if self._flush_call is not None:
            if self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
        if self.leading is not None and not self.leading():
            self.fence()
            return
        dirty = self.node.dirty
        while dirty:
            connection = dirty.pop()
            protocol = self.protocols.get(connection)
            if protocol is not None:
                protocol.flush()
        if self.node.backlogged and self._backlog_call is None:
            # Give the reactor a turn (other sockets, back-pressure) before the next batch.
            self._backlog_call = self.clock.callLater(0, self._dispatch_backlogged)

    def fence(self) -> None:
        """This node no longer leads its cluster (a paused process resumed past its lease):
        drop every connection at once, with what was waiting to be written, so that nothing
        decided here reaches a client after another node has taken over."""
        for protocol in list(self.protocols.values()):
            protocol._drop("this node no longer leads the cluster")

    def _dispatch_backlogged(self) -> None:
        self._backlog_call = None
        self.node.dispatch_backlogged()
        self.flush()

    def close_all(
        self,
        reply_code: ReplyCode = ReplyCode.CONNECTION_FORCED,
        reply_text: str = SHUTDOWN_TEXT,
        grace: float = SHUTDOWN_GRACE,
    ) -> Deferred[None]:
        """Close every connection (graceful shutdown): ``connection.close`` to each, as RabbitMQ.

        :returns: fires once every connection is gone, or after ``grace`` seconds, whichever
            comes first (the sockets left are then dropped with the reactor).
        """
        for connection in list(self.protocols):
            connection.close(reply_code, reply_text)
        self.flush()
        done: Deferred[None] = Deferred()
        if not self.protocols:
            done.callback(None)
            return done
        self.closed_waiters.append(done)
        timer = self.clock.callLater(grace, self.all_closed)

        def stop_timer(result: None) -> None:
            if timer.active():
                timer.cancel()
            return result

        done.addBoth(stop_timer)
        return done

    def all_closed(self) -> None:
        """Every connection is gone (or the grace period is over): fire :meth:`close_all`'s waiters."""
        waiters, self.closed_waiters = self.closed_waiters, []
        for waiter in waiters:
            waiter.callback(None)

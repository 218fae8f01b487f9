"""The Twisted shell around the stream protocol's sans-IO connection (``listen.stream``).

:class:`StreamServerProtocol` moves bytes between a transport and a
:class:`~broker.streams.connection.StreamConnection`, writes what the connection has to say
once per read (one write for all its frames), and runs its timers on the injected clock: 10
seconds for each handshake step (RabbitMQ's ``connection_negotiation_step_timeout``), and
once tuned, heartbeats both ways: one is sent after an interval with nothing written, and a
client heard from in neither of two intervals is dropped.

A client that does not read costs a bounded amount: the shell is the transport's producer.
Deliveries stop while the socket's buffer is full (``pauseProducing``) and go on once it
drains, and the connection queues at most ``DELIVERY_BOUND`` bytes of chunks between two
writes, whatever the credit. Answers do not stop there, so past :data:`OUTPUT_BOUND` bytes
written to a full buffer, nothing more is read from the client until it has read them.
"""

from __future__ import annotations

import errno
from typing import Any, cast

from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, ISSLTransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from postroom.broker.core.node import Node
from postroom.broker.server.alarms import ResourceMonitor
from postroom.broker.server.protocol import OUTPUT_BOUND, certificate_common_names, is_loopback
from postroom.broker.server.sockets import SocketTransport, socket_details, socket_of
from postroom.broker.streams.connection import StreamConnection
from postroom.broker.streams.handshake import HANDSHAKE_DONE, Step
from postroom.broker.wal.streamlog import Region
from postroom.broker.wire.streamframes import HEARTBEAT_FRAME

_log = Logger()

#: Seconds a client has for each step of the handshake.
STEP_TIMEOUT = 10.0

#: Seconds between two looks at the requests sent to the client (``consumer_update``): one
#: still unanswered at the second look since it was sent ends the connection, as RabbitMQ's
#: reader ends it (``request_timeout``, 60 s by default: a client that never answers would
#: otherwise hold its group's partition).
REQUEST_TIMEOUT = 60.0


#: What ``sendfile`` raises when the client has gone (the connection ends without a word).
_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})


def _bytes(items: list[Any]) -> int:
    """Bytes of ``items``: bytes, and chunks to send from their file."""
    return sum(item.length if type(item) is Region else len(item) for item in items)


def _send_some(sock: Any, data: bytes) -> int:
    """As much of ``data`` as the non-blocking socket ``sock`` takes now."""
    try:
        return int(sock.send(data))
    except BlockingIOError:  # full
        return 0


def _send_region(fileno: int, region: Region) -> int:
    """As much of ``region`` as the non-blocking socket ``fileno`` takes now (``sendfile``)."""
    done = 0
    while done < region.length:
        try:
            sent = region.send(fileno, done)
        except BlockingIOError:  # full: the rest waits
            break
        if not sent:
            break
        done += sent
    return done


class StreamServerProtocol(Protocol):
    """One stream-protocol client (see the module's docstring)."""

    def __init__(self, factory: StreamServerFactory) -> None:
        self.factory = factory
        self.connection: StreamConnection | None = None
        self._step_timer: IDelayedCall | None = None
        self._heartbeat_timer: IDelayedCall | None = None
        self._wrote = False
        self._silent_intervals = 0
        #: The bytes written since the socket's buffer filled (``connection.paused``), whether
        #: reading is held for them, and the call that goes on delivering after a write.
        self._written_while_full = 0
        self._reading_held = False
        #: What the socket did not take when it filled, in order (see :meth:`_keep_unsent`).
        self._unsent: list[Any] = []
        self._continuing: IDelayedCall | None = None
        #: The next look at the requests sent to the client, and those unanswered at the last.
        self._request_timer: IDelayedCall | None = None
        self._unanswered: set[int] = set()

    #: The transport, typed as the socket it is; set once connected (looked up on every write).
    _socket: SocketTransport

    def connectionMade(self) -> None:
        self._socket = socket_of(self)
        peer = self._socket.getPeer()
        host = getattr(peer, "host", "")
        connection = StreamConnection(
            self.factory.node,
            f"{host}:{getattr(peer, 'port', 0)}",
            is_loopback(host),
            self.factory.advertised,
            certificate_name=self._certificate_name if ISSLTransport.providedBy(self.transport) else None,
        )
        connection.wake = self._flush
        connection.connected_at = int(self.factory.clock.seconds() * 1000)
        connection.socket = socket_details(self.transport)
        self.connection = connection
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            # Deliveries and confirms are latency-bound small writes: never wait for Nagle
            # (a chunk written while the last is not acknowledged would wait for the client's
            # delayed acknowledgement, 40 ms).
            no_delay(True)
        self._socket.registerProducer(self, True)
        self._arm_step()

    def _certificate_name(self) -> str | None:
        """The common names in the client's certificate (``""``: it has none; ``None``: it
        presented none), as for AMQP's ``EXTERNAL``."""
        return certificate_common_names(ISSLTransport(self.transport).getPeerCertificate())

    def dataReceived(self, data: bytes) -> None:
        connection = self.connection
        if connection is None:
            return
        step = connection.step
        connection.recv_oct += len(data)
        connection.recv_cnt += 1
        monitor = self.factory.monitor
        if monitor is not None:  # (memory is read again after enough is read: see note_read)
            monitor.note_read(len(data))
        connection.receive(data)
        if connection.step != step:
            self._arm_step()
        self._flush()

    def _flush(self) -> None:
        connection = self.connection
        if connection is None or self.transport is None:
            return
        if connection.out:
            if connection.regions or self._unsent:
                written = self._send(connection.out)
            else:
                data = b"".join(cast("list[bytes]", connection.out))  # (no regions: bytes only)
                self._socket.write(data)
                written = len(data)
            connection.out.clear()
            connection.send_oct += written
            connection.send_cnt += 1
            connection.queued = 0
            connection.regions = 0
            self._wrote = True
            if connection.paused:
                self._written_while_full += written
                if self._written_while_full > OUTPUT_BOUND and not self._reading_held:
                    self._reading_held = True
                    self._socket.pauseProducing()
        if connection.behind and not connection.paused and self._continuing is None and not connection.finished:
            self._continuing = self.factory.clock.callLater(0, self._continue)
        if connection.pending_updates and self._request_timer is None and not connection.finished:
            self._request_timer = self.factory.clock.callLater(REQUEST_TIMEOUT, self._check_requests)
        if connection.step in (Step.TUNED, Step.OPENED) and self._heartbeat_timer is None and connection.heartbeat:
            self._heartbeat_timer = self.factory.clock.callLater(connection.heartbeat, self._heartbeat)
        if connection.finished:
            if self._unsent:  # (what the socket did not take yet goes before the end, read)
                unsent, self._unsent = self._unsent, []
                try:
                    self._socket.write(b"".join(i.read() if type(i) is Region else i for i in unsent))
                except OSError:
                    pass  # (the chunks' segment went: the connection ends anyway)
            if connection.reason:
                _log.info("stream connection {peer} closed: {reason}", peer=connection.peer, reason=connection.reason)
            # (unregistered first: loseConnection waits for a paused producer otherwise)
            self._socket.unregisterProducer()
            self._socket.loseConnection()

    def _send(self, out: list[Any]) -> int:
        """Write ``out``, chunks to send from their file among it (:class:`Region`). While
        nothing waits in the transport's buffer (and it is plain TCP), they go from the page
        cache straight to the socket (``sendfile``), the bytes before them straight too. When
        the socket is full, the rest is held (:meth:`_keep_unsent`) until it takes more. Otherwise
        (TLS, or the transport's buffer not empty) chunks are read and written through the
        transport. Returns the bytes written or held."""
        if self._unsent:
            self._unsent += out
            return _bytes(out)
        sock = self._direct_socket()
        waiting: list[Any] = []
        try:
            for at, item in enumerate(out):
                if type(item) is not Region:
                    waiting.append(item)
                    continue
                if sock is not None and item.sendable:
                    if waiting:
                        data = b"".join(waiting)
                        sent = _send_some(sock, data)
                        waiting = []
                        if sent < len(data):
                            return self._keep_unsent([data[sent:], *out[at:]])
                    done = _send_region(sock.fileno(), item)
                    if done < item.length:
                        rest = Region(item.storage, item.segment, item.offset + done, item.length - done)
                        return self._keep_unsent([rest, *out[at + 1 :]])
                    continue
                waiting.append(item.read())
        except OSError as error:
            if error.errno not in _GONE:
                # (the segment went, or its file failed: as when a read fails in the connection)
                peer = self.connection.peer if self.connection is not None else "?"
                _log.error("stream connection {peer}: sending a chunk failed: {error}", peer=peer, error=error)
            self._unsent = []
            self._socket.abortConnection()
            return 0
        data = b"".join(waiting)
        if data:
            self._socket.write(data)
        return len(data)

    def _keep_unsent(self, items: list[Any]) -> int:
        """The socket is full: keep ``items`` (in order, before anything written later) until
        the transport finds it writable again and calls :meth:`resumeProducing`. Deliveries
        stop meanwhile. Returns their bytes."""
        self._unsent = items
        if self.connection is not None:
            self.connection.paused = True
        transport: Any = self.transport  # (the TCP transport's own attributes)
        transport.producerPaused = True  # (so that its next write turn, finding its buffer empty, resumes us)
        transport.startWriting()
        return _bytes(items)

    def _direct_socket(self) -> Any:
        """The transport's socket when it is plain TCP with nothing in its buffer (so bytes
        sent to the socket itself go out in order), else ``None``."""
        transport = self.transport
        if ISSLTransport.providedBy(transport) or getattr(transport, "disconnecting", True):
            return None
        pending = getattr(transport, "_tempDataLen", None)
        buffered = len(getattr(transport, "dataBuffer", b"")) - getattr(transport, "offset", 0)
        if pending != 0 or buffered:
            return None
        return getattr(transport, "socket", None)

    def _continue(self) -> None:
        self._continuing = None
        connection = self.connection
        if connection is not None and not connection.finished:
            connection.resume()
            self._flush()

    # -- the transport's producer: its buffer full, then drained ---------------------------------

    def pauseProducing(self) -> None:  # noqa: N802 (IPushProducer)
        if self.connection is not None:
            self.connection.paused = True

    def resumeProducing(self) -> None:  # noqa: N802 (IPushProducer)
        if self._unsent:
            unsent, self._unsent = self._unsent, []
            self._send(unsent)
            if self._unsent:  # (full again)
                return
        self._written_while_full = 0
        if self._reading_held:
            self._reading_held = False
            self._socket.resumeProducing()
        connection = self.connection
        if connection is not None and not connection.finished:
            connection.paused = False
            connection.resume()
            self._flush()

    def stopProducing(self) -> None:  # noqa: N802 (IPushProducer)
        pass

    def _arm_step(self) -> None:
        if self._step_timer is not None and self._step_timer.active():
            self._step_timer.cancel()
        self._step_timer = None
        connection = self.connection
        if connection is not None and connection.step not in HANDSHAKE_DONE:
            self._step_timer = self.factory.clock.callLater(STEP_TIMEOUT, self._step_timed_out)

    def _step_timed_out(self) -> None:
        self._step_timer = None
        connection = self.connection
        if connection is None:
            return
        _log.info(
            "stream connection {peer} closed: timeout in state '{step}', likely due to lack of client action",
            peer=connection.peer,
            step=connection.step.value,
        )
        connection.finished = True
        self._socket.abortConnection()

    def _check_requests(self) -> None:
        """A look at the requests sent to the client (see :data:`REQUEST_TIMEOUT`)."""
        self._request_timer = None
        connection = self.connection
        if connection is None or connection.finished:
            return
        if self._unanswered & set(connection.pending_updates):
            _log.info("stream connection {peer} closed: request to client timed out", peer=connection.peer)
            connection.finished = True
            self._socket.abortConnection()
            return
        self._unanswered = set(connection.pending_updates)
        if self._unanswered:
            self._request_timer = self.factory.clock.callLater(REQUEST_TIMEOUT, self._check_requests)

    def _heartbeat(self) -> None:
        self._heartbeat_timer = None
        connection = self.connection
        if connection is None or connection.finished:
            return
        if connection.heard:
            connection.heard = False
            self._silent_intervals = 0
        else:
            self._silent_intervals += 1
            if self._silent_intervals >= 2:
                _log.info("stream connection {peer} closed: missed heartbeats", peer=connection.peer)
                connection.finished = True
                self._socket.abortConnection()
                return
        if not self._wrote:
            self._socket.write(HEARTBEAT_FRAME)
        self._wrote = False
        self._heartbeat_timer = self.factory.clock.callLater(connection.heartbeat, self._heartbeat)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        for timer in (self._step_timer, self._heartbeat_timer, self._continuing, self._request_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._step_timer = self._heartbeat_timer = self._continuing = self._request_timer = None
        self._unsent = []
        if self.connection is not None:
            self.connection.connection_lost()


class StreamServerFactory(Factory):
    """Stream-protocol connections to ``node``; ``advertised`` is the host and port ``open``
    tells clients to connect to (this listener's); ``monitor`` is told of the bytes read from
    clients, as the AMQP factory's (``None``: nothing is)."""

    def __init__(
        self, node: Node, clock: IReactorTime, advertised: tuple[str, int], monitor: ResourceMonitor | None = None
    ) -> None:
        self.node = node
        self.clock = clock
        self.advertised = advertised
        self.monitor = monitor

    def buildProtocol(self, addr: IAddress | None) -> StreamServerProtocol:
        return StreamServerProtocol(self)

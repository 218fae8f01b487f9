"""MQTT over WebSockets (``listen.mqtt_ws``, at path ``/ws`` as RabbitMQ's ``rabbitmq_web_mqtt``):
a protocol wrapper that accepts the WebSocket upgrade and then carries the MQTT shell's bytes
in binary frames, both ways (MQTT 3.1.1 section 6).

:class:`WebSocketProtocol` is the wrapped MQTT protocol's transport: what the MQTT shell writes
goes out as one binary frame per write; the payloads of the client's binary frames go to it as
they come (an MQTT packet may span frames, and a frame hold several [MQTT-6.0.0-2]). A text
frame ends the connection [MQTT-6.0.0-1]; pings are answered; a close is answered and ends it.
The subprotocol ``mqtt`` is chosen when offered [MQTT-6.0.0-4] (``mqttv3.1`` too, for older
clients).
"""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.interfaces import IAddress, IProtocolFactory
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure

from postroom.broker.text import printable
from postroom.broker.wire import websocket as ws

_log = Logger()

#: The subprotocols taken, in the order chosen.
PROTOCOLS = ("mqtt", "mqttv3.1")
#: RabbitMQ's path for MQTT over WebSockets.
PATH = "/ws"


class WebSocketProtocol(ProtocolWrapper):
    """One WebSocket connection carrying the wrapped protocol's bytes (see the module's docstring)."""

    factory: WebSocketFactory

    def __init__(self, factory: WebSocketFactory, wrapped: Any) -> None:
        super().__init__(cast(Any, factory), wrapped)
        #: The socket's transport (set once connected).
        self._socket: Any = None
        self._opening = b""
        self._open = False
        self._closing = False
        self._frames = ws.FrameReader(factory.max_frame)

    def makeConnection(self, transport: Any) -> None:
        # (the wrapped protocol is connected once the upgrade is accepted: see _upgrade)
        self.factory.registerProtocol(self)
        self.connected = 1
        self.transport = self._socket = transport
        self.connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._open:
            self._opening += data
            try:
                request = ws.read_handshake(self._opening)
            except ws.HandshakeError as refused:
                self._refuse(refused.status, str(refused))
                return
            if request is None:
                return
            if request.path != self.factory.path:
                self._refuse("404 Not Found", f"MQTT over WebSockets is at {self.factory.path}")
                return
            self._opening = b""
            self._upgrade(request)
            data = request.rest
            if not data:
                return
        try:
            frames = self._frames.feed(data)
        except ws.WebSocketError as error:
            self._close(error.code, str(error))
            return
        for opcode, _fin, payload in frames:
            if opcode in (ws.BINARY, ws.CONTINUATION):
                if payload:
                    self.wrappedProtocol.dataReceived(payload)
            elif opcode == ws.PING:
                self._socket.write(ws.frame(ws.PONG, payload))
            elif opcode == ws.CLOSE:
                self._close(ws.NORMAL, "")
                return
            elif opcode == ws.TEXT:
                self._close(ws.UNSUPPORTED_DATA, "MQTT is carried in binary frames [MQTT-6.0.0-1]")
                return
            elif opcode != ws.PONG:
                self._close(ws.PROTOCOL_ERROR, f"opcode {opcode:#x}")
                return
            if self._closing:
                return

    def _upgrade(self, request: ws.Request) -> None:
        chosen = next((p for p in PROTOCOLS if p in request.protocols), None)
        self._socket.write(ws.handshake_answer(request, chosen))
        self._open = True
        self.wrappedProtocol.makeConnection(cast(Any, self))

    def _refuse(self, status: str, reason: str) -> None:
        _log.info("refusing a WebSocket from {peer}: {reason}", peer=self._peer(), reason=printable(reason))
        self._closing = True
        self._socket.write(ws.refusal(status, reason))
        self._socket.loseConnection()

    def _close(self, code: int, reason: str) -> None:
        if reason:
            _log.info("closing a WebSocket from {peer}: {reason}", peer=self._peer(), reason=printable(reason))
        self._closing = True
        self._socket.write(ws.close_frame(code, reason))
        self._socket.loseConnection()

    def _peer(self) -> str:
        peer = self._socket.getPeer()
        return f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    # -- the wrapped protocol's transport ----------------------------------------------------

    def write(self, data: bytes) -> None:
        if data and not self._closing:
            self._socket.write(ws.frame(ws.BINARY, data))

    def writeSequence(self, data: Any) -> None:  # noqa: N802 (ITransport)
        self.write(b"".join(data))

    def loseConnection(self) -> None:  # noqa: N802 (ITransport)
        if not self._closing:
            self._closing = True
            self._socket.write(ws.close_frame(ws.NORMAL))
        self._socket.loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:  # noqa: N802 (IProtocol)
        self.factory.unregisterProtocol(self)
        if self._open:
            self.wrappedProtocol.connectionLost(reason)


class WebSocketFactory(WrappingFactory):
    """WebSocket connections at ``path`` carrying the protocols of ``wrapped``.

    :param max_frame: the longest frame taken from a client
    """

    protocol = WebSocketProtocol

    def __init__(self, wrapped: IProtocolFactory, path: str = PATH, max_frame: int = 256 << 20) -> None:
        super().__init__(wrapped)
        self.path = path
        self.max_frame = max_frame

    def buildProtocol(self, addr: IAddress | None) -> Any:
        return self.protocol(self, self.wrappedFactory.buildProtocol(addr))

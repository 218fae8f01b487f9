"""The HTTP listeners' site (metrics, management API): bounded before anyone has logged in.

twisted.web's defaults suit a web server, not a broker's side door: a request body of any size
is spooled to a temporary file before the resource (and its login check) sees it, and a
client that sends one header line now and then keeps its connection for twelve hours. Here
a request body over :data:`MAX_BODY` is answered 413 and the connection closed as soon as its
length shows it, a request whose headers take longer than :data:`HEADER_SECONDS` is closed,
an idle connection is closed after :data:`IDLE_SECONDS`, and bodies stay in memory.
"""

from __future__ import annotations

import io
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from postroom.broker.server.sockets import socket_of

__all__ = ["HEADER_SECONDS", "IDLE_SECONDS", "MAX_BODY", "BoundedSite"]

#: The largest request body taken (the management API's are small JSON documents).
MAX_BODY = 1 << 20
#: Seconds a request's line and headers may take to arrive.
HEADER_SECONDS = 10.0
#: Seconds a connection may stay idle between requests.
IDLE_SECONDS = 60

_TOO_LARGE = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _BoundedRequest(Request):
    """A request whose body is kept in memory, up to :data:`MAX_BODY` bytes."""

    _received = 0
    _refused = False

    def gotLength(self, length: int | None) -> None:
        self._body = self.content = io.BytesIO()
        if length is not None and length > MAX_BODY:
            self._refuse()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > MAX_BODY:
            self._refuse()
            return
        self._body.write(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self._refused:
            super().requestReceived(command, path, version)

    def _refuse(self) -> None:
        self._refused = True
        transport = socket_of(self.channel)
        transport.write(_TOO_LARGE)
        transport.loseConnection()  # reads nothing more


class _BoundedChannel(HTTPChannel):
    """An HTTP/1.1 channel that gives each request :data:`HEADER_SECONDS` for its headers."""

    _deadline: IDelayedCall | None = None

    def lineReceived(self, line: bytes) -> None:
        if self._deadline is None:
            self._deadline = self.callLater(HEADER_SECONDS, self._too_slow)
        super().lineReceived(line)

    def allHeadersReceived(self) -> None:
        self._cancel_deadline()
        super().allHeadersReceived()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_deadline()
        super().connectionLost(reason)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        transport = socket_of(self)
        transport.write(_TOO_SLOW)
        transport.loseConnection()


class BoundedSite(Site):
    """A ``Site`` whose connections and requests are bounded as the module says."""

    protocol = _BoundedChannel  # type: ignore[assignment]  # HTTP/1.1 only: no HTTP/2 here
    requestFactory = _BoundedRequest

    def __init__(self, resource: Resource, **kwargs: Any) -> None:
        super().__init__(resource, timeout=IDLE_SECONDS, **kwargs)

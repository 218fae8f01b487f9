"""The HTTP listeners' header deadline, on a Clock: a request's line and headers get
``HEADER_SECONDS`` in all, however the client spaces its lines; a request in time is served."""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.resource import Resource

from postroom.broker.server.http import HEADER_SECONDS, IDLE_SECONDS, BoundedSite


class _Fine(Resource):
    isLeaf = True

    def render_GET(self, request: object) -> bytes:
        return b"fine"


def connected(clock: Clock) -> tuple[object, StringTransport]:
    root = Resource()
    root.putChild(b"ok", _Fine())
    site = BoundedSite(root, reactor=clock)
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1234))
    transport = StringTransport()
    channel.makeConnection(transport)  # type: ignore[attr-defined]
    return channel, transport


def test_headers_that_dribble_in_are_cut_off_at_the_deadline() -> None:
    clock = Clock()
    channel, transport = connected(clock)
    channel.dataReceived(b"GET /ok HTTP/1.1\r\n")  # type: ignore[attr-defined]
    for _ in range(3):  # a line now and then resets an idle timer, not this deadline
        clock.advance(HEADER_SECONDS / 4)
        channel.dataReceived(b"X-Late: 1\r\n")  # type: ignore[attr-defined]
    assert transport.value() == b"" and not transport.disconnecting
    clock.advance(HEADER_SECONDS / 4)
    assert transport.value().startswith(b"HTTP/1.1 408 ") and transport.disconnecting


def test_a_request_in_time_is_served_and_the_connection_then_only_idles() -> None:
    clock = Clock()
    channel, transport = connected(clock)
    channel.dataReceived(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")  # type: ignore[attr-defined]
    assert transport.value().startswith(b"HTTP/1.1 200 ") and transport.value().endswith(b"fine")
    clock.advance(HEADER_SECONDS * 2)
    assert not transport.disconnecting  # no request under way: no header deadline
    clock.advance(IDLE_SECONDS)
    assert transport.disconnecting

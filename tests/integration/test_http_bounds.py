"""The HTTP listeners refuse what would cost the broker before anyone has logged in: a body
over the bound (413, at once, nothing spooled). Headers that dribble in: ``tests/broker/test_http.py``."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import threads

from postroom.broker.server.management import RateSampler, management_site
from postroom.broker.server.metrics import BrokerCollector, metrics_site

pytestmark = pytest.mark.integration


@pytest.fixture(params=["management", "metrics"])
def http_port(request: pytest.FixtureRequest, broker: Any) -> Iterator[int]:
    reactor, node = broker.reactor, broker.node
    if request.param == "management":
        site = management_site(node, RateSampler(node, reactor), reactor)
    else:
        site = metrics_site(BrokerCollector(node), reactor)
    listening = threads.blockingCallFromThread(reactor, lambda: reactor.listenTCP(0, site, interface="127.0.0.1"))
    try:
        yield listening.getHost().port
    finally:
        threads.blockingCallFromThread(reactor, listening.stopListening)


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``; everything read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_body_over_the_bound_is_refused_as_soon_as_its_length_shows(http_port: int) -> None:
    started = time.monotonic()
    request = b"POST /api/queues/%2F/q/get HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\nab"
    answer = exchange(http_port, request)
    assert answer.startswith(b"HTTP/1.1 413 ") and time.monotonic() - started < 5


def test_a_chunked_body_over_the_bound_is_refused(http_port: int) -> None:
    chunk = b"x" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20))  # 1.25 MiB
    answer = exchange(http_port, b"POST /api/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_a_small_request_is_still_answered(http_port: int) -> None:
    answer = exchange(http_port, b"GET /api/overview HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 404 Not Found")

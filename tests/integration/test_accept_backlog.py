"""Every listener's accept queue holds a storm of clients connecting at once: 4,096 unless its
endpoint says ``backlog=`` (Twisted's default of 50 overflowed under a burst of 1,000 connects),
read back from the kernel's own view of the listening socket (``ss``)."""

from __future__ import annotations

import subprocess
import time

import pytest
from twisted.internet import threads
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.selectreactor import SelectReactor

from postroom.broker.core.node import Node
from postroom.broker.server.listeners import ACCEPT_BACKLOG, Listener, with_backlog

pytestmark = pytest.mark.integration


def accept_queue(port: int) -> int:
    """The listening socket's accept queue on ``port``, as ``ss`` shows it (its Send-Q)."""
    lines = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return int(lines[0].split()[2])


def listening(reactor: SelectReactor, description: str) -> tuple[Listener, int]:
    node = Node()
    listener = Listener("amqp", description, Factory.forProtocol(Protocol), reactor, node, "amqp")
    threads.blockingCallFromThread(reactor, listener.startService)
    deadline = time.monotonic() + 5
    while not node.listeners and time.monotonic() < deadline:
        time.sleep(0.01)
    return listener, node.listeners[0].port


@pytest.mark.parametrize(
    ("description", "expected"),
    [("tcp:0:interface=127.0.0.1", ACCEPT_BACKLOG), ("tcp:0:interface=127.0.0.1:backlog=100", 100)],
)
def test_a_listeners_accept_queue(broker_reactor: SelectReactor, description: str, expected: int) -> None:
    listener, port = listening(broker_reactor, description)
    try:
        assert accept_queue(port) == expected
    finally:
        threads.blockingCallFromThread(broker_reactor, listener.stopService)


def test_an_endpoint_that_names_its_backlog_keeps_it() -> None:
    assert with_backlog("tcp:5672") == f"tcp:5672:backlog={ACCEPT_BACKLOG}"
    assert with_backlog("tcp:5672:backlog=10:interface=::1") == "tcp:5672:backlog=10:interface=::1"
    assert with_backlog("unix:/run/p.sock") == f"unix:/run/p.sock:backlog={ACCEPT_BACKLOG}"

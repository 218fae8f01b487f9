"""Shared fixtures: an in-process Postroom broker on a real loopback socket.

The stock AMQP clients under test (pika, kombu, Celery, py-amqp) block, so the broker runs on
a reactor in a background thread for the whole session and each test gets a fresh
:class:`Node` listening on ``127.0.0.1`` port 0.

The reactor is a private instance rather than the global ``twisted.internet.reactor``: the
global one belongs to pytest-twisted (which installs it and runs it in a greenlet for
``@pytest_twisted.ensureDeferred`` tests), and two owners of one reactor deadlock or raise
``ReactorAlreadyRunning``. Nothing in the broker touches the global reactor: the factory takes
its clock, and ``listenTCP`` on the private reactor binds the port to it.
"""

from __future__ import annotations

import faulthandler
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from twisted.internet import threads
from twisted.internet.interfaces import IListeningPort
from twisted.internet.selectreactor import SelectReactor

from broker.core.node import Node
from broker.protocol import AMQPServerFactory

T = TypeVar("T")

# CI and the default runs are repeatable; HYPOTHESIS_PROFILE=dev explores new examples each run.
settings.register_profile("ci", derandomize=True, max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Seconds after which a hung integration test dumps every thread's stack and ends the run.
HANG_TIMEOUT = 60


@pytest.fixture(scope="session")
def broker_reactor() -> Iterator[SelectReactor]:
    """A reactor running in a daemon thread for the whole session."""
    reactor = SelectReactor()
    thread = threading.Thread(
        target=reactor.run, kwargs={"installSignalHandlers": False}, name="postroom-reactor", daemon=True
    )
    thread.start()
    yield reactor
    reactor.callFromThread(reactor.stop)
    thread.join(5)


@dataclass
class Broker:
    """One running broker: its node and factory, and the port it listens on."""

    reactor: SelectReactor
    node: Node
    factory: AMQPServerFactory
    listening: IListeningPort
    port: int

    @property
    def url(self) -> str:
        """An AMQP URL for guest on the default vhost."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the reactor thread and return its result (to read broker state safely)."""
        return threads.blockingCallFromThread(self.reactor, fn, *args)

    def queue_names(self) -> set[str]:
        """The names of the queues on vhost ``/``."""
        return self.call(lambda: set(self.node.vhosts["/"].queues))

    def stop(self) -> None:
        """Close every connection and stop listening."""

        def stop() -> Any:
            self.factory.close_all()
            return self.listening.stopListening()

        self.call(stop)


@pytest.fixture
def make_broker(broker_reactor: SelectReactor) -> Iterator[Callable[..., Broker]]:
    """A factory for brokers over a given :class:`Node`; every broker is stopped after the test."""
    brokers: list[Broker] = []

    def make(node: Node | None = None) -> Broker:
        node = node if node is not None else Node()

        def listen() -> tuple[AMQPServerFactory, IListeningPort]:
            factory = AMQPServerFactory(node, broker_reactor)
            return factory, broker_reactor.listenTCP(0, factory, interface="127.0.0.1")

        factory, listening = threads.blockingCallFromThread(broker_reactor, listen)
        broker = Broker(broker_reactor, node, factory, listening, listening.getHost().port)
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.stop()


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    """A fresh broker with the default node (guest/guest from loopback, vhost ``/``)."""
    return make_broker()


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """End the run with a stack dump if an integration test hangs (client libraries can block forever)."""
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    faulthandler.dump_traceback_later(HANG_TIMEOUT, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def pika_connect(broker: Broker) -> Iterator[Callable[..., Any]]:
    """Open pika ``BlockingConnection``\\ s to ``broker`` with bounded timeouts; all closed after the test."""
    import pika

    connections: list[pika.BlockingConnection] = []

    def connect(**overrides: Any) -> pika.BlockingConnection:
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": broker.port,
            "credentials": pika.PlainCredentials("guest", "guest"),
            "connection_attempts": 1,
            "socket_timeout": 5,
            "stack_timeout": 5,
            "blocked_connection_timeout": 5,
        }
        options.update(overrides)
        connection = pika.BlockingConnection(pika.ConnectionParameters(**options))
        connections.append(connection)
        return connection

    yield connect
    for connection in connections:
        if connection.is_open:
            connection.close()

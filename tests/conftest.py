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
import gc
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from twisted.internet import threads
from twisted.internet.interfaces import IListeningPort
from twisted.internet.selectreactor import SelectReactor
from twisted.logger import formatEventAsClassicLogText, globalLogPublisher

from postroom.broker.core.node import Node
from postroom.broker.server.protocol import AMQPServerFactory

T = TypeVar("T")

# CI and the default runs are repeatable; HYPOTHESIS_PROFILE=dev explores new examples each run.
settings.register_profile("ci", derandomize=True, max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Seconds after which a hung integration test dumps every thread's stack and ends its worker
#: (three workers share two cores, so a slow test may take several times its quiet duration).
HANG_TIMEOUT = 180
#: Where the hang guard writes its stack dumps: a worker's own output is lost when it ends, so
#: the controller prints what it finds here at the end of the run (:func:`pytest_terminal_summary`).
HANG_DIR_VARIABLE = "POSTROOM_HANG_DIR"
#: Under ``CI=true`` nothing may be skipped: a test that cannot run (RabbitMQ, Node, Prometheus
#: or Java missing, a port taken, a fetch refused) fails, saying why, so a green run means that
#: every comparison it claims was made.
SKIPS_FAIL = os.environ.get("CI", "").lower() == "true"


#: Modules that take a minute or more, started first so that the test workers (``pytest -n``,
#: one module per worker at a time) do not end the run waiting on one of them.
SLOW_MODULES = (
    "tests/spark/test_cluster.py",
    "tests/integration/test_crash.py",
    "tests/integration/test_deep_queues.py",
    "tests/integration/test_checkpoint_restarts.py",
    "tests/conformance/test_generated_transcripts.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOW_MODULES.index(path) if path in SLOW_MODULES else len(SLOW_MODULES)

    items.sort(key=rank)  # stable: each module's tests keep their order


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        os.environ[HANG_DIR_VARIABLE] = tempfile.mkdtemp(prefix="postroom-hangs-")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    directory = os.environ.get(HANG_DIR_VARIABLE)
    if directory is None or not os.path.isdir(directory):
        return
    for dump in sorted(os.listdir(directory)):
        text = open(os.path.join(directory, dump), errors="replace").read()
        if text:
            terminalreporter.section(f"hang guard: {dump}", red=True)
            terminalreporter.write_line(text)


def _failed_for_a_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if SKIPS_FAIL and report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and under CI=true nothing may be: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _failed_for_a_skip(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _failed_for_a_skip(outcome.get_result())  # type: ignore[attr-defined]


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
def make_broker(broker_reactor: SelectReactor, request: pytest.FixtureRequest) -> Iterator[Callable[..., Broker]]:
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
        BROKER_PORTS.add(broker.port)
        BROKER_TESTS[broker.port] = request.node.nodeid
        return broker

    yield make
    for broker in brokers:
        broker.stop()


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    """A fresh broker with the default node (guest/guest from loopback, vhost ``/``)."""
    return make_broker()


#: Ports of the in-process brokers started in this run (see :func:`_no_leaked_broker_sockets`).
BROKER_PORTS: set[int] = set()
#: The test that started each of those brokers (named when one leaves a socket open).
BROKER_TESTS: dict[int, str] = {}
#: Seconds a module's broker sockets get to close after its last test (a client that sent
#: connection.close-ok hangs up at once; the broker's own close waits are 3 s at most).
SOCKET_DRAIN_SECONDS = 10.0
#: Log texts that mean the broker hid a crash path, even without a traceback attached.
CRASH_TEXTS = ("bug while", "Unhandled Error", "Unhandled error in Deferred")


def broker_sockets(ports: set[int]) -> list[str]:
    """The TCP sockets this process holds whose local port is one of ``ports`` (server side), but
    listening ones: ``"port state"`` each (state as in ``/proc/net/tcp``: 08 is CLOSE-WAIT)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports and fields[3] != "0A" and fields[9] in inodes:
                    found.append(f"{port} {fields[3]}")
    return found


@pytest.fixture(scope="module", autouse=True)
def _no_leaked_broker_sockets() -> Iterator[None]:
    """After each module, every server-side socket of its in-process brokers is closed.

    A connection that ended must release its socket whatever it left queued (a socket in
    CLOSE-WAIT for ever is a descriptor leak that ends with a broker refusing every client).
    """
    BROKER_PORTS.clear()
    yield
    gc.collect()  # (a test's client left in a reference cycle closes its socket only when collected)
    ports = set(BROKER_PORTS)
    deadline = time.monotonic() + SOCKET_DRAIN_SECONDS
    while broker_sockets(ports) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = broker_sockets(ports)
    named = [f"{socket} (the broker of {BROKER_TESTS.get(int(socket.split()[0]), 'this module')})" for socket in left]
    assert named == [], "broker sockets left open after the module's tests"


@pytest.fixture(autouse=True)
def _no_broker_tracebacks() -> Iterator[None]:
    """Fail any test during which something logged a traceback or a hidden crash path.

    The broker must never crash on what a client sends; "bug while handling frames" answered
    with 541 is still a bug, so a suite cannot pass while the broker hides one.
    """
    events: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        text = str(event.get("log_format") or "")
        if event.get("log_failure") is not None or any(crash in text for crash in CRASH_TEXTS):
            events.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        yield
    finally:
        globalLogPublisher.removeObserver(observe)
    if events:
        pytest.fail("logged during the test:\n" + "\n".join(formatEventAsClassicLogText(e) or "" for e in events))


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """End the run with a stack dump if an integration test hangs (client libraries can block forever)."""
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    longer = request.node.get_closest_marker("hang_timeout")
    directory = os.environ.get(HANG_DIR_VARIABLE) or tempfile.gettempdir()
    with open(os.path.join(directory, f"{os.getpid()}.txt"), "a") as dump:
        dump.write(f"{request.node.nodeid} did not end within its time; every thread's stack:\n")
        dump.flush()
        faulthandler.dump_traceback_later(longer.args[0] if longer else HANG_TIMEOUT, exit=True, file=dump)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            dump.truncate(0)  # it ended: nothing to report


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

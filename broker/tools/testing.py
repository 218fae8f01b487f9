"""Test helpers shipped with the broker: drive a :class:`ServerConnection` with pamqp frames.

Tests assert on decoded frames, not raw bytes, except where byte-exactness is the point.
No Twisted here: these helpers work on the sans-IO core.
"""

from __future__ import annotations

import errno
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from zope.interface import implementer

from postroom.broker.amqp.connection import ServerConnection
from postroom.broker.core.node import Node
from postroom.broker.wal.files import ISegmentStorage
from postroom.broker.wire.codec import PROTOCOL_HEADER


class FramePump:
    """Splits what the server wrote into ``(channel, frame)`` pairs, across calls."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        """Decode every complete frame in ``data`` (plus what was left over before)."""
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            if self._buffer.startswith(b"AMQP"):
                frames.append((0, self._buffer[:8]))
                self._buffer = self._buffer[8:]
                continue
            size = int.from_bytes(self._buffer[3:7], "big")
            if len(self._buffer) < size + 8:
                break
            consumed, channel, value = frame.unmarshal(self._buffer)
            frames.append((channel, value))
            self._buffer = self._buffer[consumed:]
        return frames


def encode(channel: int, *methods: Any) -> bytes:
    """Encode methods (and content header/body frames) for one channel with pamqp."""
    return b"".join(frame.marshal(method, channel) for method in methods)


def publish_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: commands.Basic.Properties | None = None,
    mandatory: bool = False,
    frame_max: int = 131072,
) -> bytes:
    """The frames of one ``basic.publish`` with its content, split at ``frame_max``."""
    parts = [
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        ContentHeader(0, len(body), properties or commands.Basic.Properties()),
    ]
    chunk = frame_max - 8
    parts += [ContentBody(body[start : start + chunk]) for start in range(0, len(body), chunk)]
    return encode(channel, *parts)


class ConfirmedPublisher:
    """Publishes over an AMQP connection of its own (a plain socket, Postroom or RabbitMQ on the
    other end) with publisher confirms, keeping up to ``window`` messages unconfirmed: as fast
    as the broker takes them, where a client waiting for each confirm makes one round trip a
    message. Channel 1 publishes; :meth:`told` hears what else the broker says."""

    #: Messages framed and sent together.
    BATCH = 16

    def __init__(
        self, port: int, window: int = 1000, capabilities: dict[str, Any] | None = None, timeout: float = 30
    ) -> None:
        self.port, self.window, self.timeout = port, window, timeout
        self.capabilities = {"publisher_confirms": True, **(capabilities or {})}
        self.sent = self.confirmed = 0
        self._pump = FramePump()

    def publish(self, messages: Iterable[bytes]) -> None:
        """Send every message (each the frames of one publish on channel 1, as
        :func:`publish_frames` makes them) and return once the broker has confirmed them all.

        :raises AssertionError: the broker nacked one, or said something :meth:`told` refuses
        :raises EOFError: the broker closed the connection
        """
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        try:
            self._open(sock)
            self._send_all(sock, iter(messages))
        finally:
            sock.close()

    def told(self, value: Any) -> None:
        """The broker said ``value`` (other than a confirm) while messages were going out."""
        raise AssertionError(f"unexpected {value!r}")

    def done(self) -> bool:
        """Once every message is confirmed: whether to close the connection (or read on)."""
        return True

    def _expect(self, sock: socket.socket, kind: type) -> Any:
        while True:
            data = sock.recv(65536)
            if not data:
                raise EOFError("the broker closed the connection")
            for _channel, value in self._pump.feed(data):
                if isinstance(value, kind):
                    return value

    def _open(self, sock: socket.socket) -> None:
        sock.sendall(PROTOCOL_HEADER)
        self._expect(sock, commands.Connection.Start)
        start_ok = commands.Connection.StartOk(
            client_properties={"capabilities": self.capabilities}, mechanism="PLAIN", response="\0guest\0guest"
        )
        sock.sendall(encode(0, start_ok))
        tune = self._expect(sock, commands.Connection.Tune)
        sock.sendall(encode(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0)))
        sock.sendall(encode(0, commands.Connection.Open("/")))
        self._expect(sock, commands.Connection.OpenOk)
        sock.sendall(encode(1, commands.Channel.Open(), commands.Confirm.Select()))
        self._expect(sock, commands.Confirm.SelectOk)

    def _send_all(self, sock: socket.socket, messages: Iterator[bytes]) -> None:
        sock.setblocking(False)
        pending, more = memoryview(b""), True
        deadline = time.monotonic() + self.timeout
        while more or self.confirmed < self.sent or not self.done():
            if more and not pending and self.sent - self.confirmed < self.window:
                batch = [message for _, message in zip(range(self.BATCH), messages, strict=False)]
                more = len(batch) == self.BATCH
                pending = memoryview(b"".join(batch))
                self.sent += len(batch)
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 0.05)
            if readable:
                data = sock.recv(1 << 20)
                if not data:
                    raise EOFError("the broker closed the connection")
                for _channel, value in self._pump.feed(data):
                    self._heard(value)
                deadline = time.monotonic() + self.timeout
            if writable and pending:
                try:
                    pending = pending[sock.send(pending) :]
                except BlockingIOError:
                    pass
                deadline = time.monotonic() + self.timeout
            if time.monotonic() > deadline:
                unconfirmed = self.sent - self.confirmed
                raise TimeoutError(f"nothing moved for {self.timeout:g} s, with {unconfirmed} publishes unconfirmed")

    def _heard(self, value: Any) -> None:
        if isinstance(value, commands.Basic.Ack):
            self.confirmed = value.delivery_tag if value.multiple else self.confirmed + 1
        elif isinstance(value, commands.Basic.Nack):
            raise AssertionError(f"the broker nacked publish {value.delivery_tag}")
        else:
            self.told(value)


def process_memory(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of process ``pid`` in bytes, from ``/proc`` (``VmRSS``: resident now,
    ``VmHWM``: the most it has been resident).

    :raises LookupError: the process has no such figure (it has exited)
    """
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(f"no {field} for process {pid}")


class MemoryReadings(threading.Thread):
    """Reads process ``pid``'s resident memory every 20 ms until :attr:`stopped` is set: the
    highest reading of the run (:attr:`peak`), of the phase entered last (:attr:`phase_peak`,
    see :meth:`enter`), and in which phase and how far into it the highest came (``VmHWM``
    says how high, not when)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = self.phase_peak = 0
        self.phase, self.since = "start", time.monotonic()
        #: The highest reading: bytes, its phase, and seconds into that phase.
        self.highest = (0, self.phase, 0.0)
        self.stopped = threading.Event()

    def enter(self, phase: str) -> None:
        """The run enters ``phase``: :attr:`phase_peak` starts again."""
        self.phase, self.since, self.phase_peak = phase, time.monotonic(), 0

    def run(self) -> None:
        while not self.stopped.wait(0.02):
            try:
                resident = process_memory(self.pid)
            except (OSError, LookupError):
                return  # (the process has exited)
            self.phase_peak = max(self.phase_peak, resident)
            if resident > self.peak:
                self.peak = resident
                self.highest = (resident, self.phase, time.monotonic() - self.since)

    def __str__(self) -> str:
        resident, phase, seconds = self.highest
        return f"highest reading {resident / 2**20:.0f} MiB, {seconds:.1f} s into the {phase}"


class Client:
    """A scripted client: sends frames to a :class:`ServerConnection`, reads its replies.

    :param node: the node to connect to
    :param loopback: whether the client appears to come from a loopback address
    """

    def __init__(self, node: Node, loopback: bool = True) -> None:
        self.connection = ServerConnection(node, loopback=loopback, peer="test")
        self.pump = FramePump()

    def send(self, data: bytes) -> list[tuple[int, Any]]:
        """Send raw bytes; return the frames the server wrote in reply (and anything pending)."""
        self.connection.receive_data(data)
        return self.read()

    def read(self) -> list[tuple[int, Any]]:
        """Frames the server has queued since the last read."""
        return self.pump.feed(self.connection.data_to_send())

    def call(self, channel: int, *methods: Any) -> list[tuple[int, Any]]:
        """Send methods on ``channel``; return the reply frames."""
        return self.send(encode(channel, *methods))

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        heartbeat: int = 0,
        frame_max: int = 131072,
        capabilities: dict[str, Any] | None = None,
    ) -> list[tuple[int, Any]]:
        """Run the handshake up to ``connection.open-ok``; return every frame the server sent."""
        frames = self.send(PROTOCOL_HEADER)
        caps = {"consumer_cancel_notify": True, "authentication_failure_close": True}
        if capabilities is not None:
            caps = capabilities
        frames += self.call(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": caps},
                mechanism="PLAIN",
                response=f"\x00{user}\x00{password}",
            ),
        )
        if self.connection.closed:
            return frames
        frames += self.call(
            0,
            commands.Connection.TuneOk(channel_max=2047, frame_max=frame_max, heartbeat=heartbeat),
            commands.Connection.Open(virtual_host=vhost),
        )
        return frames

    def open_channel(self, channel: int = 1) -> None:
        """Open ``channel`` and check the server said ``channel.open-ok``."""
        reply = self.call(channel, commands.Channel.Open())
        assert [type(value) for _, value in reply] == [commands.Channel.OpenOk], reply


def methods(frames: Iterable[tuple[int, Any]]) -> list[Any]:
    """Just the decoded values of ``(channel, value)`` pairs."""
    return [value for _, value in frames]


def described(values: Iterable[Any]) -> list[tuple[str, dict[str, Any]]]:
    """Frames as ``(name, {argument: value})`` pairs, which compare by value (pamqp's do not)."""
    described = []
    for value in values:
        if isinstance(value, ContentHeader):
            described.append(("ContentHeader", {"body_size": value.body_size, **dict(value.properties)}))
        elif isinstance(value, ContentBody):
            described.append(("ContentBody", {"value": value.value}))
        else:
            described.append((value.name, dict(value)))
    return described


class _MemorySegment:
    """One segment in memory: what a reader sees (the page cache) and what survives power loss (the disk)."""

    __slots__ = ("cache", "disk", "dirty_from")

    def __init__(self, cache: bytes | bytearray = b"", disk: bytes | bytearray = b"") -> None:
        self.cache = bytearray(cache)
        self.disk = bytearray(disk)
        #: cache[dirty_from:] has not been written to disk; dirty_from <= len(cache) always.
        self.dirty_from = len(cache)

    def flush(self) -> None:
        """Write the dirty bytes to disk, as fsync does."""
        if len(self.disk) < self.dirty_from:
            # Pages dropped by an earlier failed fsync never reached the disk: a hole of zeros.
            self.disk += bytes(self.dirty_from - len(self.disk))
        del self.disk[self.dirty_from :]
        self.disk += self.cache[self.dirty_from :]
        self.dirty_from = len(self.cache)


@implementer(ISegmentStorage)
class MemorySegmentStorage:
    """An in-memory :class:`~broker.wal.files.ISegmentStorage` with fault injection and power loss.

    Each segment has a cache (what :meth:`read` returns) and a disk (what :meth:`crash` keeps).
    Bytes reach the disk on :meth:`sync`, and :meth:`create` and :meth:`truncate` are durable on
    return, as the interface promises. A failed sync behaves like Linux after a writeback
    error: the dirty bytes are marked clean without reaching the disk, so a later successful
    sync does not save them (they come back as zeros if later bytes are synced after them).

    :param archive: keep retired segments in :attr:`archived` instead of deleting them
    """

    #: Operations :meth:`fail_next` can fail: every method of the interface that does I/O.
    OPERATIONS = frozenset({"list_segments", "read", "create", "append", "sync", "size", "truncate", "retire"})

    def __init__(self, archive: bool = False) -> None:
        self.archive = archive
        #: Retired segments' durable bytes, by number (when ``archive`` is set).
        self.archived: dict[int, bytes] = {}
        self._segments: dict[int, _MemorySegment] = {}
        self._faults: dict[str, list[tuple[OSError, int]]] = {}
        self._holds: dict[str, threading.Event] = {}
        #: Every call as ``(operation, number)``, for tests that assert on what the log did.
        self.calls: list[tuple[str, int | None]] = []

    # -- fault injection and inspection -----------------------------------------------------

    def fail_next(self, operation: str, error: OSError, written: int = 0) -> None:
        """Make the next call of ``operation`` raise ``error`` (calls queue up in order).

        :param operation: a name in :attr:`OPERATIONS`
        :param written: for ``append``, how many bytes of the data to write before failing (a
            short write, as at ENOSPC)
        :raises ValueError: unknown operation
        """
        if operation not in self.OPERATIONS:
            raise ValueError(f"cannot fail {operation!r}; one of {sorted(self.OPERATIONS)}")
        self._faults.setdefault(operation, []).append((error, written))

    def hold(self, operation: str) -> threading.Event:
        """Make calls of ``operation`` wait (in the thread that makes them, as a stalled disk
        would) until the returned event is set."""
        if operation not in self.OPERATIONS:
            raise ValueError(f"cannot hold {operation!r}; one of {sorted(self.OPERATIONS)}")
        event = self._holds[operation] = threading.Event()
        return event  # once set, it lets every later call through at once

    def _call(self, operation: str, number: int | None) -> tuple[OSError, int] | None:
        self.calls.append((operation, number))
        held = self._holds.get(operation)
        if held is not None:
            held.wait(30)
        faults = self._faults.get(operation)
        return faults.pop(0) if faults else None

    def _segment(self, number: int) -> _MemorySegment:
        try:
            return self._segments[number]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), f"segment {number}") from None

    def synced_size(self, number: int) -> int:
        """How many bytes of segment ``number`` would survive a power loss now."""
        return len(self._segment(number).disk)

    def durable(self, number: int) -> bytes:
        """The bytes of segment ``number`` that would survive a power loss now."""
        return bytes(self._segment(number).disk)

    def crash(self) -> MemorySegmentStorage:
        """A new storage holding only what is on disk: the state after a power loss here."""
        survivor = MemorySegmentStorage(archive=self.archive)
        survivor.archived = dict(self.archived)
        for number, segment in self._segments.items():
            survivor._segments[number] = _MemorySegment(segment.disk, segment.disk)
        return survivor

    def corrupt(self, number: int, offset: int, data: bytes) -> None:
        """Overwrite bytes of segment ``number`` at ``offset``, in cache and on disk (bit rot, a bad sector)."""
        segment = self._segment(number)
        for view in (segment.cache, segment.disk):
            if offset < len(view):
                view[offset : offset + len(data)] = data[: len(view) - offset]

    def put(self, number: int, data: bytes) -> None:
        """Store segment ``number`` with exactly ``data``, durable (to set up a test)."""
        self._segments[number] = _MemorySegment(data, data)

    # -- ISegmentStorage ----------------------------------------------------------------------

    def list_segments(self) -> list[int]:
        """The numbers of the segments, ascending."""
        fault = self._call("list_segments", None)
        if fault:
            raise fault[0]
        return sorted(self._segments)

    def read(self, number: int) -> bytes:
        """The whole content of segment ``number`` (as the page cache has it)."""
        fault = self._call("read", number)
        segment = self._segment(number)
        if fault:
            raise fault[0]
        return bytes(segment.cache)

    def read_at(self, number: int, offset: int, length: int) -> bytes:
        """``length`` bytes of segment ``number`` from ``offset`` (as the page cache has it)."""
        return self.read(number)[offset : offset + length]

    def create(self, number: int, header: bytes) -> None:
        """Create segment ``number`` holding ``header``, durably."""
        fault = self._call("create", number)
        if fault:
            raise fault[0]
        if number in self._segments:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), f"segment {number}")
        self._segments[number] = _MemorySegment(header, header)

    def append(self, number: int, data: bytes | list[bytes]) -> None:
        """Append ``data`` (or its pieces); a fault writes its ``written`` bytes first."""
        if not isinstance(data, bytes):
            data = b"".join(data)
        fault = self._call("append", number)
        segment = self._segment(number)
        if fault:
            error, written = fault
            segment.cache += data[:written]
            raise error
        segment.cache += data  # bytes past dirty_from (always <= len(cache)) are dirty

    def sync(self, number: int) -> None:
        """Write the dirty bytes to disk; a fault drops them instead (marks them clean)."""
        fault = self._call("sync", number)
        segment = self._segment(number)
        if fault:
            segment.dirty_from = len(segment.cache)
            raise fault[0]
        segment.flush()

    def size(self, number: int) -> int:
        """The size of segment ``number`` in bytes."""
        fault = self._call("size", number)
        segment = self._segment(number)
        if fault:
            raise fault[0]
        return len(segment.cache)

    def truncate(self, number: int, size: int) -> None:
        """Cut segment ``number`` to ``size`` bytes, durably."""
        fault = self._call("truncate", number)
        segment = self._segment(number)
        if fault:
            raise fault[0]
        del segment.cache[size:]
        segment.dirty_from = min(segment.dirty_from, size)
        segment.flush()

    def retire(self, number: int) -> None:
        """Move segment ``number`` to :attr:`archived` (durable bytes only) or delete it."""
        fault = self._call("retire", number)
        segment = self._segment(number)
        if fault:
            raise fault[0]
        segment.flush()
        if self.archive:
            self.archived[number] = bytes(segment.disk)
        del self._segments[number]


# -- real brokers on loopback, for tests and benchmarks ---------------------------------------

RABBITMQ_LAUNCHER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBITMQCTL = RABBITMQ_LAUNCHER.with_name("rabbitmqctl")
#: The home directory (Erlang cookie, data) of each running :func:`rabbitmq_node`, by AMQP port.
RABBITMQ_HOMES: dict[int, Path] = {}


class RabbitMQMissing(RuntimeError):
    """The Debian ``rabbitmq-server`` package is not installed."""


class NpmUnavailable(RuntimeError):
    """Node.js or npm is not installed, or npm could not fetch a package: the reason."""


def npm(arguments: list[str], where: Path, timeout: float = 300) -> None:
    """Run ``npm`` with ``arguments`` in ``where`` (no audit, no funding notes, errors only).

    :raises NpmUnavailable: Node.js or npm is missing, or the command failed (its last output)
    """
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise NpmUnavailable("Node.js and npm are not installed: apt-get install -y nodejs npm")
    command = ["npm", "--no-audit", "--no-fund", "--loglevel=error", *arguments]
    try:
        subprocess.run(command, cwd=where, check=True, capture_output=True, timeout=timeout)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as failure:
        output = (getattr(failure, "stderr", b"") or b"").decode(errors="replace")
        raise NpmUnavailable(f"npm {' '.join(arguments[:2])} failed: {output[-500:]}") from None


#: Where :func:`free_port` looks: below Linux's ephemeral range (32768 and up), which the
#: kernel hands out as the source ports of outgoing connections and as port 0 (a port picked
#: there could be a client socket's before the test's server listens on it), and below the
#: cluster lab's ports (``broker.tools.cluster_lab.LAB_PORTS``).
PORTS = range(10000, 20000)
_next_port: list[int] = []


def port_free(port: int) -> bool:
    """Whether nothing is bound to ``port`` on 127.0.0.1 right now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now, and that no client socket
    will take. Each pytest-xdist worker (and the main process) looks in a block of
    :data:`PORTS` of its own, from a place of its own process's, so that two workers or two
    processes do not pick the same port between the pick and the listen."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    blocks = 8
    block = (int(worker[2:]) + 1) % blocks if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = len(PORTS) // blocks
    start = PORTS.start + block * size
    if not _next_port:
        _next_port.append(os.getpid() * 97 % size)
    for _ in range(size):
        port = start + _next_port[0] % size
        _next_port[0] += 1
        if port_free(port):
            return port
    raise OSError(f"no free port in {start}..{start + size - 1}")


def wait_for_port(port: int, seconds: float) -> None:
    """Block until something accepts connections on ``port``.

    :raises TimeoutError: nothing did within ``seconds``.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {seconds:g} s")


def rabbitmq_environment(home: Path, port: int, dist_port: int) -> dict[str, str]:
    """The environment of a private RabbitMQ node listening on ``port``, everything it keeps
    (its database, logs, pid file) under ``home``: started again with it, the node finds
    its queues and messages."""
    return dict(
        os.environ,
        HOME=str(home),
        RABBITMQ_NODENAME=f"postroom{port}@localhost",
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(dist_port),
        RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_MNESIA_BASE=str(home / "mnesia"),
        RABBITMQ_LOG_BASE=str(home / "log"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(home / "enabled_plugins"),
        RABBITMQ_PID_FILE=str(home / "pid"),
    )


@contextmanager
def rabbitmq_node(
    config: str = "", plugins: Iterable[str] = (), cookie: str | None = None
) -> Iterator[tuple[int, int]]:
    """Run a private RabbitMQ node on free loopback ports, for comparisons; yield ``(port, pid)``.

    Uses the Debian package's launcher directly, as the current user, with every directory
    in a temporary home.

    :param config: lines of ``rabbitmq.conf`` (e.g. a TLS listener's ``ssl_options``)
    :param plugins: plugins to enable (e.g. ``rabbitmq_auth_mechanism_ssl``)
    :param cookie: the Erlang cookie (nodes of one cluster share one; by default, a new one)
    :raises RabbitMQMissing: ``rabbitmq-server`` is not installed
    """
    if not RABBITMQ_LAUNCHER.exists():
        raise RabbitMQMissing("rabbitmq-server is not installed: apt-get install -y rabbitmq-server")
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="postroom-rabbitmq-"))
    (home / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    if cookie is not None:
        (home / ".erlang.cookie").write_text(cookie)
        (home / ".erlang.cookie").chmod(0o400)
    env = rabbitmq_environment(home, port, free_port())
    if config:
        # Only when there is something to say: with a configuration file, even an empty one,
        # RabbitMQ 3.10 lists its mechanisms in connection.start in another order.
        (home / "rabbitmq.conf").write_text(config)
        env["RABBITMQ_CONFIG_FILE"] = str(home / "rabbitmq.conf")
    process = _launch_rabbitmq(env)
    try:
        wait_for_port(port, 60)
        pid = int((home / "pid").read_text().strip()) if (home / "pid").exists() else process.pid
        RABBITMQ_HOMES[port] = home
        _RABBITMQ_PROCESSES[port] = (process, env)
        yield port, pid
    finally:
        RABBITMQ_HOMES.pop(port, None)
        process = _RABBITMQ_PROCESSES.pop(port, (process, env))[0]
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-f", f"postroom{port}@localhost"], check=False)
        shutil.rmtree(home, ignore_errors=True)


#: The launcher process and environment of each :func:`rabbitmq_node` running, by its port.
_RABBITMQ_PROCESSES: dict[int, tuple[subprocess.Popen[bytes], dict[str, str]]] = {}


def _launch_rabbitmq(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(RABBITMQ_LAUNCHER)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def kill_rabbitmq(port: int, restart_after: float = 0.0) -> None:
    """SIGKILL the :func:`rabbitmq_node` on ``port`` (its whole Erlang VM, nothing flushed),
    then, ``restart_after`` seconds later, start it again on its port from what it had
    written: back when this returns."""
    process, env = _RABBITMQ_PROCESSES[port]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(20)
    subprocess.run(["pkill", "-KILL", "-f", f"postroom{port}@localhost"], check=False)
    time.sleep(restart_after)
    process = _launch_rabbitmq(env)
    _RABBITMQ_PROCESSES[port] = (process, env)
    wait_for_port(port, 90)


@contextmanager
def rabbitmq_cluster(
    size: int = 2, plugins: Iterable[str] = ("rabbitmq_management",)
) -> Iterator[list[tuple[int, int]]]:
    """Run ``size`` private RabbitMQ nodes on loopback joined in one cluster (the first one's
    cluster, with ``join_cluster``), each with its management API; yield ``[(amqp port,
    management port), ...]``. The nodes share an Erlang cookie, each keeps its own home.

    :raises RabbitMQMissing: ``rabbitmq-server`` is not installed
    """
    cookie = secrets.token_hex(16)
    with ExitStack() as nodes:
        started = []
        for _ in range(size):
            http = free_port()
            config = f"management.tcp.port = {http}\nmanagement.tcp.ip = 127.0.0.1\n"
            port, _pid = nodes.enter_context(rabbitmq_node(config, plugins, cookie=cookie))
            started.append((port, http))
        first = f"postroom{started[0][0]}@localhost"
        for port, _http in started[1:]:
            rabbitmqctl(port, "stop_app")
            rabbitmqctl(port, "join_cluster", first)
            rabbitmqctl(port, "start_app")
            wait_for_port(port, 60)
        yield started


def rabbitmqctl(port: int, *arguments: str) -> str:
    """Run ``rabbitmqctl`` against the :func:`rabbitmq_node` on ``port``; its output.

    :raises subprocess.CalledProcessError: the command failed
    """
    home = RABBITMQ_HOMES[port]
    env = dict(os.environ, HOME=str(home), RABBITMQ_NODENAME=f"postroom{port}@localhost")
    result = subprocess.run(
        [str(RABBITMQCTL), "-n", f"postroom{port}@localhost", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def write_test_pki(directory: Path) -> dict[str, Path]:
    """Certificates for TLS tests, made with ``trustme`` (a test dependency), as PEM files in
    ``directory``: ``server-ca`` signed ``server`` (for ``localhost``, 127.0.0.1 and ::1);
    ``client-ca`` signed the clients ``app``, ``guest`` and ``stranger`` (each with its name as
    common name); ``rogue`` (common name ``app``) comes from a CA nobody trusts. ``cas`` holds
    both trusted CAs in one file. Keys are ``NAME.key``, certificates ``NAME.crt``.
    """
    import trustme

    server_ca = trustme.CA(organization_name="Postroom test server CA")
    client_ca = trustme.CA(organization_name="Postroom test client CA")
    rogue_ca = trustme.CA(organization_name="Someone else")
    files = {"server-ca": directory / "server-ca.pem", "client-ca": directory / "client-ca.pem"}
    server_ca.cert_pem.write_to_path(files["server-ca"])
    client_ca.cert_pem.write_to_path(files["client-ca"])
    files["cas"] = directory / "cas.pem"
    files["cas"].write_bytes(server_ca.cert_pem.bytes() + client_ca.cert_pem.bytes())
    issued = {"server": server_ca.issue_cert("localhost", "127.0.0.1", "::1")}
    for name in ("app", "guest", "stranger"):
        # A subject alternative name too: Erlang's TLS refuses a certificate whose (critical)
        # alternative name extension is empty.
        issued[name] = client_ca.issue_cert(f"{name}.clients.test", common_name=name)
    issued["rogue"] = rogue_ca.issue_cert("app.clients.test", common_name="app")
    for name, certificate in issued.items():
        files[f"{name}.crt"] = directory / f"{name}.crt"
        files[f"{name}.key"] = directory / f"{name}.key"
        certificate.cert_chain_pems[0].write_to_path(files[f"{name}.crt"])
        certificate.private_key_pem.write_to_path(files[f"{name}.key"])
    return files


#: Debian's Mosquitto broker (package ``mosquitto``), the second reference of the MQTT
#: conformance transcripts where RabbitMQ 3.10 departs from the specification.
MOSQUITTO = Path("/usr/sbin/mosquitto")


class MosquittoMissing(RuntimeError):
    """Debian's ``mosquitto`` is not installed here."""


@contextmanager
def mosquitto_broker(config: str = "") -> Iterator[int]:
    """Run a private Mosquitto on a free loopback port, anonymous clients allowed and nothing
    kept on disk; yield its port.

    :param config: more lines of ``mosquitto.conf``
    :raises MosquittoMissing: ``mosquitto`` is not installed
    """
    if not MOSQUITTO.exists():
        raise MosquittoMissing("mosquitto is not installed: apt-get install -y mosquitto")
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="postroom-mosquitto-"))
    (home / "mosquitto.conf").write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n{config}"
    )
    process = subprocess.Popen(
        [str(MOSQUITTO), "-c", str(home / "mosquitto.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, 20)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(home, ignore_errors=True)

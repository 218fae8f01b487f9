"""What the soak tools share: a real broker process, its vital signs, and confirmed publishing.

* :class:`BrokerProcess` runs ``python -m postroom.broker.tools.cli serve`` on free loopback ports with the
  management API on, its output in a log file, and reads its vital signs: open file
  descriptors (``/proc/<pid>/fd``), its TCP sockets with their peers' ports (``/proc/net/tcp``,
  so a leaked socket names the client that left it), ``/api/connections`` and ``/api/queues``.
* :class:`LogScanner` reads the log as it grows and turns every traceback into a
  :class:`LogEvent` with a signature (exception type and where it was raised), so that a
  thousand identical tracebacks read as one finding.
* :class:`SidePublisher` publishes persistent messages with confirms to a durable queue from
  a thread and remembers which were confirmed; :func:`drain` empties a queue and
  :func:`check_confirmed` compares the two: each confirmed message exactly once.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from postroom.broker.tools.testing import free_port, wait_for_port  # noqa: E402

#: Seconds the broker gets to start listening (it replays its write-ahead log first; a fresh
#: one is empty, so this is only for a loaded machine).
START_TIMEOUT = 30.0
#: Seconds a SIGTERM gets before SIGKILL (the broker syncs its log on the way out).
STOP_TIMEOUT = 15.0
#: Seconds one management API request may take (it runs on the broker's reactor thread).
API_TIMEOUT = 10.0
#: Seconds between two looks at a vital sign while waiting for it to settle.
POLL_INTERVAL = 0.05
#: What marks a log entry as a bug: a Python traceback, Twisted's unhandled-error report, or
#: the protocol shell's catch-all (``broker/server/protocol.py``) that answers 541.
TRACEBACK_MARKERS = ("Traceback", "Unhandled Error", "bug while handling frames")
#: A Twisted log entry starts with an ISO timestamp; continuation lines start with a tab.
_ENTRY = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_PEER = re.compile(r"127\.0\.0\.1:(\d+)")
_FRAME_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
#: Body of a side-published message: ``<queue-tag>-<publisher>-<number>``.
_SIDE_BODY = re.compile(rb"^side-(\d+)-(\d+)$")


def wait_until(predicate: Callable[[], bool], seconds: float) -> bool:
    """Poll ``predicate`` until it is true or ``seconds`` pass; return its last value."""
    deadline = time.monotonic() + seconds
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


# -- the broker process ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SocketInfo:
    """One TCP socket the broker holds: its ports and kernel state (``/proc/net/tcp`` codes)."""

    inode: int
    local_port: int
    remote_port: int
    state: str


#: ``/proc/net/tcp`` state codes that matter here.
TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "0A": "LISTEN"}


class BrokerProcess:
    """``postroom serve`` in a subprocess on free loopback ports, with the management API.

    :param workdir: where the config, the write-ahead log and ``broker.log`` go
    :param extra_config: more YAML lines for the config file (``limits:`` ...)
    :param root: the source tree to run the broker from (default: this one); another
        checkout (``git archive REV | tar -x -C DIR``) shows whether a finding is new
    """

    def __init__(self, workdir: Path, extra_config: str = "", root: Path | None = None) -> None:
        self.workdir = workdir
        self.root = root or ROOT
        self.port = free_port()
        self.management_port = free_port()
        self.log_path = workdir / "broker.log"
        self.config_path = workdir / "postroom.yaml"
        self.config_path.write_text(
            f'listen: {{amqp: "tcp:{self.port}:interface=127.0.0.1", metrics: false, '
            f'management: "tcp:{self.management_port}:interface=127.0.0.1"}}\n'
            f'storage: {{dir: "{workdir / "data"}", fsync: batch}}\n' + extra_config
        )
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(self.config_path)],
            cwd=self.root,
            stdout=self._log,
            stderr=self._log,
        )
        self.pid = self.process.pid
        try:
            wait_for_port(self.port, START_TIMEOUT)
            wait_for_port(self.management_port, START_TIMEOUT)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"the broker did not start: {self.log_tail()}") from None

    def alive(self) -> bool:
        """Whether the broker process is still running."""
        return self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`; return the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)
        self._log.close()
        return self.process.returncode

    def log_tail(self, size: int = 4000) -> str:
        """The last ``size`` characters of the broker's log."""
        text = self.log_path.read_text(errors="replace")
        return text[-size:]

    # -- vital signs --------------------------------------------------------------------------

    def fd_count(self) -> int:
        """How many file descriptors the broker has open, not counting management API requests.

        The management API's own connections come and go with every look at the broker (an
        HTTP request's socket may not be closed yet when the fds are counted), so sockets on
        its port, other than the listener, do not count.
        """
        total = len(os.listdir(f"/proc/{self.pid}/fd"))
        requests = sum(
            1 for info in self.sockets() if info.local_port == self.management_port and info.state != "LISTEN"
        )
        return total - requests

    def sockets(self) -> list[SocketInfo]:
        """The broker's TCP sockets, from its fds and ``/proc/net/tcp``."""
        inodes = set()
        for name in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{name}")
            except OSError:
                continue  # closed between listdir and readlink
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
        found = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                inode = int(fields[9])
                if inode in inodes:
                    local, remote = fields[1], fields[2]
                    found.append(
                        SocketInfo(
                            inode,
                            int(local.rsplit(":", 1)[1], 16),
                            int(remote.rsplit(":", 1)[1], 16),
                            TCP_STATES.get(fields[3], fields[3]),
                        )
                    )
        return found

    def client_sockets(self) -> list[SocketInfo]:
        """The broker's sockets accepted on the AMQP port (not listeners, not management)."""
        return [info for info in self.sockets() if info.local_port == self.port and info.state != "LISTEN"]

    def api(self, path: str) -> Any:
        """GET ``/api/<path>`` as guest and decode the JSON."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.management_port}/api/{path}")
        token = base64.b64encode(b"guest:guest").decode()
        request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=API_TIMEOUT) as response:
            return json.loads(response.read())

    def connection_names(self) -> list[str]:
        """The peers (``127.0.0.1:port``) of the connections ``/api/connections`` lists."""
        return [connection["name"] for connection in self.api("connections")]


class Workdir:
    """A scratch directory that is removed on success and kept (and named) on failure.

    :param path: use this directory instead of a fresh temporary one (never removed)
    """

    def __init__(self, prefix: str, path: str | None = None) -> None:
        self.keep = path is not None
        if path is not None:
            self.path = Path(path)
            self.path.mkdir(parents=True, exist_ok=True)
        else:
            self.path = Path(tempfile.mkdtemp(prefix=prefix))

    def finish(self, ok: bool) -> None:
        """Remove the directory if everything went well and it was ours."""
        if ok and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)


# -- the log ------------------------------------------------------------------------------------


@dataclass
class LogEvent:
    """One log entry that reports a bug.

    :ivar text: the whole entry, traceback included
    :ivar signature: exception type and the innermost broker frame (plus the innermost frame
        overall when that is elsewhere), without line numbers, which move as the code changes
    :ivar peer_port: the client's port if the entry names ``127.0.0.1:<port>``
    """

    text: str
    signature: str
    peer_port: int | None


#: Top-level packages of the broker's source tree: a frame in one of them is the broker's own.
PROJECT_PACKAGES = ("broker", "exchanges", "plugins", "config")


def _where(path: str, function: str) -> str:
    """``package/module.py:function`` for a traceback frame, wherever the tree lives."""
    if "site-packages/" in path:
        return f"{path.rsplit('site-packages/', 1)[1]}:{function}"
    for package in PROJECT_PACKAGES:
        marker = f"/{package}/"
        if marker in path:
            return f"{package}/{path.rsplit(marker, 1)[1]}:{function}"
    return f"{Path(path).name}:{function}"


def _is_project(path: str) -> bool:
    return "site-packages/" not in path and any(f"/{package}/" in path for package in PROJECT_PACKAGES)


def signature_of(text: str) -> str:
    """Group a traceback by exception type and where it was raised (see :class:`LogEvent`)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    frames = [match.groups() for line in lines if (match := _FRAME_LINE.search(line))]
    exception = ""
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Warning|Interrupt)\b", line):
            exception = line.split(":", 1)[0]
            break
    if not exception:
        exception = lines[0][:120] if lines else "?"
    exception = exception.removeprefix("builtins.")
    if not frames:
        return exception
    own = [item for item in frames if _is_project(item[0])]
    inner = _where(frames[-1][0], frames[-1][2])
    if own and own[-1] is not frames[-1]:
        return f"{exception} in {_where(own[-1][0], own[-1][2])} (raised in {inner})"
    return f"{exception} in {inner}"


class LogScanner:
    """Reads a growing log file from where it last stopped and returns the bug reports in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._pending = ""

    def scan(self) -> list[LogEvent]:
        """The bug-reporting entries written since the last call (whole entries only)."""
        with open(self.path, "rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        text = self._pending + data.decode("utf-8", "replace")
        # The last entry may still be growing (its traceback half written): keep it for later,
        # unless the file ends with a complete line and the next line would start a new entry.
        entries: list[str] = []
        current: list[str] = []
        for line in text.splitlines(keepends=True):
            if _ENTRY.match(line) and current:
                entries.append("".join(current))
                current = []
            current.append(line)
        self._pending = "".join(current)
        events = []
        for entry in entries:
            if any(marker in entry for marker in TRACEBACK_MARKERS):
                match = _PEER.search(entry.splitlines()[0])
                events.append(LogEvent(entry, signature_of(entry), int(match.group(1)) if match else None))
        return events

    def flush(self) -> list[LogEvent]:
        """Like :meth:`scan`, but also the last entry (call when the broker has stopped or is idle)."""
        events = self.scan()
        rest, self._pending = self._pending, ""
        if rest and any(marker in rest for marker in TRACEBACK_MARKERS):
            match = _PEER.search(rest.splitlines()[0])
            events.append(LogEvent(rest, signature_of(rest), int(match.group(1)) if match else None))
        return events


# -- findings -------------------------------------------------------------------------------------

#: How the kinds of failure are ordered in a report: the worst first.
KIND_ORDER = (
    "broker died",
    "lost confirm",
    "traceback",
    "leaked socket",
    "leaked connection",
    "leaked consumer",
    "leaked exclusive queue",
    "leaked fds",
    "541 reply",
    "heartbeat",
    "health",
    "management API",
    "side publisher",
    "client",
)
#: How much of a log entry or error text a finding keeps.
EXCERPT = 3000
#: How many subjects (cases, connections) a finding lists.
SUBJECTS = 100


@dataclass
class Finding:
    """One kind of failure and what showed it.

    :ivar kind: one of :data:`KIND_ORDER`
    :ivar signature: what makes two failures the same (a traceback's exception and place)
    :ivar subjects: the fuzz cases or soak connections that showed it (``None``: not traced)
    :ivar excerpt: the first occurrence's log entry or error text
    :ivar count: how many times it happened
    """

    kind: str
    signature: str
    subjects: list[int | None] = field(default_factory=list)
    excerpt: str = ""
    count: int = 0


class Findings:
    """Failures grouped by ``(kind, signature)``."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], Finding] = {}

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, kind: str, signature: str, subject: int | None, excerpt: str = "") -> None:
        """Record one failure under its group."""
        finding = self.groups.setdefault((kind, signature), Finding(kind, signature, excerpt=excerpt[:EXCERPT]))
        finding.count += 1
        if subject not in finding.subjects and len(finding.subjects) < SUBJECTS:
            finding.subjects.append(subject)

    def count(self, kind: str) -> int:
        """How many failures of ``kind`` were recorded."""
        return sum(finding.count for finding in self.groups.values() if finding.kind == kind)

    def ordered(self) -> list[Finding]:
        """The groups, worst kind first, most frequent first within a kind."""

        def key(finding: Finding) -> tuple[int, int]:
            rank = KIND_ORDER.index(finding.kind) if finding.kind in KIND_ORDER else len(KIND_ORDER)
            return rank, -finding.count

        return sorted(self.groups.values(), key=key)


def render_findings(
    findings: Findings, noun: str, describe: Callable[[int], str | None], reproduce: Callable[[Finding, int], str]
) -> list[str]:
    """Report lines for every finding: what, how often, which ``noun``s, how to reproduce, excerpt."""
    lines = []
    for finding in findings.ordered():
        traced = [subject for subject in finding.subjects if subject is not None]
        lines.append(f"\n[{finding.kind}] {finding.signature}: {finding.count} time(s)")
        if traced:
            shown = ", ".join(str(subject) for subject in traced[:20])
            lines.append(f"  {noun}s: {shown}{' ...' if len(traced) > 20 else ''}")
            for subject in traced[:5]:
                description = describe(subject)
                if description:
                    lines.append(f"    {description}")
            lines.append(f"  reproduce: {reproduce(finding, traced[0])}")
        if finding.excerpt:
            lines.append("  " + finding.excerpt.rstrip().replace("\n", "\n  "))
    return lines


# -- confirmed publishing ---------------------------------------------------------------------------


def connect(port: int, timeout: float = 10.0) -> pika.BlockingConnection:
    """A pika connection as guest to 127.0.0.1:``port``, heartbeats off."""
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", port, heartbeat=0, socket_timeout=timeout, blocked_connection_timeout=timeout
        )
    )


class SidePublisher(threading.Thread):
    """Publishes persistent messages with confirms to a durable queue until stopped.

    Bodies are ``side-<number>-<sequence>``. A message is *confirmed* once pika's
    ``basic_publish`` returned in confirm mode; one that was being published when the
    connection failed is *in doubt* (it may or may not be in the queue). A failed connection
    is an error (the broker must not drop a well-behaved client); the publisher reconnects.

    :param rate: messages per second at most (the point is steady traffic, not load)
    """

    def __init__(self, port: int, queue: str, number: int, rate: float, stop: threading.Event) -> None:
        super().__init__(name=f"side-publisher-{number}", daemon=True)
        self.port = port
        self.queue = queue
        self.number = number
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.stop_event = stop
        self.confirmed: list[int] = []
        self.in_doubt: list[int] = []
        self.errors: list[str] = []
        self.ready = threading.Event()
        self._sequence = 0

    def run(self) -> None:
        """Publish until the stop event is set."""
        while not self.stop_event.is_set():
            connection = None
            try:
                connection = connect(self.port)
                channel = connection.channel()
                channel.queue_declare(self.queue, durable=True)
                channel.confirm_delivery()
                self.ready.set()
                while not self.stop_event.is_set():
                    sequence = self._sequence
                    self._sequence += 1
                    self.in_doubt.append(sequence)
                    channel.basic_publish(
                        "", self.queue, b"side-%d-%d" % (self.number, sequence), pika.BasicProperties(delivery_mode=2)
                    )
                    self.in_doubt.pop()
                    self.confirmed.append(sequence)
                    if self.interval:
                        self.stop_event.wait(self.interval)
                connection.close()
                return
            except Exception as error:  # noqa: BLE001 - any failure is a finding, reported below
                self.errors.append(f"side publisher {self.number}: {type(error).__name__}: {error}")
                self.ready.set()
                if connection is not None and connection.is_open:
                    try:
                        connection.close()
                    except Exception:  # noqa: BLE001 - already broken
                        pass
                self.stop_event.wait(0.5)


#: Rounds :func:`drain` makes at most (each consumes what the queue said it held).
DRAIN_ROUNDS = 10


def drain(port: int, queue: str, idle: float = 2.0) -> list[bytes]:
    """Consume and ack every ready message of ``queue``; return the bodies in order.

    Each round consumes as many messages as ``queue.declare`` (passive) says are ready, or
    until nothing came for ``idle`` seconds; rounds go on until the queue says it is empty.
    """
    connection = connect(port)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        bodies: list[bytes] = []
        for _round in range(DRAIN_ROUNDS):
            expected = channel.queue_declare(queue, passive=True).method.message_count
            if not expected:
                break
            got = 0
            last_tag = 0
            for method, _properties, body in channel.consume(queue, inactivity_timeout=idle):
                if method is None:
                    break
                bodies.append(body)
                got += 1
                last_tag = method.delivery_tag
                if got % 500 == 0:
                    channel.basic_ack(last_tag, multiple=True)
                if got >= expected:
                    break
            if last_tag:
                channel.basic_ack(last_tag, multiple=True)
            channel.cancel()
        return bodies
    finally:
        connection.close()


def drain_or_note(port: int, queue: str, findings: Findings) -> list[bytes]:
    """:func:`drain`, noting a failure to drain as a finding (and returning what it got: nothing)."""
    try:
        return drain(port, queue)
    except Exception as error:  # noqa: BLE001 - the broker failed a well-behaved client
        findings.add("health", f"cannot drain {queue}: {type(error).__name__}: {error}"[:200], None)
        return []


@dataclass
class ConfirmCheck:
    """Confirmed messages against what a queue held.

    :ivar confirmed: how many messages the broker confirmed
    :ivar present: how many of those were in the queue (counted once each)
    :ivar missing: confirmed but absent (``(publisher, sequence)``, a sample)
    :ivar duplicated: present more than once (a sample)
    :ivar unexpected: bodies nobody published (a sample)
    """

    confirmed: int = 0
    present: int = 0
    missing: list[tuple[int, int]] = field(default_factory=list)
    missing_count: int = 0
    duplicated: list[tuple[int, int]] = field(default_factory=list)
    duplicated_count: int = 0
    unexpected: list[bytes] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Each confirmed message exactly once, and nothing foreign."""
        return not (self.missing_count or self.duplicated_count or self.unexpected)


#: How many examples of each kind of mismatch a :class:`ConfirmCheck` keeps.
SAMPLE = 10


def check_confirmed(publishers: Iterable[SidePublisher], bodies: list[bytes]) -> ConfirmCheck:
    """Compare what the publishers got confirmed with the bodies drained from their queue."""
    counts: Counter[tuple[int, int]] = Counter()
    result = ConfirmCheck()
    for body in bodies:
        match = _SIDE_BODY.match(body)
        if match is None:
            if len(result.unexpected) < SAMPLE:
                result.unexpected.append(body[:80])
            continue
        counts[(int(match.group(1)), int(match.group(2)))] += 1
    published: set[tuple[int, int]] = set()
    for publisher in publishers:
        published.update((publisher.number, sequence) for sequence in publisher.in_doubt)
        for sequence in publisher.confirmed:
            key = (publisher.number, sequence)
            published.add(key)
            result.confirmed += 1
            seen = counts.get(key, 0)
            if seen:
                result.present += 1
            else:
                result.missing_count += 1
                if len(result.missing) < SAMPLE:
                    result.missing.append(key)
    for key, seen in counts.items():
        if key not in published and len(result.unexpected) < SAMPLE:
            result.unexpected.append(b"side-%d-%d" % key)
        if seen > 1:
            result.duplicated_count += 1
            if len(result.duplicated) < SAMPLE:
                result.duplicated.append(key)
    return result

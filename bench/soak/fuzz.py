"""Fuzz a real Postroom process with mutated recordings of real client sessions.

    python bench/soak/fuzz.py --cases 100000 --seed 1 [--check-every 250] [--jobs N]
    python bench/soak/fuzz.py --seed 1 --first 1234 --cases 1 --check-every 1   # replay one case
    python bench/soak/fuzz.py --seed 1 --show 1234                              # print it, run nothing
    python bench/soak/fuzz.py --record                                          # re-record the corpus

Starts ``python -m postroom.broker.tools.cli serve`` (management API on, output to ``broker.log`` in a
scratch directory), then sends case after case: a recorded session (``corpus/``) mutated
by :mod:`mutations`, written in one or several writes, answers read until EOF or a short
idle time, the socket closed by FIN, RST, half-close or without reading. Meanwhile a side
publisher publishes persistent messages with confirms to a durable queue.

Every ``--check-every`` cases: a fresh pika connection declares, publishes with a confirm and
gets a message back; the queues the cases declared are deleted; the broker's file
descriptors and ``/api/connections`` must return to their baseline within ``--drain``
seconds (a socket left over is traced to its case through its peer port); the log must
hold no traceback. At the end, every confirmed message must be in the durable queue exactly
once. Any failure exits 1 and prints how to replay the case, grouped by signature, with an
excerpt of the log.

Importable: :func:`run` returns a :class:`Summary` (``tests/integration/test_soak.py``).
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import pika.exceptions  # noqa: E402
from harness import (  # noqa: E402
    BrokerProcess,
    Findings,
    LogEvent,
    LogScanner,
    SidePublisher,
    Workdir,
    check_confirmed,
    connect,
    drain_or_note,
    render_findings,
    wait_until,
)
from mutations import Case, make_case  # noqa: E402
from wire import ReplyReader  # noqa: E402

#: RabbitMQ's (and so Postroom's) answer to a publish whose content header does not parse: a
#: bare 541, deliberate. A 541 with any other text is the broker's catch-all for a bug.
CONTENT_REFUSED = "INTERNAL_ERROR"

#: The durable queue the side publisher fills; the fuzz cases never name it.
CONFIRMED_QUEUE = "fuzz.confirmed"
#: The queue of the periodic health check.
HEALTH_QUEUE = "fuzz.health"
#: Queues the checks must not delete.
PROTECTED = frozenset({CONFIRMED_QUEUE, HEALTH_QUEUE})
#: Seconds a case waits for more answers after the last one (the broker answers a loopback
#: client in well under a millisecond; a case that says nothing more just costs this).
READ_IDLE = 0.05
#: Seconds a case reads at most (a case that makes the broker stream deliveries ends anyway).
READ_LIMIT = 1.0
#: Seconds one socket operation of a case may block (a broker that stops reading is a finding).
CASE_TIMEOUT = 10.0
#: Seconds the broker gets to close every case's connection before a leak is declared. Every
#: case closes its own socket, so the broker only has to notice EOF or RST; but after a failed
#: handshake it holds the socket 3 s first, unread (RabbitMQ's SILENT_CLOSE_DELAY), and after
#: sending connection.close it waits up to 3 s for close-ok. Ten seconds covers both.
DRAIN_SECONDS = 10.0
#: Messages per second from the side publisher: steady confirmed traffic, not load.
SIDE_RATE = 100.0


@dataclass
class Summary:
    """What a fuzz run found."""

    seed: int
    first: int
    cases: int = 0
    elapsed: float = 0.0
    tracebacks: int = 0
    replies_541: int = 0
    leaked_fds: int = 0
    leaked_connections: int = 0
    confirmed: int = 0
    present: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    health_failures: int = 0
    findings: Findings = field(default_factory=Findings)
    #: Descriptions of the cases named in findings.
    descriptions: dict[int, str] = field(default_factory=dict)
    workdir: str = ""
    #: ``--broker-root`` of the run, if any (the reproduce lines repeat it).
    broker_root: str | None = None

    @property
    def ok(self) -> bool:
        """Nothing at all went wrong."""
        return not self.findings

    @property
    def rate(self) -> float:
        """Cases per second over the whole run (start-up and checks included)."""
        return self.cases / self.elapsed if self.elapsed else 0.0

    def render(self) -> str:
        """The human summary: totals, then each finding with how to reproduce it."""
        lines = [
            f"fuzz seed {self.seed}, cases {self.first}..{self.first + self.cases - 1}: {self.cases} cases "
            f"in {self.elapsed:.1f} s ({self.rate:.1f} cases/s)",
            f"  tracebacks {self.tracebacks}, 541 replies {self.replies_541}, leaked fds {self.leaked_fds}, "
            f"leaked connections {self.leaked_connections}, health failures {self.health_failures}",
            f"  confirmed {self.confirmed}, present {self.present}, missing {self.missing}, "
            f"duplicated {self.duplicated}, unexpected {self.unexpected}",
        ]
        if self.ok:
            lines.append("  OK")
            return "\n".join(lines)
        lines.append(f"  FAILED: {len(self.findings)} kind(s) of failure (broker log and data in {self.workdir})")
        lines += render_findings(
            self.findings,
            "case",
            self.descriptions.get,
            lambda _finding, case: (
                f"python bench/soak/fuzz.py --seed {self.seed} --first {case} --cases 1 --check-every 1"
                + (f" --broker-root {self.broker_root}" if self.broker_root else "")
            ),
        )
        return "\n".join(lines)


@dataclass
class Outcome:
    """What one case saw from the client side."""

    number: int
    local_port: int | None
    reader: ReplyReader
    error: str | None = None


def run_case(port: int, case: Case, read_idle: float = READ_IDLE, read_limit: float = READ_LIMIT) -> Outcome:
    """Send one case to ``127.0.0.1:port`` and end the socket its way."""
    reader = ReplyReader()
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CASE_TIMEOUT)
    except OSError as error:
        return Outcome(case.number, None, reader, f"connect: {error}")
    outcome = Outcome(case.number, sock.getsockname()[1], reader)
    try:
        try:
            for chunk in case.chunks:
                sock.sendall(chunk)
            if case.ending == "half":
                sock.shutdown(socket.SHUT_WR)
        except TimeoutError:
            outcome.error = "the broker stopped reading (send timed out)"
        except OSError:
            pass  # the broker closed first: an answer like any other
        if case.ending != "abort":
            sock.settimeout(read_idle)
            deadline = time.monotonic() + read_limit
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(65536)
                except (TimeoutError, OSError):
                    break
                if not data:
                    break
                reader.feed(data)
                if reader.finished:
                    break
        if case.ending == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()
    return outcome


class Fuzzer:
    """One fuzz run against one broker process (see the module docstring)."""

    def __init__(
        self,
        broker: BrokerProcess,
        sessions: list[corpus.Session],
        summary: Summary,
        jobs: int,
        drain_seconds: float,
        read_idle: float,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.broker = broker
        self.sessions = sessions
        self.summary = summary
        self.jobs = jobs
        self.drain_seconds = drain_seconds
        self.read_idle = read_idle
        self.progress = progress
        self.scanner = LogScanner(broker.log_path)
        #: Client port -> case number, for the cases since the last check and those before it
        #: (a log entry can be read a check late; ports get reused after that).
        self.ports: dict[int, int] = {}
        self.previous_ports: dict[int, int] = {}
        #: Client ports of sockets and connections already reported as leaked.
        self.reported_sockets: set[int] = set()
        self.reported_connections: set[str] = set()
        self.baseline_fds = 0
        self.baseline_connections: set[str] = set()
        #: Fds above the baseline already reported, and the cases run since the last check.
        self.reported_fds = 0
        self.window = range(0)

    def case(self, number: int) -> Case:
        """Case ``number`` of this run's seed."""
        return make_case(self.sessions, self.summary.seed, number)

    def note(self, kind: str, signature: str, case: int | None, excerpt: str = "") -> None:
        """Record a failure, keeping the case's description for the report."""
        if case is not None and case not in self.summary.descriptions and len(self.summary.descriptions) < 2000:
            self.summary.descriptions[case] = self.case(case).describe()
        self.summary.findings.add(kind, signature, case, excerpt)

    # -- running cases ------------------------------------------------------------------------

    def run_window(self, numbers: range) -> None:
        """Run the cases in ``numbers`` on ``jobs`` threads and note what the clients saw."""
        port = self.broker.port
        self.window = numbers

        def one(number: int) -> Outcome:
            return run_case(port, self.case(number), self.read_idle)

        if self.jobs > 1:
            with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="fuzz-case") as pool:
                outcomes = list(pool.map(one, numbers))
        else:
            outcomes = [one(number) for number in numbers]
        for outcome in outcomes:
            self.summary.cases += 1
            if outcome.local_port is not None:
                self.ports[outcome.local_port] = outcome.number
            if outcome.error is not None:
                self.note("client", outcome.error.split(":")[0], outcome.number, outcome.error)
            for _channel, code, text in outcome.reader.closes:
                if code == 541 and text != CONTENT_REFUSED:
                    self.summary.replies_541 += 1
                    self.note("541 reply", text, outcome.number)

    # -- checks -------------------------------------------------------------------------------

    def health(self) -> None:
        """A fresh client declares, publishes with a confirm, gets it back; leftover queues go."""
        body = b"health %d" % self.summary.cases
        try:
            connection = connect(self.broker.port)
            try:
                channel = connection.channel()
                channel.queue_declare(HEALTH_QUEUE)
                channel.confirm_delivery()
                channel.basic_publish("", HEALTH_QUEUE, body)
                _method, _properties, got = channel.basic_get(HEALTH_QUEUE, auto_ack=True)
                if got != body:
                    raise AssertionError(f"basic.get returned {got!r}, not {body!r}")
                self._delete_case_queues(connection)
            finally:
                if connection.is_open:
                    connection.close()
        except Exception as error:  # noqa: BLE001 - every failure is a finding
            self.summary.health_failures += 1
            self.note("health", f"{type(error).__name__}: {error}"[:200], None)

    def _delete_case_queues(self, connection: pika.BlockingConnection) -> None:
        """Delete every queue the cases declared, so their arguments and messages do not pile up."""
        names = [queue["name"] for queue in self.broker.api("queues") if queue["name"] not in PROTECTED]
        channel = connection.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except pika.exceptions.ChannelClosedByBroker:
                channel = connection.channel()  # exclusive to a leftover connection: reported below

    def settle(self) -> tuple[int, set[str]]:
        """Wait for fds and connections to return to the baseline; return what is still above it."""
        state: dict[str, object] = {}

        def settled() -> bool:
            fds = self.broker.fd_count()
            try:
                names = set(self.broker.connection_names())
            except Exception as error:  # noqa: BLE001 - a broken management API is a finding
                self.note("management API", f"/api/connections: {type(error).__name__}: {error}"[:200], None)
                names = set(self.baseline_connections)
            state["fds"], state["names"] = fds, names
            # By count: a side publisher that had to reconnect has a new name (and is reported).
            return fds <= self.baseline_fds and len(names) <= len(self.baseline_connections)

        wait_until(settled, self.drain_seconds)
        names: set[str] = state["names"]  # type: ignore[assignment]
        extra_names = names - self.baseline_connections if len(names) > len(self.baseline_connections) else set()
        return max(0, int(state["fds"]) - self.baseline_fds), extra_names  # type: ignore[call-overload]

    def check(self) -> bool:
        """The periodic check; ``False`` if the broker is gone (the run stops)."""
        if not self.broker.alive():
            self.note("broker died", f"exit status {self.broker.process.returncode}", None, self.broker.log_tail())
            return False
        self.health()
        extra_fds, extra_names = self.settle()
        self.summary.leaked_fds = extra_fds
        self.summary.leaked_connections = len(extra_names)
        for socket_info in self.broker.client_sockets():
            port = socket_info.remote_port
            case = self.case_at(port)
            if port in self.reported_sockets or case is None:
                continue
            self.reported_sockets.add(port)
            self.note(
                "leaked socket",
                f"{socket_info.state} socket left open after ending '{self.case(case).ending}'",
                case,
            )
        for name in extra_names - self.reported_connections:
            self.reported_connections.add(name)
            port = name.rsplit(":", 1)[-1]
            case = self.case_at(int(port)) if port.isdigit() else None
            self.note("leaked connection", "connection still listed by /api/connections", case)
        if extra_fds > self.reported_fds and not self.broker.client_sockets():
            self.note(
                "leaked fds",
                "fds above the baseline that are not client sockets",
                None,
                f"{extra_fds} fd(s) above the baseline after cases {self.window.start}..{self.window.stop - 1}; "
                f"narrow down with --first {self.window.start} --cases {len(self.window)} --check-every 1",
            )
        self.reported_fds = max(self.reported_fds, extra_fds)
        self.scan_log()
        self.previous_ports, self.ports = self.ports, {}
        return True

    def case_at(self, port: int | None) -> int | None:
        """The case that used client port ``port`` in this window or the one before, if any."""
        if port is None:
            return None
        found = self.ports.get(port)
        return found if found is not None else self.previous_ports.get(port)

    def scan_log(self, final: bool = False) -> None:
        """Note every traceback logged since the last scan, traced to its case by peer port."""
        events: list[LogEvent] = self.scanner.flush() if final else self.scanner.scan()
        for event in events:
            self.summary.tracebacks += 1
            self.note("traceback", event.signature, self.case_at(event.peer_port), event.text)

    def baseline(self) -> None:
        """Take the fd and connection baselines once the side publisher is connected."""
        self.health()

        def stable() -> bool:
            before = self.broker.fd_count()
            time.sleep(0.2)
            return self.broker.fd_count() == before

        wait_until(stable, self.drain_seconds)
        self.baseline_fds = self.broker.fd_count()
        self.baseline_connections = set(self.broker.connection_names())


def run(
    cases: int,
    seed: int,
    first: int = 0,
    check_every: int = 250,
    jobs: int = 4,
    workdir: str | None = None,
    broker_root: str | None = None,
    side_rate: float = SIDE_RATE,
    drain_seconds: float = DRAIN_SECONDS,
    read_idle: float = READ_IDLE,
    progress: Callable[[str], None] | None = None,
) -> Summary:
    """Run cases ``first .. first + cases - 1`` of ``seed`` against a fresh broker; summarise.

    :param check_every: cases between two checks (1 pins a leak or traceback to its case)
    :param jobs: cases in flight at once (threads)
    :param workdir: keep the broker's files here (default: a temporary directory, removed
        when the run is clean)
    :param broker_root: run the broker from this source tree (default: this checkout)
    :param progress: called with a line after every check
    """
    sessions = corpus.load()
    summary = Summary(seed, first, broker_root=broker_root)
    scratch = Workdir("postroom-fuzz-", workdir)
    summary.workdir = str(scratch.path)
    started = time.monotonic()
    broker = BrokerProcess(scratch.path, root=Path(broker_root) if broker_root else None)
    stop = threading.Event()
    publisher = SidePublisher(broker.port, CONFIRMED_QUEUE, 0, side_rate, stop)
    try:
        publisher.start()
        publisher.ready.wait(30)
        fuzzer = Fuzzer(broker, sessions, summary, jobs, drain_seconds, read_idle, progress)
        fuzzer.baseline()
        for start in range(first, first + cases, check_every):
            window_started = time.monotonic()
            fuzzer.run_window(range(start, min(start + check_every, first + cases)))
            check_started = time.monotonic()
            alive = fuzzer.check()
            summary.elapsed = time.monotonic() - started
            if progress is not None:
                progress(
                    f"[{summary.cases}/{cases}] {summary.rate:.1f} cases/s "
                    f"(cases {check_started - window_started:.1f} s, "
                    f"check {time.monotonic() - check_started:.1f} s), tracebacks {summary.tracebacks}, "
                    f"541s {summary.replies_541}, leaked fds {summary.leaked_fds}, confirmed {len(publisher.confirmed)}"
                )
            if not alive:
                break
        stop.set()
        publisher.join(30)
        for error in publisher.errors:
            fuzzer.note("side publisher", error.split(":")[0], None, error)
        if broker.alive():
            result = check_confirmed([publisher], drain_or_note(broker.port, CONFIRMED_QUEUE, summary.findings))
            summary.confirmed, summary.present = result.confirmed, result.present
            summary.missing, summary.duplicated = result.missing_count, result.duplicated_count
            summary.unexpected = len(result.unexpected)
            if not result.ok:
                fuzzer.note(
                    "lost confirm",
                    "confirmed messages not in the queue exactly once",
                    None,
                    f"missing {result.missing} duplicated {result.duplicated} unexpected {result.unexpected}",
                )
            fuzzer.check()
        fuzzer.scan_log(final=True)
    finally:
        stop.set()
        broker.stop()
        summary.elapsed = time.monotonic() - started
        scratch.finish(summary.ok)
    return summary


def main(argv: list[str] | None = None) -> int:
    """The command line; exits 1 on any failure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=2000, help="how many cases (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="the seed (default 1)")
    parser.add_argument("--first", type=int, default=0, help="number of the first case (default 0)")
    parser.add_argument("--check-every", type=int, default=250, help="cases between checks (default 250)")
    parser.add_argument("--jobs", type=int, default=4, help="cases in flight at once (default 4)")
    parser.add_argument("--workdir", help="keep the broker's config, log and data here")
    parser.add_argument("--broker-root", help="run the broker from this source tree (default: this checkout)")
    parser.add_argument("--side-rate", type=float, default=SIDE_RATE, help="side publisher msg/s (default 100)")
    parser.add_argument("--drain", type=float, default=DRAIN_SECONDS, help="seconds for fds to settle (default 10)")
    parser.add_argument("--read-idle", type=float, default=READ_IDLE, help="idle seconds ending a case's read")
    parser.add_argument("--show", type=int, metavar="CASE", help="print case CASE (hex and mutations) and exit")
    parser.add_argument("--record", action="store_true", help="re-record the corpus against a fresh broker")
    args = parser.parse_args(argv)
    if args.record:
        scratch = Workdir("postroom-record-", args.workdir)
        broker = BrokerProcess(scratch.path)
        try:
            for path in corpus.record(broker.port):
                print(f"{path.relative_to(HERE)}: {path.stat().st_size} bytes")
        finally:
            broker.stop()
            scratch.finish(True)
        return 0
    if args.show is not None:
        case = make_case(corpus.load(), args.seed, args.show)
        print(case.describe())
        for number, chunk in enumerate(case.chunks):
            print(f"write {number}: {chunk.hex()}")
        return 0
    summary = run(
        args.cases,
        args.seed,
        first=args.first,
        check_every=args.check_every,
        jobs=args.jobs,
        workdir=args.workdir,
        broker_root=args.broker_root,
        side_rate=args.side_rate,
        drain_seconds=args.drain,
        read_idle=args.read_idle,
        progress=lambda line: print(line, flush=True),
    )
    print(summary.render())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())

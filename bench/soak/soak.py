"""Open thousands of connections against a real Postroom, end each one a different way, check nothing is left.

    python bench/soak/soak.py --connections 2000 [--jobs 4] [--heartbeat-share 0.05]
    python bench/soak/soak.py --connections 50 --endings unread          # one ending only

Starts ``python -m postroom.broker.tools.cli serve`` (management API on, output to ``broker.log`` in a
scratch directory), fills two durable queues with persistent messages (``soak.big``: 100 KB
bodies, ``soak.small``: small ones) with confirms, then opens connections on ``--jobs``
threads, each ending in turn (see :data:`ENDINGS`):

* ``unread``: consumes ``soak.big`` with no prefetch limit and reads nothing, so megabytes
  back up in the broker; then sends ``connection.close``, reads up to ``close-ok`` and closes
  (a clean close that found the broker's output queue full);
* ``unread-reset``: the same, but closes right after sending ``connection.close`` (with bytes
  unread, the kernel sends a RST);
* ``rst-mid-frame`` / ``fin-mid-frame``: with an exclusive queue and a consumer, writes half
  of a publish and resets the socket (RST, ``SO_LINGER`` 0) or closes it (FIN);
* ``get-large``: ``basic.get`` of a 100 KB message, reads a few bytes of it, closes;
* ``channel-unacked``: consumes ``soak.small`` with prefetch 10, reads 5 deliveries, closes
  the channel with all of them unacked, then closes the connection properly;
* ``heartbeat``: negotiates heartbeat=1, declares an exclusive queue and a consumer, and goes
  silent; the broker must drop it within two intervals (a few seconds). These run on a pool
  of their own, many at once, and are a fraction of the connections (``--heartbeat-share``).

Meanwhile side publishers publish persistent messages with confirms to ``soak.confirmed``.
Afterwards the broker's fds, ``/api/connections``, its consumers and its exclusive queues
must be back at their baseline (a leftover is traced to its connection by peer port), the
log must hold no traceback, and every confirmed message (side published or pre-filled) must
be ready exactly once. Any failure exits 1.

Importable: :func:`run` returns a :class:`SoakSummary` (``tests/integration/test_soak.py``).
"""

from __future__ import annotations

import argparse
import fcntl
import struct
import sys
import termios
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import pika  # noqa: E402
from harness import (  # noqa: E402
    BrokerProcess,
    ConfirmCheck,
    Findings,
    LogScanner,
    SidePublisher,
    Workdir,
    check_confirmed,
    connect,
    drain_or_note,
    render_findings,
    wait_until,
)
from pamqp import commands  # noqa: E402
from wire import ProtocolFailure, RawClient  # noqa: E402

#: Queues the tool fills before the connections start, and the side publishers' queue.
BIG_QUEUE = "soak.big"
SMALL_QUEUE = "soak.small"
CONFIRMED_QUEUE = "soak.confirmed"
#: Size of a ``soak.big`` body: large enough that a few of them overflow every socket buffer
#: on the way (Twisted's 64 KiB write threshold, the kernel's autotuned buffers).
BIG_BODY = 100 * 1024
#: Messages in ``soak.big``: 80 x 100 KB = 8 MB, more than the kernel's largest autotuned send
#: buffer (``tcp_wmem`` max, 4 MiB here), so an unread consumer leaves megabytes in the broker.
BIG_MESSAGES = 80
#: Messages in ``soak.small``: enough for every concurrent ``channel-unacked`` connection's prefetch.
SMALL_MESSAGES = 200
#: Prefetch of a ``channel-unacked`` connection, and how many of its deliveries it reads.
UNACKED_PREFETCH = 10
UNACKED_READ = 5
#: ``SO_RCVBUF`` of an ``unread`` client: small, so the broker's output backs up at once.
UNREAD_RECEIVE_BUFFER = 4096
#: Seconds an ``unread`` client waits for the broker to stop pushing before it closes.
UNREAD_SETTLE = 2.0
#: Bytes of the ``basic.get-ok`` a ``get-large`` client reads before it closes.
GET_READ = 1000
#: Bytes of the publish a mid-frame ending sends: the method, the header and half a body frame.
MID_FRAME_BODY = 10000
#: The heartbeat a ``heartbeat`` client negotiates, and how long it waits to be dropped: the
#: broker drops a peer after two silent intervals (RabbitMQ too), plus scheduling slack.
HEARTBEAT = 1
HEARTBEAT_DEADLINE = 8.0
#: A ``heartbeat`` connection every 1/share connections: each takes seconds of wall time.
HEARTBEAT_SHARE = 0.05
#: ``heartbeat`` connections in flight at once: they only wait, so many can.
HEARTBEAT_JOBS = 50
#: Seconds everything gets to return to its baseline after the last connection ended; the
#: broker waits up to 3 s (its CLOSE_TIMEOUT) for a peer that was sent connection.close.
DRAIN_SECONDS = 15.0
#: Side publishers and their rate (messages per second each): steady confirmed traffic.
SIDE_PUBLISHERS = 2
SIDE_RATE = 50.0


# -- the endings ------------------------------------------------------------------------------

#: Opens a :class:`RawClient` to the broker (keyword arguments as for it, port aside) and
#: notes its local port, so that whatever the broker leaves behind names its connection.
ClientFactory = Callable[..., RawClient]


def _exclusive_consumer(client: RawClient, tag: str) -> None:
    """Open channel 1, declare a server-named exclusive queue and consume from it."""
    client.open_channel()
    declared = client.call(1, commands.Queue.Declare(queue="", exclusive=True), "Queue.DeclareOk")
    client.call(1, commands.Basic.Consume(queue=declared.queue, consumer_tag=tag), "Basic.ConsumeOk")


def _back_up(client: RawClient, index: int) -> None:
    """Consume ``soak.big`` with no prefetch limit and read nothing until the broker stops pushing.

    What the broker has not written by then (megabytes: more than the kernel buffers hold) is
    queued inside it, and it has paused the connection as a producer.
    """
    client.handshake()
    client.open_channel()
    client.call(1, commands.Basic.Qos(prefetch_size=0, prefetch_count=0), "Basic.QosOk")
    client.send(1, commands.Basic.Consume(queue=BIG_QUEUE, consumer_tag=f"unread-{index}"))
    last = -1

    def stopped() -> bool:
        nonlocal last
        waiting = struct.unpack("i", fcntl.ioctl(client.sock, termios.FIONREAD, b"\0\0\0\0"))[0]
        settled, last = waiting == last and waiting > 0, waiting
        return settled

    wait_until(stopped, UNREAD_SETTLE)


def end_unread(open_client: ClientFactory, index: int) -> None:
    """Back megabytes up unread, then close cleanly: connection.close, read up to close-ok, FIN.

    The broker's close-ok waits behind everything queued; once the client has read it all the
    broker must close its side when the client hangs up.
    """
    client = open_client(receive_buffer=UNREAD_RECEIVE_BUFFER)
    try:
        _back_up(client, index)
        client.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        client.expect("Connection.CloseOk")
    finally:
        client.close()


def end_unread_reset(open_client: ClientFactory, index: int) -> None:
    """Back megabytes up unread, send connection.close and close at once (a RST: bytes unread)."""
    client = open_client(receive_buffer=UNREAD_RECEIVE_BUFFER)
    try:
        _back_up(client, index)
        client.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    finally:
        client.close()


def end_rst_mid_frame(open_client: ClientFactory, index: int) -> None:
    """With a consumer on an exclusive queue, send half a publish and reset the socket."""
    client = open_client()
    try:
        client.handshake()
        _exclusive_consumer(client, f"rst-{index}")
        frames = client.publish_frames(1, "", "soak.nowhere", b"r" * MID_FRAME_BODY, persistent=True)
        client.sock.sendall(frames[: len(frames) - MID_FRAME_BODY // 2])
    finally:
        client.reset()


def end_fin_mid_frame(open_client: ClientFactory, index: int) -> None:
    """With a consumer on an exclusive queue, send half a publish and close the socket (FIN)."""
    client = open_client()
    try:
        client.handshake()
        _exclusive_consumer(client, f"fin-{index}")
        frames = client.publish_frames(1, "", "soak.nowhere", b"f" * MID_FRAME_BODY, persistent=True)
        client.sock.sendall(frames[: len(frames) - MID_FRAME_BODY // 2])
    finally:
        client.close()


def end_get_large(open_client: ClientFactory, index: int) -> None:
    """``basic.get`` a 100 KB message, read a few bytes of the answer, close."""
    client = open_client()
    try:
        client.handshake()
        client.open_channel()
        client.send(1, commands.Basic.Get(queue=BIG_QUEUE, no_ack=False))
        client.read_some(GET_READ)
    finally:
        client.close()


def end_channel_unacked(open_client: ClientFactory, index: int) -> None:
    """Take deliveries, close the channel without acking them, close the connection properly."""
    client = open_client()
    try:
        client.handshake()
        client.open_channel()
        client.call(1, commands.Basic.Qos(prefetch_size=0, prefetch_count=UNACKED_PREFETCH), "Basic.QosOk")
        client.call(1, commands.Basic.Consume(queue=SMALL_QUEUE, consumer_tag=f"unacked-{index}"), "Basic.ConsumeOk")
        for _tag in client.iter_deliveries(UNACKED_READ):
            pass
        client.call(
            1, commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0), "Channel.CloseOk"
        )
        client.call(
            0,
            commands.Connection.Close(reply_code=200, reply_text="done", class_id=0, method_id=0),
            "Connection.CloseOk",
        )
    finally:
        client.close()


def end_heartbeat(open_client: ClientFactory, index: int) -> None:
    """Negotiate heartbeat=1, hold a consumer on an exclusive queue, go silent until dropped.

    :raises ProtocolFailure: the broker did not drop the connection within the deadline
    """
    client = open_client(heartbeat=HEARTBEAT, timeout=HEARTBEAT_DEADLINE)
    try:
        client.handshake()
        _exclusive_consumer(client, f"heartbeat-{index}")
        started = time.monotonic()
        try:
            while client.sock.recv(65536):  # the broker's heartbeats; we send none
                if time.monotonic() - started > HEARTBEAT_DEADLINE:
                    raise TimeoutError
        except (ConnectionResetError, BrokenPipeError):
            pass  # dropped with a RST: as good as EOF
        except TimeoutError:
            raise ProtocolFailure(
                f"a silent heartbeat={HEARTBEAT} connection was still open after {HEARTBEAT_DEADLINE:g} s"
            ) from None
    finally:
        client.close()


#: Every ending by name, in rotation order (``heartbeat`` is scheduled apart, by share).
#: The two ``unread`` endings are apart so that neighbours in flight at once do not split
#: ``soak.big`` between them.
ENDINGS: dict[str, Callable[[ClientFactory, int], None]] = {
    "unread": end_unread,
    "rst-mid-frame": end_rst_mid_frame,
    "fin-mid-frame": end_fin_mid_frame,
    "unread-reset": end_unread_reset,
    "get-large": end_get_large,
    "channel-unacked": end_channel_unacked,
    "heartbeat": end_heartbeat,
}


def schedule(connections: int, endings: list[str], heartbeat_share: float) -> list[str]:
    """The ending of each connection: every 1/share-th is ``heartbeat``, the rest rotate."""
    others = [name for name in endings if name != "heartbeat"]
    every = round(1 / heartbeat_share) if heartbeat_share > 0 and "heartbeat" in endings else 0
    plan = []
    turn = 0
    for index in range(connections):
        if (every and index % every == every - 1) or not others:
            plan.append("heartbeat")
        else:
            plan.append(others[turn % len(others)])
            turn += 1
    return plan


# -- the run ----------------------------------------------------------------------------------


@dataclass
class SoakSummary:
    """What a soak run found."""

    connections: int = 0
    endings: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0
    tracebacks: int = 0
    leaked_fds: int = 0
    leaked_connections: int = 0
    leaked_consumers: int = 0
    leaked_exclusive_queues: int = 0
    confirmed: int = 0
    present: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    findings: Findings = field(default_factory=Findings)
    #: The ending of every connection, by index (for the report).
    plan: list[str] = field(default_factory=list)
    workdir: str = ""
    #: ``--broker-root`` of the run, if any (the reproduce lines repeat it).
    broker_root: str | None = None

    @property
    def ok(self) -> bool:
        """Nothing at all went wrong."""
        return not self.findings

    @property
    def rate(self) -> float:
        """Connections per second over the whole run (start-up and checks included)."""
        return self.connections / self.elapsed if self.elapsed else 0.0

    def render(self) -> str:
        """The human summary: totals, then each finding with how to reproduce it."""
        endings = ", ".join(f"{name} {count}" for name, count in sorted(self.endings.items()))
        lines = [
            f"soak: {self.connections} connections in {self.elapsed:.1f} s ({self.rate:.1f} connections/s): {endings}",
            f"  tracebacks {self.tracebacks}, leaked fds {self.leaked_fds}, leaked connections "
            f"{self.leaked_connections}, leaked consumers {self.leaked_consumers}, leaked exclusive queues "
            f"{self.leaked_exclusive_queues}",
            f"  confirmed {self.confirmed}, present {self.present}, missing {self.missing}, "
            f"duplicated {self.duplicated}, unexpected {self.unexpected}",
        ]
        if self.ok:
            lines.append("  OK")
            return "\n".join(lines)
        lines.append(f"  FAILED: {len(self.findings)} kind(s) of failure (broker log and data in {self.workdir})")

        def describe(index: int) -> str | None:
            return f"connection {index}: {self.plan[index]}" if index < len(self.plan) else None

        def reproduce(_finding: object, index: int) -> str:
            ending = self.plan[index] if index < len(self.plan) else "?"
            root = f" --broker-root {self.broker_root}" if self.broker_root else ""
            return f"python bench/soak/soak.py --endings {ending} --connections 50{root}"

        lines += render_findings(self.findings, "connection", describe, reproduce)
        return "\n".join(lines)


@dataclass
class Vitals:
    """The broker's counts that must come back to their baseline."""

    fds: int
    connections: set[str]
    consumers: dict[str, int]
    exclusive: set[str]
    unacked: dict[str, int]

    @classmethod
    def read(cls, broker: BrokerProcess) -> Vitals:
        """Read them now."""
        fds = broker.fd_count()
        queues = broker.api("queues")
        return cls(
            fds,
            set(broker.connection_names()),
            {queue["name"]: queue["consumers"] for queue in queues if queue["consumers"]},
            {queue["name"] for queue in queues if queue["exclusive"]},
            {queue["name"]: queue["messages_unacknowledged"] for queue in queues if queue["messages_unacknowledged"]},
        )

    def within(self, baseline: Vitals) -> bool:
        """Whether nothing is above ``baseline``."""
        return (
            self.fds <= baseline.fds
            # By count: a side publisher that had to reconnect has a new name (and is reported).
            and len(self.connections) <= len(baseline.connections)
            and sum(self.consumers.values()) <= sum(baseline.consumers.values())
            and self.exclusive <= baseline.exclusive
            and sum(self.unacked.values()) <= sum(baseline.unacked.values())
        )


def prefill(port: int, queue: str, count: int, size: int) -> list[bytes]:
    """Publish ``count`` persistent messages of about ``size`` bytes with confirms; return the bodies."""
    connection = connect(port)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        bodies = []
        for number in range(count):
            head = b"%s-%06d-" % (queue.encode(), number)
            body = head + b"x" * max(0, size - len(head))
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
            bodies.append(body)
        return bodies
    finally:
        connection.close()


def check_prefilled(name: str, expected: list[bytes], drained: list[bytes]) -> ConfirmCheck:
    """Each pre-filled (confirmed) body ready exactly once, nothing else."""
    counts = Counter(drained)
    result = ConfirmCheck(confirmed=len(expected))
    for body in expected:
        if counts.get(body, 0) >= 1:
            result.present += 1
        else:
            result.missing_count += 1
        if counts.get(body, 0) > 1:
            result.duplicated_count += 1
    wanted = set(expected)
    result.unexpected = [body[:40] for body in counts if body not in wanted][:10]
    return result


class Soak:
    """One soak run against one broker process (see the module docstring)."""

    def __init__(
        self, broker: BrokerProcess, summary: SoakSummary, jobs: int, heartbeat_jobs: int, drain_seconds: float
    ) -> None:
        self.broker = broker
        self.summary = summary
        self.jobs = jobs
        self.heartbeat_jobs = heartbeat_jobs
        self.drain_seconds = drain_seconds
        self.scanner = LogScanner(broker.log_path)
        #: Client port -> connection index.
        self.ports: dict[int, int] = {}
        self._lock = threading.Lock()

    def open_client(self, index: int, **options: object) -> RawClient:
        """A :class:`RawClient` for connection ``index``, its port noted."""
        client = RawClient(self.broker.port, **options)  # type: ignore[arg-type]
        with self._lock:
            self.ports[client.local_port] = index
        return client

    def one(self, index: int) -> None:
        """Run connection ``index`` to its ending; note anything unexpected."""
        ending = self.summary.plan[index]
        try:
            ENDINGS[ending](lambda **options: self.open_client(index, **options), index)
        except Exception as error:  # noqa: BLE001 - any failure is a finding
            kind = "heartbeat" if ending == "heartbeat" and isinstance(error, ProtocolFailure) else "client"
            excerpt = "" if isinstance(error, ProtocolFailure | OSError) else traceback.format_exc()
            self.summary.findings.add(kind, f"{ending}: {type(error).__name__}: {error}"[:160], index, excerpt)
        with self._lock:
            self.summary.connections += 1
            self.summary.endings[ending] += 1

    def run_all(self) -> None:
        """Every connection of the plan: heartbeat ones on their own wide pool, the rest on ``jobs``."""
        plan = self.summary.plan
        silent = [index for index, ending in enumerate(plan) if ending == "heartbeat"]
        busy = [index for index, ending in enumerate(plan) if ending != "heartbeat"]
        with (
            ThreadPoolExecutor(max_workers=max(1, self.heartbeat_jobs), thread_name_prefix="soak-hb") as waiting,
            ThreadPoolExecutor(max_workers=max(1, self.jobs), thread_name_prefix="soak") as working,
        ):
            futures = [waiting.submit(self.one, index) for index in silent]
            futures += [working.submit(self.one, index) for index in busy]
            for future in futures:
                future.result()

    def settle(self, baseline: Vitals) -> Vitals:
        """Wait for the vitals to come back to ``baseline``; return the last reading."""
        last: list[Vitals] = []

        def back() -> bool:
            try:
                last[:] = [Vitals.read(self.broker)]
            except Exception as error:  # noqa: BLE001 - a broken management API is a finding
                self.summary.findings.add("management API", f"{type(error).__name__}: {error}"[:200], None)
                return False
            return last[0].within(baseline)

        wait_until(back, self.drain_seconds)
        return last[0] if last else baseline

    def report_leaks(self, baseline: Vitals, vitals: Vitals) -> None:
        """Note what is above the baseline, traced to connections where the peer port allows."""
        summary = self.summary
        summary.leaked_fds = max(0, vitals.fds - baseline.fds)
        extra = vitals.connections - baseline.connections
        if len(vitals.connections) <= len(baseline.connections):
            extra = set()
        summary.leaked_connections = len(extra)
        summary.leaked_consumers = max(0, sum(vitals.consumers.values()) - sum(baseline.consumers.values()))
        summary.leaked_exclusive_queues = len(vitals.exclusive - baseline.exclusive)
        traced = 0
        for info in self.broker.client_sockets():
            index = self.ports.get(info.remote_port)
            if index is None:
                continue
            traced += 1
            summary.findings.add("leaked socket", f"{info.state} socket after '{summary.plan[index]}'", index)
        if summary.leaked_fds > traced:
            summary.findings.add(
                "leaked fds", "fds above the baseline", None, f"{vitals.fds} fds against a baseline of {baseline.fds}"
            )
        for name in extra:
            port = name.rsplit(":", 1)[-1]
            index = self.ports.get(int(port)) if port.isdigit() else None
            ending = summary.plan[index] if index is not None else "?"
            summary.findings.add("leaked connection", f"still listed by /api/connections after '{ending}'", index)
        if summary.leaked_consumers:
            summary.findings.add(
                "leaked consumer", "consumers above the baseline", None, f"consumers by queue: {vitals.consumers}"
            )
        if sum(vitals.unacked.values()) > sum(baseline.unacked.values()):
            summary.findings.add(
                "leaked consumer",
                "deliveries still unacknowledged after every connection ended",
                None,
                f"unacknowledged by queue: {vitals.unacked}",
            )
        for name in sorted(vitals.exclusive - baseline.exclusive):
            summary.findings.add("leaked exclusive queue", "exclusive queue outlived its connection", None, name)

    def scan_log(self, final: bool = False) -> None:
        """Note every traceback logged so far, traced to its connection by peer port."""
        for event in self.scanner.flush() if final else self.scanner.scan():
            self.summary.tracebacks += 1
            index = self.ports.get(event.peer_port) if event.peer_port is not None else None
            self.summary.findings.add("traceback", event.signature, index, event.text)


def run(
    connections: int,
    jobs: int = 4,
    heartbeat_share: float = HEARTBEAT_SHARE,
    heartbeat_jobs: int = HEARTBEAT_JOBS,
    endings: list[str] | None = None,
    big_messages: int = BIG_MESSAGES,
    side_rate: float = SIDE_RATE,
    drain_seconds: float = DRAIN_SECONDS,
    workdir: str | None = None,
    broker_root: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> SoakSummary:
    """Open ``connections`` connections against a fresh broker, each ending its way; summarise.

    :param jobs: connections in flight at once, heartbeat ones aside
    :param heartbeat_share: the fraction of connections that end by heartbeat timeout
    :param endings: the endings to rotate through (default: all of :data:`ENDINGS`)
    :param workdir: keep the broker's files here (default: a temporary directory, removed
        when the run is clean)
    :param broker_root: run the broker from this source tree (default: this checkout)
    """
    summary = SoakSummary(broker_root=broker_root)
    summary.plan = schedule(connections, endings or list(ENDINGS), heartbeat_share)
    scratch = Workdir("postroom-soak-", workdir)
    summary.workdir = str(scratch.path)
    started = time.monotonic()
    broker = BrokerProcess(scratch.path, root=Path(broker_root) if broker_root else None)
    stop = threading.Event()
    publishers = [
        SidePublisher(broker.port, CONFIRMED_QUEUE, number, side_rate, stop) for number in range(SIDE_PUBLISHERS)
    ]
    say = progress or (lambda _line: None)
    try:
        big = prefill(broker.port, BIG_QUEUE, big_messages, BIG_BODY)
        small = prefill(broker.port, SMALL_QUEUE, SMALL_MESSAGES, 32)
        for publisher in publishers:
            publisher.start()
        for publisher in publishers:
            publisher.ready.wait(30)
        soak = Soak(broker, summary, jobs, heartbeat_jobs, drain_seconds)
        wait_until(lambda: len(broker.connection_names()) >= SIDE_PUBLISHERS, drain_seconds)
        baseline = Vitals.read(broker)
        say(f"prefilled {len(big)} x {BIG_BODY} B and {len(small)} messages; baseline {baseline.fds} fds")
        soak.run_all()
        say(f"{summary.connections} connections done in {time.monotonic() - started:.1f} s; settling")
        vitals = soak.settle(baseline)
        soak.report_leaks(baseline, vitals)
        soak.scan_log()
        stop.set()
        for publisher in publishers:
            publisher.join(30)
            for error in publisher.errors:
                summary.findings.add("side publisher", error.split(":")[0], None, error)
        if not broker.alive():
            summary.findings.add("broker died", f"exit status {broker.process.returncode}", None, broker.log_tail())
        else:
            checks = [
                check_confirmed(publishers, drain_or_note(broker.port, CONFIRMED_QUEUE, summary.findings)),
                check_prefilled(BIG_QUEUE, big, drain_or_note(broker.port, BIG_QUEUE, summary.findings)),
                check_prefilled(SMALL_QUEUE, small, drain_or_note(broker.port, SMALL_QUEUE, summary.findings)),
            ]
            for name, result in zip((CONFIRMED_QUEUE, BIG_QUEUE, SMALL_QUEUE), checks, strict=True):
                summary.confirmed += result.confirmed
                summary.present += result.present
                summary.missing += result.missing_count
                summary.duplicated += result.duplicated_count
                summary.unexpected += len(result.unexpected)
                if not result.ok:
                    summary.findings.add(
                        "lost confirm",
                        f"{name}: confirmed messages not ready exactly once",
                        None,
                        f"missing {result.missing_count} {result.missing} duplicated {result.duplicated_count} "
                        f"unexpected {result.unexpected}",
                    )
        soak.scan_log(final=True)
    finally:
        stop.set()
        broker.stop()
        summary.elapsed = time.monotonic() - started
        scratch.finish(summary.ok)
    return summary


def main(argv: list[str] | None = None) -> int:
    """The command line; exits 1 on any failure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=2000, help="how many connections (default 2000)")
    parser.add_argument("--jobs", type=int, default=4, help="connections in flight at once (default 4)")
    parser.add_argument(
        "--heartbeat-share", type=float, default=HEARTBEAT_SHARE, help="share ending by heartbeat (default 0.05)"
    )
    parser.add_argument("--heartbeat-jobs", type=int, default=HEARTBEAT_JOBS, help="heartbeat ones at once")
    parser.add_argument("--endings", help=f"comma-separated subset of: {', '.join(ENDINGS)}")
    parser.add_argument("--big-messages", type=int, default=BIG_MESSAGES, help="100 KB messages in soak.big")
    parser.add_argument("--side-rate", type=float, default=SIDE_RATE, help="msg/s per side publisher (default 50)")
    parser.add_argument("--drain", type=float, default=DRAIN_SECONDS, help="seconds to settle (default 15)")
    parser.add_argument("--workdir", help="keep the broker's config, log and data here")
    parser.add_argument("--broker-root", help="run the broker from this source tree (default: this checkout)")
    args = parser.parse_args(argv)
    endings = args.endings.split(",") if args.endings else None
    unknown = set(endings or ()) - set(ENDINGS)
    if unknown:
        parser.error(f"unknown endings: {', '.join(sorted(unknown))}")
    summary = run(
        args.connections,
        jobs=args.jobs,
        heartbeat_share=args.heartbeat_share,
        heartbeat_jobs=args.heartbeat_jobs,
        endings=endings,
        big_messages=args.big_messages,
        side_rate=args.side_rate,
        drain_seconds=args.drain,
        workdir=args.workdir,
        broker_root=args.broker_root,
        progress=lambda line: print(line, flush=True),
    )
    print(summary.render())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Deep backlogs: memory per queued message, restart time and memory, and the drain, for Postroom
and RabbitMQ one after the other on the same storage.

For each broker: start it on an empty directory, declare one queue (durable for persistent
messages, not for transient ones), publish ``--messages`` bodies of ``--size`` bytes with
confirms (1,000 unconfirmed at most), and measure the resident memory it grew by, per queued
message, 2 s after the last confirm. Persistent runs then restart the broker on the same
storage, once per ``--restarts`` entry (``term``: SIGTERM, a clean stop; ``kill``: SIGKILL),
timing from the new process's start until its port accepts and until a passive declare
counts every message, and its resident memory then. Last, one consumer (prefetch 1,000)
drains the queue, checking every body's bytes and their order, and the resident memory 2 s
after the last ack is printed with the memory before the backlog.

A broker that confirms nothing for ``--stall`` seconds while the publisher waits (RabbitMQ
blocks publishers under its memory alarm) ends its run: what it holds then is printed, with
the alarms its log shows.

    python bench/backlog.py [--messages 1000000] [--size 16] [--transient]
        [--restarts term,kill] [--brokers postroom,rabbitmq] [--stall 120]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from postroom.broker.clients.client import Timeout, connect  # noqa: E402
from postroom.broker.tools.testing import RABBITMQ_LAUNCHER, free_port, process_memory, rabbitmq_environment  # noqa: E402

QUEUE = "backlog"
#: Longest a start may take, until every message is counted (10M messages replayed take minutes).
START_SECONDS = 1800
MIB = 2**20
_sequence = struct.Struct(">Q")


def body(number: int, size: int) -> bytes:
    """Message ``number``'s body: its number, then bytes that depend on it (checked on the drain)."""
    head = _sequence.pack(number)
    return (head + (head[::-1] * (size // 8 + 1)))[:size] if size >= 8 else head[-size:]


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Node:
    """A broker process that can be stopped and started again on the same storage."""

    name = ""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> float:
        """Start it; return when it did (``time.monotonic()``)."""
        command, environment = self.command()
        started = time.monotonic()
        with open(self.home / "output.log", "ab") as log:
            self.process = subprocess.Popen(
                command, env=environment, stdout=log, stderr=log, cwd=ROOT, start_new_session=True
            )
        return started

    def stop(self, how: signal.Signals) -> None:
        """Send ``how`` to the broker itself (not a launcher) and wait until it is gone."""
        assert self.process is not None
        os.kill(self.pid, how)
        try:
            self.process.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self.process = None


class Postroom(Node):
    name = "postroom"

    def command(self) -> tuple[list[str], dict[str, str]]:
        config = self.home / "postroom.yaml"
        config.write_text(
            f'listen: {{amqp: "tcp:{self.port}:interface=127.0.0.1"}}\n'
            f'storage: {{dir: "{self.home / "data"}", fsync: batch}}\n'
        )
        return [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)], dict(os.environ)

    def alarms(self) -> list[str]:
        """The resource alarms its log shows (none: Postroom's are in its metrics)."""
        return []

    def recovery_line(self) -> str:
        """What the broker logged about its last start's recovery (from ``recovered`` on)."""
        lines = [line for line in (self.home / "output.log").read_text().splitlines() if "] recovered " in line]
        return lines[-1].split("] ", 1)[1] if lines else "(no recovery line logged)"


class RabbitMQ(Node):
    name = "rabbitmq"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.dist_port = free_port()
        (home / "enabled_plugins").write_text("[].\n")

    def command(self) -> tuple[list[str], dict[str, str]]:
        (self.home / "pid").unlink(missing_ok=True)
        return [str(RABBITMQ_LAUNCHER)], rabbitmq_environment(self.home, self.port, self.dist_port)

    def alarms(self) -> list[str]:
        """The resource alarm lines of its log."""
        return [
            line.strip()
            for path in sorted(self.home.rglob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if "alarm set" in line
        ]

    @property
    def pid(self) -> int:
        """The Erlang VM's pid (the launcher's child), once its pid file is written."""
        pid_file = self.home / "pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                return super().pid
            time.sleep(0.05)
        return int(pid_file.read_text().strip())


def message_count(port: int) -> int | None:
    """The queue's message count from a passive declare; ``None`` while the broker refuses."""
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, blocked_connection_timeout=None)
        )
    except pika.exceptions.AMQPError:
        return None
    try:
        return connection.channel().queue_declare(QUEUE, passive=True).method.message_count
    except pika.exceptions.AMQPError:
        return None
    finally:
        if connection.is_open:
            connection.close()


def wait_port(node: Node, started: float) -> float:
    """Seconds from ``started`` until the node's port accepts.

    :raises SystemExit: the node exited, or did not listen within :data:`START_SECONDS`
    """
    while not accepts(node.port):
        if time.monotonic() - started > START_SECONDS or node.process is None or node.process.poll() is not None:
            raise SystemExit(f"{node.name} did not start; see {node.home / 'output.log'}")
        time.sleep(0.01)
    return time.monotonic() - started


def wait_ready(node: Node, started: float, count: int) -> tuple[float, float]:
    """Seconds from ``started`` until the port accepts, and until every message is counted.

    :raises SystemExit: the count stayed short of ``count`` (messages lost)
    """
    port_at = wait_port(node, started)
    while (counted := message_count(node.port)) != count:
        if time.monotonic() - started > START_SECONDS:
            raise SystemExit(f"{node.name} counts {counted} messages after its start, not {count:,}")
        time.sleep(0.05)
    return port_at, time.monotonic() - started


def publish(port: int, count: int, size: int, persistent: bool, stall: float) -> float:
    """Seconds it took.

    :raises Timeout: no confirm came for ``stall`` seconds
    """
    with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=stall, reconnect=False) as connection:
        started = time.monotonic()
        connection.publish_batch(
            (("", QUEUE, body(number, size)) for number in range(count)), window=1000, persistent=persistent
        )
        return time.monotonic() - started


def drain(port: int, count: int, size: int) -> float:
    """Consume every message, checking each body and the order; seconds it took."""
    with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=120, reconnect=False) as connection:
        started = time.monotonic()
        received = 0
        for message in connection.consume(QUEUE, prefetch=1000, timeout=120):
            if message.body != body(received, size):
                raise SystemExit(f"message {received}: got {message.body[:16]!r}, not {body(received, size)[:16]!r}")
            message.ack()
            received += 1
            if received == count:
                break
        return time.monotonic() - started


def run(node: Node, args: argparse.Namespace) -> dict[str, object]:
    result: dict[str, object] = {"broker": node.name, "messages": args.messages, "size": args.size}
    result["persistent"] = not args.transient
    wait_port(node, node.start())
    with connect(f"amqp://guest:guest@127.0.0.1:{node.port}/", heartbeat=0, reconnect=False) as connection:
        connection.declare_queue(QUEUE, durable=not args.transient)
    time.sleep(2)
    baseline = process_memory(node.pid)
    try:
        seconds = publish(node.port, args.messages, args.size, not args.transient, args.stall)
    except Timeout:
        queued = message_count(node.port)
        result["stalled_at"] = queued
        result["stalled_rss_mib"] = round(process_memory(node.pid) / MIB)
        say(
            node,
            f"publishing stalled: no confirm for {args.stall:.0f} s with {queued or 0:,} queued; "
            f"RSS {result['stalled_rss_mib']:,} MiB (before the backlog {baseline / MIB:,.0f} MiB)",
        )
        for line in node.alarms():
            say(node, "  " + line)
        node.stop(signal.SIGKILL)
        return result
    result["publish_per_s"] = round(args.messages / seconds)
    time.sleep(2)
    before = process_memory(node.pid)
    result["rss_baseline_mib"] = round(baseline / MIB)
    result["ram_per_message_b"] = round((before - baseline) / args.messages, 1)
    say(node, f"published {args.messages:,} in {seconds:.1f} s; {result['ram_per_message_b']} B per queued message")
    for restart in [] if args.transient else [name for name in args.restarts.split(",") if name]:
        before = process_memory(node.pid)
        node.stop(signal.SIGTERM if restart == "term" else signal.SIGKILL)
        started = node.start()
        port_at, ready_at = wait_ready(node, started, args.messages)
        after = process_memory(node.pid)
        result[f"{restart}_port_s"] = round(port_at, 2)
        result[f"{restart}_ready_s"] = round(ready_at, 2)
        result[f"{restart}_rss_mib"] = round(after / MIB)
        result[f"{restart}_rss_before_mib"] = round(before / MIB)
        say(
            node,
            f"after SIG{restart.upper()}: port in {port_at:.1f} s, all ready in {ready_at:.1f} s; "
            f"RSS {after / MIB:,.0f} MiB (before the stop {before / MIB:,.0f} MiB)",
        )
        if isinstance(node, Postroom):
            say(node, "  " + node.recovery_line())
    seconds = drain(node.port, args.messages, args.size)
    result["drain_per_s"] = round(args.messages / seconds)
    time.sleep(2)
    result["rss_drained_mib"] = round(process_memory(node.pid) / MIB)
    say(
        node,
        f"drained and checked {args.messages:,} in {seconds:.1f} s; RSS {result['rss_drained_mib']:,} MiB "
        f"(before the backlog {result['rss_baseline_mib']:,} MiB)",
    )
    node.stop(signal.SIGTERM)
    return result


def say(node: Node, text: str) -> None:
    print(f"{node.name:<9} {text}", flush=True)


def nodes(names: list[str]) -> Iterator[Node]:
    for name in names:
        home = Path(tempfile.mkdtemp(prefix=f"postroom-backlog-{name}-"))
        node: Node = Postroom(home) if name == "postroom" else RabbitMQ(home)
        try:
            yield node
        finally:
            if node.process is not None:
                node.stop(signal.SIGKILL)
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--transient", action="store_true", help="transient messages in a transient queue")
    parser.add_argument("--restarts", default="term,kill")
    parser.add_argument("--brokers", default="postroom,rabbitmq")
    parser.add_argument("--stall", type=float, default=120, help="longest wait for a confirm, in seconds")
    parser.add_argument("--json", type=Path, default=None, help="append each broker's figures here, one per line")
    args = parser.parse_args()
    for node in nodes(args.brokers.split(",")):
        result = run(node, args)
        if args.json is not None:
            with open(args.json, "a") as out:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

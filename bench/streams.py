"""Streams over AMQP 0-9-1: Postroom's stream queues and RabbitMQ's, one after the other, each on
an empty directory, with Postroom's blocking client on both.

Scenarios (``--scenarios``, all by default):

* ``publish``: ``--messages`` bodies of ``--size`` bytes into a stream, with confirms (1,000
  unconfirmed at most): messages per second;
* ``replay``: one consumer reads them all back from ``first`` with prefetch 1,000, checking
  every body and its order, acknowledging each: messages per second;
* ``readers``: ten consumers at ten offsets each read ``--reader-messages`` at once, on ten
  connections; the broker's resident memory before, at its highest while they read (sampled
  every 50 ms) and after;
* ``group`` (Postroom only: RabbitMQ 3.10 has no single active consumer on streams over AMQP
  0-9-1): a partitioned stream of 4 partitions, ``--messages`` published through its exchange
  with 1,000 keys, read by a group of 2 members (two connections, each consuming every
  partition): messages per second end to end, and each key's order checked;
* ``restart``: ``--restart-messages`` small messages in a stream and (Postroom) 1,000 named
  subscriptions that acknowledged part of it; the time from a new process's start until a
  passive declare of the stream counts them all, after SIGTERM and after SIGKILL.

    python bench/streams.py [--messages 1000000] [--size 1024] [--scenarios publish,replay,...]
        [--brokers postroom,rabbitmq] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.backlog import MIB, Node, Postroom, nodes, say, wait_port  # noqa: E402
from postroom.broker.clients.client import connect  # noqa: E402
from postroom.broker.tools.testing import process_memory  # noqa: E402

STREAM = "bench.stream"
STREAM_ARGUMENTS = {"x-queue-type": "stream"}
_number = struct.Struct(">Q")


def body(number: int, size: int) -> bytes:
    """Message ``number``'s body: its number, then filler up to ``size`` bytes."""
    head = _number.pack(number)
    return head + b"s" * max(0, size - len(head))


def url(node: Node) -> str:
    return f"amqp://guest:guest@127.0.0.1:{node.port}/"


def declare(node: Node, name: str = STREAM) -> None:
    with connect(url(node), heartbeat=0, reconnect=False) as connection:
        connection.declare_queue(name, arguments=STREAM_ARGUMENTS)


def publish(node: Node, count: int, size: int, exchange: str = "", key: Callable[[int], str] | None = None) -> float:
    """Publish ``count`` messages with confirms; seconds it took."""
    with connect(url(node), heartbeat=0, timeout=300, reconnect=False) as connection:
        started = time.monotonic()
        connection.publish_batch(
            ((exchange, key(n) if key else STREAM, body(n, size)) for n in range(count)), window=1000, persistent=True
        )
        return time.monotonic() - started


def replay(node: Node, count: int, size: int, offset: Any = "first", check: bool = True) -> float:
    """Read ``count`` messages from ``offset``, checking that their numbers run on without a
    gap (from 0 for ``first``; from an offset, the first number is the broker's: RabbitMQ's
    offsets skip one where a segment starts); seconds it took."""
    first: int | None = 0 if offset == "first" else None
    with connect(url(node), heartbeat=0, timeout=300, reconnect=False) as connection:
        started = time.monotonic()
        received = 0
        for message in connection.consume(STREAM, prefetch=1000, timeout=60, arguments={"x-stream-offset": offset}):
            if first is None:
                first = _number.unpack_from(message.body)[0]
            if check and message.body[:8] != _number.pack(first + received):
                raise SystemExit(f"message {first + received}: got {message.body[:8]!r}")
            message.ack()
            received += 1
            if received == count:
                break
        if received != count:
            raise SystemExit(f"replay from {offset}: {received:,} of {count:,} came")
        return time.monotonic() - started


def scenario_publish_replay(node: Node, args: argparse.Namespace, result: dict[str, Any]) -> None:
    declare(node)
    seconds = publish(node, args.messages, args.size)
    result["publish_per_s"] = round(args.messages / seconds)
    say(node, f"published {args.messages:,} x {args.size} B with confirms in {seconds:.1f} s")
    if "replay" in args.scenarios:
        seconds = replay(node, args.messages, args.size)
        result["replay_per_s"] = round(args.messages / seconds)
        say(node, f"replayed and checked {args.messages:,} from first in {seconds:.1f} s")


def scenario_readers(node: Node, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Ten readers at ten offsets of a stream of ``args.messages`` (published if need be)."""
    if "publish" not in args.scenarios:
        declare(node)
        publish(node, args.messages, args.size)
    time.sleep(2)
    before = process_memory(node.pid)
    peak = before
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, process_memory(node.pid))
            time.sleep(0.05)

    step = max(1, (args.messages - args.reader_messages) // 10)
    offsets = [index * step for index in range(10)]
    failures: list[BaseException] = []

    def read(offset: int) -> None:
        try:
            replay(node, min(args.reader_messages, args.messages - offset), args.size, offset)
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    readers = [threading.Thread(target=read, args=(offset,)) for offset in offsets]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    seconds = time.monotonic() - started
    stop.set()
    sampler.join()
    if failures:
        raise SystemExit(f"a reader failed: {failures[0]!r}")
    time.sleep(2)
    after = process_memory(node.pid)
    read_bytes = sum(min(args.reader_messages, args.messages - offset) for offset in offsets) * args.size
    result.update(
        readers_rss_before_mib=round(before / MIB),
        readers_rss_peak_mib=round(peak / MIB),
        readers_rss_after_mib=round(after / MIB),
        readers_read_mib=round(read_bytes / MIB),
        readers_per_s=round(read_bytes / args.size / seconds),
    )
    say(
        node,
        f"10 readers at offsets {offsets[0]:,} ... {offsets[-1]:,} read {read_bytes / MIB:,.0f} MiB in {seconds:.1f} s;"
        f" RSS before {before / MIB:,.0f} MiB, at most {peak / MIB:,.0f} MiB, after {after / MIB:,.0f} MiB",
    )


def _member(port: int, name: str, count: int, read: Any, errors: Any) -> None:
    """A group member, in a process of its own: one connection consuming every partition of
    ``name`` as group ``g`` (acks by 100), checking each key's order, until ``count`` messages
    were read by the whole group (``read``, shared)."""
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    group = {"x-stream-offset": "first", "x-stream-consumer-name": "g", "x-single-active-consumer": True}
    last: dict[int, int] = {}

    def on_message(channel: Any, method: Any, _properties: Any, message: bytes) -> None:
        number = _number.unpack_from(message)[0]
        key = number % 1000
        if last.get(key, -1) >= number:
            errors.value += 1
        last[key] = number
        with read.get_lock():
            read.value += 1
        if method.delivery_tag % 100 == 0:
            channel.basic_ack(method.delivery_tag, multiple=True)

    for partition in range(4):
        channel.basic_consume(f"{name}-{partition}", on_message, arguments=group)
    while read.value < count:
        connection.process_data_events(time_limit=0.05)
    connection.close()


def scenario_group(node: Node, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """A 4-partition stream read by a 2-member group (a process each); key order checked."""
    import multiprocessing

    name = "bench.partitioned"
    with connect(url(node), heartbeat=0, reconnect=False) as connection:
        connection.declare_exchange(name, "direct", arguments={"x-super-stream": True})
        for index in range(4):
            connection.declare_queue(f"{name}-{index}", arguments=STREAM_ARGUMENTS)
            connection.bind(f"{name}-{index}", name, str(index), {"x-stream-partition-order": index})
    count = args.messages
    context = multiprocessing.get_context("fork")
    read, errors = context.Value("q", 0), context.Value("q", 0)
    members = [context.Process(target=_member, args=(node.port, name, count, read, errors)) for _ in range(2)]
    for each in members:
        each.start()
    time.sleep(1)  # both have joined: two partitions each
    started = time.monotonic()
    publish(node, count, args.size, name, lambda n: f"key-{n % 1000}")
    for each in members:
        each.join(600)
    seconds = time.monotonic() - started
    if errors.value or read.value < count:
        raise SystemExit(f"group: {read.value:,} of {count:,} read; {errors.value} out of key order")
    result["group_per_s"] = round(count / seconds)
    say(node, f"4 partitions, 2 members: {count:,} published and read in key order in {seconds:.1f} s")


def scenario_restart(node: Node, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """``args.restart_messages`` in a stream and 1,000 subscriptions; restarts timed."""
    name = "bench.restart"
    declare(node, name)
    count = result["restart_messages"] = args.restart_messages
    with connect(url(node), heartbeat=0, timeout=300, reconnect=False) as connection:
        started = time.monotonic()
        connection.publish_batch(((("", name, body(n, 16)) for n in range(count))), window=1000, persistent=True)
        say(node, f"published {count:,} x 16 B in {time.monotonic() - started:.1f} s")
    if isinstance(node, Postroom):
        with connect(url(node), heartbeat=0, timeout=300, reconnect=False) as connection:
            for index in range(1000):
                arguments = {"x-stream-offset": index, "x-stream-consumer-name": f"sub-{index}"}
                for message in connection.consume(name, prefetch=1, timeout=10, arguments=arguments):
                    message.ack()
                    break
        say(node, "1,000 named subscriptions stored their offsets")
    for how in ("term", "kill"):
        node.stop(signal.SIGTERM if how == "term" else signal.SIGKILL)
        started = node.start()
        port_at = wait_port(node, started)
        while not last_readable(node, name, count - 1):
            if time.monotonic() - started > 1800:
                raise SystemExit(f"{node.name}: message {count - 1:,} not readable after a restart")
            time.sleep(0.05)
        ready = time.monotonic() - started
        result[f"restart_{how}_ready_s"] = round(ready, 2)
        say(node, f"after SIG{how.upper()}: port in {port_at:.2f} s, the last message read in {ready:.2f} s")


def last_readable(node: Node, name: str, number: int) -> bool:
    """Whether a consumer from ``last`` gets message ``number`` (the stream is back, whole)."""
    try:
        with connect(url(node), heartbeat=0, timeout=10, reconnect=False) as connection:
            arguments = {"x-stream-offset": "last"}
            for message in connection.consume(name, prefetch=100, timeout=1, arguments=arguments):
                message.ack()
                if _number.unpack_from(message.body)[0] == number:
                    return True
    except Exception:  # noqa: BLE001 - not ready yet (refused, closed, timed out)
        return False
    return False


SCENARIOS: dict[str, Callable[[Node, argparse.Namespace, dict[str, Any]], None]] = {
    "publish": scenario_publish_replay,
    "readers": scenario_readers,
    "group": scenario_group,
    "restart": scenario_restart,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--reader-messages", type=int, default=200_000, help="what each of the ten readers reads")
    parser.add_argument("--restart-messages", type=int, default=10_000_000)
    parser.add_argument("--scenarios", default="publish,replay,readers,group,restart")
    parser.add_argument("--brokers", default="postroom,rabbitmq")
    parser.add_argument("--json", type=Path, default=None, help="append each broker's figures here, one per line")
    args = parser.parse_args()
    args.scenarios = args.scenarios.split(",")
    for node in nodes(args.brokers.split(",")):
        result: dict[str, Any] = {"broker": node.name, "messages": args.messages, "size": args.size}
        # The broker before left gigabytes to write back: each starts on a quiet disk.
        os.sync()
        time.sleep(2)
        wait_port(node, node.start())
        ran = set()
        for scenario in args.scenarios:
            run = SCENARIOS.get("publish" if scenario == "replay" else scenario)
            if run is None or run in ran or (scenario == "group" and node.name != "postroom"):
                continue
            ran.add(run)
            run(node, args, result)
        node.stop(signal.SIGTERM)
        print(json.dumps(result), flush=True)
        if args.json is not None:
            with open(args.json, "a") as out:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

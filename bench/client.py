"""Postroom's blocking client beside pika's BlockingConnection, back to back against one broker.

Both publish N messages one confirmed publish at a time (transient, to a non-durable queue,
so the broker's disk does not set the pace), then consume them with one ack each, prefetch
100. Prints messages per second for each, alternating which goes first.

    python bench/client.py [--messages 20000] [--size 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run import postroom  # noqa: E402

from postroom.broker.clients.client import connect  # noqa: E402


def ours(port: int, count: int, body: bytes) -> tuple[float, float]:
    with connect(f"amqp://guest:guest@127.0.0.1:{port}/") as conn:
        conn.declare_queue("bench.client", durable=False)
        started = time.perf_counter()
        for _ in range(count):
            conn.publish("", "bench.client", body, persistent=False)
        published = count / (time.perf_counter() - started)
        started = time.perf_counter()
        received = 0
        for message in conn.consume("bench.client", prefetch=100, timeout=5):
            message.ack()
            received += 1
            if received == count:
                break
        consumed = count / (time.perf_counter() - started)
    return published, consumed


def pikas(port: int, count: int, body: bytes) -> tuple[float, float]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.queue_declare("bench.pika")
    channel.confirm_delivery()
    started = time.perf_counter()
    for _ in range(count):
        channel.basic_publish("", "bench.pika", body, pika.BasicProperties(delivery_mode=1))
    published = count / (time.perf_counter() - started)
    channel.basic_qos(prefetch_count=100)
    started = time.perf_counter()
    received = 0
    for method, _properties, _body in channel.consume("bench.pika", inactivity_timeout=5):
        if method is None:
            break
        channel.basic_ack(method.delivery_tag)
        received += 1
        if received == count:
            break
    consumed = count / (time.perf_counter() - started)
    channel.cancel()
    connection.close()
    return published, consumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    body = b"x" * args.size
    results: dict[str, list[tuple[float, float]]] = {"postroom client": [], "pika": []}
    with postroom() as (port, _pid):
        for run in range(args.runs):
            order = [("postroom client", ours), ("pika", pikas)]
            for name, bench in order if run % 2 == 0 else reversed(order):
                results[name].append(bench(port, args.messages, body))
    for name, runs in results.items():
        publish = statistics.median(r[0] for r in runs)
        consume = statistics.median(r[1] for r in runs)
        print(f"{name:16} publish with confirm {publish:>9,.0f}/s   consume with ack {consume:>9,.0f}/s")


if __name__ == "__main__":
    main()

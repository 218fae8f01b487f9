"""A queue several times the memory budget: Postroom and RabbitMQ under the same load, one after the other.

One publisher sends 64 KiB messages with confirms into a durable queue nobody consumes, until
the queue holds ``--budgets`` times Postroom's ``storage.memory_budget``; then one consumer
(prefetch 100) takes every message and acks it. Every message must come back once, in order.
The broker's resident memory is sampled every 20 ms throughout.

    python bench/deep.py                                # 256 MiB budget, 3.25 budgets, both brokers
    python bench/deep.py --budget-mib 128 --no-rabbitmq

RabbitMQ 3.10 runs with its defaults (a classic queue, paging under its memory watermark) and
again with ``x-queue-mode: lazy`` (bodies to disk at once). Prints one line per broker and
delivery mode: queued bytes, peak resident memory while publishing and over the whole run,
and how long publishing and draining took.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import postroom  # noqa: E402
from postroom.broker.tools.testing import MemoryReadings, rabbitmq_node  # noqa: E402

BODY = 64 * 1024
QUEUE = "deep"
_sequence = struct.Struct(">I")


def run(name: str, port: int, pid: int, count: int, mode: int, arguments: dict[str, str]) -> str:
    sampler = MemoryReadings(pid)
    sampler.start()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    channel = connection.channel()
    channel.queue_delete(QUEUE)
    channel.queue_declare(QUEUE, durable=True, arguments=arguments)
    channel.confirm_delivery()
    padding = b"x" * (BODY - _sequence.size)
    properties = pika.BasicProperties(delivery_mode=mode)
    started = time.monotonic()
    for sequence in range(count):
        channel.basic_publish("", QUEUE, _sequence.pack(sequence) + padding, properties)
    published = time.monotonic() - started
    time.sleep(2)  # let the broker settle with the whole queue in it
    peak_publish = sampler.peak
    channel.basic_qos(prefetch_count=100)
    received = disorder = 0
    started = time.monotonic()
    for method, _properties, body in channel.consume(QUEUE, inactivity_timeout=30):
        if method is None:
            break
        if _sequence.unpack_from(body)[0] != received:
            disorder += 1
        received += 1
        if received % 50 == 0 or received == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if received == count:
            break
    drained = time.monotonic() - started
    channel.cancel()
    channel.queue_delete(QUEUE)
    connection.close()
    sampler.stopped.set()
    mib = 2**20
    return (
        f"{name:<14} {'persistent' if mode == 2 else 'transient':<10} {count * BODY / mib:,.0f} MiB queued; "
        f"peak RSS {peak_publish / mib:,.0f} MiB while publishing, {sampler.peak / mib:,.0f} MiB over the run; "
        f"{received:,} of {count:,} received, {disorder} out of order; "
        f"published in {published:.1f} s, drained in {drained:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--budgets", type=float, default=3.25)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args()
    budget = args.budget_mib * 2**20
    count = int(args.budgets * budget) // BODY
    with postroom(storage=f"memory_budget: {budget}B") as (port, pid):
        for mode in (1, 2):
            print(run("postroom", port, pid, count, mode, {}), flush=True)
    if not args.no_rabbitmq:
        for name, arguments in (("rabbitmq", {}), ("rabbitmq-lazy", {"x-queue-mode": "lazy"})):
            with rabbitmq_node() as (port, pid):
                for mode in (1, 2):
                    print(run(name, port, pid, count, mode, arguments), flush=True)


if __name__ == "__main__":
    main()

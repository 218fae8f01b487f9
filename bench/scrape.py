"""What a ``/metrics`` scrape costs the broker's clients when it has many queues.

Postroom starts with ``--queues`` queues (declared over AMQP). A probe client then asks the
broker for something (a passive ``queue.declare``) in a loop, timing each round trip, while
``/metrics`` is scraped ``--scrapes`` times one after the other. Printed: the time each scrape
took and its size, the probe's slowest round trip during the scrapes (how long the broker left
its clients waiting) and its median, and the broker's resident memory before and after.

    python bench/scrape.py                      # 50,000 queues, 5 scrapes
    python bench/scrape.py --queues 10000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import postroom  # noqa: E402
from postroom.broker.tools.testing import free_port, process_memory  # noqa: E402


class Probe(threading.Thread):
    """Round trips of a passive queue.declare, each timed, while :attr:`measuring` is set."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.measuring = threading.Event()
        self.done = threading.Event()
        self.trips: list[float] = []

    def run(self) -> None:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))
        channel = connection.channel()
        while not self.done.is_set():
            started = time.monotonic()
            channel.queue_declare("q0", passive=True)
            if self.measuring.is_set():
                self.trips.append(time.monotonic() - started)
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=50_000)
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()
    metrics_port = free_port()
    with postroom(listen=f'metrics: "tcp:{metrics_port}:interface=127.0.0.1", management: false') as (port, pid):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        channel = connection.channel()
        for number in range(args.queues):
            channel.queue_declare(f"q{number}")
        connection.close()
        probe = Probe(port)
        probe.start()
        time.sleep(1)
        before = process_memory(pid)
        probe.measuring.set()
        durations, sizes, peak = [], [], before
        for _ in range(args.scrapes):
            started = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=120) as response:
                sizes.append(len(response.read()))
            durations.append(time.monotonic() - started)
            peak = max(peak, process_memory(pid))
        probe.measuring.clear()
        probe.done.set()
        probe.join(10)
        mib = 2**20
        trips = probe.trips
        print(
            f"{args.queues:,} queues: scrape {statistics.median(durations):.2f} s median "
            f"(min {min(durations):.2f}, max {max(durations):.2f}), {statistics.median(sizes) / mib:.1f} MiB; "
            f"probe round trip during scrapes: max {max(trips) * 1000:.1f} ms, "
            f"median {statistics.median(trips) * 1000:.2f} ms over {len(trips):,} trips; "
            f"RSS {before / mib:,.0f} MiB before, {peak / mib:,.0f} MiB peak"
        )


if __name__ == "__main__":
    main()

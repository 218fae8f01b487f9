"""A flood against the memory alarm: Postroom and RabbitMQ under the same load, one after the other.

Each broker gets the same absolute memory watermark. Publishers send transient 64 KiB
messages with confirms, ten times the watermark in all, into a queue nobody consumes: the
alarm must block them. While they are blocked the broker's resident memory is sampled; then a
consumer drains the queue, the publishers are unblocked and finish, and every message must
arrive once, in each publisher's order.

    python bench/flood.py                          # 400 MiB watermark, 2 publishers, both brokers
    python bench/flood.py --watermark-mib 256 --no-rabbitmq

Prints one line per broker: peak resident memory against the watermark (while blocked, and
over the whole run), how often publishers were blocked, what arrived and how long it took.
"""

from __future__ import annotations

import argparse
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import postroom  # noqa: E402
from postroom.broker.tools.testing import MemoryReadings, rabbitmq_node  # noqa: E402

BODY = 64 * 1024
QUEUE = "flood"
_head = struct.Struct(">II")  # publisher, sequence number


class Publisher(threading.Thread):
    def __init__(self, port: int, number: int, count: int) -> None:
        super().__init__(daemon=True)
        self.port, self.number, self.count = port, number, count
        self.blocks = self.unblocks = self.confirmed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))
            connection.add_on_connection_blocked_callback(self._on_blocked)
            connection.add_on_connection_unblocked_callback(self._on_unblocked)
            channel = connection.channel()
            channel.confirm_delivery()
            padding = b"x" * (BODY - _head.size)
            for sequence in range(self.count):
                channel.basic_publish("", QUEUE, _head.pack(self.number, sequence) + padding)
                self.confirmed += 1
            connection.close()
        except BaseException as error:  # reported by the main thread
            self.error = error

    def _on_blocked(self, *args: object) -> None:
        self.blocks += 1

    def _on_unblocked(self, *args: object) -> None:
        self.unblocks += 1


def drain(port: int, expected: int, publishers: int, timeout: float) -> tuple[int, int]:
    """Consume ``expected`` messages; return how many arrived and how many were out of order."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=500)
    following = [0] * publishers
    received = disorder = 0
    deadline = time.monotonic() + timeout
    for method, _properties, body in channel.consume(QUEUE, inactivity_timeout=1.0):
        if method is None:
            if received >= expected or time.monotonic() > deadline:
                break
            continue
        number, sequence = _head.unpack_from(body)
        if sequence != following[number]:
            disorder += 1
        following[number] = sequence + 1
        received += 1
        if received % 100 == 0 or received >= expected:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if received >= expected:
            break
    channel.cancel()
    connection.close()
    return received, disorder


def stalled(senders: list[Publisher], timeout: float) -> bool:
    """Wait until no publisher has had a confirm for 2 s (they are blocked; pika's blocking
    connection tells its callback only once it is back from the publish it is stuck in)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        confirmed = sum(sender.confirmed for sender in senders)
        if confirmed != last:
            last, since = confirmed, time.monotonic()
        elif time.monotonic() - since >= 2.0:
            return True
        time.sleep(0.1)
    return False


def flood(name: str, port: int, pid: int, watermark: int, publishers: int) -> str:
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    setup.channel().queue_declare(QUEUE)
    setup.close()
    total = 10 * watermark // BODY
    sampler = MemoryReadings(pid)
    sampler.start()
    started = time.monotonic()
    senders = [Publisher(port, number, total // publishers) for number in range(publishers)]
    for sender in senders:
        sender.start()
    blocked = stalled(senders, 120)
    blocked_after = time.monotonic() - started
    sampler.enter("stall")
    time.sleep(5)  # blocked: memory must stay put
    peak_blocked = sampler.phase_peak
    held = sum(sender.confirmed for sender in senders)
    received, disorder = drain(port, sum(sender.count for sender in senders), publishers, 600)
    for sender in senders:
        sender.join(60)
    seconds = time.monotonic() - started
    sampler.stopped.set()
    errors = [repr(sender.error) for sender in senders if sender.error is not None]
    mib = 2**20
    return (
        f"{name:<9} watermark {watermark / mib:,.0f} MiB; publishers {'stalled' if blocked else 'NOT STALLED'} "
        f"after {blocked_after:.1f} s with {held:,} confirmed; peak RSS while stalled {peak_blocked / mib:,.0f} MiB "
        f"({peak_blocked / watermark:.2f}x), over the run {sampler.peak / mib:,.0f} MiB "
        f"({sampler.peak / watermark:.2f}x); connection.blocked/unblocked seen "
        f"{sum(s.blocks for s in senders)}/{sum(s.unblocks for s in senders)}; "
        f"{received:,} of {sum(s.count for s in senders):,} received, {disorder} out of order, "
        f"{sum(s.confirmed for s in senders):,} confirmed; {seconds:.1f} s" + (f"; errors: {errors}" if errors else "")
    )


@contextmanager
def rabbitmq(watermark: int) -> Iterator[tuple[int, int]]:
    with rabbitmq_node(f"vm_memory_high_watermark.absolute = {watermark}\n") as (port, pid):
        yield port, pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watermark-mib", type=int, default=400)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args()
    watermark = args.watermark_mib * 2**20
    with postroom(f"limits: {{memory_high_watermark: {watermark}B}}\n") as (port, pid):
        print(flood("postroom", port, pid, watermark, args.publishers), flush=True)
    if not args.no_rabbitmq:
        with rabbitmq(watermark) as (port, pid):
            print(flood("rabbitmq", port, pid, watermark, args.publishers), flush=True)


if __name__ == "__main__":
    main()

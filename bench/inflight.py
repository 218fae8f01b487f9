"""Scale check: a million unacked deliveries under a visibility timeout, then all taken back.

Runs the sans-IO core on a simulated clock: one consumer without a prefetch limit receives
N messages from a queue with ``x-visibility-timeout`` and acks none; then the clock passes
the timeout and every delivery is taken back and redelivered. Prints the time of each phase,
the number of timers pending (one per queue, not one per message) and the peak RSS.

    python bench/inflight.py [--messages 1000000]
"""

from __future__ import annotations

import argparse
import gc
import resource
import time

from pamqp import commands
from twisted.internet.task import Clock

from postroom.broker.core.node import Node
from postroom.broker.tools.testing import Client, encode, publish_frames


def peak_rss_mb() -> float:
    """The process's peak resident set size in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=16)
    args = parser.parse_args()
    gc.freeze()
    gc.set_threshold(100_000, 20, 100)
    clock = Clock()
    node = Node(clock=clock)
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.call(1, commands.Queue.Declare(queue="work", arguments={"x-visibility-timeout": 30_000}))
    client.call(1, commands.Basic.Consume(queue="work", consumer_tag="slow"))
    queue = node.vhosts["/"].queues["work"]
    print(f"start: peak RSS {peak_rss_mb():.0f} MiB")

    batch = publish_frames(1, "", "work", b"x" * args.size) * 1000
    started = time.perf_counter()
    for _ in range(args.messages // 1000):
        client.connection.receive_data(batch)
        while node.backlogged:
            node.dispatch_backlogged()
        client.connection.data_to_send()
    delivered = time.perf_counter() - started
    print(
        f"delivered {queue.unacked_count:,} unacked in {delivered:.1f} s "
        f"({queue.unacked_count / delivered:,.0f}/s); timers pending: {len(clock.getDelayedCalls())}; "
        f"peak RSS {peak_rss_mb():.0f} MiB"
    )

    started = time.perf_counter()
    clock.advance(30)
    while node.backlogged:
        node.dispatch_backlogged()
        client.connection.data_to_send()
    client.connection.data_to_send()
    taken = time.perf_counter() - started
    print(
        f"took back {queue.visibility_timeouts:,} and redelivered them in {taken:.1f} s "
        f"({queue.visibility_timeouts / taken:,.0f}/s); unacked now {queue.unacked_count:,}; "
        f"timers pending: {len(clock.getDelayedCalls())}; peak RSS {peak_rss_mb():.0f} MiB"
    )
    client.send(encode(1, commands.Basic.Ack(delivery_tag=0, multiple=True)))
    print(f"after acking everything: unacked {queue.unacked_count}, ready {queue.message_count}")


if __name__ == "__main__":
    main()

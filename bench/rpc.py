"""RPC round trips with pika, over direct reply-to and over a queue per request, on Postroom and
RabbitMQ back to back.

One responder process consumes ``bench.rpc`` (prefetch 100, no-ack) and answers every request
to its ``reply-to`` with the request's ``correlation-id``. One requester sends requests one at a
time and waits for each answer, in one of two ways:

* ``direct``: it consumes from ``amq.rabbitmq.reply-to`` (no-ack) once and publishes every
  request with ``reply-to: amq.rabbitmq.reply-to`` (RabbitMQ's RPC tutorial, Spring's default);
* ``queue``: for every request it declares an exclusive server-named queue, consumes from
  it, publishes, waits, and deletes it (what RPC costs without direct reply-to).

Prints round trips per second and the p50 and p99 of the round trip, per broker and way, and
Postroom/RabbitMQ ratios.

    python bench/rpc.py                          # both brokers, both ways, 3 runs of 10 s
    python bench/rpc.py --no-rabbitmq --runs 1 --seconds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run import postroom  # noqa: E402

from postroom.broker.tools.testing import rabbitmq_node  # noqa: E402

QUEUE = "bench.rpc"
REPLY_TO = "amq.rabbitmq.reply-to"


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))


def respond(port: int, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """The responder: answer every request until the process is terminated."""
    channel = connect(port).channel()
    channel.queue_declare(QUEUE)
    channel.basic_qos(prefetch_count=100)

    def answer(ch: object, method: object, properties: pika.BasicProperties, body: bytes) -> None:
        channel.basic_publish(
            "", properties.reply_to, body, pika.BasicProperties(correlation_id=properties.correlation_id)
        )

    channel.basic_consume(QUEUE, answer, auto_ack=True)
    ready.set()
    channel.start_consuming()


def _collect(replies: list[str]) -> object:
    """A consumer callback that keeps each reply's correlation id."""
    return lambda channel, method, properties, body: replies.append(properties.correlation_id)


def request_direct(port: int, seconds: float) -> list[float]:
    """Round trips (seconds) over direct reply-to for ``seconds``."""
    connection = connect(port)
    channel = connection.channel()
    replies: list[str] = []
    channel.basic_consume(REPLY_TO, _collect(replies), auto_ack=True)
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        correlation = uuid.uuid4().hex
        started = time.perf_counter()
        channel.basic_publish("", QUEUE, b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id=correlation))
        while correlation not in replies:
            connection.process_data_events(time_limit=None)
        replies.clear()
        times.append(time.perf_counter() - started)
    connection.close()
    return times


def request_queue(port: int, seconds: float) -> list[float]:
    """Round trips (seconds) with an exclusive reply queue declared and deleted per request."""
    connection = connect(port)
    channel = connection.channel()
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        correlation = uuid.uuid4().hex
        started = time.perf_counter()
        reply_queue = channel.queue_declare("", exclusive=True).method.queue
        replies: list[str] = []
        tag = channel.basic_consume(reply_queue, _collect(replies), auto_ack=True)
        channel.basic_publish(
            "", QUEUE, b"ping", pika.BasicProperties(reply_to=reply_queue, correlation_id=correlation)
        )
        while correlation not in replies:
            connection.process_data_events(time_limit=None)
        channel.basic_cancel(tag)
        channel.queue_delete(reply_queue)
        times.append(time.perf_counter() - started)
    connection.close()
    return times


def run_once(port: int, way: str, seconds: float) -> tuple[float, float, float]:
    """(round trips per second, p50 ms, p99 ms) of one window."""
    ready = multiprocessing.Event()
    responder = multiprocessing.Process(target=respond, args=(port, ready), daemon=True)
    responder.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the responder did not start")
        times = (request_direct if way == "direct" else request_queue)(port, seconds)
    finally:
        responder.terminate()
        responder.join(10)
    cut = statistics.quantiles(times, n=100)
    return len(times) / sum(times), cut[49] * 1000, cut[98] * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ways", default="direct,queue")
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args(argv)
    ways = args.ways.split(",")
    with ExitStack() as stack:
        brokers = {"postroom": stack.enter_context(postroom())[0]}
        if not args.no_rabbitmq:
            brokers["rabbitmq"] = stack.enter_context(rabbitmq_node())[0]
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for run in range(args.runs):
            order = list(brokers) if run % 2 == 0 else list(reversed(brokers))
            for way in ways:
                for name in order:
                    figures = run_once(brokers[name], way, args.seconds)
                    results.setdefault((name, way), []).append(figures)
                    print(
                        f"{name} {way} run {run + 1}: {figures[0]:,.0f} round trips/s, "
                        f"p50 {figures[1]:.3f} ms, p99 {figures[2]:.3f} ms",
                        flush=True,
                    )
    print("\n| broker | way | round trips/s | p50 ms | p99 ms |\n|---|---|---:|---:|---:|")
    medians = {}
    for (name, way), runs in results.items():
        medians[name, way] = tuple(statistics.median(figure[i] for figure in runs) for i in range(3))
        rate, p50, p99 = medians[name, way]
        print(f"| {name} | {way} | {rate:,.0f} | {p50:.3f} | {p99:.3f} |")
    for way in ways:
        if ("rabbitmq", way) in medians:
            ours, theirs = medians["postroom", way], medians["rabbitmq", way]
            print(
                f"{way}: postroom/rabbitmq round trips {ours[0] / theirs[0]:.2f}x, "
                f"p50 {ours[1] / theirs[1]:.2f}x, p99 {ours[2] / theirs[2]:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Moving a queue into a two-node RabbitMQ cluster: Postroom's shovel against RabbitMQ's own.

Starts a two-node cluster of the installed ``rabbitmq-server`` (with its shovel plugins) and
a Postroom broker, all on loopback. For each mover in turn, fills a Postroom queue with
``--messages`` persistent messages of ``--size`` bytes, then declares one shovel moving that
queue into a quorum queue on the cluster (``on-confirm``, ``src-delete-after: queue-length``):
Postroom's in Postroom (``postroom migrate``'s shovel), RabbitMQ's in the cluster's first
node. Reports messages a second (from the shovel's declaration until the source queue is
empty and the shovel has ended) and the mover's resident memory: its peak during the move,
and before it. ::

    python bench/shovel.py --messages 1000000 --size 1024 [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from postroom.broker.clients.client import connect  # noqa: E402
from postroom.broker.tools.testing import (  # noqa: E402
    RABBITMQ_HOMES,
    MemoryReadings,
    free_port,
    process_memory,
    rabbitmq_cluster,
    wait_for_port,
)

PLUGINS = ("rabbitmq_management", "rabbitmq_shovel", "rabbitmq_shovel_management")
QUEUE = "bench.move"


def api(port: int, path: str, method: str = "GET", body: Any = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def fill(port: int, count: int, size: int) -> None:
    body = b"x" * size
    with connect(f"amqp://guest:guest@127.0.0.1:{port}/") as connection:
        connection.declare_queue(QUEUE, durable=True)
        connection.publish_batch((("", QUEUE, body) for _ in range(count)), window=2000)


def depth(port: int) -> int:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return int(connection.channel().queue_declare(QUEUE, durable=True, passive=True).method.message_count)
    finally:
        connection.close()


def move(mover: str, postroom: tuple[int, int, int], nodes: list[tuple[int, int]], count: int) -> dict[str, Any]:
    """One move by ``mover``: its rate and its memory."""
    port, http, pid = postroom
    (first, first_api), (second, _second_api) = nodes
    api(first_api, f"queues/%2F/{QUEUE}", "PUT", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    if mover == "postroom":
        where, mover_pid = http, pid
        targets = [f"amqp://guest:guest@127.0.0.1:{first}", f"amqp://guest:guest@127.0.0.1:{second}"]
        value = {"src-uri": "amqp://", "dest-uri": targets}
    else:
        where = first_api
        mover_pid = int((RABBITMQ_HOMES[first] / "pid").read_text().strip())
        value = {"src-uri": f"amqp://guest:guest@127.0.0.1:{port}", "dest-uri": "amqp://"}
    value.update(
        {"src-queue": QUEUE, "dest-queue": QUEUE, "src-delete-after": "queue-length", "ack-mode": "on-confirm"}
    )
    before = process_memory(mover_pid)
    peak = MemoryReadings(mover_pid)
    peak.start()
    started = time.monotonic()
    api(where, "parameters/shovel/%2F/bench", "PUT", {"value": value})
    while api(where, "parameters/shovel/%2F/bench") is not None or depth(port) > 0:
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    peak.stopped.set()
    peak.join()
    arrived = depth(first)
    api(first_api, f"queues/%2F/{QUEUE}", "DELETE")
    return {
        "mover": mover,
        "messages": count,
        "arrived": arrived,
        "seconds": round(elapsed, 2),
        "per_second": round(count / elapsed),
        "rss_before_mib": round(before / 2**20),
        "rss_peak_mib": round(peak.peak / 2**20),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--movers", default="postroom,rabbitmq")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="postroom-shovel-bench-"))
    port, http = free_port(), free_port()
    config = home / "postroom.yaml"
    config.write_text(
        f'listen: {{amqp: "tcp:{port}:interface=127.0.0.1", management: "tcp:{http}:interface=127.0.0.1"}}\n'
        f'storage: {{dir: "{home / "data"}", fsync: batch}}\n'
    )
    log = open(home / "broker.log", "ab")
    postroom = subprocess.Popen(
        [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)],
        cwd=ROOT, stdout=log, stderr=log, env=dict(os.environ),
    )  # fmt: skip
    results = []
    try:
        wait_for_port(port, 60)
        wait_for_port(http, 60)
        with rabbitmq_cluster(2, PLUGINS) as nodes:
            for mover in args.movers.split(","):
                started = time.monotonic()
                fill(port, args.messages, args.size)
                print(
                    f"filled {args.messages:,} messages of {args.size} B in {time.monotonic() - started:.1f} s",
                    flush=True,
                )
                result = move(mover, (port, http, postroom.pid), nodes, args.messages)
                results.append(result)
                print(
                    f"{mover:9} moved {result['arrived']:,} in {result['seconds']} s: {result['per_second']:,} msg/s;"
                    f" its RSS {result['rss_before_mib']} MiB before, {result['rss_peak_mib']} MiB at the peak",
                    flush=True,
                )
    finally:
        postroom.terminate()
        postroom.wait(30)
        log.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

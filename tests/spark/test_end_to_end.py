"""End to end: a real broker dead-letters for every reason, the Spark job reports exactly that.

The broker runs as ``postroom serve`` over a data directory; pika drives traffic that
dead-letters messages from two queues into two dead-letter queues, for every reason
(rejected, delivery_limit through visibility timeouts, expired, maxlen), consumes some dead
letters and leaves the others. After a graceful stop the job runs in the shared local
SparkSession, over the raw segments and then over their Parquet export; afterwards
``postroom dlq redrive --ids`` moves the dead letters of the job's redrive list back.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pika = pytest.importorskip("pika")

from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER  # noqa: E402
from postroom.broker.tools.testing import free_port  # noqa: E402
from postroom.spark.export import export  # noqa: E402
from postroom.spark.job import run  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

#: Bound on every wait for the broker's timers (visibility timeouts, TTLs).
WAIT = 15.0


@contextmanager
def serve(data: Path) -> Iterator[int]:
    """``postroom serve`` over ``data`` on a free loopback port; stopped gracefully (SIGTERM)."""
    port = free_port()
    config = data.parent / "broker.yaml"
    config.write_text(
        f'listen: {{amqp: "tcp:{port}:interface=127.0.0.1", metrics: false, management: false}}\n'
        f'storage: {{dir: "{data}"}}\n'
    )
    log = open(data.parent / "broker.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    try:
        wait_until(lambda: process.poll() is not None or socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        assert process.poll() is None, (data.parent / "broker.log").read_text()[-2000:]
        yield port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        log.close()


def wait_until(condition: Callable[[], object]) -> None:
    """Poll ``condition`` (real broker timers) until true, for at most :data:`WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the broker"
        time.sleep(0.02)


def count(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def traffic(port: int) -> set[int]:
    """Dead-letter 8 messages for every reason; consume 3 of them; return the consumed ids."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
    channel = connection.channel()
    persistent = pika.BasicProperties(delivery_mode=2, headers={"tenant": "acme"})
    for name in ("dlx.a", "dlx.b"):
        channel.exchange_declare(name, "fanout", durable=True)
    for dlq, dlx in (("dlq.a", "dlx.a"), ("dlq.b", "dlx.b")):
        channel.queue_declare(dlq, durable=True)
        channel.queue_bind(dlq, dlx)
    channel.queue_declare(
        "work.a",
        durable=True,
        arguments={"x-dead-letter-exchange": "dlx.a", "x-delivery-limit": 1, "x-visibility-timeout": 200},
    )
    channel.queue_declare("work.b", durable=True, arguments={"x-dead-letter-exchange": "dlx.b", "x-max-length": 2})
    channel.confirm_delivery()

    # work.a: three rejected (no returns before dying)...
    for n in range(3):
        channel.basic_publish("", "work.a", b"reject %d" % n, persistent)
    for _ in range(3):
        method, _properties, _body = channel.basic_get("work.a")
        channel.basic_reject(method.delivery_tag, requeue=False)
    wait_until(lambda: count(channel, "dlq.a") == 3)
    # ... and two past the delivery limit of 1: taken, left unacked, taken back by the visibility
    # timeout (return 1), taken again, taken back again (return 2 > 1: dead-lettered).
    for n in range(2):
        channel.basic_publish("", "work.a", b"poison %d" % n, pika.BasicProperties(delivery_mode=2))
    for _round in range(2):
        taken = 0
        deadline = time.monotonic() + WAIT
        while taken < 2:
            assert time.monotonic() < deadline, "the visibility timeout did not return the messages"
            method, _properties, _body = channel.basic_get("work.a")
            if method is None:
                time.sleep(0.02)
                continue
            taken += 1
    wait_until(lambda: count(channel, "dlq.a") == 5)

    # work.b: two expired (per-message TTL), then one dropped from the head by the length limit.
    for n in range(2):
        channel.basic_publish("", "work.b", b"late %d" % n, pika.BasicProperties(delivery_mode=2, expiration="50"))
    wait_until(lambda: count(channel, "dlq.b") == 2)
    for n in range(3):
        channel.basic_publish("", "work.b", b"full %d" % n, pika.BasicProperties(delivery_mode=2))
    wait_until(lambda: count(channel, "dlq.b") == 3)

    # Consume the two oldest of dlq.a (rejected ones) and the oldest of dlq.b (an expired one).
    consumed = set()
    for queue, n in (("dlq.a", 2), ("dlq.b", 1)):
        for _ in range(n):
            method, properties, _body = channel.basic_get(queue)
            consumed.add(int(properties.headers[DEAD_LETTER_ID_HEADER]))
            channel.basic_ack(method.delivery_tag)
    connection.close()
    return consumed


def job(spark: Any, out: Path, **options: Any) -> dict[str, Any]:
    args = argparse.Namespace(
        input=options.get("input", []),
        segments=options.get("segments"),
        out=str(out),
        master=None,
        redrive_where=options.get("redrive_where"),
        redrive_all=False,
        rows=options.get("rows", False),
    )
    return run(spark, args, say=lambda _message: None)


def test_the_job_reports_exactly_what_the_broker_dead_lettered(spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data) as port:
        consumed = traffic(port)
    segments = data / "deadletters"

    raw = tmp_path / "raw"
    summary = job(spark, raw, segments=str(segments), redrive_where="reason = 'rejected'", rows=True)
    expected = {
        "total": 8,
        "pending": 5,
        "by_reason": {"delivery_limit": 2, "expired": 2, "maxlen": 1, "rejected": 3},
        "by_queue": {"work.a": 5, "work.b": 3},
        "by_dlq": {"dlq.a": 5, "dlq.b": 3},
        "corrupt_records": 0,
    }
    assert {key: summary[key] for key in expected} == expected
    assert json.loads((raw / "summary.json").read_text()) == summary
    rows = spark.read.parquet(str(raw / "dead_letters")).collect()
    assert sorted((r["reason"], r["delivery_count"]) for r in rows) == sorted(
        [("rejected", 0)] * 3 + [("delivery_limit", 2)] * 2 + [("expired", 0)] * 2 + [("maxlen", 0)]
    )
    assert {r["dead_letter_id"] for r in rows if not r["pending"]} == consumed
    assert {r["headers"]["tenant"] for r in rows if r["reason"] == "rejected"} == {"acme"}
    assert all(r["first_death_time"] <= r["last_death_time"] for r in rows)
    pending_rejected = {r["dead_letter_id"] for r in rows if r["reason"] == "rejected" and r["pending"]}
    listed = [line for line in (raw / "redrive.txt").read_text().splitlines() if not line.startswith("#")]
    assert {int(line) for line in listed} == pending_rejected and len(pending_rejected) == 1
    html = (raw / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4

    # The same answer from the Parquet export (the broker is stopped: the last segment too).
    parquet = tmp_path / "parquet"
    assert export(str(segments), str(parquet), include_last=True).rows > 0
    exported = job(spark, tmp_path / "exported", input=[str(parquet)], segments=str(segments))
    assert {key: exported[key] for key in expected} == expected
    assert not (tmp_path / "exported" / "dead_letters").exists()  # the rows only with --rows

    # The redrive list moves exactly that dead letter back to work.a, after a restart.
    with serve(data) as port:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "postroom.broker.tools.cli",
                "dlq",
                "redrive",
                "dlq.a",
                "--ids",
                str(raw / "redrive.txt"),
                "--url",
                f"amqp://guest:guest@127.0.0.1:{port}/",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "moved 1 message(s)" in result.stdout
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        assert count(channel, "dlq.a") == 2
        method, _properties, body = channel.basic_get("work.a", auto_ack=True)
        assert body == b"reject 2"
        connection.close()

    # The redriven dead letter left dlq.a in the second run (known by its header after
    # recovery): it is no longer pending.
    again = job(spark, tmp_path / "again", segments=str(segments))
    assert (again["total"], again["pending"]) == (8, 4)

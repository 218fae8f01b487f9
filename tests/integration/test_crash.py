"""kill -9 the real broker process while a publisher waits for confirms: nothing confirmed is lost.

Each cycle starts ``postroom serve`` on a fresh port over the same data directory, publishes
persistent messages with confirms from a thread, kills the broker with SIGKILL at a random
moment, and starts it again. At the end every confirmed message must be in the queue;
duplicates (published again after a lost confirm) are allowed and counted.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom.broker.clients.client import connect
from postroom.broker.tools.testing import free_port, wait_for_port
from postroom.broker.wal.records import Snapshot
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, iter_records

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def broker(
    data: Path,
    segment_bytes: str = "64MiB",
    memory_budget: str = "256MiB",
    management: int = 0,
    checkpoint_bytes: str = "16MiB",
    limits: str = "",
    extra: str = "",
    metrics: int = 0,
    amqps: int = 0,
    port: int = 0,
    stream: int = 0,
    stream_tls: int = 0,
    mqtt: int = 0,
    mqtt_ws: int = 0,
    mqtt_tls: int = 0,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``postroom serve`` over ``data``; with ``management``, its management API on that port
    (with ``metrics``, ``/metrics`` on that one; with ``amqps``, AMQP over TLS on that one, which
    needs a ``tls:`` section in ``extra``);
    ``stream``: the stream protocol's port (none when 0), ``stream_tls`` its TLS port (which needs
    a ``tls:`` section in ``extra``); ``mqtt``: MQTT's port (none when 0), ``mqtt_ws`` MQTT over
    WebSockets', ``mqtt_tls`` MQTT over TLS' (which needs a ``tls:`` section in ``extra``);
    ``limits``: the ``limits:`` keys, such as ``memory_high_watermark: 150MiB``; ``extra``: more
    of the configuration (YAML lines); ``port``: AMQP's port (a free one when 0)."""
    port = port or free_port()
    config = data.parent / f"broker-{port}.yaml"
    api = f'"tcp:{management}:interface=127.0.0.1"' if management else "false"
    scrape = f'"tcp:{metrics}:interface=127.0.0.1"' if metrics else "false"
    tls = f', amqps: "tcp:{amqps}:interface=127.0.0.1"' if amqps else ""
    tls += f', stream: "tcp:{stream}:interface=127.0.0.1"' if stream else ""
    tls += f', stream_tls: "tcp:{stream_tls}:interface=127.0.0.1"' if stream_tls else ""
    tls += f', mqtt: "tcp:{mqtt}:interface=127.0.0.1"' if mqtt else ""
    tls += f', mqtt_ws: "tcp:{mqtt_ws}:interface=127.0.0.1"' if mqtt_ws else ""
    tls += f', mqtt_tls: "tcp:{mqtt_tls}:interface=127.0.0.1"' if mqtt_tls else ""
    config.write_text(
        f'listen: {{amqp: "tcp:{port}:interface=127.0.0.1", metrics: {scrape}, management: {api}{tls}}}\n'
        f'storage: {{dir: "{data}", fsync: batch, segment_bytes: {segment_bytes}, memory_budget: {memory_budget}, '
        f"checkpoint_bytes: {checkpoint_bytes}, archive: {{enabled: true, retention: 7d, max_bytes: 1GiB}}}}\n"
        + (f"limits: {{{limits}}}\n" if limits else "")
        + extra
    )
    log_path = data.parent / "broker.log"
    # This start's listening line: the port answering could be another test's broker that took
    # the same free port meanwhile.
    listening = f"AMQPServerFactory starting on {port}\n"
    before = log_path.read_text().count(listening) if log_path.exists() else 0
    log = open(log_path, "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 60  # a start that reads a whole log of a million messages
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0 and log_path.read_text().count(listening) > before:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(f"broker did not start: {(data.parent / 'broker.log').read_text()[-2000:]}")
            time.sleep(0.05)
        # The other listeners open after AMQP's: a test may go straight to one of them.
        for other in (amqps, stream, stream_tls, mqtt, mqtt_ws, mqtt_tls, management, metrics):
            if other:
                wait_for_port(other, max(1.0, deadline - time.monotonic()))
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        log.close()


def publish_until_killed(port: int, start: int, confirmed: list[int], stop: threading.Event) -> None:
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        channel.queue_declare("crash", durable=True)
        channel.confirm_delivery()
        number = start
        while not stop.is_set():
            channel.basic_publish("", "crash", b"%d" % number, pika.BasicProperties(delivery_mode=2))
            confirmed.append(number)  # basic_publish returned: the broker confirmed it
            number += 1
    except Exception:  # noqa: BLE001 - the broker was killed under the publisher
        return


def kill_while_publishing(data: Path, rng: random.Random, publish: Callable[..., None], *args: Any) -> None:
    """Start the broker over ``data``, run ``publish(port, *args, stop)`` on a thread, and kill
    the broker with SIGKILL at a random moment."""
    with broker(data) as (process, port):
        stop = threading.Event()
        publisher = threading.Thread(target=publish, args=(port, *args, stop), daemon=True)
        publisher.start()
        time.sleep(rng.uniform(0.3, 0.8))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        stop.set()
        publisher.join(10)


def test_no_confirmed_message_is_lost_across_sigkills(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random(20261122)
    confirmed: list[int] = []
    for cycle in range(3):
        kill_while_publishing(data, rng, publish_until_killed, cycle * 1_000_000, confirmed)
    assert len(confirmed) > 100
    with broker(data) as (_process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        found: list[int] = []
        while True:
            method, _properties, body = channel.basic_get("crash", auto_ack=True)
            if method is None:
                break
            found.append(int(body))
        connection.close()
    missing = set(confirmed) - set(found)
    assert missing == set()
    duplicates = len(found) - len(set(found))
    print(f"confirmed {len(confirmed)}, recovered {len(found)}, duplicates {duplicates}")


def test_rotated_segments_start_with_the_topology_and_recover_every_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data, segment_bytes="32KiB") as (process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("rotated", durable=True)
        channel.queue_bind("rotated", "orders", "k")
        channel.confirm_delivery()
        for number in range(200):
            channel.basic_publish("orders", "k", b"%04d" % number + b"x" * 1000, pika.BasicProperties(delivery_mode=2))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    segments = sorted(data.glob("*.wal"))
    assert len(segments) >= 5
    for segment in segments[1:]:
        first = next(iter_records(segment.read_bytes(), SEGMENT_HEADER_BYTES))[2]
        assert first == Snapshot(True)
    with broker(data, segment_bytes="32KiB") as (_process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        assert channel.queue_declare("rotated", passive=True).method.message_count == 200
        channel.basic_publish("orders", "k", b"routed after recovery")
        assert channel.queue_declare("rotated", passive=True).method.message_count == 201
        channel.confirm_delivery()
        for _ in range(201):
            method, _properties, _body = channel.basic_get("rotated")
            channel.basic_ack(method.delivery_tag)
        channel.basic_publish("orders", "k", b"last", pika.BasicProperties(delivery_mode=2))
        connection.close()
    remaining = sorted(data.glob("*.wal"))
    assert len(remaining) == 1  # every segment before the active one held only consumed messages
    assert remaining[0].name >= segments[-1].name
    archived = sorted(path.name for path in (data / "archive").glob("*.wal"))
    every = [f"{number:020d}.wal" for number in range(1, int(remaining[0].stem))]
    assert archived == every  # every retired segment is kept for the Spark job


def test_a_long_lived_message_does_not_pin_old_segments(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data, segment_bytes="32KiB") as (process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        channel.queue_declare("keep", durable=True)
        channel.queue_declare("churn", durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", "keep", b"long-lived", pika.BasicProperties(delivery_mode=2))
        for _ in range(200):
            channel.basic_publish("", "churn", b"x" * 1000, pika.BasicProperties(delivery_mode=2))
        for _ in range(200):
            method, _properties, _body = channel.basic_get("churn")
            channel.basic_ack(method.delivery_tag)
        for _ in range(3):  # more writes: the sparse first segment is copied forward and retired
            channel.basic_publish("", "churn", b"tick", pika.BasicProperties(delivery_mode=2))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert len(list(data.glob("*.wal"))) <= 2
    with broker(data, segment_bytes="32KiB") as (_process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        assert channel.basic_get("keep", auto_ack=True)[2] == b"long-lived"
        assert channel.queue_declare("churn", passive=True).method.message_count == 3
        connection.close()


def test_bodies_beyond_the_memory_budget_come_back_from_the_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    bodies = [b"%04d" % number + bytes([number % 256]) * 2000 for number in range(300)]
    with broker(data, segment_bytes="64KiB", memory_budget="16KiB") as (process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        channel.queue_declare("paged", durable=True)
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", "paged", body, pika.BasicProperties(delivery_mode=2))
        connection.close()
        process.send_signal(signal.SIGKILL)
    with broker(data, segment_bytes="64KiB", memory_budget="16KiB") as (_process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        received = []
        for _ in bodies:
            method, _properties, body = channel.basic_get("paged")
            received.append(body)
            channel.basic_ack(method.delivery_tag)
        connection.close()
    assert received == bodies
    log = (tmp_path / "broker.log").read_text()
    assert "are paged out to the log" in log
    paged = [
        int(line.split(" bodies left in the log")[0].rsplit(" ", 1)[1])
        for line in log.splitlines()
        if "left in the log" in line
    ]
    assert paged[-1] > 250  # after the restart, only about 16 KiB of bodies were loaded


def test_a_policy_set_from_the_command_line_outlives_kills_and_retired_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from postroom.broker.tools.cli import main

    data = tmp_path / "data"
    http = free_port()
    url = f"http://guest:guest@127.0.0.1:{http}/"

    def reject_one(channel: Any) -> None:
        channel.basic_publish("", "orders.eu", b"refused", pika.BasicProperties(delivery_mode=2))
        method, _properties, _body = channel.basic_get("orders.eu")
        channel.basic_reject(method.delivery_tag, requeue=False)

    def dead_letters(channel: Any) -> int:
        return int(channel.queue_declare("dead", durable=True, passive=True).method.message_count)

    with broker(data, segment_bytes="32KiB", management=http) as (process, port):
        channel = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5)).channel()
        channel.exchange_declare("dlx", "fanout", durable=True)
        channel.queue_declare("dead", durable=True)
        channel.queue_bind("dead", "dlx")
        channel.queue_declare("orders.eu", durable=True)
        channel.confirm_delivery()
        assert main(["policies", "set", "DLX", r"^orders\.", '{"dead-letter-exchange": "dlx"}', "--url", url]) == 0
        assert capsys.readouterr().out == "policy 'DLX' set on vhost '/'\n"
        # The command returned once the policy was durable: a kill right after keeps it.
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(data, segment_bytes="32KiB", management=http) as (process, port):
        channel = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5)).channel()
        channel.confirm_delivery()
        reject_one(channel)
        assert dead_letters(channel) == 1
        # Enough churn that the segment holding the policy's record is retired: the snapshot at
        # the head of each new segment carries the policy on.
        for _ in range(100):
            channel.basic_publish("", "orders.eu", b"x" * 1000, pika.BasicProperties(delivery_mode=2))
        for _ in range(100):
            method, _properties, _body = channel.basic_get("orders.eu")
            channel.basic_ack(method.delivery_tag)
        channel.basic_publish("", "orders.eu", b"tick", pika.BasicProperties(delivery_mode=2))
        assert not (data / "00000000000000000001.wal").exists()
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(data, segment_bytes="32KiB", management=http) as (_process, port):
        channel = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5)).channel()
        channel.basic_get("orders.eu", auto_ack=True)  # the tick
        reject_one(channel)
        assert dead_letters(channel) == 2
        assert main(["policies", "list", "--url", url, "--json"]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(policy["name"], policy["definition"]) for policy in listed] == [
            ("DLX", {"dead-letter-exchange": "dlx"})
        ]
        assert main(["policies", "clear", "DLX", "--url", url]) == 0
        reject_one(channel)
        assert dead_letters(channel) == 2  # cleared: the next reject is dropped
        assert main(["policies", "clear", "DLX", "--url", url]) == 1
        assert "HTTP 404: Not Found" in capsys.readouterr().err


def deep_body(number: int) -> bytes:
    """Message ``number`` of the deep backlog: 16 bytes, its number and a byte that depends on it."""
    return b"%09d" % number + bytes([number % 251]) * 7


def publish_chunks(port: int, numbers: range, confirmed: list[int], stop: threading.Event) -> None:
    """Publish ``numbers`` to ``deep`` in confirmed chunks of 500 until ``stop`` or the broker dies."""
    try:
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=10, reconnect=False) as connection:
            for start in range(numbers.start, numbers.stop, 500):
                if stop.is_set():
                    return
                chunk = range(start, min(start + 500, numbers.stop))
                connection.publish_batch((("", "deep", deep_body(n)) for n in chunk), window=500, persistent=True)
                confirmed.extend(chunk)  # publish_batch returned: every one of them is confirmed
    except Exception:  # noqa: BLE001 - the broker was killed under the publisher
        return


def consume_some(port: int, acked: set[int], rng: random.Random, stop: threading.Event) -> None:
    """Take messages from the head of ``deep``: ack most, return some (their delivery counts go up)."""
    try:
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=10, reconnect=False) as connection:
            for message in connection.consume("deep", prefetch=200, timeout=5):
                if stop.is_set():
                    return
                if rng.random() < 0.1:
                    message.nack(requeue=True)
                else:
                    acked.add(int(message.body[:9]))  # before the ack: it may be gone once sent
                    message.ack()
    except Exception:  # noqa: BLE001 - the broker was killed under the consumer
        return


@pytest.mark.hang_timeout(900)
def test_no_confirmed_message_is_lost_across_kills_during_checkpoints_with_a_million_queued(tmp_path: Path) -> None:
    """20 SIGKILLs while a million messages are queued, publishers and consumers run, and
    checkpoints are taken every 256 KiB of log; half of the kills land while a checkpoint is
    being written. Every confirmed message is there at the end, with its bytes, unless a
    consumer acked it."""
    data = tmp_path / "data"
    backlog = 1_000_000
    rng = random.Random(20261126)
    confirmed: list[int] = []
    acked: set[int] = set()
    with broker(data, checkpoint_bytes="256KiB") as (_process, port):
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=120, reconnect=False) as connection:
            connection.declare_queue("deep", durable=True)
            connection.publish_batch((("", "deep", deep_body(n)) for n in range(backlog)), window=1000, persistent=True)
        confirmed.extend(range(backlog))
    during_checkpoint = 0
    for cycle in range(20):
        with broker(data, checkpoint_bytes="256KiB") as (process, port):
            stop = threading.Event()
            first = backlog + cycle * 1_000_000
            workers = [
                threading.Thread(target=publish_chunks, args=(port, range(first, first + 1_000_000), confirmed, stop)),
                threading.Thread(target=consume_some, args=(port, acked, random.Random(cycle), stop)),
            ]
            for worker in workers:
                worker.start()
            deadline = time.monotonic() + rng.uniform(0.5, 2.0)
            # Odd cycles: kill as soon as a checkpoint is being written (its directory exists).
            while time.monotonic() < deadline and not (cycle % 2 and (data / "checkpoint.new").exists()):
                time.sleep(0.0005 if cycle % 2 else 0.01)
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            stop.set()
            for worker in workers:
                worker.join(15)
        during_checkpoint += (data / "checkpoint.new").exists()  # the kill found one half written
    with broker(data, checkpoint_bytes="256KiB") as (_process, port):
        found: list[int] = []
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=120, reconnect=False) as connection:
            for message in connection.consume("deep", prefetch=1000, timeout=10):
                number = int(message.body[:9])
                assert message.body == deep_body(number)
                found.append(number)
                message.ack()
    log = (tmp_path / "broker.log").read_text()
    missing = set(confirmed) - set(found) - acked
    assert missing == set(), f"{len(missing)} confirmed messages lost, such as {sorted(missing)[:5]}"
    assert len(set(confirmed)) >= backlog + 20_000 and len(acked) > 1000
    assert during_checkpoint >= 3, during_checkpoint
    assert log.count("from the checkpoint at segment") >= 20  # every start read a checkpoint and the log after it
    assert "Traceback" not in log
    print(
        f"confirmed {len(set(confirmed))}, acked {len(acked)}, found {len(found)}, killed while a checkpoint was"
        f" written: {during_checkpoint} of 20"
    )


def publish_to_stream_until_killed(port: int, confirmed: list[int], stop: threading.Event) -> None:
    """Publish numbered messages to stream ``events`` with confirms, pipelined 100 at a time
    (so chunks hold many), noting those confirmed, until the broker dies."""
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        number = len(confirmed)
        while not stop.is_set():
            channel.basic_publish("", "events", b"%d" % number)
            confirmed.append(number)
            number += 1
    except Exception:  # noqa: BLE001 - the broker was killed under the publisher
        return


def read_stream(port: int, queue: str, offset: Any, expected: int) -> list[tuple[int, int]]:
    """``(offset, number)`` of each message read from ``offset`` until ``expected`` came (or 10 s passed)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    got: list[tuple[int, int]] = []

    def on(_channel: Any, method: Any, properties: Any, body: bytes) -> None:
        got.append((properties.headers["x-stream-offset"], int(body)))
        _channel.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on, arguments={"x-stream-offset": offset})
    deadline = time.monotonic() + 10
    while len(got) < expected and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    connection.close()
    return got


def test_a_streams_confirmed_messages_survive_sigkills_and_read_back_in_order(tmp_path: Path) -> None:
    data = tmp_path / "data"
    confirmed: list[int] = []
    with broker(data) as (_process, port):
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/", heartbeat=0, timeout=30, reconnect=False) as client:
            client.declare_queue("events", arguments={"x-queue-type": "stream"})
            client.publish_batch(("", "events", b"%d" % number) for number in range(20_000))  # all confirmed
        confirmed += range(20_000)
    rng = random.Random(20261128)
    for _cycle in range(2):
        kill_while_publishing(data, rng, publish_to_stream_until_killed, confirmed)
    with broker(data) as (_process, port):
        got = read_stream(port, "events", "first", len(confirmed))
        from_offset = read_stream(port, "events", 19_990, 10)
    offsets = [offset for offset, _number in got]
    assert offsets == list(range(len(got)))  # in order, no gap, nothing twice
    numbers = [number for _offset, number in got]
    assert numbers[:20_000] == list(range(20_000))
    assert set(confirmed) <= set(numbers)
    assert from_offset[:10] == [(offset, offset) for offset in range(19_990, 20_000)]

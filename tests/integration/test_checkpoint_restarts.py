"""A clean stop writes a checkpoint and the next start uses it instead of reading the log; a
crash after that is recovered from it and the log after it; a damaged one is not used."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pika

from postroom.broker.storage.checkpoint import CHECKPOINT_DIR, MANIFEST
from postroom.broker.storage.spool_files import SPOOL_WINDOW
from tests.integration.test_crash import broker


def connect(port: int) -> tuple[pika.BlockingConnection, pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
    channel = connection.channel()
    channel.queue_declare("deep", durable=True)
    channel.queue_declare("marks", durable=True)
    channel.confirm_delivery()
    return connection, channel


def publish(channel: pika.adapters.blocking_connection.BlockingChannel, bodies: list[bytes], first: int = 0) -> None:
    for number, body in enumerate(bodies, first):
        channel.basic_publish("", "deep", body, pika.BasicProperties(delivery_mode=2, headers={"n": number}))


def terminate(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0


def consume(channel: pika.adapters.blocking_connection.BlockingChannel, count: int) -> list[tuple[bytes, bool, dict]]:
    got = []
    channel.basic_qos(prefetch_count=200)
    for method, properties, body in channel.consume("deep", inactivity_timeout=10):
        assert method is not None, f"only {len(got)} of {count} came"
        got.append((body, method.redelivered, properties.headers))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_a_clean_stop_is_started_from_its_checkpoint_and_a_crash_after_it_from_the_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "broker.log"
    count = 3 * SPOOL_WINDOW
    bodies = [b"%06d" % number + bytes([number % 256]) * 40 for number in range(count)]
    with broker(data) as (process, port):
        connection, channel = connect(port)
        publish(channel, bodies)
        method, _properties, _body = channel.basic_get("deep")
        channel.basic_nack(method.delivery_tag, requeue=True)  # delivered once: x-delivery-count 1
        connection.close()
        terminate(process)
    assert f"checkpoint written: {count} message(s) in 2 durable queue(s)" in log.read_text()
    assert (data / CHECKPOINT_DIR / MANIFEST).exists()

    half = count // 2
    with broker(data) as (_process, port):
        assert (
            f"recovered {count} message(s) in 2 durable queue(s) from the checkpoint at segment 1 and the"
            " 0 record(s) (0 bytes) logged after it"
        ) in log.read_text()
        connection, channel = connect(port)
        assert channel.queue_declare("deep", passive=True).method.message_count == count
        got = consume(channel, half)
        # Confirmed after the acks: the log holds them once this returns.
        channel.basic_publish("", "marks", b"after the acks", pika.BasicProperties(delivery_mode=2))
    assert [body for body, _redelivered, _headers in got] == bodies[:half]
    assert all(redelivered for _body, redelivered, _headers in got)
    assert [headers.get("x-delivery-count", 0) for _body, _redelivered, headers in got[:2]] == [1, 0]

    with broker(data) as (_process, port):  # after a SIGKILL: from the same checkpoint, and the log after it
        text = log.read_text().rsplit("AMQPServerFactory starting", 1)[0]
        assert f"recovered {count - half + 1} message(s) in 2 durable queue(s) from the checkpoint at segment 1" in text
        assert "and the 0 record(s)" not in text.rsplit("recovered", 1)[1]
        connection, channel = connect(port)
        rest = consume(channel, count - half)
        connection.close()
    assert [body for body, _redelivered, _headers in rest] == bodies[half:]
    assert [headers["n"] for _body, _redelivered, headers in rest] == list(range(half, count))
    assert "Traceback" not in log.read_text()


def test_a_checkpoint_is_recovered_with_the_log_after_it_and_a_damaged_one_is_not_used(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "broker.log"
    bodies = [b"m%d" % number for number in range(300)]
    with broker(data) as (process, port):
        _connection, channel = connect(port)
        publish(channel, bodies[:200])
        terminate(process)
    with broker(data) as (_process, port):  # from the checkpoint; then written to, and killed
        _connection, channel = connect(port)
        publish(channel, bodies[200:], 200)
        for _ in range(10):  # acked after the checkpoint
            method, _properties, _body = channel.basic_get("deep")
            channel.basic_ack(method.delivery_tag)
        channel.basic_publish("", "marks", b"after the acks", pika.BasicProperties(delivery_mode=2))

    with broker(data) as (process, port):
        text = log.read_text().rsplit("Received SIGTERM", 1)[1]
        found = re.search(
            r"recovered 291 message\(s\) in 2 durable queue\(s\) from the checkpoint at segment 1 and the"
            r" (\d+) record\(s\)",
            text,
        )
        # 101 publishes and the acks: one removal each, or fewer (acks of one write are one record)
        assert found is not None and 102 <= int(found[1]) <= 111, text[-2000:]
        connection, channel = connect(port)
        assert channel.queue_declare("deep", passive=True).method.message_count == 290
        connection.close()
        terminate(process)
    (head,) = (data / CHECKPOINT_DIR).glob("*.head")
    head.unlink()  # a checkpoint with a file missing
    with broker(data) as (_process, port):
        text = log.read_text().rsplit("Received SIGTERM", 1)[1]
        assert "the checkpoint is not used (it is damaged or incomplete" in text
        assert "recovered 291 message(s) in 2 durable queue(s) from 1 segment(s)" in text
        connection, channel = connect(port)
        assert [body for body, _redelivered, _headers in consume(channel, 290)] == bodies[10:]
        connection.close()
    assert "Traceback" not in log.read_text()

"""A restart, side by side with RabbitMQ 3.10: what a durable queue holds after a clean stop.

Each broker runs as its own process on its own storage. Eight persistent messages go to a
durable queue with confirms; a client takes five, acks two, returns one, and still holds two
when the broker is stopped with SIGTERM. Started again on the same storage, the queue must
hold the same messages in the same order on both. RabbitMQ flags only the messages it had
delivered as redelivered; Postroom flags every recovered message (docs/rabbitmq-compatibility.md,
"Differences from RabbitMQ"), so the flags are compared as: every message RabbitMQ flags, Postroom flags too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from postroom.broker.tools.testing import RABBITMQ_LAUNCHER, free_port, rabbitmq_environment, wait_for_port
from tests.integration.test_crash import broker as postroom

pytestmark = pytest.mark.integration

QUEUE = "restart-order"
MESSAGES = 8


@contextlib.contextmanager
def rabbitmq(home: Path, port: int, dist_port: int) -> Iterator[Path]:
    """A RabbitMQ node keeping everything under ``home`` (started again on it, it finds its
    queues); yields its pid file. Killed on the way out unless it stopped already."""
    process = subprocess.Popen(
        [str(RABBITMQ_LAUNCHER)],
        env=rabbitmq_environment(home, port, dist_port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, 60)
        yield home / "pid"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(20)
        subprocess.run(["pkill", "-9", "-f", f"postroom{port}@localhost"], check=False)


def stop_rabbitmq(pid_file: Path) -> None:
    """SIGTERM to the Erlang VM (a clean stop); returns once it is gone."""
    pid = int(pid_file.read_text().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "RabbitMQ did not stop within 60 s"
        time.sleep(0.1)


def before_the_stop(port: int) -> pika.BlockingConnection:
    """Publish, take, ack and return; the connection stays open, holding ``m0`` and ``m2``."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.confirm_delivery()
    for number in range(MESSAGES):
        channel.basic_publish("", QUEUE, b"m%d" % number, pika.BasicProperties(delivery_mode=2))
    tags = []
    for _ in range(5):
        method, _properties, _body = channel.basic_get(QUEUE)
        assert method is not None
        tags.append(method.delivery_tag)
    channel.basic_ack(tags[1])
    channel.basic_ack(tags[3])
    channel.basic_reject(tags[4], requeue=True)
    channel.queue_declare(QUEUE, durable=True, passive=True)  # a round trip: the acks are in
    return connection


def after_the_start(port: int) -> list[tuple[bytes, bool]]:
    """Every message the queue holds, in order, with its redelivered flag."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
    channel = connection.channel()
    got = []
    while True:
        method, _properties, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    connection.close()
    return got


def forget(connection: pika.BlockingConnection) -> None:
    """Close a connection whose broker has stopped."""
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection.close()


@pytest.mark.hang_timeout(240)
def test_a_clean_stop_keeps_the_queue_as_rabbitmq_does(tmp_path: Path) -> None:
    if not RABBITMQ_LAUNCHER.exists():
        pytest.skip("no RabbitMQ to compare with: apt-get install -y rabbitmq-server")
    home = tmp_path / "rabbitmq"
    home.mkdir()
    (home / "enabled_plugins").write_text("[].\n")
    port, dist_port = free_port(), free_port()
    try:
        with rabbitmq(home, port, dist_port) as pid_file:
            held = before_the_stop(port)
            stop_rabbitmq(pid_file)
            forget(held)
    except TimeoutError as stuck:
        pytest.skip(f"RabbitMQ is installed but did not start here: {stuck}")
    with rabbitmq(home, port, dist_port) as pid_file:
        expected = after_the_start(port)
        stop_rabbitmq(pid_file)

    data = tmp_path / "postroom"
    with postroom(data) as (process, broker_port):
        held = before_the_stop(broker_port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        forget(held)
    with postroom(data) as (process, broker_port):
        actual = after_the_start(broker_port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0

    assert len(expected) == MESSAGES - 2  # the two acked are gone, the two held are back
    assert [body for body, _redelivered in actual] == [body for body, _redelivered in expected]
    flagged = {body for body, redelivered in expected if redelivered}
    assert flagged <= {body for body, redelivered in actual if redelivered}
    assert all(redelivered for _body, redelivered in actual)  # the listed difference
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

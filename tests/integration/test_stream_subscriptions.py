"""Durable subscriptions to streams: a named consumer picks up after what it acknowledged, after a
reconnect, a clean restart and a SIGKILL; consumers sharing a name with single active consumer
form a failover group.

Each start is a real ``postroom serve`` over the same data directory, with pika as the client.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration


def open_channel(port: int, prefetch: int = 50) -> tuple[pika.BlockingConnection, Any]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    return connection, channel


def publish(port: int, count: int, start: int = 0) -> None:
    """``count`` numbered messages into stream ``events``, each confirmed."""
    connection, channel = open_channel(port)
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for number in range(start, start + count):
        channel.basic_publish("", "events", b"%d" % number)
    connection.close()


def read_acking(port: int, name: str, until: int, offset: Any = "first", group: bool = False) -> list[int]:
    """Consume as subscription ``name``, acknowledging each delivery up to offset ``until``
    (exclusive), then leave: the offsets of every delivery, in order."""
    connection, channel = open_channel(port)
    got: list[int] = []
    arguments = {"x-stream-offset": offset, "x-stream-consumer-name": name}
    if group:
        arguments["x-single-active-consumer"] = True

    def on(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        offset = properties.headers["x-stream-offset"]
        got.append(offset)
        if offset < until:
            channel.basic_ack(method.delivery_tag)

    channel.basic_consume("events", on, arguments=arguments)
    deadline = time.monotonic() + 10
    while (not got or got[-1] < until) and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    settle(connection, got)
    connection.close()
    return got


def settle(connection: pika.BlockingConnection, got: list[int]) -> None:
    """Process events until three rounds in a row bring nothing: every delivery the credit allows
    has reached the callback (pika rejects deliveries still waiting in its buffer when it closes,
    which a stream refuses, as RabbitMQ's does). A round sends the acks of the one before, so
    one round without deliveries is not yet quiet."""
    quiet = 0
    while quiet < 3:
        seen = len(got)
        connection.process_data_events(time_limit=0.2)
        quiet = quiet + 1 if len(got) == seen else 0


def test_a_named_consumer_resumes_after_its_acks_across_reconnects_restarts_and_kills(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data) as (_process, port):
        publish(port, 1000)
        first = read_acking(port, "billing", 300)
        assert first[0] == 0 and first[-1] >= 300  # 300 acked, more delivered and not acked
        again = read_acking(port, "billing", 400, offset="last")  # a stored offset wins over x-stream-offset
        assert again[0] == 300
        other = read_acking(port, "audit", 5)  # another subscription reads on its own
        assert other[0] == 0
    with broker(data) as (process, port):  # after a clean stop
        after_stop = read_acking(port, "billing", 500)
        assert after_stop[0] == 400
        publish(port, 1, start=1000)  # confirmed: the stored offsets before it are written
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(data) as (_process, port):
        after_kill = read_acking(port, "billing", 1001)
        assert after_kill[0] == 500 and after_kill[-1] == 1000
        assert read_acking(port, "audit", 6)[0] == 5
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_a_group_reads_with_one_member_and_the_next_takes_over_where_it_stopped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data) as (_process, port):
        publish(port, 100)
        arguments = {"x-stream-offset": "first", "x-stream-consumer-name": "g", "x-single-active-consumer": True}
        standby, standby_channel = open_channel(port, prefetch=200)
        waiting: list[int] = []
        active, active_channel = open_channel(port, prefetch=200)
        read: list[int] = []

        def on_active(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
            read.append(properties.headers["x-stream-offset"])
            if properties.headers["x-stream-offset"] < 60:
                active_channel.basic_ack(method.delivery_tag)

        def on_standby(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
            waiting.append(properties.headers["x-stream-offset"])
            standby_channel.basic_ack(method.delivery_tag)

        active_channel.basic_consume("events", on_active, arguments=arguments)
        deadline = time.monotonic() + 10
        while len(read) < 100 and time.monotonic() < deadline:
            active.process_data_events(time_limit=0.05)
        standby_channel.basic_consume("events", on_standby, arguments=arguments)
        standby.process_data_events(time_limit=0.3)
        assert read == list(range(100)) and waiting == []  # one member reads
        settle(active, read)
        active.close()  # 60 to 99 were not acknowledged
        deadline = time.monotonic() + 10
        while len(waiting) < 40 and time.monotonic() < deadline:
            standby.process_data_events(time_limit=0.05)
        assert waiting == list(range(60, 100))
        settle(standby, waiting)
        standby.close()

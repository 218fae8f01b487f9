"""Visibility timeouts, poison messages and TTL expiry with pika over real sockets.

Timeouts here are short (hundreds of milliseconds) so the tests stay quick; they wait for
events with a deadline, never for a fixed time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

pytestmark = [pytest.mark.integration, pytest.mark.interop]

Connect = Callable[..., BlockingConnection]


def wait_for(connection: BlockingConnection, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Run ``connection``'s I/O loop until ``condition()`` holds, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"condition not met within {timeout} s")
        connection.process_data_events(time_limit=min(remaining, 0.05))


def get_one(connection: BlockingConnection, channel: BlockingChannel, queue: str, timeout: float = 5.0) -> Any:
    """Poll ``queue`` with ``basic.get`` (auto-ack) until a message comes, within ``timeout`` seconds."""
    got: list[Any] = []

    def poll() -> bool:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            got.append((method, properties, body))
        return bool(got)

    wait_for(connection, poll, timeout)
    return got[0]


def test_a_hung_consumers_message_goes_to_a_second_consumer_after_the_timeout(pika_connect: Connect) -> None:
    hung_connection, worker_connection = pika_connect(), pika_connect()
    hung, worker = hung_connection.channel(), worker_connection.channel()
    hung.queue_declare("jobs", arguments={"x-visibility-timeout": 300})
    hung.basic_qos(prefetch_count=1)
    worker.basic_qos(prefetch_count=1)
    held: list[bytes] = []
    done: list[tuple[bool, dict | None, bytes]] = []
    hung.basic_consume("jobs", lambda ch, method, props, body: held.append(body))
    hung.basic_publish("", "jobs", b"job-7")
    wait_for(hung_connection, lambda: held == [b"job-7"])

    def work(ch: BlockingChannel, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        done.append((method.redelivered, props.headers, body))
        ch.basic_ack(method.delivery_tag)

    worker.basic_consume("jobs", work)
    wait_for(worker_connection, lambda: bool(done))
    assert done == [(True, {"x-delivery-count": 1}, b"job-7")]
    hung.basic_ack(1)  # stale: ignored, the channel stays open
    assert hung.queue_declare("jobs", passive=True).method.message_count == 0
    assert hung.is_open


def test_a_poison_message_reaches_the_dlq_after_n_attempts(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("orders.dlq")
    channel.queue_bind("orders.dlq", "dlx")
    channel.queue_declare("orders", arguments={"x-dead-letter-exchange": "dlx", "x-delivery-limit": 2})
    channel.basic_publish("", "orders", b"{bad json", pika.BasicProperties(headers={"tenant": "acme"}))
    attempts: list[int] = []

    def fail(ch: BlockingChannel, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        attempts.append((props.headers or {}).get("x-delivery-count", 0))
        ch.basic_nack(method.delivery_tag, requeue=True)

    channel.basic_consume("orders", fail)
    wait_for(connection, lambda: channel.queue_declare("orders.dlq", passive=True).method.message_count == 1)
    assert attempts == [0, 1, 2]
    method, properties, body = channel.basic_get("orders.dlq", auto_ack=True)
    death = properties.headers["x-death"][0]
    assert body == b"{bad json"
    assert properties.headers["tenant"] == "acme"
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", "orders", 1)
    assert "delivery-count" not in death  # RabbitMQ's x-death has no such key
    assert properties.headers["x-first-death-reason"] == "delivery_limit"


def test_expired_messages_go_to_the_dlq_with_nobody_consuming(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.exchange_declare("dlx", "direct")
    channel.queue_declare("expired")
    channel.queue_bind("expired", "dlx", "gone")
    channel.queue_declare(
        "short-lived",
        arguments={"x-message-ttl": 200, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "gone"},
    )
    channel.basic_publish("", "short-lived", b"tick", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", "short-lived", b"tock")
    first = get_one(connection, channel, "expired")
    second = get_one(connection, channel, "expired")
    assert [first[2], second[2]] == [b"tick", b"tock"]
    assert first[1].headers["x-death"][0]["original-expiration"] == "100"
    assert [m[1].headers["x-death"][0]["reason"] for m in (first, second)] == ["expired", "expired"]
    assert channel.queue_declare("short-lived", passive=True).method.message_count == 0


def test_extend_keeps_a_slow_delivery(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("slow", arguments={"x-visibility-timeout": 300})
    channel.basic_publish("", "slow", b"long job")
    method, _, _ = channel.basic_get("slow")
    channel.confirm_delivery()
    channel.basic_publish(
        "amq.postroom.extend",
        "",
        b"",
        pika.BasicProperties(headers={"x-delivery-tag": method.delivery_tag, "x-visibility-timeout": 5_000}),
    )
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert channel.queue_declare("slow", passive=True).method.message_count == 0
    channel.basic_ack(method.delivery_tag)

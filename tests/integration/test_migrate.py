"""``postroom migrate`` into a real RabbitMQ node: the topology imported (Postroom's own
settings mapped or dropped, each said), every message moved with its properties and headers
(priorities, ``x-death`` history) as the broker held them and the time to live it had left as
its ``expiration``, and a migration killed midway finished by a rerun with nothing lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom.broker.tools.testing import free_port, rabbitmq_node
from tests.integration.test_crash import ROOT, broker
from tests.integration.test_live_administration import api

#: Brokers filled, then moved (with kills and restarts): minutes on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

ORDERS = 10_000


def guest(port: int, path: str, method: str = "GET", body: Any = None) -> Any:
    status, answer = api(port, path, method, body, user="guest:guest")
    assert status < 400, (path, status, answer)
    return answer


def contents(http: int, queue: str, ackmode: str) -> list[Any]:
    """Every message of ``queue`` as the management API shows it: properties and body."""
    got = guest(http, f"queues/%2F/{queue}/get", "POST", {"count": 1000, "ackmode": ackmode, "encoding": "base64"})
    return [[message["properties"], message["payload"]] for message in got]


def order(number: int) -> tuple[dict[str, Any], bytes]:
    """The properties (those set) and body of order ``number`` as published."""
    properties = {
        "delivery_mode": 2, "headers": {"n": number, "region": ["eu", "north"], "nested": {"a": "x", "b": 2}},
        "message_id": f"m-{number}", "timestamp": 1_700_000_000 + number, "content_type": "application/json",
    }  # fmt: skip
    if number % 10 == 0:
        properties["expiration"] = "3600000"
    return properties, json.dumps({"n": number}).encode()


def moved_orders(got: list[tuple[dict[str, Any], bytes]], numbers: range, populated: float) -> None:
    """``got`` are orders ``numbers`` as published, but each ``expiration`` is the time the
    order had left when it was moved: its TTL less at most the time since ``populated``."""
    assert len(got) == len(numbers)
    spent = (time.monotonic() - populated) * 1000
    for (properties, body), number in zip(got, numbers, strict=True):
        published, sent = order(number)
        assert body == sent
        left, ttl = properties.pop("expiration", None), published.pop("expiration", None)
        assert properties == published, number
        assert (left is None) == (ttl is None), number
        if left is not None:
            assert int(ttl) - spent <= int(left) < int(ttl), (number, left)


def consumed(port: int, queue: str) -> list[tuple[dict[str, Any], bytes]]:
    """Every message taken from ``queue`` over AMQP: the properties set, the body."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    taken = []
    for method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=2):
        if method is None:
            break
        taken.append(({k: v for k, v in vars(properties).items() if v is not None}, body))
    connection.close()
    return taken


def moved_to(http: int, queue: str) -> list[Any]:
    """What a queue on RabbitMQ holds (taken), as :func:`contents` shows it, without the
    ``x-delivery-count`` 0 a quorum queue adds on each delivery."""
    moved = contents(http, queue, "ack_requeue_false")
    for properties, _body in moved:
        if properties.get("headers", {}).get("x-delivery-count") == 0:
            del properties["headers"]["x-delivery-count"]
    return moved


def populate(port: int, orders: int = ORDERS) -> None:
    """``orders`` orders (the first 20 dead-lettered, with their history), a priority queue."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.exchange_declare("shop", "topic", durable=True)
    channel.exchange_declare("dlx", "fanout", durable=True)
    arguments = {"x-delivery-limit": 5, "x-visibility-timeout": 30_000, "x-dead-letter-exchange": "dlx"}
    channel.queue_declare("orders", durable=True, arguments=arguments)
    channel.queue_bind("orders", "shop", "order.*")
    channel.queue_declare("prio", durable=True, arguments={"x-max-priority": 10})
    channel.queue_declare("orders.dead", durable=True)
    channel.queue_bind("orders.dead", "dlx")
    for number in range(orders):  # (without confirms, for speed: the queue's depth says when all are in)
        properties, body = order(number)
        channel.basic_publish("shop", "order.paid", body, pika.BasicProperties(**properties))
    deadline = time.monotonic() + 120
    while channel.queue_declare("orders", passive=True).method.message_count < orders:
        assert time.monotonic() < deadline, "the orders did not all arrive"
        time.sleep(0.05)
    channel.confirm_delivery()
    for number in range(100):
        channel.basic_publish("", "prio", b"p%d" % number, pika.BasicProperties(delivery_mode=2, priority=number % 10))
    for _ in range(20):  # dead letters with their history
        method, _properties, _body = channel.basic_get("orders")
        channel.basic_reject(method.delivery_tag, requeue=False)
    connection.close()


def migrate(source: list[str], rabbit: int, rabbit_http: int, *extra: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "postroom.broker.tools.cli", "migrate", *source,
        "--to", f"amqp://guest:guest@127.0.0.1:{rabbit}/", "--to-api", f"http://guest:guest@127.0.0.1:{rabbit_http}/",
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)


def test_a_populated_broker_moves_to_rabbitmq_with_every_message_as_it_was(tmp_path: Path) -> None:
    http, rabbit_http = free_port(), free_port()
    config = f"management.tcp.port = {rabbit_http}\nmanagement.tcp.ip = 127.0.0.1\n"
    with (
        rabbitmq_node(config, ["rabbitmq_management"]) as (rabbit, _pid),
        broker(tmp_path / "data", management=http) as (_process, port),
    ):
        populated = time.monotonic()
        populate(port)
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = connection.channel()
        channel.queue_declare("aging", durable=True, arguments={"x-message-ttl": 3_600_000})
        channel.confirm_delivery()
        for number in range(10):
            channel.basic_publish("", "aging", b"%d" % number, pika.BasicProperties(delivery_mode=2))
        connection.close()
        before = {queue: contents(http, queue, "peek") for queue in ("prio", "orders.dead")}
        assert guest(http, "queues/%2F/orders")["messages"] == ORDERS - 20 and len(before["orders.dead"]) == 20
        assert "x-death" in before["orders.dead"][0][0]["headers"]

        by_url = ["--url", f"http://guest:guest@127.0.0.1:{http}/"]
        first = migrate(by_url, rabbit, rabbit_http, "--queue-type", "quorum", "--prefetch", "200")
        deadline = time.monotonic() + 60
        while guest(http, "queues/%2F/orders")["messages"] > ORDERS // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # the migration is killed midway (its shovels go on)
        first.wait(10)
        # The rerun finds the broker's API through its configuration.
        (config,) = (tmp_path).glob("broker-*.yaml")
        again = migrate(["--config", str(config)], rabbit, rabbit_http, "--queue-type", "quorum", "--prefetch", "200")
        _out, said = again.communicate(timeout=120)
        assert again.returncode == 0, said

        assert "x-visibility-timeout dropped" in said
        assert "queue 'prio' in vhost '/': stays a classic queue, a quorum queue cannot be a priority queue" in said
        assert "orders: done" in said and "possible duplicate(s)" in said
        queues = {q["name"]: q for q in guest(rabbit_http, "queues/%2F")}
        assert queues["orders"]["type"] == "quorum" and queues["orders"]["arguments"]["x-delivery-limit"] == 5
        assert "x-visibility-timeout" not in queues["orders"]["arguments"]
        assert queues["prio"]["type"] == "classic"
        assert [b["destination"] for b in guest(rabbit_http, "exchanges/%2F/shop/bindings/source")] == ["orders"]
        for queue in ("orders", "prio", "orders.dead", "aging"):
            assert guest(http, f"queues/%2F/{queue}")["messages"] == 0  # all moved
        # Every message, with its properties and headers as the broker held them, once (the
        # shovels were not disturbed: no duplicates) and in order.
        moved_orders(consumed(rabbit, "orders"), range(20, ORDERS), populated)
        for queue in ("prio", "orders.dead"):
            assert moved_to(rabbit_http, queue) == before[queue], queue
        # A message that had only its queue's TTL arrives with the time it had left.
        assert queues["aging"]["arguments"]["x-message-ttl"] == 3_600_000
        spent = (time.monotonic() - populated) * 1000
        aged = consumed(rabbit, "aging")
        assert [body for _properties, body in aged] == [b"%d" % number for number in range(10)]
        assert all(3_600_000 - spent <= int(properties["expiration"]) < 3_600_000 for properties, _ in aged), aged
        assert guest(http, "shovels") == []  # each ended when its queue was moved, and cleared itself
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

"""The example configuration's topology works end to end with pika."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom import config
from postroom.broker.core.definitions import node_from_config
from postroom.config.loader import load

pytestmark = [pytest.mark.integration, pytest.mark.interop]


def test_the_example_files_queues_route_and_dead_letter(make_broker: Callable[..., Any]) -> None:
    cfg = load(Path(config.__file__).parent / "postroom.yaml")
    broker = make_broker(node_from_config(cfg))
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, socket_timeout=5))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "order.eu.created", b'{"id": 1}')
        channel.basic_publish("audit", "", b"eu event", pika.BasicProperties(headers={"region": "eu"}))
        channel.basic_publish("audit", "", b"us event", pika.BasicProperties(headers={"region": "us"}))
        method, _, body = channel.basic_get("orders.created")
        assert body == b'{"id": 1}'
        channel.basic_nack(method.delivery_tag, requeue=False)
        _, properties, dead = channel.basic_get("orders.dlq", auto_ack=True)
        assert dead == b'{"id": 1}'
        assert properties.headers["x-death"][0]["reason"] == "rejected"
        assert [channel.basic_get("audit.eu", auto_ack=True)[2] for _ in range(2)] == [b"eu event", None]
    finally:
        connection.close()

"""kombu over py-amqp (which logs in with AMQPLAIN) against an in-process broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

pytestmark = [pytest.mark.integration, pytest.mark.interop]


@pytest.fixture
def connection(broker: Any) -> Iterator[Connection]:
    """A kombu connection to ``broker``'s default vhost, with bounded connect and I/O."""
    with Connection(
        f"amqp://guest:guest@127.0.0.1:{broker.port}//",
        connect_timeout=5,
        transport_options={"read_timeout": 5, "write_timeout": 5},
    ) as conn:
        conn.ensure_connection(max_retries=1)
        yield conn


def test_producer_publishes_json_that_a_consumer_drains(connection: Connection) -> None:
    exchange = Exchange("orders", type="direct", durable=False)
    queue = Queue("orders.created", exchange, routing_key="created", durable=False)
    received: list[tuple[Any, str, dict[str, Any]]] = []

    def on_message(body: Any, message: Any) -> None:
        received.append((body, message.content_type, message.headers))
        message.ack()

    Producer(connection.default_channel).publish(
        {"order": 7, "items": ["a", "b"]},
        exchange=exchange,
        routing_key="created",
        serializer="json",
        headers={"source": "test"},
        declare=[queue],
    )
    with Consumer(connection, [queue], callbacks=[on_message], accept=["json"]):
        connection.drain_events(timeout=5)

    assert received == [({"order": 7, "items": ["a", "b"]}, "application/json", {"source": "test"})]


def test_simple_queue_put_then_get(connection: Connection) -> None:
    simple = connection.SimpleQueue("simple")
    try:
        simple.put({"hello": "world"}, serializer="json")
        message = simple.get(timeout=5)
        message.ack()

        assert message.payload == {"hello": "world"}
        assert simple.qsize() == 0
    finally:
        simple.close()


def test_priority_queue_declared_through_queue_arguments(connection: Connection) -> None:
    queue = Queue("kombu.priority", routing_key="kombu.priority", queue_arguments={"x-max-priority": 10})
    producer = Producer(connection.default_channel)
    for priority in (1, 9, 5, 0, 7):
        producer.publish(
            {"priority": priority},
            exchange="",
            routing_key="kombu.priority",
            serializer="json",
            priority=priority,
            declare=[queue],
        )
    bound = queue(connection.default_channel)

    received = []
    while (message := bound.get(no_ack=True, accept=["json"])) is not None:
        received.append(message.payload["priority"])

    assert received == [9, 7, 5, 1, 0]


def test_consumer_arguments_give_a_consumer_priority(connection: Connection, broker: Any) -> None:
    queue = Queue("kombu.work", routing_key="kombu.work", durable=False)
    received: list[tuple[str, Any]] = []

    def on(name: str) -> Any:
        return lambda body, message: received.append((name, body))

    with Connection(f"amqp://guest:guest@127.0.0.1:{broker.port}//", connect_timeout=5) as other:
        low = Consumer(connection, [queue], callbacks=[on("low")], accept=["json"], prefetch_count=2)
        eager = Queue("kombu.work", routing_key="kombu.work", durable=False, consumer_arguments={"x-priority": 10})
        high = Consumer(other, [eager], callbacks=[on("high")], accept=["json"], prefetch_count=2)
        with low, high:
            producer = Producer(connection.default_channel)
            for number in range(4):
                producer.publish(number, routing_key="kombu.work", serializer="json", declare=[queue])
            while len(received) < 4:
                for conn in (connection, other):
                    try:
                        conn.drain_events(timeout=0.05)
                    except TimeoutError:
                        pass
    assert sorted(received, key=lambda item: item[1]) == [("high", 0), ("high", 1), ("low", 2), ("low", 3)]

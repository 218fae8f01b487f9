"""Postroom's client against a real RabbitMQ node: the client works with both brokers.

The test command installs ``rabbitmq-server`` where it can; where it is missing these tests
are skipped, saying so.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet import defer

from postroom.broker.clients.client import ChannelClosed, Message, PublishNacked, PublishReturned, connect
from postroom.broker.clients.txclient import connect_twisted
from postroom.broker.tools.testing import RabbitMQMissing, rabbitmq_node

pytestmark = [pytest.mark.integration, pytest.mark.interop]


@pytest.fixture(scope="module")
def rabbitmq_url() -> Iterator[str]:
    try:
        node = rabbitmq_node()
        port, _pid = node.__enter__()
    except RabbitMQMissing as missing:
        pytest.skip(f"no RabbitMQ to test against: {missing}")
    except TimeoutError as stuck:
        pytest.skip(f"RabbitMQ is installed but did not start here: {stuck}")
    try:
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        node.__exit__(None, None, None)


@pytest.fixture
def name() -> str:
    """A fresh name, so tests sharing one RabbitMQ node do not meet."""
    return f"postroom-test-{uuid.uuid4().hex[:8]}"


def test_publish_consume_ack_with_rabbitmq(rabbitmq_url: str, name: str) -> None:
    with connect(rabbitmq_url) as conn:
        conn.declare_exchange(name, "topic", durable=False)
        conn.declare_queue(name, durable=False)
        conn.bind(name, name, "order.*")
        conn.publish(name, "order.eu", b"one", headers={"tenant": "acme"})
        conn.publish(name, "order.us", b"two")
        received = []
        for message in conn.consume(name, prefetch=10, timeout=2):
            received.append((message.body, message.headers.get("tenant")))
            message.ack()
            if len(received) == 2:
                break
        assert received == [(b"one", "acme"), (b"two", None)]


def test_rejections_dead_letter_with_rabbitmq(rabbitmq_url: str, name: str) -> None:
    with connect(rabbitmq_url) as conn:
        conn.declare_exchange(f"{name}.dlx", "fanout", durable=False)
        conn.declare_queue(f"{name}.dlq", durable=False)
        conn.bind(f"{name}.dlq", f"{name}.dlx")
        conn.declare_queue(name, durable=False, arguments={"x-dead-letter-exchange": f"{name}.dlx"})
        conn.publish("", name, b"bad")
        message = conn.get(name)
        assert message is not None
        message.reject()
        dead = None
        deadline = time.monotonic() + 5
        while dead is None and time.monotonic() < deadline:  # RabbitMQ dead-letters asynchronously
            dead = conn.get(f"{name}.dlq")
        assert dead is not None and [d["reason"] for d in dead.x_death] == ["rejected"]
        dead.ack()


def test_returns_nacks_and_errors_with_rabbitmq(rabbitmq_url: str, name: str) -> None:
    with connect(rabbitmq_url) as conn:
        with pytest.raises(PublishReturned) as returned:
            conn.publish("", f"{name}.nowhere", b"lost", mandatory=True)
        assert returned.value.reply_code == 312
        conn.declare_queue(name, durable=False, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        conn.publish("", name, b"fits")
        with pytest.raises(PublishNacked):
            conn.publish("", name, b"does not")
        with pytest.raises(ChannelClosed) as closed:
            conn.get(f"{name}.missing")
        assert closed.value.reply_code == 404


def test_batch_publish_with_rabbitmq(rabbitmq_url: str, name: str) -> None:
    with connect(rabbitmq_url) as conn:
        conn.declare_queue(name, durable=False)
        assert conn.publish_batch((("", name, b"%d" % i) for i in range(1000)), window=200) == 1000
        assert conn.declare_queue(name, durable=False) == name


@pytest_twisted.ensureDeferred
async def test_the_twisted_client_with_rabbitmq(rabbitmq_url: str, name: str) -> None:
    from twisted.internet import reactor

    conn = await connect_twisted(reactor, rabbitmq_url)
    try:
        await conn.declare_queue(name, durable=False)
        assert await conn.publish_batch((("", name, b"%d" % i) for i in range(500)), window=100) == 500
        bodies: list[bytes] = []
        all_received: defer.Deferred[None] = defer.Deferred()

        def on_message(message: Message) -> None:
            bodies.append(message.body)
            message.ack()
            if len(bodies) == 500:
                all_received.callback(None)

        tag = await conn.consume(name, on_message, prefetch=50)
        await all_received
        await conn.cancel(tag)
        assert bodies == [b"%d" % i for i in range(500)]
        with pytest.raises(PublishReturned) as returned:
            await conn.publish("", f"{name}.nowhere", b"lost", mandatory=True)
        assert returned.value.reply_code == 312
        await conn.declare_queue(
            f"{name}.full", durable=False, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        await conn.publish("", f"{name}.full", b"fits")
        with pytest.raises(PublishNacked):
            await conn.publish("", f"{name}.full", b"does not")
    finally:
        await conn.close()

"""The Twisted client against an in-process broker on the same reactor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_twisted
from twisted.internet import defer

from broker.client import Message, PublishNacked, PublishReturned
from broker.core.node import Node
from broker.protocol import AMQPServerFactory
from broker.txclient import TwistedConnection, connect_twisted


@pytest_twisted.async_yield_fixture
async def conn() -> AsyncIterator[TwistedConnection]:
    from twisted.internet import reactor

    factory = AMQPServerFactory(Node(), reactor)
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    connection = await connect_twisted(reactor, f"amqp://guest:guest@127.0.0.1:{port.getHost().port}/")
    try:
        yield connection
    finally:
        await connection.close()
        factory.close_all()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_publish_get_and_consume_with_deferreds(conn: TwistedConnection) -> None:
    assert await conn.declare_queue("jobs") == "jobs"
    await conn.publish("", "jobs", b"first", headers={"tenant": "acme"})
    await conn.publish("", "jobs", b"second")
    got = await conn.get("jobs")
    assert got is not None and (got.body, got.headers) == (b"first", {"tenant": "acme"})
    got.ack()
    received: defer.Deferred[Message] = defer.Deferred()
    await conn.consume("jobs", received.callback, prefetch=5)
    message = await received
    assert (message.body, message.redelivered) == (b"second", False)
    message.ack()
    assert await conn.get("jobs") is None


@pytest_twisted.ensureDeferred
async def test_refused_and_returned_publishes_fail_their_deferreds(conn: TwistedConnection) -> None:
    await conn.declare_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    await conn.publish("", "full", b"fits")
    with pytest.raises(PublishNacked):
        await conn.publish("", "full", b"does not")
    with pytest.raises(PublishReturned) as returned:
        await conn.publish("", "nowhere", b"lost", mandatory=True)
    assert returned.value.reply_code == 312

"""aio-pika (over aiormq) against an in-process broker, on its own asyncio event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.interop]


async def publish_and_consume_one(url: str, connect: Any) -> tuple[bytes, dict[str, Any], bool]:
    connection = await connect(url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("aio", durable=False)
        await channel.default_exchange.publish(
            aio_pika.Message(b"from asyncio", headers={"kind": "test"}, message_id="m-1"), routing_key="aio"
        )
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    return message.body, dict(message.headers), message.redelivered
    raise AssertionError("no message")


@pytest.mark.parametrize("connect", [aio_pika.connect, aio_pika.connect_robust], ids=["connect", "connect_robust"])
def test_publish_then_consume_one_message(broker: Any, connect: Any) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"

    result = asyncio.run(asyncio.wait_for(publish_and_consume_one(url, connect), timeout=10))

    assert result == (b"from asyncio", {"kind": "test"}, False)
    assert "aio" in broker.queue_names()


async def rpc_priorities_and_single_active(url: str) -> tuple[list[bytes], list[str], list[str]]:
    """Direct reply-to RPC, consumer priorities and a single active consumer, from aio-pika."""
    requester, responder = await aio_pika.connect(url, timeout=5), await aio_pika.connect(url, timeout=5)
    async with requester, responder:
        server = await responder.channel()
        requests = await server.declare_queue("aio.rpc")

        async def answer(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                reply = aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id)
                await server.default_exchange.publish(reply, routing_key=message.reply_to)

        await requests.consume(answer)
        client = await requester.channel()
        replies = await client.get_queue("amq.rabbitmq.reply-to", ensure=True)
        answers: asyncio.Queue[bytes] = asyncio.Queue()

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await answers.put(message.body)

        await replies.consume(take, no_ack=True)
        bodies = []
        for word in (b"ping", b"pong"):
            request = aio_pika.Message(word, reply_to="amq.rabbitmq.reply-to", correlation_id=word.decode())
            await client.default_exchange.publish(request, routing_key="aio.rpc")
            bodies.append(await asyncio.wait_for(answers.get(), 5))

        # Priorities: prefetch 2 each; the high one gets the first two, the low one the rest.
        low_channel, high_channel = await requester.channel(), await responder.channel()
        await low_channel.set_qos(prefetch_count=2)
        await high_channel.set_qos(prefetch_count=2)
        work = await low_channel.declare_queue("aio.work")
        got: list[str] = []
        await work.consume(keep_into(got, "low"))
        await (await high_channel.get_queue("aio.work")).consume(keep_into(got, "high"), arguments={"x-priority": 5})
        for number in range(4):
            await client.default_exchange.publish(aio_pika.Message(b"%d" % number), routing_key="aio.work")
        while len(got) < 4:
            await asyncio.sleep(0.01)

        # A single active consumer: everything goes to the first.
        ordered = await low_channel.declare_queue("aio.ordered", arguments={"x-single-active-consumer": True})
        seen: list[str] = []
        await ordered.consume(keep_into(seen, "first"), no_ack=True)
        await (await high_channel.get_queue("aio.ordered")).consume(keep_into(seen, "second"), no_ack=True)
        for number in range(3):
            await client.default_exchange.publish(aio_pika.Message(b"%d" % number), routing_key="aio.ordered")
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        return bodies, sorted(got), seen


def keep_into(into: list[str], name: str) -> Any:
    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        into.append(f"{name}:{message.body.decode()}")

    return on_message


def test_direct_reply_to_consumer_priorities_and_single_active_consumer(broker: Any) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    bodies, got, seen = asyncio.run(asyncio.wait_for(rpc_priorities_and_single_active(url), timeout=15))
    assert bodies == [b"PING", b"PONG"]
    assert got == ["high:0", "high:1", "low:2", "low:3"]
    assert seen == ["first:0", "first:1", "first:2"]

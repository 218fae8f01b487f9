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

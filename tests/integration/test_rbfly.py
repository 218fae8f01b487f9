"""RabbitMQ's stream protocol with a second stock client: ``rbfly`` (0.10.0, asyncio, Cython)
against Postroom and against RabbitMQ 3.10.8 with ``rabbitmq_stream``, the same session on
each, the same results.

The session creates a stream, publishes with confirms one at a time and in a batch under one
publisher name (reopening it continues its message ids: rbfly asks for the publisher's
sequence), reads from ``first``, an offset, a timestamp and ``next``, stores an offset and
reads on from it. Postroom is then killed: the stored offset and the publisher's sequence
outlive it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import rbfly.streams as rbs
from rbfly.streams import Offset, PublisherBatchFast, get_message_ctx

from postroom.broker.tools.testing import free_port, rabbitmq_node, wait_for_port
from tests.integration.test_crash import broker

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(180)]

STREAM = "rb-s"


async def read(client: Any, offset: Offset, until: int, seconds: float = 3.0) -> list[tuple[int, Any]]:
    """``(offset, body)`` of what a subscription from ``offset`` gets (up to ``until``)."""
    got: list[tuple[int, Any]] = []
    try:
        async for body in client.subscribe(STREAM, offset=offset, timeout=seconds):
            got.append((get_message_ctx().stream_offset, body))
            if len(got) >= until:
                break
    except TimeoutError:
        pass
    return got


async def session(port: int) -> dict[str, Any]:
    client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/")
    results: dict[str, Any] = {}
    try:
        await client.create_stream(STREAM)
        async with client.publisher(STREAM, name="rb-app") as publisher:
            for n in range(20):
                await publisher.send(b"r%d" % n)
            results["ids after 20"] = publisher.message_id
        async with client.publisher(STREAM, name="rb-app", cls=PublisherBatchFast) as batch:
            results["ids on reopening"] = batch.message_id
            for n in range(20, 40):
                batch.batch(b"r%d" % n)
            await batch.flush()
        everything = await read(client, Offset.FIRST, 40)
        results["first"] = [body for _offset, body in everything]
        results["offsets are consecutive"] = [offset for offset, _ in everything] == list(range(len(everything)))
        results["from offset 30"] = [body for _offset, body in await read(client, Offset.offset(30), 10)]
        results["from a timestamp"] = len(await read(client, Offset.timestamp(time.time() - 3600), 40))

        async def late() -> None:
            await asyncio.sleep(1.0)
            async with client.publisher(STREAM, name="rb-late") as publisher:
                await publisher.send(b"late")

        writer = asyncio.create_task(late())
        results["next"] = [body for _offset, body in await read(client, Offset.NEXT, 1, 4.0)]
        await writer
        await client.write_offset(STREAM, "rb-reader", 33)
        await asyncio.sleep(0.5)
        stored = await read(client, Offset.reference("rb-reader"), 3)
        results["from the stored reference"] = [body for _offset, body in stored]
    finally:
        await client.disconnect()
    return results


async def after_restart(port: int) -> tuple[list[Any], int]:
    """What the stored reference still gives, and the id rb-app's publisher goes on from."""
    client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/")
    try:
        stored = [body for _offset, body in await read(client, Offset.reference("rb-reader"), 2)]
        async with client.publisher(STREAM, name="rb-app") as publisher:
            return stored, publisher.message_id
    finally:
        await client.disconnect()


def test_rbfly_gets_the_same_from_postroom_as_from_rabbitmq(tmp_path: Path) -> None:
    rabbit_stream, stream = free_port(), free_port()
    config = f"stream.listeners.tcp.1 = 127.0.0.1:{rabbit_stream}\nstream.advertised_host = 127.0.0.1\n"
    with rabbitmq_node(config, ["rabbitmq_stream"]):
        wait_for_port(rabbit_stream, 60)
        theirs = asyncio.run(session(rabbit_stream))
    with broker(tmp_path / "data", stream=stream) as (process, _amqp):
        ours = asyncio.run(session(stream))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert ours == theirs
    assert ours["first"] == [b"r%d" % n for n in range(40)] and ours["ids on reopening"] == 21
    assert ours["next"] == [b"late"] and ours["from the stored reference"] == [b"r34", b"r35", b"r36"]
    with broker(tmp_path / "data", stream=stream):
        # rb-app's 40 messages: its next id is 41 (rbfly asks for the sequence, 40, and adds 1).
        assert asyncio.run(after_restart(stream)) == ([b"r34", b"r35"], 41)
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

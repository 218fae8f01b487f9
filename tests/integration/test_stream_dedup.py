"""Deduplication of a named stream-protocol publisher's messages holds within a frame, across
frames and across a SIGKILL of the broker: with stock ``rstream``, over loopback. (RabbitMQ's
answers to the same frames are compared in tests/conformance/test_stream_protocol_transcripts.py.)"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType, Producer, RawMessage

from postroom.broker.tools.testing import free_port
from tests.integration.test_crash import broker
from tests.integration.test_stream_protocol import read

pytestmark = pytest.mark.integration

STREAM = "dedup-s"


async def publish(port: int, ids: list[int], create: bool = False) -> list[int]:
    """Publisher ``app-1`` sends ``ids`` in one frame (body ``m<id>`` each) and waits for
    their confirms; returns the ids confirmed."""
    confirmed: list[int] = []
    done = asyncio.Event()

    async def on_confirm(status: object) -> None:
        confirmed.append(status.message_id)  # type: ignore[attr-defined]
        if len(set(confirmed)) >= len(set(ids)):
            done.set()

    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
        if create:
            await producer.create_stream(STREAM)
        messages = [RawMessage(bytes(AMQPMessage(body=b"m%d" % n)), publishing_id=n) for n in ids]
        await producer.send_batch(STREAM, messages, publisher_name="app-1", on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 10)
    return sorted(set(confirmed))


def test_repeated_ids_are_stored_once_within_a_frame_and_across_a_sigkill(tmp_path: Path) -> None:
    stream = free_port()
    with broker(tmp_path / "data", stream=stream) as (process, _amqp):
        assert asyncio.run(publish(stream, [1, 2, 3, 1, 2, 3], create=True)) == [1, 2, 3]
        first = asyncio.run(read(stream, ConsumerOffsetSpecification(OffsetType.FIRST, None), 10, 2.0, STREAM))
        assert [body for _offset, body, _n in first] == [b"m1", b"m2", b"m3"]
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(tmp_path / "data", stream=stream):
        # The same frame again, then one with a new id among old ones.
        assert asyncio.run(publish(stream, [1, 2, 3, 1, 2, 3])) == [1, 2, 3]
        assert asyncio.run(publish(stream, [2, 3, 4, 3])) == [2, 3, 4]
        after = asyncio.run(read(stream, ConsumerOffsetSpecification(OffsetType.FIRST, None), 10, 2.0, STREAM))
        assert [(offset, body) for offset, body, _n in after] == [(0, b"m1"), (1, b"m2"), (2, b"m3"), (3, b"m4")]
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

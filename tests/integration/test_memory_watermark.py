"""A flood of 64 KiB messages with no consumer, over real sockets: the broker's resident memory
stays within 1.2 times its watermark, publishers are blocked (``connection.blocked``) once it
passes the watermark and unblocked once it falls, every confirmed message is delivered once a
consumer drains the queue, and memory is back under the watermark afterwards.

While the queue drains, with the publishers unblocked, memory may pass the watermark for a few
seconds (docs/configuration.md, "Resource alarms"): the highest reading of that phase is
printed, not held to the flood's bound."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pika
import pytest
from pamqp import commands

from postroom.broker.tools.testing import ConfirmedPublisher, MemoryReadings, process_memory, publish_frames
from tests.integration.test_crash import broker

WATERMARK = 128 << 20
BODY = 64 << 10
PUBLISHERS = 4
#: Messages each publisher sends: 640 MiB in all, five times the watermark.
EACH = 2560
#: Unconfirmed messages a publisher lets out at most (as clients with confirms do).
UNCONFIRMED = 1000
#: A body's first bytes: its publisher and its number.
_head = struct.Struct(">II")


class Publisher(ConfirmedPublisher, threading.Thread):
    """One connection publishing persistent 64 KiB messages with confirms, as fast as the broker
    reads them, counting what it is told besides confirms: ``connection.blocked`` and ``unblocked``."""

    def __init__(self, port: int, number: int) -> None:
        ConfirmedPublisher.__init__(self, port, UNCONFIRMED, {"connection.blocked": True}, timeout=120)
        threading.Thread.__init__(self, daemon=True)
        self.number = number
        self.blocks = self.unblocks = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        properties = commands.Basic.Properties(delivery_mode=2)
        padding = bytes(BODY - _head.size)
        bodies = (_head.pack(self.number, n) + padding for n in range(EACH))
        try:
            self.publish(publish_frames(1, "", "flood", body, properties) for body in bodies)
        except BaseException as error:  # the test reports it
            self.error = error

    def done(self) -> bool:
        # Confirms go on while a connection is blocked: one may have them all and still be
        # blocked, until memory falls.
        return self.blocks == self.unblocks

    def told(self, value: object) -> None:
        if isinstance(value, commands.Connection.Blocked):
            self.blocks += 1
        elif isinstance(value, commands.Connection.Unblocked):
            self.unblocks += 1
        else:
            super().told(value)


class Holder:
    """A slow consumer: it takes messages of its own queue and acknowledges none of them until
    told, so the broker holds them (unacknowledged deliveries are never paged)."""

    def __init__(self, port: int, size: int) -> None:
        self.connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        self.channel = self.connection.channel()
        self.channel.queue_declare("held")
        self.tags: list[int] = []
        self.channel.basic_consume(
            "held", lambda _channel, method, _properties, _body: self.tags.append(method.delivery_tag)
        )
        count = max(size, 0) // BODY
        for _ in range(count):
            self.channel.basic_publish("", "held", bytes(BODY))
        while len(self.tags) < count:
            self.connection.process_data_events(time_limit=1)

    def release(self) -> None:
        """Acknowledge everything and go."""
        if self.tags:
            self.channel.basic_ack(self.tags[-1], multiple=True)
        self.connection.close()


@pytest.mark.parametrize("held", [False, True], ids=["alone", "beside-a-slow-consumer"])
def test_a_flood_without_consumers_stays_within_the_watermark_and_loses_nothing(tmp_path: Path, held: bool) -> None:
    """``alone``: paging keeps the broker's memory down, and the alarm blocks publishers if it
    passes the watermark all the same; ``beside-a-slow-consumer``: a consumer holds
    unacknowledged messages up to 24 MiB under the watermark, memory that paging cannot give
    back, so the flood passes the watermark and the alarm must block it."""
    data = tmp_path / "data"
    with broker(data, limits=f"memory_high_watermark: {WATERMARK}B") as (process, port):
        setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        setup.channel().queue_declare("flood", durable=True)
        setup.close()
        readings = MemoryReadings(process.pid)
        readings.start()
        holder = Holder(port, WATERMARK - (24 << 20) - process_memory(process.pid)) if held else None
        readings.enter("flood")
        publishers = [Publisher(port, number) for number in range(PUBLISHERS)]
        for publisher in publishers:
            publisher.start()
        # No consumer until every publisher is done, or stalls blocked.
        deadline = time.monotonic() + 40
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline and any(publisher.is_alive() for publisher in publishers):
            confirmed = sum(publisher.confirmed for publisher in publishers)
            if confirmed != last:
                last, since = confirmed, time.monotonic()
            elif time.monotonic() - since > 2:
                break
            time.sleep(0.05)
        flood_peak = process_memory(process.pid, "VmHWM")
        blocked = sum(publisher.blocks for publisher in publishers)
        readings.enter("drain")
        if holder is not None:
            holder.release()
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        seen: set[bytes] = set()
        deadline = time.monotonic() + 90  # the publishers read on as memory falls, and finish
        for method, _properties, body in channel.consume("flood", inactivity_timeout=1):
            if method is None:
                if time.monotonic() > deadline:
                    break
                continue
            assert len(body) == BODY
            seen.add(body[: _head.size])
            if len(seen) % 50 == 0:
                channel.basic_ack(method.delivery_tag, multiple=True)
            if len(seen) == PUBLISHERS * EACH:
                channel.basic_ack(method.delivery_tag, multiple=True)
                break
        channel.cancel()
        connection.close()
        for publisher in publishers:
            publisher.join(10)
        peak = process_memory(process.pid, "VmHWM")
        # Drained: what the broker holds goes back to the system (malloc_trim once drained).
        deadline = time.monotonic() + 10
        while (after := process_memory(process.pid)) > WATERMARK and time.monotonic() < deadline:
            time.sleep(0.1)
        readings.stopped.set()
    print(f"peak {peak / 2**20:.0f} MiB over the run, {after / 2**20:.0f} MiB after; {readings}")
    assert [publisher.error for publisher in publishers] == [None] * PUBLISHERS
    confirmed = sum(publisher.confirmed for publisher in publishers)
    told = [(publisher.confirmed, publisher.blocks, publisher.unblocks) for publisher in publishers]
    assert confirmed == PUBLISHERS * EACH and len(seen) == confirmed, f"{len(seen)} received; {told}"
    assert flood_peak <= 1.2 * WATERMARK, f"{flood_peak / 2**20:.0f} MiB while flooded; {readings}"
    assert after <= WATERMARK, f"{after / 2**20:.0f} MiB after the drain; peak {peak / 2**20:.0f} MiB; {readings}"
    assert [publisher.blocks for publisher in publishers] == [publisher.unblocks for publisher in publishers]
    text = (tmp_path / "broker.log").read_text()
    assert "Traceback" not in text
    if held:
        assert blocked > 0 and "memory alarm set" in text, "the memory alarm never blocked a publisher"

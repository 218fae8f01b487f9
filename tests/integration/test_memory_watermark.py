"""A flood of 64 KiB messages with no consumer, over real sockets: the broker's resident memory
stays within 1.2 times its watermark, publishers are blocked (``connection.blocked``) once it
passes the watermark and unblocked once it falls, and every confirmed message is delivered
once a consumer drains the queue."""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from pathlib import Path

import pika
import pytest
from pamqp import commands
from pamqp.header import ProtocolHeader

from postroom.broker.tools.testing import FramePump, encode, publish_frames
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


def status(pid: int, field: str) -> int:
    """A memory figure of process ``pid`` in bytes (``VmRSS``, ``VmHWM``) from ``/proc``."""
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


class Publisher(threading.Thread):
    """One connection publishing persistent 64 KiB messages with confirms, as fast as the broker
    reads them, counting what it is told: confirms, ``connection.blocked`` and ``unblocked``."""

    def __init__(self, port: int, number: int) -> None:
        super().__init__(daemon=True)
        self.port, self.number = port, number
        self.sent = self.confirmed = self.blocks = self.unblocks = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._publish()
        except BaseException as error:  # the test reports it
            self.error = error

    def _publish(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        pump = FramePump()

        def expect(kind: type) -> object:
            while True:
                for _channel, value in pump.feed(sock.recv(65536)):
                    if isinstance(value, kind):
                        return value

        sock.sendall(ProtocolHeader().marshal())
        expect(commands.Connection.Start)
        capabilities = {"connection.blocked": True, "publisher_confirms": True}
        sock.sendall(
            encode(
                0,
                commands.Connection.StartOk(
                    client_properties={"capabilities": capabilities}, mechanism="PLAIN", response="\0guest\0guest"
                ),
            )
        )
        tune = expect(commands.Connection.Tune)
        assert isinstance(tune, commands.Connection.Tune)
        sock.sendall(
            encode(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), commands.Connection.Open("/"))
        )
        expect(commands.Connection.OpenOk)
        sock.sendall(encode(1, commands.Channel.Open(), commands.Confirm.Select()))
        expect(commands.Confirm.SelectOk)
        sock.setblocking(False)
        properties = commands.Basic.Properties(delivery_mode=2)
        padding = bytes(BODY - _head.size)
        pending = memoryview(b"")
        while self.confirmed < EACH:
            if not pending and self.sent < EACH and self.sent - self.confirmed < UNCONFIRMED:
                batch = min(16, EACH - self.sent)
                bodies = [_head.pack(self.number, self.sent + n) + padding for n in range(batch)]
                pending = memoryview(b"".join(publish_frames(1, "", "flood", body, properties) for body in bodies))
                self.sent += batch
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 0.05)
            if readable:
                data = sock.recv(1 << 20)
                if not data:
                    raise EOFError("the broker closed the connection")
                for _channel, value in pump.feed(data):
                    self._told(value)
            if writable and pending:
                try:
                    pending = pending[sock.send(pending) :]
                except BlockingIOError:
                    pass
        sock.close()

    def _told(self, value: object) -> None:
        if isinstance(value, commands.Basic.Ack):
            self.confirmed = value.delivery_tag if value.multiple else self.confirmed + 1
        elif isinstance(value, commands.Connection.Blocked):
            self.blocks += 1
        elif isinstance(value, commands.Connection.Unblocked):
            self.unblocks += 1
        else:
            raise AssertionError(f"unexpected {value!r}")


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
        holder = Holder(port, WATERMARK - (24 << 20) - status(process.pid, "VmRSS")) if held else None
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
        flood_peak = status(process.pid, "VmHWM")
        blocked = sum(publisher.blocks for publisher in publishers)
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
        peak = status(process.pid, "VmHWM")
    assert [publisher.error for publisher in publishers] == [None] * PUBLISHERS
    confirmed = sum(publisher.confirmed for publisher in publishers)
    told = [(publisher.confirmed, publisher.blocks, publisher.unblocks) for publisher in publishers]
    assert confirmed == PUBLISHERS * EACH and len(seen) == confirmed, f"{len(seen)} received; {told}"
    assert flood_peak <= 1.2 * WATERMARK, f"{flood_peak / 2**20:.0f} MiB while flooded"
    assert peak <= 1.2 * WATERMARK, f"{peak / 2**20:.0f} MiB over the run"
    assert [publisher.blocks for publisher in publishers] == [publisher.unblocks for publisher in publishers]
    text = (tmp_path / "broker.log").read_text()
    assert "Traceback" not in text
    if held:
        assert blocked > 0 and "memory alarm set" in text, "the memory alarm never blocked a publisher"

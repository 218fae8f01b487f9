"""Memory held for clients that have gone is handed back: 2,000 MQTT clients connect to a
``postroom serve`` process, subscribe and leave, twice; once they have gone, the broker's RSS falls
back most of the way to what it was before they came (it kept all of it: 30 MB more for these,
and 144 MB more after 10,000 AMQP subscribers), and a second crowd reuses what is left."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import time
from pathlib import Path

import pytest

from postroom.broker.tools.fuzzing import mqtt_connect, mqtt_packet, mqtt_string
from postroom.broker.tools.testing import free_port, process_memory
from tests.integration.test_crash import broker

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

CLIENTS = 2000


async def connect_and_leave(port: int) -> None:
    async def one(number: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        subscribe = mqtt_packet(0x82, struct.pack(">H", 1) + mqtt_string(f"dev/{number}") + b"\x00")
        writer.write(mqtt_connect(f"m{number}") + subscribe)
        assert await reader.readexactly(4) == b"\x20\x02\x00\x00"  # CONNACK
        assert (await reader.readexactly(5))[0] == 0x90  # SUBACK
        return reader, writer

    clients = await asyncio.gather(*(one(n) for n in range(CLIENTS)))
    await asyncio.sleep(1)  # (the caller reads the broker's memory with them all connected)
    for _reader, writer in clients:
        writer.write(b"\xe0\x00")
        writer.close()
    await asyncio.gather(*(writer.wait_closed() for _r, writer in clients))


def crowd(process: subprocess.Popen[bytes], port: int, before: int) -> tuple[int, int]:
    """One crowd of clients comes and leaves: the broker's RSS at its highest while they were
    there, and once they have gone (as soon as it is back under half of what they took)."""
    peak = 0

    async def run() -> None:
        nonlocal peak
        task = asyncio.ensure_future(connect_and_leave(port))
        while not task.done():
            peak = max(peak, process_memory(process.pid))
            await asyncio.sleep(0.05)
        await task

    asyncio.run(run())
    deadline = time.monotonic() + 10
    after = process_memory(process.pid)
    while after - before > (peak - before) / 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        after = process_memory(process.pid)
    return peak, after


def test_memory_comes_back_once_clients_have_gone(tmp_path: Path) -> None:
    port = free_port()
    with broker(tmp_path / "data", mqtt=port) as (process, _amqp):
        time.sleep(1)
        before = process_memory(process.pid)
        first_peak, first_after = crowd(process, port, before)
        second_peak, second_after = crowd(process, port, before)
    held = first_peak - before
    figures = (
        f"before {before / 2**20:.1f} MiB; first crowd {first_peak / 2**20:.1f}, after {first_after / 2**20:.1f}; "
        f"second crowd {second_peak / 2**20:.1f}, after {second_after / 2**20:.1f}"
    )
    assert held > 10 * 2**20, f"{CLIENTS} clients cost only {held / 2**20:.1f} MiB: nothing to hand back"
    # Handed back: what is left is what the allocator cannot return (an arena pinned by one live
    # object, a table that grew), from 15% to 35% of what the clients took here.
    assert first_after - before <= held / 2, figures
    assert second_after - before <= held / 2, figures
    # And what is left is used again: a second crowd as large takes no more than the first.
    assert second_peak - first_peak <= held / 4, figures

"""MQTT load: Postroom against RabbitMQ 3.10's ``rabbitmq_mqtt``, back to back on one machine.

Each broker is started on free loopback ports (Postroom with ``listen.mqtt``, RabbitMQ with its
MQTT plugin), and the same scenarios run against one and then the other. The load generator is
here: raw MQTT 3.1.1 packets over asyncio, one process, with its clients spread over several
loopback source addresses.

* ``clients``: ``--clients`` clients connect all at once (a storm: no pacing), each
  subscribed to its own topic and to one shared one, QoS 0. Reported: the time until the last
  is subscribed, the accept queue's overflows meanwhile (the kernel's ListenOverflows), the
  broker's memory per connection (its RSS with them less before them, over their number), the
  time from one message on the shared topic until the last client has it (p50 and max over
  ``--ticks`` ticks), and what the broker's RSS is once they have all gone.
* ``throughput``: one publisher, one subscriber, QoS 0 or 1 both ways, ``--sizes`` bodies, for
  ``--seconds``: messages the subscriber received per second (QoS 1: a window of 100 publishes
  not yet PUBACKed, every delivery PUBACKed).

    python bench/mqtt.py                                      # both scenarios, both brokers
    python bench/mqtt.py --scenarios throughput --seconds 5   # a quick look
    python bench/mqtt.py --clients 18000 --no-rabbitmq        # Postroom alone

A process may hold 20,000 open files on the machines this was measured on (the hard limit, which
only a privileged process can raise), so one broker holds at most about that many clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import postroom as run_postroom  # noqa: E402
from postroom.broker.tools.fuzzing import mqtt_connect, mqtt_packet, mqtt_string  # noqa: E402
from postroom.broker.tools.testing import free_port, process_memory, wait_for_port  # noqa: E402
from postroom.broker.tools.testing import rabbitmq_node as rabbitmq  # noqa: E402

MIB = 1 << 20


# -- the brokers ------------------------------------------------------------------------------


@contextmanager
def postroom() -> Iterator[tuple[int, int]]:
    """Postroom with an MQTT listener (``bench/run.py``'s start); yields ``(MQTT port, pid)``."""
    mqtt = free_port()
    listen = f'mqtt: "tcp:{mqtt}:interface=127.0.0.1", metrics: false, management: false'
    with run_postroom(listen=listen) as (_amqp, pid):
        wait_for_port(mqtt, 30)
        yield mqtt, pid


@contextmanager
def rabbitmq_mqtt() -> Iterator[tuple[int, int]]:
    """RabbitMQ 3.10 with ``rabbitmq_mqtt``; yields ``(MQTT port, pid of its VM)``."""
    mqtt = free_port()
    with rabbitmq(f"mqtt.listeners.tcp.1 = 127.0.0.1:{mqtt}\n", ["rabbitmq_mqtt"]) as (_amqp, pid):
        wait_for_port(mqtt, 60)
        yield mqtt, pid


# -- the client -------------------------------------------------------------------------------


def subscribe_packet(packet_id: int, *filters: tuple[str, int]) -> bytes:
    return mqtt_packet(0x82, struct.pack(">H", packet_id) + b"".join(mqtt_string(f) + bytes([q]) for f, q in filters))


def publish_packet(topic: str, payload: bytes, qos: int, packet_id: int) -> bytes:
    return mqtt_packet(0x30 | qos << 1, mqtt_string(topic) + (struct.pack(">H", packet_id) if qos else b"") + payload)


class Client(asyncio.Protocol):
    """One MQTT client: it reads packets and hands each to :meth:`packet`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.connacked = asyncio.get_running_loop().create_future()
        self.subacked = asyncio.get_running_loop().create_future()
        self.received = 0
        self.on_publish: Any = None
        self.on_ack: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        at, end = 0, len(buffer)
        while end - at >= 2:
            length, shift, index, complete = 0, 0, at + 1, False
            while index < end:
                byte = buffer[index]
                index += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    complete = True
                    break
            if not complete or end - index < length:
                break
            self.packet(buffer[at], bytes(buffer[index : index + length]))
            at = index + length
        del buffer[:at]

    def packet(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 3:
            self.received += 1
            qos = first >> 1 & 3
            if qos and self.transport is not None:
                size = struct.unpack_from(">H", body)[0]
                self.transport.write(b"\x40\x02" + body[2 + size : 4 + size])
            if self.on_publish is not None:
                self.on_publish(self, body)
        elif kind == 2 and not self.connacked.done():
            self.connacked.set_result(body[1])
        elif kind == 9 and not self.subacked.done():
            self.subacked.set_result(body[2:])
        elif kind == 4 and self.on_ack is not None:
            self.on_ack()

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.connacked, self.subacked):
            future.cancel()  # (one awaited raises CancelledError: the connection is gone)


async def open_client(port: int, client_id: str, source: str, *filters: tuple[str, int]) -> Client:
    loop = asyncio.get_running_loop()
    _transport, client = await loop.create_connection(Client, "127.0.0.1", port, local_addr=(source, 0))
    assert client.transport is not None
    client.transport.write(mqtt_connect(client_id))
    if await client.connacked != 0:
        raise ConnectionError(f"{client_id} refused")
    if filters:
        client.transport.write(subscribe_packet(1, *filters))
        await client.subacked
    return client


def settle_time_wait(most: int = 1000, seconds: float = 90.0) -> None:
    """Wait (up to ``seconds``) until fewer than ``most`` loopback sockets are in TIME-WAIT:
    thousands of clients just closed leave that many ports taken, and a RabbitMQ node started
    meanwhile failed on one (``dist_port_already_used``: the free port picked for its
    distribution was one of them)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        if sum(1 for line in lines if line.split()[3] == "06") < most:
            return
        time.sleep(1)


def listen_overflows() -> int:
    """The kernel's count of connections its accept queues dropped (TcpExt ListenOverflows)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[0::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    return 0


# -- the scenarios ----------------------------------------------------------------------------


async def clients_scenario(port: int, pid: int, count: int, ticks: int) -> dict[str, Any]:
    before = process_memory(pid)
    overflows = listen_overflows()
    started = time.perf_counter()
    sources = [f"127.0.0.{2 + n // 20000}" for n in range(count)]
    clients = await asyncio.gather(
        *(open_client(port, f"c{n}", sources[n], (f"dev/{n}", 0), ("all", 0)) for n in range(count))
    )
    connected = time.perf_counter() - started
    overflowed = listen_overflows() - overflows
    await asyncio.sleep(2)
    with_them = process_memory(pid)
    publisher = await open_client(port, "ticker", "127.0.0.1")
    assert publisher.transport is not None
    lasts: list[float] = []
    for tick in range(ticks):
        remaining = count
        done = asyncio.get_running_loop().create_future()

        def arrived(_client: Client, _body: bytes, done: asyncio.Future[float] = done) -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0 and not done.done():
                done.set_result(time.perf_counter())

        for client in clients:
            client.on_publish = arrived
        sent = time.perf_counter()
        publisher.transport.write(publish_packet("all", b"tick %d" % tick, 0, 0))
        lasts.append((await asyncio.wait_for(done, 60)) - sent)
        await asyncio.sleep(0.1)
    for client in [*clients, publisher]:
        if client.transport is not None:
            client.transport.write(b"\xe0\x00")
            client.transport.close()
    await asyncio.sleep(5)
    after = process_memory(pid)
    return {
        "clients": count,
        "connect_all_s": round(connected, 3),
        "listen_overflows": overflowed,
        "rss_before_mib": round(before / MIB, 1),
        "rss_with_clients_mib": round(with_them / MIB, 1),
        "rss_after_mib": round(after / MIB, 1),
        "kib_per_connection": round((with_them - before) / count / 1024, 1),
        "tick_last_p50_ms": round(statistics.median(lasts) * 1000, 1),
        "tick_last_max_ms": round(max(lasts) * 1000, 1),
    }


async def throughput_scenario(port: int, qos: int, size: int, seconds: float) -> dict[str, Any]:
    subscriber = await open_client(port, "sink", "127.0.0.1", ("load/t", qos))
    publisher = await open_client(port, "source", "127.0.0.1")
    assert publisher.transport is not None
    transport = publisher.transport
    body = b"x" * size
    window = asyncio.Semaphore(100) if qos else None
    if window is not None:
        publisher.on_ack = window.release
    deadline = time.perf_counter() + seconds
    packet_id = 0
    sent = 0
    start_received = subscriber.received
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(200):
            if window is not None:
                await window.acquire()
                packet_id = packet_id % 65535 + 1
            transport.write(publish_packet("load/t", body, qos, packet_id))
            sent += 1
        if window is None:
            while transport.get_write_buffer_size() > 1 << 20:
                await asyncio.sleep(0.001)
        else:
            await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    received = subscriber.received - start_received
    for client in (subscriber, publisher):
        if client.transport is not None:
            client.transport.write(b"\xe0\x00")
            client.transport.close()
    await asyncio.sleep(0.5)
    return {"qos": qos, "size": size, "sent": sent, "received_msgs_per_s": round(received / elapsed)}


# -- the runs ---------------------------------------------------------------------------------


def run_scenarios(name: str, port: int, pid: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    records = []
    if "throughput" in args.scenarios:
        for qos in (0, 1):
            for size in args.sizes:
                record = asyncio.run(throughput_scenario(port, qos, size, args.seconds))
                records.append({"broker": name, "scenario": "throughput", **record})
                print(json.dumps(records[-1]), flush=True)
    if "clients" in args.scenarios:
        record = asyncio.run(clients_scenario(port, pid, args.clients, args.ticks))
        records.append({"broker": name, "scenario": "clients", **record})
        print(json.dumps(records[-1]), flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="throughput,clients", type=lambda v: v.split(","))
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--sizes", default="16,1024", type=lambda v: [int(s) for s in v.split(",")])
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mqtt.jsonl")
    args = parser.parse_args()
    records: list[dict[str, Any]] = []
    brokers = [("postroom", postroom)] + ([] if args.no_rabbitmq else [("rabbitmq", rabbitmq_mqtt)])
    # Each scenario on a broker of its own (memory is measured from its start), one broker and
    # straight after the other, the first to go alternating.
    for number, scenario in enumerate(args.scenarios):
        for name, start in brokers[:: -1 if number % 2 else 1]:
            settle_time_wait()
            with start() as (port, pid):
                records += run_scenarios(name, port, pid, argparse.Namespace(**{**vars(args), "scenarios": [scenario]}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    print(table(records))


def table(records: list[dict[str, Any]]) -> str:
    """A markdown table: each figure, Postroom's and RabbitMQ's, and their ratio."""
    rows = ["| scenario | figure | Postroom | RabbitMQ | ratio |", "|---|---|---|---|---|"]
    by = {(r["broker"], r["scenario"], r.get("qos"), r.get("size")): r for r in records}
    for (broker, scenario, qos, size), record in by.items():
        if broker != "postroom":
            continue
        other = by.get(("rabbitmq", scenario, qos, size), {})
        label = f"{scenario} QoS {qos}, {size} B" if scenario == "throughput" else f"{scenario} ({record['clients']:,})"
        for key, value in record.items():
            if key in ("broker", "scenario", "qos", "size", "sent", "clients") or not isinstance(value, (int, float)):
                continue
            theirs = other.get(key)
            ratio = f"{value / theirs:.2f}" if isinstance(theirs, (int, float)) and theirs else ""
            rows.append(f"| {label} | {key} | {value:,} | {theirs if theirs is not None else ''} | {ratio} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()

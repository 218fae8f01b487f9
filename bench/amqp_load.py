"""Postroom's AMQP 0-9-1 load generator: raw sockets and pamqp, one process per publisher and
per consumer, any broker on any port.

Scenarios (``--scenario``, a comma list), each ``--runs`` times for each ``--size``:

* ``transient``: one non-durable queue through the default exchange, ``delivery_mode`` 1, one
  publisher, one consumer (prefetch 1000, ``basic.ack`` with ``multiple`` every 100);
* ``persistent``: one durable queue (``--queue-type stream``: a stream, read from ``first`` at
  once), ``delivery_mode`` 2, publisher confirms with at most 1000 unconfirmed, 100 a write;
* ``fanout``: a fanout exchange bound to 10 queues, two consumer processes of 5 queues each;
* ``topic``: a topic exchange with 1000 bindings over 100 queues (exact keys and patterns
  with ``*`` and ``#``, drawn with seed 42), 1000 routing keys in turn, two consumer processes
  of 50 queues each;
* ``latency``: the transient layout at ``--rate`` messages a second (a batch a millisecond).

Every message carries the time it was sent (``time.monotonic_ns``, one clock for every process
of the machine) in its first 8 bytes: consumers report the end-to-end latency percentiles.
The figure compared is deliveries a second over ``--seconds`` after a second of warm-up.
Names start with ``amqp_bench.`` and are deleted after each run. One JSON line per run::

    python bench/amqp_load.py --port 5672 --scenario transient,persistent --size 16,1024 --seconds 8
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import struct
import sys
import time
from typing import Any

from pamqp import commands, frame, header
from pamqp.base import Frame

_FRAME = struct.Struct(">BHI")
_STAMP = struct.Struct(">q")
_DELIVER = (60 << 16) | 60
_CONFIRM_ACK, _CONFIRM_NACK = (60 << 16) | 80, (60 << 16) | 120
_FANOUT_QUEUES, _TOPIC_BINDINGS, _TOPIC_QUEUES, _TOPIC_KEYS = 10, 1000, 100, 1000


class Client:
    """One AMQP 0-9-1 connection with channel 1 open."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.socket = socket.create_connection((args.host, args.port))
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.socket.sendall(b"AMQP\x00\x00\x09\x01")
        self.wait(commands.Connection.Start, 0)
        response = f"\0{args.user}\0{args.password}"
        self.send(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response=response), 0)
        tune = self.wait(commands.Connection.Tune, 0)
        self.send(commands.Connection.TuneOk(tune.channel_max, min(tune.frame_max or 131072, 131072), 0), 0)
        self.send(commands.Connection.Open(args.vhost), 0)
        self.wait(commands.Connection.OpenOk, 0)
        self.send(commands.Channel.Open(), 1)
        self.wait(commands.Channel.OpenOk, 1)

    def send(self, method: Frame, channel: int = 1) -> None:
        self.socket.sendall(frame.marshal(method, channel))

    def wait(self, kind: type, channel: int = 1) -> Any:
        """Read frames until ``kind`` arrives on ``channel`` (a close raises)."""
        while True:
            while len(self.buffer) < 7 or len(self.buffer) < 8 + _FRAME.unpack_from(self.buffer)[2]:
                data = self.socket.recv(1 << 20)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                self.buffer += data
            used, number, value = frame.unmarshal(self.buffer)
            self.buffer = self.buffer[used:]
            if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                raise ConnectionError(f"{value.reply_code} {value.reply_text}")
            if isinstance(value, kind) and number == channel:
                return value

    def call(self, method: Frame, reply: type) -> Any:
        self.send(method)
        return self.wait(reply)

    def close(self) -> None:
        try:
            self.socket.close()
        except OSError:
            pass


def layout(args: argparse.Namespace, scenario: str, tag: str) -> tuple[str, list[str], list[str], list[list[str]]]:
    """Declare the scenario's exchange and queues: ``(exchange, routing keys to publish with,
    queues, queues of each consumer process)``."""
    client = Client(args)
    try:
        if scenario in ("transient", "latency", "persistent"):
            durable = scenario == "persistent"
            arguments = {"x-queue-type": args.queue_type} if args.queue_type != "classic" and durable else {}
            declare = commands.Queue.Declare(queue=tag, durable=durable, arguments=arguments)
            client.call(declare, commands.Queue.DeclareOk)
            return "", [tag], [tag], [[tag]]
        kind = "fanout" if scenario == "fanout" else "topic"
        client.call(commands.Exchange.Declare(exchange=tag, exchange_type=kind), commands.Exchange.DeclareOk)
        count = _FANOUT_QUEUES if kind == "fanout" else _TOPIC_QUEUES
        queues = [f"{tag}.{n}" for n in range(count)]
        for queue in queues:
            client.call(commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        if kind == "fanout":
            for queue in queues:
                client.call(commands.Queue.Bind(queue=queue, exchange=tag), commands.Queue.BindOk)
            keys = [""]
        else:
            # Keys region.service.level.item; patterns of mixed kinds, each from a key's parts:
            # 40% exact, 30% r.s.l.*, 20% r.*.l.i, 9% r.s.#, 1% #.l.i (about two queues a message).
            draw = random.Random(42)
            spans = (("r", 10), ("s", 10), ("l", 5), ("i", 20))
            parts = [tuple(f"{name}{draw.randrange(span)}" for name, span in spans) for _ in range(_TOPIC_KEYS)]
            keys = [".".join(key) for key in parts]
            shapes = ["{0}.{1}.{2}.{3}"] * 40 + ["{0}.{1}.{2}.*"] * 30 + ["{0}.*.{2}.{3}"] * 20
            shapes += ["{0}.{1}.#"] * 9 + ["#.{2}.{3}"]
            for n in range(_TOPIC_BINDINGS):
                pattern = draw.choice(shapes).format(*draw.choice(parts))
                client.call(
                    commands.Queue.Bind(queue=queues[n % count], exchange=tag, routing_key=pattern),
                    commands.Queue.BindOk,
                )
        half = len(queues) // 2
        return tag, keys, queues, [queues[:half], queues[half:]]
    finally:
        client.close()


def remove(args: argparse.Namespace, exchange: str, queues: list[str]) -> None:
    client = Client(args)
    try:
        for queue in queues:
            client.call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        if exchange:
            client.call(commands.Exchange.Delete(exchange=exchange), commands.Exchange.DeleteOk)
    finally:
        client.close()


def publisher(
    args: argparse.Namespace, scenario: str, exchange: str, keys: list[str], size: int, until: float, out: Any
) -> None:
    """Publish until ``until`` (monotonic seconds); put the messages published (confirmed)."""
    client = Client(args)
    client.socket.settimeout(10)
    persistent = scenario == "persistent"
    if persistent:
        client.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    heads = [
        frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), 1)
        + frame.marshal(header.ContentHeader(0, max(size, 8), properties), 1)
        for key in keys
    ]
    body_head = _FRAME.pack(3, 1, max(size, 8))
    padding = b"x" * max(size - 8, 0) + b"\xce"
    stamp = _STAMP.pack
    sent = confirmed = 0
    interval = 0.001
    per_tick = max(1, round(args.rate * interval)) if scenario == "latency" else 100
    next_tick = time.monotonic()
    sock = client.socket
    while time.monotonic() < until:
        if persistent:
            while sent - confirmed >= 1000:
                confirmed = _read_confirms(client, confirmed)
        if scenario == "latency":
            next_tick += interval
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        now = stamp(time.monotonic_ns())
        sock.sendall(b"".join([heads[(sent + n) % len(heads)] + body_head + now + padding for n in range(per_tick)]))
        sent += per_tick
    if persistent:
        deadline = time.monotonic() + 10
        while confirmed < sent and time.monotonic() < deadline:
            confirmed = _read_confirms(client, confirmed)
    out.put(confirmed if persistent else sent)
    client.close()


def _read_confirms(client: Client, confirmed: int) -> int:
    """Read what arrives and count the confirms in it (multiple ones count what they cover)."""
    data = client.socket.recv(1 << 16)
    if not data:
        raise ConnectionError("the broker closed the connection")
    client.buffer += data
    buffer, at = client.buffer, 0
    while len(buffer) - at >= 7:
        kind, _channel, length = _FRAME.unpack_from(buffer, at)
        if len(buffer) - at < 8 + length:
            break
        if kind == 1:
            method = struct.unpack_from(">I", buffer, at + 7)[0]
            if method in (_CONFIRM_ACK, _CONFIRM_NACK):
                tag, multiple = struct.unpack_from(">QB", buffer, at + 11)
                confirmed = tag if multiple else max(confirmed, tag)
            elif method >> 16 in (10, 20):
                raise ConnectionError("the broker closed the channel or the connection")
        at += 8 + length
    client.buffer = buffer[at:]
    return confirmed


def consumer(args: argparse.Namespace, queues: list[str], stream: bool, window: tuple[float, float], out: Any) -> None:
    """Consume from ``queues`` until the window ends; put ``(deliveries in the window, latencies)``."""
    client = Client(args)
    client.call(commands.Basic.Qos(prefetch_count=1000), commands.Basic.QosOk)
    arguments = {"x-stream-offset": "first"} if stream else {}
    for queue in queues:
        client.call(commands.Basic.Consume(queue=queue, arguments=arguments), commands.Basic.ConsumeOk)
    start, end = window
    counted = unacked = 0
    last_tag = 0
    latencies: list[float] = []
    buffer, sock = client.buffer, client.socket
    sock.settimeout(0.5)
    ack = struct.Struct(">BHIIQBB")
    while True:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            data = b""
        now = time.monotonic()
        if now >= end:
            break
        if not data:
            continue
        buffer += data
        at = 0
        size = len(buffer)
        while size - at >= 7:
            kind, _channel, length = _FRAME.unpack_from(buffer, at)
            if size - at < 8 + length:
                break
            if kind == 1 and struct.unpack_from(">I", buffer, at + 7)[0] == _DELIVER:
                last_tag = struct.unpack_from(">Q", buffer, at + 12 + buffer[at + 11])[0]
                unacked += 1
                if now >= start:
                    counted += 1
            elif kind == 3 and now >= start and len(latencies) < 200_000:
                latencies.append((time.monotonic_ns() - _STAMP.unpack_from(buffer, at + 7)[0]) / 1e6)
            at += 8 + length
        buffer = buffer[at:]
        if unacked >= 100:
            sock.sendall(ack.pack(1, 1, 13, (60 << 16) | 80, last_tag, 1, 0xCE))
            unacked = 0
    out.put((counted, latencies))
    client.close()


def run(args: argparse.Namespace, scenario: str, size: int, number: int) -> dict[str, Any]:
    tag = f"amqp_bench.{scenario}.{os.getpid()}.{number}.{random.randrange(1 << 30):x}"
    exchange, keys, queues, groups = layout(args, scenario, tag)
    record: dict[str, Any] = {"scenario": scenario, "size": size, "errors": [], "params": {}}
    if scenario == "latency":
        record["params"]["rate"] = args.rate
    try:
        results: Any = multiprocessing.Queue()
        started = time.monotonic()
        window = (started + 1.0, started + 1.0 + args.seconds)
        stream = scenario == "persistent" and args.queue_type == "stream"
        readers = [
            multiprocessing.Process(target=consumer, args=(args, group, stream, window, results)) for group in groups
        ]
        writer = multiprocessing.Process(
            target=publisher, args=(args, scenario, exchange, keys, size, window[1], results)
        )
        for process in [*readers, writer]:
            process.start()
        try:
            found = [results.get(timeout=args.seconds + 60) for _ in range(len(readers) + 1)]
        finally:
            for process in [*readers, writer]:
                process.join(30)
                if process.is_alive():
                    process.terminate()
        published = next(item for item in found if isinstance(item, int))
        consumed = [item for item in found if isinstance(item, tuple)]
        deliveries = sum(count for count, _ in consumed)
        latencies = sorted(value for _, values in consumed for value in values)
        record["published_msgs_per_s"] = published / (window[1] - started)
        record["consumed_msgs_per_s"] = deliveries / args.seconds
        if latencies:
            record["latency_ms"] = {
                "p50": latencies[len(latencies) // 2],
                "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            }
    except Exception as error:  # noqa: BLE001 (a failed run is a record saying why)
        record["errors"].append(f"{type(error).__name__}: {error}")
    finally:
        try:
            remove(args, exchange, queues)
        except (OSError, ConnectionError) as error:
            record["errors"].append(f"cleanup: {error}")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--vhost", default="/")
    parser.add_argument("--broker-pid", type=int, help="(kept for the runners; not read)")
    parser.add_argument("--scenario", default="transient")
    parser.add_argument("--size", default="16")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rate", type=int, default=2000, help="messages a second (latency)")
    parser.add_argument("--queue-type", default="classic", help="persistent: classic or stream")
    args = parser.parse_args()
    for scenario in args.scenario.split(","):
        for size in (int(value) for value in args.size.split(",")):
            for number in range(args.runs):
                print(json.dumps(run(args, scenario, size, number)), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

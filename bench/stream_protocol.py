"""RabbitMQ's stream protocol, Postroom against RabbitMQ 3.10.8's ``rabbitmq_stream``, with
one raw-socket load generator for both (as ``bench/amqp_load.py`` is for AMQP 0-9-1).

For each broker in turn, started here on loopback (Postroom with storage, RabbitMQ with its
stream plugin): create a stream, publish ``--messages`` messages of each ``--sizes`` with
confirms, ``--batch`` messages a ``publish`` frame, at most ``--in-flight`` unconfirmed; then
read them all back from ``first`` (credit 10 chunks, one more for each chunk received).
Reports messages a second for each, and the broker's resident memory after. ::

    python bench/stream_protocol.py --messages 1000000 --sizes 16,1024 [--brokers postroom,rabbitmq] [--json F]

``--latency RATE``: instead, one publisher sends ``RATE`` messages a second (16 B, a frame each
millisecond, for ``--seconds``) while a subscriber from ``next`` on another connection reads
them; each message carries the time it was sent, and the end-to-end latencies' percentiles
are reported. ``--readers N``: instead, ``--messages`` messages of the first size are
published, then N subscribers read them all from ``first`` at once, each on its connection and
thread, with the broker's resident memory sampled all along (its growth over the start of the
reading is reported). ``--cpus 0``: the broker runs on those CPUs only (``taskset``).

The messages are AMQP 1.0 (one data section), as stream clients send them.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import postroom  # noqa: E402
from postroom.broker.tools.testing import MemoryReadings, free_port, process_memory, rabbitmq_node, wait_for_port  # noqa: E402

_u32 = struct.Struct(">I")
_head = struct.Struct(">IHH")


def frame(key: int, body: bytes) -> bytes:
    return _head.pack(4 + len(body), key, 1) + body


def string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


class Peer:
    """A blocking stream-protocol connection: the handshake, requests, and raw frames."""

    def __init__(self, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port))
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.correlation = 0
        self.request(17, _u32.pack(0))  # peer_properties
        self.request(18, b"")  # sasl_handshake
        plain = b"\0guest\0guest"
        self.socket.sendall(self._correlated(19, string("PLAIN") + _u32.pack(len(plain)) + plain))
        while not any(struct.unpack_from(">H", f)[0] == 20 for f in self.frames()):
            pass
        self.socket.sendall(frame(20 | 0x8000, struct.pack(">II", 1048576, 0)))
        self.request(21, string("/"))  # open

    def _correlated(self, key: int, body: bytes) -> bytes:
        self.correlation += 1
        return frame(key, _u32.pack(self.correlation) + body)

    def request(self, key: int, body: bytes) -> bytes:
        """Send a request and wait for its response (other frames in between are dropped)."""
        self.socket.sendall(self._correlated(key, body))
        while True:
            for got in self.frames():
                if struct.unpack_from(">H", got)[0] == key | 0x8000:
                    return got

    def frames(self) -> list[bytes]:
        """The whole frames in what one read brings (waiting for one)."""
        found: list[bytes] = []
        while not found:
            data = self.socket.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            buffer = self.buffer
            buffer += data
            at = 0
            while len(buffer) - at >= 4:
                size = _u32.unpack_from(buffer, at)[0]
                if len(buffer) - at - 4 < size:
                    break
                found.append(bytes(buffer[at + 4 : at + 4 + size]))
                at += 4 + size
            del buffer[:at]
        return found

    def close(self) -> None:
        self.socket.close()


def message(size: int) -> bytes:
    """An AMQP 1.0 message of one data section holding ``size`` bytes."""
    payload = b"x" * size
    section = b"\xa0" + bytes((size,)) if size < 256 else b"\xb0" + _u32.pack(size)
    return b"\x00\x53\x75" + section + payload


def publish(port: int, stream: str, count: int, size: int, batch: int, in_flight: int) -> float:
    """Messages a second, from the first publish to the last confirm."""
    peer = Peer(port)
    peer.request(13, string(stream) + _u32.pack(0))  # create
    peer.request(1, bytes((1,)) + string("") + string(stream))  # declare_publisher 1
    body = message(size)
    entry = struct.Struct(f">QI{len(body)}s")
    pack = entry.pack
    sock = peer.socket
    next_id, confirmed = 1, 0
    started = time.perf_counter()
    while confirmed < count:
        while next_id <= count and next_id - 1 - confirmed < in_flight:
            last = min(next_id + batch, count + 1)
            parts = [pack(i, len(body), body) for i in range(next_id, last)]
            payload = b"".join(parts)
            sock.sendall(_head.pack(9 + len(payload), 2, 1) + bytes((1,)) + _u32.pack(last - next_id) + payload)
            next_id = last
        for got in peer.frames():
            key = struct.unpack_from(">H", got)[0]
            if key == 3:  # publish_confirm: publisher, then the count of ids
                confirmed += _u32.unpack_from(got, 5)[0]
            elif key == 4:
                raise RuntimeError("publish_error")
    elapsed = time.perf_counter() - started
    peer.close()
    return count / elapsed


def consume(port: int, stream: str, count: int) -> float:
    """Messages a second, reading ``count`` from ``first``.

    What arrives is read into one buffer and only the frames' heads are looked at (a chunk is
    not copied again), so that the reader costs as little as it can and the broker is what is
    measured."""
    peer = Peer(port)
    sock = peer.socket
    credit = frame(9, bytes((1,)) + struct.pack(">h", 1))
    buffer = bytearray(8 << 20)
    view = memoryview(buffer)
    have = len(peer.buffer)
    buffer[:have] = peer.buffer
    skip = 0  # bytes of the frame being passed over still to come
    started = time.perf_counter()
    sock.sendall(peer._correlated(7, bytes((1,)) + string(stream) + struct.pack(">hH", 1, 10)))
    read = 0
    while read < count:
        got = sock.recv_into(view[have:])
        if not got:
            raise ConnectionError("closed")
        have += got
        at, chunks = 0, 0
        while True:
            if skip:
                step = min(skip, have - at)
                at += step
                skip -= step
                if skip:
                    break
            if have - at < 6:
                break
            size, key = _size_key.unpack_from(buffer, at)
            if key == 8:  # deliver: subscription, magic, type, entries, then records
                if have - at < 17:
                    break
                read += _u32.unpack_from(buffer, at + 13)[0]
                chunks += 1
            skip = 4 + size
        rest = have - at  # (a frame's head cut short, if anything)
        buffer[:rest] = buffer[at:have]
        have = rest
        if chunks:
            sock.sendall(credit * chunks)
    elapsed = time.perf_counter() - started
    peer.close()
    return count / elapsed


_size_key = struct.Struct(">IH")
_ENTRY_SIZE = struct.Struct(">I")
_SENT = struct.Struct(">Q")
#: Where a deliver frame's first entry starts: key, version, subscription, then osiris's head.
_DATA_AT = 2 + 2 + 1 + 44


def latency(port: int, stream: str, rate: int, seconds: float) -> dict[str, float]:
    """End-to-end latency percentiles (milliseconds) of 16 B messages sent at ``rate`` a second."""
    peer = Peer(port)
    peer.request(13, string(stream) + _u32.pack(0))
    peer.request(1, bytes((1,)) + string("") + string(stream))
    reader = Peer(port)
    reader.request(7, bytes((1,)) + string(stream) + struct.pack(">hH", 3, 10))  # from next
    total = int(rate * seconds)
    latencies: list[int] = []
    credit = frame(9, bytes((1,)) + struct.pack(">h", 1))

    def read() -> None:
        while len(latencies) < total:
            frames = reader.frames()
            now = time.perf_counter_ns()
            chunks = 0
            for got in frames:
                if struct.unpack_from(">H", got)[0] != 8:
                    continue
                chunks += 1
                at = _DATA_AT
                while at < len(got):
                    size = _ENTRY_SIZE.unpack_from(got, at)[0]
                    # the message: 0x00 0x53 0x75, a data section's head (2 bytes), the time sent
                    latencies.append(now - _SENT.unpack_from(got, at + 4 + 5)[0])
                    at += 4 + size
            if chunks:
                reader.socket.sendall(credit * chunks)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    per_tick = max(1, rate // 1000)
    sock = peer.socket
    sent, next_id, started = 0, 1, time.perf_counter()
    while sent < total:
        wait = started + sent / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        count = min(per_tick, total - sent)
        now = time.perf_counter_ns()
        parts = [
            struct.pack(">QI", next_id + i, 21) + b"\x00\x53\x75\xa0\x10" + _SENT.pack(now) + bytes(8)
            for i in range(count)
        ]
        payload = b"".join(parts)
        sock.sendall(_head.pack(9 + len(payload), 2, 1) + bytes((1,)) + _u32.pack(count) + payload)
        sent += count
        next_id += count
    thread.join(seconds + 30)
    peer.close()
    reader.close()
    ordered = sorted(latencies)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] / 1e6 if ordered else float("nan")

    return {"received": len(latencies), "p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999), "max_ms": at(1.0)}


def readers(port: int, pid: int, stream: str, count: int, size: int, many: int) -> dict[str, float]:
    """``many`` subscribers read ``count`` messages from ``first`` at once: the seconds it took
    and the broker's resident memory (MiB) at the start and at its peak."""
    publish(port, stream, count, size, 100, 10_000)
    sampler = MemoryReadings(pid)
    sampler.start()
    time.sleep(0.5)
    before = process_memory(pid)
    threads = [threading.Thread(target=consume, args=(port, stream, count)) for _ in range(many)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    sampler.stopped.set()
    sampler.join()
    return {"seconds": elapsed, "rss_before_mib": before / 2**20, "rss_peak_mib": sampler.peak / 2**20}


def pin(pid: int, cpus: str) -> None:
    """Run every thread of process ``pid`` on ``cpus`` only."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)


@contextmanager
def postroom_streams(storage: str = "") -> Iterator[tuple[int, int]]:
    """A Postroom process with storage and the stream listener: ``(stream port, pid)``;
    ``storage``: more ``storage:`` keys."""
    port = free_port()
    listen = f'stream: "tcp:{port}:interface=127.0.0.1", metrics: false, management: false'
    with postroom(storage=storage, listen=listen) as (_, pid):
        wait_for_port(port, 60)
        yield port, pid


@contextmanager
def rabbitmq() -> Iterator[tuple[int, int]]:
    """A RabbitMQ node with its stream plugin: ``(stream port, pid)``."""
    port = free_port()
    config = f"stream.listeners.tcp.1 = 127.0.0.1:{port}\nstream.advertised_host = 127.0.0.1\n"
    with rabbitmq_node(config, ["rabbitmq_stream"]) as (_amqp, pid):
        wait_for_port(port, 60)
        yield port, pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="postroom,rabbitmq")
    parser.add_argument("--sizes", default="16,1024")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--latency", type=int, default=0, help="messages a second (the latency run)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--readers", type=int, default=0, help="subscribers at once (the memory run)")
    parser.add_argument("--cpus", default="", help="the CPUs the broker may run on")
    parser.add_argument("--fsync-interval-ms", type=int, help="Postroom's storage.fsync_interval_ms")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for name in args.brokers.split(","):
        interval = "" if args.fsync_interval_ms is None else f"fsync_interval_ms: {args.fsync_interval_ms}"
        with postroom_streams(interval) if name == "postroom" else rabbitmq() as (port, pid):
            if args.cpus:
                pin(pid, args.cpus)
            if args.latency:
                row: dict[str, Any] = {"broker": name, "rate": args.latency}
                row.update(latency(port, "bench-latency", args.latency, args.seconds))
                results.append(row)
                print(
                    f"{name:9} {args.latency:,} msg/s  received {row['received']:,}  p50 {row['p50_ms']:.2f} ms"
                    f"  p99 {row['p99_ms']:.2f} ms  p99.9 {row['p999_ms']:.2f} ms  max {row['max_ms']:.2f} ms",
                    flush=True,
                )
                continue
            if args.readers:
                size = int(args.sizes.split(",")[0])
                row = {"broker": name, "size": size, "messages": args.messages, "readers": args.readers}
                row.update(readers(port, pid, "bench-readers", args.messages, size, args.readers))
                results.append(row)
                print(
                    f"{name:9} {args.readers} readers of {args.messages:,} x {size} B: {row['seconds']:.1f} s,"
                    f"  RSS {row['rss_before_mib']:,.0f} -> peak {row['rss_peak_mib']:,.0f} MiB",
                    flush=True,
                )
                continue
            for size in (int(s) for s in args.sizes.split(",")):
                stream = f"bench-{size}"
                published = publish(port, stream, args.messages, size, args.batch, args.in_flight)
                consumed = consume(port, stream, args.messages)
                row = {
                    "broker": name,
                    "size": size,
                    "publish": published,
                    "consume": consumed,
                    "rss_mib": process_memory(pid) / 2**20,
                }
                results.append(row)
                print(
                    f"{name:9} {size:5} B  publish {published:11,.0f} msg/s  consume {consumed:11,.0f} msg/s"
                    f"  RSS {row['rss_mib']:,.0f} MiB",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

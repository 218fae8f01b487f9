"""A requeue-heavy run against Postroom and RabbitMQ back to back: every delivery nacked with requeue.

A consumer with prefetch 1,000 over a queue of 10,000 messages (16 B bodies and a headers
table of four entries, so that the broker's handling of headers on a return is paid) nacks
every 100 deliveries with ``multiple`` and ``requeue``: each message goes round and round.
The figure is deliveries per second over the window. It exercises the return path
(``basic.nack`` requeue, the head of the queue, ``redelivered``, and on Postroom the
``x-delivery-count`` spliced into the header) that ordinary throughput runs never touch.

    python bench/requeue.py                       # both brokers, 10 s windows, 3 runs each
    python bench/requeue.py --no-rabbitmq --runs 1 --seconds 5

The client is raw sockets and ``struct`` (pamqp for the handshake), so it is not the limit.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import postroom  # noqa: E402
from postroom.broker.tools.testing import rabbitmq_node  # noqa: E402

#: Messages kept going round (ten prefetch windows: the queue is never empty).
MESSAGES = 10_000
PREFETCH = 1_000
#: Deliveries settled per nack (``multiple``), as the load generator acks.
NACK_EVERY = 100
HEADERS = {"tenant": "acme", "attempt": 1, "trace": "0af7651916cd43dd8448eb211c80319c", "priority": 0.5}

_frame_head = struct.Struct(">BHI")
_DELIVER = struct.pack(">HH", 60, 60)


class Client:
    """One AMQP connection on a raw socket, channel 1 open."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        tune = self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def send(self, channel: int, *values: object) -> None:
        self.sock.sendall(b"".join(frame.marshal(value, channel) for value in values))

    def expect(self, kind: type) -> object:
        while True:
            while len(self.buffer) >= 7:
                size = _frame_head.unpack_from(self.buffer)[2]
                if len(self.buffer) < size + 8:
                    break
                _used, _channel, value = frame.unmarshal(self.buffer[: size + 8])
                self.buffer = self.buffer[size + 8 :]
                if isinstance(value, kind):
                    return value
            self.buffer += self.sock.recv(65536)

    def close(self) -> None:
        self.send(0, commands.Connection.Close(reply_code=200, reply_text="done", class_id=0, method_id=0))
        self.sock.close()


def run_once(port: int, seconds: float) -> float:
    """Fill a fresh queue, then nack-requeue everything for ``seconds``: deliveries per second."""
    queue = f"bench.requeue.{time.monotonic_ns()}"
    client = Client(port)
    client.send(1, commands.Queue.Declare(queue=queue, auto_delete=False))
    client.expect(commands.Queue.DeclareOk)
    body = b"x" * 16
    properties = commands.Basic.Properties(headers=HEADERS)
    one = b"".join(
        frame.marshal(value, 1)
        for value in (
            commands.Basic.Publish(routing_key=queue),
            ContentHeader(0, len(body), properties),
            ContentBody(body),
        )
    )
    for start in range(0, MESSAGES, 1000):
        client.sock.sendall(one * min(1000, MESSAGES - start))
    client.send(1, commands.Queue.Declare(queue=queue, passive=True))
    client.expect(commands.Queue.DeclareOk)
    client.send(1, commands.Basic.Qos(prefetch_count=PREFETCH))
    client.expect(commands.Basic.QosOk)
    client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="requeue"))
    client.expect(commands.Basic.ConsumeOk)
    sock = client.sock
    data = client.buffer
    delivered = 0
    since_nack = 0
    last_tag = 0
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("broker closed the connection")
        data += chunk
        pos = 0
        end = len(data)
        while end - pos >= 7:
            kind, _channel, size = _frame_head.unpack_from(data, pos)
            if end - pos < size + 8:
                break
            if kind == 1 and data.startswith(_DELIVER, pos + 7):
                tag_at = pos + 7 + 4 + 1 + data[pos + 11]
                last_tag = struct.unpack_from(">Q", data, tag_at)[0]
                delivered += 1
                since_nack += 1
            pos += size + 8
        data = data[pos:]
        if since_nack >= NACK_EVERY:
            sock.sendall(frame.marshal(commands.Basic.Nack(delivery_tag=last_tag, multiple=True, requeue=True), 1))
            since_nack = 0
    rate = delivered / (time.monotonic() - started)
    client.sock.sendall(frame.marshal(commands.Queue.Delete(queue=queue), 1))
    client.close()
    return rate


def main(argv: list[str] | None = None) -> int:
    """Run the requeue-heavy window on each broker, alternating, and print medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        brokers = {"postroom": stack.enter_context(postroom())[0]}
        if not args.no_rabbitmq:
            brokers["rabbitmq"] = stack.enter_context(rabbitmq_node())[0]
        rates: dict[str, list[float]] = {name: [] for name in brokers}
        for run in range(args.runs):
            order = list(brokers) if run % 2 == 0 else list(reversed(brokers))
            for name in order:
                rate = run_once(brokers[name], args.seconds)
                rates[name].append(rate)
                print(f"{name} run {run + 1}: {rate:,.0f} deliveries/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"{name}: median {value:,.0f} deliveries/s over {args.runs} x {args.seconds:g} s")
    if "rabbitmq" in medians:
        print(f"ratio postroom/rabbitmq: {medians['postroom'] / medians['rabbitmq']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Durable subscriptions to streams: a named consumer picks up after what it acknowledged, after a
reconnect, a clean restart and a SIGKILL; consumers sharing a name with single active consumer
form a failover group.

Each start is a real ``postroom serve`` over the same data directory, with pika as the client.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom.broker.tools.testing import free_port
from postroom.exchanges.partitions import partition_of
from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration


def open_channel(port: int, prefetch: int = 50) -> tuple[pika.BlockingConnection, Any]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    return connection, channel


def publish(port: int, count: int, start: int = 0) -> None:
    """``count`` numbered messages into stream ``events``, each confirmed."""
    connection, channel = open_channel(port)
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for number in range(start, start + count):
        channel.basic_publish("", "events", b"%d" % number)
    connection.close()


def read_acking(port: int, name: str, until: int, offset: Any = "first", group: bool = False) -> list[int]:
    """Consume as subscription ``name``, acknowledging each delivery up to offset ``until``
    (exclusive), then leave: the offsets of every delivery, in order."""
    connection, channel = open_channel(port)
    got: list[int] = []
    arguments = {"x-stream-offset": offset, "x-stream-consumer-name": name}
    if group:
        arguments["x-single-active-consumer"] = True

    def on(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        offset = properties.headers["x-stream-offset"]
        got.append(offset)
        if offset < until:
            channel.basic_ack(method.delivery_tag)

    channel.basic_consume("events", on, arguments=arguments)
    deadline = time.monotonic() + 10
    while (not got or got[-1] < until) and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    settle(connection, got)
    connection.close()
    return got


def settle(connection: pika.BlockingConnection, got: list[int]) -> None:
    """Process events until three rounds in a row bring nothing: every delivery the credit allows
    has reached the callback (pika rejects deliveries still waiting in its buffer when it closes,
    which a stream refuses, as RabbitMQ's does). A round sends the acks of the one before, so
    one round without deliveries is not yet quiet."""
    quiet = 0
    while quiet < 3:
        seen = len(got)
        connection.process_data_events(time_limit=0.2)
        quiet = quiet + 1 if len(got) == seen else 0


def test_a_named_consumer_resumes_after_its_acks_across_reconnects_restarts_and_kills(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data) as (_process, port):
        publish(port, 1000)
        first = read_acking(port, "billing", 300)
        assert first[0] == 0 and first[-1] >= 300  # 300 acked, more delivered and not acked
        again = read_acking(port, "billing", 400, offset="last")  # a stored offset wins over x-stream-offset
        assert again[0] == 300
        other = read_acking(port, "audit", 5)  # another subscription reads on its own
        assert other[0] == 0
    with broker(data) as (process, port):  # after a clean stop
        after_stop = read_acking(port, "billing", 500)
        assert after_stop[0] == 400
        publish(port, 1, start=1000)  # confirmed: the stored offsets before it are written
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(data) as (_process, port):
        after_kill = read_acking(port, "billing", 1001)
        assert after_kill[0] == 500 and after_kill[-1] == 1000
        assert read_acking(port, "audit", 6)[0] == 5
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_a_group_reads_with_one_member_and_the_next_takes_over_where_it_stopped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data) as (_process, port):
        publish(port, 100)
        arguments = {"x-stream-offset": "first", "x-stream-consumer-name": "g", "x-single-active-consumer": True}
        standby, standby_channel = open_channel(port, prefetch=200)
        waiting: list[int] = []
        active, active_channel = open_channel(port, prefetch=200)
        read: list[int] = []

        def on_active(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
            read.append(properties.headers["x-stream-offset"])
            if properties.headers["x-stream-offset"] < 60:
                active_channel.basic_ack(method.delivery_tag)

        def on_standby(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
            waiting.append(properties.headers["x-stream-offset"])
            standby_channel.basic_ack(method.delivery_tag)

        active_channel.basic_consume("events", on_active, arguments=arguments)
        deadline = time.monotonic() + 10
        while len(read) < 100 and time.monotonic() < deadline:
            active.process_data_events(time_limit=0.05)
        standby_channel.basic_consume("events", on_standby, arguments=arguments)
        standby.process_data_events(time_limit=0.3)
        assert read == list(range(100)) and waiting == []  # one member reads
        settle(active, read)
        active.close()  # 60 to 99 were not acknowledged
        deadline = time.monotonic() + 10
        while len(waiting) < 40 and time.monotonic() < deadline:
            standby.process_data_events(time_limit=0.05)
        assert waiting == list(range(60, 100))
        settle(standby, waiting)
        standby.close()


PARTITIONED = "vhosts:\n  /:\n    streams:\n      - {name: events, partitions: 4}\n"
GROUP = {"x-stream-offset": "first", "x-stream-consumer-name": "g", "x-single-active-consumer": True}


class Member:
    """A group member: one connection consuming every partition of ``events`` as group ``g``,
    acknowledging each delivery at once (pika writes an ack before ``basic_ack`` returns)."""

    def __init__(self, port: int, group: Group) -> None:
        self.connection, self.channel = open_channel(port, prefetch=20)
        self.partitions: set[int] = set()
        self.group = group
        #: Killed: what still arrives is neither acknowledged nor counted (it comes back to the others).
        self.killed = False
        #: Deliveries held unacknowledged while the group is at its cap, in order.
        self.held: list[tuple[Any, Any, Any, bytes]] = []
        for partition in range(4):
            self.channel.basic_consume(
                f"events-{partition}", self.on_message, arguments=GROUP, consumer_tag=f"p{partition}"
            )

    def on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        if self.killed:
            return
        if self.group.cap is not None and len(self.group.acked) >= self.group.cap:
            self.held.append((channel, method, properties, body))
            return
        partition = int(method.consumer_tag[1:])
        offset = properties.headers["x-stream-offset"]
        self.partitions.add(partition)
        self.group.delivered(partition, offset, body)
        channel.basic_ack(method.delivery_tag)

    def release(self) -> None:
        """Take the deliveries held at the group's cap, in order, acknowledging each."""
        held, self.held = self.held, []
        for delivery in held:
            self.on_message(*delivery)

    def kill(self) -> None:
        """The connection dies under it (no close handshake), deliveries in flight; every ack
        it sent before was handled by the broker (the ``basic.qos`` round trip after them on
        the same channel says so), so none is lost with the socket."""
        self.killed = True
        self.channel.basic_qos(prefetch_count=20)
        self.connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)


class Group:
    """What the members of group ``g`` were given, checked as it comes."""

    def __init__(self) -> None:
        self.acked: set[tuple[int, int]] = set()
        #: Acknowledged deliveries past which members hold what comes (``None``: no cap).
        self.cap: int | None = None
        #: Each key's message numbers, in the order they were first acknowledged.
        self.by_key: dict[str, list[int]] = {}

    def delivered(self, partition: int, offset: int, body: bytes) -> None:
        assert (partition, offset) not in self.acked, f"acknowledged {partition}:{offset} came back"
        self.acked.add((partition, offset))
        key, _colon, number = body.decode().partition(":")
        self.by_key.setdefault(key, []).append(int(number))


def publish_keys(port: int, start: int, count: int) -> None:
    """Messages ``start`` ... through exchange ``events``: 40 keys, each key's numbered in order."""
    connection, channel = open_channel(port)
    channel.confirm_delivery()
    for number in range(start, start + count):
        channel.basic_publish("events", f"key-{number % 40}", b"key-%d:%d" % (number % 40, number))
    connection.close()


def pump(members: list[Member], group: Group, until: int) -> None:
    deadline = time.monotonic() + 30
    while len(group.acked) < until and time.monotonic() < deadline:
        for member in members:
            member.connection.process_data_events(time_limit=0.01)
    assert len(group.acked) == until


def test_a_group_shares_a_partitioned_streams_partitions_and_hands_them_over_in_order(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker(data, extra=PARTITIONED) as (_process, port):
        group = Group()
        first, second = Member(port, group), Member(port, group)
        publish_keys(port, 0, 2000)
        pump([first, second], group, 2000)
        assert (first.partitions, second.partitions) == ({0, 2}, {1, 3})  # member p mod 2 of partition p
        publish_keys(port, 2000, 2000)
        group.cap = 2400  # then the members hold what comes, unacknowledged: every partition has more
        pump([first, second], group, 2400)
        first.kill()  # mid-stream, with deliveries in flight
        second.partitions.clear()
        group.cap = None
        second.release()
        pump([second], group, 4000)
        assert second.partitions == {0, 1, 2, 3}  # the other holds all four
        third = Member(port, group)
        second.partitions.clear()
        publish_keys(port, 4000, 2000)
        pump([second, third], group, 6000)
        assert (second.partitions, third.partitions) == ({0, 2}, {1, 3})  # spread again
        for key, numbers in group.by_key.items():
            assert numbers == sorted(numbers), f"{key} out of order"
        assert sorted(number for numbers in group.by_key.values() for number in numbers) == list(range(6000))
        for member in (second, third):
            settle(member.connection, [])
            member.connection.close()
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def postroom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_streams_command_adds_a_partitioned_stream_lists_lag_and_moves_a_subscription(tmp_path: Path) -> None:
    data = tmp_path / "data"
    api, scrape = free_port(), free_port()
    with broker(data, management=api, metrics=scrape) as (_process, port):
        url, management = f"amqp://guest:guest@127.0.0.1:{port}/", f"http://guest:guest@127.0.0.1:{api}/"
        added = postroom("streams", "add-partitioned", "events", "--partitions", "2", "--max-age", "7D", "--url", url)
        assert added.returncode == 0, added.stderr
        connection, channel = open_channel(port)
        channel.confirm_delivery()
        for number in range(100):
            channel.basic_publish("events", f"key-{number}", b"%d" % number)
        connection.close()
        counts = [sum(partition_of(f"key-{n}", 2) == p for n in range(100)) for p in range(2)]
        read = read_acking_from(port, "events-1", "billing", 10)
        assert read[:10] == list(range(10))
        listed = postroom("streams", "--url", management, "--json")
        assert listed.returncode == 0, listed.stderr
        streams = {item["name"]: item for item in map(json.loads, listed.stdout.splitlines())}
        assert [streams[f"events-{p}"]["messages"] for p in range(2)] == counts
        assert streams["events-1"]["partition"] == {"exchange": "events", "order": 1}
        assert streams["events-0"]["max_age_seconds"] == 7 * 86400
        [billing] = streams["events-1"]["subscriptions"]
        assert (billing["name"], billing["offset"], billing["lag"]) == ("billing", 10, counts[1] - 10)
        with urllib.request.urlopen(f"http://127.0.0.1:{scrape}/metrics", timeout=10) as response:
            exported = response.read().decode()
        labels = 'stream="events-1",subscription="billing",vhost="/"'
        assert f"postroom_stream_subscription_lag{{{labels}}} {counts[1] - 10}.0" in exported
        with urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{api}/api/queues/%2F/events-1",
                headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
            ),
            timeout=10,
        ) as response:
            view = json.loads(response.read())
        assert (view["type"], view["messages"], view["messages_unacknowledged"]) == ("stream", counts[1], 0)
        table = postroom("streams", "--url", management)
        assert "events-1" in table.stdout and "billing" in table.stdout
        moved = postroom("streams", "reset", "events-1", "billing", "--to", "first", "--url", management)
        assert moved.returncode == 0, moved.stderr
        assert "reads on from offset 0" in moved.stdout
        assert read_acking_from(port, "events-1", "billing", 1)[0] == 0
        refused = postroom("streams", "reset", "events-1", "billing", "--to", "yesterday", "--url", management)
        assert refused.returncode == 1 and "'to' must be first, last, next" in refused.stderr
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def read_acking_from(port: int, queue: str, name: str, until: int) -> list[int]:
    """:func:`read_acking` on another stream."""
    connection, channel = open_channel(port)
    got: list[int] = []

    def on(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        got.append(properties.headers["x-stream-offset"])
        if got[-1] < until:
            channel.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on, arguments={"x-stream-offset": "first", "x-stream-consumer-name": name})
    deadline = time.monotonic() + 10
    while len(got) < until and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    settle(connection, got)
    connection.close()
    return got

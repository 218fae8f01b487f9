"""Resource alarms: a publisher is blocked once it publishes during an alarm, and reads on
when the alarm clears; the monitor raises and clears alarms from its readings, on a Clock."""

from __future__ import annotations

import random
from typing import Any

from pamqp import commands
from twisted.internet.task import Clock

from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.server.alarms import DISK_INTERVAL, MEMORY_INTERVAL, READ_CHECK_MIN, ResourceMonitor
from postroom.broker.tools.testing import Client, encode, publish_frames

BLOCKING = {"connection.blocked": True, "authentication_failure_close": True}


def node() -> Node:
    return Node(users=[User("guest", "guest", loopback_only=True)], rng=random.Random(7))


def client(n: Node, capabilities: dict[str, Any] | None = BLOCKING) -> Client:
    c = Client(n)
    c.handshake(capabilities=capabilities)
    c.open_channel(1)
    c.call(1, commands.Queue.Declare(queue="q"))
    return c


def kinds(frames: list[tuple[int, Any]]) -> list[str]:
    return [type(value).__name__ for _, value in frames]


def test_a_publisher_is_blocked_after_its_first_publish_during_an_alarm() -> None:
    n = node()
    publisher, idle = client(n), client(n)
    assert n.set_alarm("memory", True)
    assert not publisher.connection.blocked and not idle.connection.blocked  # nothing published yet
    replies = publisher.send(
        publish_frames(1, "", "q", b"one")
        + publish_frames(1, "", "q", b"two")
        + encode(1, commands.Queue.Declare(queue="q"))
    )
    assert kinds(replies) == ["Blocked"] and replies[0][1].reason == "low on memory"
    assert publisher.connection.blocked and not idle.connection.blocked
    queue = n.vhosts["/"].queues["q"]
    assert queue.message_count == 0  # blocked after its header, as RabbitMQ: the rest waits unread
    assert publisher.send(publish_frames(1, "", "q", b"three")) == []  # read before the shell paused
    assert queue.message_count == 0

    assert n.set_alarm("memory", False)
    assert not publisher.connection.blocked
    replies = publisher.send(b"")  # the shell reads on, starting with what was held
    assert kinds(replies) == ["Unblocked", "DeclareOk"]
    assert queue.message_count == 3


def test_the_log_backlog_pauses_publishers_without_a_word_and_resumes_them() -> None:
    n = node()
    journal = Journal(1, lambda: 0.0)
    n.set_journal(journal)
    journal.max_backlog = 1_000
    journal.on_backlog = lambda: n.set_alarm("log", True)
    publisher = client(n)
    publisher.call(1, commands.Queue.Declare(queue="durable", durable=True))
    persistent = commands.Basic.Properties(delivery_mode=2)
    assert publisher.send(publish_frames(1, "", "durable", b"x" * 2_000, persistent)) == []
    assert n.alarms == {"log"}
    assert publisher.send(publish_frames(1, "", "durable", b"held", persistent)) == []
    assert publisher.connection.blocked
    queue = n.vhosts["/"].queues["durable"]
    assert queue.message_count == 1
    # A resource alarm meanwhile is told, and its end too, while the backlog still holds it.
    n.set_alarm("memory", True)
    assert [value.reason for _, value in publisher.read()] == ["low on memory"]
    n.set_alarm("memory", False)
    assert kinds(publisher.read()) == ["Unblocked"] and publisher.connection.blocked
    journal.take()  # the writer took the backlog
    n.set_alarm("log", False)
    assert publisher.send(b"") == [] and not publisher.connection.blocked
    assert queue.message_count == 2


def test_a_client_without_the_capability_is_paused_without_a_word() -> None:
    n = node()
    publisher = client(n, capabilities={"authentication_failure_close": True})
    n.set_alarm("disk", True)
    assert publisher.send(publish_frames(1, "", "q", b"x")) == []
    assert publisher.connection.blocked
    n.set_alarm("disk", False)
    assert publisher.send(b"") == [] and not publisher.connection.blocked


def test_both_alarms_are_named_and_the_connection_stays_blocked_until_both_clear() -> None:
    n = node()
    publisher = client(n)
    n.set_alarm("disk", True)
    n.set_alarm("memory", True)
    replies = publisher.send(publish_frames(1, "", "q", b"x"))
    assert [value.reason for _, value in replies] == ["low on memory & disk"]
    n.set_alarm("memory", False)
    assert publisher.connection.blocked and publisher.read() == []
    n.set_alarm("disk", False)
    assert kinds(publisher.read()) == ["Unblocked"]


def test_a_blocked_client_is_not_dropped_for_missed_heartbeats() -> None:
    n = node()
    publisher = client(n)
    n.set_alarm("memory", True)
    publisher.send(publish_frames(1, "", "q", b"x"))
    assert all(publisher.connection.tick() for _ in range(10))


class Readings:
    def __init__(self) -> None:
        self.memory = 100
        self.free = 10_000
        self.trims = 0

    def trim(self) -> None:
        self.trims += 1
        self.memory -= 5  # what the C library gave back


def monitor(n: Node, readings: Readings, clock: Clock) -> ResourceMonitor:
    watcher = ResourceMonitor(
        n, clock, 200, "/data", 1000, lambda: readings.memory, lambda path: readings.free, readings.trim
    )
    watcher.startService()
    return watcher


def test_the_monitor_raises_and_clears_the_memory_alarm_on_its_readings() -> None:
    n, readings, clock = node(), Readings(), Clock()
    watcher = monitor(n, readings, clock)
    assert n.alarms == set() and readings.trims == 0
    readings.memory = 203
    clock.advance(MEMORY_INTERVAL)
    assert n.alarms == set() and readings.trims == 1  # given back first: 198, below the watermark
    readings.memory = 300
    clock.advance(MEMORY_INTERVAL)
    assert n.alarms == {"memory"} and watcher.memory_used == 300
    assert readings.trims == 1  # memory is given back at most once a second
    clock.advance(1.0)
    assert readings.trims == 2 and watcher.memory_used == 295 and n.alarms == {"memory"}
    readings.memory = 150
    clock.advance(MEMORY_INTERVAL)
    assert n.alarms == set()
    watcher.stopService()
    assert clock.getDelayedCalls() == []


def test_memory_is_read_again_once_half_of_what_was_left_is_read_from_clients() -> None:
    n, readings, clock = node(), Readings(), Clock()
    mib = 1 << 20
    readings.memory = 20 * mib
    watcher = ResourceMonitor(n, clock, 100 * mib, read_memory=lambda: readings.memory, trim=readings.trim)
    watcher.startService()
    readings.memory = 90 * mib  # a flood, faster than the timer
    watcher.note_read(40 * mib)  # half of the 80 MiB left at the last reading: not read yet
    assert watcher.memory_used == 20 * mib
    watcher.note_read(1)
    assert watcher.memory_used == 90 * mib and n.alarms == set()
    readings.memory = 101 * mib
    watcher.note_read(5 * mib)  # half of the 10 MiB left
    assert n.alarms == set()
    watcher.note_read(1)
    assert n.alarms == {"memory"} and readings.trims == 1  # no timer went off meanwhile
    readings.memory = 50 * mib
    watcher.note_read(READ_CHECK_MIN + 1)  # the least allowed between readings
    assert n.alarms == set() and clock.seconds() == 0
    watcher.stopService()


def test_bytes_read_over_either_protocol_have_memory_read_again() -> None:
    from twisted.internet.testing import StringTransport

    from postroom.broker.server.protocol import AMQPServerFactory
    from postroom.broker.server.streamprotocol import StreamServerFactory

    n, readings, clock = node(), Readings(), Clock()
    watcher = ResourceMonitor(n, clock, 4 * READ_CHECK_MIN, read_memory=lambda: readings.memory, trim=readings.trim)
    watcher.startService()
    factories = [AMQPServerFactory(n, clock, watcher), StreamServerFactory(n, clock, ("127.0.0.1", 5552), watcher)]
    for factory in factories:
        readings.memory = 0
        watcher.check_memory()  # room for 2 MiB to be read before the next reading
        protocol = factory.buildProtocol(None)
        protocol.makeConnection(StringTransport())
        readings.memory = 5 * READ_CHECK_MIN
        protocol.dataReceived(b"\x00" * (2 * READ_CHECK_MIN + 1))  # (a bad frame: the connection ends)
        assert watcher.memory_used > 4 * READ_CHECK_MIN and n.alarms == {"memory"}
    assert clock.seconds() == 0
    watcher.stopService()


def test_the_monitor_raises_the_disk_alarm_below_the_free_space_limit() -> None:
    n, readings, clock = node(), Readings(), Clock()
    watcher = monitor(n, readings, clock)
    readings.free = 999
    clock.advance(MEMORY_INTERVAL)
    assert n.alarms == set()  # free space is read once a second
    clock.advance(DISK_INTERVAL)
    assert n.alarms == {"disk"} and watcher.disk_free == 999
    readings.free = 5000
    clock.advance(DISK_INTERVAL)
    assert n.alarms == set()
    watcher.stopService()


def test_alarms_and_readings_are_exported() -> None:
    from prometheus_client.exposition import generate_latest

    from postroom.broker.server.metrics import BrokerCollector, make_registry

    n, readings, clock = node(), Readings(), Clock()
    watcher = monitor(n, readings, clock)
    readings.free = 10
    clock.advance(DISK_INTERVAL)
    text = generate_latest(make_registry(BrokerCollector(n, rabbitmq_compatible=True, monitor=watcher))).decode()
    assert 'postroom_alarm{resource="disk"} 1.0' in text and 'postroom_alarm{resource="memory"} 0.0' in text
    assert "postroom_memory_watermark_bytes 200.0" in text and "postroom_disk_free_bytes 10.0" in text
    assert "rabbitmq_alarms_free_disk_space_watermark 1.0" in text
    assert "rabbitmq_alarms_memory_used_watermark 0.0" in text
    assert "rabbitmq_resident_memory_limit_bytes 200.0" in text
    assert "postroom_publishers_slowed 0.0" in text
    n.set_flow(True)
    text = generate_latest(make_registry(BrokerCollector(n, rabbitmq_compatible=True))).decode()
    assert "postroom_publishers_slowed 1.0" in text
    watcher.stopService()


def test_memory_is_handed_back_once_many_clients_have_gone() -> None:
    from postroom.broker.server.alarms import GONE_CLIENTS, MEMORY_INTERVAL

    n, readings, clock = node(), Readings(), Clock()
    watcher = monitor(n, readings, clock)
    n.mqtt_connections.update(object() for _ in range(4 * GONE_CLIENTS))
    clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 0
    for _ in range(GONE_CLIENTS - 1):
        n.mqtt_connections.pop()
    clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 0  # a few gone: not worth it
    while len(n.mqtt_connections) > GONE_CLIENTS:
        n.mqtt_connections.pop()
    clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 1  # three quarters gone: handed back
    n.mqtt_connections.pop()
    clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 2  # still leaving: again
    clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 3  # the last has gone: once more
    for _ in range(3):
        clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 3  # and no more after that
    n.mqtt_connections.pop()
    clock.advance(MEMORY_INTERVAL)
    assert readings.trims == 3  # one more gone later is not a crowd
    watcher.stopService()

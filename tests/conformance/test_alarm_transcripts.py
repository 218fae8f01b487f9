"""Resource alarms, frame for frame: who is blocked, what is still read and served, and when.

The same scenario runs against RabbitMQ 3.10 and Postroom: a consumer, a publisher that has the
``connection.blocked`` capability and one that has not. The memory watermark is set below
what each broker uses (``rabbitmqctl set_vm_memory_high_watermark absolute 1``; Postroom's
:class:`broker.server.alarms.ResourceMonitor` with a watermark of 1 byte, on its real readings); each
publisher publishes and then asks for something; the watermark is put back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pamqp import commands
from transcript import (
    CLIENT_PROPERTIES,
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    frames,
    handshake,
    method,
    publish,
    quiet,
    until,
    wait_for,
)
from twisted.internet import threads

from postroom.broker.core.node import Node
from postroom.broker.server.alarms import ResourceMonitor
from postroom.broker.tools.testing import rabbitmqctl

pytestmark = pytest.mark.integration

Alarm = Callable[[bool], None]
BLOCKING = {**CLIENT_PROPERTIES, "capabilities": {**CLIENT_PROPERTIES["capabilities"], "connection.blocked": True}}


@pytest.fixture
def rabbitmq_alarm(rabbitmq_port: int) -> Iterator[tuple[int, Alarm]]:
    def alarm(on: bool) -> None:
        rabbitmqctl(rabbitmq_port, "set_vm_memory_high_watermark", *(("absolute", "1") if on else ("0.4",)))
        assert wait_for(lambda: ("memory" in rabbitmqctl(rabbitmq_port, "eval", "rabbit_alarm:get_alarms().")) == on)

    try:
        yield rabbitmq_port, alarm
    finally:
        alarm(False)


@pytest.fixture
def postroom_alarm(make_broker: Any) -> Iterator[tuple[int, Alarm]]:
    node = Node()
    broker = make_broker(node)
    monitor = ResourceMonitor(node, broker.reactor, 2**62)
    threads.blockingCallFromThread(broker.reactor, monitor.startService)

    def alarm(on: bool) -> None:
        monitor.memory_limit = 1 if on else 2**62
        assert wait_for(lambda: ("memory" in node.alarms) == on)

    try:
        yield broker.port, alarm
    finally:
        threads.blockingCallFromThread(broker.reactor, monitor.stopService)


def scenario(alarm: Alarm) -> Callable[[int, str], list[Entry]]:
    def run(port: int, prefix: str) -> list[Entry]:
        # The publishers are unblocked at the same moment: each publishes to a queue of its own,
        # so that the consumer's transcript does not depend on which goes first.
        queue, other = f"{prefix}-q", f"{prefix}-other"
        transcript = Transcript()
        try:
            with (
                transcript.connect(port) as consumer,
                transcript.connect(port) as told,
                transcript.connect(port) as untold,
            ):
                for client, properties in ((consumer, None), (told, BLOCKING), (untold, None)):
                    client.send(handshake(client_properties=properties), frames(1, commands.Channel.Open()))
                    client.read(until("Channel.OpenOk"))
                consumer.send(
                    frames(
                        1,
                        commands.Queue.Declare(queue=other),
                        commands.Queue.Declare(queue=queue),
                        commands.Basic.Consume(queue=queue, no_ack=True),
                    )
                )
                consumer.read(until("Basic.ConsumeOk"))
                transcript.note("memory alarm: each publisher publishes, then declares")
                alarm(True)
                for name, client, target in (("told", told, queue), ("untold", untold, other)):
                    transcript.note(name)
                    client.send(
                        publish(1, "", target, name.encode()),
                        # (RabbitMQ's count of the publisher's own queue may not include its
                        # publish yet: a passive declare of the consumed queue answers alike.)
                        method(1, commands.Queue.Declare, queue=queue, passive=True),
                    )
                    client.read(quiet(1.0))
                transcript.note("the consumer is still served")
                consumer.read(quiet(1.0))
                transcript.note("alarm cleared")
                alarm(False)
                for name, client in (("told", told), ("untold", untold)):
                    transcript.note(name)
                    client.read(until("Queue.DeclareOk"))
                    close_connection(client)
                close_connection(consumer)
        finally:
            delete_queues(port, queue, other)
        return transcript.normalized()

    return run


def test_a_memory_alarm_blocks_publishers_as_rabbitmq_does(
    rabbitmq_alarm: tuple[int, Alarm], postroom_alarm: tuple[int, Alarm]
) -> None:
    (rabbitmq, rabbitmq_switch), (postroom, postroom_switch) = rabbitmq_alarm, postroom_alarm
    expected = scenario(rabbitmq_switch)(rabbitmq, "alarm")
    actual = scenario(postroom_switch)(postroom, "alarm")

    lines = [str(entry) for entry in expected]
    assert sum("Connection.Blocked" in line for line in lines) == 1, lines
    assert sum("Connection.Unblocked" in line for line in lines) == 1, lines
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

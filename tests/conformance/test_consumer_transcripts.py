"""Single active consumers and consumer priorities, frame for frame against RabbitMQ 3.10.

``docs/rabbitmq-consumers.md`` gives RabbitMQ's rules with their places in its source.
"""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands
from test_policy_transcripts import open_confirming, publish
from test_scenario_transcripts import declare_queue
from test_teardown_transcripts import Scenario, compare
from transcript import (
    Client,
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    frames,
    open_connection,
    until,
    without_header,
)

pytestmark = pytest.mark.integration

SAC = {"x-single-active-consumer": True}


def consume(client: Client, queue: str, tag: str, prefetch: int = 0, **arguments: Any) -> None:
    if prefetch:
        client.send(frames(1, commands.Basic.Qos(prefetch_count=prefetch)))
        client.read(until("Basic.QosOk"))
    client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag=tag, arguments=arguments)))
    client.read(until("Basic.ConsumeOk"))


def reopen(client: Client) -> None:
    """Answer the broker's channel.close on channel 1 and open it again."""
    client.send(frames(1, commands.Channel.CloseOk(), commands.Channel.Open()))
    client.read(until("Channel.OpenOk"))


def deliveries(client: Client, count: int) -> None:
    """Read ``count`` deliveries (each a deliver, a header and one body frame)."""
    for _ in range(count):
        client.read(until("ContentBody"))


def sac_failover(port: int, prefix: str) -> list[Entry]:
    """Ten messages on a single-active-consumer queue: the first consumer gets them all as its
    prefetch allows, the second none; the first's connection drops, and the second gets all
    ten in queue order, its predecessor's unacked ones first."""
    queue = f"{prefix}-sac"
    transcript = Transcript()
    try:
        with transcript.connect(port) as first, transcript.connect(port) as second:
            with transcript.connect(port) as publisher:
                open_connection(first, 1)
                declare_queue(first, queue, arguments=SAC)
                consume(first, queue, "first", prefetch=3)
                open_connection(second, 1)
                declare_queue(second, queue, arguments=SAC)
                consume(second, queue, "second", prefetch=100)
                open_confirming(publisher)
                for number in range(10):
                    publish(publisher, queue, b"%d" % number)
                deliveries(first, 3)
                first.close()  # the connection drops, nothing acked
                deliveries(second, 10)
                second.send(frames(1, commands.Basic.Ack(delivery_tag=10, multiple=True)))
                declare_queue(second, queue, arguments=SAC, passive=True)
                close_connection(second)
                close_connection(publisher)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def sac_cancel(port: int, prefix: str) -> list[Entry]:
    """The active consumer cancels: its deliveries stay its channel's, and once nacked back they
    go, in queue order, to the consumer that became active. An exclusive consume is refused on
    such a queue. (RabbitMQ 3.10.8 stalls ready messages after cancelling a full active
    consumer, rabbitmq-server#5460: this scenario leaves none ready.)"""
    queue = f"{prefix}-sac-cancel"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client, transcript.connect(port) as publisher:
            open_connection(client, 1)
            declare_queue(client, queue, arguments=SAC)
            consume(client, queue, "a")
            consume(client, queue, "b")
            open_confirming(publisher)
            for number in range(4):
                publish(publisher, queue, b"%d" % number)
            deliveries(client, 4)
            client.send(frames(1, commands.Basic.Cancel(consumer_tag="a")))
            client.read(until("Basic.CancelOk"))
            client.send(frames(1, commands.Basic.Nack(delivery_tag=4, multiple=True, requeue=True)))
            deliveries(client, 4)
            client.send(frames(1, commands.Basic.Ack(delivery_tag=8, multiple=True)))
            declare_queue(client, queue, arguments=SAC, passive=True)
            client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="alone", exclusive=True)))
            client.read(until("Basic.ConsumeOk"))
            close_connection(client)
            close_connection(publisher)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def sac_arguments(port: int, prefix: str) -> list[Entry]:
    """``x-single-active-consumer`` must be a bool, and a redeclare must repeat it."""
    queue = f"{prefix}-sac-args"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, queue, arguments=SAC)
            client.send(frames(1, commands.Queue.Declare(queue=queue)))
            client.read(until("Channel.Close"))
            reopen(client)
            client.send(frames(1, commands.Queue.Declare(queue=queue, arguments={"x-single-active-consumer": False})))
            client.read(until("Channel.Close"))
            reopen(client)
            client.send(
                frames(1, commands.Queue.Declare(queue=f"{queue}-2", arguments={"x-single-active-consumer": "yes"}))
            )
            client.read(until("Channel.Close"))
            close_connection(client)
    finally:
        delete_queues(port, queue, f"{queue}-2")
    return transcript.normalized()


def priorities(port: int, prefix: str) -> list[Entry]:
    """A high-priority consumer gets everything while its prefetch has room; the overflow goes
    to the low-priority one; an ack gives the high one room again, and the next is its."""
    queue = f"{prefix}-prio"
    transcript = Transcript()
    try:
        with transcript.connect(port) as low, transcript.connect(port) as high:
            with transcript.connect(port) as publisher:
                open_connection(low, 1)
                declare_queue(low, queue)
                consume(low, queue, "low", prefetch=3)
                open_connection(high, 1)
                consume(high, queue, "high", prefetch=3, **{"x-priority": 10})
                open_confirming(publisher)
                for number in range(5):
                    publish(publisher, queue, b"%d" % number)
                deliveries(high, 3)
                deliveries(low, 2)
                high.send(frames(1, commands.Basic.Ack(delivery_tag=1)))
                high.send(frames(1, commands.Basic.Qos(prefetch_count=3)))  # once answered, the ack is in
                high.read(until("Basic.QosOk"))
                publish(publisher, queue, b"5")
                deliveries(high, 1)
                close_connection(high)
                deliveries(low, 1)  # the high one's unacked, back to the low one as it has room
                close_connection(low)
                close_connection(publisher)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def priority_arguments(port: int, prefix: str) -> list[Entry]:
    """``x-priority`` of any integer type is taken; a string or a float is refused with 406."""
    queue = f"{prefix}-prio-args"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, queue)
            consume(client, queue, "negative", **{"x-priority": -7})
            for value in ("high", 1.5):
                client.send(
                    frames(1, commands.Basic.Consume(queue=queue, consumer_tag="bad", arguments={"x-priority": value}))
                )
                client.read(until("Basic.ConsumeOk"))
                reopen(client)
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


SCENARIOS: dict[str, Scenario] = {
    "single-active-consumer-failover": sac_failover,
    "single-active-consumer-cancel": sac_cancel,
    "single-active-consumer-arguments": sac_arguments,
    "consumer-priorities-with-full-prefetch": priorities,
    "consumer-priority-arguments": priority_arguments,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_consumers_match_rabbitmq(rabbitmq_port: int, broker: Any, name: str) -> None:
    expected, actual = compare(SCENARIOS[name], rabbitmq_port, broker.port)
    actual = without_header(actual, "x-delivery-count", drop_emptied=True)  # Postroom's own, on purpose
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

"""Deletes, exclusivity and limits, frame for frame: Postroom answers exactly as RabbitMQ 3.10 does."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands
from test_teardown_transcripts import compare
from transcript import (
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    frames,
    handshake,
    open_connection,
    until,
)
from transcript import content as content_frames
from transcript import method as method_frame

pytestmark = pytest.mark.integration


def deletes_of_missing_things(port: int, prefix: str) -> list[Entry]:
    """Delete and unbind things that do not exist, each on a channel of its own."""
    queue, exchange = f"{prefix}-q", f"{prefix}-x"
    missing = f"{prefix}-missing"
    transcript = Transcript()
    operations = [
        commands.Queue.Delete(queue=missing),
        commands.Exchange.Delete(exchange=missing),
        commands.Queue.Unbind(queue=queue, exchange=exchange, routing_key="never-bound"),
        commands.Queue.Unbind(queue=missing, exchange=exchange, routing_key="k"),
        commands.Queue.Unbind(queue=queue, exchange=missing, routing_key="k"),
        commands.Exchange.Unbind(destination=exchange, source="amq.direct", routing_key="never-bound"),
        commands.Exchange.Unbind(destination=missing, source="amq.direct", routing_key="k"),
        commands.Queue.Purge(queue=missing),
    ]
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            client.send(frames(1, commands.Queue.Declare(queue=queue), commands.Exchange.Declare(exchange=exchange)))
            client.read(until("Exchange.DeclareOk"))
            for channel, operation in enumerate(operations, start=2):
                client.send(frames(channel, commands.Channel.Open(), operation))
                client.read(until("Channel.OpenOk", channel=channel))
                client.read(
                    until(
                        "Channel.Close",
                        operation.name.replace("Unbind", "UnbindOk")
                        .replace("Delete", "DeleteOk")
                        .replace("Purge", "PurgeOk"),
                        channel=channel,
                    )
                )
            client.send(frames(1, commands.Exchange.Delete(exchange=exchange)))
            client.read(until("Exchange.DeleteOk"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def test_deletes_and_unbinds_of_missing_things(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(deletes_of_missing_things, rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def exclusive_queue_of_another_connection(port: int, prefix: str) -> list[Entry]:
    """One connection owns an exclusive queue; another redeclares it, with other arguments, passively, and uses it."""
    queue = f"{prefix}-mine"
    transcript = Transcript()
    with transcript.connect(port) as owner:
        open_connection(owner, 1)
        owner.send(frames(1, commands.Queue.Declare(queue=queue, exclusive=True)))
        owner.read(until("Queue.DeclareOk"))
        with transcript.connect(port) as other:
            open_connection(other)
            attempts = [
                commands.Queue.Declare(queue=queue, exclusive=True),
                commands.Queue.Declare(queue=queue, arguments={"x-max-length": 5}),
                commands.Queue.Declare(queue=queue, passive=True),
                commands.Basic.Get(queue=queue),
                commands.Queue.Purge(queue=queue),
                commands.Queue.Delete(queue=queue),
            ]
            for channel, attempt in enumerate(attempts, start=1):
                other.send(frames(channel, commands.Channel.Open(), attempt))
                other.read(until("Channel.OpenOk", channel=channel))
                other.read(until("Channel.Close", "Connection.Close", channel=channel))
            close_connection(other)
        close_connection(owner)
    return transcript.normalized()


def test_another_connections_exclusive_queue_is_locked(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(exclusive_queue_of_another_connection, rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def limits(port: int, prefix: str) -> list[Entry]:
    """A body frame whose payload is exactly ``frame_max`` bytes; channel 65535 with channel_max 2047."""
    queue = f"{prefix}-limits"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            client.send(handshake(frame_max=4096))
            client.read(until("Connection.OpenOk"))
            client.send(frames(65535, commands.Channel.Open()))
            client.read(until("Channel.OpenOk", "Connection.Close", channel=65535))
        with transcript.connect(port) as client:
            client.send(handshake(frame_max=4096))
            client.read(until("Connection.OpenOk"))
            client.send(frames(1, commands.Channel.Open(), commands.Queue.Declare(queue=queue)))
            client.read(until("Queue.DeclareOk"))
            body = b"x" * 4096
            client.send(
                method_frame(1, commands.Basic.Publish, exchange="", routing_key=queue)
                + content_frames(1, body, frame_max=4096 + 8)
            )
            client.send(frames(1, commands.Basic.Get(queue=queue, no_ack=True)))
            client.read(until("Basic.GetOk", "Basic.GetEmpty", "Connection.Close"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def test_frames_and_channels_at_their_limits(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(limits, rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

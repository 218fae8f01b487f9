"""Requeue order, delivery for delivery: returned messages go back to where they were, as RabbitMQ 3.10.

RabbitMQ's classic queues put every returned message back at its original position in the
queue, whatever order the client returns them in and whichever way (``basic.nack`` or
``basic.reject`` with requeue, ``basic.recover``, a cancelled consumer's channel closing, a
channel closing with unacked deliveries). Each scenario publishes ten numbered messages,
takes some, returns them out of order, and reads the queue's order back with ``basic.get``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands
from test_scenario_transcripts import message_count
from test_teardown_transcripts import compare
from transcript import (
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    frames,
    open_connection,
    publish,
    until,
    wait_for,
    without_header,
)

pytestmark = pytest.mark.integration

MESSAGES = 10


def fill(
    client: Any, transcript: Transcript, queue: str, arguments: dict[str, Any] | None = None, priorities: bool = False
) -> None:
    """Declare ``queue`` and publish messages ``m0`` .. ``m9`` to it."""
    client.send(frames(1, commands.Queue.Declare(queue=queue, arguments=arguments or {})))
    client.read(until("Queue.DeclareOk"))
    for number in range(MESSAGES):
        properties = b"\x00\x00"
        if priorities:  # priority 0 for even numbers, 5 for odd ones
            properties = b"\x08\x00" + bytes((5 * (number % 2),))
        client.send(publish(1, "", queue, b"m%d" % number, properties))
    # Not confirms (how a broker batches them is its own business): a passive declare on the
    # same channel, then basic.gets, are ordered after the publishes. Its message_count is
    # left out: in RabbitMQ the publishes may still be on their way to the queue process.
    client.send(frames(1, commands.Queue.Declare(queue=queue, passive=True)))
    client.read(until("Queue.DeclareOk"))
    transcript.entries.pop()


def read_back(client: Any, queue: str, channel: int = 1) -> None:
    """``basic.get`` until the queue is empty: its order."""
    for _ in range(MESSAGES + 1):
        client.send(frames(channel, commands.Basic.Get(queue=queue, no_ack=True)))
        if client.read(until("ContentBody", "Basic.GetEmpty", channel=channel))[-1].kind == "Basic.GetEmpty":
            break


def scenario(returns: str, priorities: bool = False) -> Any:
    """A scenario: take messages 1-7 with basic.get (tags 1-7), return them by ``returns``."""

    def run(port: int, prefix: str) -> list[Entry]:
        queue = f"{prefix}-order"
        transcript = Transcript()
        arguments = {"x-max-priority": 9} if priorities else None
        try:
            with transcript.connect(port) as client:
                open_connection(client, 1, 2)
                fill(client, transcript, queue, arguments, priorities)
                client.send(frames(1, commands.Basic.Get(queue=queue)))  # m0, kept
                client.read(until("ContentBody"))
                for _ in range(7):
                    client.send(frames(2, commands.Basic.Get(queue=queue)))
                    client.read(until("ContentBody", channel=2))
                if returns == "nack":
                    for tag in (3, 1, 6, 2, 7, 5, 4):
                        client.send(frames(2, commands.Basic.Nack(delivery_tag=tag, multiple=False, requeue=True)))
                elif returns == "reject-forward":
                    for tag in range(1, 8):
                        client.send(frames(2, commands.Basic.Reject(delivery_tag=tag, requeue=True)))
                if returns in ("nack", "reject-forward"):
                    # basic.nack and basic.reject have no reply, and in RabbitMQ they travel from
                    # channel 2's process to the queue's, so channel 1's gets could pass them. A
                    # passive declare on channel 2 reaches the queue's process after them: once
                    # it is answered, they wait there ahead of channel 1's gets (the declare's
                    # count may be answered first, at a higher priority; gets are not).
                    client.send(frames(2, commands.Queue.Declare(queue=queue, passive=True)))
                    client.read(until("Queue.DeclareOk", channel=2))
                    transcript.entries.pop()
                elif returns == "recover":
                    client.send(frames(2, commands.Basic.Recover(requeue=True)))
                    client.read(until("Basic.RecoverOk", channel=2))
                elif returns == "close":
                    client.send(
                        frames(2, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
                    )
                    client.read(until("Channel.CloseOk", channel=2))
                    # RabbitMQ's queue takes a channel's deliveries back when it sees the channel's
                    # process end, after its close-ok: wait until the seven are back.
                    assert wait_for(lambda: message_count(port, queue) == 9, 10)
                client.send(frames(1, commands.Basic.Ack(delivery_tag=1)))
                read_back(client, queue)
                close_connection(client)
        finally:
            delete_queues(port, queue)
        return transcript.normalized()

    return run


@pytest.mark.parametrize(
    ("returns", "priorities"),
    [("nack", False), ("reject-forward", False), ("recover", False), ("close", False), ("nack", True)],
    ids=["nack-shuffled", "reject-in-order", "recover", "channel-close", "nack-shuffled-priorities"],
)
def test_returned_messages_go_back_to_their_original_position(
    rabbitmq_port: int, broker: Any, returns: str, priorities: bool
) -> None:
    expected, actual = compare(scenario(returns, priorities), rabbitmq_port, broker.port)
    actual = without_header(actual, "x-delivery-count", drop_emptied=True)  # Postroom's own, on purpose
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

"""Direct reply-to (``amq.rabbitmq.reply-to``), frame for frame against RabbitMQ 3.10.

Reply consumers' names are random on both brokers (RabbitMQ's encode its channel and a key):
the transcripts show each as ``amq.rabbitmq.reply-to.<name>``; everything else is compared as
it came. ``docs/rabbitmq-consumers.md`` (section 3) gives RabbitMQ's rules.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from pamqp import commands
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
    method,
    open_connection,
    until,
)
from transcript import content as content_frames

pytestmark = pytest.mark.integration

PSEUDO = "amq.rabbitmq.reply-to"
#: A reply consumer's name, wherever it appears (a routing key, a property, a reply text).
NAME = re.compile(r"amq\.rabbitmq\.reply-to\.[^' ]+")


def masked(entries: list[Entry]) -> list[Entry]:
    """Every reply consumer's name shown as ``amq.rabbitmq.reply-to.<name>``."""

    def mask(value: Any) -> Any:
        return NAME.sub(PSEUDO + ".<name>", value) if isinstance(value, str) else value

    return [replace(entry, fields=tuple((name, mask(value)) for name, value in entry.fields)) for entry in entries]


def properties(**values: Any) -> bytes:
    """A content header's property flags and properties, as a publisher sends them."""
    return commands.Basic.Properties(**values).marshal()


def publish(client: Client, queue: str, body: bytes, mandatory: bool = False, **values: Any) -> None:
    publish_method = method(1, commands.Basic.Publish, exchange="", routing_key=queue, mandatory=mandatory)
    client.send(publish_method + content_frames(1, body, properties(**values)))
    client.read(until("Basic.Ack", "Basic.Nack"))


def passive_declare(client: Client, name: str) -> None:
    """A passive ``queue.declare`` of ``name`` (RabbitMQ's reply names hold ``+``, ``/`` and
    ``=``, which pamqp refuses in a queue name: the frame is built without its checks)."""
    client.send(method(1, commands.Queue.Declare, queue=name, passive=True))
    client.read(until("Queue.DeclareOk"))


def confirming(client: Client) -> None:
    client.send(frames(1, commands.Confirm.Select()))
    client.read(until("Confirm.SelectOk"))


def rpc(port: int, prefix: str) -> list[Entry]:
    """A request with ``reply-to: amq.rabbitmq.reply-to`` carries the requester's reply name;
    a reply to it is delivered straight away (and, published mandatory, returned all the same,
    as RabbitMQ routes it to no queue); once the reply consumer is cancelled the name is gone
    and a reply to it is dropped."""
    queue = f"{prefix}-rpc"
    transcript = Transcript()
    try:
        with transcript.connect(port) as requester, transcript.connect(port) as responder:
            open_connection(requester, 1)
            declare_queue(requester, PSEUDO, passive=True)
            requester.send(frames(1, commands.Basic.Consume(queue=PSEUDO, consumer_tag="replies", no_ack=True)))
            requester.read(until("Basic.ConsumeOk"))
            confirming(requester)
            open_connection(responder, 1)
            declare_queue(responder, queue)
            confirming(responder)
            publish(requester, queue, b"2+2", reply_to=PSEUDO, correlation_id="c-1", content_type="text/plain")
            responder.send(frames(1, commands.Basic.Get(queue=queue, no_ack=True)))
            header = next(e for e in responder.read(until("ContentBody")) if e.kind == "ContentHeader")
            name = dict(header.fields)["reply_to"]
            passive_declare(responder, name)
            publish(responder, name, b"4", correlation_id="c-1")
            requester.read(until("ContentBody"))
            publish(responder, name, b"4 again", mandatory=True, correlation_id="c-1")
            requester.read(until("ContentBody"))
            requester.send(frames(1, commands.Basic.Cancel(consumer_tag="replies")))
            requester.read(until("Basic.CancelOk"))
            publish(responder, name, b"too late", mandatory=True)
            passive_declare(responder, name)
            close_connection(requester)
            close_connection(responder)
    finally:
        delete_queues(port, queue)
    return masked(transcript.normalized())


def refusals(port: int, prefix: str) -> list[Entry]:
    """A reply consumer must be no-ack and alone on its channel; a request needs one; a name that
    only looks like the pseudo-queue is 404; the pseudo-queue cannot be read with basic.get.
    (A reply name that does not decode closes RabbitMQ 3.10's connection with 541; Postroom
    answers 404, see docs/rabbitmq-compatibility.md.)"""
    transcript = Transcript()
    with transcript.connect(port) as client:
        open_connection(client, 1)
        attempts: list[tuple[Any, ...]] = [
            (commands.Basic.Consume(queue=PSEUDO, consumer_tag="acking"),),
            (commands.Basic.Consume(queue=PSEUDO, no_ack=True), commands.Basic.Consume(queue=PSEUDO, no_ack=True)),
            (commands.Queue.Declare(queue=PSEUDO + "X"),),
            (commands.Basic.Get(queue=PSEUDO, no_ack=True),),
        ]
        for methods in attempts:
            client.send(frames(1, *methods))
            client.read(until("Channel.Close"))
            client.send(frames(1, commands.Channel.CloseOk(), commands.Channel.Open()))
            client.read(until("Channel.OpenOk"))
        publish_method = method(1, commands.Basic.Publish, exchange="", routing_key=f"{prefix}-nowhere")
        client.send(publish_method + content_frames(1, b"?", properties(reply_to=PSEUDO)))
        client.read(until("Channel.Close"))
        client.send(frames(1, commands.Channel.CloseOk()))
        client.read(until("Channel.CloseOk", or_close=False))
        close_connection(client)
    return masked(transcript.normalized())


SCENARIOS: dict[str, Scenario] = {"request-and-replies": rpc, "refusals": refusals}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_direct_reply_to_matches_rabbitmq(rabbitmq_port: int, broker: Any, name: str) -> None:
    expected, actual = compare(SCENARIOS[name], rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

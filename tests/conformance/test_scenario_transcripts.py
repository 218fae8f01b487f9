"""Behaviour scenarios, each run against RabbitMQ and Postroom: what clients build on.

* dead-lettering for each reason (``basic.reject``, ``basic.nack``, a message's expiration,
  the queue's message TTL, ``x-max-length``) through each kind of dead-letter exchange (the
  default exchange with a routing key, direct, fanout, topic, headers, an exchange that does
  not exist, and the queue itself);
* queue life cycles: exclusive queues seen from another connection and after their owner
  leaves, auto-delete queues after their last consumer, ``x-expires``;
* a message TTL running out while the message is unacked, then requeued;
* ``basic.qos`` per consumer and global;
* publisher confirms interleaved with mandatory returns;
* the consumer cancel notification when a queue is deleted.

Waiting is on state, never on time alone: a scenario that needs the broker to have done
something asynchronous (dead-lettering, expiry) polls over a connection of its own, which
records nothing, and then reads the result in the transcript.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from pamqp import commands
from test_dead_letter_transcripts import masked
from test_teardown_transcripts import compare
from transcript import (
    AT_EOF,
    Client,
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    field,
    frames,
    handshake,
    method,
    open_connection,
    quiet,
    table,
    until,
    wait_for,
)
from transcript import content as content_frames

pytestmark = pytest.mark.integration

Scenario = Callable[[int, str], list[Entry]]

#: The routing key every scenario publishes with (through its own direct exchange).
KEY = "orders.eu.created"


# -- helpers -------------------------------------------------------------------------------------


def message_count(port: int, queue: str) -> int | None:
    """The queue's ready messages, read over a connection of its own (``None``: no such queue)."""
    scratch = Transcript()
    with scratch.connect(port) as client:
        client.send(handshake())
        client.read(until("Connection.OpenOk"))
        client.send(frames(1, commands.Channel.Open(), commands.Queue.Declare(queue=queue, passive=True)))
        answer = client.read(until("Queue.DeclareOk", channel=1))
        close_connection(client)
    last = answer[-1] if answer else None
    return last.get("message_count") if last is not None and last.kind == "Queue.DeclareOk" else None


def routable(port: int, queue: str) -> bool:
    """Whether a mandatory publish to ``queue`` is routed, over a connection of its own. Unlike a
    passive declare, a publish is no use of the queue: its idle time keeps running."""
    scratch = Transcript()
    with scratch.connect(port) as client:
        open_connection(client, 1)
        client.send(frames(1, commands.Confirm.Select()))
        client.read(until("Confirm.SelectOk"))
        publish = method(1, commands.Basic.Publish, exchange="", routing_key=queue, mandatory=True)
        client.send(publish + content_frames(1, b"probe"))
        answer = client.read(until("Basic.Ack", "Basic.Nack"))
        close_connection(client)
    return not any(entry.kind == "Basic.Return" for entry in answer)


def declare_queue(client: Client, queue: str, **options: Any) -> None:
    client.send(frames(1, commands.Queue.Declare(queue=queue, **options)))
    client.read(until("Queue.DeclareOk"))


def declare_exchange(client: Client, exchange: str, kind: str) -> None:
    client.send(frames(1, commands.Exchange.Declare(exchange=exchange, exchange_type=kind)))
    client.read(until("Exchange.DeclareOk"))


def bind(client: Client, queue: str, exchange: str, key: str, arguments: dict[str, Any] | None = None) -> None:
    client.send(frames(1, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=key, arguments=arguments)))
    client.read(until("Queue.BindOk"))


def properties(expiration: str | None = None) -> bytes:
    """A ``headers`` table (``kind: dead``) and, when given, an ``expiration``."""
    flags = 0x2000 | (0x0100 if expiration is not None else 0)
    data = struct.pack(">H", flags) + table(field("kind", "S", struct.pack(">I", 4) + b"dead"))
    if expiration is not None:
        data += bytes([len(expiration)]) + expiration.encode()
    return data


def publish_confirmed(client: Client, exchange: str, body: bytes, props: bytes = b"\x00\x00") -> None:
    """Publish ``body`` with ``KEY`` (confirm mode must be on) and read its ack."""
    client.send(method(1, commands.Basic.Publish, exchange=exchange, routing_key=KEY) + content_frames(1, body, props))
    client.read(until("Basic.Ack", "Basic.Nack"))


def get(client: Client, queue: str, no_ack: bool = True) -> list[Entry]:
    client.send(frames(1, commands.Basic.Get(queue=queue, no_ack=no_ack)))
    return client.read(until("ContentBody", "Basic.GetEmpty"))


# -- dead-lettering ------------------------------------------------------------------------------

DLX_KINDS = ("default", "direct", "fanout", "topic", "headers", "missing", "itself")
REASONS = ("reject", "nack", "expiration", "message-ttl", "max-length")


def dead_letter(kind: str, reason: str) -> Scenario:
    """A message published to ``src`` through a direct exchange dies for ``reason`` and is read
    from ``dlq`` (or, for ``missing`` and ``itself``, what is left where)."""

    def run(port: int, prefix: str) -> list[Entry]:
        entrance, src, dlq, dlx = f"{prefix}-in", f"{prefix}-src", f"{prefix}-dlq", f"{prefix}-dlx"
        arguments: dict[str, Any] = {}
        if kind == "default":
            arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
        elif kind == "itself":
            arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": src}
        elif kind == "missing":
            arguments = {"x-dead-letter-exchange": f"{prefix}-no-such-exchange"}
        else:
            arguments = {"x-dead-letter-exchange": dlx}
            if kind == "direct":
                arguments["x-dead-letter-routing-key"] = "dead"
        if reason == "message-ttl":
            arguments["x-message-ttl"] = 0
        if reason == "max-length":
            arguments["x-max-length"] = 1
        transcript = Transcript()
        try:
            with transcript.connect(port) as client:
                open_connection(client, 1)
                declare_exchange(client, entrance, "direct")
                declare_queue(client, src, arguments=arguments)
                declare_queue(client, dlq)
                bind(client, src, entrance, KEY)
                if kind in ("direct", "fanout", "topic", "headers"):
                    declare_exchange(client, dlx, kind)
                    key = {"direct": "dead", "fanout": "", "topic": "orders.*.created", "headers": ""}[kind]
                    match = {"x-match": "all", "kind": "dead"} if kind == "headers" else None
                    bind(client, dlq, dlx, key, match)
                client.send(frames(1, commands.Confirm.Select()))
                client.read(until("Confirm.SelectOk"))
                expiration = "0" if reason == "expiration" else None
                if reason == "max-length":
                    publish_confirmed(client, entrance, b"first", properties())
                publish_confirmed(client, entrance, b"dies", properties(expiration))
                if reason in ("reject", "nack"):
                    got = get(client, src, no_ack=False)
                    tag = got[0].get("delivery_tag") if got[0].kind == "Basic.GetOk" else 0
                    if reason == "reject":
                        client.send(frames(1, commands.Basic.Reject(delivery_tag=tag, requeue=False)))
                    else:
                        client.send(frames(1, commands.Basic.Nack(delivery_tag=tag, requeue=False)))
                expected_in_src = 1 if reason == "max-length" else 0
                if kind == "itself" and reason in ("reject", "nack"):
                    expected_in_src = 1  # a rejection is no cycle: it comes back
                if kind in ("missing", "itself"):
                    wait_for(lambda: message_count(port, src) == expected_in_src, 5)
                else:
                    wait_for(lambda: message_count(port, dlq) == 1, 5)
                transcript.note(f"{src}:")
                for _ in range(2):
                    get(client, src)
                transcript.note(f"{dlq}:")
                for _ in range(2):
                    get(client, dlq)
                close_connection(client)
        finally:
            delete_queues(port, src, dlq, exchanges=(entrance, dlx))
        return masked(transcript.normalized())

    return run


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("kind", DLX_KINDS)
def test_dead_lettering_matches_rabbitmq(rabbitmq_port: int, broker: Any, kind: str, reason: str) -> None:
    expected, actual = compare(dead_letter(kind, reason), rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


# -- queue life cycles ---------------------------------------------------------------------------


def exclusive_life(port: int, prefix: str) -> list[Entry]:
    """Another connection meets an exclusive queue (declare, passive, get, consume, delete,
    purge, bind), then the owner leaves and the queue is gone."""
    queue = f"{prefix}-exclusive"
    transcript = Transcript()
    with transcript.connect(port) as owner, transcript.connect(port) as other:
        open_connection(owner, 1)
        declare_queue(owner, queue, exclusive=True)
        open_connection(other)
        attempts = [
            commands.Queue.Declare(queue=queue, exclusive=True),
            commands.Queue.Declare(queue=queue, passive=True),
            commands.Basic.Get(queue=queue),
            commands.Basic.Consume(queue=queue),
            commands.Queue.Purge(queue=queue),
            commands.Queue.Bind(queue=queue, exchange="amq.direct", routing_key="k"),
            commands.Queue.Delete(queue=queue),
        ]
        for channel, attempt in enumerate(attempts, start=1):
            other.send(frames(channel, commands.Channel.Open(), attempt))
            other.read(until("Channel.Close", "Queue.DeclareOk", "Basic.GetEmpty", "Basic.ConsumeOk", channel=channel))
        close_connection(owner)
        wait_for(lambda: message_count(port, queue) is None, 5)
        other.send(frames(9, commands.Channel.Open(), commands.Queue.Declare(queue=queue, passive=True)))
        other.read(until("Queue.DeclareOk", channel=9))
        close_connection(other)
    return transcript.normalized()


def auto_delete_life(port: int, prefix: str) -> list[Entry]:
    """An auto-delete queue lives while nobody consumed, and goes when its last consumer cancels."""
    queue = f"{prefix}-auto"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1, 2)
            declare_queue(client, queue, auto_delete=True)
            client.send(frames(2, commands.Queue.Declare(queue=queue, passive=True)))
            client.read(until("Queue.DeclareOk", channel=2))
            for tag in ("c1", "c2"):
                client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag=tag)))
                client.read(until("Basic.ConsumeOk"))
            client.send(frames(1, commands.Basic.Cancel(consumer_tag="c1")))
            client.read(until("Basic.CancelOk"))
            client.send(frames(2, commands.Queue.Declare(queue=queue, passive=True)))
            client.read(until("Queue.DeclareOk", channel=2))
            client.send(frames(1, commands.Basic.Cancel(consumer_tag="c2")))
            client.read(until("Basic.CancelOk"))
            wait_for(lambda: message_count(port, queue) is None, 5)
            client.send(frames(2, commands.Queue.Declare(queue=queue, passive=True)))
            client.read(until("Queue.DeclareOk", channel=2))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def expires_life(port: int, prefix: str) -> list[Entry]:
    """``x-expires``: a queue nobody uses is deleted after it; a wrong value is refused."""
    queue = f"{prefix}-expires"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, queue, arguments={"x-expires": 300})
            for _ in range(20):  # a look counts as a use (a passive declare): look less often than that
                time.sleep(0.5)
                if message_count(port, queue) is None:
                    break
            client.send(frames(1, commands.Queue.Declare(queue=queue, passive=True)))
            client.read(until("Queue.DeclareOk"))
            for value in (0, -1, "soon"):
                client.send(frames(1, commands.Channel.CloseOk(), commands.Channel.Open()))
                client.read(until("Channel.OpenOk"))
                client.send(frames(1, commands.Queue.Declare(queue=queue, arguments={"x-expires": value})))
                client.read(until("Queue.DeclareOk"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def passive_declare_is_a_use(port: int, prefix: str) -> list[Entry]:
    """A passive ``queue.declare`` counts as a use of an ``x-expires`` queue (RabbitMQ's ``stat``
    restarts the idle time): looked at every 0.2 s, a queue of 0.6 s expiry lives on; left
    alone, it goes."""
    queue = f"{prefix}-looked-at"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, queue, arguments={"x-expires": 600})
            for _ in range(8):  # 1.6 s in all, well past the expiry
                time.sleep(0.2)
                client.send(frames(1, commands.Queue.Declare(queue=queue, passive=True)))
                if client.read(until("Queue.DeclareOk"))[-1].kind != "Queue.DeclareOk":
                    break  # gone (404): the transcripts show it
            assert wait_for(lambda: not routable(port, queue), 10)
            client.send(frames(1, commands.Queue.Declare(queue=queue, passive=True)))
            client.read(until("Queue.DeclareOk"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


# -- TTL, qos, confirms, cancel notifications ----------------------------------------------------


def ttl_then_requeue(port: int, prefix: str) -> list[Entry]:
    """A message whose queue TTL runs out while it is unacked is dead-lettered when it is requeued."""
    src, dlq = f"{prefix}-ttl", f"{prefix}-ttl-dead"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, dlq)
            arguments = {"x-message-ttl": 400, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
            declare_queue(client, src, arguments=arguments)
            client.send(frames(1, commands.Confirm.Select()))
            client.read(until("Confirm.SelectOk"))
            client.send(method(1, commands.Basic.Publish, routing_key=src) + content_frames(1, b"late"))
            client.read(until("Basic.Ack"))
            got = get(client, src, no_ack=False)
            time.sleep(0.6)  # past the TTL while the message is unacked: the subject of the scenario
            client.send(frames(1, commands.Basic.Nack(delivery_tag=got[0].get("delivery_tag"), requeue=True)))
            wait_for(lambda: message_count(port, dlq) == 1, 5)
            get(client, src)
            get(client, dlq)
            close_connection(client)
    finally:
        delete_queues(port, src, dlq)
    return masked(transcript.normalized())


def qos(global_: bool) -> Scenario:
    """Two consumers on two queues of one channel with prefetch 2: per consumer, or for the
    channel as a whole (RabbitMQ's meaning of ``global``), then one ack."""

    def run(port: int, prefix: str) -> list[Entry]:
        first, second = f"{prefix}-qos-a", f"{prefix}-qos-b"
        transcript = Transcript()
        try:
            with transcript.connect(port) as client:
                open_connection(client, 1)
                # The first queue holds exactly the prefetch, so once the limit frees a slot only
                # the second queue can use it (RabbitMQ wakes every blocked queue at once, and
                # which of two wins is not defined).
                for queue, count in ((first, 2), (second, 3)):
                    declare_queue(client, queue)
                    for number in range(count):
                        client.send(
                            method(1, commands.Basic.Publish, routing_key=queue) + content_frames(1, b"%d" % number)
                        )
                client.send(frames(1, commands.Basic.Qos(prefetch_count=2, global_=global_)))
                client.read(until("Basic.QosOk"))
                client.send(frames(1, commands.Basic.Consume(queue=first, consumer_tag="a")))
                client.read(until("Basic.ConsumeOk"))
                client.read(quiet(0.5))
                client.send(frames(1, commands.Basic.Consume(queue=second, consumer_tag="b")))
                client.read(until("Basic.ConsumeOk"))
                client.read(quiet(0.5))
                client.send(frames(1, commands.Basic.Ack(delivery_tag=1)))
                client.read(quiet(0.5))
                close_connection(client)
        finally:
            delete_queues(port, first, second)
        return transcript.normalized()

    return run


def confirms_with_returns(port: int, prefix: str) -> list[Entry]:
    """Mandatory publishes, routable or not, in confirm mode: each return comes before its ack."""
    queue = f"{prefix}-confirm"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, queue)
            bind(client, queue, "amq.direct", "routed")
            client.send(frames(1, commands.Confirm.Select()))
            client.read(until("Confirm.SelectOk"))
            for number, key in enumerate(("routed", "nowhere", "routed", "nowhere", "nowhere")):
                client.send(
                    method(1, commands.Basic.Publish, exchange="amq.direct", routing_key=key, mandatory=True)
                    + content_frames(1, b"%d" % number)
                )
                client.read(until("Basic.Ack", "Basic.Nack"))
            client.send(
                method(1, commands.Basic.Publish, exchange="amq.direct", routing_key="nowhere")
                + content_frames(1, b"plain")
            )
            client.read(until("Basic.Ack", "Basic.Nack"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def cancel_notification(port: int, prefix: str) -> list[Entry]:
    """A consumer whose queue another connection deletes gets ``basic.cancel`` from the broker."""
    queue = f"{prefix}-cancelled"
    transcript = Transcript()
    with transcript.connect(port) as consumer, transcript.connect(port) as other:
        open_connection(consumer, 1)
        declare_queue(consumer, queue)
        consumer.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="watcher")))
        consumer.read(until("Basic.ConsumeOk"))
        open_connection(other, 1)
        other.send(frames(1, commands.Queue.Delete(queue=queue)))
        other.read(until("Queue.DeleteOk"))
        consumer.read(until("Basic.Cancel"))
        consumer.send(frames(1, commands.Basic.Qos(prefetch_count=1)))  # the channel is still open
        consumer.read(until("Basic.QosOk"))
        close_connection(consumer)
        close_connection(other)
    return transcript.normalized()


def reused_tag_on_a_missing_queue(port: int, prefix: str) -> list[Entry]:
    """A consumer tag already in use on the channel, given again for a queue that does not exist:
    the tag is checked first (530, the connection closes), the queue is never looked up."""
    queue = f"{prefix}-tagged"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, queue)
            client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="tag")))
            client.read(until("Basic.ConsumeOk"))
            client.send(frames(1, commands.Basic.Consume(queue=f"{prefix}-missing", consumer_tag="tag")))
            client.read(until("Connection.Close"))
            client.send(frames(0, commands.Connection.CloseOk()))
            client.read(AT_EOF)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def consume_published(client: Client, queue: str, count: int, prefetch: int = 0) -> None:
    """Declare ``queue`` on channel 1, publish ``count`` bodies (``b"0"``, ``b"1"``, …) to it,
    then consume it as ``c`` (with ``prefetch``, if any) and read the deliveries."""
    declare_queue(client, queue)
    for number in range(count):
        client.send(method(1, commands.Basic.Publish, routing_key=queue) + content_frames(1, b"%d" % number))
    if prefetch:
        client.send(frames(1, commands.Basic.Qos(prefetch_count=prefetch)))
        client.read(until("Basic.QosOk"))
    client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="c")))
    client.read(until("Basic.ConsumeOk"))
    client.read(quiet(0.5))


def single_acks_in_one_write(port: int, prefix: str) -> list[Entry]:
    """A consumer's single acks sent together: each frees its slot, and an unknown tag among
    them closes the channel with those before it acked and the rest given back."""
    queue = f"{prefix}-acks"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            consume_published(client, queue, 5, prefetch=3)
            client.send(frames(1, commands.Basic.Ack(delivery_tag=1), commands.Basic.Ack(delivery_tag=2)))
            client.read(quiet(0.5))
            client.send(frames(1, *(commands.Basic.Ack(delivery_tag=tag) for tag in (3, 99, 4))))
            client.read(until("Channel.Close"))
            client.send(frames(1, commands.Channel.CloseOk()))
            client.send(frames(2, commands.Channel.Open(), commands.Queue.Declare(queue=queue, passive=True)))
            client.read(until("Queue.DeclareOk", channel=2))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def exclusive_redeclares(port: int, prefix: str) -> list[Entry]:
    """Redeclares of an exclusive queue (declared durable) and of a shared one, with and
    without ``exclusive``, from the owning connection and from another, each with an
    argument that matches or not: which is checked first, and what a declare's ``durable``
    means for an exclusive queue."""
    queue, shared = f"{prefix}-mine", f"{prefix}-shared"
    transcript = Transcript()
    limit = {"x-max-length": 5}
    try:
        with transcript.connect(port) as owner, transcript.connect(port) as other:
            open_connection(owner, 1)
            declare_queue(owner, queue, exclusive=True, durable=True)
            declare_queue(owner, shared)
            open_connection(other)
            attempts = [
                (owner, commands.Queue.Declare(queue=queue)),
                (owner, commands.Queue.Declare(queue=queue, durable=True)),
                (owner, commands.Queue.Declare(queue=queue, exclusive=True)),
                (owner, commands.Queue.Declare(queue=queue, exclusive=True, durable=True)),
                (owner, commands.Queue.Declare(queue=queue, exclusive=True, auto_delete=True)),
                (owner, commands.Queue.Declare(queue=queue, exclusive=True, arguments=limit)),
                (owner, commands.Queue.Declare(queue=queue, arguments=limit)),
                (owner, commands.Queue.Declare(queue=shared, exclusive=True)),
                (owner, commands.Queue.Declare(queue=shared, exclusive=True, durable=True, arguments=limit)),
                (owner, commands.Queue.Declare(queue=shared, durable=True)),
                (other, commands.Queue.Declare(queue=queue)),
                (other, commands.Queue.Declare(queue=queue, exclusive=True)),
                (other, commands.Queue.Declare(queue=queue, exclusive=True, arguments=limit)),
                (other, commands.Queue.Declare(queue=shared, exclusive=True)),
                (other, commands.Queue.Declare(queue=shared, exclusive=True, auto_delete=True)),
            ]
            for channel, (client, attempt) in enumerate(attempts, start=2):
                client.send(frames(channel, commands.Channel.Open(), attempt))
                client.read(until("Channel.Close", "Queue.DeclareOk", channel=channel))
            close_connection(other)
            close_connection(owner)
    finally:
        delete_queues(port, queue, shared)
    return transcript.normalized()


def ack_after_a_closed_channel(port: int, prefix: str) -> list[Entry]:
    """The broker closes a consumer's channel (an unknown tag); once the close handshake is
    done an ack for an earlier delivery arrives on that channel number, as a threaded
    consumer's ack can: what becomes of it, and of the connection's other channel."""
    queue = f"{prefix}-late"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1, 2)
            consume_published(client, queue, 2)
            client.send(frames(1, commands.Basic.Ack(delivery_tag=99)))
            client.read(until("Channel.Close"))
            # In one write: RabbitMQ fails the stray ack in a channel process of its own, so a
            # declare written later may be read before or after the connection's close.
            client.send(
                frames(1, commands.Channel.CloseOk())
                + frames(1, commands.Basic.Ack(delivery_tag=1))
                + frames(2, commands.Queue.Declare(queue=queue, passive=True))
            )
            client.read(until("Queue.DeclareOk", "Connection.Close", channel=None))
            client.read(quiet(0.5))
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


SCENARIOS: dict[str, Scenario] = {
    "exclusive-queue-life": exclusive_life,
    "auto-delete-queue-life": auto_delete_life,
    "x-expires-life": expires_life,
    "passive-declare-is-a-use": passive_declare_is_a_use,
    "ttl-runs-out-then-requeued": ttl_then_requeue,
    "qos-per-consumer": qos(False),
    "qos-global": qos(True),
    "confirms-with-mandatory-returns": confirms_with_returns,
    "consumer-cancel-notification": cancel_notification,
    "consumer-tag-reused-on-a-missing-queue": reused_tag_on_a_missing_queue,
    "single-acks-in-one-write": single_acks_in_one_write,
    "exclusive-redeclares": exclusive_redeclares,
    "ack-after-a-closed-channel": ack_after_a_closed_channel,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_matches_rabbitmq(rabbitmq_port: int, broker: Any, name: str) -> None:
    expected, actual = compare(SCENARIOS[name], rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

"""Stream queues over AMQP 0-9-1, frame for frame against RabbitMQ 3.10.

``docs/rabbitmq-streams.md`` gives RabbitMQ's rules with their places in its source. Postroom's
side is a broker process with storage (streams keep their messages in files of their own).
Each message is published on its own and confirmed before the next, so that each is a chunk
of its own on both brokers (a chunk is what one write holds, and ``last`` starts at the last
chunk). Declare-ok counts of streams holding messages are not compared: RabbitMQ's lag (they
are refreshed every 5 seconds); those of new streams are.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from test_consumer_transcripts import deliveries, reopen
from test_teardown_transcripts import Scenario, compare
from transcript import (
    Client,
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    content,
    delete_queues,
    field,
    frames,
    headers_properties,
    method,
    open_connection,
    table,
    until,
)

from postroom.broker.tools.testing import free_port, wait_for_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STREAM = {"x-queue-type": "stream"}


@pytest.fixture(scope="module")
def storage_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A Postroom process with storage (``postroom serve``), its AMQP port; its log must hold no traceback."""
    directory = tmp_path_factory.mktemp("stream-broker")
    port = free_port()
    config = directory / "broker.yaml"
    config.write_text(
        f'listen: {{amqp: "tcp:{port}:interface=127.0.0.1", metrics: "tcp:{free_port()}:interface=127.0.0.1",'
        f' management: "tcp:{free_port()}:interface=127.0.0.1"}}\n'
        f'storage: {{dir: "{directory / "data"}"}}\n'
    )
    log_path = directory / "broker.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    try:
        wait_for_port(port, 30)
        yield port
    finally:
        process.terminate()
        process.wait(30)
    logged = log_path.read_text()
    assert "Traceback" not in logged, logged


def declare(client: Client, queue: str, **options: Any) -> bool:
    """A queue.declare, read until its answer; whether it was a declare-ok (else a close)."""
    client.send(frames(1, commands.Queue.Declare(queue=queue, **options)))
    return client.read(until("Queue.DeclareOk", "Channel.Close", "Connection.Close"))[-1].kind == "Queue.DeclareOk"


def publish_one(client: Client, queue: str, body: bytes, properties: bytes = b"\x00\x00") -> None:
    """Publish to ``queue`` (confirms on) and read the confirm: one message, one chunk."""
    client.send(method(1, commands.Basic.Publish, exchange="", routing_key=queue) + content(1, body, properties))
    client.read(until("Basic.Ack", "Basic.Nack"))


def confirming(client: Client) -> None:
    open_connection(client, 1)
    client.send(frames(1, commands.Confirm.Select()))
    client.read(until("Confirm.SelectOk"))


def consume_from(client: Client, queue: str, tag: str, offset: Any, prefetch: int) -> None:
    """On an open channel 1: ``basic.qos`` then ``basic.consume`` from ``offset``, each answered."""
    client.send(frames(1, commands.Basic.Qos(prefetch_count=prefetch)))
    client.read(until("Basic.QosOk"))
    arguments = {"x-stream-offset": offset}
    client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag=tag, arguments=arguments)))
    client.read(until("Basic.ConsumeOk"))


def stream_declares(port: int, prefix: str) -> list[Entry]:
    """What a stream declaration may and may not say, and what a redeclaration must repeat."""
    queue = f"{prefix}-declares"
    good = [f"{queue}-{n}" for n in range(6)]
    transcript = Transcript()
    refused: list[dict[str, Any]] = [
        {"durable": False},
        {"durable": True, "exclusive": True},
        {"durable": True, "auto_delete": True},
        {"durable": True, "arguments": {**STREAM, "x-max-length": 10}},
        {"durable": True, "arguments": {**STREAM, "x-message-ttl": 1000}},
        {"durable": True, "arguments": {**STREAM, "x-dead-letter-exchange": "dlx"}},
        {"durable": True, "arguments": {**STREAM, "x-single-active-consumer": True}},
        {"durable": True, "arguments": {**STREAM, "x-max-priority": 5}},
        {"durable": True, "arguments": {**STREAM, "x-overflow": "reject-publish"}},
        {"durable": True, "arguments": {**STREAM, "x-max-age": "7X"}},
        {"durable": True, "arguments": {**STREAM, "x-max-age": "0D"}},
        {"durable": True, "arguments": {**STREAM, "x-max-age": "7d"}},
        {"durable": True, "arguments": {**STREAM, "x-max-age": 10}},
        {"durable": True, "arguments": {**STREAM, "x-max-length-bytes": -1}},
        {"durable": True, "arguments": {**STREAM, "x-stream-max-segment-size-bytes": 3_000_000_001}},
        {"durable": True, "arguments": {**STREAM, "x-initial-cluster-size": 0}},
        {"durable": True, "arguments": {**STREAM, "x-queue-leader-locator": "nearest"}},
        {"durable": False, "arguments": {**STREAM, "x-max-length": 1}},
    ]
    accepted: list[dict[str, Any]] = [
        {**STREAM, "x-max-age": "7D", "x-max-length-bytes": 1_000_000},
        {**STREAM, "x-max-age": "12h", "x-stream-max-segment-size-bytes": 3_000_000_000},
        {**STREAM, "x-max-age": "30m", "x-initial-cluster-size": 3},
        {**STREAM, "x-max-age": "10s", "x-queue-leader-locator": "balanced"},
        {**STREAM, "x-initial-cluster-size": 1, "x-foo": "kept"},
        STREAM,
    ]
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            for options in refused:
                options = {"arguments": STREAM, **options}
                declare(client, queue, **options)
                reopen(client)
            declare(client, "", durable=True, arguments=STREAM)
            reopen(client)
            for name, arguments in zip(good, accepted, strict=True):
                declare(client, name, durable=True, arguments=arguments)
            # A redeclaration repeats the stream's own arguments, and only those.
            redeclares: list[dict[str, Any]] = [
                {"durable": True, "arguments": {**STREAM, "x-max-age": "7D", "x-max-length-bytes": 1_000_000}},
                {"durable": True, "arguments": {**STREAM, "x-max-age": "8D", "x-max-length-bytes": 1_000_000}},
                {"durable": True, "arguments": {"x-max-age": "7D", "x-max-length-bytes": 1_000_000}},
                {"durable": True, "arguments": {**STREAM, "x-max-length-bytes": 1_000_000}},
                {"durable": True, "arguments": {**STREAM, "x-max-age": "7D"}},
                {"durable": False, "arguments": {**STREAM, "x-max-age": "7D", "x-max-length-bytes": 1_000_000}},
                {"durable": True, "exclusive": True, "arguments": {**STREAM, "x-max-age": "7D"}},
                {
                    "durable": True,
                    "arguments": {**STREAM, "x-max-age": "7D", "x-max-length-bytes": 1_000_000, "x-max-length": 5},
                },
            ]
            for options in redeclares:
                if not declare(client, good[0], **options):
                    reopen(client)
            declare(client, good[5], durable=True, arguments=STREAM, passive=True)
            close_connection(client)
    finally:
        delete_queues(port, *good)
    return transcript.normalized()


def stream_refusals(port: int, prefix: str) -> list[Entry]:
    """What a stream does not do: consume without a prefetch, with no-ack or under a global
    prefetch, consumer priorities, bad offsets, basic.get, purge, nack, reject and recover."""
    queue = f"{prefix}-refusals"
    transcript = Transcript()
    tries: list[tuple[str, Any]] = [
        ("no prefetch", None),
        ("no-ack", {"no_ack": True}),
        ("global prefetch", "global"),
        ("priority", {"arguments": {"x-priority": 5}}),
        ("bad interval", {"arguments": {"x-stream-offset": "7X"}}),
        ("no digits", {"arguments": {"x-stream-offset": "foo"}}),
        ("a boolean", {"arguments": {"x-stream-offset": True}}),
        ("a float", {"arguments": {"x-stream-offset": 1.5}}),
        ("get", "get"),
        ("purge", "purge"),
    ]
    try:
        with transcript.connect(port) as setup:
            confirming(setup)
            declare(setup, queue, durable=True, arguments=STREAM)
            publish_one(setup, queue, b"one")
            close_connection(setup)
        for _name, attempt in tries:
            with transcript.connect(port) as client:
                open_connection(client, 1)
                if attempt is None:
                    client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="c")))
                elif attempt == "global":
                    client.send(frames(1, commands.Basic.Qos(prefetch_count=10)))
                    client.send(frames(1, commands.Basic.Qos(prefetch_count=10, global_=True)))
                    client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="c")))
                elif attempt == "get":
                    client.send(frames(1, commands.Basic.Get(queue=queue)))
                elif attempt == "purge":
                    client.send(frames(1, commands.Queue.Purge(queue=queue)))
                else:
                    client.send(frames(1, commands.Basic.Qos(prefetch_count=10)))
                    client.send(frames(1, commands.Basic.Consume(queue=queue, consumer_tag="c", **attempt)))
                client.read(until("Channel.Close", "Connection.Close"))
        for settle in ("nack", "reject", "recover"):
            with transcript.connect(port) as client:
                open_connection(client, 1)
                client.send(frames(1, commands.Basic.Qos(prefetch_count=10)))
                client.send(
                    frames(
                        1, commands.Basic.Consume(queue=queue, consumer_tag="c", arguments={"x-stream-offset": "first"})
                    )
                )
                deliveries(client, 1)
                if settle == "nack":
                    client.send(frames(1, commands.Basic.Nack(delivery_tag=1, requeue=True)))
                elif settle == "reject":
                    client.send(frames(1, commands.Basic.Reject(delivery_tag=1, requeue=False)))
                else:
                    client.send(frames(1, commands.Basic.Recover(requeue=True)))
                client.read(until("Connection.Close"))
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def stream_offsets(port: int, prefix: str) -> list[Entry]:
    """Ten messages, one chunk each: consumers (a connection each) from first, last, next, and
    offsets inside, before and past the end; each delivery's ``x-stream-offset``; what each
    gets of three more; acks return credit and remove nothing; publisher headers come back
    sorted, with the offset."""
    queue = f"{prefix}-offsets"
    transcript = Transcript()
    headers = headers_properties(table(field("zz", "I", (1).to_bytes(4, "big")), field("aa", "S", b"\0\0\0\1x")))
    starts: list[tuple[str, Any, int, int]] = [
        ("first", "first", 10, 3),
        ("last", "last", 1, 3),
        ("four", 4, 6, 3),
        ("before", -5, 10, 3),
        ("end", 10, 0, 3),
        ("next", "next", 0, 3),
        ("past", 12, 0, 1),
    ]
    try:
        with transcript.connect(port) as publisher, ExitStack() as connections:
            confirming(publisher)
            declare(publisher, queue, durable=True, arguments=STREAM)
            for number in range(10):
                publish_one(publisher, queue, b"m%d" % number, headers if number == 3 else b"\x00\x00")
            consumers = []
            for tag, offset, count, _later in starts:
                client = connections.enter_context(transcript.connect(port))
                consumers.append(client)
                open_connection(client, 1)
                consume_from(client, queue, tag, offset, 100)
                deliveries(client, count)
            for number in (10, 11, 12):
                publish_one(publisher, queue, b"m%d" % number)
            for client, (_tag, _offset, _count, later) in zip(consumers, starts, strict=True):
                deliveries(client, later)
                client.send(frames(1, commands.Basic.Ack(delivery_tag=1, multiple=True)))
                close_connection(client)
            close_connection(publisher)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def stream_credit(port: int, prefix: str) -> list[Entry]:
    """A prefetch of 2 over one-message chunks: two deliveries, then one per ack; a delete of a
    stream with messages and a consumer, with if-empty and if-unused, deletes it and counts 0."""
    queue = f"{prefix}-credit"
    transcript = Transcript()
    try:
        with transcript.connect(port) as publisher, transcript.connect(port) as client:
            confirming(publisher)
            declare(publisher, queue, durable=True, arguments=STREAM)
            for number in range(5):
                publish_one(publisher, queue, b"m%d" % number)
            open_connection(client, 1)
            consume_from(client, queue, "c", "first", 2)
            deliveries(client, 2)
            client.send(frames(1, commands.Basic.Ack(delivery_tag=1)))
            deliveries(client, 1)
            client.send(frames(1, commands.Basic.Ack(delivery_tag=3, multiple=True)))
            deliveries(client, 2)
            publisher.send(frames(1, commands.Queue.Delete(queue=queue, if_empty=True, if_unused=True)))
            publisher.read(until("Queue.DeleteOk"))
            close_connection(publisher)
            client.send(frames(1, commands.Basic.Ack(delivery_tag=5, multiple=True)))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def stream_times(port: int, prefix: str) -> list[Entry]:
    """Two messages, then (past the next whole second ``T``) two more: consumers from the AMQP
    timestamp ``T`` get the later two, from before the first all four, from an hour past ``T``
    nothing yet; intervals (``10m``, ``1Y``) reach back past all of them."""
    queue = f"{prefix}-times"
    transcript = Transcript()
    starts: list[tuple[str, Any, int]] = []
    try:
        with transcript.connect(port) as publisher, ExitStack() as connections:
            confirming(publisher)
            declare(publisher, queue, durable=True, arguments=STREAM)
            before = datetime.fromtimestamp(int(time.time()) - 60, timezone.utc)
            for number in range(2):
                publish_one(publisher, queue, b"m%d" % number)
            second = int(time.time()) + 1
            time.sleep(second + 0.3 - time.time())
            for number in (2, 3):
                publish_one(publisher, queue, b"m%d" % number)
            starts = [
                ("at-t", datetime.fromtimestamp(second, timezone.utc), 2),
                ("before", before, 4),
                ("future", datetime.fromtimestamp(second + 3600, timezone.utc), 0),
                ("ten-minutes", "10m", 4),
                ("a-year", "1Y", 4),
            ]
            for tag, offset, count in starts:
                client = connections.enter_context(transcript.connect(port))
                open_connection(client, 1)
                consume_from(client, queue, tag, offset, 100)
                deliveries(client, count)
                close_connection(client)
            close_connection(publisher)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def stream_routing(port: int, prefix: str) -> list[Entry]:
    """Into streams through an exchange and its alternate exchange, with mandatory (one that no
    queue takes comes back), and in a transaction (what was rolled back is not appended); a
    consumer of each stream from ``first`` gets exactly what was appended."""
    queue, other = f"{prefix}-routed", f"{prefix}-alternate"
    exchange, alternate = f"{prefix}-x", f"{prefix}-ae"
    transcript = Transcript()
    try:
        with transcript.connect(port) as publisher, transcript.connect(port) as tx, ExitStack() as connections:
            confirming(publisher)
            publisher.send(frames(1, commands.Exchange.Declare(exchange=alternate, exchange_type="fanout")))
            publisher.read(until("Exchange.DeclareOk"))
            arguments = {"alternate-exchange": alternate}
            publisher.send(frames(1, commands.Exchange.Declare(exchange=exchange, arguments=arguments)))
            publisher.read(until("Exchange.DeclareOk"))
            for name, source, key in ((queue, exchange, "k"), (other, alternate, "")):
                declare(publisher, name, durable=True, arguments=STREAM)
                publisher.send(frames(1, commands.Queue.Bind(queue=name, exchange=source, routing_key=key)))
                publisher.read(until("Queue.BindOk"))
            for target, key, body in ((exchange, "k", b"routed"), (exchange, "other", b"to the alternate")):
                publisher.send(
                    method(1, commands.Basic.Publish, exchange=target, routing_key=key, mandatory=True)
                    + content(1, body)
                )
                publisher.read(until("Basic.Ack", "Basic.Nack"))
            publisher.send(
                method(1, commands.Basic.Publish, exchange="amq.direct", routing_key="nowhere", mandatory=True)
                + content(1, b"returned")
            )
            publisher.read(until("Basic.Ack", "Basic.Nack"))
            open_connection(tx, 1)
            tx.send(frames(1, commands.Tx.Select()))
            tx.read(until("Tx.SelectOk"))
            for body, end in ((b"rolled back", commands.Tx.Rollback()), (b"committed", commands.Tx.Commit())):
                tx.send(method(1, commands.Basic.Publish, exchange="", routing_key=queue) + content(1, body))
                tx.send(frames(1, end))
                tx.read(until("Tx.RollbackOk", "Tx.CommitOk"))
            for name, count in ((queue, 2), (other, 1)):
                client = connections.enter_context(transcript.connect(port))
                open_connection(client, 1)
                consume_from(client, name, "c", "first", 10)
                deliveries(client, count)
                close_connection(client)
            close_connection(tx)
            close_connection(publisher)
    finally:
        delete_queues(port, queue, other, exchanges=(exchange, alternate))
    return transcript.normalized()


SCENARIOS: dict[str, Scenario] = {
    "stream-routing": stream_routing,
    "stream-times": stream_times,
    "stream-declares": stream_declares,
    "stream-refusals": stream_refusals,
    "stream-offsets": stream_offsets,
    "stream-credit": stream_credit,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_streams_match_rabbitmq(rabbitmq_port: int, storage_broker: int, name: str) -> None:
    expected, actual = compare(SCENARIOS[name], rabbitmq_port, storage_broker)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

"""RabbitMQ's stream protocol with a stock client: ``rstream`` (1.1.1) against Postroom and
against RabbitMQ 3.10.8 with ``rabbitmq_stream``, the same session on each, the same results.

The session publishes with confirms (one at a time and in a batch), resends a named
publisher's messages (deduplicated: none is written twice), reads from ``first``, ``next``,
an offset and a timestamp, and stores and queries an offset. Then it crosses protocols on
Postroom: what rstream published is read by pika over AMQP 0-9-1 and the other way round.
Postroom is killed and started again: the stored offset and the publisher's sequence are
still there.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import ssl
import struct
import time
import urllib.request
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import mmh3
import pika
import pytest
from rstream import (
    AMQPMessage,
    CompressionType,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    Producer,
    RouteType,
    SlasMechanism,
    SuperStreamConsumer,
    SuperStreamProducer,
    amqp_decoder,
    schema,
)
from rstream.client import Client
from rstream.exceptions import OffsetNotFound, ServerError, StreamAlreadyExists

from postroom.broker.tools.testing import free_port, rabbitmq_node, wait_for_port, write_test_pki
from postroom.broker.wire import streamframes as wire
from tests.broker.test_stream_connection import handshake_frames, request
from tests.integration.test_crash import broker

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

STREAM = "orders-s"


async def read(
    port: int, offset: ConsumerOffsetSpecification, until: int, seconds: float = 5.0, stream: str = STREAM
) -> list[Any]:
    """``(offset, body, n)`` of what a consumer of ``stream`` from ``offset`` gets (up to
    ``until`` messages)."""
    got: list[Any] = []
    done = asyncio.Event()

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        properties = message.application_properties or {}
        got.append((context.offset, bytes(message.body), properties.get(b"n", properties.get("n"))))
        if len(got) >= until:
            done.set()

    async with Consumer("127.0.0.1", port=port, username="guest", password="guest") as consumer:
        await consumer.start()
        await consumer.subscribe(stream, on, decoder=amqp_decoder, offset_specification=offset)
        try:
            await asyncio.wait_for(done.wait(), seconds)
        except TimeoutError:
            pass
    return got[:until]  # (a chunk is delivered whole: one may bring more)


async def resend(port: int) -> list[int]:
    """A named publisher sends ids 1-20, then 11-30 again (as after a lost connection): the
    publisher sequence it is told after each."""
    client = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
    await client.start()
    await client.authenticate("/", "guest", "guest")
    confirmed: list[int] = []
    arrived = asyncio.Event()

    def on_confirm(frame: schema.PublishConfirm) -> None:
        confirmed.extend(frame.publishing_ids)
        arrived.set()

    client.add_handler(schema.PublishConfirm, on_confirm)
    await client.declare_publisher(STREAM, "app-1", 1)
    sequences = []
    for ids in (range(1, 21), range(11, 31)):
        messages = [schema.Message(i, None, bytes(AMQPMessage(body=b"d%d" % i))) for i in ids]
        await client.publish(messages, 1)
        deadline = time.monotonic() + 5
        while not set(ids) <= set(confirmed) and time.monotonic() < deadline:
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), 1)
            except TimeoutError:
                pass
        sequences.append(await client.query_publisher_sequence(STREAM, "app-1"))
    await client.delete_publisher(1)
    await client.close()
    return sequences


async def session(port: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
        await producer.create_stream(STREAM, exists_ok=True)
        for n in range(30):
            await producer.send_wait(STREAM, AMQPMessage(body=b"o%d" % n, application_properties={"n": n}))
        await producer.send_batch(
            STREAM, [AMQPMessage(body=b"o%d" % n, application_properties={"n": n}) for n in range(30, 60)]
        )
    await asyncio.sleep(0.5)
    results["sequences"] = await resend(port)
    everything = await read(port, ConsumerOffsetSpecification(OffsetType.FIRST, None), 90)
    results["first"] = [(body, n) for _offset, body, n in everything]
    results["offsets are consecutive"] = [offset for offset, _, _ in everything] == list(range(len(everything)))
    results["from offset 10"] = [
        body for _o, body, _n in await read(port, ConsumerOffsetSpecification(OffsetType.OFFSET, 10), 70)
    ]
    an_hour_ago = int((time.time() - 3600) * 1000)
    results["from a timestamp"] = len(
        await read(port, ConsumerOffsetSpecification(OffsetType.TIMESTAMP, an_hour_ago), 100)
    )

    async def next_only() -> list[Any]:
        reader = asyncio.create_task(read(port, ConsumerOffsetSpecification(OffsetType.NEXT, None), 1))
        await asyncio.sleep(1.5)
        async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
            await producer.send_wait(STREAM, AMQPMessage(body=b"late", application_properties={"n": -1}))
        return [(body, n) for _o, body, n in await reader]

    results["next"] = await next_only()
    async with Consumer("127.0.0.1", port=port, username="guest", password="guest") as consumer:
        await consumer.start()
        try:
            await consumer.query_offset(STREAM, "reader")
            results["unknown reference"] = "found"
        except OffsetNotFound:
            results["unknown reference"] = "OffsetNotFound"
        await consumer.store_offset(STREAM, "reader", 57)
        await asyncio.sleep(0.5)
        results["stored"] = await consumer.query_offset(STREAM, "reader")
    return results


def test_rstream_gets_the_same_from_postroom_as_from_rabbitmq(tmp_path: Path) -> None:
    rabbit_stream, stream, http = free_port(), free_port(), free_port()
    config = f"stream.listeners.tcp.1 = 127.0.0.1:{rabbit_stream}\nstream.advertised_host = 127.0.0.1\n"
    with rabbitmq_node(config, ["rabbitmq_stream"]):
        wait_for_port(rabbit_stream, 60)
        theirs = asyncio.run(session(rabbit_stream))
    with broker(tmp_path / "data", stream=stream, management=http) as (process, amqp):
        ours = asyncio.run(session(stream))
        assert ours == theirs
        assert ours["first"][:2] == [(b"o0", 0), (b"o1", 1)] and len(ours["first"]) == 90
        assert ours["first"][60:] == [(b"d%d" % n, None) for n in range(1, 31)]  # each once
        assert ours["sequences"] == [20, 30] and ours["next"] == [(b"late", -1)]

        # Across protocols: pika reads rstream's messages, rstream reads pika's.
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=200)
        channel.confirm_delivery()
        channel.basic_publish(
            "",
            STREAM,
            b"from amqp",
            pika.BasicProperties(headers={"n": 99}, content_type="text/plain", message_id="a1"),
        )
        seen = []
        for method, properties, body in channel.consume(
            STREAM, arguments={"x-stream-offset": "first"}, inactivity_timeout=2
        ):
            if method is None:
                break
            seen.append((body, properties.headers.get("n"), properties.headers["x-stream-offset"]))
        connection.close()
        assert seen[0] == (b"o0", 0, 0) and seen[-1] == (b"from amqp", 99, len(seen) - 1)
        last = asyncio.run(read(stream, ConsumerOffsetSpecification(OffsetType.LAST, None), 1))
        assert last == [(len(seen) - 1, b"from amqp", 99)]

        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(tmp_path / "data", stream=stream):

        async def stored() -> tuple[int, int]:
            async with Consumer("127.0.0.1", port=stream, username="guest", password="guest") as consumer:
                await consumer.start()
                offset = await consumer.query_offset(STREAM, "reader")
            client = Client("127.0.0.1", stream, frame_max=1048576, heartbeat=60)
            await client.start()
            await client.authenticate("/", "guest", "guest")
            sequence = await client.query_publisher_sequence(STREAM, "app-1")
            await client.close()
            return offset, sequence

        # The stored offset and the publisher's sequence outlived the kill.
        assert asyncio.run(stored()) == (57, 30)
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def declare_super_stream(amqp: int, name: str, partitions: int) -> None:
    """A super stream as RabbitMQ lays one out, declared over AMQP 0-9-1: a direct exchange,
    streams ``name-0`` ..., each bound with its number as key and its partition order."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
    channel = connection.channel()
    channel.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
    for index in range(partitions):
        stream = f"{name}-{index}"
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_bind(stream, name, str(index), arguments={"x-stream-partition-order": index})
    connection.close()


async def routing_key(message: AMQPMessage) -> str:
    return str(message.application_properties["key"])


def rstream_partition(key: str, partitions: int) -> int:
    """The partition rstream's hash routing picks (its own: MurmurHash3 x64 128 of the key's
    UTF-16, seed 104729; RabbitMQ's Java, Go and .NET clients hash its UTF-8 with x86 32)."""
    return int.from_bytes(mmh3.hash_bytes(bytes(key, "UTF-16"), 104729), "little") % partitions


async def publish_invoices(port: int) -> None:
    """60 invoices through rstream's SuperStreamProducer (hash routing), keys of 7 customers."""
    async with SuperStreamProducer(
        "127.0.0.1", port=port, username="guest", password="guest", super_stream="invoices",
        routing_extractor=routing_key, routing=RouteType.Hash,
    ) as producer:  # fmt: skip
        for n in range(60):
            await producer.send(AMQPMessage(body=b"i%d" % n, application_properties={"key": f"customer-{n % 7}"}))
        await asyncio.sleep(1)


async def super_session(port: int) -> dict[str, Any]:
    """Partitions and routes as rstream asks for them, and a SuperStreamProducer (hash
    routing) with a SuperStreamConsumer reading every partition."""
    client = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
    await client.start()
    await client.authenticate("/", "guest", "guest")
    results: dict[str, Any] = {
        "partitions": await client.partitions("invoices"),
        "route 1": await client.route("1", "invoices"),
        "route none": await client.route("nope", "invoices"),
    }
    await client.close()
    await publish_invoices(port)
    got: dict[str, list[bytes]] = {}

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.setdefault(context.stream, []).append(bytes(message.body))

    async with SuperStreamConsumer(
        "127.0.0.1", port=port, username="guest", password="guest", super_stream="invoices"
    ) as consumer:
        await consumer.start()
        await consumer.subscribe(
            on, decoder=amqp_decoder, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None)
        )
        await asyncio.sleep(3)
    results["read"] = {stream: sorted(bodies) for stream, bodies in sorted(got.items())}
    return results


def test_rstreams_super_stream_producer_and_consumer_work_against_postroom(tmp_path: Path) -> None:
    """``route`` and ``partitions`` in the protocol reference's form (RabbitMQ 3.11's: 3.10.8
    answers them without the response bit, which rstream never reads, so there is no RabbitMQ
    3.10 to compare with): the producer hashes each key to a partition as RabbitMQ's stream
    clients do, and the consumer reads every partition."""
    stream = free_port()
    with broker(tmp_path / "data", stream=stream) as (_process, amqp):
        declare_super_stream(amqp, "invoices", 3)
        ours = asyncio.run(super_session(stream))
    assert ours["partitions"] == ["invoices-0", "invoices-1", "invoices-2"]
    assert (ours["route 1"], ours["route none"]) == (["invoices-1"], [])
    expected: dict[str, list[bytes]] = {}
    for n in range(60):
        place = rstream_partition(f"customer-{n % 7}", 3)
        expected.setdefault(f"invoices-{place}", []).append(b"i%d" % n)
    assert ours["read"] == {stream: sorted(bodies) for stream, bodies in sorted(expected.items())}
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


async def group_session(port: int) -> tuple[dict[str, set[bytes]], set[bytes]]:
    """Two members of one consumer group on super stream ``invoices`` (single active consumer
    per partition), 60 messages published, then the second member leaves: what each read,
    and what the first read after."""
    read: dict[str, set[bytes]] = {"a": set(), "b": set()}

    def member(name: str) -> Any:
        async def on(message: AMQPMessage, context: MessageContext) -> None:
            read[name].add(bytes(message.body))

        return on

    async def from_first(active: bool, context: Any) -> OffsetSpecification:
        return OffsetSpecification(OffsetType.FIRST, 0)

    properties = {"single-active-consumer": "true", "name": "billing", "super-stream": "invoices"}
    consumers = []
    for name in ("a", "b"):
        consumer = SuperStreamConsumer(
            "127.0.0.1", port=port, username="guest", password="guest", super_stream="invoices"
        )
        await consumer.start()
        await consumer.subscribe(
            member(name), decoder=amqp_decoder, properties=dict(properties), consumer_update_listener=from_first,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        )  # fmt: skip
        consumers.append(consumer)
        await asyncio.sleep(1)
    await publish_invoices(port)
    await asyncio.sleep(1)
    before = {name: set(bodies) for name, bodies in read.items()}
    await consumers[1].close()  # b leaves: its partition goes to a, from the first offset
    await asyncio.sleep(3)
    after = set(read["a"])
    await consumers[0].close()
    return before, after


def test_a_consumer_group_shares_a_super_streams_partitions_and_fails_over(tmp_path: Path) -> None:
    stream = free_port()
    with broker(tmp_path / "data", stream=stream) as (_process, amqp):
        declare_super_stream(amqp, "invoices", 3)
        before, after = asyncio.run(group_session(stream))
    by_partition: dict[int, set[bytes]] = {0: set(), 1: set(), 2: set()}
    for n in range(60):
        by_partition[rstream_partition(f"customer-{n % 7}", 3)].add(b"i%d" % n)
    # Two members: partition p is read by member p mod 2 (RabbitMQ's rule), each message once.
    assert before == {"a": by_partition[0] | by_partition[2], "b": by_partition[1]}
    # b left: a reads partition 1 too.
    assert after == by_partition[0] | by_partition[1] | by_partition[2]
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


async def publish_keyed(port: int, start: int, count: int, batch: int = 1_000) -> None:
    """Messages ``k<start>`` ... through rstream's SuperStreamProducer (hash routing), keys of
    100 customers, ``batch`` at a time a tenth of a second apart."""
    async with SuperStreamProducer(
        "127.0.0.1", port=port, username="guest", password="guest", super_stream="invoices",
        routing_extractor=routing_key, routing=RouteType.Hash,
    ) as producer:  # fmt: skip
        for n in range(start, start + count):
            await producer.send(AMQPMessage(body=b"k%d" % n, application_properties={"key": f"customer-{n % 100}"}))
            if (n + 1 - start) % batch == 0:
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)


def keyed(start: int, count: int) -> dict[str, list[bytes]]:
    """The bodies of :func:`publish_keyed`'s messages ``start`` ... by partition, sorted."""
    by_partition: dict[str, list[bytes]] = {}
    for n in range(start, start + count):
        by_partition.setdefault(f"invoices-{rstream_partition(f'customer-{n % 100}', 3)}", []).append(b"k%d" % n)
    return {partition: sorted(bodies) for partition, bodies in sorted(by_partition.items())}


Read = list[tuple[str, str, bytes]]


async def group_of_three_session(port: int) -> Read:
    """Members of one consumer group on super stream ``invoices``, reading slowly: ``a`` joins,
    messages 0-9,999 are published and ``b`` then ``c`` join meanwhile; 10,000-10,299 once all is
    read. Then 10,300-13,299, ``b`` leaving and ``d`` joining meanwhile; 13,300-13,599 once all
    is read. ``(member, partition, body)`` of each message read.

    Each member reads a partition on from after the last message the group read of it (as a
    consumer storing its offsets would); one stepping down first handles what it was sent."""
    read: Read = []
    last: dict[str, int] = {}  # the last offset the group read, by partition
    handled: dict[tuple[str, str], int] = {}  # messages handled, by member and partition

    def member(name: str) -> tuple[Any, Any]:
        async def on(message: AMQPMessage, context: MessageContext) -> None:
            read.append((name, context.stream, bytes(message.body)))
            last[context.stream] = context.offset
            handled[name, context.stream] = handled.get((name, context.stream), 0) + 1
            if len(read) % 3 == 0:
                await asyncio.sleep(0.001)  # (a slow consumer: some chunks wait when it steps down)

        async def update(active: bool, context: Any) -> OffsetSpecification:
            if not active:  # what it was sent is handled first
                while True:
                    before = handled.get((name, context.stream), 0)
                    await asyncio.sleep(0.2)
                    if handled.get((name, context.stream), 0) == before:
                        return OffsetSpecification(OffsetType.NEXT, 0)
            if context.stream in last:
                return OffsetSpecification(OffsetType.OFFSET, last[context.stream] + 1)
            return OffsetSpecification(OffsetType.FIRST, 0)

        return on, update

    async def join(name: str) -> SuperStreamConsumer:
        consumer = SuperStreamConsumer(
            "127.0.0.1", port=port, username="guest", password="guest", super_stream="invoices"
        )
        await consumer.start()
        on, update = member(name)
        await consumer.subscribe(
            on, decoder=amqp_decoder, consumer_update_listener=update,
            properties={"single-active-consumer": "true", "name": "billing", "super-stream": "invoices"},
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        )  # fmt: skip
        return consumer

    async def until(count: int) -> None:
        deadline = time.monotonic() + 60
        while len({body for _, _, body in read}) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # (and no more than that)

    async def once(name: str, partition: str, count: int) -> None:
        deadline = time.monotonic() + 30
        while handled.get((name, partition), 0) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    members = {"a": await join("a")}
    publishing = asyncio.create_task(publish_keyed(port, 0, 10_000))
    await once("a", "invoices-1", 500)
    members["b"] = await join("b")
    await once("a", "invoices-2", 1_000)
    members["c"] = await join("c")
    await publishing
    await until(10_000)
    await publish_keyed(port, 10_000, 300)
    await until(10_300)
    publishing = asyncio.create_task(publish_keyed(port, 10_300, 3_000))
    await once("b", "invoices-1", handled.get(("b", "invoices-1"), 0) + 300)
    await members.pop("b").close()
    members["d"] = await join("d")
    await publishing
    await until(13_300)
    await publish_keyed(port, 13_300, 300)
    await until(13_600)
    for consumer in members.values():
        await consumer.close()
    return read


def test_a_consumer_group_of_three_gives_each_member_a_partition_and_hands_them_over(tmp_path: Path) -> None:
    """RabbitMQ's rules for a group over a super stream: partition p goes to member p mod n
    of the n members in the order they came; the member reading it steps down and answers
    before the next is made active, so no message is read twice or missed."""
    stream = free_port()
    with broker(tmp_path / "data", stream=stream) as (_process, amqp):
        declare_super_stream(amqp, "invoices", 3)
        read = asyncio.run(group_of_three_session(stream))

    def part(start: int, end: int) -> Read:
        return [each for each in read if start <= int(each[2][1:]) < end]

    joined, settled, handed, after = part(0, 10_000), part(10_000, 10_300), part(10_300, 13_300), part(13_300, 13_600)

    def readers(some: Read) -> dict[str, set[str]]:
        held: dict[str, set[str]] = {}
        for name, partition, _ in some:
            held.setdefault(partition, set()).add(name)
        return held

    def bodies(some: Read) -> dict[str, list[bytes]]:
        by_partition: dict[str, list[bytes]] = {}
        for _, partition, body in some:
            by_partition.setdefault(partition, []).append(body)
        return {partition: sorted(found) for partition, found in sorted(by_partition.items())}

    # Each message once, whatever moved while it was published.
    assert [body for body, times in Counter(body for _, _, body in read).items() if times > 1] == []
    assert bodies(joined) == keyed(0, 10_000)
    assert bodies(handed) == keyed(10_300, 3_000)
    # a, b, c: partition p is read by member p mod 3.
    assert bodies(settled) == keyed(10_000, 300)
    assert readers(settled) == {"invoices-0": {"a"}, "invoices-1": {"b"}, "invoices-2": {"c"}}
    # b left (a, c: 1 went to c, 2 to a), then d came (a, c, d: 2 went to d).
    assert bodies(after) == keyed(13_300, 300)
    assert readers(after) == {"invoices-0": {"a"}, "invoices-1": {"c"}, "invoices-2": {"d"}}
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


async def tls_session(port: int, context: ssl.SSLContext, http: int) -> tuple[list[bytes], list[Any]]:
    """rstream over TLS, logged in by its client certificate (EXTERNAL): what it reads back of
    what it published, and how the API shows its connections."""
    login: dict[str, Any] = {
        "username": "", "password": "", "ssl_context": context,
        "sasl_configuration_mechanism": SlasMechanism.MechanismExternal,
    }  # fmt: skip
    async with Producer("127.0.0.1", port=port, connection_name="tls-producer", **login) as producer:
        await producer.create_stream("tls-s", exists_ok=True)
        await producer.send_batch("tls-s", [AMQPMessage(body=b"t%d" % n) for n in range(3)])
        await asyncio.sleep(0.5)
        got: list[bytes] = []

        async def on(message: AMQPMessage, context: MessageContext) -> None:
            got.append(bytes(message.body))

        async with Consumer("127.0.0.1", port=port, connection_name="tls-consumer", **login) as consumer:
            await consumer.start()
            await consumer.subscribe(
                "tls-s", on, decoder=amqp_decoder, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST)
            )
            deadline = time.monotonic() + 5
            while len(got) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            request = urllib.request.Request(
                f"http://127.0.0.1:{http}/api/stream/connections",
                headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                shown = json.loads(response.read())
    return got, [(c["user_provided_name"], c["user"], c["auth_mechanism"], c["ssl"]) for c in shown]


def test_rstream_logs_in_with_its_client_certificate_over_tls(tmp_path: Path) -> None:
    """EXTERNAL over the stream protocol's TLS listener. (RabbitMQ 3.10.8's stream reader
    crashes on EXTERNAL: ``tests/conformance/test_stream_tls_transcripts.py``.)"""
    pki = write_test_pki(tmp_path)
    stream, secured, http = free_port(), free_port(), free_port()
    extra = (
        f"tls: {{certificate: '{pki['server.crt']}', key: '{pki['server.key']}', "
        f"ca: ['{pki['client-ca']}'], verify: peer}}\n"
        "auth_mechanisms: [PLAIN, AMQPLAIN, EXTERNAL]\n"
        "users:\n"
        "  - {name: guest, password: guest, loopback_only: true, tags: [administrator]}\n"
        "  - {name: app, password: app-password}\n"
    )
    context = ssl.create_default_context(cafile=str(pki["server-ca"]))
    context.load_cert_chain(pki["app.crt"], pki["app.key"])
    with broker(tmp_path / "data", stream=stream, stream_tls=secured, management=http, extra=extra):
        got, shown = asyncio.run(tls_session(secured, context, http))
    assert got == [b"t0", b"t1", b"t2"]
    assert ("tls-producer", "app", "EXTERNAL", True) in shown and ("tls-consumer", "app", "EXTERNAL", True) in shown
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


async def super_stream_lifecycle(port: int) -> dict[str, Any]:
    """rstream's own create_super_stream and delete_super_stream (RabbitMQ 3.13's commands),
    with the refusals the protocol reference gives."""
    results: dict[str, Any] = {}
    settings: dict[str, Any] = {
        "username": "guest", "password": "guest", "super_stream": "orders-ss",
        "routing_extractor": routing_key, "routing": RouteType.Hash,
    }  # fmt: skip
    async with SuperStreamProducer("127.0.0.1", port=port, **settings) as creator:
        await creator.create_super_stream("orders-ss", n_partitions=3, arguments={"max-age": "1h"})
        try:
            await creator.create_super_stream("orders-ss", n_partitions=3)
            results["again"] = "created"
        except StreamAlreadyExists:
            results["again"] = "StreamAlreadyExists"
    # (rstream's create_super_stream closes the connection its producer routes with: a new one)
    async with SuperStreamProducer("127.0.0.1", port=port, **settings) as producer:
        for n in range(30):
            await producer.send(AMQPMessage(body=b"s%d" % n, application_properties={"key": f"k{n}"}))
        await asyncio.sleep(1)
    client = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
    await client.start()
    await client.authenticate("/", "guest", "guest")
    results["partitions"] = await client.partitions("orders-ss")
    results["route 2"] = await client.route("2", "orders-ss")
    for name, partitions, keys in [("bad-ss", ["bad-ss-a", "bad-ss-b"], ["a"]), ("amq.ss", ["amq-ss-0"], ["0"])]:
        try:
            await client.create_super_stream(name, partitions, keys)
            results[name] = "created"
        except ServerError as error:
            results[name] = type(error).__name__
    await client.close()
    return results


async def delete_super_stream(port: int) -> list[str]:
    client = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
    await client.start()
    await client.authenticate("/", "guest", "guest")
    outcomes = []
    for _ in range(2):
        try:
            await client.delete_super_stream("orders-ss")
            outcomes.append("deleted")
        except ServerError as error:
            outcomes.append(type(error).__name__)
    await client.close()
    return outcomes


def test_rstream_creates_and_deletes_a_super_stream(tmp_path: Path) -> None:
    stream, http = free_port(), free_port()
    with broker(tmp_path / "data", stream=stream) as (process, amqp):
        results = asyncio.run(super_stream_lifecycle(stream))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert results == {
        "again": "StreamAlreadyExists",
        "partitions": ["orders-ss-0", "orders-ss-1", "orders-ss-2"],
        "route 2": ["orders-ss-2"],
        "bad-ss": "PreconditionFailed",
        "amq.ss": "PreconditionFailed",
    }
    with broker(tmp_path / "data", stream=stream, management=http) as (_process, amqp):
        # The super stream outlived the kill, with its messages and its streams' max-age.
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
        counts = [
            connection.channel().queue_declare(f"orders-ss-{n}", passive=True).method.message_count for n in range(3)
        ]
        connection.close()
        assert sum(counts) == 30 and all(counts)
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/api/queues/%2F/orders-ss-0",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["arguments"]["x-max-age"] == "1h"
        assert asyncio.run(delete_super_stream(stream)) == ["deleted", "StreamDoesNotExist"]
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            channel.exchange_declare("orders-ss", passive=True)
        connection.close()
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


BATCHES = "batches-s"


async def batch_session(port: int, compression: CompressionType) -> dict[str, Any]:
    """rstream's sub-entry batches (``send_sub_entry``) among single messages, read back from
    ``first`` and from an offset inside a batch."""
    results: dict[str, Any] = {}
    name = f"{BATCHES}-{compression.name}"
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
        await producer.create_stream(name)
        await producer.send_wait(name, AMQPMessage(body=b"single-0"))
        for first in (1, 6):
            batch = [
                AMQPMessage(body=b"batched-%d" % n, application_properties={"n": n}) for n in range(first, first + 5)
            ]
            confirmed = asyncio.Event()

            async def on_confirm(status: ConfirmationStatus, confirmed: asyncio.Event = confirmed) -> None:
                confirmed.set()

            await producer.send_sub_entry(name, batch, compression_type=compression, on_publish_confirm=on_confirm)
            await asyncio.wait_for(confirmed.wait(), 10)  # (each batch its own chunk, on both brokers)
        await producer.send_wait(name, AMQPMessage(body=b"single-11"))
    await asyncio.sleep(0.5)
    for key, offset, until in (
        ("first", ConsumerOffsetSpecification(OffsetType.FIRST, None), 12),
        ("from 8", ConsumerOffsetSpecification(OffsetType.OFFSET, 8), 4),
        ("last", ConsumerOffsetSpecification(OffsetType.LAST, None), 1),
    ):
        results[key] = [(o, body) for o, body, _n in await read(port, offset, until, stream=name)]
    return results


def amqp_read(port: int, name: str) -> list[tuple[bytes, int]]:
    """What pika reads of stream ``name`` from ``first``: each body with its ``x-stream-offset``."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    seen = []
    for method, properties, body in channel.consume(name, arguments={"x-stream-offset": "first"}, inactivity_timeout=2):
        if method is None:
            break
        seen.append((body, properties.headers["x-stream-offset"]))
    connection.close()
    return seen


def test_sub_entry_batches_read_back_as_from_rabbitmq(tmp_path: Path) -> None:
    rabbit_stream, stream = free_port(), free_port()
    config = f"stream.listeners.tcp.1 = 127.0.0.1:{rabbit_stream}\nstream.advertised_host = 127.0.0.1\n"
    with rabbitmq_node(config, ["rabbitmq_stream"]) as (rabbit_amqp, _pid):
        wait_for_port(rabbit_stream, 60)
        theirs = {kind: asyncio.run(batch_session(rabbit_stream, kind)) for kind in CompressionType if kind.value < 2}
        # RabbitMQ 3.10's AMQP 0-9-1 readers take an uncompressed batch's messages one by one.
        their_amqp = amqp_read(rabbit_amqp, f"{BATCHES}-No")
    with broker(tmp_path / "data", stream=stream) as (process, amqp):
        ours = {kind: asyncio.run(batch_session(stream, kind)) for kind in CompressionType if kind.value < 2}
        assert ours == theirs
        expected = [(0, b"single-0")] + [(n, b"batched-%d" % n) for n in range(1, 11)] + [(11, b"single-11")]
        assert ours[CompressionType.No]["first"] == expected
        assert ours[CompressionType.Gzip]["first"] == expected
        assert amqp_read(amqp, f"{BATCHES}-No") == their_amqp == [(body, offset) for offset, body in expected]
        # A compressed batch's messages are for the stream protocol's clients: AMQP 0-9-1
        # readers pass over them (RabbitMQ 3.11 on; 3.10's readers fail on them).
        assert amqp_read(amqp, f"{BATCHES}-Gzip") == [(b"single-0", 0), (b"single-11", 11)]
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(tmp_path / "data", stream=stream):

        async def reread() -> list[list[Any]]:
            first = ConsumerOffsetSpecification(OffsetType.FIRST, None)
            return [
                [(o, body) for o, body, _n in await read(stream, first, 12, stream=f"{BATCHES}-{kind}")]
                for kind in ("No", "Gzip")
            ]

        assert asyncio.run(reread()) == [expected, expected]
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


class RawClient:
    """A blocking stream-protocol client that reads frames whole."""

    def __init__(self, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = wire.FrameReader()
        self.frames: list[bytes] = []
        self.socket.sendall(b"".join(handshake_frames()))
        while not any(struct.unpack_from(">H", f)[0] == wire.OPEN | wire.RESPONSE for f in self.frames):
            self.read()

    def read(self) -> None:
        data = self.socket.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        self.frames += self.reader.feed(data)


def test_large_chunks_reach_a_slow_reader_whole_and_checked(tmp_path: Path) -> None:
    """Chunks of 64 KiB and more go from their file (sendfile) while the socket takes them,
    and through the transport when it is full: a reader that waits before reading gets every
    chunk whole, its CRC right, and every message once, in order."""
    port = free_port()
    with broker(tmp_path / "data", stream=port):
        client = RawClient(port)
        client.socket.sendall(request(wire.CREATE_STREAM, 5, wire.string("large") + wire.string_map({})))
        client.socket.sendall(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("large")))
        frames, per_frame = 400, 50  # 20 MB
        bodies = [bytes([n % 251]) * (1000 + n % 50) for n in range(per_frame)]
        for number in range(frames):
            messages = b"".join(
                struct.pack(">QI", number * per_frame + n, len(body)) + body for n, body in enumerate(bodies)
            )
            client.socket.sendall(wire.frame(wire.PUBLISH, struct.pack(">BI", 1, per_frame) + messages))
        confirmed = 0
        while confirmed < frames * per_frame:
            client.read()
            for got in client.frames:
                if struct.unpack_from(">H", got)[0] == wire.PUBLISH_CONFIRM:
                    confirmed += struct.unpack_from(">I", got, 5)[0]
            client.frames.clear()
        subscribe = b"\x01" + wire.string("large") + struct.pack(">hH", wire.OFFSET_FIRST, 1000)
        client.socket.sendall(request(wire.SUBSCRIBE, 7, subscribe))
        time.sleep(1.0)  # (the socket's buffers fill meanwhile)
        head = struct.Struct(">HHBBBHIqQQIIII")
        offset, sizes = 0, []
        while offset < frames * per_frame:
            client.read()
            for got in client.frames:
                if struct.unpack_from(">H", got)[0] != wire.DELIVER:
                    continue
                fields = head.unpack_from(got)
                entries = got[head.size :]
                assert (fields[9], fields[10], fields[11]) == (offset, zlib.crc32(entries), len(entries))
                at = 0
                for n in range(fields[6]):
                    size = struct.unpack_from(">I", entries, at)[0]
                    assert entries[at + 4 : at + 4 + size] == bodies[(offset + n) % per_frame]
                    at += 4 + size
                assert at == len(entries)
                offset += fields[6]
                sizes.append(len(entries))
            client.frames.clear()
        client.socket.close()
        assert max(sizes) >= 64 << 10 and offset == frames * per_frame
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

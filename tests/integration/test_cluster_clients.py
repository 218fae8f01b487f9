"""Stock clients through a failover, with nothing of theirs changed: kombu and Celery given every
node's address as failover URLs, aio-pika's robust connection given one node's. The leader is
killed while they publish with confirms; each carries on through another node, and everything
they had confirmed is consumed afterwards (at least once: a publish that failed with the leader
is sent again)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import kombu
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from postroom.broker.tools.cluster_lab import Lab

pytestmark = [pytest.mark.integration, pytest.mark.interop]


def urls(lab: Lab) -> list[str]:
    return [f"amqp://guest:guest@127.0.0.1:{port}//" for port in lab.amqp_ports()]


def wait_until(condition: Callable[[], bool], seconds: float, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, why()
        time.sleep(0.05)


def test_kombu_given_every_node_carries_on_through_a_failover(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    exchange = kombu.Exchange("kombu.failover", type="direct", durable=True)
    queue = kombu.Queue("kombu.failover", exchange, routing_key="jobs", durable=True)
    confirmed = []
    with kombu.Connection(
        ";".join(urls(lab)), transport_options={"confirm_publish": True}, connect_timeout=2, heartbeat=0
    ) as connection:
        producer = connection.Producer()
        publish = connection.ensure(
            producer, producer.publish, max_retries=100, interval_start=0.1, interval_step=0.1, interval_max=0.5
        )
        for number in range(400):
            if number == 200:
                lab.signal(leader, signal.SIGKILL)
            publish({"n": number}, exchange=exchange, routing_key="jobs", declare=[queue], delivery_mode=2)
            confirmed.append(number)
    assert lab.wait_for_leader() != leader

    got: list[int] = []

    def take(body: Any, message: Any) -> None:
        got.append(body["n"])
        message.ack()

    with kombu.Connection(";".join(urls(lab)), connect_timeout=2, heartbeat=0) as connection:
        with connection.Consumer(queue, callbacks=[take], prefetch_count=100):
            deadline = time.monotonic() + 30
            while not set(confirmed) <= set(got) and time.monotonic() < deadline:
                try:
                    connection.drain_events(timeout=1)
                except TimeoutError:
                    pass
    assert set(confirmed) <= set(got), f"lost {sorted(set(confirmed) - set(got))[:20]}"
    assert set(got) <= set(range(400))


def test_a_celery_worker_and_its_callers_carry_on_through_a_failover(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    app = Celery("postroom_cluster", broker=";".join(urls(lab)), set_as_current=False)
    app.conf.update(
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry=True,
        broker_connection_max_retries=100,
        broker_connection_timeout=2,
        broker_heartbeat=0,
        task_default_queue="celery.failover",
        task_acks_late=True,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
    )
    done: set[int] = set()
    lock = threading.Lock()

    @app.task(name="tests.record")
    def record(number: int) -> None:
        with lock:
            done.add(number)

    retry = {"max_retries": 100, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 1.0}
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        for number in range(20):
            record.apply_async((number,), retry=True, retry_policy=retry)
        wait_until(lambda: done >= set(range(20)), 30, lambda: f"ran {sorted(done)}")
        lab.signal(leader, signal.SIGKILL)
        for number in range(20, 40):
            record.apply_async((number,), retry=True, retry_policy=retry)
        wait_until(lambda: done >= set(range(40)), 60, lambda: f"ran {sorted(done)}: {lab.logs()}")
    assert lab.wait_for_leader() != leader


async def publish_through_a_failover(url: str, kill: Callable[[], None]) -> tuple[list[int], list[int]]:
    """Publish 200 numbers with confirms on a robust connection to ``url``, ``kill`` called
    after the first 100, sending again each that failed; then consume: (confirmed, consumed)."""
    connection = await aio_pika.connect_robust(url, timeout=5, reconnect_interval=0.2)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("aio.failover", durable=True)
        confirmed = []
        for number in range(200):
            if number == 100:
                await asyncio.get_running_loop().run_in_executor(None, kill)
            for _attempt in range(300):
                try:
                    message = aio_pika.Message(str(number).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                    await channel.default_exchange.publish(message, routing_key="aio.failover", timeout=5)
                    break
                except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError, asyncio.TimeoutError):
                    await asyncio.sleep(0.1)  # (the robust connection comes back by itself)
            else:
                raise AssertionError(f"{number} was never confirmed")
            confirmed.append(number)
        queue = await channel.declare_queue("aio.failover", durable=True)
        consumed: list[int] = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    consumed.append(int(message.body))
                if set(confirmed) <= set(consumed):
                    break
    return confirmed, consumed


def test_aio_pika_robust_connection_carries_on_through_a_failover(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    follower = next(name for name in lab.nodes if name != leader)
    url = f"amqp://guest:guest@127.0.0.1:{lab.nodes[follower].amqp}/"  # (it serves on, leading or forwarding)

    confirmed, consumed = asyncio.run(
        asyncio.wait_for(publish_through_a_failover(url, lambda: lab.signal(leader, signal.SIGKILL)), timeout=120)
    )
    assert confirmed == list(range(200))
    assert set(consumed) == set(range(200))
    assert lab.wait_for_leader() != leader


async def publish_stream(port: int, numbers: range) -> None:
    """Publish ``numbers`` to the stream ``events`` with rstream, each confirmed before the next."""
    from rstream import AMQPMessage, Producer

    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
        await producer.create_stream("events", exists_ok=True)
        for number in numbers:
            await producer.send_wait("events", AMQPMessage(body=str(number).encode()))


async def leader_of_stream(port: int) -> tuple[str, int]:
    """Where the stream protocol's ``metadata`` says ``events`` is led, asked on ``port``."""
    from rstream.client import Client

    client = Client("127.0.0.1", port, frame_max=1048576, heartbeat=60)
    await client.start()
    await client.authenticate("/", "guest", "guest")
    leader, _replicas = await client.query_leader_and_replicas("events")
    await client.close()
    return leader.host, leader.port


async def read_stream(port: int, count: int) -> list[tuple[int, int]]:
    """``(offset, number)`` of the first ``count`` messages of ``events``."""
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType, amqp_decoder

    got: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append((context.offset, int(bytes(message.body))))
        if len(got) >= count:
            done.set()

    async with Consumer("127.0.0.1", port=port, username="guest", password="guest") as consumer:
        await consumer.start()
        first = ConsumerOffsetSpecification(OffsetType.FIRST, None)
        await consumer.subscribe("events", on, decoder=amqp_decoder, offset_specification=first)
        await asyncio.wait_for(done.wait(), 30)
    return got[:count]


def test_a_stream_client_finds_the_leader_and_reads_everything_after_a_failover(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab(streams=True)
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    follower = next(name for name in lab.nodes if name != leader)
    stream_port = {name: node.stream for name, node in lab.nodes.items()}
    assert all(stream_port.values())
    asyncio.run(asyncio.wait_for(publish_stream(stream_port[follower], range(100)), 60))
    # Asked on a follower, which forwards to the leader: the leader's address.
    assert asyncio.run(leader_of_stream(stream_port[follower])) == ("127.0.0.1", stream_port[leader])

    lab.signal(leader, signal.SIGKILL)
    second = lab.wait_for_leader(other_than=leader)
    assert asyncio.run(leader_of_stream(stream_port[follower])) == ("127.0.0.1", stream_port[second])
    asyncio.run(asyncio.wait_for(publish_stream(stream_port[follower], range(100, 200)), 60))
    got = asyncio.run(read_stream(stream_port[follower], 200))
    assert [number for _offset, number in got] == list(range(200))
    assert [offset for offset, _number in got] == list(range(200))

"""The bundled plugins end to end: pika against a real broker on loopback, and across a restart
of ``postroom serve`` (delayed persistent messages come back with the delay that remained)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from postroom.broker.tools.testing import free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[2]


def wait_for(connection: BlockingConnection, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Run ``connection``'s I/O loop until ``condition()`` holds, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"condition not met within {timeout} s")
        connection.process_data_events(time_limit=min(remaining, 0.02))


def get_when_it_comes(connection: BlockingConnection, channel: BlockingChannel, queue: str) -> tuple[Any, float]:
    """Poll ``queue`` until a message comes; return it (method, properties, body) and when it came."""
    got: list[Any] = []

    def poll() -> bool:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            got.append(((method, properties, body), time.monotonic()))
        return bool(got)

    wait_for(connection, poll)
    return got[0]


def declare_delayed(channel: BlockingChannel, durable: bool = False) -> None:
    channel.exchange_declare("later", "x-delayed-message", durable=durable, arguments={"x-delayed-type": "direct"})
    channel.queue_declare("jobs", durable=durable)
    channel.queue_bind("jobs", "later", "job")


@pytest.fixture
def connect() -> Iterator[Callable[[int], BlockingConnection]]:
    """``connect(port)``: a pika connection as guest, closed after the test."""
    connections: list[BlockingConnection] = []

    def make(port: int, **overrides: Any) -> BlockingConnection:
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": port,
            "credentials": pika.PlainCredentials("guest", "guest"),
            "connection_attempts": 1,
            "socket_timeout": 5,
            "stack_timeout": 5,
        }
        options.update(overrides)
        connection = pika.BlockingConnection(pika.ConnectionParameters(**options))
        connections.append(connection)
        return connection

    yield make
    for connection in connections:
        # A connection to a broker the test killed is already gone.
        with contextlib.suppress(pika.exceptions.AMQPError):
            if connection.is_open:
                connection.close()


def test_a_delayed_message_arrives_after_its_delay_with_x_delay_negated(plugin_broker: Any, connect: Any) -> None:
    connection = connect(plugin_broker("delayed_message").port)
    channel = connection.channel()
    declare_delayed(channel)
    channel.confirm_delivery()
    sent = time.monotonic()
    channel.basic_publish("later", "job", b"soon", pika.BasicProperties(headers={"x-delay": 300, "n": 1}))
    channel.basic_publish("later", "job", b"now")
    assert channel.basic_get("jobs", auto_ack=True)[2] == b"now"
    assert channel.basic_get("jobs", auto_ack=True)[0] is None
    (method, properties, body), came = get_when_it_comes(connection, channel, "jobs")
    assert body == b"soon"
    assert properties.headers == {"x-delay": -300, "n": 1}
    assert came - sent >= 0.3


def test_a_mandatory_delayed_publish_is_returned_but_still_delivered(plugin_broker: Any, connect: Any) -> None:
    connection = connect(plugin_broker("delayed_message").port)
    channel = connection.channel()
    declare_delayed(channel)
    channel.confirm_delivery()
    with pytest.raises(UnroutableError):
        channel.basic_publish("later", "job", b"x", pika.BasicProperties(headers={"x-delay": 100}), mandatory=True)
    (_method, _properties, body), _came = get_when_it_comes(connection, channel, "jobs")
    assert body == b"x"


def test_declaring_a_delayed_exchange_without_its_type_closes_the_channel_with_406(
    plugin_broker: Any, connect: Any
) -> None:
    connection = connect(plugin_broker("delayed_message").port)
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare("later", "x-delayed-message")
    assert excinfo.value.reply_code == 406
    assert "'x-delayed-type' must be an existing exchange type" in excinfo.value.reply_text


def test_a_broker_without_the_plugin_refuses_the_type(plugin_broker: Any, connect: Any) -> None:
    connection = connect(plugin_broker().port)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        connection.channel().exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - invalid exchange type 'x-delayed-message'",
    )


def test_the_consistent_hash_exchange_spreads_messages_over_four_queues(plugin_broker: Any, connect: Any) -> None:
    connection = connect(plugin_broker("consistent_hash").port)
    channel = connection.channel()
    channel.exchange_declare("spread", "x-consistent-hash")
    queues = [f"part-{i}" for i in range(4)]
    for queue in queues:
        channel.queue_declare(queue)
        channel.queue_bind(queue, "spread", "1")
    channel.confirm_delivery()
    for i in range(4000):
        channel.basic_publish("spread", f"customer-{i}", b"x")
    counts = [channel.queue_declare(queue, passive=True).method.message_count for queue in queues]
    # 4,000 keys over 4 equal weights: 1,000 each, binomial sd 27; the tolerance, 10% (100), is 3.6 sd.
    assert sum(counts) == 4000
    assert all(abs(count - 1000) <= 100 for count in counts), counts
    # The same key always goes to the same queue.
    for _ in range(20):
        channel.basic_publish("spread", "customer-7", b"again")
    after = [channel.queue_declare(queue, passive=True).method.message_count for queue in queues]
    assert sorted(b - a for a, b in zip(counts, after, strict=True)) == [0, 0, 0, 20]


def test_a_consistent_hash_binding_key_that_is_no_weight_closes_the_channel(plugin_broker: Any, connect: Any) -> None:
    connection = connect(plugin_broker("consistent_hash").port)
    channel = connection.channel()
    channel.exchange_declare("spread", "x-consistent-hash")
    channel.queue_declare("part")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_bind("part", "spread", "heavy")
    assert excinfo.value.reply_code == 406
    assert excinfo.value.reply_text == "PRECONDITION_FAILED - The binding key must be an integer: 'heavy'"


@contextmanager
def serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``postroom serve`` with the delayed-message plugin, on a fresh port, over ``tmp_path/data``."""
    port = free_port()
    config = tmp_path / f"broker-{port}.yaml"
    config.write_text(
        f'listen: {{amqp: "tcp:{port}:interface=127.0.0.1"}}\n'
        f'storage: {{dir: "{tmp_path / "data"}", fsync: always}}\n'
        "plugins: [delayed_message]\n"
    )
    log = open(tmp_path / "broker.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    try:
        wait_for_port(port, 20)
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        log.close()


def test_delayed_persistent_messages_survive_a_kill_and_restart(tmp_path: Path, connect: Any) -> None:
    with serve(tmp_path) as (process, port):
        connection = connect(port)
        channel = connection.channel()
        declare_delayed(channel, durable=True)
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 2500})
        published = time.monotonic()
        channel.basic_publish("later", "job", b"kept", persistent)  # confirmed: in the log
        channel.basic_publish("later", "job", b"lost", pika.BasicProperties(headers={"x-delay": 2500}))
        process.kill()  # SIGKILL: nothing is flushed on the way out
        process.wait(10)
    assert (
        "plugin delayed_message loaded from bundled module postroom.plugins.delayed_message"
        in (tmp_path / "broker.log").read_text()
    )
    with serve(tmp_path) as (_process, port):
        connection = connect(port)
        channel = connection.channel()
        (_method, properties, body), came = get_when_it_comes(connection, channel, "jobs")
        assert body == b"kept"
        assert properties.headers == {"x-delay": -2500}
        assert came - published >= 2.5
        assert channel.basic_get("jobs", auto_ack=True)[0] is None  # the transient one is gone

"""A RabbitMQ definitions.json applied to a real broker, then checked with pika."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ProbableAccessDeniedError, ProbableAuthenticationError
from twisted.internet.task import Clock

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.journal import Journal
from postroom.broker.storage.streams import StreamFiles
from postroom.config.loader import load
from tests.integration.test_crash import broker as serve

pytestmark = [pytest.mark.integration, pytest.mark.interop]

EXPORT = Path(__file__).parent.parent / "config" / "fixtures" / "rabbitmq-definitions.json"


def postroom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_declare_applies_an_export_and_reports_the_rest(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as (_process, port):  # with storage: the export has a stream
        declare_export(port)


def declare_export(port: int) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    result = postroom("declare", "--url", url, "-f", str(EXPORT))
    assert result.returncode == 0, result.stderr
    assert "declared 5 exchange(s), 5 queue(s), 5 binding(s) on vhost '/'" in result.stdout
    assert f"{EXPORT}: vhost 'billing' not applied: run again with it in --url" in result.stderr
    assert f"{EXPORT}: users and permissions are applied when the broker starts with this file" in result.stderr
    assert f"{EXPORT}: policies are applied when the broker starts with this file" in result.stderr
    assert f"{EXPORT}: exchanges[5].type: unknown exchange type 'x-modulus-hash'" in result.stderr
    again = postroom("declare", "--url", url, "-f", str(EXPORT))
    assert again.returncode == 0, again.stderr  # the same export applies twice without a conflict

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
    channel = connection.channel()
    assert channel.queue_declare("orders.events", passive=True, arguments={}).method.message_count == 0
    with pytest.raises(ChannelClosedByBroker) as inequivalent:  # a stream, with RabbitMQ's x-max-age
        connection.channel().queue_declare("orders.events", durable=True, arguments={"x-queue-type": "classic"})
    assert inequivalent.value.reply_code == 406
    for queue in ("orders.created", "orders.dlq", "orders.priority", "orders.audit", "orders.events"):
        channel.queue_declare(queue, passive=True)
    for exchange in ("orders", "orders.unrouted", "orders.dlx", "orders.audit", "orders.priority"):
        channel.exchange_declare(exchange, passive=True)
    channel.confirm_delivery()
    # Through a topic binding, and through the exchange-to-exchange binding into the internal exchange.
    channel.basic_publish("orders", "order.eu.created", b'{"id": 1}')
    assert channel.basic_get("orders.audit", auto_ack=True)[2] == b'{"id": 1}'
    method, _properties, body = channel.basic_get("orders.created")
    assert body == b'{"id": 1}'
    # The x-dead-letter-* arguments: a rejected message goes to orders.dlx with the new routing key.
    channel.basic_reject(method.delivery_tag, requeue=False)
    dead_method, dead_properties, dead = channel.basic_get("orders.dlq", auto_ack=True)
    assert dead == b'{"id": 1}' and dead_method.routing_key == "orders.created.dead"
    assert dead_properties.headers["x-death"][0]["reason"] == "rejected"
    assert dead_properties.headers["x-death"][0]["queue"] == "orders.created"
    # Binding arguments: the headers binding takes only priority=high.
    for priority in ("high", "low"):
        channel.basic_publish(
            "orders.priority", "", priority.encode(), pika.BasicProperties(headers={"priority": priority})
        )
    assert [channel.basic_get("orders.priority", auto_ack=True)[2] for _ in range(2)] == [b"high", None]
    # Queue arguments took effect: a second declare with other arguments is refused as inequivalent.
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare("orders.priority", durable=True, arguments={"x-max-priority": 5})
    assert refused.value.reply_code == 406
    connection.close()


def test_a_broker_started_with_an_export_lets_its_users_in_with_their_passwords(
    make_broker: Callable[..., Any], tmp_path: Path
) -> None:
    broker = make_broker(node_from_config(load(EXPORT), streams=StreamFiles(str(tmp_path), Journal(1), Clock())))

    def connect(user: str, password: str, vhost: str) -> pika.BlockingConnection:
        parameters = pika.ConnectionParameters(
            "127.0.0.1",
            broker.port,
            vhost,
            pika.PlainCredentials(user, password),
            connection_attempts=1,
            socket_timeout=5,
        )
        return pika.BlockingConnection(parameters)

    connect("orders-app", "s3cret", "/").close()  # a sha256 hash from the export
    connect("billing-app", "ledger", "billing").close()  # a sha512 one
    connect("guest", "guest", "/").close()
    with pytest.raises(ProbableAuthenticationError):
        connect("orders-app", "wrong", "/")
    with pytest.raises(ProbableAuthenticationError):
        connect("federation", "", "billing")  # no password in the export: not created
    with pytest.raises(ProbableAccessDeniedError):
        connect("billing-app", "ledger", "/")  # no permissions on '/'
    with pytest.raises(ProbableAccessDeniedError):
        connect("guest", "guest", "billing")
    assert broker.call(lambda: sorted(broker.node.vhosts["billing"].queues)) == ["invoices.pending"]

"""py-amqp (the ``amqp`` package) against an in-process broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import amqp
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.interop]


def connect(port: int, password: str = "guest", **options: Any) -> amqp.Connection:
    """A connected py-amqp connection to ``port`` with bounded connect and I/O timeouts."""
    conn = amqp.Connection(
        host=f"127.0.0.1:{port}",
        userid="guest",
        password=password,
        connect_timeout=5,
        read_timeout=5,
        write_timeout=5,
        **options,
    )
    conn.connect()
    return conn


@pytest.fixture
def connection(broker: Any) -> Iterator[amqp.Connection]:
    conn = connect(broker.port, confirm_publish=True)
    yield conn
    conn.close()


@pytest.mark.parametrize("login_method", [None, "AMQPLAIN", "PLAIN"])
def test_login_succeeds_with_each_mechanism(broker: Any, login_method: str | None) -> None:
    conn = connect(broker.port, login_method=login_method)
    try:
        assert conn.connected
        assert conn.server_properties["product"] == "Postroom"
        assert set(conn.mechanisms) == {b"PLAIN", b"AMQPLAIN"}
    finally:
        conn.close()


@pytest.mark.parametrize("login_method", ["AMQPLAIN", "PLAIN"])
def test_wrong_password_is_refused_with_403(broker: Any, login_method: str) -> None:
    conn = amqp.Connection(
        host=f"127.0.0.1:{broker.port}",
        userid="guest",
        password="wrong",
        login_method=login_method,
        connect_timeout=5,
        read_timeout=5,
        write_timeout=5,
    )

    try:
        with pytest.raises(amqp.exceptions.AccessRefused) as excinfo:
            conn.connect()
    finally:
        conn.collect()

    assert excinfo.value.reply_code == 403
    assert f"mechanism {login_method}" in excinfo.value.reply_text


def test_publish_then_basic_get(connection: amqp.Connection) -> None:
    channel = connection.channel()
    channel.queue_declare("py-amqp", durable=False, auto_delete=False)

    channel.basic_publish(  # confirm_publish: returns once the broker has acked
        amqp.Message(b"payload", content_type="text/plain", application_headers={"n": 1}, priority=4),
        exchange="",
        routing_key="py-amqp",
    )
    message = channel.basic_get("py-amqp", no_ack=False)
    channel.basic_ack(message.delivery_tag)

    assert message.body == b"payload"
    assert (message.content_type, message.application_headers, message.priority) == ("text/plain", {"n": 1}, 4)
    assert (message.delivery_info["routing_key"], message.delivery_info["redelivered"]) == ("py-amqp", False)
    assert message.delivery_info["message_count"] == 0
    assert channel.basic_get("py-amqp") is None

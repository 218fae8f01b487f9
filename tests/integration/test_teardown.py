"""Connections end without leaving anything behind; the broker starts and stops as operators expect."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import amqp
import pika
import pytest

from postroom.broker.tools.testing import free_port, wait_for_port
from tests.conftest import Broker, broker_sockets

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def wait_until_no_sockets(port: int, seconds: float = 10.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while broker_sockets({port}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return broker_sockets({port})


def test_py_amqp_closing_with_megabytes_of_deliveries_queued_releases_the_socket(broker: Broker) -> None:
    # Issue reproduction: 40 messages of 100 KB, consumed without a prefetch limit by py-amqp
    # (Celery's and kombu's client), then conn.close(): the socket stayed in CLOSE-WAIT for ever.
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as publisher:
        channel = publisher.channel()
        channel.queue_declare("big")
        for _ in range(40):
            channel.basic_publish("", "big", b"x" * 100_000)
    for _ in range(3):
        conn = amqp.Connection(f"127.0.0.1:{broker.port}")
        conn.connect()
        conn.channel().basic_consume("big", callback=lambda message: None)
        conn.close()
    assert wait_until_no_sockets(broker.port) == []
    assert broker.call(lambda: broker.node.vhosts["/"].queues["big"].message_count) == 40


SERVE = [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config"]
TWISTD = [
    sys.executable,
    "-c",
    "from twisted.scripts.twistd import run; run()",
    "-n",
    "--pidfile=",
    "postroom",
    "--config",
]


def serve(tmp_path: Path, port: int, command: list[str] = SERVE) -> subprocess.Popen[bytes]:
    config = tmp_path / "postroom.yaml"
    config.write_text(
        f'listen: {{amqp: "tcp:{port}:interface=127.0.0.1", metrics: false, management: false}}\n'
        f'storage: {{dir: "{tmp_path / "data"}"}}\n'
    )
    return subprocess.Popen([*command, str(config)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("command", [SERVE, TWISTD], ids=["serve", "twistd"])
def test_the_broker_exits_at_once_with_one_line_when_its_port_is_taken(
    tmp_path: Path, broker: Broker, command: list[str]
) -> None:
    process = serve(tmp_path, broker.port, command)  # the in-process broker holds the port
    output, _ = process.communicate(timeout=20)
    assert process.returncode == 1
    (line,) = [line for line in output.decode().splitlines() if "cannot listen" in line]
    assert f"cannot listen for amqp on tcp:{broker.port}:interface=127.0.0.1: [Errno 98] Address already in use" in line
    assert "Traceback" not in output.decode()


def test_sigterm_closes_every_connection_with_320_and_exits_0(tmp_path: Path) -> None:
    port = free_port()
    process = serve(tmp_path, port)
    try:
        wait_for_port(port, 20)
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = connection.channel()
        channel.queue_declare("kept", durable=True)
        channel.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
        process.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
            connection.process_data_events(time_limit=10)
            connection.process_data_events(time_limit=10)
        assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
            320,
            "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
        )
        output, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output.decode()[-2000:]
    assert "Traceback" not in output.decode()

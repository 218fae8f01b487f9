"""The real ``twistd postroom`` in a subprocess: serve, report the log's metrics, stop on SIGTERM gracefully."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

from postroom.broker.tools.testing import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline or process.poll() is not None:
            raise AssertionError(f"broker did not start: {log.read_text()[-3000:]}")
        time.sleep(0.05)


@contextmanager
def running(command: list[str], config: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as output:
        process = subprocess.Popen([*command, str(config)], cwd=ROOT, stdout=output, stderr=output)
    try:
        wait_for_port(port, process, log)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_twistd_serves_and_shuts_down_gracefully_on_sigterm(tmp_path: Path) -> None:
    amqp, metrics = free_port(), free_port()
    config = tmp_path / "postroom.yaml"
    config.write_text(
        f'listen: {{amqp: "tcp:{amqp}:interface=127.0.0.1", metrics: "tcp:{metrics}:interface=127.0.0.1",'
        " management: false}\n"
        f'storage: {{dir: "{tmp_path / "data"}", fsync: always}}\n'
    )
    log = tmp_path / "twistd.log"
    twistd = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
    command = [*twistd, "--nodaemon", "--pidfile=", f"--logfile={log}", "postroom", "--config"]
    with running(command, config, amqp, log) as process:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp, socket_timeout=5))
        channel = connection.channel()
        channel.queue_declare("jobs", durable=True)
        channel.confirm_delivery()
        for number in range(3):
            channel.basic_publish("", "jobs", b"job %d" % number, pika.BasicProperties(delivery_mode=2))
        method, _, body = channel.basic_get("jobs")
        channel.basic_ack(method.delivery_tag)
        held, _, _ = channel.basic_get("jobs")  # unacked at shutdown: it must come back
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert float(re.search(r"^postroom_wal_bytes (\S+)$", text, re.M).group(1)) > 0
        assert float(re.search(r"^postroom_wal_fsync_seconds_count (\S+)$", text, re.M).group(1)) >= 1
        assert re.search(r'^postroom_queue_messages_unacked\{queue="jobs",vhost="/"\} 1.0$', text, re.M)
        process.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
            connection.process_data_events(time_limit=10)
        assert excinfo.value.reply_code == 320
        # twistd stops the reactor (running every shutdown trigger), then ends itself with the
        # same signal so its parent sees why it exited.
        assert process.wait(30) == -signal.SIGTERM
    text = log.read_text()
    assert "shutting down" in text and "write-ahead log flushed and synced" in text
    serve = [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config"]
    with running(serve, config, amqp, tmp_path / "serve.log"):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp, socket_timeout=5))
        channel = connection.channel()
        bodies = []
        while (got := channel.basic_get("jobs", auto_ack=True))[0] is not None:
            bodies.append(got[2])
        connection.close()
    assert body == b"job 0" and sorted(bodies) == [b"job 1", b"job 2"]

"""Shovels between real brokers over loopback: Postroom to Postroom and RabbitMQ to Postroom
with each ack mode, and ``on-confirm`` through a SIGKILL of the destination, of the source
(Postroom or RabbitMQ) and of the broker the shovel runs in: every message arrives (a few may
arrive twice, and are counted), nothing is lost."""

from __future__ import annotations

import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
from pamqp import commands

from postroom.broker.tools.testing import (
    ConfirmedPublisher,
    free_port,
    kill_rabbitmq,
    publish_frames,
    rabbitmq_node,
    write_test_pki,
)
from tests.integration.test_crash import broker
from tests.integration.test_live_administration import api as management

#: Brokers filled, then moved (with kills and restarts): minutes on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

#: Messages the kill tests move.
COUNT = 20_000


def data_in(tmp_path: Path, name: str) -> Path:
    """A broker's data folder, in a folder of its own (where its log goes too)."""
    (tmp_path / name).mkdir(exist_ok=True)
    return tmp_path / name / "data"


def wait_for(check: Callable[[], Any], seconds: float) -> bool:
    """Poll ``check`` until it is true (a broker that is not back yet counts as false)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except (pika.exceptions.AMQPError, OSError, IndexError):
            pass
        time.sleep(0.1)
    return False


def api(http: int, path: str, method: str = "GET", body: Any = None) -> Any:
    """A management API request as guest that must succeed: its answer."""
    status, answer = management(http, path, method, body, user="guest:guest")
    assert status < 400, (path, status, answer)
    return answer


def fill(port: int, queue: str, count: int, start: int = 0) -> None:
    """``count`` persistent messages in ``queue`` (declared durable), each carrying its number
    in its body and its header ``n``, confirmed up to a thousand at a time."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    ConfirmedPublisher(port).publish(
        publish_frames(1, "", queue, b"%d" % number, commands.Basic.Properties(delivery_mode=2, headers={"n": number}))
        for number in range(start, start + count)
    )


def drain(port: int, queue: str) -> list[int]:
    """Every message in ``queue`` (taken), as the numbers they carry."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    numbers: list[int] = []
    count = channel.queue_declare(queue, durable=True, passive=True).method.message_count
    for _method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=10) if count else ():
        assert body is not None, f"{len(numbers)} of {count} messages came"
        # The headers came across as they were (one delivered again carries the source's
        # x-delivery-count, as a redelivery from a Postroom queue does).
        assert {k: v for k, v in properties.headers.items() if k != "x-delivery-count"} == {"n": int(body)}
        numbers.append(int(body))
        if len(numbers) == count:
            break
    channel.cancel()
    connection.close()
    return numbers


def depth(port: int, queue: str) -> int:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return int(connection.channel().queue_declare(queue, durable=True).method.message_count)
    finally:
        connection.close()


def shovel(http: int, name: str, src: int, dest: int, **keys: Any) -> None:
    value = {
        "src-uri": f"amqp://guest:guest@127.0.0.1:{src}",
        "src-queue": "from",
        "dest-uri": f"amqp://guest:guest@127.0.0.1:{dest}",
        "dest-queue": "to",
        "reconnect-delay": 1,
        **keys,
    }
    api(http, f"parameters/shovel/%2F/{name}", "PUT", {"value": value})


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """Two Postroom brokers, each with its management API: ``((amqp, http), (amqp, http))``."""
    http_a, http_b = free_port(), free_port()
    with broker(data_in(tmp_path, "a"), management=http_a) as (_a, port_a):
        with broker(data_in(tmp_path, "b"), management=http_b) as (_b, port_b):
            yield (port_a, http_a), (port_b, http_b)
    for folder in ("a", "b"):
        assert "Traceback" not in (tmp_path / folder / "broker.log").read_text()


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_a_shovel_moves_every_message_between_two_postroom_brokers(
    two: tuple[tuple[int, int], tuple[int, int]], ack_mode: str
) -> None:
    (port_a, http_a), (port_b, _http_b) = two
    fill(port_a, "from", 2000)
    shovel(http_a, "move", port_a, port_b, **{"ack-mode": ack_mode, "src-prefetch-count": 100})
    assert wait_for(lambda: depth(port_b, "to") == 2000, 30), depth(port_b, "to")
    assert wait_for(lambda: depth(port_a, "from") == 0, 10)
    (status,) = api(http_a, "shovels")
    assert status["state"] == "running" and status["src_queue"] == "from" and status["dest_queue"] == "to"
    assert drain(port_b, "to") == list(range(2000))  # in order, each once
    assert "postroom-shovel" not in {user["name"] for user in api(http_a, "users")}


def scraped(metrics: int, name: str) -> float:
    """The value of one sample on ``/metrics``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def settled(port: int, queue: str, at_least: int) -> bool:
    """Whether ``queue`` holds ``at_least`` messages and no more arrive (the shovel is done)."""
    first = depth(port, queue)
    if first < at_least:
        return False
    time.sleep(0.5)
    return depth(port, queue) == first


def test_on_confirm_loses_nothing_when_the_destination_is_killed(tmp_path: Path) -> None:
    http_a, metrics_a, port_b = free_port(), free_port(), free_port()
    data_b = data_in(tmp_path, "b")
    with broker(data_in(tmp_path, "a"), management=http_a, metrics=metrics_a) as (_a, port_a):
        fill(port_a, "from", COUNT)
        with broker(data_b, port=port_b) as (process_b, _port):
            shovel(http_a, "move", port_a, port_b, **{"src-prefetch-count": 500})
            assert wait_for(lambda: depth(port_b, "to") > COUNT // 5, 30)
            process_b.send_signal(signal.SIGKILL)  # mid-run, with publishes unconfirmed
            process_b.wait(10)
        with broker(data_b, port=port_b):  # back on its port: the shovel reconnects by itself
            assert wait_for(lambda: depth(port_a, "from") == 0 and settled(port_b, "to", COUNT), 60)
            assert api(http_a, "shovels")[0]["state"] == "running"
            numbers = drain(port_b, "to")
            again = scraped(metrics_a, "postroom_shovel_redelivered_total")
            assert scraped(metrics_a, "postroom_shovel_restarts_total") >= 1
    assert set(numbers) == set(range(COUNT)), f"lost: {sorted(set(range(COUNT)) - set(numbers))[:10]}"
    assert len(numbers) - COUNT <= again  # each duplicate was a message got again, and counted
    for folder in ("a", "b"):
        assert "Traceback" not in (tmp_path / folder / "broker.log").read_text()


def test_on_confirm_loses_nothing_when_the_source_is_killed(tmp_path: Path) -> None:
    """The shovel runs in a third broker, so the source dies under it and comes back."""
    http_c, port_a = free_port(), free_port()
    data_a = data_in(tmp_path, "a")
    with broker(data_in(tmp_path, "b")) as (_b, port_b), broker(data_in(tmp_path, "c"), management=http_c):
        with broker(data_a, port=port_a) as (process_a, _port):
            fill(port_a, "from", COUNT)
            shovel(http_c, "move", port_a, port_b, **{"src-prefetch-count": 500})
            assert wait_for(lambda: depth(port_b, "to") > COUNT // 5, 30)
            process_a.send_signal(signal.SIGKILL)
            process_a.wait(10)
        with broker(data_a, port=port_a):  # back on its port: the shovel reconnects by itself
            assert wait_for(lambda: depth(port_a, "from") == 0 and settled(port_b, "to", COUNT), 60)
            numbers = drain(port_b, "to")
    assert set(numbers) == set(range(COUNT)), f"lost: {sorted(set(range(COUNT)) - set(numbers))[:10]}"
    for folder in ("a", "b", "c"):
        assert "Traceback" not in (tmp_path / folder / "broker.log").read_text()


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_a_shovel_moves_a_rabbitmq_queue_into_postroom(tmp_path: Path, ack_mode: str) -> None:
    http = free_port()
    with rabbitmq_node() as (rabbit, _pid), broker(tmp_path / "data", management=http) as (_p, port):
        fill(rabbit, "from", 1000)
        value = {
            "src-uri": f"amqp://guest:guest@127.0.0.1:{rabbit}", "src-queue": "from",
            "dest-uri": "amqp://", "dest-queue": "to", "ack-mode": ack_mode,
        }  # fmt: skip
        api(http, "parameters/shovel/%2F/in", "PUT", {"value": value})
        assert wait_for(lambda: depth(port, "to") == 1000, 30)
        assert wait_for(lambda: depth(rabbit, "from") == 0, 10)
        assert drain(port, "to") == list(range(1000))
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def shovel_in(http: int, rabbit: int) -> None:
    """A shovel in the Postroom of management port ``http`` taking RabbitMQ's queue ``from``
    into its own ``to`` (``on-confirm``, 500 in flight)."""
    value = {
        "src-uri": f"amqp://guest:guest@127.0.0.1:{rabbit}", "src-queue": "from", "src-prefetch-count": 500,
        "dest-uri": "amqp://", "dest-queue": "to", "reconnect-delay": 1,
    }  # fmt: skip
    api(http, "parameters/shovel/%2F/in", "PUT", {"value": value})


def test_on_confirm_loses_nothing_when_rabbitmq_the_source_is_killed(tmp_path: Path) -> None:
    http = free_port()
    with rabbitmq_node() as (rabbit, _pid), broker(tmp_path / "data", management=http) as (_p, port):
        fill(rabbit, "from", COUNT)
        shovel_in(http, rabbit)
        assert wait_for(lambda: depth(port, "to") > COUNT // 5, 30)
        kill_rabbitmq(rabbit)  # its whole VM, mid-run; started again from its files
        assert wait_for(lambda: depth(rabbit, "from") == 0 and settled(port, "to", COUNT), 120)
        numbers = drain(port, "to")
    assert set(numbers) == set(range(COUNT)), f"lost: {sorted(set(range(COUNT)) - set(numbers))[:10]}"
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_on_confirm_loses_nothing_when_the_broker_running_the_shovel_is_killed(tmp_path: Path) -> None:
    """RabbitMQ into Postroom, the shovel in Postroom: killed with it, it starts again with it
    (its definition is in the log), and what it had not acknowledged RabbitMQ delivers again."""
    port, http = free_port(), free_port()
    with rabbitmq_node() as (rabbit, _pid):
        fill(rabbit, "from", COUNT)
        with broker(tmp_path / "data", port=port, management=http) as (process, _port):
            shovel_in(http, rabbit)
            assert wait_for(lambda: depth(port, "to") > COUNT // 5, 30)
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        with broker(tmp_path / "data", port=port, management=http):
            assert wait_for(lambda: depth(rabbit, "from") == 0 and settled(port, "to", COUNT), 60)
            assert api(http, "shovels")[0]["state"] == "running"
            numbers = drain(port, "to")
    assert set(numbers) == set(range(COUNT)), f"lost: {sorted(set(range(COUNT)) - set(numbers))[:10]}"
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_a_shovel_publishes_over_tls_checking_the_brokers_certificate(tmp_path: Path) -> None:
    files = write_test_pki(tmp_path)
    http_a, amqps = free_port(), free_port()
    tls = f'tls: {{certificate: "{files["server.crt"]}", key: "{files["server.key"]}", ca: ["{files["client-ca"]}"]}}\n'
    with broker(data_in(tmp_path, "a"), management=http_a) as (_a, port_a):
        with broker(data_in(tmp_path, "b"), amqps=amqps, extra=tls) as (_b, port_b):
            fill(port_a, "from", 500)
            checked = (
                f"?cacertfile={quote(str(files['server-ca']))}&verify=verify_peer&server_name_indication=localhost"
            )
            value = {
                "src-uri": "amqp://", "src-queue": "from", "dest-queue": "to",
                "dest-uri": f"amqps://guest:guest@127.0.0.1:{amqps}/%2F{checked}",
            }  # fmt: skip
            api(http_a, "parameters/shovel/%2F/tls", "PUT", {"value": value})
            assert wait_for(lambda: depth(port_b, "to") == 500, 30)
            (status,) = api(http_a, "shovels")
            assert status["dest_uri"] == f"amqps://127.0.0.1:{amqps}/%2F"  # (no credentials, no query)
            # A certificate the given CA did not sign is refused: the shovel does not run.
            value["dest-uri"] = (
                f"amqps://guest:guest@127.0.0.1:{amqps}/%2F?cacertfile={quote(str(files['client-ca']))}&verify=verify_peer"
            )
            api(http_a, "parameters/shovel/%2F/tls", "PUT", {"value": value})
            time.sleep(2)
            assert api(http_a, "shovels")[0]["state"] == "starting"
    assert "certificate verify failed" in (tmp_path / "a" / "broker.log").read_text()
    for folder in ("a", "b"):
        assert "Traceback" not in (tmp_path / folder / "broker.log").read_text()


class Cutter:
    """A TCP proxy on loopback whose connections can all be cut at once (the network failing
    between a shovel and a broker); it goes on accepting new ones."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _address = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            cut, self.sockets = self.sockets, []
        for end in cut:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def close(self) -> None:
        self.server.close()
        self.cut()


def test_on_confirm_loses_nothing_when_the_network_is_cut_under_the_shovel(
    two: tuple[tuple[int, int], tuple[int, int]],
) -> None:
    (port_a, http_a), (port_b, _http_b) = two
    fill(port_a, "from", COUNT)
    to_source, to_dest = Cutter(port_a), Cutter(port_b)
    try:
        shovel(http_a, "move", to_source.port, to_dest.port, **{"src-prefetch-count": 500})
        for cutter, depth_at_cut in ((to_dest, COUNT // 5), (to_source, COUNT // 2)):
            assert wait_for(lambda depth_at_cut=depth_at_cut: depth(port_b, "to") > depth_at_cut, 60)
            cutter.cut()  # both ways, mid-run: the shovel starts over through the proxy
        assert wait_for(lambda: depth(port_a, "from") == 0 and settled(port_b, "to", COUNT), 120)
        assert api(http_a, "shovels?counters=true")[0]["restarts"] >= 2
        numbers = drain(port_b, "to")
    finally:
        to_source.close()
        to_dest.close()
    assert set(numbers) == set(range(COUNT)), f"lost: {sorted(set(range(COUNT)) - set(numbers))[:10]}"

"""``postroom migrate`` into a two-node RabbitMQ cluster started here on loopback (two nodes of
the installed ``rabbitmq-server``, joined with ``join_cluster``): a populated broker (100,000
orders, a priority queue, dead letters with their history, messages with a TTL) moved to
quorum queues with every message as it was, through a migration killed midway and run again;
``--follow`` under a running producer; one node stopped during a move, the shovels going on
through the other."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from postroom.broker.clients.client import connect
from postroom.broker.tools.testing import free_port, rabbitmq_cluster, rabbitmqctl
from tests.integration.test_crash import ROOT, broker
from tests.integration.test_migrate import consumed, contents, guest, moved_orders, moved_to, populate

#: A cluster's start, a populated broker and its move take minutes on two cores.
pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

#: Messages moved while a node stops.
MOVING = 60_000
#: Orders in the populated broker.
ORDERS = 100_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[tuple[int, int]]]:
    with rabbitmq_cluster(2) as nodes:
        yield nodes


def migrate_command(http: int, nodes: list[tuple[int, int]], *extra: str) -> list[str]:
    targets = [arg for port, _http in nodes for arg in ("--to", f"amqp://guest:guest@127.0.0.1:{port}/")]
    return [
        sys.executable, "-m", "postroom.broker.tools.cli", "migrate", "--url", f"http://guest:guest@127.0.0.1:{http}/",
        *targets, "--to-api", f"http://guest:guest@127.0.0.1:{nodes[0][1]}/", *extra,
    ]  # fmt: skip


def migrate(http: int, nodes: list[tuple[int, int]], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(migrate_command(http, nodes, *extra), cwd=ROOT, capture_output=True, text=True, timeout=600)


def migrate_in_background(http: int, nodes: list[tuple[int, int]], *extra: str) -> subprocess.Popen[str]:
    command = migrate_command(http, nodes, *extra)
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)


def test_the_cluster_is_one_cluster(cluster: list[tuple[int, int]]) -> None:
    names = {node["name"] for node in guest(cluster[1][1], "nodes")}
    assert names == {f"postroom{port}@localhost" for port, _http in cluster}


def test_a_populated_broker_moves_into_quorum_queues_on_the_cluster_through_a_killed_migration(
    cluster: list[tuple[int, int]], tmp_path: Path
) -> None:
    http = free_port()
    with broker(tmp_path / "data", management=http) as (_process, port):
        populated = time.monotonic()
        populate(port, ORDERS)
        before = {queue: contents(http, queue, "peek") for queue in ("prio", "orders.dead")}
        first = migrate_in_background(http, cluster, "--queue-type", "quorum")
        deadline = time.monotonic() + 120
        while guest(http, "queues/%2F/orders")["messages"] > ORDERS // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # the migration is killed midway (its shovels go on)
        first.wait(10)
        done = migrate(http, cluster, "--queue-type", "quorum")  # and run again: it resumes
        assert done.returncode == 0, done.stderr
        api = cluster[1][1]  # (the other node answers for the whole cluster)
        queues = {q["name"]: q for q in guest(api, "queues/%2F")}
        assert queues["orders"]["type"] == "quorum" and len(queues["orders"]["members"]) == 2
        assert queues["orders"]["arguments"]["x-delivery-limit"] == 5
        moved_orders(consumed(cluster[1][0], "orders"), range(20, ORDERS), populated)
        for queue in ("prio", "orders.dead"):
            assert moved_to(api, queue) == before[queue], queue
        for queue in ("orders", "prio", "orders.dead"):
            guest(api, f"queues/%2F/{queue}", "DELETE")
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def publish_until(port: int, queue: str, stop: threading.Event, sent: list[int]) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.confirm_delivery()
    number = 0
    while not stop.is_set():
        channel.basic_publish("", queue, b"%d" % number, pika.BasicProperties(delivery_mode=2))
        sent.append(number)
        number += 1
        time.sleep(0.001)
    connection.close()


def numbers(port: int, queue: str) -> list[int]:
    return [int(body) for _properties, body in consumed(port, queue)]


def test_follow_moves_what_a_running_producer_keeps_publishing(cluster: list[tuple[int, int]], tmp_path: Path) -> None:
    http = free_port()
    with broker(tmp_path / "data", management=http) as (_process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        connection.channel().queue_declare("live", durable=True)
        connection.close()
        stop, sent = threading.Event(), []
        producer = threading.Thread(target=publish_until, args=(port, "live", stop, sent), daemon=True)
        producer.start()
        time.sleep(1)
        follower = subprocess.Popen(
            [
                sys.executable, "-m", "postroom.broker.tools.cli", "migrate", "--url", f"http://guest:guest@127.0.0.1:{http}/",
                "--to", f"amqp://guest:guest@127.0.0.1:{cluster[0][0]}/",
                "--to-api", f"http://guest:guest@127.0.0.1:{cluster[0][1]}/", "--queue-type", "quorum", "--follow",
            ],
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3)  # the producer goes on publishing to Postroom while the shovel moves
        stop.set()
        producer.join(10)
        _out, said = follower.communicate(timeout=120)
        assert follower.returncode == 0, said
        assert "the shovels keep running" in said
        deadline = time.monotonic() + 30
        while guest(http, "queues/%2F/live")["messages"] and time.monotonic() < deadline:
            time.sleep(0.1)
        moved = numbers(cluster[1][0], "live")
        assert moved == sent and len(sent) > 100  # all of it, in order, once
        (shovel,) = guest(http, "shovels")
        assert shovel["name"] == "migrate-live" and shovel["state"] == "running"  # (--follow: no end)
        guest(http, "shovels/vhost/%2F/migrate-live", "DELETE")
        guest(cluster[0][1], "queues/%2F/live", "DELETE")
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_a_node_stopped_during_the_move_the_shovels_go_on_through_the_other(
    cluster: list[tuple[int, int]], tmp_path: Path
) -> None:
    """The queues are classic, on the first node; the shovels start through the second, which
    is stopped mid-move: they reconnect to the first and finish."""
    http = free_port()
    (first, first_api), (second, _second_api) = cluster
    with broker(tmp_path / "data", management=http) as (_process, port):
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/") as client:
            client.declare_queue("moving", durable=True)
            client.publish_batch((("", "moving", b"%d" % number) for number in range(MOVING)), window=1000)
        guest(first_api, "queues/%2F/moving", "PUT", {"durable": True, "arguments": {}})  # (on the first node)
        # (no path: vhost "/"; as in RabbitMQ, a URI ending in "/" names the vhost "")
        targets = [f"amqp://guest:guest@127.0.0.1:{second}", f"amqp://guest:guest@127.0.0.1:{first}"]
        value = {
            "src-uri": "amqp://", "src-queue": "moving", "dest-uri": targets, "dest-queue": "moving",
            "src-delete-after": "queue-length", "src-prefetch-count": 200, "reconnect-delay": 1,
        }  # fmt: skip
        guest(http, "parameters/shovel/%2F/moving", "PUT", {"value": value})
        # A shovel picks one of its URIs at random: until it went through the second node,
        # it is started again.
        through_second = f"amqp://127.0.0.1:{second}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            shown = guest(http, "shovels")
            if shown and shown[0]["state"] == "running":
                if shown[0]["dest_uri"] == through_second:
                    break
                guest(http, "shovels/vhost/%2F/moving/restart", "DELETE")
            time.sleep(0.1)
        assert guest(http, "shovels")[0]["dest_uri"] == through_second
        while guest(http, "queues/%2F/moving")["messages"] > MOVING - 5_000 and time.monotonic() < deadline:
            time.sleep(0.02)
        rabbitmqctl(second, "stop_app")  # mid-move
        try:
            deadline = time.monotonic() + 120
            while guest(http, "shovels") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert guest(http, "shovels") == [], "the shovel did not finish through the first node"
        finally:
            rabbitmqctl(second, "start_app")
        moved = numbers(first, "moving")
        assert sorted(set(moved)) == list(range(MOVING))  # nothing lost (a few may come twice)
        guest(first_api, "queues/%2F/moving", "DELETE")
    log = (tmp_path / "broker.log").read_text()
    assert "shovel 'moving' in vhost '/': " in log  # it lost the second node mid-move, and went on
    assert "Traceback" not in log

"""Three Postroom nodes on one etcd, as processes on loopback: what a confirm promises when a
leader dies, is paused past its lease, or is left without followers.

The clients are stock pika connections given every node's address: a follower forwards them to
the leader, and after a failover they reconnect to whichever node answers.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands

from postroom.broker.tools.cluster_lab import (
    ETCD_PROCESSES,
    Consumer,
    EtcdMissing,
    Lab,
    Publisher,
    check,
    etcd_members,
)
from postroom.broker.tools.cluster_lab import connect as cluster_connect
from postroom.broker.tools.commands.clustering import etcd_call
from postroom.broker.tools.testing import ConfirmedPublisher, publish_frames

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    try:
        with etcd_members(1, tmp_path_factory.mktemp("etcd")) as urls:
            yield urls
    except EtcdMissing as missing:
        pytest.skip(str(missing))


_prefixes = iter(range(1_000_000))


@pytest.fixture
def lab(etcd: list[str], tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(
        tmp_path,
        etcd,
        settings="in_sync_timeout: 1s\nconfirm_timeout: 2s",
        prefix=f"test{next(_prefixes)}-{time.monotonic_ns()}",
    )
    lab.start_all()
    try:
        yield lab
    finally:
        lab.stop_all()
    assert lab.tracebacks() == [], lab.logs()


def connect(lab: Lab) -> pika.BlockingConnection:
    return cluster_connect(lab.amqp_ports())


def drain(lab: Lab, queue: str, expected: int, seconds: float = 30) -> list[int]:
    """Every message in ``queue``, in the order delivered (at least ``expected`` of them)."""
    connection = connect(lab)
    channel = connection.channel()
    got: list[int] = []
    deadline = time.monotonic() + seconds
    for method, _properties, body in channel.consume(queue, inactivity_timeout=1.0):
        if method is None:
            if len(got) >= expected or time.monotonic() > deadline:
                break
            continue
        got.append(int(body))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    connection.close()
    return got


def wait_until(condition: Callable[[], bool], seconds: float, why: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def test_every_confirmed_message_survives_the_leader_killed(lab: Lab) -> None:
    first = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    ports = lab.amqp_ports()
    publishers = [Publisher(ports, "jobs", tag) for tag in ("p", "q")]
    consumer = Consumer(ports, "jobs")
    for thread in (*publishers, consumer):
        thread.start()
    wait_until(lambda: all(len(p.confirmed) >= 200 for p in publishers), 30, "publishing did not start")
    killed_at = time.monotonic()
    lab.signal(first, signal.SIGKILL)
    second = lab.wait_for_leader(other_than=first)
    before = [len(p.confirmed) for p in publishers]
    wait_until(
        lambda: all(len(p.confirmed) >= count + 200 for p, count in zip(publishers, before, strict=True)),
        30,
        f"publishing did not resume: {[p.failures[-3:] for p in publishers]} {lab.logs()}",
    )
    for publisher in publishers:
        publisher.stop.set()
        publisher.join(30)
    confirmed = {f"{p.tag}:{n}".encode() for p in publishers for n in p.confirmed}
    wait_until(lambda: confirmed <= set(consumer.delivered), 30, "not everything confirmed was delivered")
    consumer.stop.set()
    consumer.join(30)

    verdict = check(publishers, [consumer.delivered])
    assert verdict.ok, f"lost {verdict.lost[:20]} phantoms {verdict.phantoms[:20]}; leader {first} -> {second}"
    assert verdict.reordered == 0
    after = min(
        confirmed
        for p in publishers
        for confirmed, published in zip(p.confirmed_at, p.published_at, strict=True)
        if published > killed_at
    )
    # The first confirm on the new leader: a lease (2 s) and an election, with room for a loaded machine.
    assert after - killed_at < 10, after - killed_at


def more_confirmed(publisher: Publisher, count: int) -> None:
    """Wait until ``publisher`` has ``count`` more confirms."""
    target = len(publisher.confirmed) + count
    wait_until(lambda: len(publisher.confirmed) >= target, 30, f"publishing stalled: {publisher.failures[-3:]}")


def test_a_rolling_restart_of_every_node_loses_nothing(lab: Lab) -> None:
    lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    ports = lab.amqp_ports()
    publisher = Publisher(ports, "rolling")
    consumer = Consumer(ports, "rolling")
    publisher.start()
    consumer.start()
    for name in lab.nodes:  # followers and the leader alike, one at a time
        more_confirmed(publisher, 100)
        lab.signal(name, signal.SIGTERM)
        assert lab.nodes[name].process is not None and lab.nodes[name].process.returncode == 0, lab.log(name)
        lab.start(name)
        lab.wait_for_leader()
        lab.wait_in_sync(set(lab.nodes))
    more_confirmed(publisher, 100)
    publisher.stop.set()
    publisher.join(30)
    confirmed = {f"p:{n}".encode() for n in publisher.confirmed}
    wait_until(lambda: confirmed <= set(consumer.delivered), 30, "not everything confirmed was delivered")
    consumer.stop.set()
    consumer.join(30)
    verdict = check([publisher], [consumer.delivered])
    assert verdict.ok, (verdict.lost[:20], verdict.phantoms[:20])


def publish_confirmed(lab: Lab, queue: str, numbers: range) -> None:
    """Publish ``numbers`` to the durable ``queue``, each confirmed, through any node."""
    connection = connect(lab)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for number in numbers:
        channel.basic_publish("", queue, str(number).encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()


def test_a_restarted_node_catches_up_and_rejoins_the_in_sync_set(lab: Lab) -> None:
    first = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    publish_confirmed(lab, "jobs", range(200))
    lab.signal(first, signal.SIGKILL)
    second = lab.wait_for_leader(other_than=first)
    lab.wait_in_sync(set(lab.nodes) - {first})
    publish_confirmed(lab, "jobs", range(200, 400))

    lab.start(first)
    lab.wait_in_sync(set(lab.nodes))
    # A follower in the set holds the leader's files byte for byte once it has the last batch.
    deadline = time.monotonic() + 10
    while lab.files(first) != lab.files(second):
        assert time.monotonic() < deadline, (sorted(lab.files(first)), sorted(lab.files(second)))
        time.sleep(0.1)
    assert "follows" in lab.log(first)
    assert drain(lab, "jobs", 400) == list(range(400))


class TimedPublisher(ConfirmedPublisher):
    """Keeps when each ack came, and counts nacks instead of failing on them."""

    def __init__(self, port: int) -> None:
        super().__init__(port, window=100, timeout=60)
        self.acks: list[float] = []
        self.nacks = 0

    def _heard(self, value: object) -> None:
        if isinstance(value, commands.Basic.Ack):
            now = time.monotonic()
            count = value.delivery_tag - self.confirmed if value.multiple else 1
            self.acks.extend([now] * count)
            self.confirmed = value.delivery_tag if value.multiple else self.confirmed + 1
        elif isinstance(value, commands.Basic.Nack):
            self.nacks += 1
            self.confirmed = value.delivery_tag if value.multiple else self.confirmed + 1


def test_a_leader_paused_past_its_lease_sends_no_confirm_when_it_resumes(lab: Lab) -> None:
    first = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    publisher = TimedPublisher(lab.nodes[first].amqp)
    stop = threading.Event()
    properties = commands.Basic.Properties(delivery_mode=2)

    def messages() -> Iterator[bytes]:
        number = 0
        while not stop.is_set():
            yield publish_frames(1, "", "paused", str(number).encode(), properties)
            number += 1

    def publish() -> None:
        try:
            publisher.publish(messages())
        except (OSError, EOFError, TimeoutError):
            pass  # the paused leader closes its connections once it resumes

    connection = connect(lab)
    connection.channel().queue_declare("paused", durable=True)
    connection.close()
    deliveries: list[tuple[float, int]] = []

    def consume() -> None:
        try:
            consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[first].amqp))
            channel = consumer.channel()
            channel.basic_qos(prefetch_count=50)
            for method, _properties, _body in channel.consume("paused", inactivity_timeout=0.2):  # noqa: B007
                if stop.is_set():
                    break
                if method is not None:
                    deliveries.append((time.monotonic(), int(_body)))
                    channel.basic_ack(method.delivery_tag)
        except (pika.exceptions.AMQPError, OSError):
            pass  # closed by the paused leader once it resumes

    consuming = threading.Thread(target=consume, daemon=True)
    consuming.start()
    sending = threading.Thread(target=publish, daemon=True)
    sending.start()
    while len(publisher.acks) < 200:
        time.sleep(0.01)
    sent_before = publisher.sent  # what was published later, the paused node reads on resuming
    lab.signal(first, signal.SIGSTOP)
    second = lab.wait_for_leader(other_than=first)
    time.sleep(1.0)  # publishes wait in the paused node's socket buffer
    resumed_at = time.monotonic()
    lab.signal(first, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while "follows" not in lab.log(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    sending.join(30)
    consuming.join(30)
    assert deliveries and publisher.acks
    late = [round(at - resumed_at, 3) for at in publisher.acks if at > resumed_at]
    assert late == [], f"{len(late)} confirms after the paused leader resumed; new leader {second}"
    # Nothing it read after resuming reaches a consumer. (Deliveries it had written to its
    # sockets' buffers before the pause may still go out as it resumes: they were decided then.)
    late = [number for at, number in deliveries if at > resumed_at and number >= sent_before]
    assert late == [], f"{len(late)} deliveries of what the paused leader read after resuming; new leader {second}"
    assert "ran out" in lab.log(first) or "stepping down" in lab.log(first), lab.log(first)
    assert "follows" in lab.log(first)


def test_without_a_follower_in_sync_confirms_are_refused_then_resume(lab: Lab) -> None:
    first = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    followers = [name for name in lab.nodes if name != first]
    for name in followers:
        lab.signal(name, signal.SIGKILL)
    lab.wait_in_sync({first})
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[first].amqp))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("alone", durable=True)
    started = time.monotonic()
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "alone", b"one copy", pika.BasicProperties(delivery_mode=2))
    # Held for confirm_timeout (2 s), then refused.
    assert 1.5 < time.monotonic() - started < 10
    lab.start(followers[0])
    lab.wait_in_sync({first, followers[0]})
    channel.basic_publish("", "alone", b"two copies", pika.BasicProperties(delivery_mode=2))
    connection.close()


def test_a_follower_forwards_clients_to_the_leader(lab: Lab) -> None:
    first = lab.wait_for_leader()
    follower = next(name for name in lab.nodes if name != first)
    lab.wait_listening(follower)
    through = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[follower].amqp))
    channel = through.channel()
    channel.confirm_delivery()
    channel.queue_declare("via-follower")
    channel.basic_publish("", "via-follower", b"hello")
    # What went in through the follower is on the leader: read it there directly.
    direct = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[first].amqp))
    _method, _properties, body = direct.channel().basic_get("via-follower", auto_ack=True)
    assert body == b"hello"
    direct.close()
    through.close()


def api(port: int, path: str) -> object:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def postroom(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *arguments], capture_output=True, text=True, timeout=60
    )


def test_every_node_answers_for_the_whole_cluster(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    follower = next(name for name in lab.nodes if name != leader)
    lab.wait_listening(follower)
    # The follower forwards its management listener to the leader's, which lists every node.
    deadline = time.monotonic() + 10
    while True:
        nodes = api(lab.nodes[follower].management, "nodes")
        assert isinstance(nodes, list)
        if all(node["postroom_cluster"]["in_sync"] for node in nodes) and len(nodes) == 3:
            break
        assert time.monotonic() < deadline, nodes
        time.sleep(0.2)
    roles = {node["name"]: node["postroom_cluster"]["role"] for node in nodes}
    assert roles == {f"postroom@{name}": "leader" if name == leader else "follower" for name in lab.nodes}
    mine = next(node for node in nodes if node["name"] == f"postroom@{leader}")
    assert mine["running"] and "mem_used" in mine and "exchange_types" in mine
    for node in nodes:
        if node["name"] != f"postroom@{leader}":
            assert node["postroom_cluster"]["state"] == "streaming"
            assert node["postroom_cluster"]["lag_batches"] >= 0
    assert api(lab.nodes[leader].management, f"nodes/postroom@{follower}")["running"]  # type: ignore[index]

    with urllib.request.urlopen(f"http://127.0.0.1:{lab.nodes[leader].metrics}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    assert "postroom_cluster_in_sync_copies 3.0" in metrics
    assert "postroom_cluster_leader_elections_total 1.0" in metrics
    for name in lab.nodes:
        if name != leader:
            assert f'postroom_cluster_follower_lag_batches{{follower="{name}"}}' in metrics

    shown = postroom("cluster", "status", "--config", str(lab.nodes[follower].config), "--json")
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert (state["leader"], state["in_sync"], sorted(state["nodes"])) == (leader, sorted(lab.nodes), sorted(lab.nodes))
    text = postroom("cluster", "status", "--config", str(lab.nodes[follower].config)).stdout
    assert f"leader: {leader}" in text
    refused = postroom("cluster", "forget", follower, "--config", str(lab.nodes[leader].config))
    assert refused.returncode == 1 and "is running" in refused.stderr
    lab.signal(follower, signal.SIGKILL)
    wait_until(lambda: follower not in lab.in_sync() and lab.leader() == leader, 15, "the leader kept it")
    config = str(lab.nodes[leader].config)
    wait_until(
        lambda: follower not in json.loads(postroom("cluster", "status", "--config", config, "--json").stdout)["nodes"],
        15,
        "its key outlived its lease",
    )
    # Its key in the set, as a cluster stopped whole would have left it: forget takes it out.
    key = base64.b64encode(f"{lab.prefix}/isr/{follower}".encode()).decode()
    etcd_call(lab.urls, "kv/put", {"key": key, "value": base64.b64encode(b"1").decode()})
    assert follower in lab.in_sync()
    forgotten = postroom("cluster", "forget", follower, "--config", config)
    assert forgotten.returncode == 0 and "out of the in-sync set" in forgotten.stdout, forgotten
    assert follower not in lab.in_sync()


def test_nodes_run_under_twistd_as_the_systemd_unit_runs_them(etcd: list[str], tmp_path: Path) -> None:
    lab = Lab(tmp_path, etcd, prefix=f"twistd-{time.monotonic_ns()}")
    for name in lab.nodes:
        lab.start(name, twistd=True)
    try:
        first = lab.wait_for_leader()
        lab.wait_in_sync(set(lab.nodes))
        publish_confirmed(lab, "jobs", range(1))
        lab.signal(first, signal.SIGTERM)  # systemctl stop: the lead passes on at once
        # twistd ends itself with the signal once its shutdown is done (see test_twistd.py).
        assert lab.nodes[first].process is not None and lab.nodes[first].process.returncode == -signal.SIGTERM
        assert "checkpoint written" in lab.log(first)
        lab.wait_for_leader(other_than=first)
        assert drain(lab, "jobs", 1) == [0]
    finally:
        lab.stop_all()
    assert lab.tracebacks() == [], lab.logs()


def test_a_slow_follower_leaves_the_in_sync_set_and_comes_back(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    slow = next(name for name in lab.nodes if name != leader)
    publisher = Publisher([lab.nodes[leader].amqp], "slow")  # not through the follower paused
    publisher.start()
    more_confirmed(publisher, 100)
    lab.signal(slow, signal.SIGSTOP)  # a disk that stalls, a VM that freezes
    lab.wait_in_sync(set(lab.nodes) - {slow}, 10)  # after in_sync_timeout (1 s)
    more_confirmed(publisher, 300)  # the other follower is enough for min_in_sync (2)
    lab.signal(slow, signal.SIGCONT)
    lab.wait_in_sync(set(lab.nodes), 30)
    more_confirmed(publisher, 100)
    publisher.stop.set()
    publisher.join(30)
    deadline = time.monotonic() + 10
    while lab.files(slow) != lab.files(leader):
        assert time.monotonic() < deadline, "the follower did not catch up"
        time.sleep(0.1)


@pytest.fixture
def three_etcd_members(tmp_path: Path) -> Iterator[list[str]]:
    (tmp_path / "etcd").mkdir()
    try:
        with etcd_members(3, tmp_path / "etcd") as urls:
            yield urls
    except EtcdMissing as missing:
        pytest.skip(str(missing))


def test_the_cluster_goes_on_when_an_etcd_member_is_lost(three_etcd_members: list[str], tmp_path: Path) -> None:
    urls = three_etcd_members
    lab = Lab(tmp_path, urls, prefix="three-etcd")
    lab.start_all()
    try:
        first = lab.wait_for_leader()
        lab.wait_in_sync(set(lab.nodes))
        publisher = Publisher(lab.amqp_ports(), "etcd")
        publisher.start()
        more_confirmed(publisher, 100)
        # The member each node reached first: the nodes go on through the two others.
        ETCD_PROCESSES[urls[0]].kill()
        more_confirmed(publisher, 200)
        lab.signal(first, signal.SIGKILL)  # and an election still happens
        lab.wait_for_leader(other_than=first)
        more_confirmed(publisher, 200)
        publisher.stop.set()
        publisher.join(30)
    finally:
        lab.stop_all()
    assert lab.tracebacks() == [], lab.logs()


def test_a_node_whose_copy_cannot_be_served_gives_the_lead_back(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    damaged, gone = (name for name in lab.nodes if name != leader)
    publish_confirmed(lab, "jobs", range(100))
    lab.signal(gone, signal.SIGKILL)
    lab.wait_in_sync({leader, damaged})
    # A bad disk under one copy: bytes in the middle of its log change.
    segment = lab.directory / damaged / "00000000000000000001.wal"
    with open(segment, "r+b") as file:
        file.seek(segment.stat().st_size // 2)
        file.write(b"\xff" * 16)
    publish_confirmed(lab, "jobs", range(100, 200))
    lab.signal(leader, signal.SIGKILL)
    # The only follower in the set takes the lead, cannot read its copy, and gives the lead
    # and the set back: the killed leader, which has every confirm, may lead when it returns.
    wait_until(lambda: "cannot serve" in lab.log(damaged), 30, lab.log(damaged))
    wait_until(lambda: lab.in_sync() == {leader}, 10, str(lab.in_sync()))
    assert lab.leader() in (None, damaged) and not lab.serving(damaged)
    lab.start(leader)
    lab.start(gone)
    assert lab.wait_for_leader() == leader
    lab.wait_in_sync(set(lab.nodes))
    assert drain(lab, "jobs", 200) == list(range(200))

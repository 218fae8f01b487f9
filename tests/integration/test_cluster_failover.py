"""Three Postroom nodes on one etcd, as processes on loopback: what a confirm promises when a
leader dies, is paused past its lease, or is left without followers.

The clients are stock pika connections given every node's address: a follower forwards them to
the leader, and after a failover they reconnect to whichever node answers.
"""

from __future__ import annotations

import base64
import json
import os
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
        self.stop = threading.Event()

    def start(self, queue: str) -> threading.Thread:
        """Publish ``0``, ``1``, ``2`` ... to ``queue`` (persistent) on a thread of its own,
        until :attr:`stop` is set or the broker closes the connection."""
        properties = commands.Basic.Properties(delivery_mode=2)

        def messages() -> Iterator[bytes]:
            number = 0
            while not self.stop.is_set():
                yield publish_frames(1, "", queue, str(number).encode(), properties)
                number += 1

        def publish() -> None:
            try:
                self.publish(messages())
            except (OSError, EOFError, TimeoutError):
                pass  # (a leader that lost its lease closes its clients' connections)

        sending = threading.Thread(target=publish, daemon=True)
        sending.start()
        return sending

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
    stop = publisher.stop
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
    sending = publisher.start("paused")
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
    # Nothing it read after resuming reaches a consumer. (Deliveries the kernel held for its
    # sockets before the pause go out during it: they were decided then.)
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


def test_nodes_run_under_twistd_as_the_systemd_unit_runs_them(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab(start=False)
    for name in lab.nodes:
        lab.start(name, twistd=True)
    first = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    publish_confirmed(lab, "jobs", range(1))
    lab.signal(first, signal.SIGTERM)  # systemctl stop: the lead passes on at once
    # twistd ends itself with the signal once its shutdown is done (see test_twistd.py).
    assert lab.nodes[first].process is not None and lab.nodes[first].process.returncode == -signal.SIGTERM
    assert "checkpoint written" in lab.log(first)
    lab.wait_for_leader(other_than=first)
    assert drain(lab, "jobs", 1) == [0]


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
        if os.environ.get("CI") == "true":
            pytest.fail(str(missing))
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


def test_a_leader_cut_from_etcd_and_its_followers_confirms_nothing_more(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab(partitioned=True)
    first = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    connection = connect(lab)
    connection.channel().queue_declare("cut", durable=True)
    connection.close()
    # Its clients still reach it: only its links to etcd and to the other nodes are cut.
    publisher = TimedPublisher(lab.nodes[first].amqp)
    sending = publisher.start("cut")
    wait_until(lambda: len(publisher.acks) >= 300, 30, "publishing did not start")
    cut_at = time.monotonic()
    lab.partitions[first].cut()
    second = lab.wait_for_leader(other_than=first, timeout=30)
    on_second = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[second].amqp))
    channel = on_second.channel()
    channel.confirm_delivery()
    confirmed_at = []
    for number in range(10**9, 10**9 + 50):  # (told from the first leader's by their size)
        channel.basic_publish("", "cut", str(number).encode(), pika.BasicProperties(delivery_mode=2))
        confirmed_at.append(time.monotonic())
    on_second.close()
    first_new_confirm = confirmed_at[0]
    # It closes its clients' connections once its lease may have run out (2 s), without etcd.
    sending.join(30)
    assert not sending.is_alive(), lab.log(first)
    closed_at = time.monotonic()
    publisher.stop.set()
    assert "ran out" in lab.log(first), lab.log(first)

    # Nothing published after the cut was confirmed: no follower could take it.
    late = [round(at - cut_at, 3) for at in publisher.acks if at > cut_at + 0.5]
    assert late == [], f"{len(late)} confirms from the cut-off leader after the cut; new leader {second}"
    assert publisher.acks[-1] < first_new_confirm
    assert closed_at - cut_at < 30
    # What it confirmed before, the new leader has.
    confirmed = len(publisher.acks)
    got = drain(lab, "cut", confirmed + 50)
    old = [number for number in got if number < 10**9]
    assert set(range(confirmed)) <= set(old), f"lost {sorted(set(range(confirmed)) - set(old))[:20]}"
    assert max(old) < publisher.sent, "a message never published was delivered"
    assert [number for number in got if number >= 10**9] == list(range(10**9, 10**9 + 50))

    # Mended, it follows the new leader and its copy becomes the leader's again.
    lab.partitions[first].mend()
    lab.wait_in_sync(set(lab.nodes), 30)
    wait_until(lambda: lab.files(first) == lab.files(second), 15, "the old leader's copy did not catch up")


def test_a_follower_whose_disk_fills_leaves_the_in_sync_set_and_comes_back(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab(start=False)
    lab.start("a")
    assert lab.wait_for_leader() == "a"
    lab.start("b")
    lab.start("c", disk=32 << 20)
    lab.wait_in_sync(set(lab.nodes))
    publisher = Publisher([lab.nodes["a"].amqp], "small")
    publisher.start()
    more_confirmed(publisher, 100)
    # Its disk fills (the log's copy grows into the last 256 KiB a filler left).
    filler = lab.data_dir("c") / "filler"
    free = os.statvfs(lab.data_dir("c"))
    with open(filler, "wb") as file:
        file.write(b"\0" * (free.f_bavail * free.f_frsize - (256 << 10)))
    publish_confirmed_bodies(lab.nodes["a"].amqp, "big", 20, 64 << 10)
    wait_until(lambda: "cannot write its copy" in lab.log("c"), 30, lab.log("c"))
    lab.wait_in_sync({"a", "b"}, 10)
    more_confirmed(publisher, 200)  # the leader and b are min_in_sync (2)
    # Space again: it catches up and rejoins.
    filler.unlink()
    lab.wait_in_sync(set(lab.nodes), 30)
    publisher.stop.set()
    publisher.join(30)
    wait_until(lambda: lab.files("c") == lab.files("a"), 15, "the follower did not catch up")
    # It waited longer each time it could not write (from 1 s): no storm of attempts.
    assert lab.log("c").count("cannot write its copy") < 10, lab.log("c")


def publish_confirmed_bodies(port: int, queue: str, count: int, size: int) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for _ in range(count):
        channel.basic_publish("", queue, b"x" * size, pika.BasicProperties(delivery_mode=2))
    connection.close()


def test_the_nodes_link_over_tls_and_refuse_a_node_the_cluster_ca_did_not_sign(
    make_lab: Callable[..., Lab], tmp_path: Path
) -> None:
    import trustme

    cluster_ca, other_ca = trustme.CA(), trustme.CA()
    cluster_ca.cert_pem.write_to_path(tmp_path / "cluster-ca.pem")
    lab = make_lab(start=False)
    for name, node in lab.nodes.items():
        issued = (other_ca if name == "c" else cluster_ca).issue_cert(f"{name}.postroom.test")
        issued.cert_chain_pems[0].write_to_path(tmp_path / f"{name}.crt")
        issued.private_key_pem.write_to_path(tmp_path / f"{name}.key")
        tls = f"certificate: {tmp_path}/{name}.crt, key: {tmp_path}/{name}.key, ca: {tmp_path}/cluster-ca.pem"
        node.config.write_text(node.config.read_text() + f"  tls: {{{tls}}}\n")  # (cluster: is the last section)
    lab.start("a")
    assert lab.wait_for_leader() == "a"
    lab.start("b")
    lab.start("c")
    lab.wait_in_sync({"a", "b"})
    publish_confirmed(lab, "jobs", range(100))  # confirmed: b has them, over TLS
    # The leader finds no cluster CA behind c's certificate, and tells it so.
    wait_until(lambda: "TLS with the leader a failed (tlsv1 alert unknown ca)" in lab.log("c"), 30, lab.log("c"))
    wait_until(lambda: "TLS failed (certificate verify failed)" in lab.log("a"), 10, lab.log("a"))
    assert lab.in_sync() == {"a", "b"}

    # The other way round: b leads, a follows it over TLS once it is back.
    lab.signal("a", signal.SIGTERM)
    assert lab.wait_for_leader(other_than="a") == "b"
    lab.start("a")
    lab.wait_in_sync({"a", "b"})
    publish_confirmed(lab, "jobs", range(100, 200))
    assert drain(lab, "jobs", 200) == list(range(200))
    wait_until(lambda: lab.files("a") == lab.files("b"), 15, "a did not catch up")
    assert lab.in_sync() == {"a", "b"}
    assert lab.log("c").count("TLS with the leader") <= 3  # once for each leader it tried, not each attempt


def dead_lettered(data_dir: Path, out: Path) -> list[tuple[int, str]]:
    """``(dead-letter id, message id)`` of each message dead-lettered in ``data_dir``'s event
    stream, as ``postroom dlq export`` (every segment) turns it into Parquet."""
    import pyarrow.parquet as pq

    done = postroom("dlq", "export", "--data-dir", str(data_dir), "--include-last", "--parquet", str(out))
    assert done.returncode == 0, done
    rows = [row for path in sorted(out.rglob("segment-*.parquet")) for row in pq.read_table(path).to_pylist()]
    return sorted((row["dead_letter_id"], row["message_id"]) for row in rows if row["kind"] == "dead_lettered")


def test_the_dead_letter_events_are_on_the_node_that_takes_over(lab: Lab, tmp_path: Path) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    before = sum(map(len, dead_letter_files(lab, leader).values()))
    connection = connect(lab)
    channel = connection.channel()
    channel.queue_declare("dead", durable=True)
    dead_letter_to = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    channel.queue_declare("work", durable=True, arguments=dead_letter_to)
    channel.confirm_delivery()
    for number in range(50):
        channel.basic_publish("", "work", b"x", pika.BasicProperties(delivery_mode=2, message_id=f"m{number}"))
    for _ in range(50):
        method, _properties, _body = channel.basic_get("work")
        assert method is not None
        channel.basic_reject(method.delivery_tag, requeue=False)
    connection.close()
    wait_until(lambda: channel_depth(lab, "dead") == 50, 10, "not dead-lettered")

    def on_every_node() -> bool:
        """The events are written (0.2 s after the first of a burst) and on both followers."""
        copies = [dead_letter_files(lab, name) for name in lab.nodes]
        return all(copy == copies[0] for copy in copies) and sum(map(len, copies[0].values())) > before + 1000

    wait_until(on_every_node, 10, "the dead-letter events did not reach the followers")
    lab.signal(leader, signal.SIGKILL)
    second = lab.wait_for_leader(other_than=leader)
    written = dead_lettered(lab.directory / leader, tmp_path / "written")
    assert sorted(message for _id, message in written) == sorted(f"m{number}" for number in range(50))
    assert dead_lettered(lab.data_dir(second), tmp_path / "kept") == written


def dead_letter_files(lab: Lab, name: str) -> dict[str, bytes]:
    return {path: data for path, data in lab.files(name).items() if path.startswith("deadletters/")}


def channel_depth(lab: Lab, queue: str) -> int:
    connection = connect(lab)
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def test_deliveries_unacknowledged_when_the_leader_dies_come_back_redelivered(lab: Lab) -> None:
    leader = lab.wait_for_leader()
    lab.wait_in_sync(set(lab.nodes))
    publish_confirmed(lab, "held", range(20))
    consumer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lab.nodes[leader].amqp))
    channel = consumer.channel()
    channel.basic_qos(prefetch_count=10)
    held = []
    for method, _properties, body in channel.consume("held", inactivity_timeout=5):
        assert method is not None and not method.redelivered
        held.append(int(body))
        if len(held) == 10:
            break
    lab.signal(leader, signal.SIGKILL)  # (the ten are never acknowledged)
    lab.wait_for_leader(other_than=leader)
    connection = connect(lab)
    channel = connection.channel()
    got = []
    for method, _properties, body in channel.consume("held", inactivity_timeout=5):
        assert method is not None, f"only {got}"
        got.append((int(body), method.redelivered))
        channel.basic_ack(method.delivery_tag)
        if len(got) == 20:
            break
    connection.close()
    assert held == list(range(10))
    # Every message, in order; those held come back redelivered (as after a restart, so does
    # every message the new leader recovered: docs/rabbitmq-compatibility.md).
    assert [number for number, _redelivered in got] == list(range(20))
    assert all(redelivered for _number, redelivered in got[:10]), got

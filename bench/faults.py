"""Faults under load: a three-node cluster's leader killed, paused and cut off, again and again, while
two publishers publish with confirms (each moves to the next node once a confirm takes over
``--confirm-timeout``) and two consumers consume; then a check of everything
(in the style of Jepsen's checkers): every confirmed message delivered at least once, none
delivered that was never published, and each publisher's messages in its order.

Runs against a Postroom cluster (one etcd member, three nodes) and, unless ``--no-rabbitmq``,
the same faults against a three-node RabbitMQ cluster's quorum queue (the node holding the
queue's leader is the one killed or paused). A killed node is started again once a new leader
confirms, and the next fault waits until it is back in sync. ``--cuts`` cut Postroom's leader
off from etcd and from the other nodes for ``--cut-seconds`` (its clients still reach it), with
the lab's proxies (``cluster_lab.Partition``); this harness cannot cut RabbitMQ's nodes apart,
so its runs leave them out. Prints one JSON line per broker::

    python bench/faults.py --kills 20 --pauses 3
    python bench/faults.py --kills 3 --pauses 1 --no-rabbitmq     # the short run
    python bench/faults.py --kills 200 --pauses 20 --cuts 20 --no-rabbitmq     # the long run
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from postroom.broker.tools import testing  # noqa: E402
from postroom.broker.tools.cluster_lab import (  # noqa: E402
    CarefulPublisher,
    Consumer,
    Lab,
    Publisher,
    check,
    etcd_members,
)

QUEUE = "faults"


def first_confirm_after(publishers: list[Publisher], moment: float, timeout: float = 60.0) -> float | None:
    """Seconds from ``moment`` to the first confirm of a message published after it (one
    published before may be confirmed by the node that was just killed, its confirm on its way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = []
        for publisher in publishers:
            published, confirmed = list(publisher.published_at), list(publisher.confirmed_at)
            index = bisect.bisect_right(published, moment)
            if index < len(confirmed):
                later.append(confirmed[index])
        if later:
            return min(later) - moment
        time.sleep(0.01)
    return None


def longest_gap(publishers: list[Publisher], start: float, end: float) -> float:
    """The longest time between two confirms (of any publisher) from ``start`` to ``end``."""
    times = sorted(at for publisher in publishers for at in publisher.confirmed_at if start <= at <= end)
    points = [start, *times, end]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


class Target:
    """A cluster to fault: its AMQP ports, and how to find, kill and pause its leader."""

    name = ""
    arguments: dict[str, Any] = {}
    ports: list[int] = []

    def leader(self) -> Any:
        raise NotImplementedError

    def kill(self, leader: Any) -> Callable[[], None]:
        """SIGKILL ``leader``; returns what starts it again."""
        raise NotImplementedError

    def pause(self, leader: Any, seconds: float) -> None:
        raise NotImplementedError

    def cut(self, leader: Any, seconds: float) -> None:
        """Cut ``leader`` off from etcd and from the other nodes for ``seconds``."""
        raise NotImplementedError

    def settle(self) -> None:
        """Wait until every node is back and in sync."""


class PostroomTarget(Target):
    name = "postroom"

    def __init__(self, lab: Lab, lease: float) -> None:
        self.lab = lab
        self.lease = lease
        self.ports = lab.amqp_ports()

    def leader(self) -> str:
        return self.lab.wait_for_leader(60)

    def kill(self, leader: str) -> Callable[[], None]:
        self.lab.signal(leader, signal.SIGKILL)
        return lambda: self.lab.start(leader)

    def pause(self, leader: str, seconds: float) -> None:
        self.lab.signal(leader, signal.SIGSTOP)
        time.sleep(seconds)
        self.lab.signal(leader, signal.SIGCONT)

    def cut(self, leader: str, seconds: float) -> None:
        self.lab.partitions[leader].cut()
        time.sleep(seconds)
        self.lab.partitions[leader].mend()

    def settle(self) -> None:
        self.lab.wait_in_sync(set(self.lab.nodes), 120)


class RabbitMQTarget(Target):
    name = "rabbitmq"
    arguments = {"x-queue-type": "quorum"}

    def __init__(self, nodes: list[tuple[int, int]]) -> None:
        self.nodes = nodes
        self.ports = [port for port, _http in nodes]

    def _api(self, path: str) -> Any:
        for _port, http in self.nodes:
            request = urllib.request.Request(f"http://127.0.0.1:{http}/api/{path}")
            request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    return json.load(answer)
            except OSError:
                continue
        raise RuntimeError("no RabbitMQ node answers its management API")

    def leader(self) -> int:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                name = self._api(f"queues/%2F/{QUEUE}").get("leader", "")
            except (RuntimeError, ValueError):
                name = ""
            for port in self.ports:
                if name == f"postroom{port}@localhost":
                    return port
            time.sleep(0.2)
        raise RuntimeError("the quorum queue has no leader")

    def kill(self, leader: int) -> Callable[[], None]:
        process, env = testing._RABBITMQ_PROCESSES[leader]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(20)

        def restart() -> None:
            testing._RABBITMQ_PROCESSES[leader] = (testing._launch_rabbitmq(env), env)
            testing.wait_for_port(leader, 120)

        return restart

    def pause(self, leader: int, seconds: float) -> None:
        process, _env = testing._RABBITMQ_PROCESSES[leader]
        os.killpg(process.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.killpg(process.pid, signal.SIGCONT)

    def settle(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                queue = self._api(f"queues/%2F/{QUEUE}")
                if len(queue.get("online", [])) == len(self.nodes):
                    return
            except (RuntimeError, ValueError):
                pass
            time.sleep(0.5)


def run(
    target: Target,
    kills: int,
    pauses: int,
    pause_seconds: float,
    spacing: float,
    confirm_timeout: float,
    cuts: int = 0,
    cut_seconds: float = 6.0,
) -> dict[str, Any]:
    publishers: list[Publisher] = [
        CarefulPublisher(target.ports, QUEUE, tag, target.arguments, confirm_timeout)
        if confirm_timeout
        else Publisher(target.ports, QUEUE, tag, target.arguments)
        for tag in ("p", "q")
    ]
    consumers = [Consumer(target.ports, QUEUE, target.arguments) for _ in range(2)]
    for thread in (*publishers, *consumers):
        thread.start()
    started = time.monotonic()
    faults: list[dict[str, Any]] = []
    plan = ["kill"] * kills
    for index in range(pauses):  # the pauses spread among the kills
        plan.insert(round((index + 1) * (kills + index) / (pauses + 1)), "pause")
    for index in range(cuts):  # and the cuts among both
        plan.insert(round((index + 1) * (len(plan) + 1) / (cuts + 1)), "cut")
    for kind in plan:
        time.sleep(spacing)
        leader = target.leader()
        moment = time.monotonic()
        if kind == "kill":
            restart = target.kill(leader)
            took = first_confirm_after(publishers, moment)
            restart()
            faults.append({"fault": "kill", "node": leader, "first_confirm_s": took})
        else:
            (target.pause if kind == "pause" else target.cut)(leader, pause_seconds if kind == "pause" else cut_seconds)
            resumed = time.monotonic()
            took = first_confirm_after(publishers, moment)
            time.sleep(max(0.0, resumed + 5 - time.monotonic()))
            stall = longest_gap(publishers, moment, resumed + 5) if took is not None else None
            faults.append({"fault": kind, "node": leader, "first_confirm_s": took, "stall_s": stall})
        print(json.dumps({"broker": target.name, **faults[-1]}), file=sys.stderr)
        target.settle()
    time.sleep(spacing)
    for publisher in publishers:
        publisher.stop.set()
    for publisher in publishers:
        publisher.join(60)
    ended = time.monotonic()
    confirmed = {f"{p.tag}:{n}".encode() for p in publishers for n in p.confirmed}
    deadline = time.monotonic() + 120
    while not confirmed <= {body for consumer in consumers for body in consumer.delivered}:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for consumer in consumers:
        consumer.stop.set()
    for consumer in consumers:
        consumer.join(60)
    verdict = check(publishers, [consumer.delivered for consumer in consumers])
    left = None
    if verdict.lost:
        # Lost, or only not delivered yet: what the queue still holds tells.
        drained = Consumer(target.ports, QUEUE, target.arguments)
        drained.start()
        time.sleep(10)
        drained.stop.set()
        drained.join(30)
        verdict = check(publishers, [consumer.delivered for consumer in consumers] + [drained.delivered])
        left = len(drained.delivered)
    kill_times = [f["first_confirm_s"] for f in faults if f["fault"] == "kill" and f["first_confirm_s"] is not None]
    stalls = [f["stall_s"] for f in faults if f["fault"] == "pause" and f.get("stall_s") is not None]
    cut_stalls = [f["stall_s"] for f in faults if f["fault"] == "cut" and f.get("stall_s") is not None]
    return {
        "broker": target.name,
        "kills": kills,
        "pauses": pauses,
        "confirmed": verdict.confirmed,
        "confirmed_per_s": round(verdict.confirmed / (ended - started)),
        "delivered": verdict.delivered,
        "lost": len(verdict.lost),
        "delivered_to_a_last_consumer": left,
        "consumer_failures": [consumer.failures[-3:] for consumer in consumers],
        "lost_examples": verdict.lost[:10],
        "phantoms": len(verdict.phantoms),
        "duplicates": verdict.duplicates,
        "reordered": verdict.reordered,
        "kill_to_first_confirm_s": {
            "median": round(statistics.median(kill_times), 3) if kill_times else None,
            "max": round(max(kill_times), 3) if kill_times else None,
            "unanswered": sum(1 for f in faults if f["fault"] == "kill" and f["first_confirm_s"] is None),
        },
        "pause_stall_s": {
            "median": round(statistics.median(stalls), 3) if stalls else None,
            "max": max(stalls, default=None),
        },
        "cuts": cuts,
        "cut_stall_s": {
            "median": round(statistics.median(cut_stalls), 3) if cut_stalls else None,
            "max": max(cut_stalls, default=None),
        },
        "faults": faults,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--pauses", type=int, default=3)
    parser.add_argument("--pause-seconds", type=float, default=6.0, help="how long a leader is paused (past its lease)")
    parser.add_argument("--cuts", type=int, default=0, help="Postroom only: the leader cut off from etcd and the nodes")
    parser.add_argument("--cut-seconds", type=float, default=6.0, help="how long a leader is cut off (past its lease)")
    parser.add_argument("--spacing", type=float, default=3.0, help="seconds of load before each fault")
    parser.add_argument(
        "--confirm-timeout",
        type=float,
        default=1.0,
        help="publishers move to the next node after this long without a confirm (0: pika's publisher, which waits "
        "for its heartbeats)",
    )
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--no-postroom", action="store_true")
    args = parser.parse_args()
    results = []
    if not args.no_postroom:
        with ExitStack() as stack:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="postroom-faults-")))
            urls = stack.enter_context(etcd_members(1, directory))
            lab = Lab(directory, urls, partitioned=args.cuts > 0)
            lab.start_all()
            stack.callback(lab.stop_all)
            target = PostroomTarget(lab, 2.0)
            target.leader()
            target.settle()
            results.append(
                run(
                    target,
                    args.kills,
                    args.pauses,
                    args.pause_seconds,
                    args.spacing,
                    args.confirm_timeout,
                    args.cuts,
                    args.cut_seconds,
                )
            )
            results[-1]["tracebacks"] = lab.tracebacks()
    if not args.no_rabbitmq:
        with testing.rabbitmq_cluster(3) as nodes:
            target = RabbitMQTarget(nodes)
            results.append(run(target, args.kills, args.pauses, args.pause_seconds, args.spacing, args.confirm_timeout))
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()

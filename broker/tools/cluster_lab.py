"""A cluster on this machine, for the tests and ``bench/faults.py``: etcd members and Postroom
nodes as processes on loopback, which can be started, killed, paused and resumed.

    with etcd_members(1, directory) as urls:
        lab = Lab(directory, urls)
        lab.start_all()
        leader = lab.wait_for_leader()
        lab.signal(leader, signal.SIGKILL)
        ...
        lab.stop_all()

Each node keeps its ports across restarts (AMQP, management, replication), so that a client
given every node's address reaches whichever leads.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postroom.broker.cluster.replication import replicated_files
from postroom.broker.tools.testing import free_port, wait_for_port

__all__ = ["EtcdMissing", "Lab", "etcd_members", "etcd_get", "etcd_get_prefix"]


class EtcdMissing(RuntimeError):
    """The ``etcd`` server is not installed (``apt-get install etcd-server``)."""


def _post(url: str, path: str, body: dict[str, Any], timeout: float = 3.0) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/v3/{path}", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return dict(json.load(answer))


def etcd_get(url: str, key: str) -> str | None:
    """The value of ``key`` in the etcd at ``url`` (``None``: no such key)."""
    kvs = _post(url, "kv/range", {"key": base64.b64encode(key.encode()).decode()}).get("kvs") or []
    return base64.b64decode(kvs[0].get("value", "")).decode() if kvs else None


def etcd_get_prefix(url: str, prefix: str) -> dict[str, str]:
    """Every key under ``prefix`` with its value."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    answer = _post(
        url,
        "kv/range",
        {"key": base64.b64encode(prefix.encode()).decode(), "range_end": base64.b64encode(end.encode()).decode()},
    )
    return {
        base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
        for kv in answer.get("kvs") or []
    }


@contextmanager
def etcd_members(count: int, directory: Path) -> Iterator[list[str]]:
    """``count`` etcd members forming one cluster on loopback, their data under ``directory``;
    yields their client URLs, and stops them afterwards.

    :raises EtcdMissing: ``etcd`` is not installed
    """
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdMissing("etcd is not installed: apt-get install etcd-server")
    members = [(f"e{index}", free_port(), free_port()) for index in range(count)]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _client, peer in members)
    processes = []
    try:
        for name, client, peer in members:
            log = open(directory / f"etcd-{name}.log", "ab")
            processes.append(
                subprocess.Popen(
                    [
                        binary,
                        "--name",
                        name,
                        "--data-dir",
                        str(directory / f"etcd-{name}"),
                        "--listen-client-urls",
                        f"http://127.0.0.1:{client}",
                        "--advertise-client-urls",
                        f"http://127.0.0.1:{client}",
                        "--listen-peer-urls",
                        f"http://127.0.0.1:{peer}",
                        "--initial-advertise-peer-urls",
                        f"http://127.0.0.1:{peer}",
                        "--initial-cluster",
                        initial,
                        "--initial-cluster-state",
                        "new",
                    ],
                    stdout=log,
                    stderr=log,
                )
            )
            log.close()
        urls = [f"http://127.0.0.1:{client}" for _name, client, _peer in members]
        deadline = time.monotonic() + 30
        for url in urls:
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                        if json.load(answer).get("health") == "true":
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd at {url} did not become healthy")
                time.sleep(0.1)
        yield urls
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(10)


@dataclass
class NodeProcess:
    """One Postroom node of a :class:`Lab`."""

    name: str
    amqp: int
    management: int
    replication: int
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    #: Lines of its log before this run of it started.
    starts: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Lab:
    """Postroom nodes in cluster mode under ``directory``, on the etcd at ``urls``.

    :param settings: more keys of the ``cluster:`` section (YAML, one per line)
    """

    def __init__(
        self,
        directory: Path,
        urls: list[str],
        names: tuple[str, ...] = ("a", "b", "c"),
        settings: str = "",
        prefix: str = "postroom",
        storage: str = "",
    ) -> None:
        self.directory = directory
        self.urls = urls
        self.prefix = prefix
        self.nodes: dict[str, NodeProcess] = {}
        for name in names:
            node = NodeProcess(
                name,
                free_port(),
                free_port(),
                free_port(),
                directory / f"{name}.yaml",
                directory / f"{name}.log",
            )
            cluster = "".join(f"\n  {line.strip()}" for line in settings.splitlines() if line.strip())
            node.config.write_text(
                f'listen: {{amqp: "tcp:{node.amqp}:interface=127.0.0.1",'
                f' management: "tcp:{node.management}:interface=127.0.0.1", metrics: false}}\n'
                f'storage: {{dir: "{directory / name}", fsync: batch{", " + storage if storage else ""}}}\n'
                f"cluster:\n  name: {name}\n  etcd: [{', '.join(urls)}]\n"
                f'  listen: "tcp:{node.replication}:interface=127.0.0.1"\n  prefix: {prefix}{cluster}\n'
            )
            self.nodes[name] = node

    def start(self, name: str) -> None:
        node = self.nodes[name]
        assert not node.running, f"{name} is running"
        node.starts.append(node.log.read_text().count("\n") if node.log.exists() else 0)
        log = open(node.log, "ab")
        node.process = subprocess.Popen(
            [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(node.config)],
            stdout=log,
            stderr=log,
        )
        node.paused = False
        log.close()

    def start_all(self) -> None:
        for name in self.nodes:
            self.start(name)

    def signal(self, name: str, number: int) -> None:
        node = self.nodes[name]
        assert node.process is not None
        node.process.send_signal(number)
        if number == signal.SIGSTOP:
            node.paused = True
        elif number == signal.SIGCONT:
            node.paused = False
        elif number in (signal.SIGKILL, signal.SIGTERM):
            if node.paused:
                node.process.send_signal(signal.SIGCONT)
            node.process.wait(30)
            node.paused = False

    def stop_all(self) -> None:
        for node in self.nodes.values():
            if node.running:
                assert node.process is not None
                if node.paused:
                    node.process.send_signal(signal.SIGCONT)
                node.process.terminate()
        for node in self.nodes.values():
            if node.process is not None:
                try:
                    node.process.wait(30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(10)

    def leader(self) -> str | None:
        """The node that holds the leader key now."""
        for url in self.urls:
            try:
                value = etcd_get(url, f"{self.prefix}/leader")
            except OSError:
                continue
            return json.loads(value)["name"] if value else None
        return None

    def in_sync(self) -> set[str]:
        for url in self.urls:
            try:
                keys = etcd_get_prefix(url, f"{self.prefix}/isr/")
            except OSError:
                continue
            return {key.rpartition("/")[2] for key in keys}
        return set()

    def wait_for_leader(self, timeout: float = 30.0, other_than: str | None = None) -> str:
        """The leader, once one holds the key and serves AMQP (not ``other_than``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.leader()
            if name is not None and name != other_than and self.serving(name):
                return name
            time.sleep(0.05)
        raise AssertionError(f"no leader after {timeout} s: {self.logs()}")

    def serving(self, name: str) -> bool:
        """Whether ``name``'s broker (not a proxy) has started serving in its current run."""
        node = self.nodes[name]
        return node.running and "AMQPServerFactory starting on" in self.log(name)

    def wait_in_sync(self, names: set[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.in_sync() != names:
            if time.monotonic() > deadline:
                raise AssertionError(f"in sync: {self.in_sync()}, not {names}: {self.logs()}")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        """``name``'s log in its current run."""
        node = self.nodes[name]
        if not node.log.exists():
            return ""
        lines = node.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[node.starts[-1] if node.starts else 0 :])

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)[-3000:]}" for name in self.nodes)

    def tracebacks(self) -> list[str]:
        """The nodes whose logs (all their runs) hold a traceback."""
        return [
            name
            for name, node in self.nodes.items()
            if node.log.exists() and "Traceback" in node.log.read_text(errors="replace")
        ]

    def amqp_ports(self) -> list[int]:
        return [node.amqp for node in self.nodes.values()]

    def wait_listening(self, name: str, timeout: float = 30.0) -> None:
        wait_for_port(self.nodes[name].amqp, timeout)

    def files(self, name: str) -> dict[str, bytes]:
        """The replicated files of ``name``'s data directory, by relative path."""
        root = self.directory / name
        return {path: (root / path).read_bytes() for path in replicated_files(str(root))}

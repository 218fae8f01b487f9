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

import json
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands

from postroom.broker.cluster.replication import replicated_files
from postroom.broker.tools.commands.clustering import etcd_range
from postroom.broker.tools.testing import FramePump, encode, port_free, publish_frames, wait_for_port
from postroom.broker.wire.codec import PROTOCOL_HEADER

__all__ = ["ETCD_PROCESSES", "EtcdMissing", "Lab", "Partition", "etcd_members"]


class EtcdMissing(RuntimeError):
    """The ``etcd`` server is not installed (``apt-get install etcd-server``)."""


#: Ports the lab's processes listen on are drawn from here, below the kernel's ephemeral range
#: (32768 and up), where ``free_port`` finds its ports: a node binds some of its ports long
#: after they were chosen (the replication port when it comes to lead), and another test's
#: ``free_port`` must not hand out the same one meanwhile.
LAB_PORTS = range(20000, 32000)


def lab_port() -> int:
    """A port in :data:`LAB_PORTS` that nothing listens on right now."""
    while True:
        port = random.choice(LAB_PORTS)
        if port_free(port):
            return port


#: The process of each etcd member :func:`etcd_members` runs, by its client URL (a test kills one).
ETCD_PROCESSES: dict[str, subprocess.Popen[bytes]] = {}


@contextmanager
def etcd_members(count: int, directory: Path) -> Iterator[list[str]]:
    """``count`` etcd members forming one cluster on loopback, their data under ``directory``;
    yields their client URLs, and stops them afterwards.

    :raises EtcdMissing: ``etcd`` is not installed
    """
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdMissing("etcd is not installed: apt-get install etcd-server")
    members = [(f"e{index}", lab_port(), lab_port()) for index in range(count)]
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
        ETCD_PROCESSES.update(zip(urls, processes, strict=True))
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
        for url in [url for url, process in ETCD_PROCESSES.items() if process in processes]:
            del ETCD_PROCESSES[url]


class Partition(threading.Thread):
    """A node's links to the other nodes and to etcd, through proxies that can be cut as a
    network partition cuts them: once :meth:`cut`, no byte passes either way on any link, open
    or new, and nothing is closed (the ends find out by their own timeouts, as across a switch
    that fails). :meth:`mend` closes what was held during the cut, as the timeouts of a long
    partition would have, and lets new connections through again.

    Each route listens on ``listen`` and relays each connection to ``target``, and listens only
    while something listens on ``target`` (read from ``/proc/net/tcp``): a node that is not
    running refuses connections through its partition as it would without one.
    """

    def __init__(self, routes: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
        super().__init__(daemon=True)
        self.routes = routes
        self.is_cut = False
        self._lock = threading.Lock()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._pending: dict[socket.socket, bytearray] = {}
        self._held: list[socket.socket] = []
        self._listeners: dict[socket.socket, tuple[str, int]] = {}
        #: Each route's listener while it listens.
        self._open: dict[tuple[str, int], socket.socket] = {}
        self._follow_targets()
        self._closing = threading.Event()
        self.start()

    def cut(self) -> None:
        with self._lock:
            self.is_cut = True

    def mend(self) -> None:
        with self._lock:
            if not self.is_cut:
                return
            self.is_cut = False
            ends = [*self._pairs, *self._held]
            self._pairs.clear()
            self._pending.clear()
            self._held.clear()
        for end in ends:
            end.close()

    def close(self) -> None:
        self._closing.set()
        self.join(5)
        for end in [*self._listeners, *self._pairs, *self._held]:
            end.close()

    def _follow_targets(self) -> None:
        """Listen on each route whose target listens, and on no other."""
        listening = _listening()
        for listen, target in self.routes:
            up = target in listening or ("0.0.0.0", target[1]) in listening
            if up and listen not in self._open:
                listener = socket.socket()
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(listen)
                listener.listen(64)
                self._open[listen] = listener
                self._listeners[listener] = target
            elif not up and listen in self._open:
                listener = self._open.pop(listen)
                del self._listeners[listener]
                listener.close()

    def run(self) -> None:
        while not self._closing.is_set():
            with self._lock:
                self._follow_targets()
                # (an end is read while what it sent before has mostly gone on)
                open_ends = [end for end, other in self._pairs.items() if len(self._pending[other]) < 1 << 20]
                readable = [*self._listeners] + ([] if self.is_cut else open_ends)
                writable = [] if self.is_cut else [end for end, data in self._pending.items() if data]
            try:
                ready, can_write, _ = select.select(readable, writable, [], 0.05)
            except (OSError, ValueError):
                continue  # (an end closed by mend meanwhile)
            with self._lock:
                for end in ready:
                    if end in self._listeners:
                        self._accept(end)
                    elif end in self._pairs and not self.is_cut:
                        self._relay(end)
                for end in can_write:
                    if end in self._pending and not self.is_cut:
                        self._flush(end)

    def _accept(self, listener: socket.socket) -> None:
        client, _address = listener.accept()
        if self.is_cut:
            self._held.append(client)  # (its SYN went nowhere: it waits, then times out)
            return
        upstream = socket.socket()
        try:
            upstream.connect(self._listeners[listener])
        except OSError:
            client.close()
            upstream.close()
            return
        for end in (client, upstream):
            end.setblocking(False)
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pairs[client], self._pairs[upstream] = upstream, client
        self._pending[client], self._pending[upstream] = bytearray(), bytearray()

    def _relay(self, end: socket.socket) -> None:
        other = self._pairs[end]
        try:
            data = end.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(end)
            return
        self._pending[other] += data
        self._flush(other)

    def _flush(self, end: socket.socket) -> None:
        pending = self._pending[end]
        try:
            sent = end.send(pending)
        except BlockingIOError:
            return
        except OSError:
            self._drop(end)
            return
        del pending[:sent]

    def _drop(self, end: socket.socket) -> None:
        other = self._pairs.pop(end, None)
        self._pending.pop(end, None)
        end.close()
        if other is not None:
            self._pairs.pop(other, None)
            self._pending.pop(other, None)
            other.close()


def _listening() -> set[tuple[str, int]]:
    """The IPv4 addresses and ports something on this machine listens on."""
    found = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                address, _, port = fields[1].partition(":")
                host = socket.inet_ntoa(int(address, 16).to_bytes(4, "little"))
                found.add((host, int(port, 16)))
    return found


@dataclass
class NodeProcess:
    """One Postroom node of a :class:`Lab`."""

    name: str
    amqp: int
    management: int
    replication: int
    metrics: int
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    #: Its stream-protocol port (:class:`Lab`'s ``streams``), if it listens on one.
    stream: int | None = None
    #: The size of the disk of its own it runs on (see :meth:`Lab.start`), if it does.
    disk: int | None = None
    #: Lines of its log before this run of it started.
    starts: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Lab:
    """Postroom nodes in cluster mode under ``directory``, on the etcd at ``urls``.

    :param settings: more keys of the ``cluster:`` section (YAML, one per line)
    :param streams: each node listens for the stream protocol too (:attr:`NodeProcess.stream`)
    :param partitioned: each node reaches etcd, and the others reach it, through a
        :class:`Partition` of its own (:attr:`partitions`), on an address of its own
        (``127.0.0.2`` and up, which it advertises)
    """

    def __init__(
        self,
        directory: Path,
        urls: list[str],
        names: tuple[str, ...] = ("a", "b", "c"),
        settings: str = "",
        prefix: str = "postroom",
        storage: str = "",
        partitioned: bool = False,
        streams: bool = False,
    ) -> None:
        self.directory = directory
        self.urls = urls
        self.prefix = prefix
        self.nodes: dict[str, NodeProcess] = {}
        self.partitions: dict[str, Partition] = {}
        for number, name in enumerate(names):
            node = NodeProcess(
                name,
                lab_port(),
                lab_port(),
                lab_port(),
                lab_port(),
                directory / f"{name}.yaml",
                directory / f"{name}.log",
                stream=lab_port() if streams else None,
            )
            cluster = "".join(f"\n  {line.strip()}" for line in settings.splitlines() if line.strip())
            etcd = urls
            if partitioned:
                host = f"127.0.0.{2 + number}"
                etcd = [url.replace("127.0.0.1", host) for url in urls]
                ports = [int(url.rpartition(":")[2]) for url in urls]
                ports += [node.amqp, node.management, node.replication] + ([node.stream] if node.stream else [])
                self.partitions[name] = Partition([((host, port), ("127.0.0.1", port)) for port in ports])
                cluster += f"\n  advertise: {host}"
            node.config.write_text(
                f'listen: {{amqp: "tcp:{node.amqp}:interface=127.0.0.1",'
                f' management: "tcp:{node.management}:interface=127.0.0.1",'
                f' metrics: "tcp:{node.metrics}:interface=127.0.0.1"'
                + (f', stream: "tcp:{node.stream}:interface=127.0.0.1"' if node.stream else "")
                + "}\n"
                f'storage: {{dir: "{directory / name}", fsync: batch{", " + storage if storage else ""}}}\n'
                f"cluster:\n  name: {name}\n  etcd: [{', '.join(etcd)}]\n"
                f'  listen: "tcp:{node.replication}:interface=127.0.0.1"\n  prefix: {prefix}{cluster}\n'
            )
            self.nodes[name] = node

    def start(self, name: str, twistd: bool = False, disk: int | None = None) -> None:
        """Start node ``name`` with ``postroom serve`` (``twistd``: with ``twistd postroom``, as
        the systemd unit does).

        :param disk: give it a disk of this many bytes: its data directory is then an empty
            tmpfs of that size, mounted in a mount namespace of its own (which ends with the
            process); :meth:`data_dir` is where others see it
        """
        node = self.nodes[name]
        assert not node.running, f"{name} is running"
        node.starts.append(node.log.read_text().count("\n") if node.log.exists() else 0)
        log = open(node.log, "ab")
        command = [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(node.config)]
        if twistd:
            runner = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
            command = [*runner, "--nodaemon", "--pidfile=", "--logfile=-", "postroom", "--config", str(node.config)]
        node.disk = disk
        if disk is not None:
            (self.directory / name).mkdir(exist_ok=True)
            mount = f'mount -t tmpfs -o size={disk} postroom-lab "$0" && exec "$@"'
            command = ["unshare", "--mount", "sh", "-c", mount, str(self.directory / name), *command]
        node.process = subprocess.Popen(command, stdout=log, stderr=log)
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
        """Stop every node, then the lab's partitions (mended first, so that each node stops as it
        would with its links whole)."""
        for partition in self.partitions.values():
            partition.mend()
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
        for partition in self.partitions.values():
            partition.close()

    def leader(self) -> str | None:
        """The node that holds the leader key now."""
        key = f"{self.prefix}/leader"
        value = etcd_range(self.urls, key).get(key)
        return json.loads(value)["name"] if value else None

    def in_sync(self) -> set[str]:
        """The nodes in the in-sync set, as etcd holds it."""
        return {key.rpartition("/")[2] for key in etcd_range(self.urls, f"{self.prefix}/isr/")}

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

    def data_dir(self, name: str) -> Path:
        """``name``'s data directory as this process reaches it (through the node's own root
        when it runs on a disk of its own)."""
        node = self.nodes[name]
        if node.disk is not None and node.process is not None:
            return Path(f"/proc/{node.process.pid}/root") / (self.directory / name).relative_to("/")
        return self.directory / name

    def files(self, name: str) -> dict[str, bytes]:
        """The replicated files of ``name``'s data directory, by relative path."""
        root = self.data_dir(name)
        return {path: (root / path).read_bytes() for path in replicated_files(str(root))}


def connect(ports: list[int], timeout: float = 30.0) -> Any:
    """A pika connection to the first of ``ports`` on 127.0.0.1 that answers, trying them all
    again until one does within ``timeout``."""
    import pika
    import pika.exceptions
    from pika.adapters.utils.connection_workflow import AMQPConnectorException

    # A node that is paused accepts connections (its kernel does) and answers nothing: give up
    # on one within a few seconds, and notice one that stops answering by its heartbeats.
    parameters = [
        pika.ConnectionParameters(
            "127.0.0.1", port, connection_attempts=1, socket_timeout=1, stack_timeout=3, heartbeat=2
        )
        for port in ports
    ]
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pika.BlockingConnection(parameters)
        except (pika.exceptions.AMQPConnectionError, AMQPConnectorException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Publisher(threading.Thread):
    """Publishes numbered persistent messages (``<tag>:<number>``) with confirms, one at a time,
    until stopped, reconnecting to any of ``ports`` after a failure (as a stock client given
    every node's address does); keeps what was confirmed, when, and what was only tried."""

    def __init__(self, ports: list[int], queue: str, tag: str = "p", arguments: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.queue = queue
        self.tag = tag
        self.arguments = arguments or {}
        self.stop = threading.Event()
        self.confirmed: list[int] = []
        #: When each confirmed message was published, and when its confirm came.
        self.published_at: list[float] = []
        self.confirmed_at: list[float] = []
        self.tried: set[int] = set()
        self.failures: list[str] = []

    def run(self) -> None:
        import pika
        import pika.exceptions
        from pika.adapters.utils.connection_workflow import AMQPConnectorException

        number = 0
        while not self.stop.is_set():
            try:
                connection = connect(self.ports)
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare(self.queue, durable=True, arguments=self.arguments)
                while not self.stop.is_set():
                    self.tried.add(number)
                    body = f"{self.tag}:{number}".encode()
                    started = time.monotonic()
                    channel.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
                    self.confirmed.append(number)
                    self.published_at.append(started)
                    self.confirmed_at.append(time.monotonic())
                    number += 1
                connection.close()
            except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as failure:
                self.failures.append(repr(failure))
                number += 1
                time.sleep(0.05)


class Consumer(threading.Thread):
    """Consumes ``queue`` with acknowledgements until stopped, reconnecting after a failure;
    keeps every delivery's body, in order, and when each came."""

    def __init__(self, ports: list[int], queue: str, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.queue = queue
        self.arguments = arguments or {}
        self.stop = threading.Event()
        self.delivered: list[bytes] = []
        self.delivered_at: list[float] = []
        self.failures: list[str] = []

    def run(self) -> None:
        import pika.exceptions
        from pika.adapters.utils.connection_workflow import AMQPConnectorException

        while not self.stop.is_set():
            try:
                connection = connect(self.ports)
                channel = connection.channel()
                channel.queue_declare(self.queue, durable=True, arguments=self.arguments)
                channel.basic_qos(prefetch_count=100)
                for method, _properties, body in channel.consume(self.queue, inactivity_timeout=0.2):
                    if self.stop.is_set():
                        break
                    if method is not None:
                        self.delivered.append(body)
                        self.delivered_at.append(time.monotonic())
                        channel.basic_ack(method.delivery_tag)
                connection.close()
            except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as failure:
                self.failures.append(repr(failure))
                time.sleep(0.05)


@dataclass
class Verdict:
    """What :func:`check` found."""

    confirmed: int
    delivered: int
    #: Confirmed and never delivered; delivered and never published; delivered more than once.
    lost: list[str]
    phantoms: list[str]
    duplicates: int
    #: A publisher's message delivered (the first time) to a consumer before one it published
    #: earlier and that consumer got later (after a failover, a message another consumer held
    #: unacknowledged comes back to whichever consumer is there).
    reordered: int

    @property
    def ok(self) -> bool:
        return not self.lost and not self.phantoms


def check(publishers: list[Publisher], consumers: list[list[bytes]]) -> Verdict:
    """Every confirmed message delivered at least once, none delivered that was never
    published, and how many deliveries were repeated or out of each publisher's order
    (``consumers``: what each consumer got, in order)."""
    seen: dict[str, set[int]] = {}
    firsts: set[bytes] = set()
    duplicates = reordered = 0
    for delivered in consumers:
        last: dict[str, int] = {}
        for body in delivered:
            if body in firsts:
                duplicates += 1
                continue
            firsts.add(body)
            tag, _, text = body.decode().partition(":")
            number = int(text)
            seen.setdefault(tag, set()).add(number)
            if number < last.get(tag, -1):
                reordered += 1
            last[tag] = number
    lost, phantoms = [], []
    for publisher in publishers:
        got = seen.pop(publisher.tag, set())
        lost += [f"{publisher.tag}:{number}" for number in publisher.confirmed if number not in got]
        phantoms += [f"{publisher.tag}:{number}" for number in sorted(got - publisher.tried)]
    phantoms += [f"{tag}:{number}" for tag, numbers in seen.items() for number in sorted(numbers)]
    confirmed = sum(len(publisher.confirmed) for publisher in publishers)
    return Verdict(confirmed, sum(len(delivered) for delivered in consumers), lost, phantoms, duplicates, reordered)


class CarefulPublisher(Publisher):
    """A :class:`Publisher` that gives up on a connection whose confirm has not come within
    ``confirm_timeout`` seconds and publishes on through the next node: a client of a node
    that is paused (which accepts connections and answers nothing) moves on as soon as that
    timeout allows, where a stock client waits for its heartbeats to run out. Over a plain
    socket, one message at a time, each waiting for its confirm."""

    def __init__(
        self,
        ports: list[int],
        queue: str,
        tag: str = "p",
        arguments: dict[str, Any] | None = None,
        confirm_timeout: float = 1.0,
    ) -> None:
        super().__init__(ports, queue, tag, arguments)
        self.confirm_timeout = confirm_timeout

    def _expect(self, sock: socket.socket, pump: FramePump, kinds: tuple[type, ...]) -> Any:
        deadline = time.monotonic() + self.confirm_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise TimeoutError(f"nothing within {self.confirm_timeout} s")
            data = sock.recv(65536)
            if not data:
                raise EOFError("the node closed the connection")
            for _channel, value in pump.feed(data):
                if isinstance(value, kinds):
                    return value
                if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                    raise EOFError(f"closed: {value.reply_text}")

    def _open(self, port: int) -> tuple[socket.socket, FramePump]:
        sock = socket.create_connection(("127.0.0.1", port), timeout=self.confirm_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pump = FramePump()
        try:
            sock.sendall(PROTOCOL_HEADER)
            self._expect(sock, pump, (commands.Connection.Start,))
            start_ok = commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest")
            sock.sendall(encode(0, start_ok))
            tune = self._expect(sock, pump, (commands.Connection.Tune,))
            sock.sendall(encode(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0)))
            sock.sendall(encode(0, commands.Connection.Open("/")))
            self._expect(sock, pump, (commands.Connection.OpenOk,))
            sock.sendall(encode(1, commands.Channel.Open(), commands.Confirm.Select()))
            self._expect(sock, pump, (commands.Confirm.SelectOk,))
            declare = commands.Queue.Declare(queue=self.queue, durable=True, arguments=self.arguments)
            sock.sendall(encode(1, declare))
            self._expect(sock, pump, (commands.Queue.DeclareOk,))
        except BaseException:
            sock.close()
            raise
        return sock, pump

    def run(self) -> None:
        number = 0
        turn = 0
        properties = commands.Basic.Properties(delivery_mode=2)
        while not self.stop.is_set():
            port = self.ports[turn % len(self.ports)]
            turn += 1
            try:
                sock, pump = self._open(port)
            except (OSError, EOFError, ValueError) as failure:
                self.failures.append(f"{port}: {failure!r}")
                time.sleep(0.02)
                continue
            tag = 0
            try:
                while not self.stop.is_set():
                    self.tried.add(number)
                    started = time.monotonic()
                    sock.sendall(publish_frames(1, "", self.queue, f"{self.tag}:{number}".encode(), properties))
                    tag += 1
                    answer = self._expect(sock, pump, (commands.Basic.Ack, commands.Basic.Nack))
                    if isinstance(answer, commands.Basic.Ack):
                        self.confirmed.append(number)
                        self.published_at.append(started)
                        self.confirmed_at.append(time.monotonic())
                    number += 1
            except (OSError, EOFError, ValueError) as failure:
                self.failures.append(f"{port}: {failure!r}")
                number += 1
            finally:
                sock.close()

"""The fuzzer's seed corpus: what real clients send, recorded through a proxy.

Each scenario drives one stock client (pika's ``BlockingConnection`` or py-amqp) through one
connection against a running broker, by way of :class:`RecordingProxy`, which forwards both
directions and keeps the client-to-server bytes. A session is saved as
``corpus/<name>.amqp``: the raw stream, protocol header first, then whole frames, exactly as
the client wrote them (a few KB each). :func:`load` reads them back as :class:`Session`
objects, the header apart and the frames split (:func:`wire.split_session`), so the
fuzzer can mutate whole frames as well as bytes.

The scenarios name their exchanges and queues ``fz.*`` and bound every queue with
``x-max-length``: a replayed session then finds the same names, and a hundred thousand
replays cannot fill the broker. Regenerate with ``python bench/soak/fuzz.py --record``;
recordings differ from run to run (pika's consumer tags are random), which is harmless: the
fuzzer is deterministic given the corpus files.
"""

from __future__ import annotations

import datetime
import decimal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import amqp
import pika
from wire import split_session

#: Where the recorded sessions live (committed).
CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
#: Corpus files' suffix.
SUFFIX = ".amqp"
#: Every queue a scenario declares is bounded: replays add messages and only checks delete them.
QUEUE_BOUND = {"x-max-length": 50}
#: Seconds the proxy waits for the broker to accept, and for a scenario's sockets to close.
PROXY_TIMEOUT = 10.0


@dataclass(frozen=True)
class Session:
    """One recorded client session.

    :ivar name: the scenario's name (the file's stem)
    :ivar header: the protocol header as sent
    :ivar frames: every frame the client sent after it, whole, in order
    """

    name: str
    header: bytes
    frames: tuple[bytes, ...]


def load(directory: Path = CORPUS_DIR) -> list[Session]:
    """Every session in ``directory``, by file name.

    :raises ValueError: a file is not a frame-aligned client stream, or there are none
    """
    sessions = []
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            header, frames = split_session(path.read_bytes())
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        sessions.append(Session(path.stem, header, tuple(frames)))
    if not sessions:
        raise ValueError(f"no {SUFFIX} sessions in {directory}; record them with --record")
    return sessions


# -- recording ----------------------------------------------------------------------------------


class RecordingProxy:
    """A loopback TCP proxy to ``127.0.0.1:upstream`` that keeps what each client sent.

    :ivar port: where clients connect
    :ivar streams: one ``bytearray`` per accepted connection, in accept order
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.streams: list[bytearray] = []
        self._pumps: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="recording-proxy", daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _address = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(("127.0.0.1", self.upstream), timeout=PROXY_TIMEOUT)
            server.settimeout(None)
            stream = bytearray()
            self.streams.append(stream)
            for source, target, record in ((client, server, stream), (server, client, None)):
                pump = threading.Thread(target=self._pump, args=(source, target, record), daemon=True)
                pump.start()
                self._pumps.append(pump)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, record: bytearray | None) -> None:
        try:
            while data := source.recv(65536):
                if record is not None:
                    record += data
                target.sendall(data)
        except OSError:
            pass
        for sock, how in ((target, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass

    def finish(self) -> list[bytes]:
        """Wait for every proxied connection to end; return the recorded streams."""
        for pump in self._pumps:
            pump.join(PROXY_TIMEOUT)
        self._pumps.clear()
        return [bytes(stream) for stream in self.streams]

    def close(self) -> None:
        """Stop accepting."""
        self.listener.close()
        self._accepting.join(PROXY_TIMEOUT)


def _pika(port: int, **parameters: object) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, **parameters))  # type: ignore[arg-type]


#: Header values of every type pika encodes: S, x, t, I, l, D, T, F, A, V.
PIKA_HEADERS = {
    "string": "naïve ünïcode",
    "bytes": b"\x00\x01\xfe\xff",
    "true": True,
    "int": 42,
    "negative": -7,
    "long": 2**40,
    "decimal": decimal.Decimal("3.14"),
    "timestamp": datetime.datetime(2026, 11, 22, 12, 0, 0),
    "table": {"nested": {"deeper": [1, "two", None]}},
    "array": [1, "a", True, {"k": "v"}, [2, 3]],
    "void": None,
}


def pika_topology(port: int) -> None:
    """Exchanges of every type, queues with arguments, bindings (headers too), then teardown."""
    connection = _pika(port, heartbeat=0)
    channel = connection.channel()
    channel.exchange_declare("fz.direct", "direct")
    channel.exchange_declare("fz.topic", "topic", arguments={"alternate-exchange": "fz.fanout"})
    channel.exchange_declare("fz.fanout", "fanout", auto_delete=True)
    channel.exchange_declare("fz.headers", "headers")
    channel.exchange_bind("fz.fanout", "fz.direct", "e2e")
    channel.queue_declare(
        "fz.topo",
        arguments={**QUEUE_BOUND, "x-message-ttl": 60000, "x-dead-letter-exchange": "fz.direct", "x-max-priority": 5},
    )
    channel.queue_bind("fz.topo", "fz.topic", "a.*.c.#")
    channel.queue_bind("fz.topo", "fz.headers", "", arguments={"x-match": "any", "kind": "a", "level": 3})
    channel.queue_bind("fz.topo", "fz.fanout")
    channel.basic_publish("fz.topic", "a.b.c.d", b"topic", pika.BasicProperties(priority=3))
    channel.basic_publish("fz.headers", "", b"headers", pika.BasicProperties(headers={"kind": "a", "level": 3}))
    channel.queue_unbind("fz.topo", "fz.topic", "a.*.c.#")
    channel.exchange_unbind("fz.fanout", "fz.direct", "e2e")
    channel.queue_purge("fz.topo")
    channel.exchange_delete("fz.headers")
    connection.close()


def pika_confirms(port: int) -> None:
    """Publisher confirms with headers of every type pika encodes, persistent and not."""
    connection = _pika(port, heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("fz.confirm", durable=True, arguments=QUEUE_BOUND)
    channel.confirm_delivery()
    channel.basic_publish(
        "",
        "fz.confirm",
        b"all the types",
        pika.BasicProperties(
            content_type="text/plain",
            content_encoding="utf-8",
            headers=PIKA_HEADERS,
            delivery_mode=2,
            priority=1,
            correlation_id="corr",
            reply_to="fz.reply",
            expiration="60000",
            message_id="m-1",
            timestamp=1700000000,
            type="kind",
            user_id="guest",
            app_id="fuzz",
        ),
    )
    channel.basic_publish("", "fz.confirm", b"", pika.BasicProperties(delivery_mode=1))
    channel.basic_publish("", "fz.confirm", b"mandatory", mandatory=True)
    try:
        channel.basic_publish("", "fz.nowhere", b"unroutable", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    connection.close()


def pika_consume(port: int) -> None:
    """qos, consume, ack (single and multiple), nack with and without requeue, reject, cancel."""
    connection = _pika(port, heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("fz.work", arguments=QUEUE_BOUND)
    channel.queue_purge("fz.work")
    for number in range(8):
        channel.basic_publish("", "fz.work", b"job %d" % number, pika.BasicProperties(headers={"n": number}))
    channel.basic_qos(prefetch_count=4)
    tags = []
    for method, _properties, _body in channel.consume("fz.work", inactivity_timeout=1.0):
        if method is None:
            break
        tags.append(method.delivery_tag)
        if len(tags) == 1:
            channel.basic_ack(method.delivery_tag)
        elif len(tags) == 3:
            channel.basic_ack(method.delivery_tag, multiple=True)
        elif len(tags) == 4:
            channel.basic_nack(method.delivery_tag, requeue=True)
        elif len(tags) == 5:
            channel.basic_reject(method.delivery_tag, requeue=False)
        elif len(tags) == 6:
            channel.basic_nack(method.delivery_tag, multiple=True, requeue=False)
        if len(tags) >= 8:
            break
    channel.cancel()
    channel.basic_qos(prefetch_count=10, global_qos=True)
    channel.close()
    connection.close()


def pika_get_tx(port: int) -> None:
    """basic.get (empty and not), recover, transactions committed and rolled back."""
    connection = _pika(port, heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("fz.get", arguments=QUEUE_BOUND)
    channel.basic_get("fz.get")
    channel.basic_publish("", "fz.get", b"one")
    method, _properties, _body = channel.basic_get("fz.get")
    if method is not None:
        channel.basic_reject(method.delivery_tag, requeue=True)
    channel.basic_recover(requeue=True)
    channel.tx_select()
    channel.basic_publish("", "fz.get", b"committed")
    channel.tx_commit()
    channel.basic_publish("", "fz.get", b"rolled back")
    channel.tx_rollback()
    method, _properties, _body = channel.basic_get("fz.get", auto_ack=False)
    if method is not None:
        channel.basic_ack(method.delivery_tag)
        channel.tx_commit()
    connection.close()


def pika_errors(port: int) -> None:
    """Channel errors a client recovers from: 404 on a passive declare, 406 on a redeclare, 403."""
    connection = _pika(port, heartbeat=0)
    for attempt in (
        lambda channel: channel.queue_declare("fz.absent", passive=True),
        lambda channel: (
            channel.queue_declare("fz.args", arguments={"x-max-length": 1}),
            channel.queue_declare("fz.args", arguments={"x-max-length": 2}),
        ),
        lambda channel: channel.exchange_declare("amq.fz", "direct"),
        lambda channel: channel.basic_get("fz.absent"),
    ):
        channel = connection.channel()
        try:
            attempt(channel)
        except pika.exceptions.ChannelClosedByBroker:
            pass
    channel = connection.channel()
    channel.queue_delete("fz.args")
    connection.close()


def pika_exclusive_large(port: int) -> None:
    """Exclusive server-named queue, a small frame_max and a body split over several frames."""
    connection = _pika(port, heartbeat=0, frame_max=4096, channel_max=16)
    channel = connection.channel()
    result = channel.queue_declare("", exclusive=True, arguments=QUEUE_BOUND)
    queue = result.method.queue
    channel.queue_declare("fz.excl", exclusive=True, auto_delete=True, arguments=QUEUE_BOUND)
    channel.basic_publish("", queue, bytes(range(256)) * 24)
    channel.basic_publish("", "fz.excl", b"x")
    second = connection.channel()
    second.basic_get("fz.excl", auto_ack=True)
    second.close()
    channel.queue_delete("fz.excl")
    connection.close()


def _amqp(port: int, **options: object) -> amqp.Connection:
    connection = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest", **options)  # type: ignore[arg-type]
    connection.connect()
    return connection


#: Header values of the types py-amqp adds: float (d), nested lists and dicts, big ints.
AMQP_HEADERS = {
    "float": 2.5,
    "int": 7,
    "big": 2**62,
    "text": "py-amqp",
    "list": [1, 2.0, "three", [4], {"five": 5}],
    "map": {"a": {"b": {"c": True}}},
    "when": datetime.datetime(2026, 1, 2, 3, 4, 5),
    "dec": decimal.Decimal("1.5"),
}


def amqp_publish(port: int) -> None:
    """py-amqp with AMQPLAIN: confirms, headers of its types, a heartbeat frame, basic.get."""
    connection = _amqp(port, login_method="AMQPLAIN", heartbeat=0, confirm_publish=True)
    channel = connection.channel()
    channel.exchange_declare("fz.amqp", "direct", durable=False, auto_delete=False)
    channel.queue_declare("fz.amqp.q", durable=False, auto_delete=False, arguments=QUEUE_BOUND)
    channel.queue_bind("fz.amqp.q", "fz.amqp", "k")
    channel.basic_publish(
        amqp.Message(b"py-amqp body", application_headers=AMQP_HEADERS, delivery_mode=2, content_type="x/y"),
        exchange="fz.amqp",
        routing_key="k",
    )
    connection.send_heartbeat()
    message = channel.basic_get("fz.amqp.q")
    if message is not None:
        channel.basic_ack(message.delivery_tag)
    channel.close()
    connection.close()


def amqp_consume(port: int) -> None:
    """py-amqp with PLAIN: qos, consume, reject with requeue, recover, cancel, tx."""
    connection = _amqp(port, login_method="PLAIN", heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("fz.amqp.c", durable=False, auto_delete=True, arguments=QUEUE_BOUND)
    for number in range(3):
        channel.basic_publish(amqp.Message(b"c%d" % number), routing_key="fz.amqp.c")
    channel.basic_qos(prefetch_size=0, prefetch_count=2, a_global=False)
    seen: list[int] = []

    def on_message(message: amqp.Message) -> None:
        seen.append(message.delivery_tag)
        if len(seen) == 1:
            channel.basic_reject(message.delivery_tag, requeue=True)
        else:
            channel.basic_ack(message.delivery_tag)

    tag = channel.basic_consume("fz.amqp.c", callback=on_message)
    for _ in range(4):
        try:
            connection.drain_events(timeout=0.3)
        except socket.timeout:
            break
    channel.basic_cancel(tag)
    channel.basic_recover(requeue=True)
    channel.tx_select()
    channel.basic_publish(amqp.Message(b"tx"), routing_key="fz.amqp.c")
    channel.tx_rollback()
    channel.close()
    connection.close()


#: Every scenario, by the corpus file name it records to.
SCENARIOS: dict[str, Callable[[int], None]] = {
    "pika-topology": pika_topology,
    "pika-confirms": pika_confirms,
    "pika-consume": pika_consume,
    "pika-get-tx": pika_get_tx,
    "pika-errors": pika_errors,
    "pika-exclusive-large": pika_exclusive_large,
    "amqp-publish": amqp_publish,
    "amqp-consume": amqp_consume,
}


def record(port: int, directory: Path = CORPUS_DIR) -> list[Path]:
    """Run every scenario through a :class:`RecordingProxy` to ``port``; write the sessions.

    :raises RuntimeError: a scenario did not open exactly one connection
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, scenario in SCENARIOS.items():
        proxy = RecordingProxy(port)
        try:
            scenario(proxy.port)
            streams = proxy.finish()
        finally:
            proxy.close()
        if len(streams) != 1:
            raise RuntimeError(f"scenario {name} opened {len(streams)} connections, not 1")
        split_session(streams[0])  # must be a whole, frame-aligned session
        path = directory / f"{name}{SUFFIX}"
        path.write_bytes(streams[0])
        written.append(path)
    return written

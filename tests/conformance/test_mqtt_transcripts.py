"""MQTT 3.1.1, packet for packet, against RabbitMQ 3.10.8 with ``rabbitmq_mqtt``, and against
Mosquitto 2.0 (Debian's ``mosquitto``) where RabbitMQ departs from the specification.

Each scenario sends the same packets to Postroom (a ``postroom serve`` process with
``listen.mqtt``) and to its reference, and records every packet that comes back (decoded to
its fields) and whether the socket was closed. Topics carry a prefix of their own per run (shown
as ``<p>``), packet identifiers the server chose are shown as ``id`` (their values are the
server's to pick). The scenarios whose reference is Mosquitto are the differences from
RabbitMQ listed in ``docs/mqtt.md``; each names the rule of the specification it follows.
"""

from __future__ import annotations

import base64
import http.server
import json
import socket
import struct
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pika
import pytest
from transcript import field_paths, oracle

from postroom.broker.tools.testing import MosquittoMissing, free_port, mosquitto_broker, wait_for_port
from tests.integration.test_crash import broker
from tests.integration.test_mqtt_browser import bundle
from tests.integration.test_web_ui import browser

__all__ = ["browser", "bundle"]  # (fixtures: Chromium, and MQTT.js's browser bundle)

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(600)]

#: Seconds without a byte after which an answer is taken as whole.
SETTLE = 0.3


@dataclass(frozen=True)
class Ports:
    postroom: int
    postroom_amqp: int
    rabbitmq: int
    rabbitmq_amqp: int
    mosquitto: int
    postroom_http: int
    rabbitmq_http: int
    #: MQTT over WebSockets (``rabbitmq_web_mqtt`` on RabbitMQ, at ``/ws``).
    postroom_ws: int
    rabbitmq_ws: int
    mosquitto_ws: int


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    """The MQTT ports of a Postroom process, a RabbitMQ node and a Mosquitto, and the two AMQP ones."""
    rabbit_mqtt, mqtt, rabbit_http, http = free_port(), free_port(), free_port(), free_port()
    rabbit_ws, ws, mosquitto_ws = free_port(), free_port(), free_port()
    directory = tmp_path_factory.mktemp("mqtt")
    try:
        mosquitto = mosquitto_broker(f"listener {mosquitto_ws} 127.0.0.1\nprotocol websockets\n")
        mosquitto_port = mosquitto.__enter__()
    except MosquittoMissing as missing:
        pytest.skip(f"no Mosquitto to compare with: {missing}")
    try:
        with (
            oracle(
                f"mqtt.listeners.tcp.1 = 127.0.0.1:{rabbit_mqtt}\n"
                f"management.tcp.port = {rabbit_http}\nmanagement.tcp.ip = 127.0.0.1\n"
                f"web_mqtt.tcp.port = {rabbit_ws}\nweb_mqtt.tcp.ip = 127.0.0.1\n",
                ["rabbitmq_mqtt", "rabbitmq_management", "rabbitmq_web_mqtt"],
                also=[rabbit_mqtt, rabbit_http, rabbit_ws],
            ) as amqp,
            broker(directory / "data", mqtt=mqtt, management=http, mqtt_ws=ws) as (_process, postroom_amqp),
        ):
            wait_for_port(mqtt, 30)
            yield Ports(
                mqtt, postroom_amqp, rabbit_mqtt, amqp, mosquitto_port, http, rabbit_http, ws, rabbit_ws, mosquitto_ws
            )
    finally:
        mosquitto.__exit__(None, None, None)
    assert "Traceback" not in (directory / "broker.log").read_text()


# -- a client that sends what it is told, and reads what comes back ---------------------------


def _length(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _length(len(body)) + body


def text(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack(">H", len(data)) + data


def connect(
    client_id: str,
    clean: bool = True,
    keep_alive: int = 60,
    will: tuple[str, bytes, int, bool] | None = None,
    username: str | None = None,
    password: str | None = None,
    level: int = 4,
    name: str = "MQTT",
) -> bytes:
    flags = 0x02 if clean else 0
    payload = text(client_id)
    if will is not None:
        topic, message, qos, retain = will
        flags |= 0x04 | qos << 3 | (0x20 if retain else 0)
        payload += text(topic) + text(message)
    if username is not None:
        flags |= 0x80
        payload += text(username)
    if password is not None:
        flags |= 0x40
        payload += text(password)
    return packet(0x10, text(name) + bytes([level, flags]) + struct.pack(">H", keep_alive) + payload)


def publish(
    topic: str, payload: bytes, qos: int = 0, packet_id: int = 0, retain: bool = False, dup: bool = False
) -> bytes:
    first = 0x30 | dup << 3 | qos << 1 | retain
    return packet(first, text(topic) + (struct.pack(">H", packet_id) if qos else b"") + payload)


def subscribe(packet_id: int, *filters: tuple[str, int]) -> bytes:
    return packet(0x82, struct.pack(">H", packet_id) + b"".join(text(f) + bytes([qos]) for f, qos in filters))


def unsubscribe(packet_id: int, *filters: str) -> bytes:
    return packet(0xA2, struct.pack(">H", packet_id) + b"".join(text(f) for f in filters))


def ack(kind: int, packet_id: int) -> bytes:
    """PUBACK (4), PUBREC (5), PUBREL (6) or PUBCOMP (7)."""
    return packet(kind << 4 | (0x02 if kind == 6 else 0), struct.pack(">H", packet_id))


PINGREQ = packet(0xC0, b"")
DISCONNECT = packet(0xE0, b"")
NAMES = {2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP", 9: "SUBACK"}
NAMES |= {11: "UNSUBACK", 13: "PINGRESP"}


@dataclass
class Received:
    kind: str
    fields: dict[str, Any]

    def line(self, prefix: str) -> str:
        shown = {k: v for k, v in self.fields.items() if k != "packet_id"}
        if "packet_id" in self.fields and self.kind == "PUBLISH":
            shown["id"] = self.fields["packet_id"] is not None
        if "topic" in shown:
            shown["topic"] = shown["topic"].replace(prefix, "<p>")
        return f"{self.kind} " + " ".join(f"{k}={v!r}" for k, v in shown.items())


class Wire:
    """One client socket; what it read is decoded into :class:`Received` packets."""

    def __init__(self, port: int, prefix: str, log: list[str], name: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buffer = b""
        self.closed = False
        self.prefix = prefix
        self.log = log
        self.name = name

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def read(self, settle: float = SETTLE, until: float = 0.0) -> list[Received]:
        """What comes until nothing more for ``settle`` seconds (and at least ``until`` seconds
        passed), or the socket closes; logged as lines."""
        started = time.monotonic()
        self.sock.settimeout(settle)
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                if time.monotonic() - started >= until:
                    break
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            self.buffer += data
        found = []
        while True:
            item = self._cut()
            if item is None:
                break
            found.append(item)
        self.log += [f"{self.name}: {item.line(self.prefix)}" for item in found]
        if self.closed:
            self.log.append(f"{self.name}: closed")
        return found

    def _cut(self) -> Received | None:
        data = self.buffer
        if len(data) < 2:
            return None
        length, shift, at = 0, 0, 1
        while True:
            if at >= len(data):
                return None
            byte = data[at]
            length |= (byte & 0x7F) << shift
            shift += 7
            at += 1
            if not byte & 0x80:
                break
        if len(data) < at + length:
            return None
        first, body = data[0], data[at : at + length]
        self.buffer = data[at + length :]
        kind = first >> 4
        name = NAMES.get(kind, f"type{kind}")
        if kind == 2:
            return Received(name, {"present": body[0], "code": body[1]})
        if kind == 3:
            qos = first >> 1 & 3
            size = struct.unpack_from(">H", body)[0]
            topic = body[2 : 2 + size].decode()
            rest = body[2 + size :]
            packet_id = struct.unpack_from(">H", rest)[0] if qos else None
            fields = {"topic": topic, "qos": qos, "retain": first & 1, "dup": first >> 3 & 1}
            return Received(name, fields | {"payload": rest[2:] if qos else rest, "packet_id": packet_id})
        if kind == 9:
            return Received(name, {"codes": list(body[2:])})
        if kind in (4, 5, 6, 7):
            return Received(name, {"packet_id": struct.unpack(">H", body)[0]})
        return Received(name, {})

    def close(self) -> None:
        self.sock.close()


Scenario = Callable[[Callable[[str], Wire], str], None]


def run(port: int, scenario: Scenario) -> list[str]:
    """Run ``scenario`` against the MQTT broker on ``port``: the lines of what came back."""
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    log: list[str] = []
    wires: list[Wire] = []

    def open_wire(name: str) -> Wire:
        wire = Wire(port, prefix, log, name)
        wires.append(wire)
        return wire

    try:
        scenario(open_wire, prefix)
    finally:
        for wire in wires:
            wire.close()
    return log


def answer(wire: Wire, received: list[Received]) -> None:
    """Acknowledge what ``received`` asks for: PUBACK a QoS 1 PUBLISH, PUBREC a QoS 2 one,
    PUBCOMP a PUBREL."""
    for item in received:
        if item.kind == "PUBLISH" and item.fields["qos"]:
            wire.send(ack(4 if item.fields["qos"] == 1 else 5, item.fields["packet_id"]))
        elif item.kind == "PUBREL":
            wire.send(ack(7, item.fields["packet_id"]))


def client(open_wire: Callable[[str], Wire], name: str, prefix: str, **options: Any) -> Wire:
    """A wire named ``name``, connected (client id ``<prefix>-<name>``) and its CONNACK read."""
    wire = open_wire(name)
    wire.send(connect(f"{prefix}-{name}", **options))
    wire.read()
    return wire


def subscriber(open_wire: Callable[[str], Wire], name: str, prefix: str, *filters: tuple[str, int]) -> Wire:
    """:func:`client`, subscribed to ``filters`` and its SUBACK read."""
    wire = client(open_wire, name, prefix)
    wire.send(subscribe(1, *filters))
    wire.read()
    return wire


# -- the scenarios ----------------------------------------------------------------------------


def connect_and_ping(open_wire: Callable[[str], Wire], prefix: str) -> None:
    a = client(open_wire, "a", prefix)
    a.send(PINGREQ)
    a.read()
    a.send(DISCONNECT)
    a.read()


def refusals(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """An empty client id for a persistent session (CONNACK 2), a user name without a
    password, a wrong password and a vhost that does not exist (CONNACK 4)."""
    for name, data in [
        ("empty-id", connect("", clean=False)),
        ("no-password", connect(prefix + "-p", username="guest")),
        ("wrong-password", connect(prefix + "-w", username="guest", password="nope")),
        ("no-vhost", connect(prefix + "-v", username="nowhere:guest", password="guest")),
    ]:
        wire = open_wire(name)
        wire.send(data)
        wire.read()


def protocol_errors(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """Packets that end the connection: not CONNECT first, QoS 3, a reserved flag."""
    first = open_wire("not-connect-first")
    first.send(PINGREQ)
    first.read()
    qos3 = open_wire("qos3")
    qos3.send(connect(prefix + "-q"))
    qos3.read()
    qos3.send(packet(0x36, text(prefix) + b"\x00\x01x"))
    qos3.read()
    reserved = open_wire("subscribe-flags")
    reserved.send(connect(prefix + "-r"))
    reserved.read()
    reserved.send(packet(0x80, struct.pack(">H", 1) + text(prefix) + b"\x00"))
    reserved.read()


def qos0_and_qos1(open_wire: Callable[[str], Wire], prefix: str) -> None:
    sub = subscriber(open_wire, "sub", prefix, (prefix + "/+/t", 1), (prefix + "/zero", 0))
    pub = client(open_wire, "pub", prefix)
    pub.send(publish(prefix + "/zero", b"z"))
    pub.send(publish(prefix + "/a/t", b"one", 1, 7))
    pub.read()
    answer(sub, sub.read())
    pub.send(publish(prefix + "/b/t", b"zero-at-qos1", 0))
    pub.read()
    sub.read()
    sub.send(unsubscribe(2, prefix + "/+/t"))
    sub.read()
    pub.send(publish(prefix + "/a/t", b"after", 1, 8))
    pub.read()
    sub.read()


def qos1_redelivered(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """A persistent session's unacknowledged QoS 1 delivery comes again, DUP set, with the
    session found again (CONNACK present)."""
    sub = open_wire("sub")
    sub.send(connect(prefix + "-sub", clean=False))
    sub.read()
    sub.send(subscribe(1, (prefix + "/jobs", 1)))
    sub.read()
    pub = client(open_wire, "pub", prefix)
    pub.send(publish(prefix + "/jobs", b"job", 1, 1))
    pub.read()
    sub.read()
    sub.close()
    time.sleep(0.3)
    back = open_wire("back")
    back.send(connect(prefix + "-sub", clean=False))
    answer(back, back.read())
    back.send(DISCONNECT)
    back.read()
    clean = open_wire("clean")
    clean.send(connect(prefix + "-sub", clean=True))
    clean.read()


def retained_exact(open_wire: Callable[[str], Wire], prefix: str) -> None:
    pub = client(open_wire, "pub", prefix)
    pub.send(publish(prefix + "/light", b"on", 1, 1, retain=True))
    pub.read()
    sub = subscriber(open_wire, "sub", prefix, (prefix + "/light", 0))
    pub.send(publish(prefix + "/light", b"", 0, retain=True))
    pub.read()
    sub.read()
    subscriber(open_wire, "late", prefix, (prefix + "/light", 1))


def will_on_drop(open_wire: Callable[[str], Wire], prefix: str) -> None:
    watcher = open_wire("watcher")
    watcher.send(connect(prefix + "-w"))
    watcher.read()
    watcher.send(subscribe(1, (prefix + "/status/#", 0)))
    watcher.read()
    polite = open_wire("polite")
    polite.send(connect(prefix + "-polite", will=(prefix + "/status/polite", b"gone", 0, False)))
    polite.read()
    polite.send(DISCONNECT)
    polite.read()
    rude = open_wire("rude")
    rude.send(connect(prefix + "-rude", will=(prefix + "/status/rude", b"gone", 0, False)))
    rude.read()
    rude.close()
    watcher.read()


def takeover(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """A second connection with the client id ends the first [MQTT-3.1.4-2], and the first's
    will is published: it did not send DISCONNECT [MQTT-3.1.2-10] (RabbitMQ 3.10 drops it)."""
    watcher = open_wire("watcher")
    watcher.send(connect(prefix + "-w"))
    watcher.read()
    watcher.send(subscribe(1, (prefix + "/will", 0)))
    watcher.read()
    first = open_wire("first")
    first.send(connect(prefix + "-id", will=(prefix + "/will", b"first", 0, False)))
    first.read()
    second = open_wire("second")
    second.send(connect(prefix + "-id"))
    second.read()
    first.read()
    second.send(PINGREQ)
    second.read()
    watcher.read()


def amqp_interplay(amqp_port: int) -> Scenario:
    """What an MQTT publish is to an AMQP consumer, and an AMQP publish to an MQTT subscriber."""

    def scenario(open_wire: Callable[[str], Wire], prefix: str) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F"))
        try:
            channel = connection.channel()
            channel.queue_declare(prefix, auto_delete=True)
            channel.queue_bind(prefix, "amq.topic", prefix + ".#")
            pub = open_wire("pub")
            pub.send(connect(prefix + "-pub"))
            pub.read()
            for qos in (0, 1):
                pub.send(publish(prefix + "/a/b", b"q%d" % qos, qos, 3 if qos else 0))
                pub.read()
            log = pub.log
            for _ in range(2):
                method, properties, body = channel.basic_get(prefix, auto_ack=True)
                log.append(f"amqp: {method.routing_key.replace(prefix, '<p>')} {body!r} {properties}")
            sub = open_wire("sub")
            sub.send(connect(prefix + "-sub"))
            sub.read()
            sub.send(subscribe(1, (prefix + "/from/#", 1)))
            sub.read()
            channel.basic_publish("amq.topic", prefix + ".from.amqp", b"transient")
            persistent = pika.BasicProperties(delivery_mode=2)
            channel.basic_publish("amq.topic", prefix + ".from.amqp", b"persistent", persistent)
            sub.read()
        finally:
            connection.close()

    return scenario


# -- where RabbitMQ 3.10 departs from the specification: Mosquitto is the reference ----------


def qos2_both_ways(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """QoS 2 granted, and a QoS 2 publish completed with PUBREC, PUBREL, PUBCOMP [MQTT-4.3.3];
    a PUBLISH sent again before PUBREL is not delivered twice [MQTT-4.3.3-2]."""
    sub = subscriber(open_wire, "sub", prefix, (prefix + "/x", 2))
    pub = client(open_wire, "pub", prefix)
    pub.send(publish(prefix + "/x", b"once", 2, 9))
    pub.read()
    pub.send(publish(prefix + "/x", b"once", 2, 9, dup=True))
    pub.read()
    pub.send(ack(6, 9))
    pub.read()
    answer(sub, sub.read())
    answer(sub, sub.read())
    sub.read()


def retained_wildcard(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """Retained messages go to new wildcard subscriptions too [MQTT-3.3.1-6]."""
    pub = client(open_wire, "pub", prefix)
    pub.send(publish(prefix + "/kitchen/light", b"on", 0, retain=True))
    pub.send(publish(prefix + "/hall/light", b"off", 0, retain=True))
    pub.read()
    subscriber(open_wire, "sub", prefix, (prefix + "/kitchen/+", 0))
    for topic in ("/kitchen/light", "/hall/light"):
        pub.send(publish(prefix + topic, b"", 0, retain=True))
    pub.read()


def dollar_topics(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """A filter that starts with a wildcard does not match a topic that starts with ``$``
    [MQTT-4.7.2-1]."""
    sub = subscriber(open_wire, "sub", prefix, ("+/" + prefix, 0))
    pub = client(open_wire, "pub", prefix)
    pub.send(publish("$x/" + prefix, b"dollar", 0))
    pub.send(publish("y/" + prefix, b"plain", 0))
    pub.read()
    sub.read()


def keep_alive(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """A client silent past its keep-alive (1 s) is disconnected, and its will published
    [MQTT-3.1.2-24]. When: one and a half times the keep-alive, as the specification says,
    is checked on a clock in ``tests/broker/test_mqtt_connection.py``; RabbitMQ 3.10 takes
    about three times, Mosquitto 2.0 about five seconds whatever the keep-alive."""
    watcher = open_wire("watcher")
    watcher.send(connect(prefix + "-w"))
    watcher.read()
    watcher.send(subscribe(1, (prefix + "/will", 0)))
    watcher.read()
    silent = open_wire("silent")
    silent.send(connect(prefix + "-s", keep_alive=1, will=(prefix + "/will", b"timed out", 0, False)))
    silent.read()
    silent.read(settle=8.0)
    watcher.read()


def unsupported_level(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """A protocol level the server does not serve is answered with CONNACK 1, then the
    connection ends [MQTT-3.1.2-2] (RabbitMQ 3.10 ends it without a word)."""
    wire = open_wire("level")
    wire.send(connect(prefix, level=6))
    wire.read()


def second_connect(open_wire: Callable[[str], Wire], prefix: str) -> None:
    """A second CONNECT is a protocol violation: the connection ends [MQTT-3.1.0-2]."""
    a = client(open_wire, "a", prefix)
    a.send(connect(prefix + "-a"))
    a.read()


RABBITMQ_SCENARIOS: dict[str, Scenario] = {
    "connect_and_ping": connect_and_ping,
    "refusals": refusals,
    "protocol_errors": protocol_errors,
    "qos0_and_qos1": qos0_and_qos1,
    "qos1_redelivered": qos1_redelivered,
    "retained_exact": retained_exact,
    "will_on_drop": will_on_drop,
    "keep_alive": keep_alive,
}

MOSQUITTO_SCENARIOS: dict[str, Scenario] = {
    "qos2_both_ways": qos2_both_ways,
    "retained_wildcard": retained_wildcard,
    "dollar_topics": dollar_topics,
    "unsupported_level": unsupported_level,
    "second_connect": second_connect,
    "takeover": takeover,
}


@pytest.mark.parametrize("name", list(RABBITMQ_SCENARIOS))
def test_as_rabbitmq(ports: Ports, name: str) -> None:
    scenario = RABBITMQ_SCENARIOS[name]
    expected = run(ports.rabbitmq, scenario)
    assert run(ports.postroom, scenario) == expected


def test_amqp_interplay_as_rabbitmq(ports: Ports) -> None:
    expected = run(ports.rabbitmq, amqp_interplay(ports.rabbitmq_amqp))
    assert run(ports.postroom, amqp_interplay(ports.postroom_amqp)) == expected


@pytest.mark.parametrize("name", list(MOSQUITTO_SCENARIOS))
def test_as_mosquitto_where_rabbitmq_departs(ports: Ports, name: str) -> None:
    scenario = MOSQUITTO_SCENARIOS[name]
    reference = run(ports.mosquitto, scenario)
    assert run(ports.postroom, scenario) == reference
    # The departure is real: RabbitMQ 3.10 answers otherwise.
    assert run(ports.rabbitmq, scenario) != reference


def mqtt_connection_object(http: int, mqtt: int, prefix: str) -> dict[str, Any]:
    """``/api/connections``' object for an MQTT client connected to ``mqtt``, as guest."""
    log: list[str] = []
    wire = Wire(mqtt, prefix, log, "c")
    try:
        wire.send(connect(prefix + "-dev", keep_alive=30, username="guest", password="guest"))
        wire.read()
        credentials = base64.b64encode(b"guest:guest").decode()
        deadline = time.monotonic() + 15
        while True:  # (RabbitMQ shows a connection's byte counts once its stats are emitted: up to 5 s)
            request = urllib.request.Request(
                f"http://127.0.0.1:{http}/api/connections", headers={"Authorization": f"Basic {credentials}"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                listed = json.load(response)
            found = [c for c in listed if c.get("client_properties", {}).get("client_id") == prefix + "-dev"]
            if (found and "recv_oct" in found[0]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert found, "the MQTT connection is not listed"
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/api/overview", headers={"Authorization": f"Basic {credentials}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            totals = json.load(response)["object_totals"]
        assert totals["connections"] == len(listed)  # (MQTT's counted, as RabbitMQ counts them)
        return found[0]
    finally:
        wire.close()


def test_the_management_api_lists_an_mqtt_connection_as_rabbitmq_does(ports: Ports) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    expected = mqtt_connection_object(ports.rabbitmq_http, ports.rabbitmq, prefix)
    actual = mqtt_connection_object(ports.postroom_http, ports.postroom, prefix)
    # Erlang's own (the process's garbage collection and reductions) are RabbitMQ's alone.
    erlang = {"garbage_collection", "reductions", "reductions_details"}
    assert field_paths(actual) == {path for path in field_paths(expected) if path.split(".")[0] not in erlang}
    same = ["protocol", "type", "user", "vhost", "client_properties", "variable_map", "state", "ssl", "frame_max"]
    assert {key: actual[key] for key in same} == {key: expected[key] for key in same}


# -- Debian's mosquitto-clients, unchanged ----------------------------------------------------


def tool_output(process: subprocess.Popen[str], name: str, prefix: str) -> list[str]:
    """A ``mosquitto_sub`` run to its end (killed after 15 s): its lines, then its exit status."""
    try:
        out, _ = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return [f"{name}: {line.replace(prefix, '<p>')}" for line in out.splitlines()] + [
        f"{name}: exit {process.returncode}"
    ]


def ending(
    late: subprocess.Popen[str], first: subprocess.Popen[str], watcher: subprocess.Popen[str], prefix: str
) -> list[str]:
    """What the late subscriber printed; then the first subscriber killed (no DISCONNECT: its
    will goes), and what it and the will's watcher printed."""
    printed = tool_output(late, "late", prefix)
    time.sleep(0.5)
    first.kill()
    return printed + tool_output(first, "first", prefix) + tool_output(watcher, "watcher", prefix)


def clients_session(qos: int) -> Callable[[int, str], list[str]]:
    """``mosquitto_sub`` and ``mosquitto_pub`` against the broker on ``port``: a subscriber at
    ``qos`` with a will, two publishes at ``qos`` (one retained), a late subscriber that gets
    the retained one, and the first subscriber killed: its will reaches a watcher. Each tool's
    output and exit status."""

    def session(port: int, prefix: str) -> list[str]:
        common = ["-h", "127.0.0.1", "-p", str(port)]
        lines: list[str] = []

        def sub(*arguments: str) -> subprocess.Popen[str]:
            return subprocess.Popen(["mosquitto_sub", *common, "-v", *arguments], stdout=subprocess.PIPE, text=True)

        watcher = sub("-t", f"{prefix}/will", "-C", "1", "-W", "10")
        first = sub("-t", f"{prefix}/#", "-q", str(qos), "-C", "3", "-W", "10", "--will-topic", f"{prefix}/will",
                    "--will-payload", "gone", "-i", f"{prefix}-first")  # fmt: skip
        time.sleep(1)
        for topic, message, retain in (("a", "one", False), ("r", "kept", True)):
            publisher = subprocess.run(
                ["timeout", "10", "mosquitto_pub", *common, "-t", f"{prefix}/{topic}", "-m", message,
                 "-q", str(qos), *(["-r"] if retain else [])],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            lines.append(f"pub {topic}: exit {publisher.returncode}")
        late = sub("-t", f"{prefix}/r", "-C", "1", "-W", "10", "-q", str(qos))
        lines += ending(late, first, watcher, prefix)
        subprocess.run(["mosquitto_pub", *common, "-t", f"{prefix}/r", "-r", "-n"], check=False)  # (cleared)
        return lines

    return session


def test_mosquitto_clients_at_qos1_as_rabbitmq(ports: Ports) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    session = clients_session(1)
    expected = session(ports.rabbitmq, prefix)
    assert "late: <p>/r kept" in expected
    assert session(ports.postroom, prefix) == expected


def test_mosquitto_clients_at_qos2_as_mosquitto(ports: Ports) -> None:
    """``mosquitto_pub -q 2`` waits for PUBREC: RabbitMQ 3.10 answers PUBACK (its exchange
    never completes); Postroom completes it, as Mosquitto does."""
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    session = clients_session(2)
    expected = session(ports.mosquitto, prefix)
    assert session(ports.postroom, prefix) == expected
    assert session(ports.rabbitmq, prefix) != expected


#: What ``mosquitto_sub -F`` prints of a message at MQTT 5.0: topic, payload, QoS, RETAIN,
#: content type, correlation data, response topic, payload format, user properties and
#: subscription identifiers.
FORMAT_5 = "%t %p q=%q r=%r C=%C D=%D R=%R F=%F P=%P S=%S"


def clients5_session(port: int, prefix: str) -> list[str]:
    """``mosquitto_sub -V 5`` and ``mosquitto_pub -V 5``: a subscriber with a Subscription
    Identifier and a will with properties, a publish with every property that is carried, a
    retained one, one that reaches nobody (its warning), a late subscriber, and the first
    subscriber killed. Each tool's output, warnings and exit status."""
    common = ["-h", "127.0.0.1", "-p", str(port), "-V", "5"]
    lines: list[str] = []

    def sub(*arguments: str) -> subprocess.Popen[str]:
        command = ["mosquitto_sub", *common, "-F", FORMAT_5, "-W", "10", *arguments]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def pub(name: str, topic: str, *arguments: str) -> None:
        publisher = subprocess.run(
            ["timeout", "10", "mosquitto_pub", *common, "-t", f"{prefix}/{topic}", "-q", "1", *arguments],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        said = (publisher.stdout + publisher.stderr).replace(prefix, "<p>").splitlines()
        lines.extend(f"pub {name}: {line}" for line in said)
        lines.append(f"pub {name}: exit {publisher.returncode}")

    watcher = sub("-t", f"{prefix}/will", "-C", "1")
    first = sub("-t", f"{prefix}/room/#", "-q", "1", "-C", "2", "-i", f"{prefix}-first",
                "-D", "subscribe", "subscription-identifier", "7",
                "--will-topic", f"{prefix}/will", "--will-payload", "gone", "-D", "will", "content-type",
                "text/plain", "-D", "will", "user-property", "why", "dropped")  # fmt: skip
    time.sleep(1)
    pub("a", "room/a", "-m", "one", "-D", "publish", "content-type", "text/plain",
        "-D", "publish", "user-property", "k", "v", "-D", "publish", "correlation-data", "c1",
        "-D", "publish", "response-topic", f"{prefix}/replies",
        "-D", "publish", "payload-format-indicator", "1")  # fmt: skip
    pub("r", "room/r", "-m", "kept", "-r", "-D", "publish", "content-type", "application/json")
    pub("nobody", "nobody", "-m", "x")
    lines += ending(sub("-t", f"{prefix}/room/r", "-C", "1"), first, watcher, prefix)
    subprocess.run(["mosquitto_pub", *common, "-t", f"{prefix}/room/r", "-r", "-n"], check=False)  # (cleared)
    return lines


def test_mosquitto_clients_at_mqtt5_as_mosquitto(ports: Ports) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    expected = clients5_session(ports.mosquitto, prefix)
    assert "late: <p>/room/r kept q=0 r=1 C=application/json D= R= F= P= S=" in expected
    assert clients5_session(ports.postroom, prefix) == expected


# -- paho-mqtt, unchanged -----------------------------------------------------------------------


def paho_session(qos: int) -> Callable[[int, str], list[str]]:
    """paho-mqtt 2.2 (MQTT 3.1.1) against the broker on ``port``: what a subscriber at ``qos``
    receives of two publishes at ``qos`` (one retained), whether each publish completed, what a
    late subscriber gets, and the will of a client whose socket drops."""

    def session(port: int, prefix: str) -> list[str]:
        import paho.mqtt.client as paho

        lines: list[str] = []
        clients: list[paho.Client] = []

        def client(name: str, **will: Any) -> tuple[paho.Client, list[str]]:
            raw = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-{name}", protocol=paho.MQTTv311)
            got: list[str] = []
            raw.on_message = lambda _c, _u, m: got.append(
                f"{name}: {m.topic.replace(prefix, '<p>')} {m.payload!r} qos={m.qos} retain={int(m.retain)}"
            )
            if will:
                raw.will_set(**will)
            raw.connect("127.0.0.1", port)
            raw.loop_start()
            clients.append(raw)
            return raw, got

        try:
            watcher, watched = client("watcher")
            watcher.subscribe(f"{prefix}/will", 1)
            first, heard = client("first", topic=f"{prefix}/will", payload=b"gone", qos=1)
            first.subscribe(f"{prefix}/#", qos)
            time.sleep(0.5)
            publisher, _ = client("publisher")
            for topic, message, retain in (("a", b"one", False), ("r", b"kept", True)):
                info = publisher.publish(f"{prefix}/{topic}", message, qos, retain)
                info.wait_for_publish(3)
                lines.append(f"publish {topic}: completed={info.is_published()}")
            late, kept = client("late")
            late.subscribe(f"{prefix}/r", qos)
            time.sleep(1)
            first.loop_stop()
            first.socket().close()  # (no DISCONNECT: the will)
            time.sleep(1)
            lines += sorted(heard) + kept + watched  # (read before the clearing publish below reaches "late")
            publisher.publish(f"{prefix}/r", b"", 0, True)  # (cleared)
        finally:
            for raw in clients:
                raw.loop_stop()
                raw.disconnect()
        return lines

    return session


def test_paho_at_qos1_as_rabbitmq(ports: Ports) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    expected = paho_session(1)(ports.rabbitmq, prefix)
    assert "publish a: completed=True" in expected
    assert paho_session(1)(ports.postroom, prefix) == expected


def test_paho_at_qos2_as_mosquitto(ports: Ports) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    expected = paho_session(2)(ports.mosquitto, prefix)
    assert paho_session(2)(ports.postroom, prefix) == expected
    assert paho_session(2)(ports.rabbitmq, prefix) != expected


# -- MQTT.js in Chromium, over WebSockets ------------------------------------------------------

BROWSER_PAGE = """<!doctype html><html><body><script src="mqtt.min.js"></script><script>
const query = new URLSearchParams(location.search);
const prefix = query.get("prefix"), qos = Number(query.get("qos"));
window.received = []; window.state = "connecting"; window.granted = null;
window.client = mqtt.connect(query.get("url"), {
  protocolVersion: 4, clientId: prefix + "-browser", clean: true, reconnectPeriod: 0,
  will: {topic: prefix + "/will", payload: "gone", qos: 1, retain: false},
});
client.on("connect", () => {
  client.subscribe(prefix + "/ticker/#", {qos: qos}, (error, granted) => {
    window.granted = granted.map((g) => g.qos);
    window.state = "subscribed";
    client.publish(prefix + "/browser/hello", "from chromium", {qos: qos, retain: true}, () => {
      window.state = "published";
    });
  });
});
client.on("message", (topic, payload, packet) => {
  window.received.push([topic.replace(prefix, "<p>"), new TextDecoder().decode(payload), packet.qos]);
});
</script></body></html>"""


#: The page at MQTT 5.0: it takes topic aliases from the server (and records each PUBLISH's
#: topic as it came, before MQTT.js resolves an alias), subscribes with No Local, and
#: publishes with a content type and a user property.
BROWSER_PAGE_5 = """<!doctype html><html><body><script src="mqtt.min.js"></script><script>
const query = new URLSearchParams(location.search);
const prefix = query.get("prefix");
window.received = []; window.wire = []; window.state = "connecting"; window.granted = null;
window.client = mqtt.connect(query.get("url"), {
  protocolVersion: 5, clientId: prefix + "-browser5", clean: true, reconnectPeriod: 0,
  properties: {topicAliasMaximum: 4},
  will: {topic: prefix + "/will", payload: "gone", qos: 1, retain: false,
         properties: {contentType: "text/plain", userProperties: {why: "dropped"}}},
});
client.on("packetreceive", (packet) => {
  if (packet.cmd === "publish") window.wire.push(packet.topic === "" ? "(alias)" : "(topic)");
});
client.on("connect", () => {
  client.subscribe(prefix + "/ticker/#", {qos: 1, nl: true}, (error, granted) => {
    window.granted = granted.map((g) => g.qos);
    window.state = "subscribed";
    const properties = {contentType: "text/plain", userProperties: {from: "chromium"}};
    client.publish(prefix + "/ticker/own", "not for me", {qos: 1, properties: properties});
    client.publish(prefix + "/browser/hello", "from chromium", {qos: 1, retain: true, properties: properties},
      () => { window.state = "published"; });
  });
});
client.on("message", (topic, payload, packet) => {
  const properties = packet.properties || {};
  window.received.push([topic.replace(prefix, "<p>"), new TextDecoder().decode(payload), packet.qos,
    properties.contentType || null, properties.userProperties || null]);
});
</script></body></html>"""


@pytest.fixture(scope="module")
def browser_site(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Where the page and MQTT.js are served (its URL's start)."""
    site = tmp_path_factory.mktemp("mqtt-page")
    (site / "mqtt.min.js").write_bytes(bundle.read_bytes())
    (site / "index.html").write_text(BROWSER_PAGE)
    (site / "v5.html").write_text(BROWSER_PAGE_5)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *_a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()


def page_watcher(tcp: int, client_id: str, protocol: int, prefix: str) -> Any:
    """A paho client over TCP (``protocol``: its MQTT level), subscribed to what the page
    publishes and to its will; its loop runs (its ``on_message`` may be set after)."""
    import paho.mqtt.client as paho

    device = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    device.connect("127.0.0.1", tcp)
    device.subscribe([(f"{prefix}/browser/#", 2), (f"{prefix}/will", 1)])
    device.loop_start()
    return device


def retained_for(tcp: int, client_id: str, protocol: int, prefix: str, on_message: Callable[..., None]) -> None:
    """A late paho client subscribes to the page's retained topic for a second: what it gets
    goes to ``on_message``."""
    import paho.mqtt.client as paho

    late = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    late.on_message = on_message
    late.connect("127.0.0.1", tcp)
    late.subscribe(f"{prefix}/browser/hello", 1)
    late.loop_start()
    time.sleep(1)
    late.loop_stop()
    late.disconnect()


def browser_session(browser: Any, site: str, qos: int) -> Callable[[int, int, str], list[str]]:
    """MQTT.js in Chromium over WebSockets (port ``ws``), a paho client over TCP (``tcp``) on
    the other side: what the page was granted and received, whether its QoS ``qos`` publish
    completed, what the TCP side got of it, the page's will, and the retained message."""

    def session(ws: int, tcp: int, prefix: str) -> list[str]:
        import paho.mqtt.client as paho

        heard: list[str] = []
        device = page_watcher(tcp, f"{prefix}-device", paho.MQTTv311, prefix)
        device.on_message = lambda _c, _u, m: heard.append(f"{m.topic.replace(prefix, '<p>')} {m.payload!r} {m.qos}")
        lines: list[str] = []
        try:
            time.sleep(0.5)
            browser.get(f"{site}?url=ws://127.0.0.1:{ws}/ws&prefix={prefix}&qos={qos}")
            deadline = time.monotonic() + 10
            while browser.execute_script("return window.state") == "connecting" and time.monotonic() < deadline:
                time.sleep(0.05)
            device.publish(f"{prefix}/ticker/eur", b"1.0841", qos)
            time.sleep(2)
            lines.append(f"granted {browser.execute_script('return window.granted')}")
            lines.append(f"state {browser.execute_script('return window.state')}")
            lines.append(f"received {browser.execute_script('return window.received')}")
            browser.execute_script("window.client.stream.destroy()")  # (no DISCONNECT: the will)
            time.sleep(1.5)
            kept: list[str] = []
            retained_for(
                tcp, f"{prefix}-late", paho.MQTTv311, prefix,
                lambda _c, _u, m: kept.append(f"retained {m.payload!r} {int(m.retain)}"),
            )  # fmt: skip
            lines += heard + kept
            device.publish(f"{prefix}/browser/hello", b"", 0, True)  # (cleared)
        finally:
            device.loop_stop()
            device.disconnect()
        return lines

    return session


def test_mqttjs_over_websockets_at_qos1_as_rabbitmq(ports: Ports, browser: Any, browser_site: str) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    session = browser_session(browser, browser_site, 1)
    expected = session(ports.rabbitmq_ws, ports.rabbitmq, prefix)
    assert "state published" in expected
    assert session(ports.postroom_ws, ports.postroom, prefix) == expected


def test_mqttjs_over_websockets_at_qos2_as_mosquitto(ports: Ports, browser: Any, browser_site: str) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    session = browser_session(browser, browser_site, 2)
    expected = session(ports.mosquitto_ws, ports.mosquitto, prefix)
    assert "state published" in expected
    assert session(ports.postroom_ws, ports.postroom, prefix) == expected
    assert session(ports.rabbitmq_ws, ports.rabbitmq, prefix) != expected


# -- MQTT 5.0, paho-mqtt in its v5 mode: Mosquitto is the reference ---------------------------


def paho5_session(port: int, prefix: str) -> list[str]:
    """paho-mqtt at MQTT 5.0: properties from publisher to subscriber, PUBACK's reason code for
    a publish nobody gets, a topic alias, No Local, Retain As Published and Retain Handling,
    a session kept by its expiry interval, and the will after DISCONNECT 0x04."""
    import paho.mqtt.client as paho
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    lines: list[str] = []
    clients: list[paho.Client] = []

    def client(name: str, clean_start: bool = True, expiry: int = 0, **will: Any) -> paho.Client:
        raw = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-{name}", protocol=paho.MQTTv5)
        raw.on_message = lambda _c, _u, m: lines.append(
            f"{name} got {m.topic.replace(prefix, '<p>')} {m.payload!r} qos={m.qos} retain={int(m.retain)} "
            f"props={sorted((k, v) for k, v in m.properties.json().items() if k != 'MessageExpiryInterval')}"
        )
        raw.on_connect = lambda _c, _u, flags, code, _p: lines.append(
            f"{name} connack {code.value} present={int(flags.session_present)}"
        )
        raw.on_publish = lambda _c, _u, _mid, code, _p: lines.append(f"{name} ack {code.value}")
        if will:
            raw.will_set(**will)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = expiry
        raw.connect("127.0.0.1", port, clean_start=clean_start, properties=properties)
        raw.loop_start()
        clients.append(raw)
        time.sleep(0.3)
        return raw

    def publish(raw: paho.Client, topic: str, payload: bytes, qos: int, retain: bool = False, **values: Any) -> None:
        props = Properties(PacketTypes.PUBLISH)
        for key, value in values.items():
            setattr(props, key, value)
        raw.publish(topic, payload, qos, retain, props if values else None)
        time.sleep(0.3)

    try:
        watcher = client("watcher")
        watcher.subscribe(f"{prefix}/status/#", options=SubscribeOptions(qos=1))
        sub = client("sub")
        sub.subscribe(f"{prefix}/room/#", options=SubscribeOptions(qos=1, noLocal=True))
        other = client("other")
        other.subscribe(f"{prefix}/room/#", options=SubscribeOptions(qos=1, retainAsPublished=True))
        time.sleep(0.3)
        publish(sub, f"{prefix}/room/a", b"props", 1, ContentType="text/plain", CorrelationData=b"c1",
                ResponseTopic=f"{prefix}/replies", UserProperty=[("k", "v")])  # fmt: skip
        publish(sub, f"{prefix}/nobody", b"x", 1)
        publish(sub, f"{prefix}/room/r", b"kept", 1, retain=True)
        publish(sub, f"{prefix}/room/long", b"aliased", 1, TopicAlias=1)
        publish(sub, "", b"by alias", 1, TopicAlias=1)
        late = client("late")
        late.subscribe(f"{prefix}/room/#", options=SubscribeOptions(qos=1, retainHandling=2))
        time.sleep(0.3)
        late.unsubscribe(f"{prefix}/room/#")  # (overlapping subscriptions may each get a copy, or not)
        late.subscribe(f"{prefix}/room/+", options=SubscribeOptions(qos=1, retainHandling=1))
        time.sleep(0.5)
        keeper = client("keeper", clean_start=False, expiry=60)
        keeper.subscribe(f"{prefix}/jobs", options=SubscribeOptions(qos=1))
        time.sleep(0.3)
        keeper.disconnect()
        keeper.loop_stop()
        publish(other, f"{prefix}/jobs", b"while away", 1)
        client("keeper", clean_start=False, expiry=0)
        time.sleep(0.5)
        leaving = client("leaving", topic=f"{prefix}/status/leaving", payload=b"gone", qos=1)
        leaving.disconnect(reasoncode=paho.ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
        time.sleep(0.5)
        publish(other, f"{prefix}/room/r", b"", 0, retain=True)  # (cleared)
    finally:
        for raw in clients:
            raw.loop_stop()
            raw.disconnect()
    return lines


def test_paho_at_mqtt5_as_mosquitto(ports: Ports) -> None:
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    expected = paho5_session(ports.mosquitto, prefix)
    assert "sub ack 16" in expected  # (No matching subscribers: Mosquitto says so too)
    # Each client's callbacks run on its own thread: the lines are compared as a set of lines.
    assert sorted(paho5_session(ports.postroom, prefix)) == sorted(expected)


def browser5_session(browser: Any, site: str, ws: int, tcp: int, prefix: str) -> tuple[list[str], list[str]]:
    """MQTT.js at MQTT 5.0 in Chromium over WebSockets, paho at 5.0 over TCP on the other
    side: what the page was granted and received (three ticks on one topic, with their
    properties; not its own publish, by No Local), what paho got of the page's publish, its
    will and its retained message with their properties. And, apart, each PUBLISH the page
    got as it came: with its topic, or by a topic alias alone."""
    import paho.mqtt.client as paho
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    def heard_by(lines: list[str], name: str) -> Callable[..., None]:
        def on_message(_c: Any, _u: Any, m: Any) -> None:
            props = sorted((k, v) for k, v in m.properties.json().items() if k != "MessageExpiryInterval")
            lines.append(f"{name} {m.topic.replace(prefix, '<p>')} {m.payload!r} {m.qos} {int(m.retain)} {props}")

        return on_message

    heard: list[str] = []
    device = page_watcher(tcp, f"{prefix}-device5", paho.MQTTv5, prefix)
    device.on_message = heard_by(heard, "device")
    lines: list[str] = []
    try:
        time.sleep(0.5)
        url = site.replace("index.html", "v5.html")
        browser.get(f"{url}?url=ws://127.0.0.1:{ws}/ws&prefix={prefix}")
        deadline = time.monotonic() + 10
        while browser.execute_script("return window.state") != "published" and time.monotonic() < deadline:
            time.sleep(0.05)
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.UserProperty = [("desk", "fx")]
        for price in (b"1.0841", b"1.0842", b"1.0843"):
            device.publish(f"{prefix}/ticker/eur", price, 1, properties=props)
        time.sleep(2)
        lines.append(f"granted {browser.execute_script('return window.granted')}")
        lines.append(f"state {browser.execute_script('return window.state')}")
        lines.append(f"received {browser.execute_script('return window.received')}")
        wire = browser.execute_script("return window.wire")
        browser.execute_script("window.client.stream.destroy()")  # (no DISCONNECT: the will)
        time.sleep(1.5)
        kept: list[str] = []
        retained_for(tcp, f"{prefix}-late5", paho.MQTTv5, prefix, heard_by(kept, "late"))
        lines += sorted(heard) + kept
        device.publish(f"{prefix}/browser/hello", b"", 0, True)  # (cleared)
    finally:
        device.loop_stop()
        device.disconnect()
    return lines, wire


def test_mqttjs_at_mqtt5_over_websockets_as_mosquitto(ports: Ports, browser: Any, browser_site: str) -> None:
    """MQTT.js at 5.0 over WebSockets gets what it gets from Mosquitto 2.0. Postroom gives it
    topic aliases where Mosquitto gives none (RabbitMQ 3.13 gives them as Postroom does, see
    ``docs/rabbitmq-mqtt5.md``): the second and third tick came by their alias alone."""
    prefix = f"conformance-{uuid.uuid4().hex[:8]}"
    expected, by_mosquitto = browser5_session(browser, browser_site, ports.mosquitto_ws, ports.mosquitto, prefix)
    assert "state published" in expected and "(alias)" not in by_mosquitto
    found, by_postroom = browser5_session(browser, browser_site, ports.postroom_ws, ports.postroom, prefix)
    assert found == expected
    assert by_postroom == ["(topic)", "(alias)", "(alias)"]

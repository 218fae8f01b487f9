"""MQTT 3.1.1 with a stock client, paho-mqtt 2.2, against an in-process Postroom over loopback:
QoS 0, 1 and 2 both ways, retained messages (wildcard subscriptions too), the will, client-id
takeover, persistent sessions, logins and vhosts, and MQTT and AMQP 0-9-1 on the same
exchange. The comparisons with RabbitMQ and Mosquitto are in ``tests/conformance``."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from twisted.internet import threads

from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.mqtt.registry import MqttRegistry
from postroom.broker.server.mqttprotocol import MqttServerFactory
from postroom.config.schema import MqttConfig, Permission, TopicPermission
from tests.conftest import BROKER_PORTS, Broker

pytestmark = pytest.mark.integration

TIMEOUT = 5.0
#: CONNACK's return codes, from paho's reason codes (it shows MQTT 5.0's for every version).
RETURN_CODES = {0: 0, 132: 1, 133: 2, 136: 3, 134: 4, 135: 5}


@dataclass
class MqttBroker:
    """An in-process broker with an MQTT listener beside its AMQP one."""

    broker: Broker
    registry: MqttRegistry
    port: int
    clients: list[mqtt.Client] = field(default_factory=list)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.broker.call(fn, *args)


@pytest.fixture
def make_mqtt(make_broker: Callable[..., Broker]) -> Iterator[Callable[..., MqttBroker]]:
    made: list[tuple[MqttBroker, Any]] = []

    def make(node: Node | None = None, **settings: Any) -> MqttBroker:
        broker = make_broker(node)

        def listen() -> tuple[MqttRegistry, Any]:
            registry = MqttRegistry(broker.node, MqttConfig(**settings))
            factory = MqttServerFactory(registry, broker.factory, broker.reactor)
            return registry, broker.reactor.listenTCP(0, factory, interface="127.0.0.1")

        registry, listening = threads.blockingCallFromThread(broker.reactor, listen)
        port = listening.getHost().port
        BROKER_PORTS.add(port)
        made.append((MqttBroker(broker, registry, port), listening))
        return made[-1][0]

    yield make
    for mqtt_broker, listening in made:
        for client in mqtt_broker.clients:
            client.disconnect()  # (with its loop still running, which sends it and closes the socket)
            client.loop_stop()
            sock = client.socket()
            if sock is not None:
                sock.close()
        mqtt_broker.call(listening.stopListening)


@pytest.fixture
def server(make_mqtt: Callable[..., MqttBroker]) -> MqttBroker:
    return make_mqtt()


class Client:
    """A paho client on its own network thread, with what it received in a queue."""

    def __init__(self, server: MqttBroker, client_id: str = "", clean: bool = True, **options: Any) -> None:
        self.raw = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean, protocol=mqtt.MQTTv311
        )
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[tuple[int, bool]] = queue.Queue()
        self.subacks: queue.Queue[list[int]] = queue.Queue()
        self.disconnected = threading.Event()
        self.raw.on_message = lambda _c, _u, message: self.messages.put(message)
        self.raw.on_connect = lambda _c, _u, flags, code, _p: self.connacks.put(
            (RETURN_CODES[code.value], flags.session_present)
        )
        self.raw.on_subscribe = lambda _c, _u, _mid, codes, _p: self.subacks.put([code.value for code in codes])
        self.raw.on_disconnect = lambda *_a: self.disconnected.set()
        if "username" in options:
            self.raw.username_pw_set(options.pop("username"), options.pop("password", None))
        if "will" in options:
            self.raw.will_set(*options.pop("will"))
        self.server = server
        server.clients.append(self.raw)
        self.raw.connect("127.0.0.1", server.port, keepalive=options.pop("keepalive", 60))
        self.raw.loop_start()

    def connack(self) -> tuple[int, bool]:
        return self.connacks.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 0) -> list[int]:
        self.raw.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        info = self.raw.publish(topic, payload, qos, retain)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def receive(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=TIMEOUT)

    def nothing(self, seconds: float = 0.3) -> bool:
        try:
            message = self.messages.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected message on {message.topic}: {message.payload!r}")

    def close(self) -> None:
        self.raw.disconnect()
        self.raw.loop_stop()


def connected(server: MqttBroker, client_id: str = "", clean: bool = True, **options: Any) -> Client:
    client = Client(server, client_id, clean, **options)
    assert client.connack()[0] == 0
    return client


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_and_subscribe_at_each_qos(server: MqttBroker, qos: int) -> None:
    subscriber = connected(server, "sub")
    assert subscriber.subscribe("sensors/+/temperature", qos) == [qos]
    publisher = connected(server, "pub")
    for n in range(20):
        publisher.publish(f"sensors/{n % 3}/temperature", b"%d" % n, qos)
    received = [subscriber.receive() for _ in range(20)]
    assert [m.payload for m in received] == [b"%d" % n for n in range(20)]
    assert {m.qos for m in received} == {qos}
    assert received[4].topic == "sensors/1/temperature"
    subscriber.nothing()


def test_a_message_goes_at_the_lower_of_the_publish_and_the_subscription_qos(server: MqttBroker) -> None:
    subscriber = connected(server, "sub")
    subscriber.subscribe("a/#", 1)
    publisher = connected(server, "pub")
    publisher.publish("a/b", b"zero", 0)
    publisher.publish("a/b", b"two", 2)
    assert [(m.payload, m.qos) for m in (subscriber.receive(), subscriber.receive())] == [(b"zero", 0), (b"two", 1)]


def test_retained_messages_reach_exact_and_wildcard_subscriptions(server: MqttBroker) -> None:
    publisher = connected(server, "pub")
    publisher.publish("home/kitchen/light", b"on", 1, retain=True)
    publisher.publish("home/hall/light", b"off", 0, retain=True)
    publisher.publish("$SYS/uptime", b"5", 0, retain=True)
    exact = connected(server, "exact")
    exact.subscribe("home/kitchen/light", 1)
    message = exact.receive()
    assert (message.topic, message.payload, message.retain, message.qos) == ("home/kitchen/light", b"on", True, 1)
    wild = connected(server, "wild")
    wild.subscribe("home/+/light", 2)
    got = sorted((m.topic, m.payload, m.retain) for m in (wild.receive(), wild.receive()))
    assert got == [("home/hall/light", b"off", True), ("home/kitchen/light", b"on", True)]
    everything = connected(server, "everything")
    everything.subscribe("#", 0)
    assert len([everything.receive() for _ in range(2)]) == 2
    everything.nothing()  # $SYS/uptime is not matched by # [MQTT-4.7.2-1]
    # An empty retained message clears the topic's.
    publisher.publish("home/kitchen/light", b"", 0, retain=True)
    late = connected(server, "late")
    late.subscribe("home/kitchen/light", 0)
    late.nothing()


def test_a_retained_message_is_live_for_established_subscribers(server: MqttBroker) -> None:
    subscriber = connected(server, "sub")
    subscriber.subscribe("t", 0)
    connected(server, "pub").publish("t", b"x", 0, retain=True)
    message = subscriber.receive()
    assert (message.payload, message.retain) == (b"x", False)  # [MQTT-3.3.1-9]


def test_the_will_is_published_when_the_client_vanishes(server: MqttBroker) -> None:
    watcher = connected(server, "watcher")
    watcher.subscribe("status/#", 1)
    doomed = Client(server, "doomed", will=("status/doomed", b"gone", 1, False))
    assert doomed.connack()[0] == 0
    doomed.raw.loop_stop()
    doomed.raw.socket().close()  # no DISCONNECT
    message = watcher.receive()
    assert (message.topic, message.payload) == ("status/doomed", b"gone")


def test_no_will_after_disconnect(server: MqttBroker) -> None:
    watcher = connected(server, "watcher")
    watcher.subscribe("status/#", 1)
    polite = Client(server, "polite", will=("status/polite", b"gone", 1, False))
    assert polite.connack()[0] == 0
    polite.close()
    watcher.nothing(0.5)


def test_a_second_connection_takes_the_client_id_over(server: MqttBroker) -> None:
    first = connected(server, "device-1")
    second = connected(server, "device-1")
    assert first.disconnected.wait(TIMEOUT)
    second.subscribe("x", 0)
    connected(server, "pub").publish("x", b"1")
    assert second.receive().payload == b"1"
    assert server.call(lambda: len(server.broker.node.mqtt_connections)) == 2


def test_a_persistent_session_keeps_subscriptions_and_messages(server: MqttBroker) -> None:
    client = connected(server, "keeper", clean=False)
    client.subscribe("jobs/#", 1)
    client.close()
    publisher = connected(server, "pub")
    for n in range(5):
        publisher.publish(f"jobs/{n}", b"%d" % n, 1)
    back = Client(server, "keeper", clean=False)
    assert back.connack() == (0, True)
    assert [back.receive().payload for _ in range(5)] == [b"%d" % n for n in range(5)]
    assert "mqtt-subscription-keeperqos1" in server.broker.queue_names()
    back.close()
    # A clean session replaces it: its queue goes.
    clean = Client(server, "keeper", clean=True)
    assert clean.connack() == (0, False)
    assert "mqtt-subscription-keeperqos1" not in server.broker.queue_names()


def test_a_clean_session_leaves_nothing_behind(server: MqttBroker) -> None:
    client = connected(server, "brief")
    client.subscribe("a", 0)
    client.subscribe("b", 1)
    assert {"mqtt-subscription-briefqos0", "mqtt-subscription-briefqos1"} <= server.broker.queue_names()
    client.close()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and server.broker.queue_names():
        time.sleep(0.02)
    assert server.broker.queue_names() == set()
    assert server.call(lambda: (len(server.registry.sessions), len(server.registry.clients))) == (0, 0)


def test_logins(make_mqtt: Callable[..., MqttBroker]) -> None:
    node = Node(
        users=(
            User("guest", password="guest", loopback_only=True),
            User("ann", password="secret", permissions={"site": Permission(".*", ".*", ".*")}),
        ),
        vhost_names=("/", "site"),
    )
    server = make_mqtt(node, allow_anonymous=False)
    assert Client(server, "a").connack()[0] == 4  # no credentials, no anonymous: refused
    assert Client(server, "b", username="ann", password="wrong").connack()[0] == 4
    assert Client(server, "c", username="ann", password="secret").connack()[0] == 5  # no permission on /
    assert Client(server, "d", username="nowhere:ann", password="secret").connack()[0] == 4
    assert Client(server, "e", username="ann").connack()[0] == 4  # a user name without a password
    ann = connected(server, "f", username="site:ann", password="secret")
    ann.subscribe("t", 1)
    assert server.call(lambda: "mqtt-subscription-fqos1" in server.broker.node.vhosts["site"].queues)


def test_amqp_and_mqtt_on_the_same_exchange(server: MqttBroker) -> None:
    import pika

    amqp = pika.BlockingConnection(pika.URLParameters(server.broker.url))
    channel = amqp.channel()
    channel.queue_declare("from-mqtt")
    channel.queue_bind("from-mqtt", "amq.topic", "devices.*.state")
    subscriber = connected(server, "sub")
    subscriber.subscribe("orders/#", 1)
    channel.basic_publish("amq.topic", "orders.eu.new", b"from amqp", pika.BasicProperties(delivery_mode=2))
    message = subscriber.receive()
    assert (message.topic, message.payload, message.qos) == ("orders/eu/new", b"from amqp", 1)
    connected(server, "pub").publish("devices/7/state", b"ready", 1)
    method, properties, body = None, None, None
    deadline = time.monotonic() + TIMEOUT
    while method is None and time.monotonic() < deadline:
        method, properties, body = channel.basic_get("from-mqtt", auto_ack=True)
    assert method is not None and body == b"ready"
    assert method.routing_key == "devices.7.state"
    assert properties.delivery_mode == 2
    assert properties.headers == {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}
    amqp.close()


def test_a_malformed_packet_ends_the_connection(server: MqttBroker) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(bytes([0x30, 0x02, 0x00, 0x01]))  # PUBLISH before CONNECT
        assert sock.recv(10) == b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(bytes([0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]))  # a five-byte length
        assert sock.recv(10) == b""


@pytest.fixture
def websocket_port(server: MqttBroker) -> Iterator[int]:
    """MQTT over WebSockets (``/ws``) beside ``server``'s TCP listener, on the same registry."""
    from postroom.broker.server.websocket import WebSocketFactory

    def listen() -> Any:
        factory = MqttServerFactory(server.registry, server.broker.factory, server.broker.reactor)
        return server.broker.reactor.listenTCP(0, WebSocketFactory(factory), interface="127.0.0.1")

    listening = server.call(listen)
    BROKER_PORTS.add(listening.getHost().port)
    yield listening.getHost().port
    server.call(listening.stopListening)


def test_mqtt_over_websockets_with_paho(server: MqttBroker, websocket_port: int) -> None:
    browser = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="browser", transport="websockets", protocol=mqtt.MQTTv311
    )
    browser.ws_set_options(path="/ws")
    received: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    subscribed = threading.Event()
    browser.on_message = lambda _c, _u, message: received.put(message)
    browser.on_subscribe = lambda *_a: subscribed.set()
    browser.on_connect = lambda client, *_a: client.subscribe("ticker/#", 1)
    server.clients.append(browser)
    browser.connect("127.0.0.1", websocket_port)
    browser.loop_start()
    assert subscribed.wait(TIMEOUT)
    connected(server, "device").publish("ticker/eur", b"1.0841" * 100, 1)  # (a frame over 125 bytes)
    message = received.get(timeout=TIMEOUT)
    assert (message.topic, message.payload, message.qos) == ("ticker/eur", b"1.0841" * 100, 1)
    info = browser.publish("ticker/usd", b"from the browser", 2)
    info.wait_for_publish(TIMEOUT)
    assert received.get(timeout=TIMEOUT).payload == b"from the browser"


def test_a_websocket_that_is_not_mqtts_is_refused(server: MqttBroker, websocket_port: int) -> None:
    with socket.create_connection(("127.0.0.1", websocket_port), timeout=TIMEOUT) as sock:
        sock.sendall(
            b"GET /other HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 404 ")


def test_the_will_of_a_websocket_client_that_vanishes(server: MqttBroker, websocket_port: int) -> None:
    watcher = connected(server, "watcher")
    watcher.subscribe("status/#", 1)
    page = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="page", transport="websockets")
    page.ws_set_options(path="/ws")
    page.will_set("status/page", b"gone", 1)
    done = threading.Event()
    page.on_connect = lambda *_a: done.set()
    page.connect("127.0.0.1", websocket_port)
    page.loop_start()
    assert done.wait(TIMEOUT)
    page.loop_stop()
    page.socket().close()  # no DISCONNECT, no close frame
    message = watcher.receive()
    assert (message.topic, message.payload) == ("status/page", b"gone")


def test_a_websocket_closed_without_disconnect_publishes_the_will(server: MqttBroker, websocket_port: int) -> None:
    from postroom.broker.tools.fuzzing import mqtt_packet, mqtt_string

    watcher = connected(server, "watcher")
    watcher.subscribe("status/#", 1)
    will = mqtt_string("status/tab") + mqtt_string("closed")
    connect = mqtt_packet(0x10, mqtt_string("MQTT") + b"\x04\x0e\x00\x3c" + mqtt_string("tab") + will)
    with socket.create_connection(("127.0.0.1", websocket_port), timeout=TIMEOUT) as sock:
        sock.sendall(
            b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        assert b"Sec-WebSocket-Protocol: mqtt" in sock.recv(1000)
        sock.sendall(bytes([0x82, 0x80 | len(connect)]) + b"\x00\x00\x00\x00" + connect)  # (a zero mask)
        assert sock.recv(100) == b"\x82\x04\x20\x02\x00\x00"  # CONNACK in a binary frame
        sock.sendall(b"\x88\x82\x00\x00\x00\x00\x03\xe9")  # close, 1001 going away (a tab closed)
        assert sock.recv(100) == b"\x88\x02\x03\xe8"
    message = watcher.receive()
    assert (message.topic, message.payload) == ("status/tab", b"closed")


def test_topic_permissions_with_the_client_id(make_mqtt: Callable[..., MqttBroker]) -> None:
    """RabbitMQ's MQTT plugin puts the client id in topic permissions (``{client_id}``): a
    device may publish under its own id only, and a publish it may not make ends it."""
    topics = {"/": {"amq.topic": TopicPermission(write="^devices\\.{client_id}\\.", read="^devices\\.")}}
    node = Node(
        users=(User("dev", password="pw", permissions={"/": Permission(".*", ".*", ".*")}, topic_permissions=topics),)
    )
    server = make_mqtt(node, allow_anonymous=False)
    watcher = connected(server, "watcher", username="dev", password="pw")
    assert watcher.subscribe("devices/#", 1) == [1]
    assert watcher.subscribe("other/#", 1) == [0x80]  # read refused: SUBACK failure [MQTT-3.9.3]
    device = connected(server, "d1", username="dev", password="pw")
    device.publish("devices/d1/temperature", b"21.5", 1)
    assert watcher.receive().payload == b"21.5"
    device.raw.publish("devices/d2/temperature", b"spoofed", 1)
    assert device.disconnected.wait(TIMEOUT)  # write refused: the connection ends (as RabbitMQ ends it)
    watcher.nothing()
    # A client id that breaks the pattern once put in logs in, and may publish nowhere there.
    broken = connected(server, "d(", username="dev", password="pw")
    broken.raw.publish("devices/d(/temperature", b"x", 1)
    assert broken.disconnected.wait(TIMEOUT)
    watcher.nothing()

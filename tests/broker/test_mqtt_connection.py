"""The MQTT connection without a network: packets in, packets out, on a node of its own; and
its shell's timers on a ``Clock`` over a ``StringTransport`` (CONNECT's deadline, the keep-alive
at one and a half times), deterministic, with no sleeps."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from postroom.broker.core.journal import Journal
from postroom.broker.core.message import Message
from postroom.broker.core.node import Node
from postroom.broker.core.users import User, hash_password
from postroom.broker.mqtt.connection import MqttConnection, Phase
from postroom.broker.mqtt.registry import MqttRegistry
from postroom.broker.server.mqttprotocol import CONNECT_TIMEOUT, MqttServerFactory, MqttServerProtocol
from postroom.broker.server.protocol import AMQPServerFactory
from postroom.broker.wire import mqtt as wire
from postroom.broker.wire import mqtt5


def text(value: str) -> bytes:
    return struct.pack(">H", len(value.encode())) + value.encode()


def packet(first: int, body: bytes) -> bytes:
    out = bytearray([first])
    length = len(body)
    while True:
        byte, length = length & 0x7F, length >> 7
        out.append(byte | 0x80 if length else byte)
        if not length:
            return bytes(out) + body


def connect(client_id: str, clean: bool = True, keep_alive: int = 0, will: tuple[str, bytes] | None = None) -> bytes:
    flags = (0x02 if clean else 0) | (0x04 if will else 0)
    payload = text(client_id) + (text(will[0]) + struct.pack(">H", len(will[1])) + will[1] if will else b"")
    return packet(0x10, text("MQTT") + bytes([4, flags]) + struct.pack(">H", keep_alive) + payload)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 1, retain: bool = False) -> bytes:
    return packet(0x30 | qos << 1 | retain, text(topic) + (struct.pack(">H", packet_id) if qos else b"") + payload)


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    return packet(0x82, struct.pack(">H", packet_id) + text(topic_filter) + bytes([qos]))


def read(data: bytes) -> list[tuple[int, int, bytes]]:
    return wire.PacketReader().feed(data)


def opened(registry: MqttRegistry, client_id: str, clean: bool = True, keep_alive: int = 0) -> MqttConnection:
    connection = MqttConnection(registry, "127.0.0.1:40000", True)
    connection.receive(connect(client_id, clean, keep_alive))
    assert read(connection.take_output()) == [(wire.CONNACK, 0, b"\x00\x00")]
    return connection


@pytest.fixture
def registry() -> MqttRegistry:
    return MqttRegistry(Node())


def test_qos1_acknowledgements_wait_for_the_log_and_keep_their_order(registry: MqttRegistry) -> None:
    node = registry.node
    journal = Journal(1)
    node.set_journal(journal)
    subscriber = opened(registry, "sub")
    subscriber.receive(subscribe(1, "jobs/#", 1))  # a durable queue: its messages are logged
    subscriber.take_output()
    publisher = opened(registry, "pub")
    publisher.receive(publish("jobs/a", b"1", 1, 1) + publish("elsewhere", b"2", 1, 2) + publish("jobs/b", b"3", 1, 3))
    assert publisher.take_output() == b""  # nothing is on disk yet, and the second waits for the first
    journal.synced_to(journal.position)
    assert [body for _kind, _flags, body in read(publisher.take_output())] == [b"\x00\x01", b"\x00\x02", b"\x00\x03"]


def test_a_failed_log_write_ends_the_publisher_without_an_acknowledgement(registry: MqttRegistry) -> None:
    journal = Journal(1)
    registry.node.set_journal(journal)
    subscriber = opened(registry, "sub")
    subscriber.receive(subscribe(1, "t", 1))
    publisher = opened(registry, "pub")
    publisher.receive(publish("t", b"x", 1, 5))
    journal.failed(journal.position)
    assert publisher.take_output() == b"" and publisher.finished


def test_a_qos2_publish_sent_again_before_its_release_is_routed_once(registry: MqttRegistry) -> None:
    subscriber = opened(registry, "sub")
    subscriber.receive(subscribe(1, "t", 2))
    subscriber.take_output()
    publisher = opened(registry, "pub")
    publisher.receive(publish("t", b"once", 2, 9))
    publisher.receive(packet(0x3C, text("t") + struct.pack(">H", 9) + b"once"))  # DUP, same id
    assert [kind for kind, _f, _b in read(publisher.take_output())] == [wire.PUBREC, wire.PUBREC]
    publisher.receive(packet(0x62, struct.pack(">H", 9)))  # PUBREL
    assert read(publisher.take_output()) == [(wire.PUBCOMP, 0, b"\x00\x09")]
    delivered = read(subscriber.take_output())
    assert [(kind, flags >> 1 & 3) for kind, flags, _b in delivered] == [(wire.PUBLISH, 2)]


def test_an_alarm_holds_a_publisher_until_it_clears(registry: MqttRegistry) -> None:
    node = registry.node
    subscriber = opened(registry, "sub")
    subscriber.receive(subscribe(1, "t", 0))
    subscriber.take_output()
    publisher = opened(registry, "pub")
    node.set_alarm("memory", True)
    publisher.receive(publish("t", b"held") + packet(0xC0, b""))
    assert publisher.blocked and subscriber.take_output() == b"" and publisher.take_output() == b""
    node.set_alarm("memory", False)
    assert not publisher.blocked
    assert [kind for kind, _f, _b in read(subscriber.take_output())] == [wire.PUBLISH]
    assert read(publisher.take_output()) == [(wire.PINGRESP, 0, b"")]  # (what came after it waited too)


def test_packets_that_come_while_the_login_is_checked_wait_for_it(registry: MqttRegistry) -> None:
    node = registry.node
    pending: list[tuple[object, object]] = []
    node.run_blocking = lambda fn, callback: pending.append((fn, callback))
    node.users_by_name["guest"] = User("guest", password_hash=hash_password("guest", b"salt", n=2), loopback_only=True)
    connection = MqttConnection(registry, "127.0.0.1:40000", True)
    connection.receive(connect("slow") + packet(0xC0, b""))
    assert connection.phase is Phase.AUTHENTICATING and connection.take_output() == b""
    fn, callback = pending.pop()
    callback(fn())  # type: ignore[operator]
    assert [kind for kind, _f, _b in read(connection.take_output())] == [wire.CONNACK, wire.PINGRESP]


def test_an_amqp_message_reaches_an_mqtt_subscriber_at_qos1(registry: MqttRegistry) -> None:
    subscriber = opened(registry, "sub")
    subscriber.receive(subscribe(1, "a/+", 2))
    subscriber.take_output()
    vhost = registry.node.vhosts["/"]
    exchange = vhost.exchanges["amq.topic"]
    message = Message.build("amq.topic", "a.b", b"hi")
    vhost.enqueue_routed(vhost.route(exchange, message), message)
    [(kind, flags, body)] = read(subscriber.take_output())
    assert (kind, flags >> 1 & 3) == (wire.PUBLISH, 1)  # an AMQP message counts as QoS 1
    assert body.endswith(b"hi") and body.startswith(text("a/b"))


# -- the shell, on a clock --------------------------------------------------------------------


def shell(registry: MqttRegistry) -> tuple[MqttServerProtocol, StringTransport, Clock]:
    clock = Clock()
    amqp = AMQPServerFactory(registry.node, clock)
    protocol = MqttServerFactory(registry, amqp, clock).buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    protocol.makeConnection(transport)
    return protocol, transport, clock


def test_no_connect_within_the_deadline_ends_the_socket(registry: MqttRegistry) -> None:
    _protocol, transport, clock = shell(registry)
    clock.advance(CONNECT_TIMEOUT - 0.01)
    assert not transport.disconnecting
    clock.advance(0.01)
    assert transport.disconnecting


def test_a_silent_client_is_ended_at_one_and_a_half_keep_alives_and_its_will_published(
    registry: MqttRegistry,
) -> None:
    watcher = opened(registry, "watcher")
    watcher.receive(subscribe(1, "status", 0))
    watcher.take_output()
    protocol, transport, clock = shell(registry)
    protocol.dataReceived(connect("sleepy", keep_alive=10, will=("status", b"gone")))
    assert read(transport.value()) == [(wire.CONNACK, 0, b"\x00\x00")]
    clock.advance(9)
    protocol.dataReceived(packet(0xC0, b""))  # heard at 9 s: the deadline moves to 24 s
    clock.advance(14.99)
    assert not transport.disconnecting
    clock.advance(0.01)
    assert transport.disconnecting
    [(kind, _flags, body)] = read(watcher.take_output())
    assert kind == wire.PUBLISH and body.endswith(b"gone")


def test_keep_alive_zero_means_no_limit(registry: MqttRegistry) -> None:
    protocol, transport, clock = shell(registry)
    protocol.dataReceived(connect("forever", keep_alive=0))
    clock.advance(24 * 3600)
    assert not transport.disconnecting


def test_qos2_is_exactly_once_across_reconnects_of_a_persistent_session(registry: MqttRegistry) -> None:
    """[MQTT-4.4.0-1]: a persistent session's client and server send again, with their packet
    identifiers, what was in flight; a QoS 2 message is delivered once, both ways."""
    subscriber = opened(registry, "sub", clean=False)
    subscriber.receive(subscribe(1, "t", 2))
    subscriber.take_output()
    publisher = opened(registry, "pub", clean=False)
    publisher.receive(publish("t", b"once", 2, 5))
    assert read(publisher.take_output()) == [(wire.PUBREC, 0, b"\x00\x05")]
    publisher.connection_lost()  # before its PUBREL
    publisher = opened_again(registry, "pub")
    publisher.receive(packet(0x3C, text("t") + struct.pack(">H", 5) + b"once"))  # sent again, DUP
    publisher.receive(packet(0x62, struct.pack(">H", 5)))
    assert [kind for kind, _f, _b in read(publisher.take_output())] == [wire.PUBREC, wire.PUBCOMP]
    [(kind, flags, body)] = read(subscriber.take_output())  # one delivery, not two
    packet_id = body[3:5]
    subscriber.connection_lost()  # before its PUBREC
    subscriber = opened_again(registry, "sub")
    [(kind, flags, again)] = read(subscriber.take_output())
    assert (kind, flags) == (wire.PUBLISH, 0b1100) and again == body  # DUP, QoS 2, the same id
    subscriber.receive(packet(0x50, packet_id))  # PUBREC
    assert read(subscriber.take_output()) == [(wire.PUBREL, 0b0010, packet_id)]
    subscriber.connection_lost()  # before its PUBCOMP
    subscriber = opened_again(registry, "sub")
    assert read(subscriber.take_output()) == [(wire.PUBREL, 0b0010, packet_id)]  # released again
    subscriber.receive(packet(0x70, packet_id))  # PUBCOMP
    subscriber.connection_lost()
    assert read(opened_again(registry, "sub").take_output()) == []  # nothing in flight any more


def opened_again(registry: MqttRegistry, client_id: str) -> MqttConnection:
    """A persistent session's client back: its CONNACK says the session was found."""
    connection = MqttConnection(registry, "127.0.0.1:40001", True)
    connection.receive(connect(client_id, clean=False))
    packets = read(connection.take_output())
    assert packets[0] == (wire.CONNACK, 0, b"\x01\x00")
    connection.out[:0] = [wire.packet(kind << 4 | flags, body) for kind, flags, body in packets[1:]]
    return connection


def test_a_session_found_again_after_a_restart_has_its_subscriptions_options(registry: MqttRegistry) -> None:
    """A persistent session's subscriptions are its queues' bindings: their QoS 2, MQTT 5.0
    options and identifiers are kept in the bindings' arguments, read back by a new session."""
    from postroom.broker.mqtt.session import MqttSession

    vhost = registry.node.vhosts["/"]
    first = MqttSession(vhost, "dev", False, "amq.topic", 10, None)
    first.subscribe("a/#", 2, None, no_local=True, identifier=5)
    first.subscribe("b", 1, None, retain_as_published=True)
    first.subscribe("c", 0, None)
    first.subscribe("b", 1, None)  # options changed: the binding is replaced, not added to
    again = MqttSession(vhost, "dev", False, "amq.topic", 10, None)
    again.recover_filters()
    assert again.filters == {"a/#": 2, "b": 1, "c": 0}
    assert again.options == {"a/#": (True, False)} and again.identifiers == {"a/#": 5}


def test_retained_messages_read_back_from_their_records() -> None:
    from postroom.broker.core.retained import Retained

    for kept in (Retained(b"on", 1), Retained(b"off", 2, b"\x00\x3c" + bytes(12), 1234.5)):
        assert Retained.from_value(kept.value()) == kept
    assert Retained.from_value(b"\x01on") == Retained(b"on", 1)  # (the 3.1.1 record, as it always was)


def test_qos2_publishes_awaiting_release_read_back_from_their_records() -> None:
    """A persistent session's QoS 2 packet ids waiting for PUBREL are definition records: the
    head of a new log segment holds them all, and a node reads them back; once none wait, the
    record says so (and a vhost that is gone takes its sessions' with it)."""
    from postroom.broker.core.releases import AwaitingRelease
    from postroom.broker.wal.records import Defined
    from postroom.broker.wal.segments import iter_records

    journal = Journal()
    kept = AwaitingRelease()
    kept.journal = journal
    kept.set("/", "dev-1", {7, 300})
    kept.set("/", "dev-1", {7, 300})  # (unchanged: nothing more written)
    kept.set("other", "dev-2", {1})
    records = [record for _start, _end, record in iter_records(b"".join(kept.records()))]
    assert all(isinstance(record, Defined) for record in records)
    again = AwaitingRelease()
    again.restore([record for record in records if isinstance(record, Defined)], ["/"])
    assert again.by_client == {("/", "dev-1"): frozenset({7, 300})}
    assert again.get("/", "dev-1") == {7, 300} and again.get("/", "dev-9") == set()
    written = journal.position
    kept.set("/", "dev-1", ())
    assert journal.position > written and ("/", "dev-1") not in kept.by_client


# -- MQTT 5.0: topic aliases from the server ----------------------------------------------------


def opened5(registry: MqttRegistry, client_id: str, alias_maximum: int, maximum_packet: int) -> MqttConnection:
    """A client at level 5 that takes ``alias_maximum`` topic aliases and packets of at most
    ``maximum_packet`` bytes, subscribed to ``t/#`` at QoS 0."""
    values = {mqtt5.TOPIC_ALIAS_MAXIMUM: alias_maximum, mqtt5.MAXIMUM_PACKET_SIZE: maximum_packet}
    properties = mqtt5.properties(wire.CONNECT, values)
    connection = MqttConnection(registry, "127.0.0.1:40002", True)
    connection.receive(packet(0x10, text("MQTT") + bytes([5, 0x02]) + b"\x00\x00" + properties + text(client_id)))
    connection.receive(packet(0x82, struct.pack(">H", 1) + b"\x00" + text("t/#") + b"\x00"))
    assert [kind for kind, _flags, _body in read(connection.take_output())] == [wire.CONNACK, wire.SUBACK]
    return connection


def delivered5(registry: MqttRegistry, connection: MqttConnection, *sends: tuple[str, bytes]) -> list[tuple[str, Any]]:
    """Publish each ``(routing key, payload)`` over AMQP: each PUBLISH the client gets, as its
    topic and Topic Alias."""
    vhost = registry.node.vhosts["/"]
    for key, payload in sends:
        message = Message.build("amq.topic", key, payload)
        vhost.enqueue_routed(vhost.route(vhost.exchanges["amq.topic"], message), message)
    found = []
    for kind, flags, body in read(connection.take_output()):
        publish = mqtt5.parse(kind, flags, body)
        assert isinstance(publish, mqtt5.Publish)
        found.append((publish.topic, publish.properties.get(mqtt5.TOPIC_ALIAS)))
    return found


def test_topic_aliases_to_the_client_as_rabbitmq_gives_them(registry: MqttRegistry) -> None:
    """RabbitMQ 3.13 (``process_topic_alias_outbound/3``): the next alias to each new topic
    while the client's Topic Alias Maximum allows, the topic sent empty once it has one, none
    to a topic of one byte, none replaced once all are given."""
    connection = opened5(registry, "aliased", alias_maximum=2, maximum_packet=1000)
    assert delivered5(registry, connection, ("t.a", b"1"), ("t.b", b"2"), ("t.c", b"3"), ("t.a", b"4")) == [
        ("t/a", 1),
        ("t/b", 2),
        ("t/c", None),  # no alias left
        ("", 1),
    ]
    assert delivered5(registry, connection, ("t.b", b"5"), ("t.c", b"6")) == [("", 2), ("t/c", None)]


def test_no_topic_aliases_to_a_client_that_takes_none(registry: MqttRegistry) -> None:
    connection = opened5(registry, "plain", alias_maximum=0, maximum_packet=1000)
    assert delivered5(registry, connection, ("t.a", b"1"), ("t.a", b"2")) == [("t/a", None), ("t/a", None)]


def test_an_alias_is_given_only_by_a_publish_that_was_sent(registry: MqttRegistry) -> None:
    """A PUBLISH larger than the client takes is not sent [MQTT-3.1.2-25]: the alias it would
    have given is given by the next one on that topic (RabbitMQ takes it all the same, and
    later sends the alias alone to a client that never learnt it)."""
    connection = opened5(registry, "small", alias_maximum=4, maximum_packet=40)
    assert delivered5(registry, connection, ("t.a", b"x" * 64), ("t.a", b"fits")) == [("t/a", 1)]
    assert delivered5(registry, connection, ("t.a", b"again")) == [("", 1)]


# -- MQTT 5.0: a session's expiry on its queues ---------------------------------------------------


def connect5(registry: MqttRegistry, client_id: str, expiry: int) -> MqttConnection:
    """A client at level 5 without Clean Start, asking for a Session Expiry Interval of ``expiry``."""
    properties = mqtt5.properties(wire.CONNECT, {mqtt5.SESSION_EXPIRY_INTERVAL: expiry})
    connection = MqttConnection(registry, "127.0.0.1:40003", True)
    connection.receive(packet(0x10, text("MQTT") + bytes([5, 0x00]) + b"\x00\x00" + properties + text(client_id)))
    assert read(connection.take_output())[0][0] == wire.CONNACK
    return connection


def test_a_new_session_expiry_reaches_the_sessions_queues(registry: MqttRegistry) -> None:
    """RabbitMQ 3.13 (``maybe_update_session_expiry_interval/2``): a CONNECT that finds the
    session, and a DISCONNECT with a Session Expiry Interval, set its queues' ``x-expires``."""
    queue_name = "mqtt-subscription-keeperqos1"
    connection = connect5(registry, "keeper", 60)
    connection.receive(packet(0x82, struct.pack(">H", 1) + b"\x00" + text("jobs") + b"\x01"))
    queue = registry.node.vhosts["/"].queues[queue_name]
    assert (queue.arguments["x-expires"], queue.settings.expires) == (60_000, 60.0)
    disconnect = mqtt5.properties(wire.DISCONNECT, {mqtt5.SESSION_EXPIRY_INTERVAL: 300})
    connection.receive(packet(0xE0, b"\x00" + disconnect))
    connection.connection_lost()
    assert (queue.arguments["x-expires"], queue.settings.expires) == (300_000, 300.0)
    connect5(registry, "keeper", 10)
    assert registry.node.vhosts["/"].queues[queue_name] is queue
    assert (queue.arguments["x-expires"], queue.settings.expires) == (10_000, 10.0)


def test_sessions_that_expired_are_forgotten() -> None:
    """A persistent session outlives its client by its expiry interval; once that has passed
    and its queues went by their ``x-expires``, the registry forgets it (a client id seen once
    holds no memory for ever). One whose client came back, and one that never expires, stay."""
    clock = Clock()
    registry = MqttRegistry(Node(clock=clock))
    for client_id, expiry in (("brief", 10), ("back", 10), ("forever", 0xFFFFFFFF)):
        connection = connect5(registry, client_id, expiry)
        connection.receive(packet(0x82, struct.pack(">H", 1) + b"\x00" + text(f"t/{client_id}") + b"\x01"))
        connection.connection_lost()
    clock.advance(5)
    registry.forget_expired()
    assert set(registry.sessions) == {("/", "brief"), ("/", "back"), ("/", "forever")}
    connect5(registry, "back", 10)
    clock.advance(6)  # (the queues' x-expires: 10 s unused)
    registry.forget_expired()
    assert set(registry.sessions) == {("/", "back"), ("/", "forever")}
    assert "mqtt-subscription-briefqos1" not in registry.node.vhosts["/"].queues


# -- MQTT 5.0 on a clock: the will's delay, a retained message's expiry -----------------------------


def subscribed(registry: MqttRegistry, client_id: str, topic_filter: str) -> MqttConnection:
    """A client at 3.1.1 subscribed to ``topic_filter`` at QoS 0, its output read so far."""
    connection = opened(registry, client_id)
    connection.receive(subscribe(1, topic_filter, 0))
    connection.take_output()
    return connection


def topics_of(connection: MqttConnection) -> list[tuple[str, bytes]]:
    """Each PUBLISH ``connection`` has to send (at 3.1.1), as its topic and payload."""
    found = []
    for kind, flags, body in read(connection.take_output()):
        publish = wire.parse(kind, flags, body)
        assert isinstance(publish, wire.Publish)
        found.append((publish.topic, publish.payload))
    return found


def test_the_will_waits_its_delay_on_the_clock() -> None:
    """The will of a client at 5.0 goes after its Will Delay Interval [MQTT-3.1.3-9], and a
    connection of the same client id within it cancels it (section 3.1.3.2.2)."""
    clock = Clock()
    registry = MqttRegistry(Node(clock=clock))
    watcher = subscribed(registry, "watcher", "status/#")

    def leaving(client_id: str) -> MqttConnection:
        will = mqtt5.properties(mqtt5.WILL, {mqtt5.WILL_DELAY_INTERVAL: 5})
        session = mqtt5.properties(wire.CONNECT, {mqtt5.SESSION_EXPIRY_INTERVAL: 60})
        payload = text(client_id) + will + text(f"status/{client_id}") + text("gone")
        connection = MqttConnection(registry, "127.0.0.1:40004", True)
        connection.receive(packet(0x10, text("MQTT") + bytes([5, 0x04]) + b"\x00\x00" + session + payload))
        assert read(connection.take_output())[0][0] == wire.CONNACK
        connection.connection_lost()  # (no DISCONNECT)
        return connection

    leaving("dev-1")
    clock.advance(4.9)
    assert topics_of(watcher) == []
    clock.advance(0.2)
    assert topics_of(watcher) == [("status/dev-1", b"gone")]
    leaving("dev-2")
    clock.advance(2)
    connect5(registry, "dev-2", 60)  # back within the delay: no will
    clock.advance(10)
    assert topics_of(watcher) == []


def test_a_retained_message_expires_on_the_clock() -> None:
    """A retained message at 5.0 goes to a new subscriber with what is left of its Message
    Expiry Interval, and to none once that has passed [MQTT-3.3.2-5, 3.3.2-6]."""
    clock = Clock()
    registry = MqttRegistry(Node(clock=clock))
    publisher = connect5(registry, "pub", 0)
    expiry = mqtt5.properties(wire.PUBLISH, {mqtt5.MESSAGE_EXPIRY_INTERVAL: 5})
    publisher.receive(mqtt5.publish("state/a", b"on", 0, True, False, None, expiry))
    clock.advance(3)
    early = connect5(registry, "early", 0)
    early.receive(packet(0x82, struct.pack(">H", 1) + b"\x00" + text("state/#") + b"\x00"))
    [delivery] = [mqtt5.parse(kind, flags, body) for kind, flags, body in read(early.take_output()) if kind == 3]
    assert isinstance(delivery, mqtt5.Publish)
    assert (delivery.topic, delivery.payload, delivery.retain) == ("state/a", b"on", True)
    assert delivery.properties.get(mqtt5.MESSAGE_EXPIRY_INTERVAL) == 2
    clock.advance(2.5)
    late = subscribed(registry, "late", "state/#")
    assert topics_of(late) == []


# -- names too long for the log's records ------------------------------------------------------------


def test_names_too_long_for_the_logs_records_are_refused_before_anything_is_kept() -> None:
    """An MQTT string may be 65,535 bytes, and JSON escapes some of them: a client id, or a
    retained topic, whose log record would not fit is refused (CONNACK 2; the connection ends,
    nothing routed or retained) instead of failing to be recorded after the fact."""
    node = Node()
    node.set_journal(Journal())
    registry = MqttRegistry(node)
    refused = MqttConnection(registry, "127.0.0.1:40005", True)
    refused.receive(connect('"' * 40_000, clean=False))
    assert read(refused.take_output()) == [(wire.CONNACK, 0, b"\x00\x02")]
    assert refused.phase is Phase.CLOSED
    publisher = opened(registry, "pub")
    publisher.receive(publish('"' * 40_000, b"kept?", qos=1, retain=True))
    assert read(publisher.take_output()) == [] and publisher.finished  # (the shell then closes it)
    assert node.retained.by_vhost.get("/", {}) == {}
    fine = opened(registry, "fine", clean=False)  # (a long name that fits is kept as before)
    fine.receive(publish("t/" + "a" * 60_000, b"kept", retain=True))
    assert list(node.retained.by_vhost["/"]) == ["t/" + "a" * 60_000]

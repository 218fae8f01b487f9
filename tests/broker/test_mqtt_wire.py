"""MQTT 3.1.1 packets on the wire (``broker/wire/mqtt.py``): each packet a client sends, read
from bytes built as the specification lays them out, the malformed ones refused with the rule
they break, and what a server writes read back."""

from __future__ import annotations

import struct

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from postroom.broker.wire import mqtt
from postroom.broker.wire.mqtt import (
    Acknowledgement,
    Connect,
    Disconnect,
    MalformedPacket,
    PacketReader,
    PacketTooLarge,
    PingReq,
    Publish,
    Subscribe,
    Unsubscribe,
    Will,
    parse,
)


def remaining_length(length: int) -> bytes:
    """Section 2.2.3's encoding, written here from the specification's own algorithm."""
    out = bytearray()
    while True:
        byte, length = length % 128, length // 128
        out.append(byte | 128 if length > 0 else byte)
        if length == 0:
            return bytes(out)


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + remaining_length(len(body)) + body


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def connect_body(
    flags: int, client_id: str = "sensor-1", keep_alive: int = 60, rest: bytes = b"", name: str = "MQTT", level: int = 4
) -> bytes:
    return string(name) + bytes([level, flags]) + struct.pack(">H", keep_alive) + string(client_id) + rest


def read_one(data: bytes) -> object:
    ((kind, flags, body),) = PacketReader().feed(data)
    return parse(kind, flags, body)


def test_a_connect_with_every_field_is_read() -> None:
    flags = 0x80 | 0x40 | 0x20 | (1 << 3) | 0x04 | 0x02  # user, password, will retain, will QoS 1, will, clean
    rest = string("devices/1/gone") + string(b"\x00offline") + string("alice") + string(b"s3cret")
    assert read_one(packet(0x10, connect_body(flags, rest=rest))) == Connect(
        "MQTT", 4, True, 60, "sensor-1", Will("devices/1/gone", b"\x00offline", 1, True), "alice", b"s3cret"
    )


def test_mqtt_3_1_is_read_under_its_own_name() -> None:
    found = read_one(packet(0x10, connect_body(0x02, name="MQIsdp", level=3)))
    assert isinstance(found, Connect) and (found.protocol_level, found.client_id) == (3, "sensor-1")


@pytest.mark.parametrize(("name", "level"), [("MQTT", 5), ("MQTT", 3), ("MQIsdp", 4), ("AMQP", 4)])
def test_a_level_or_name_not_read_is_handed_on_for_the_session_to_answer(name: str, level: int) -> None:
    found = read_one(packet(0x10, connect_body(0x02, name=name, level=level)))
    assert isinstance(found, Connect) and (found.protocol_name, found.protocol_level) == (name, level)
    assert mqtt.PROTOCOLS.get(level) != name


@pytest.mark.parametrize(
    ("flags", "rest", "rule"),
    [
        (0x03, b"", "MQTT-3.1.2-3"),  # the reserved bit
        (0x04 | (3 << 3), string("t") + string(b"m"), "MQTT-3.1.2-14"),  # will QoS 3
        (1 << 3, b"", "MQTT-3.1.2-11"),  # will QoS without the will flag
        (0x20, b"", "MQTT-3.1.2-11"),  # will retain without the will flag
        (0x40, string(b"pw"), "MQTT-3.1.2-22"),  # a password without a user name
        (0x04, string("a/+") + string(b"m"), "MQTT-3.3.2-2"),  # a will topic with a wildcard
        (0x02, b"\x00", "after its fields"),
        (0x80, b"\x00\x05ab", "ends inside"),
    ],
)
def test_each_malformed_connect_is_refused_with_its_rule(flags: int, rest: bytes, rule: str) -> None:
    with pytest.raises(MalformedPacket, match=rule.replace("+", r"\+")):
        read_one(packet(0x10, connect_body(flags, rest=rest)))


def test_strings_must_be_utf8_without_nul() -> None:
    with pytest.raises(MalformedPacket, match="MQTT-1.5.3-1"):
        read_one(packet(0x10, connect_body(0x02, rest=b"")[:-10] + string(b"\xff\xfe")))
    with pytest.raises(MalformedPacket, match="MQTT-1.5.3-2"):
        read_one(packet(0x10, connect_body(0x02, client_id="a\x00b")))


def test_publish_at_each_qos() -> None:
    assert read_one(packet(0x30, string("a/b") + b"hello")) == Publish("a/b", b"hello", 0, False, False, None)
    assert read_one(packet(0x3B, string("a/b") + b"\x00\x07hi")) == Publish("a/b", b"hi", 1, True, True, 7)
    assert read_one(packet(0x34, string("a/b") + b"\x01\x00")) == Publish("a/b", b"", 2, False, False, 256)


@pytest.mark.parametrize(
    ("first", "body", "rule"),
    [
        (0x36, string("a") + b"\x00\x01", "MQTT-3.3.1-4"),  # QoS 3
        (0x38, string("a"), "MQTT-3.3.1-2"),  # DUP at QoS 0
        (0x30, string("a/#"), "MQTT-3.3.2-2"),
        (0x30, string("a/+/b"), "MQTT-3.3.2-2"),
        (0x30, string(""), "MQTT-4.7.3-1"),
        (0x32, string("a") + b"\x00\x00", "MQTT-2.3.1-1"),  # packet identifier 0
        (0x32, string("a") + b"\x00", "ends early"),
    ],
)
def test_each_malformed_publish_is_refused_with_its_rule(first: int, body: bytes, rule: str) -> None:
    with pytest.raises(MalformedPacket, match=rule):
        read_one(packet(first, body))


def test_acknowledgements_and_their_flags() -> None:
    assert read_one(packet(0x40, b"\x00\x05")) == Acknowledgement(mqtt.PUBACK, 5)
    assert read_one(packet(0x50, b"\x00\x05")) == Acknowledgement(mqtt.PUBREC, 5)
    assert read_one(packet(0x62, b"\x00\x05")) == Acknowledgement(mqtt.PUBREL, 5)
    assert read_one(packet(0x70, b"\x00\x05")) == Acknowledgement(mqtt.PUBCOMP, 5)
    with pytest.raises(MalformedPacket, match="MQTT-2.2.2-2"):
        read_one(packet(0x60, b"\x00\x05"))  # PUBREL's flags must be 0010
    with pytest.raises(MalformedPacket, match="after its fields"):
        read_one(packet(0x40, b"\x00\x05\x00"))


def test_subscribe_and_unsubscribe() -> None:
    body = b"\x00\x0a" + string("sensors/+/temp") + b"\x01" + string("#") + b"\x02"
    assert read_one(packet(0x82, body)) == Subscribe(10, (("sensors/+/temp", 1), ("#", 2)))
    assert read_one(packet(0xA2, b"\x00\x0b" + string("a/b") + string("c"))) == Unsubscribe(11, ("a/b", "c"))
    with pytest.raises(MalformedPacket, match="MQTT-3.8.3-3"):
        read_one(packet(0x82, b"\x00\x0a"))
    with pytest.raises(MalformedPacket, match="MQTT-3.8.3-4"):
        read_one(packet(0x82, b"\x00\x0a" + string("a") + b"\x03"))
    with pytest.raises(MalformedPacket, match="MQTT-3.8.3-4"):
        read_one(packet(0x82, b"\x00\x0a" + string("a") + b"\x41"))  # the reserved bits
    with pytest.raises(MalformedPacket, match="MQTT-3.10.3-2"):
        read_one(packet(0xA2, b"\x00\x0b"))
    with pytest.raises(MalformedPacket, match="MQTT-2.2.2-2"):
        read_one(packet(0x80, body))


def test_ping_and_disconnect_have_no_body() -> None:
    assert read_one(b"\xc0\x00") == PingReq()
    assert read_one(b"\xe0\x00") == Disconnect()
    with pytest.raises(MalformedPacket, match="a body of 1"):
        read_one(b"\xc0\x01\x00")


@pytest.mark.parametrize("kind", [0, mqtt.CONNACK, mqtt.SUBACK, mqtt.UNSUBACK, mqtt.PINGRESP, 15])
def test_a_packet_only_a_server_sends_is_refused(kind: int) -> None:
    with pytest.raises(MalformedPacket, match="MQTT-2.2.1"):
        parse(kind, 0, b"")


def test_a_remaining_length_of_five_bytes_is_refused() -> None:
    with pytest.raises(MalformedPacket, match="MQTT-2.2.3"):
        PacketReader().feed(b"\x30\xff\xff\xff\xff\x01")


def test_a_packet_over_the_limit_is_refused_before_its_body_comes() -> None:
    reader = PacketReader(max_packet=100)
    with pytest.raises(PacketTooLarge, match="101 bytes"):
        reader.feed(b"\x30" + remaining_length(101))


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8), st.integers(min_value=1, max_value=7))
def test_packets_are_cut_the_same_however_the_bytes_arrive(bodies: list[bytes], step: int) -> None:
    stream = b"".join(packet(0x30, string("t") + body) for body in bodies)
    reader = PacketReader()
    found = []
    for at in range(0, len(stream), step):
        found += reader.feed(stream[at : at + step])
    assert [parse(*one) for one in found] == [Publish("t", body, 0, False, False, None) for body in bodies]


@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"), min_size=1),
    st.binary(max_size=200),
    st.integers(min_value=0, max_value=2),
    st.booleans(),
    st.booleans(),
    st.integers(min_value=1, max_value=65535),
)
def test_what_the_server_writes_reads_back(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int
) -> None:
    dup = dup and qos > 0
    written = mqtt.publish(topic, payload, qos, retain, dup, packet_id if qos else None)
    assert read_one(written) == Publish(topic, payload, qos, retain, dup, packet_id if qos else None)


@given(st.integers(min_value=0, max_value=mqtt.MAX_REMAINING_LENGTH))
def test_every_remaining_length_is_read_as_the_specification_writes_it(length: int) -> None:
    header = b"\x30" + remaining_length(length)
    assert mqtt._fixed_header(bytearray(header), 0) == (0x30, length, len(header))


@given(st.integers(min_value=0, max_value=300_000))
def test_the_server_writes_remaining_lengths_as_the_specification_does(length: int) -> None:
    assert mqtt.pingresp()[:1] + remaining_length(length) + b"x" * length == mqtt.packet(0xD0, b"x" * length)


def test_server_packets() -> None:
    assert mqtt.connack(False, mqtt.ACCEPTED) == b"\x20\x02\x00\x00"
    assert mqtt.connack(True, mqtt.NOT_AUTHORIZED) == b"\x20\x02\x01\x05"
    assert mqtt.acknowledgement(mqtt.PUBREL, 9) == b"\x62\x02\x00\x09"
    assert mqtt.acknowledgement(mqtt.PUBACK, 9) == b"\x40\x02\x00\x09"
    assert mqtt.suback(3, [0, 1, mqtt.SUBSCRIPTION_FAILURE]) == b"\x90\x05\x00\x03\x00\x01\x80"
    assert mqtt.pingresp() == b"\xd0\x00"


@pytest.mark.parametrize(
    ("topic_filter", "problem"),
    [
        ("sport/tennis/#", None),
        ("#", None),
        ("+", None),
        ("+/tennis/#", None),
        ("sport/+/player1", None),
        ("/+", None),
        ("sport/tennis#", "MQTT-4.7.1-2"),
        ("sport/tennis/#/ranking", "MQTT-4.7.1-2"),
        ("sport+", "MQTT-4.7.1-3"),
        ("", "MQTT-4.7.3-1"),
    ],
)
def test_topic_filters_as_section_4_7_1_gives_them(topic_filter: str, problem: str | None) -> None:
    found = mqtt.filter_problem(topic_filter)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_topics_map_onto_routing_keys_as_rabbitmq_3_10_maps_them() -> None:
    assert mqtt.to_amqp("sensors/+/temp") == "sensors.*.temp"
    assert mqtt.to_amqp("sensors/#") == "sensors.#"
    assert mqtt.to_amqp("a.b/c") == "a.b.c"  # (3.10 keeps a dot: it separates words in AMQP)
    assert mqtt.to_mqtt("sensors.kitchen.temp") == "sensors/kitchen/temp"
    assert mqtt.to_mqtt("a.*.#") == "a/+/#"


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matched"),
    [
        # Section 4.7.1.2's examples.
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("#", "sport/tennis", True),
        # Section 4.7.1.3's.
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        # Section 4.7.2's: topics beginning with $.
        ("#", "$SYS/broker/clients", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/broker/clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        # Levels are compared whole, and case matters (4.7.3).
        ("ACCOUNTS", "Accounts", False),
        ("a/b", "a/b/c", False),
        ("a/b/c", "a/b", False),
    ],
)
def test_filters_match_topics_as_section_4_7_gives_it(topic_filter: str, topic: str, matched: bool) -> None:
    assert mqtt.filter_problem(topic_filter) is None
    assert mqtt.matches(topic_filter, topic) is matched


_level = st.sampled_from(["a", "b", "", "sport"])


@given(
    st.lists(st.one_of(_level, st.just("+")), min_size=1, max_size=4),
    st.booleans(),
    st.lists(_level, min_size=1, max_size=5),
)
def test_a_filter_mapped_onto_amq_topic_routes_what_it_matches(levels: list[str], rest: bool, topic: list[str]) -> None:
    """Subscriptions become bindings on a topic exchange (``to_amqp``): the exchange routes a
    published topic, mapped the same way, exactly when the filter matches it (topics without
    ``$`` and ``.``, which RabbitMQ 3.10's mapping keeps as they are)."""
    from postroom.exchanges.topic import TopicRouter

    topic_filter = "/".join(levels + (["#"] if rest else []))
    name = "/".join(topic)
    assume(mqtt.topic_problem(name) is None)  # (not the empty topic)
    router = TopicRouter()
    router.bind("subscriber", mqtt.to_amqp(topic_filter), {})
    assert (list(router.route(mqtt.to_amqp(name), None)) == ["subscriber"]) is mqtt.matches(topic_filter, name)

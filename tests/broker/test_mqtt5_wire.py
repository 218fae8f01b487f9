"""MQTT 5.0's packets on the wire (``broker.wire.mqtt5``): properties read and written as
paho-mqtt's own encoder writes and reads them (an independent implementation of section 2.2.2),
each packet a client sends read with the reason code the specification gives what breaks it,
and what the server sends. Rules are cited as the specification numbers them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from postroom.broker.wire import mqtt as v3
from postroom.broker.wire import mqtt5


def text(value: str) -> bytes:
    return struct.pack(">H", len(value.encode())) + value.encode()


def read(kind: int, data: bytes) -> mqtt5.Properties:
    fields = v3.Body(data, "test")
    found = mqtt5.read_properties(fields, kind)
    fields.end()
    return found


def test_publish_properties_as_paho_writes_them() -> None:
    theirs = PahoProperties(PacketTypes.PUBLISH)
    theirs.ContentType = "application/json"
    theirs.MessageExpiryInterval = 60
    theirs.CorrelationData = b"\x00\x01req"
    theirs.ResponseTopic = "replies/7"
    theirs.TopicAlias = 3
    theirs.PayloadFormatIndicator = 1
    theirs.UserProperty = [("trace", "a1"), ("trace", "b2")]
    found = read(v3.PUBLISH, theirs.pack())
    assert found.values == {
        mqtt5.CONTENT_TYPE: "application/json",
        mqtt5.MESSAGE_EXPIRY_INTERVAL: 60,
        mqtt5.CORRELATION_DATA: b"\x00\x01req",
        mqtt5.RESPONSE_TOPIC: "replies/7",
        mqtt5.TOPIC_ALIAS: 3,
        mqtt5.PAYLOAD_FORMAT_INDICATOR: 1,
    }
    assert found.user == (("trace", "a1"), ("trace", "b2"))  # repeated, in order [MQTT-3.3.2-17]


#: Text an MQTT string may hold: no U+0000 [MQTT-1.5.4-2], no surrogates [MQTT-1.5.4-1].
TEXT = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))


@given(
    expiry=st.integers(0, 2**32 - 1),
    keep_alive=st.integers(0, 2**16 - 1),
    identifier=st.text(TEXT, max_size=20),
    user=st.lists(st.tuples(st.text(TEXT, max_size=8), st.text(TEXT, max_size=8)), max_size=3),
)
def test_connack_properties_read_back_by_paho(
    expiry: int, keep_alive: int, identifier: str, user: list[tuple[str, str]]
) -> None:
    ours = mqtt5.properties(
        v3.CONNACK,
        {
            mqtt5.SESSION_EXPIRY_INTERVAL: expiry,
            mqtt5.SERVER_KEEP_ALIVE: keep_alive,
            mqtt5.ASSIGNED_CLIENT_IDENTIFIER: identifier,
        },
        tuple(user),
    )
    theirs = PahoProperties(PacketTypes.CONNACK)
    theirs.unpack(ours)
    assert (theirs.SessionExpiryInterval, theirs.ServerKeepAlive, theirs.AssignedClientIdentifier) == (
        expiry,
        keep_alive,
        identifier,
    )
    assert [tuple(pair) for pair in getattr(theirs, "UserProperty", [])] == user


@pytest.mark.parametrize(
    ("kind", "data", "code"),
    [
        (v3.PUBLISH, b"\x03\x11\x00\x00", mqtt5.PROTOCOL_ERROR),  # Session Expiry Interval in a PUBLISH
        (v3.CONNECT, b"\x06\x21\x00\x0a\x21\x00\x0b", mqtt5.PROTOCOL_ERROR),  # Receive Maximum twice
        (v3.CONNECT, b"\x03\x21\x00\x00", mqtt5.PROTOCOL_ERROR),  # Receive Maximum 0 [MQTT-3.1.2-23]
        (v3.PUBLISH, b"\x02\x01\x02", mqtt5.PROTOCOL_ERROR),  # Payload Format Indicator 2
        (v3.CONNECT, b"\x05\xff\xff\xff\xff\x7f", mqtt5.MALFORMED_PACKET),  # a five-byte identifier
        (v3.CONNECT, b"\x09\x11\x00\x00", mqtt5.MALFORMED_PACKET),  # longer than the packet
        (v3.SUBSCRIBE, b"\x02\x0b\x00", mqtt5.PROTOCOL_ERROR),  # Subscription Identifier 0
        (v3.CONNECT, b"\x02\x7e\x00", mqtt5.PROTOCOL_ERROR),  # an identifier no property has
    ],
    ids=["not allowed", "twice", "zero", "not a boolean", "a long identifier", "past the end", "id 0", "unknown"],
)
def test_properties_that_break_the_rules(kind: int, data: bytes, code: int) -> None:
    with pytest.raises(mqtt5.Problem) as problem:
        read(kind, data)
    assert problem.value.code == code


def connect_body(flags: int = 0x02, properties: bytes = b"\x00", payload: bytes = b"") -> bytes:
    return text("MQTT") + bytes([5, flags]) + b"\x00\x3c" + properties + payload


def test_a_connect_of_level_5() -> None:
    session = mqtt5.properties(v3.CONNECT, {mqtt5.SESSION_EXPIRY_INTERVAL: 300, mqtt5.RECEIVE_MAXIMUM: 20})
    will = mqtt5.properties(mqtt5.WILL, {mqtt5.WILL_DELAY_INTERVAL: 5, mqtt5.CONTENT_TYPE: "text/plain"})
    payload = text("dev-1") + will + text("status/dev-1") + text("gone") + text("ann") + text("pw")
    packet = mqtt5.parse(v3.CONNECT, 0, connect_body(0x02 | 0x04 | 0x08 | 0xC0, session, payload))
    assert isinstance(packet, mqtt5.Connect)
    assert (packet.clean_start, packet.keep_alive, packet.client_id, packet.username, packet.password) == (
        True,
        60,
        "dev-1",
        "ann",
        b"pw",
    )
    assert packet.properties.values == {mqtt5.SESSION_EXPIRY_INTERVAL: 300, mqtt5.RECEIVE_MAXIMUM: 20}
    assert packet.will == mqtt5.Will(
        "status/dev-1",
        b"gone",
        1,
        False,
        mqtt5.Properties({mqtt5.WILL_DELAY_INTERVAL: 5, mqtt5.CONTENT_TYPE: "text/plain"}),
    )
    # A password without a user name is allowed at level 5 (section 3.1.2.9).
    assert mqtt5.parse(v3.CONNECT, 0, connect_body(0x42, payload=text("x") + text("pw"))).password == b"pw"


@pytest.mark.parametrize(
    ("flags", "body", "code"),
    [
        (0b0000, text("t") + b"\x02\x23\x00", mqtt5.MALFORMED_PACKET),  # an alias cut short
        (0b0000, text("") + b"\x00", mqtt5.PROTOCOL_ERROR),  # no topic, no alias [MQTT-3.3.2-1]
        (0b0000, text("") + b"\x03\x23\x00\x00", mqtt5.TOPIC_ALIAS_INVALID),  # alias 0 [MQTT-3.3.2-8]
        (0b0000, text("a/+") + b"\x00", mqtt5.TOPIC_NAME_INVALID),  # a wildcard in a topic name
        (0b0000, text("t") + b"\x02\x0b\x01", mqtt5.PROTOCOL_ERROR),  # a Subscription Identifier [MQTT-3.3.4-6]
        (0b0110, text("t") + b"\x00\x01\x00", mqtt5.MALFORMED_PACKET),  # QoS 3
    ],
    ids=["short", "no topic", "alias 0", "wildcard", "subscription id", "qos 3"],
)
def test_publishes_that_break_the_rules(flags: int, body: bytes, code: int) -> None:
    with pytest.raises(mqtt5.Problem) as problem:
        mqtt5.parse(v3.PUBLISH, flags, body)
    assert problem.value.code == code


def test_a_publish_by_alias() -> None:
    body = text("") + struct.pack(">H", 7) + b"\x03\x23\x00\x02" + b"payload"
    packet = mqtt5.parse(v3.PUBLISH, 0b0011, body)
    assert isinstance(packet, mqtt5.Publish)
    assert (packet.topic, packet.packet_id, packet.qos, packet.retain, packet.payload) == ("", 7, 1, True, b"payload")
    assert packet.properties.get(mqtt5.TOPIC_ALIAS) == 2


def test_acknowledgements_short_and_long() -> None:
    assert mqtt5.parse(v3.PUBACK, 0, b"\x00\x05") == mqtt5.Acknowledgement(v3.PUBACK, 5, 0, mqtt5.NONE)
    found = mqtt5.parse(v3.PUBREC, 0, b"\x00\x05\x10\x00")
    assert isinstance(found, mqtt5.Acknowledgement) and found.code == mqtt5.NO_MATCHING_SUBSCRIBERS
    with pytest.raises(mqtt5.Problem) as problem:
        mqtt5.parse(v3.PUBREL, 0b0010, b"\x00\x05\x80")  # 0x80 is no reason PUBREL may give
    assert problem.value.code == mqtt5.PROTOCOL_ERROR


def test_subscription_options() -> None:
    body = b"\x00\x09\x02\x0b\x2a" + text("a/#") + bytes([0b00101110]) + text("b") + bytes([0b00010000])
    packet = mqtt5.parse(v3.SUBSCRIBE, 0b0010, body)
    assert isinstance(packet, mqtt5.Subscribe)
    assert packet.properties.get(mqtt5.SUBSCRIPTION_IDENTIFIER) == 42
    assert packet.subscriptions == (
        mqtt5.Subscription("a/#", 2, True, True, 2),
        mqtt5.Subscription("b", 0, False, False, 1),
    )
    for options in (0b01000000, 0b00110000, 0b00000011):  # reserved bits, Retain Handling 3, QoS 3
        with pytest.raises(mqtt5.Problem) as problem:
            mqtt5.parse(v3.SUBSCRIBE, 0b0010, b"\x00\x09\x00" + text("b") + bytes([options]))
        assert problem.value.code == mqtt5.MALFORMED_PACKET


def test_disconnect_and_auth() -> None:
    assert mqtt5.parse(v3.DISCONNECT, 0, b"") == mqtt5.Disconnect(0, mqtt5.NONE)
    expiry = mqtt5.parse(v3.DISCONNECT, 0, b"\x04\x05\x11\x00\x00\x00\x00")
    assert expiry == mqtt5.Disconnect(mqtt5.DISCONNECT_WITH_WILL, mqtt5.Properties({mqtt5.SESSION_EXPIRY_INTERVAL: 0}))
    assert mqtt5.parse(v3.AUTH_TYPE, 0, b"\x19\x00") == mqtt5.Auth(0x19, mqtt5.NONE)


def test_what_the_server_sends() -> None:
    connack = mqtt5.connack(True, 0, {mqtt5.RECEIVE_MAXIMUM: 10, mqtt5.SHARED_SUBSCRIPTION_AVAILABLE: 0})
    [(kind, _flags, body)] = v3.PacketReader().feed(connack)
    theirs = PahoProperties(PacketTypes.CONNACK)
    theirs.unpack(body[2:])
    assert (kind, body[:2], theirs.ReceiveMaximum, theirs.SharedSubscriptionAvailable) == (
        v3.CONNACK,
        b"\x01\x00",
        10,
        0,
    )
    assert mqtt5.acknowledgement(v3.PUBACK, 9) == b"\x40\x02\x00\x09"
    assert mqtt5.acknowledgement(v3.PUBACK, 9, mqtt5.NO_MATCHING_SUBSCRIBERS) == b"\x40\x04\x00\x09\x10\x00"
    assert mqtt5.suback(3, [1, 0x9E]) == b"\x90\x05\x00\x03\x00\x01\x9e"
    assert mqtt5.disconnect(mqtt5.SESSION_TAKEN_OVER) == b"\xe0\x02\x8e\x00"
    publish = mqtt5.publish("t", b"x", 1, False, False, 4, mqtt5.properties(v3.PUBLISH, {mqtt5.CONTENT_TYPE: "a"}))
    assert publish == b"\x32\x0b\x00\x01t\x00\x04\x04\x03\x00\x01ax"

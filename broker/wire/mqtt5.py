"""MQTT 5.0 on the wire (OASIS Standard, 7 March 2019): properties, reason codes, and the
packets of protocol level 5 that differ from 3.1.1's (``broker.wire.mqtt`` reads the fixed
header and the fields both share).

A packet of level 5 carries properties (section 2.2.2): a Variable Byte Integer length, then
each property as its identifier and a value of the identifier's type. :func:`read_properties`
reads them for one packet type, refusing one the type may not carry, and one sent twice that
may be sent once (a Protocol Error, [MQTT-2.2.2-2]); :func:`properties` writes them.
:func:`parse` reads a packet a client sends at level 5; :class:`Problem` is what breaks the
specification, with the reason code the server's DISCONNECT (or CONNACK) gives it before the
connection ends (section 4.13).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from postroom.broker.wire import mqtt as v3
from postroom.broker.wire.mqtt import (
    AUTH_TYPE,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBSCRIBE,
    UNSUBSCRIBE,
)

# -- reason codes (section 2.4) ------------------------------------------------------------------

SUCCESS = 0x00
GRANTED_QOS_1, GRANTED_QOS_2 = 0x01, 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# -- properties (section 2.2.2.2) -----------------------------------------------------------------

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

#: The packet type a Will's properties are read for (it is no packet of its own).
WILL = 0

BYTE, U16, U32, VBI, TEXT, BINARY, PAIR = "byte", "u16", "u32", "vbi", "text", "binary", "pair"

#: Each property: its type, and the packet types that may carry it (section 2.2.2.2's table).
PROPERTIES: dict[int, tuple[str, frozenset[int]]] = {
    PAYLOAD_FORMAT_INDICATOR: (BYTE, frozenset({PUBLISH, WILL})),
    MESSAGE_EXPIRY_INTERVAL: (U32, frozenset({PUBLISH, WILL})),
    CONTENT_TYPE: (TEXT, frozenset({PUBLISH, WILL})),
    RESPONSE_TOPIC: (TEXT, frozenset({PUBLISH, WILL})),
    CORRELATION_DATA: (BINARY, frozenset({PUBLISH, WILL})),
    SUBSCRIPTION_IDENTIFIER: (VBI, frozenset({PUBLISH, SUBSCRIBE})),
    SESSION_EXPIRY_INTERVAL: (U32, frozenset({CONNECT, v3.CONNACK, DISCONNECT})),
    ASSIGNED_CLIENT_IDENTIFIER: (TEXT, frozenset({v3.CONNACK})),
    SERVER_KEEP_ALIVE: (U16, frozenset({v3.CONNACK})),
    AUTHENTICATION_METHOD: (TEXT, frozenset({CONNECT, v3.CONNACK, AUTH_TYPE})),
    AUTHENTICATION_DATA: (BINARY, frozenset({CONNECT, v3.CONNACK, AUTH_TYPE})),
    REQUEST_PROBLEM_INFORMATION: (BYTE, frozenset({CONNECT})),
    WILL_DELAY_INTERVAL: (U32, frozenset({WILL})),
    REQUEST_RESPONSE_INFORMATION: (BYTE, frozenset({CONNECT})),
    RESPONSE_INFORMATION: (TEXT, frozenset({v3.CONNACK})),
    SERVER_REFERENCE: (TEXT, frozenset({v3.CONNACK, DISCONNECT})),
    REASON_STRING: (TEXT, frozenset({v3.CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, v3.SUBACK, v3.UNSUBACK})
                    | {DISCONNECT, AUTH_TYPE}),
    RECEIVE_MAXIMUM: (U16, frozenset({CONNECT, v3.CONNACK})),
    TOPIC_ALIAS_MAXIMUM: (U16, frozenset({CONNECT, v3.CONNACK})),
    TOPIC_ALIAS: (U16, frozenset({PUBLISH})),
    MAXIMUM_QOS: (BYTE, frozenset({v3.CONNACK})),
    RETAIN_AVAILABLE: (BYTE, frozenset({v3.CONNACK})),
    USER_PROPERTY: (PAIR, frozenset(range(0, 16))),
    MAXIMUM_PACKET_SIZE: (U32, frozenset({CONNECT, v3.CONNACK})),
    WILDCARD_SUBSCRIPTION_AVAILABLE: (BYTE, frozenset({v3.CONNACK})),
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: (BYTE, frozenset({v3.CONNACK})),
    SHARED_SUBSCRIPTION_AVAILABLE: (BYTE, frozenset({v3.CONNACK})),
}  # fmt: skip


class Problem(v3.MalformedPacket):
    """A packet of level 5 breaks the specification: end the connection with :attr:`code`
    (0x81 Malformed Packet, 0x82 Protocol Error, ...)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass(frozen=True, slots=True)
class Properties:
    """A packet's properties: each by its identifier, but user properties (their pairs, in
    order, in :attr:`user`)."""

    values: Mapping[int, Any] = field(default_factory=dict)
    user: tuple[tuple[str, str], ...] = ()

    def get(self, identifier: int, default: Any = None) -> Any:
        return self.values.get(identifier, default)


NONE = Properties()


def read_properties(fields: v3.Body, kind: int) -> Properties:
    """The properties at ``fields``' place, for a packet of type ``kind`` (:data:`WILL`: a
    Will's).

    :raises Problem: 0x81 for properties that do not add up, 0x82 for one ``kind`` may not
        carry or one sent twice that may be sent once
    """
    length = _vbi(fields)
    if fields.left() < length:
        raise Problem(MALFORMED_PACKET, f"properties of {length} bytes in a packet with {fields.left()} left")
    end = fields.at + length
    values: dict[int, Any] = {}
    user: list[tuple[str, str]] = []
    while fields.at < end:
        identifier = _vbi(fields)
        known = PROPERTIES.get(identifier)
        if known is None or kind not in known[1]:
            raise Problem(PROTOCOL_ERROR, f"property {identifier:#04x} in a packet of type {kind} [MQTT-2.2.2-2]")
        kind_of_value = known[0]
        if kind_of_value == PAIR:
            user.append((fields.string(), fields.string()))
            continue
        if identifier in values:
            raise Problem(PROTOCOL_ERROR, f"property {identifier:#04x} twice [MQTT-2.2.2-2]")
        values[identifier] = _value(fields, kind_of_value)
    if fields.at != end:
        raise Problem(MALFORMED_PACKET, "a property runs past the properties' length")
    if values.get(SUBSCRIPTION_IDENTIFIER) == 0:
        raise Problem(PROTOCOL_ERROR, "Subscription Identifier 0 [MQTT-3.8.2-1]")
    for identifier in (RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE):
        if values.get(identifier) == 0:
            raise Problem(PROTOCOL_ERROR, f"property {identifier:#04x} of 0 [MQTT-3.1.2-23]")
    for identifier in (PAYLOAD_FORMAT_INDICATOR, REQUEST_PROBLEM_INFORMATION, REQUEST_RESPONSE_INFORMATION):
        if values.get(identifier, 0) > 1:
            raise Problem(PROTOCOL_ERROR, f"property {identifier:#04x} of {values[identifier]}, not 0 or 1")
    return Properties(values, tuple(user)) if values or user else NONE


def _vbi(fields: v3.Body) -> int:
    value = 0
    for index in range(4):
        byte = fields.u8()
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value
    raise Problem(MALFORMED_PACKET, "a Variable Byte Integer of more than four bytes [MQTT-1.5.5-1]")


def _value(fields: v3.Body, kind: str) -> Any:
    if kind == BYTE:
        return fields.u8()
    if kind == U16:
        return fields.u16()
    if kind == U32:
        high = fields.u16()
        return high << 16 | fields.u16()
    if kind == VBI:
        return _vbi(fields)
    if kind == TEXT:
        return fields.string()
    return fields.binary()


def properties(kind: int, values: Mapping[int, Any] | None = None, user: tuple[tuple[str, str], ...] = ()) -> bytes:
    """Properties written for a packet of type ``kind``, in identifier order, user properties last."""
    out = bytearray()
    for identifier, given in sorted((values or {}).items()):
        if given is None:
            continue
        for value in given if isinstance(given, list) else [given]:  # (a PUBLISH's Subscription Identifiers)
            out += v3.variable_byte_integer(identifier)
            out += _value_bytes(identifier, value)
    for name, value in user:
        out += v3.variable_byte_integer(USER_PROPERTY) + v3.topic_field(name) + v3.topic_field(value)
    return v3.variable_byte_integer(len(out)) + bytes(out)


def _value_bytes(identifier: int, value: Any) -> bytes:
    """One property's value, written as its type says."""
    kind_of_value = PROPERTIES[identifier][0]
    if kind_of_value == BYTE:
        return bytes((value,))
    if kind_of_value == U16:
        return struct.pack(">H", value)
    if kind_of_value == U32:
        return struct.pack(">I", value)
    if kind_of_value == VBI:
        return v3.variable_byte_integer(value)
    if kind_of_value == TEXT:
        return v3.topic_field(value)
    return struct.pack(">H", len(value)) + bytes(value)


# -- the packets a client sends at level 5 ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    message: bytes
    qos: int
    retain: bool
    properties: Properties


@dataclass(frozen=True, slots=True)
class Connect:
    clean_start: bool
    keep_alive: int
    client_id: str
    will: Will | None
    username: str | None
    password: bytes | None
    properties: Properties


@dataclass(frozen=True, slots=True)
class Publish:
    #: Empty when the publish names its topic by alias only (:data:`TOPIC_ALIAS`).
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int | None
    properties: Properties


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """PUBACK, PUBREC, PUBREL or PUBCOMP, with its reason code (0: success)."""

    kind: int
    packet_id: int
    code: int
    properties: Properties


@dataclass(frozen=True, slots=True)
class Subscription:
    """A topic filter with its options (section 3.8.3.1)."""

    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]
    properties: Properties


@dataclass(frozen=True, slots=True)
class Disconnect:
    code: int
    properties: Properties


@dataclass(frozen=True, slots=True)
class Auth:
    code: int
    properties: Properties


Packet = Connect | Publish | Acknowledgement | Subscribe | Unsubscribe | v3.PingReq | Disconnect | Auth

#: Reason codes a client may give in each acknowledgement, DISCONNECT and AUTH (section 3).
_CLIENT_CODES = {
    PUBACK: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PUBREC: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PUBREL: frozenset({0x00, 0x92}),
    PUBCOMP: frozenset({0x00, 0x92}),
    DISCONNECT: frozenset({0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94}
                          | {0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2}),
    AUTH_TYPE: frozenset({0x00, 0x18, 0x19}),
}  # fmt: skip


def parse(kind: int, flags: int, body: bytes) -> Packet:
    """A packet a client sent at protocol level 5 (CONNECT included).

    :raises Problem: it breaks the specification (its reason code says how)
    """
    try:
        return _parse(kind, flags, body)
    except Problem:
        raise
    except v3.MalformedPacket as malformed:
        raise Problem(MALFORMED_PACKET, str(malformed)) from None


def _parse(kind: int, flags: int, body: bytes) -> Packet:
    if kind == PUBLISH:
        return _publish(flags, body)
    expected = _FLAGS.get(kind)
    if expected is None:
        raise Problem(MALFORMED_PACKET, f"packet type {kind}, which a client does not send [MQTT-2.1.3-1]")
    if flags != expected:
        raise Problem(MALFORMED_PACKET, f"packet type {kind} with flags {flags:04b}, not {expected:04b} [MQTT-2.1.3-1]")
    fields = v3.Body(body, f"a packet of type {kind}")
    if kind == CONNECT:
        return _connect(fields)
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        packet_id = fields.packet_id()
        code = fields.u8() if fields.left() else SUCCESS
        found = read_properties(fields, kind) if fields.left() else NONE
        fields.end()
        _check_code(kind, code)
        return Acknowledgement(kind, packet_id, code, found)
    if kind == SUBSCRIBE:
        return _subscribe(fields)
    if kind == UNSUBSCRIBE:
        packet_id = fields.packet_id()
        found = read_properties(fields, kind)
        filters = []
        while fields.left():
            filters.append(fields.string())
        if not filters:
            raise Problem(PROTOCOL_ERROR, "UNSUBSCRIBE without a topic filter [MQTT-3.10.3-2]")
        return Unsubscribe(packet_id, tuple(filters), found)
    if kind in (DISCONNECT, AUTH_TYPE):
        code = fields.u8() if fields.left() else SUCCESS
        found = read_properties(fields, kind) if fields.left() else NONE
        fields.end()
        _check_code(kind, code)
        return Disconnect(code, found) if kind == DISCONNECT else Auth(code, found)
    fields.end()
    return v3.PingReq()


_FLAGS = {CONNECT: 0, PUBACK: 0, PUBREC: 0, PUBREL: 0b0010, PUBCOMP: 0, SUBSCRIBE: 0b0010, UNSUBSCRIBE: 0b0010}
_FLAGS |= {PINGREQ: 0, DISCONNECT: 0, AUTH_TYPE: 0}


def _check_code(kind: int, code: int) -> None:
    if code not in _CLIENT_CODES[kind]:
        raise Problem(PROTOCOL_ERROR, f"reason code {code:#04x} in a packet of type {kind}")


def _connect(fields: v3.Body) -> Connect:
    name, level = fields.string(), fields.u8()
    if name != "MQTT" or level != 5:
        raise Problem(UNSUPPORTED_PROTOCOL_VERSION, f"protocol {name!r} level {level}")
    flags = fields.u8()
    if flags & 0x01:
        raise Problem(MALFORMED_PACKET, "CONNECT with its reserved flag set [MQTT-3.1.2-3]")
    will_flag, will_qos, will_retain = bool(flags & 0x04), (flags >> 3) & 0x03, bool(flags & 0x20)
    if will_qos == 3:
        raise Problem(MALFORMED_PACKET, "CONNECT with Will QoS 3 [MQTT-3.1.2-12]")
    if not will_flag and (will_qos or will_retain):
        raise Problem(MALFORMED_PACKET, "CONNECT with a Will QoS or Will Retain but no Will Flag [MQTT-3.1.2-11]")
    keep_alive = fields.u16()
    found = read_properties(fields, CONNECT)
    client_id = fields.string()
    will = None
    if will_flag:
        will_properties = read_properties(fields, WILL)
        topic = fields.string()
        will = Will(topic, fields.binary(), will_qos, will_retain, will_properties)
        if problem := v3.topic_problem(topic):
            raise Problem(TOPIC_NAME_INVALID, f"CONNECT with a Will Topic that {problem}")
    username = fields.string() if flags & 0x80 else None
    password = fields.binary() if flags & 0x40 else None
    fields.end()
    return Connect(bool(flags & 0x02), keep_alive, client_id, will, username, password, found)


def _publish(flags: int, body: bytes) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise Problem(MALFORMED_PACKET, "PUBLISH with QoS 3 [MQTT-3.3.1-4]")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise Problem(MALFORMED_PACKET, "PUBLISH with DUP at QoS 0 [MQTT-3.3.1-2]")
    fields = v3.Body(body, "PUBLISH")
    topic = fields.string()
    packet_id = fields.packet_id() if qos else None
    found = read_properties(fields, PUBLISH)
    if SUBSCRIPTION_IDENTIFIER in found.values:
        raise Problem(PROTOCOL_ERROR, "a client's PUBLISH with a Subscription Identifier [MQTT-3.3.4-6]")
    if topic:
        if problem := v3.topic_problem(topic):
            raise Problem(TOPIC_NAME_INVALID, f"PUBLISH to a topic that {problem}")
    elif TOPIC_ALIAS not in found.values:
        raise Problem(PROTOCOL_ERROR, "PUBLISH with neither a topic nor a Topic Alias [MQTT-3.3.2-1]")
    if found.get(TOPIC_ALIAS) == 0:
        raise Problem(TOPIC_ALIAS_INVALID, "Topic Alias 0 [MQTT-3.3.2-8]")
    return Publish(topic, body[fields.at :], qos, bool(flags & 0x01), dup, packet_id, found)


def _subscribe(fields: v3.Body) -> Subscribe:
    packet_id = fields.packet_id()
    found = read_properties(fields, SUBSCRIBE)
    subscriptions = []
    while fields.left():
        topic_filter = fields.string()
        options = fields.u8()
        if options & 0xC0 or options & 0x03 == 3 or (options >> 4) & 0x03 == 3:
            raise Problem(MALFORMED_PACKET, f"subscription options {options:#04x} [MQTT-3.8.3-5]")
        subscriptions.append(
            Subscription(topic_filter, options & 0x03, bool(options & 0x04), bool(options & 0x08), (options >> 4) & 3)
        )
    if not subscriptions:
        raise Problem(PROTOCOL_ERROR, "SUBSCRIBE without a topic filter [MQTT-3.8.3-2]")
    return Subscribe(packet_id, tuple(subscriptions), found)


# -- what a server sends at level 5 ---------------------------------------------------------------


def connack(session_present: bool, code: int, values: Mapping[int, Any] | None = None) -> bytes:
    return v3.packet(v3.CONNACK << 4, bytes([int(session_present), code]) + properties(v3.CONNACK, values))


def publish(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None, props: bytes = b"\x00"
) -> bytes:
    """A PUBLISH, its properties (:func:`properties`) written already."""
    head = v3.topic_field(topic) + (struct.pack(">H", packet_id) if qos and packet_id is not None else b"")
    return v3.packet(PUBLISH << 4 | dup << 3 | qos << 1 | retain, head + props + payload)


def with_topic_alias(props: bytes, alias: int) -> bytes:
    """``props`` (written by :func:`properties`) with a Topic Alias added in front (the order of
    properties carries no meaning, section 2.2.2.2)."""
    length, at = 0, 0
    for shift in range(0, 28, 7):
        byte = props[at]
        length |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            break
    return v3.variable_byte_integer(length + 3) + struct.pack(">BH", TOPIC_ALIAS, alias) + props[at:]


def acknowledgement(kind: int, packet_id: int, code: int = SUCCESS, reason: str | None = None) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP; the short form when it succeeded and says nothing
    more (section 3.4.2.1)."""
    first = kind << 4 | (0b0010 if kind == PUBREL else 0)
    if code == SUCCESS and reason is None:
        return v3.packet(first, struct.pack(">H", packet_id))
    return v3.packet(first, struct.pack(">HB", packet_id, code) + properties(kind, {REASON_STRING: reason}))


def suback(packet_id: int, codes: list[int], kind: int = v3.SUBACK) -> bytes:
    """SUBACK (or UNSUBACK, with ``kind``) with a reason code for each filter."""
    return v3.packet(kind << 4, struct.pack(">H", packet_id) + properties(kind) + bytes(codes))


def disconnect(code: int, reason: str | None = None) -> bytes:
    """The server's DISCONNECT with ``code`` (section 3.14)."""
    return v3.packet(DISCONNECT << 4, bytes([code]) + properties(DISCONNECT, {REASON_STRING: reason}))

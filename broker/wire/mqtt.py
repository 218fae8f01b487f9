"""MQTT 3.1.1 on the wire (OASIS Standard, 29 October 2014), and MQTT 3.1, which RabbitMQ
3.10's plugin also reads: the packets a client sends, read and checked as the specification
asks, and those a server sends, written.

A packet is a fixed header (the type in the high four bits of its first byte, flags in the
low four) and a remaining length (one to four bytes, seven bits each, least significant first,
the high bit saying another follows), then that many bytes. :class:`PacketReader` cuts packets
out of what the socket gives; :func:`parse` turns one a client sent into its dataclass, and
raises :class:`MalformedPacket` for anything the specification calls malformed (the server
then closes the connection, [MQTT-4.8.0-1]), citing the rule. A CONNECT of a protocol level
this module does not read is returned as it is: answering it (CONNACK 1) is the session's part.

Topic names map onto AMQP routing keys as RabbitMQ 3.10 maps them (``rabbit_mqtt_util``):
``/`` becomes ``.`` and ``+`` becomes ``*``, and back (:func:`to_amqp`, :func:`to_mqtt`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "Acknowledgement",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "PacketReader",
    "PacketTooLarge",
    "PingReq",
    "Publish",
    "Subscribe",
    "Unsubscribe",
    "Will",
    "acknowledgement",
    "connack",
    "filter_problem",
    "matches",
    "parse",
    "pingresp",
    "publish",
    "suback",
    "to_amqp",
    "to_mqtt",
    "topic_problem",
]

#: Packet types (section 2.2.1).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
#: MQTT 5.0's AUTH (``broker.wire.mqtt5``): a 3.1.1 client sends no packet of this type.
AUTH_TYPE = 15

#: CONNACK return codes (section 3.2.2.3).
ACCEPTED = 0
UNACCEPTABLE_PROTOCOL_VERSION = 1
IDENTIFIER_REJECTED = 2
SERVER_UNAVAILABLE = 3
BAD_USERNAME_OR_PASSWORD = 4
NOT_AUTHORIZED = 5

#: A SUBACK's return code for a subscription refused (section 3.9.3).
SUBSCRIPTION_FAILURE = 0x80

#: The most a remaining length can say: four bytes of seven bits (section 2.2.3).
MAX_REMAINING_LENGTH = 268_435_455

#: The protocol levels read, with the protocol name each must come with (section 3.1.2.1-2).
PROTOCOLS = {4: "MQTT", 3: "MQIsdp"}

#: The flags each type's fixed header must have; PUBLISH's carry DUP, QoS and RETAIN (2.2.2).
_FLAGS = {
    CONNECT: 0,
    PUBACK: 0,
    PUBREC: 0,
    PUBREL: 0b0010,
    PUBCOMP: 0,
    SUBSCRIBE: 0b0010,
    UNSUBSCRIBE: 0b0010,
    PINGREQ: 0,
    DISCONNECT: 0,
}

_U16 = struct.Struct(">H")


class MalformedPacket(ValueError):
    """What a client sent breaks the specification (the message cites the rule): the server
    closes the connection without a reply [MQTT-4.8.0-1]."""


class PacketTooLarge(MalformedPacket):
    """A packet longer than the server takes."""


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    message: bytes
    qos: int
    retain: bool


@dataclass(frozen=True, slots=True)
class Connect:
    protocol_name: str
    protocol_level: int
    clean_session: bool
    keep_alive: int
    client_id: str
    will: Will | None
    username: str | None
    password: bytes | None


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    #: ``None`` at QoS 0.
    packet_id: int | None


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """PUBACK, PUBREC, PUBREL or PUBCOMP (:attr:`kind`) for :attr:`packet_id`."""

    kind: int
    packet_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    #: Each topic filter with the QoS asked for, in the order sent.
    filters: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    pass


Packet = Connect | Publish | Acknowledgement | Subscribe | Unsubscribe | PingReq | Disconnect


class PacketReader:
    """Cuts packets out of a byte stream: :meth:`feed` returns ``(type, flags, body)`` for each
    packet completed, keeping what is left for the next call.

    :param max_packet: the longest remaining length taken; longer raises :class:`PacketTooLarge`
        as soon as its length is read, before its body is buffered
    """

    def __init__(self, max_packet: int = MAX_REMAINING_LENGTH) -> None:
        self.max_packet = max_packet
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buffer = self._buffer
        buffer += data
        packets = []
        start = 0
        while True:
            header = _fixed_header(buffer, start)
            if header is None:
                break
            first, length, body_at = header
            if length > self.max_packet:
                raise PacketTooLarge(f"a packet of {length} bytes, over the {self.max_packet} taken")
            if len(buffer) - body_at < length:
                break
            packets.append((first >> 4, first & 0x0F, bytes(buffer[body_at : body_at + length])))
            start = body_at + length
        del buffer[:start]
        return packets


def _fixed_header(buffer: bytearray, start: int) -> tuple[int, int, int] | None:
    """``(first byte, remaining length, where the body starts)``, or ``None`` when more bytes
    are needed to know."""
    if len(buffer) - start < 2:
        return None
    length = 0
    for index in range(4):
        at = start + 1 + index
        if at >= len(buffer):
            return None
        byte = buffer[at]
        length |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return buffer[start], length, at + 1
    raise MalformedPacket("a remaining length of more than four bytes [MQTT-2.2.3]")


class Body:
    """Reads the fields of a packet's body in order (3.1.1's and 5.0's alike)."""

    def __init__(self, data: bytes, kind: str) -> None:
        self.data = data
        self.at = 0
        self.kind = kind

    def left(self) -> int:
        return len(self.data) - self.at

    def u8(self) -> int:
        if self.left() < 1:
            raise MalformedPacket(f"{self.kind} ends early")
        value = self.data[self.at]
        self.at += 1
        return value

    def u16(self) -> int:
        if self.left() < 2:
            raise MalformedPacket(f"{self.kind} ends early")
        value: int = _U16.unpack_from(self.data, self.at)[0]
        self.at += 2
        return value

    def binary(self) -> bytes:
        length = self.u16()
        if self.left() < length:
            raise MalformedPacket(f"{self.kind} ends inside a field of {length} bytes")
        value = self.data[self.at : self.at + length]
        self.at += length
        return value

    def string(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket(f"{self.kind} holds a string that is not UTF-8 [MQTT-1.5.3-1]") from None
        if "\x00" in text:
            raise MalformedPacket(f"{self.kind} holds a string with U+0000 [MQTT-1.5.3-2]")
        return text

    def packet_id(self) -> int:
        value = self.u16()
        if value == 0:
            raise MalformedPacket(f"{self.kind} has packet identifier 0 [MQTT-2.3.1-1]")
        return value

    def end(self) -> None:
        if self.left():
            raise MalformedPacket(f"{self.kind} has {self.left()} byte(s) after its fields")


def parse(kind: int, flags: int, body: bytes) -> Packet:
    """The packet a client sent, from :class:`PacketReader`'s ``(type, flags, body)``.

    :raises MalformedPacket: the packet breaks the specification, or is one only a server sends
    """
    if kind == PUBLISH:
        return _publish(flags, body)
    expected = _FLAGS.get(kind)
    if expected is None:
        raise MalformedPacket(f"packet type {kind}, which a client does not send [MQTT-2.2.1]")
    if flags != expected:
        raise MalformedPacket(f"packet type {kind} with flags {flags:04b}, not {expected:04b} [MQTT-2.2.2-2]")
    if kind == CONNECT:
        return _connect(body)
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        fields = Body(body, "an acknowledgement")
        acknowledged = Acknowledgement(kind, fields.packet_id())
        fields.end()
        return acknowledged
    if kind == SUBSCRIBE:
        return _subscribe(body)
    if kind == UNSUBSCRIBE:
        return _unsubscribe(body)
    if body:
        raise MalformedPacket(f"packet type {kind} with a body of {len(body)} byte(s)")
    return PingReq() if kind == PINGREQ else Disconnect()


def _connect(body: bytes) -> Connect:
    fields = Body(body, "CONNECT")
    name = fields.string()
    level = fields.u8()
    if PROTOCOLS.get(level) != name:
        # Answered with CONNACK 1 when the level is one not read, and the name right for it
        # (3.1.2.2); a name that is not MQTT's is the session's to refuse [MQTT-3.1.2-1].
        return Connect(name, level, True, 0, "", None, None, None)
    flags = fields.u8()
    if flags & 0x01:
        raise MalformedPacket("CONNECT with its reserved flag set [MQTT-3.1.2-3]")
    will_flag, will_qos, will_retain = bool(flags & 0x04), (flags >> 3) & 0x03, bool(flags & 0x20)
    has_username, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if will_qos == 3:
        raise MalformedPacket("CONNECT with Will QoS 3 [MQTT-3.1.2-14]")
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("CONNECT with a Will QoS or Will Retain but no Will Flag [MQTT-3.1.2-11]")
    if has_password and not has_username:
        raise MalformedPacket("CONNECT with a password but no user name [MQTT-3.1.2-22]")
    keep_alive = fields.u16()
    client_id = fields.string()
    will = None
    if will_flag:
        topic = fields.string()
        will = Will(topic, fields.binary(), will_qos, will_retain)
        if problem := topic_problem(topic):
            raise MalformedPacket(f"CONNECT with a Will Topic that {problem}")
    username = fields.string() if has_username else None
    password = fields.binary() if has_password else None
    fields.end()
    return Connect(name, level, bool(flags & 0x02), keep_alive, client_id, will, username, password)


def _publish(flags: int, body: bytes) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3 [MQTT-3.3.1-4]")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH with DUP at QoS 0 [MQTT-3.3.1-2]")
    fields = Body(body, "PUBLISH")
    topic = fields.string()
    if problem := topic_problem(topic):
        raise MalformedPacket(f"PUBLISH to a topic that {problem}")
    packet_id = fields.packet_id() if qos else None
    return Publish(topic, body[fields.at :], qos, bool(flags & 0x01), dup, packet_id)


def _subscribe(body: bytes) -> Subscribe:
    fields = Body(body, "SUBSCRIBE")
    packet_id = fields.packet_id()
    filters = []
    while fields.left():
        topic_filter = fields.string()
        requested = fields.u8()
        if requested & 0xFC or requested == 3:
            raise MalformedPacket(f"SUBSCRIBE asking for {requested:#04x}, not a QoS [MQTT-3.8.3-4]")
        filters.append((topic_filter, requested))
    if not filters:
        raise MalformedPacket("SUBSCRIBE without a topic filter [MQTT-3.8.3-3]")
    return Subscribe(packet_id, tuple(filters))


def _unsubscribe(body: bytes) -> Unsubscribe:
    fields = Body(body, "UNSUBSCRIBE")
    packet_id = fields.packet_id()
    filters = []
    while fields.left():
        filters.append(fields.string())
    if not filters:
        raise MalformedPacket("UNSUBSCRIBE without a topic filter [MQTT-3.10.3-2]")
    return Unsubscribe(packet_id, tuple(filters))


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be published to, or ``None``."""
    if not topic:
        return "is empty [MQTT-4.7.3-1]"
    if "+" in topic or "#" in topic:
        return "holds a wildcard [MQTT-3.3.2-2]"
    if len(topic.encode()) > 65535:
        return "is longer than 65,535 bytes [MQTT-4.7.3-3]"
    return None


def filter_problem(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a topic filter, or ``None`` (section 4.7.1)."""
    if not topic_filter:
        return "is empty [MQTT-4.7.3-1]"
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return "has a # that is not a whole last level [MQTT-4.7.1-2]"
        if "+" in level and level != "+":
            return "has a + that is not a whole level [MQTT-4.7.1-3]"
    return None


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic_filter`` (a valid one: :func:`filter_problem`) matches the topic name
    ``topic``, as section 4.7 gives it: ``+`` one whole level, ``#`` the rest and the level
    above it (``sport/#`` matches ``sport``), and no filter that starts with a wildcard matches
    a topic that starts with ``$`` [MQTT-4.7.2-1]. For the broker's own matching of what an
    MQTT client's subscription receives (retained messages, which RabbitMQ 3.10 does not match
    to wildcards)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    wanted, levels = topic_filter.split("/"), topic.split("/")
    for index, level in enumerate(wanted):
        if level == "#":
            return True
        if index >= len(levels) or (level != "+" and level != levels[index]):
            return False
    return len(wanted) == len(levels)


def to_amqp(topic: str) -> str:
    """An MQTT topic name or filter as an AMQP routing or binding key (RabbitMQ 3.10's
    ``rabbit_mqtt_util:to_amqp``): ``/`` becomes ``.``, ``+`` becomes ``*``."""
    return topic.replace("/", ".").replace("+", "*")


def to_mqtt(key: str) -> str:
    """An AMQP routing key as an MQTT topic name (``rabbit_mqtt_util:to_mqtt``)."""
    return key.replace("*", "+").replace(".", "/")


# -- what a server sends ----------------------------------------------------------------------


def packet(first: int, body: bytes) -> bytes:
    """A packet: its first byte, the remaining length, then ``body``."""
    return bytes((first,)) + variable_byte_integer(len(body)) + body


def connack(session_present: bool, code: int) -> bytes:
    return packet(CONNACK << 4, bytes([int(session_present), code]))


def publish(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None) -> bytes:
    return publish_packet(topic_field(topic), payload, qos, retain, dup, packet_id)


def topic_field(topic: str) -> bytes:
    """A topic name as PUBLISH carries it (its length, then its UTF-8): a sender keeps it."""
    name = topic.encode()
    return _U16.pack(len(name)) + name


def publish_packet(topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None) -> bytes:
    """A PUBLISH of ``payload`` to ``topic`` (a :func:`topic_field`), put together at once."""
    length = len(topic) + len(payload) + (2 if qos else 0)
    first = PUBLISH << 4 | dup << 3 | qos << 1 | retain
    if length < 0x80:
        head = bytes((first, length))
    elif length < 0x4000:
        head = bytes((first, length & 0x7F | 0x80, length >> 7))
    else:
        head = bytes((first,)) + variable_byte_integer(length)
    if qos and packet_id is not None:
        return b"".join((head, topic, _U16.pack(packet_id), payload))
    return b"".join((head, topic, payload))


def variable_byte_integer(length: int) -> bytes:
    """A remaining length, or MQTT 5.0's Variable Byte Integer: seven bits a byte, least
    significant first, the high bit saying another follows (section 2.2.3)."""
    out = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        out.append(byte | 0x80 if length else byte)
        if not length:
            return bytes(out)


def acknowledgement(kind: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBREL (its flags 0010) or PUBCOMP; UNSUBACK too."""
    return packet(kind << 4 | (0b0010 if kind == PUBREL else 0), _U16.pack(packet_id))


def suback(packet_id: int, codes: list[int]) -> bytes:
    return packet(SUBACK << 4, _U16.pack(packet_id) + bytes(codes))


def pingresp() -> bytes:
    return packet(PINGRESP << 4, b"")

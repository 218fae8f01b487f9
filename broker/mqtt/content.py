"""What an MQTT message is on the AMQP side, as RabbitMQ 3.10's MQTT plugin makes it: the
routing key from the topic (``/`` to ``.``, ``+`` to ``*``), ``delivery_mode`` 2 for QoS 1
and 2 (1 for QoS 0), and the headers ``x-mqtt-publish-qos`` (a byte) and ``x-mqtt-dup`` (a
boolean), in that order (``rabbit_mqtt_processor:amqp_pub``).

The six content headers a publish can have (three QoS, with and without DUP) differ only in
the body size, so each is built once: a publish pastes its size in. A delivery reads the QoS
back from those same bytes when the message came from MQTT, and decodes the headers only when
it did not (an AMQP publisher that set ``x-mqtt-publish-qos`` itself).
"""

from __future__ import annotations

import struct

from postroom.broker.core.message import Message
from postroom.broker.wire.codec import BASIC_CLASS, FLAG_DELIVERY_MODE, FLAG_HEADERS, shortstr

#: The header that carries the QoS a message was published with.
QOS_HEADER = "x-mqtt-publish-qos"
#: The header that carries a publish's DUP flag.
DUP_HEADER = "x-mqtt-dup"

_class_weight_size = struct.Struct(">HHQ")


def _properties(qos: int, dup: bool) -> bytes:
    """The property flags and properties of a publish at ``qos`` (headers, delivery mode)."""
    entries = shortstr(QOS_HEADER) + b"b" + struct.pack(">b", qos) + shortstr(DUP_HEADER) + b"t" + bytes([dup])
    table = struct.pack(">I", len(entries)) + entries
    return struct.pack(">H", FLAG_HEADERS | FLAG_DELIVERY_MODE) + table + bytes([2 if qos else 1])


#: The properties part of a published message's content header, by (QoS, DUP).
_TEMPLATES = {(qos, dup): _properties(qos, dup) for qos in (0, 1, 2) for dup in (False, True)}
#: The QoS of a message published over MQTT, by its content header's properties part.
_QOS_OF = {properties: qos for (qos, _dup), properties in _TEMPLATES.items()}


def content_header(qos: int, dup: bool, size: int) -> bytes:
    """The content header of a message published at ``qos`` with a body of ``size`` bytes."""
    return _class_weight_size.pack(BASIC_CLASS, 0, size) + _TEMPLATES[qos, dup]


def published_qos(message: Message) -> int:
    """The QoS ``message`` was published with: its ``x-mqtt-publish-qos`` header, or 1 for a
    message that has none (RabbitMQ's plugin takes any AMQP publish as QoS 1, whatever its
    ``delivery_mode``)."""
    qos = _QOS_OF.get(message.header[12:])
    if qos is not None:
        return qos
    value = message.lenient_headers().get(QOS_HEADER)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2:
        return value
    return 1


def is_plain(message: Message) -> bool:
    """Whether ``message`` came from an MQTT 3.1.1 publish (it has no properties but the
    plugin's headers)."""
    return message.header[12:] in _QOS_OF

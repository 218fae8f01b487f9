"""MQTT 5.0's PUBLISH properties on the AMQP side, as RabbitMQ 3.13's MQTT plugin maps them
(``mc_mqtt``), both ways.

From MQTT 5.0 to an AMQP message: Content Type becomes ``content_type`` (when it is a short
ASCII string), Correlation Data ``correlation_id`` (when it is a short UTF-8 string, else the
header ``x-correlation-id``), Response Topic the header ``x-reply-to-topic`` (as a routing
key), User Properties headers of the same names (the first of each name, sorted; names of 256
bytes or more left out, the others in the order given), Message Expiry Interval
``expiration`` in milliseconds. Postroom also keeps the publish's QoS and DUP as 3.1.1
publishes do (``x-mqtt-publish-qos``, ``x-mqtt-dup``), a retained publish's RETAIN
(``x-mqtt-retain``), for subscriptions that ask for it as published, and its Payload Format
Indicator (``x-mqtt-payload-format``), which RabbitMQ hands to MQTT subscribers untouched.

From an AMQP message to an MQTT 5.0 subscriber: ``content_type`` becomes Content Type,
``correlation_id`` (or ``x-correlation-id``) Correlation Data, ``x-reply-to-topic`` Response
Topic, every other header a User Property (strings as they are, numbers and booleans written
out, tables and arrays left out), and the time left of a message's TTL its Message Expiry
Interval (in whole seconds); ``x-mqtt-payload-format`` its Payload Format Indicator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pamqp import commands

from postroom.broker.core.message import Message
from postroom.broker.errors import AMQPError
from postroom.broker.mqtt.content import DUP_HEADER, QOS_HEADER
from postroom.broker.wire import mqtt as wire
from postroom.broker.wire import mqtt5
from postroom.broker.wire.codec import encode_content_header

#: Headers that carry what an AMQP property cannot.
CORRELATION_HEADER = "x-correlation-id"
REPLY_TO_TOPIC_HEADER = "x-reply-to-topic"
RETAIN_HEADER = "x-mqtt-retain"
#: MQTT 5.0's Payload Format Indicator, as published (RabbitMQ 3.13 hands it from MQTT
#: publisher to MQTT subscriber, its message never being an AMQP 0-9-1 one in between).
PAYLOAD_FORMAT_HEADER = "x-mqtt-payload-format"
#: Headers of Postroom's own, not User Properties.
_OWN = frozenset(
    {QOS_HEADER, DUP_HEADER, RETAIN_HEADER, CORRELATION_HEADER, REPLY_TO_TOPIC_HEADER, PAYLOAD_FORMAT_HEADER}
)


def amqp_header(qos: int, dup: bool, retain: bool, size: int, found: mqtt5.Properties) -> bytes:
    """The AMQP content header of an MQTT 5.0 publish with properties ``found``."""
    values = found.values
    chosen: dict[str, str] = {}
    for name, value in sorted(found.user):
        if len(name.encode()) < 256 and name not in chosen:
            chosen[name] = value
    # (RabbitMQ's choice of value for each name, in the order the publisher gave the names: an
    # MQTT subscriber gets them in that order)
    headers: dict[str, Any] = {name: chosen[name] for name, _value in found.user if name in chosen}
    content_type = values.get(mqtt5.CONTENT_TYPE)
    if content_type is not None and (len(content_type) >= 256 or not content_type.isascii()):
        content_type = None
    correlation_id = None
    data = values.get(mqtt5.CORRELATION_DATA)
    if data is not None:
        text = _short_text(data)
        if text is None:
            headers[CORRELATION_HEADER] = data
        else:
            correlation_id = text
    response_topic = values.get(mqtt5.RESPONSE_TOPIC)
    if response_topic is not None:
        headers[REPLY_TO_TOPIC_HEADER] = wire.to_amqp(response_topic)
    headers[QOS_HEADER] = qos
    headers[DUP_HEADER] = dup
    if retain:
        headers[RETAIN_HEADER] = True
    if mqtt5.PAYLOAD_FORMAT_INDICATOR in values:
        headers[PAYLOAD_FORMAT_HEADER] = values[mqtt5.PAYLOAD_FORMAT_INDICATOR]
    expiry = values.get(mqtt5.MESSAGE_EXPIRY_INTERVAL)
    properties = commands.Basic.Properties(
        content_type=content_type,
        correlation_id=correlation_id,
        headers=headers,
        delivery_mode=2 if qos else 1,
        expiration=str(expiry * 1000) if expiry is not None else None,
    )
    return encode_content_header(size, properties)


def _short_text(data: bytes) -> str | None:
    """``data`` as an AMQP short string, or ``None`` when it cannot be one."""
    if len(data) >= 256 or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def mqtt_properties(
    message: Message, remaining_ms: float | None, identifiers: list[int] | None = None
) -> tuple[bytes, bool]:
    """The properties (written) an MQTT 5.0 subscriber gets with ``message``, and whether it
    was published retained. ``remaining_ms``: what is left of its TTL (``None``: none);
    ``identifiers``: the Subscription Identifiers of the subscriptions it matched."""
    # (a delivery runs after the publish was confirmed: properties that do not decode are
    # left out, never raised)
    try:
        properties: commands.Basic.Properties | None = message.properties
    except AMQPError:
        properties = None
    headers: Mapping[str, Any] = message.lenient_headers()
    values: dict[int, Any] = {}
    if properties is not None and properties.content_type is not None:
        values[mqtt5.CONTENT_TYPE] = properties.content_type
    if properties is not None and properties.correlation_id is not None:
        values[mqtt5.CORRELATION_DATA] = properties.correlation_id.encode()
    elif isinstance(headers.get(CORRELATION_HEADER), (bytes, str)):
        value = headers[CORRELATION_HEADER]
        values[mqtt5.CORRELATION_DATA] = value if isinstance(value, bytes) else value.encode()
    reply_to = headers.get(REPLY_TO_TOPIC_HEADER)
    if isinstance(reply_to, (bytes, str)):
        values[mqtt5.RESPONSE_TOPIC] = wire.to_mqtt(reply_to if isinstance(reply_to, str) else reply_to.decode())
    if headers.get(PAYLOAD_FORMAT_HEADER) in (0, 1):
        values[mqtt5.PAYLOAD_FORMAT_INDICATOR] = headers[PAYLOAD_FORMAT_HEADER]
    if remaining_ms is not None:
        values[mqtt5.MESSAGE_EXPIRY_INTERVAL] = max(0, int(remaining_ms // 1000))
    if identifiers:
        values[mqtt5.SUBSCRIPTION_IDENTIFIER] = identifiers
    user = tuple(
        (name, text) for name, value in headers.items() if name not in _OWN and (text := _text(value)) is not None
    )
    return mqtt5.properties(wire.PUBLISH, values, user), headers.get(RETAIN_HEADER) is True


def _text(value: Any) -> str | None:
    """A header's value as a User Property's, or ``None`` for one that has no such form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        return None if "\x00" in value else value
    if value is None:
        return ""
    return None

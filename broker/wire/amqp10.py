"""AMQP 1.0 messages, as RabbitMQ's stream protocol carries them, and their AMQP 0-9-1 form.

A message published over the stream protocol is kept as its client encoded it (AMQP 1.0
sections: header, annotations, properties, application properties, data ...) and sent on to
stream-protocol readers unchanged. An AMQP 0-9-1 consumer of the same stream gets it
converted (:func:`to_amqp091`), and a stream-protocol reader gets a message published over
AMQP 0-9-1 converted the other way (:func:`from_amqp091`), both as RabbitMQ 3.10's
``rabbit_msg_record`` maps them: properties to properties, headers to application
properties, ``type`` and ``app-id`` as ``x-basic-type`` and ``x-basic-app-id`` application
properties, priority, delivery mode and expiration as ``x-basic-*`` message annotations, the
exchange and routing key as ``x-exchange`` and ``x-routing-key`` annotations, the body as
one data section. Timestamps are milliseconds in AMQP 1.0, seconds in 0-9-1.

Values decode to ``(type, value)`` pairs (``("utf8", "text")``, ``("ulong", 7)`` ...), so
that their types survive a conversion.
"""

from __future__ import annotations

import base64
import datetime
import struct
import uuid
from collections.abc import Iterable
from typing import Any

from pamqp import commands

from postroom.broker.wire.codec import decode_properties, encode_content_header, split_names

Typed = tuple[str, Any]

#: Section descriptors.
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, SEQUENCE, VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
_SYMBOLIC = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": SEQUENCE,
    b"amqp:amqp-value:*": VALUE,
    b"amqp:footer:map": FOOTER,
}
#: The properties section's fields, in order.
PROPERTY_FIELDS = (
    "message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type", "content_encoding",
    "absolute_expiry_time", "creation_time", "group_id", "group_sequence", "reply_to_group_id",
)  # fmt: skip


class AMQP10Error(ValueError):
    """Bytes that are not an AMQP 1.0 message."""


_FIXED: dict[int, tuple[str, str]] = {
    0x50: ("ubyte", ">B"), 0x51: ("byte", ">b"), 0x60: ("ushort", ">H"), 0x61: ("short", ">h"),
    0x70: ("uint", ">I"), 0x52: ("uint", ">B"), 0x71: ("int", ">i"), 0x54: ("int", ">b"),
    0x80: ("ulong", ">Q"), 0x53: ("ulong", ">B"), 0x81: ("long", ">q"), 0x55: ("long", ">b"),
    0x72: ("float", ">f"), 0x82: ("double", ">d"), 0x83: ("timestamp", ">q"),
}  # fmt: skip
_VARIABLE = {0xA0: "binary", 0xA1: "utf8", 0xA3: "symbol", 0xB0: "binary", 0xB1: "utf8", 0xB3: "symbol"}
_OPAQUE = {0x73: ("char", 4), 0x74: ("decimal32", 4), 0x84: ("decimal64", 8), 0x94: ("decimal128", 16)}


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data = data
        self.at = at

    def take(self, size: int) -> bytes:
        end = self.at + size
        if size < 0 or end > len(self.data):
            raise AMQP10Error("short")
        value = self.data[self.at : end]
        self.at = end
        return value

    def unpack(self, shape: str) -> Any:
        size = struct.calcsize(shape)
        return struct.unpack(shape, self.take(size))[0]

    def value(self) -> Typed:
        return self.body(self.unpack(">B"))

    def body(self, code: int) -> Typed:
        """The value of type ``code`` that starts here."""
        if code == 0x00:
            descriptor = self.value()
            return ("described", (descriptor, self.value()))
        if code == 0x40:
            return ("null", None)
        if code in (0x41, 0x42):
            return ("boolean", code == 0x41)
        if code == 0x56:
            return ("boolean", self.unpack(">B") != 0)
        if code in (0x43, 0x44):
            return ("uint" if code == 0x43 else "ulong", 0)
        fixed = _FIXED.get(code)
        if fixed is not None:
            return (fixed[0], self.unpack(fixed[1]))
        opaque = _OPAQUE.get(code)
        if opaque is not None:
            return (opaque[0], self.take(opaque[1]))
        if code == 0x98:
            return ("uuid", uuid.UUID(bytes=self.take(16)))
        if code in _VARIABLE:
            raw = self.take(self.unpack(">B" if code < 0xB0 else ">I"))
            kind = _VARIABLE[code]
            if kind == "binary":
                return ("binary", raw)
            try:
                return (kind, raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise AMQP10Error("text that is not UTF-8") from None
        if code == 0x45:
            return ("list", [])
        if code in (0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0):
            wide = code >= 0xD0 and code != 0xE0
            inner = _Reader(self.take(self.unpack(">I" if wide else ">B")))
            count = inner.unpack(">I" if wide else ">B")
            if code in (0xE0, 0xF0):
                element = inner.unpack(">B")
                if element == 0x00:
                    raise AMQP10Error("an array of described values")
                return ("array", [inner.body(element) for _ in range(count)])
            items = [inner.value() for _ in range(count)]
            if code in (0xC0, 0xD0):
                return ("list", items)
            if count % 2:
                raise AMQP10Error("a map with an odd count")
            return ("map", list(zip(items[::2], items[1::2], strict=True)))
        raise AMQP10Error(f"unknown type code 0x{code:02x}")


def sections(message: bytes) -> list[tuple[int, Typed]]:
    """The sections of ``message``: ``(descriptor code, value)`` each, in order.

    :raises AMQP10Error: not a sequence of described sections
    """
    reader = _Reader(message)
    found = []
    try:
        while reader.at < len(message):
            kind, value = reader.value()
            if kind != "described":
                raise AMQP10Error("a section that is not described")
            (descriptor_kind, descriptor), inner = value
            if descriptor_kind == "ulong":
                code = descriptor
            elif descriptor_kind == "symbol":
                code = _SYMBOLIC.get(descriptor.encode(), -1)
            else:
                raise AMQP10Error("a section descriptor that is neither a number nor a symbol")
            found.append((code, inner))
    except (struct.error, IndexError) as error:
        raise AMQP10Error(str(error)) from None
    return found


# -- to AMQP 0-9-1 ----------------------------------------------------------------------------


def _plain(value: Typed) -> Any:
    return value[1]


def _header_value(value: Typed) -> Any:
    """An application property as a 0-9-1 header value (RabbitMQ's ``to_091``)."""
    kind, plain = value
    if kind == "timestamp":
        return _Timestamp(plain // 1000)
    if kind in ("symbol", "utf8"):
        return plain
    if kind == "null":
        return None
    if kind == "uuid":
        return str(plain)
    if kind in ("list", "map", "array", "described"):
        return str(plain)
    return plain


class _Timestamp(int):
    """A header value to encode as a 0-9-1 timestamp."""


def _message_id(value: Typed | None, key: str, headers: dict[str, Any]) -> str | None:
    """A message or correlation id as 0-9-1 carries it (RabbitMQ's ``message_id/3``)."""
    if value is None or value[0] == "null":
        return None
    kind, plain = value
    if kind == "uuid":
        headers[f"{key}-type"] = "uuid"
        return str(plain)
    if kind == "ulong":
        headers[f"{key}-type"] = "ulong"
        return str(plain)
    if kind == "binary":
        encoded = base64.b64encode(plain).decode()
        if len(encoded) > 256:
            headers[key] = plain
            return None
        headers[f"{key}-type"] = "binary"
        return encoded
    text = str(plain)
    if len(text.encode()) > 256:
        headers[key] = text
        return None
    return text


def to_amqp091(message: bytes, stream: str = "") -> tuple[bytes, bytes, bytes]:
    """An AMQP 1.0 message as AMQP 0-9-1 has it: the exchange and routing key (two shortstrs,
    from ``x-exchange`` and ``x-routing-key``; without them the default exchange and the name
    of the ``stream`` it was read from, as RabbitMQ delivers it), the content header, the body
    (its data sections; an ``amqp-value`` of bytes or text when it has none).

    :raises AMQP10Error: ``message`` is not an AMQP 1.0 message, or holds what 0-9-1 cannot
        carry (a timestamp out of range, a header name over 255 bytes ...)
    """
    try:
        return _to_amqp091(message, stream)
    except AMQP10Error:
        raise
    except (ValueError, OverflowError, TypeError, struct.error, OSError) as error:
        raise AMQP10Error(f"not convertible: {error}") from None


def delivered_as_amqp091(message: bytes, stream: str) -> tuple[bytes, bytes, bytes]:
    """:func:`to_amqp091`, and for bytes that are not an AMQP 1.0 message: the bytes as the
    body, with no properties, on the default exchange with the stream's name as routing key."""
    try:
        return to_amqp091(message, stream)
    except AMQP10Error:
        name = stream.encode("utf-8", "surrogateescape")[:255]
        return (
            b"\x00" + bytes((len(name),)) + name,
            encode_content_header(len(message), commands.Basic.Properties()),
            message,
        )


def _to_amqp091(message: bytes, stream: str) -> tuple[bytes, bytes, bytes]:
    found = sections(message)
    fields: dict[str, Typed] = {}
    annotations: dict[str, Any] = {}
    headers: dict[str, Any] = {}
    body_parts: list[bytes] = []
    value_body: bytes | None = None
    for code, value in found:
        if code == PROPERTIES and value[0] == "list":
            fields = dict(zip(PROPERTY_FIELDS, value[1], strict=False))
        elif code == MESSAGE_ANNOTATIONS and value[0] == "map":
            annotations = {str(_plain(k)): _plain(v) for k, v in value[1]}
        elif code == APPLICATION_PROPERTIES and value[0] == "map":
            headers = {str(_plain(k)): v for k, v in value[1]}
        elif code == DATA and value[0] == "binary":
            body_parts.append(value[1])
        elif code == VALUE and value[0] in ("binary", "utf8"):
            plain = value[1]
            value_body = plain if isinstance(plain, bytes) else plain.encode()
    message_type = headers.pop("x-basic-type", None)
    app_id = headers.pop("x-basic-app-id", None)
    converted = {key: _header_value(value) for key, value in headers.items()}
    message_id = _message_id(fields.get("message_id"), "x-message-id", converted)
    correlation_id = _message_id(fields.get("correlation_id"), "x-correlation-id", converted)
    created = fields.get("creation_time")
    user_id = fields.get("user_id")
    properties = commands.Basic.Properties(
        content_type=_text(fields.get("content_type")),
        content_encoding=_text(fields.get("content_encoding")),
        headers=converted or None,
        delivery_mode=_small(annotations.get("x-basic-delivery-mode")),
        priority=_small(annotations.get("x-basic-priority")),
        correlation_id=correlation_id,
        reply_to=_text(fields.get("reply_to")),
        expiration=_text(("utf8", annotations["x-basic-expiration"]) if "x-basic-expiration" in annotations else None),
        message_id=message_id,
        timestamp=_seconds(created),
        message_type=_text(message_type),
        user_id=(user_id[1].decode("utf-8", "replace") if isinstance(user_id[1], bytes) else str(user_id[1]))
        if user_id is not None and user_id[0] != "null"
        else None,
        app_id=_text(app_id),
    )
    body = b"".join(body_parts) if body_parts else (value_body or b"")
    exchange = str(annotations.get("x-exchange", "")).encode()[:255]
    routing_key = str(annotations.get("x-routing-key", stream)).encode()[:255]
    names = bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) + routing_key
    return names, _header(len(body), properties), body


def _text(value: Typed | None) -> str | None:
    if value is None or value[0] == "null" or value[1] is None:
        return None
    plain = value[1]
    return (plain.decode("utf-8", "replace") if isinstance(plain, bytes) else str(plain))[:255]


def _small(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255 else None


def _seconds(value: Typed | None) -> Any:
    if value is None or value[0] != "timestamp":
        return None
    return datetime.datetime.fromtimestamp(value[1] // 1000, datetime.timezone.utc)


def _header(size: int, properties: commands.Basic.Properties) -> bytes:
    headers = properties.headers
    if headers:
        properties.headers = {
            k: datetime.datetime.fromtimestamp(int(v), datetime.timezone.utc) if isinstance(v, _Timestamp) else v
            for k, v in headers.items()
        }
    return encode_content_header(size, properties)


# -- from AMQP 0-9-1 -----------------------------------------------------------------------------


def _described(code: int, body: bytes) -> bytes:
    return b"\x00\x53" + bytes((code,)) + body


def _string(value: str, small: int, wide: int) -> bytes:
    raw = value.encode("utf-8", "surrogateescape")
    return bytes((small, len(raw))) + raw if len(raw) < 256 else bytes((wide,)) + struct.pack(">I", len(raw)) + raw


def _binary(raw: bytes) -> bytes:
    return b"\xa0" + bytes((len(raw),)) + raw if len(raw) < 256 else b"\xb0" + struct.pack(">I", len(raw)) + raw


def encode_value(value: Any) -> bytes:
    """One 0-9-1 header value as RabbitMQ's ``from_091`` types it."""
    if value is None:
        return b"\x40"
    if isinstance(value, bool):
        return b"\x41" if value else b"\x42"
    if isinstance(value, int):
        return b"\x81" + struct.pack(">q", value) if -(2**63) <= value < 2**63 else _string(str(value), 0xA1, 0xB1)
    if isinstance(value, float):
        return b"\x82" + struct.pack(">d", value)
    if isinstance(value, bytes):
        return _binary(value)
    if hasattr(value, "timestamp"):
        return b"\x83" + struct.pack(">q", int(value.timestamp()) * 1000)
    return _string(str(value), 0xA1, 0xB1)


def _compound(code_small: int, code_wide: int, items: Iterable[bytes], count: int) -> bytes:
    body = b"".join(items)
    if len(body) + 1 < 256 and count < 256:
        return bytes((code_small, len(body) + 1, count)) + body
    return bytes((code_wide,)) + struct.pack(">II", len(body) + 4, count) + body


def from_amqp091(names: bytes, header: bytes, body: bytes) -> bytes:
    """A message published over AMQP 0-9-1 as an AMQP 1.0 message for stream-protocol readers
    (see the module's docstring); one whose properties do not convert is its body alone."""
    try:
        return _from_amqp091(names, header, body)
    except (ValueError, TypeError, OverflowError, struct.error, OSError):
        return _described(DATA, _binary(body))


def _from_amqp091(names: bytes, header: bytes, body: bytes) -> bytes:
    properties = decode_properties(header)
    exchange, routing_key = split_names(names)
    annotations = [
        ("x-routing-key", _string(routing_key, 0xA1, 0xB1)),
        ("x-exchange", _string(exchange, 0xA1, 0xB1)),
    ]
    if properties.priority is not None:
        annotations.append(("x-basic-priority", b"\x50" + bytes((properties.priority,))))
    if properties.delivery_mode is not None:
        annotations.append(("x-basic-delivery-mode", b"\x50" + bytes((properties.delivery_mode,))))
    if properties.expiration is not None:
        annotations.append(("x-basic-expiration", _string(properties.expiration, 0xA1, 0xB1)))
    parts = [
        _described(
            MESSAGE_ANNOTATIONS,
            _compound(0xC1, 0xD1, (_string(k, 0xA3, 0xB3) + v for k, v in annotations), 2 * len(annotations)),
        )
    ]
    created = properties.timestamp
    fields = [
        _string(properties.message_id, 0xA1, 0xB1) if properties.message_id is not None else b"\x40",
        _binary(properties.user_id.encode()) if properties.user_id is not None else b"\x40",
        b"\x40",
        b"\x40",
        _string(properties.reply_to, 0xA1, 0xB1) if properties.reply_to is not None else b"\x40",
        _string(properties.correlation_id, 0xA1, 0xB1) if properties.correlation_id is not None else b"\x40",
        _string(properties.content_type, 0xA3, 0xB3) if properties.content_type is not None else b"\x40",
        _string(properties.content_encoding, 0xA3, 0xB3) if properties.content_encoding is not None else b"\x40",
        b"\x40",
        b"\x83" + struct.pack(">q", int(created.timestamp()) * 1000) if created is not None else b"\x40",
    ]
    while fields and fields[-1] == b"\x40":
        fields.pop()
    if fields:
        parts.append(_described(PROPERTIES, _compound(0xC0, 0xD0, fields, len(fields))))
    application: list[tuple[str, Any]] = []
    if properties.app_id is not None:
        application.append(("x-basic-app-id", properties.app_id))
    if properties.message_type is not None:
        application.append(("x-basic-type", properties.message_type))
    for key, value in (properties.headers or {}).items():
        if not isinstance(value, (dict, list)):  # (tables and arrays are dropped, as RabbitMQ drops them)
            application.append((key, value))
    if application:
        parts.append(
            _described(
                APPLICATION_PROPERTIES,
                _compound(
                    0xC1, 0xD1, (_string(k, 0xA1, 0xB1) + encode_value(v) for k, v in application), 2 * len(application)
                ),
            )
        )
    parts.append(_described(DATA, _binary(body)))
    return b"".join(parts)

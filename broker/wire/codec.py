"""Frame encoding and decoding: pamqp for the breadth of the protocol, ``struct`` for the hot path.

Every message crosses the same few frames: ``basic.publish``, a content header, content
bodies, ``basic.deliver`` and ``basic.ack``. Decoding and re-encoding those with pamqp costs
about 24 µs per message; recognising them by their ids and slicing the buffer costs a few.
So this module:

* decodes ``basic.publish``/``ack``/``nack``/``reject`` with ``struct`` (:func:`decode_publish`,
  :func:`decode_ack` ...), and every other method with pamqp (:func:`decode_method`);
* passes the content header through unchanged: a delivery reuses the publisher's header bytes;
* builds ``basic.deliver``, ``basic.get-ok`` and ``basic.return`` frames with ``struct``;
* decodes the content properties only when something needs them (:func:`decode_properties`).

AMQP 0-9-1 §4.2.3 (general frame format): ``type:octet channel:short size:long payload frame-end``.
Short strings travel as bytes; names are decoded as UTF-8 with ``surrogateescape`` so that a
name that is not valid UTF-8 still round-trips byte for byte, as RabbitMQ treats names as binaries.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, decode, encode, exceptions
from pamqp.base import Frame

from postroom.broker.errors import ConnectionDropped, ConnectionException, ReplyCode
from postroom.broker.wire import table as _table

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
#: Bytes a frame adds around its payload (header and frame-end).
FRAME_OVERHEAD = 8
#: AMQP 0-9-1 §4.2.1: no peer may refuse frames of this size, so frame_max may not go below it.
FRAME_MIN_SIZE = 4096

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

# (class id, method id) of the methods on the hot path.
BASIC_CLASS = 60
BASIC_PUBLISH = 0x003C0028
BASIC_DELIVER = 0x003C003C
BASIC_GET_OK = 0x003C0047
BASIC_ACK = 0x003C0050
BASIC_REJECT = 0x003C005A
BASIC_NACK = 0x003C0078
BASIC_RETURN = 0x003C0032
CHANNEL_OPEN_OK = 0x0014000B
QUEUE_DECLARE_OK = 0x0032000B

# Content property flags (AMQP 0-9-1 §4.2.6.1, basic class), highest bit first.
FLAG_HEADERS = 0x2000
FLAG_DELIVERY_MODE = 0x1000
FLAG_PRIORITY = 0x0800
FLAG_EXPIRATION = 0x0100
FLAG_USER_ID = 0x0010

_frame_header = struct.Struct(">BHI")
_method_ids = struct.Struct(">I")
_deliver_head = struct.Struct(">BHII")  # frame header, method index
_frame_end_then_header = struct.Struct(">BBHI")  # frame-end of one frame, header of the next
_tag_redelivered = struct.Struct(">QB")
_content_header_fixed = struct.Struct(">HHQ")  # class, weight, body size
_ack = struct.Struct(">QB")
_uint64 = struct.Struct(">Q")
_uint16 = struct.Struct(">H")
_counts = struct.Struct(">II")


def shortstr(value: str) -> bytes:
    """Encode a short string (length octet and bytes).

    :raises ValueError: the encoded string is longer than 255 bytes.
    """
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise ValueError("short string longer than 255 bytes")
    return bytes((len(raw),)) + raw


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """Wrap ``payload`` in one frame."""
    return _frame_header.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


# -- decoding ------------------------------------------------------------------------------


def erlang_binary(data: bytes, limit: int = 64) -> str:
    """``data`` as RabbitMQ's reply texts show a binary: ``<<1,2,3>>`` (the first ``limit`` octets)."""
    return "<<" + ",".join(str(octet) for octet in data[:limit]) + (",..." if len(data) > limit else "") + ">>"


def decode_method(payload: bytes, channel: int = 1) -> Frame:
    """Decode a method frame's payload with pamqp, refusing what RabbitMQ refuses, as it does.

    :param channel: the frame's channel (on channel 0 RabbitMQ's connection process decodes
        the method itself, and a failure there is a bare 541)
    :raises ConnectionDropped: an unknown method, or a field table in the arguments that does
        not parse (RabbitMQ's reader cannot answer either and closes the socket)
    :raises ConnectionException: 501 FRAME_ERROR ``cannot decode`` with the method's ids for
        arguments that are truncated or followed by other bytes, or a short string that is not
        UTF-8; 541 INTERNAL_ERROR for the first two on channel 0
    """
    if len(payload) < 4:
        raise ConnectionException(
            ReplyCode.FRAME_ERROR, f"type 1, all octets = {erlang_binary(payload)}: unknown_frame"
        )
    (index,) = _method_ids.unpack_from(payload)
    method_class: type[Frame] | None = commands.INDEX_MAPPING.get(index)
    if method_class is None:
        # RabbitMQ's reader cannot name an unknown method and drops the connection.
        raise ConnectionDropped(ReplyCode.COMMAND_INVALID, f"unknown method {index >> 16}/{index & 0xFFFF}")
    method = method_class()
    try:
        complete = _arguments_size(method, payload, 4) == len(payload)
    except IndexError:
        complete = False
    if not complete:
        if channel == 0:
            raise ConnectionException(ReplyCode.INTERNAL_ERROR, "", 0, 0)
        raise ConnectionException(
            ReplyCode.FRAME_ERROR, f"cannot decode {erlang_binary(payload[4:])}", index >> 16, index & 0xFFFF
        )
    try:
        method.unmarshal(payload[4:])
    except UnicodeDecodeError as err:
        raise ConnectionException(ReplyCode.FRAME_ERROR, "Malformed UTF-8 in shortstr") from err
    except (ValueError, struct.error, exceptions.PAMQPException, IndexError, TypeError) as err:
        # Every field is where it should be, so a table's contents do not parse.
        raise ConnectionDropped(ReplyCode.FRAME_ERROR, f"{method_class.name}: field table does not parse") from err
    return method


_FIXED_ARGUMENTS = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}


def _arguments_size(method: Frame, payload: bytes, offset: int) -> int:
    """Where a method's arguments end in ``payload`` (from their types, as pamqp reads them)."""
    bits = False
    for name in method.__slots__:
        kind = method.amqp_type(name)
        if kind == "bit":
            if not bits:
                offset += 1
                bits = True
            continue
        bits = False
        if kind == "shortstr":
            offset += 1 + payload[offset]
        elif kind in ("longstr", "table"):
            offset += 4 + int.from_bytes(payload[offset : offset + 4], "big")
        else:
            offset += _FIXED_ARGUMENTS[kind]
    return offset


def _shortstr_at(payload: bytes, offset: int) -> tuple[str, int]:
    length = payload[offset]
    end = offset + 1 + length
    if end > len(payload):
        raise IndexError("short string runs past the frame")
    return payload[offset + 1 : end].decode("utf-8", "surrogateescape"), end


def split_names(names: bytes) -> tuple[str, str]:
    """The exchange name and routing key of ``names``, the two short strings of a
    ``basic.publish`` or ``basic.deliver`` as sent (undecodable bytes kept by ``surrogateescape``)."""
    exchange_length = names[0]
    return (
        names[1 : 1 + exchange_length].decode("utf-8", "surrogateescape"),
        names[2 + exchange_length :].decode("utf-8", "surrogateescape"),
    )


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool, bytes]:
    """Decode ``basic.publish`` (method payload including the 4 id bytes).

    :returns: ``(exchange, routing_key, mandatory, immediate, names)`` where ``names`` is the raw
        ``exchange`` and ``routing-key`` short strings, reused verbatim in deliveries.
    :raises ConnectionException: 501 FRAME_ERROR when the arguments are truncated or followed
        by other bytes.
    """
    try:
        exchange, offset = _shortstr_at(payload, 6)  # ids (4) + reserved ticket (2)
        routing_key, end = _shortstr_at(payload, offset)
        bits = payload[end]
    except IndexError:
        end = -1
    if end != len(payload) - 1:
        raise ConnectionException(ReplyCode.FRAME_ERROR, f"cannot decode {erlang_binary(payload[4:])}", BASIC_CLASS, 40)
    return exchange, routing_key, bool(bits & 1), bool(bits & 2), payload[6:end]


def decode_ack(payload: bytes) -> tuple[int, int]:
    """Decode ``basic.ack``/``nack``/``reject``: ``(delivery_tag, bits)``.

    For ack the bits are ``multiple``; for nack ``multiple | requeue << 1``; for reject ``requeue``.

    :raises ConnectionException: 501 FRAME_ERROR when the arguments are truncated or followed
        by other bytes.
    """
    if len(payload) != 4 + _ack.size:
        method_id = _method_ids.unpack_from(payload)[0] & 0xFFFF
        raise ConnectionException(
            ReplyCode.FRAME_ERROR, f"cannot decode {erlang_binary(payload[4:])}", BASIC_CLASS, method_id
        )
    return _ack.unpack_from(payload, 4)


def content_body_size(header_payload: bytes) -> tuple[int, int, int]:
    """Read a content header's class id, weight and body size without decoding its properties.

    :raises ConnectionException: 501 FRAME_ERROR when the header is shorter than those fields
        (RabbitMQ cannot tell what frame it is); a header too short for its property flags
        fails the property check at publish instead.
    """
    if len(header_payload) < 12:
        raise ConnectionException(
            ReplyCode.FRAME_ERROR, f"type 2, all octets = {erlang_binary(header_payload)}: unknown_frame"
        )
    return _content_header_fixed.unpack_from(header_payload)


def delivery_mode(header_payload: bytes) -> int:
    """The ``delivery-mode`` property (2: persistent) without decoding the others, 0 when absent.

    Skips ``content-type``, ``content-encoding`` and ``headers`` by their lengths: O(1).
    """
    flags = (header_payload[12] << 8) | header_payload[13]
    if not flags & FLAG_DELIVERY_MODE:
        return 0
    offset = 14
    try:
        if flags & 0x8000:  # content-type
            offset += 1 + header_payload[offset]
        if flags & 0x4000:  # content-encoding
            offset += 1 + header_payload[offset]
        if flags & FLAG_HEADERS:
            offset += 4 + int.from_bytes(header_payload[offset : offset + 4], "big")
        return header_payload[offset]
    except IndexError:
        return 0


def decode_properties(header_payload: bytes) -> commands.Basic.Properties:
    """Decode every content property of a content header payload with pamqp.

    :raises ConnectionException: 502 SYNTAX_ERROR when the properties do not decode.
    """
    from pamqp.header import ContentHeader

    header = ContentHeader()
    try:
        header.unmarshal(header_payload)
    except (ValueError, struct.error, IndexError, TypeError, exceptions.PAMQPException) as err:
        raise ConnectionException(
            ReplyCode.SYNTAX_ERROR, f"cannot decode content properties: {err}", BASIC_CLASS
        ) from err
    return header.properties


def encode_content_header(body_size: int, properties: commands.Basic.Properties) -> bytes:
    """Encode a content header payload (class 60) for ``properties``."""
    return struct.pack(">HHQ", BASIC_CLASS, 0, body_size) + properties.marshal()


# -- encoding --------------------------------------------------------------------------------


def encode_method(channel: int, method: Frame) -> bytes:
    """Encode a method frame with pamqp."""
    return frame(FRAME_METHOD, channel, _method_ids.pack(method.index) + method.marshal())


def declare_ok_method(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    """Build ``queue.declare-ok`` with ``struct``: any name RabbitMQ allows (every UTF-8 string up
    to 255 bytes; pamqp's client-side name pattern would refuse ``*``, ``#``, ``%`` ...)."""
    return frame(
        FRAME_METHOD,
        channel,
        _method_ids.pack(QUEUE_DECLARE_OK) + shortstr(queue) + _counts.pack(message_count, consumer_count),
    )


def channel_open_ok_method(channel: int) -> bytes:
    """``channel.open-ok`` with an empty reserved ``channel-id``, as RabbitMQ sends it (pamqp insists on ``"0"``)."""
    return frame(FRAME_METHOD, channel, _method_ids.pack(CHANNEL_OPEN_OK) + b"\x00\x00\x00\x00")


def deliver_frames(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    names: bytes,
    header: bytes,
    body: bytes,
    frame_max: int,
) -> tuple[bytes, ...]:
    """The frames of one delivery: ``basic.deliver``, the content header, the body.

    Built with four ``struct`` packs around the stored byte strings; nothing is re-encoded.

    :param consumer_tag: the consumer tag as an encoded short string (length octet included)
    :param names: the exchange and routing key short strings as the publisher sent them
    :param header: the content header payload as the publisher sent it
    """
    body_size = len(body)
    head = (
        _deliver_head.pack(FRAME_METHOD, channel, 13 + len(consumer_tag) + len(names), BASIC_DELIVER),
        consumer_tag,
        _tag_redelivered.pack(delivery_tag, redelivered),
        names,
        _frame_end_then_header.pack(FRAME_END, FRAME_HEADER, channel, len(header)),
        header,
    )
    if body_size == 0:
        return head + (FRAME_END_BYTE,)
    if body_size <= frame_max - FRAME_OVERHEAD:
        return head + (_frame_end_then_header.pack(FRAME_END, FRAME_BODY, channel, body_size), body, FRAME_END_BYTE)
    return head + (FRAME_END_BYTE, *body_frames(channel, body, frame_max))


def get_ok_method(channel: int, delivery_tag: int, redelivered: bool, names: bytes, message_count: int) -> bytes:
    """Build a ``basic.get-ok`` frame (names: exchange and routing key short strings)."""
    payload = b"".join(
        (
            _method_ids.pack(BASIC_GET_OK),
            _tag_redelivered.pack(delivery_tag, redelivered),
            names,
            struct.pack(">I", message_count),
        )
    )
    return frame(FRAME_METHOD, channel, payload)


def return_method(channel: int, reply_code: int, reply_text: str, names: bytes) -> bytes:
    """Build a ``basic.return`` frame (names: exchange and routing key short strings)."""
    payload = _method_ids.pack(BASIC_RETURN) + _uint16.pack(reply_code) + shortstr(reply_text[:255]) + names
    return frame(FRAME_METHOD, channel, payload)


def ack_method(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Build a ``basic.ack`` frame (a publisher confirm)."""
    return frame(FRAME_METHOD, channel, _method_ids.pack(BASIC_ACK) + _ack.pack(delivery_tag, multiple))


def nack_method(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Build a ``basic.nack`` frame (a negative publisher confirm). Its ``requeue`` bit is set,
    as RabbitMQ sets it (the field's default there); a publisher has nothing to requeue."""
    return frame(FRAME_METHOD, channel, _method_ids.pack(BASIC_NACK) + _ack.pack(delivery_tag, multiple | 2))


def body_frames(channel: int, body: bytes, frame_max: int) -> list[bytes]:
    """The body frames of one message, split at ``frame_max`` (none for an empty body)."""
    size = len(body)
    chunk = frame_max - FRAME_OVERHEAD
    if size <= chunk:
        return [_frame_header.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE] if size else []
    parts: list[bytes] = []
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        parts += (_frame_header.pack(FRAME_BODY, channel, len(piece)), bytes(piece), FRAME_END_BYTE)
    return parts


def content_frames(channel: int, header_payload: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """The content header frame and the body frames of one message, split at ``frame_max``."""
    return [
        _frame_header.pack(FRAME_HEADER, channel, len(header_payload)),
        header_payload,
        FRAME_END_BYTE,
        *body_frames(channel, body, frame_max),
    ]


def decode_table(raw: bytes) -> dict[str, Any]:
    """Decode an AMQP field table given without its 4-byte length prefix (SASL AMQPLAIN)."""
    return _table.decode_table(struct.pack(">I", len(raw)) + raw)[0]


def decode_field_table(raw: bytes) -> dict[str, Any]:
    """Decode an AMQP field table given with its 4-byte length prefix; ``b""`` is the empty table."""
    if not raw:
        return {}
    return _table.decode_table(raw)[0]


def encode_table(table: dict[str, Any]) -> bytes:
    """Encode an AMQP field table with its length prefix, every value in its own wire type."""
    return _table.encode_table(table)


# -- pamqp adapter -------------------------------------------------------------------------
# pamqp decodes tables recursively (a RecursionError past ~1,000 levels, where RabbitMQ has no
# limit), turns float64 into float32 and sorts keys when it encodes, and cannot encode a long
# string that is not UTF-8. Every table pamqp reads or writes for us (method arguments,
# client properties, the headers property) goes through broker.wire.table instead: iterative,
# and exact both ways. Timestamps are read as RabbitMQ reads them (seconds, no guessing).


def _pamqp_table(value: bytes) -> tuple[int, dict[str, Any]]:
    table, end = _table.decode_table(value)
    return end, table


def _pamqp_timestamp(value: bytes) -> tuple[int, Any]:
    if len(value) < 8:
        raise ValueError("Could not unpack timestamp value")
    return 8, _table.decode_value(value, ord("T"), 0, 8)


decode.METHODS["table"] = _pamqp_table
decode.METHODS["timestamp"] = _pamqp_timestamp
encode.METHODS["table"] = _table.encode_table

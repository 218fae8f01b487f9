"""The write-ahead log's record codec: a record's frame, and its payload field by field.

A framed record is ``length u32 | crc32 u32 | type u8 | payload[length]`` (big-endian); the
CRC covers the type byte and the payload (:data:`~broker.wal.crc.TYPE_CRC`), so a record whose
type byte flipped does not decode as another type. :func:`encode` frames any record of
:mod:`broker.wal.records`, :func:`decode` reads a payload back; each field's encoding follows
from its annotation (strings and bytes with their length, integers u64, floats f64, bools in
one flags octet). ``Published`` (the bulk of any log) and ``DeadLettered`` (of the dead-letter
stream) have unrolled fast paths, and :func:`published_contents` reads what a delivery needs
of ``Published`` records in place (a drain's hot path).

Standard library only: ``spark/`` decodes records with it. ``docs/wal-format.md`` describes
the format byte by byte.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Protocol, Union

from postroom.broker.wal.crc import TYPE_CRC
from postroom.broker.wal.records import RECORD_CLASSES, DeadLettered, Published, Record, RecordType, WALCorruption

__all__ = [
    "RECORD_HEADER",
    "RECORD_HEADER_BYTES",
    "MAX_RECORD_BYTES",
    "Buffer",
    "encode",
    "encode_published",
    "encode_published_after",
    "published_prefix",
    "published_payload",
    "decode",
    "published_content",
    "published_contents",
]

#: The struct of a record's frame header.
RECORD_HEADER = struct.Struct(">IIB")

#: Size of a record's frame header: length u32, crc32 u32, type u8.
RECORD_HEADER_BYTES = RECORD_HEADER.size

#: The largest payload a record may have; a larger length field means corruption.
#: Why this number: the biggest record is a ``Published``, whose body is at most the broker's
#: message size limit (16 MiB by default, configurable up to 64 MiB, RabbitMQ's
#: ``max_message_size`` ceiling); 1 MiB more covers its content header (properties, bounded by
#: ``frame_max``) and names (shortstrs). Recovery never allocates more than this for one record
#: on the word of a length field that may be garbage.
MAX_RECORD_BYTES = 64 * 1024 * 1024 + 1024 * 1024

# ---------------------------------------------------------------------------------------------
# Field encodings. Each field's kind comes from its annotation, so the dataclasses of
# broker.wal.records are the one statement of each payload's layout.

_STR, _BYTES, _INT, _FLOAT, _BOOL, _STRS, _INTS = range(7)
_KINDS = {
    "str": _STR,
    "bytes": _BYTES,
    "int": _INT,
    "float": _FLOAT,
    "bool": _BOOL,
    "tuple[str, ...]": _STRS,
    "tuple[int, ...]": _INTS,
}

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")

# Names, routing keys and vhosts are AMQP shortstrs (at most 255 bytes), so u16 lengths are
# plenty; surrogateescape lets a name that arrived as invalid UTF-8 round-trip byte for byte.
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"

_PUBLISHED_TYPE = int(RecordType.PUBLISHED)
_PUBLISHED_CRC = TYPE_CRC[_PUBLISHED_TYPE]

_Spec = tuple[tuple[str, int], ...]
_SPECS: dict[type, _Spec] = {
    cls: tuple((field.name, _KINDS[str(field.type)]) for field in fields(cls)) for cls in RECORD_CLASSES.values()
}


def _encode_fields(record: object, spec: _Spec) -> bytes:
    """The payload of ``record``: its fields in order, bools packed into one flags octet.

    The flags octet sits where the first bool field is; bool number ``i`` (in field order) is
    bit ``i``. Cost O(fields + total string and bytes length).
    """
    parts: list[bytes] = []
    flags = 0
    bit = 0
    flags_at = -1
    for name, kind in spec:
        value = getattr(record, name)
        if kind == _STR:
            data = value.encode(_ENCODING, _ERRORS)
            parts += (_U16.pack(len(data)), data)
        elif kind == _BYTES:
            parts += (_U32.pack(len(value)), value)
        elif kind == _INT:
            parts.append(_U64.pack(value))
        elif kind == _FLOAT:
            parts.append(_F64.pack(value))
        elif kind == _BOOL:
            if flags_at < 0:
                flags_at = len(parts)
                parts.append(b"")
            if value:
                flags |= 1 << bit
            bit += 1
        elif kind == _STRS:
            parts.append(_U16.pack(len(value)))
            for item in value:
                data = item.encode(_ENCODING, _ERRORS)
                parts += (_U16.pack(len(data)), data)
        else:  # _INTS
            parts.append(struct.pack(f">I{len(value)}Q", len(value), *value))
    if flags_at >= 0:
        parts[flags_at] = bytes((flags,))
    return b"".join(parts)


_PUBLISHED_HEAD = struct.Struct(">QH")  # message_id, len(vhost)
_U16_U16 = struct.Struct(">HH")  # count of queues, len(first queue)
_F64_U32 = struct.Struct(">dI")  # timestamp, len(header)
#: A record's header (length, CRC, type) and, for a ``Published`` one, its message id.
_HEAD_AND_ID = struct.Struct(">IIBQ")


def _encode_published(record: Published) -> bytes:
    """:func:`_encode_fields` unrolled for :class:`Published` (see :func:`published_payload`)."""
    return published_payload(
        record.message_id,
        record.vhost,
        record.queues,
        record.exchange,
        record.routing_key,
        record.timestamp,
        record.header,
        record.body,
    )


def published_payload(
    message_id: int,
    vhost: str,
    queues: tuple[str, ...],
    exchange: str,
    routing_key: str,
    timestamp: float,
    header: bytes,
    body: bytes,
) -> bytes:
    """The payload of a :class:`Published` record, from its fields.

    Same bytes as the generic encoder (a test checks), in about half the time: fixed fields
    are packed together and the common single-queue case takes one pack.
    """
    vhost_bytes = vhost.encode(_ENCODING, _ERRORS)
    exchange_bytes = exchange.encode(_ENCODING, _ERRORS)
    routing_key_bytes = routing_key.encode(_ENCODING, _ERRORS)
    if len(queues) == 1:
        queue = queues[0].encode(_ENCODING, _ERRORS)
        parts = [_PUBLISHED_HEAD.pack(message_id, len(vhost_bytes)), vhost_bytes, _U16_U16.pack(1, len(queue)), queue]
    else:
        parts = [_PUBLISHED_HEAD.pack(message_id, len(vhost_bytes)), vhost_bytes, _U16.pack(len(queues))]
        for name in queues:
            queue = name.encode(_ENCODING, _ERRORS)
            parts += (_U16.pack(len(queue)), queue)
    parts += (
        _U16.pack(len(exchange_bytes)),
        exchange_bytes,
        _U16.pack(len(routing_key_bytes)),
        routing_key_bytes,
        _F64_U32.pack(timestamp, len(header)),
        header,
        _U32.pack(len(body)),
        body,
    )
    return b"".join(parts)


def published_prefix(message_id: int, vhost: str, queues: tuple[str, ...], exchange: str, routing_key: str) -> bytes:
    """The start of a :class:`Published` payload, up to its timestamp: what records of messages
    that came the same way share (see :func:`encode_published_after`)."""
    return published_payload(message_id, vhost, queues, exchange, routing_key, 0.0, b"", b"")[:-16]


def encode_published_after(prefix: bytes, timestamp: float, header: bytes, body: bytes) -> bytes:
    """:func:`encode_published` of a record whose payload starts with ``prefix``
    (:func:`published_prefix`), without encoding its names again.

    :raises ValueError: as :func:`encode`
    """
    try:
        payload = b"".join((prefix, _F64_U32.pack(timestamp, len(header)), header, _U32.pack(len(body)), body))
    except struct.error as err:
        raise ValueError(f"Published does not fit the WAL format: {err}") from err
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"Published payload of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload, _PUBLISHED_CRC), _PUBLISHED_TYPE) + payload


def encode_published(
    message_id: int,
    vhost: str,
    queues: tuple[str, ...],
    exchange: str,
    routing_key: str,
    timestamp: float,
    header: bytes,
    body: bytes,
) -> bytes:
    """The framed :class:`Published` record, without building the dataclass (the broker's hot path).

    :raises ValueError: as :func:`encode`
    """
    try:
        payload = published_payload(message_id, vhost, queues, exchange, routing_key, timestamp, header, body)
    except struct.error as err:
        raise ValueError(f"Published does not fit the WAL format: {err}") from err
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"Published payload of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    kind = int(RecordType.PUBLISHED)
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload, TYPE_CRC[kind]), kind) + payload


def _generic(spec: _Spec) -> Callable[[object], bytes]:
    return lambda record: _encode_fields(record, spec)


_ENCODERS: dict[type, tuple[int, Callable[[object], bytes]]] = {
    cls: (int(record_type), _generic(_SPECS[cls])) for record_type, cls in RECORD_CLASSES.items()
}
_ENCODERS[Published] = (int(RecordType.PUBLISHED), _encode_published)  # type: ignore[assignment]


def encode(record: Record) -> bytes:
    """The framed record: ``length | crc32 | type | payload``, ready to append to a segment.

    :param record: one of the record classes of this module
    :raises TypeError: ``record`` is not a record
    :raises ValueError: a value does not fit its encoding (a string over 65535 bytes in UTF-8, a
        negative or over-64-bit integer, a string with a surrogate that ``surrogateescape``
        cannot encode), or the payload exceeds :data:`MAX_RECORD_BYTES`
    """
    try:
        record_type, encoder = _ENCODERS[type(record)]
    except KeyError:
        raise TypeError(f"not a WAL record: {record!r}") from None
    try:
        payload = encoder(record)
    except struct.error as err:
        # A try block costs nothing on the fast path (Python 3.11 zero-cost exceptions).
        raise ValueError(f"{type(record).__name__} does not fit the WAL format: {err}") from err
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"{type(record).__name__} payload of {len(payload)} bytes is over {MAX_RECORD_BYTES}")
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload, TYPE_CRC[record_type]), record_type) + payload


class _Malformed(Exception):
    """A payload is too short or inconsistent; :func:`decode` turns it into :exc:`WALCorruption`."""


#: What :func:`decode` and the scanners take: anything that holds bytes.
Buffer = Union[bytes, bytearray, memoryview]


def _decode_fields(cls: type, spec: _Spec, data: bytes) -> Record:
    """Decode a payload laid out by :func:`_encode_fields`. Cost O(payload bytes).

    Works on ``bytes``: slicing bytes and ``bytes.decode`` are faster than going through a
    memoryview, and the payload is copied out of the segment once anyway.
    """
    size = len(data)
    values: list[object] = []
    pos = 0
    flags = 0
    bit = 0  # bools decoded so far; the flags octet is read at the first one
    name = ""
    try:
        for name, kind in spec:  # noqa: B007 (the except clauses below name the field that failed)
            if kind == _STR:
                (length,) = _U16.unpack_from(data, pos)
                pos += 2
                end = pos + length
                if end > size:
                    raise _Malformed("runs past the end")
                values.append(data[pos:end].decode(_ENCODING, _ERRORS))
                pos = end
            elif kind == _BYTES:
                (length,) = _U32.unpack_from(data, pos)
                pos += 4
                end = pos + length
                if end > size:
                    raise _Malformed("runs past the end")
                values.append(data[pos:end])
                pos = end
            elif kind == _INT:
                values.append(_U64.unpack_from(data, pos)[0])
                pos += 8
            elif kind == _FLOAT:
                values.append(_F64.unpack_from(data, pos)[0])
                pos += 8
            elif kind == _BOOL:
                if bit == 0:
                    if pos >= size:
                        raise _Malformed("runs past the end")
                    flags = data[pos]
                    pos += 1
                values.append(bool(flags >> bit & 1))
                bit += 1
            elif kind == _STRS:
                (count,) = _U16.unpack_from(data, pos)
                pos += 2
                items = []
                for _ in range(count):
                    (length,) = _U16.unpack_from(data, pos)
                    pos += 2
                    end = pos + length
                    if end > size:
                        raise _Malformed("runs past the end")
                    items.append(data[pos:end].decode(_ENCODING, _ERRORS))
                    pos = end
                values.append(tuple(items))
            else:  # _INTS
                (count,) = _U32.unpack_from(data, pos)
                pos += 4
                # Checked before unpacking so a garbage count cannot build a huge format string.
                if pos + 8 * count > size:
                    raise _Malformed("runs past the end")
                values.append(struct.unpack_from(f">{count}Q", data, pos))
                pos += 8 * count
    except struct.error:
        raise WALCorruption(f"{cls.__name__}.{name} runs past the end of the payload") from None
    except _Malformed as err:
        raise WALCorruption(f"{cls.__name__}.{name} {err}") from None
    # Strict: unused flag bits and trailing bytes are not what we write, so this is not our format.
    if flags >> bit:
        raise WALCorruption(f"{cls.__name__} has unknown flag bits set: {flags:#04x}")
    if pos != size:
        raise WALCorruption(f"{cls.__name__} has {size - pos} trailing bytes")
    return cls(*values)  # type: ignore[no-any-return]


#: The names (vhost, queues, exchange, routing key) of the last ``Published`` payload decoded,
#: as ``(their bytes, (vhost, queues, exchange, routing_key))``: a log's messages mostly came
#: the same way, and those that do are decoded without their names.
_last_names: tuple[bytes, tuple[str, tuple[str, ...], str, str]] = (b"\xff", ("", (), "", ""))


def _decode_published(data: bytes) -> Published:
    """:func:`_decode_fields` unrolled for :class:`Published`, the bulk of any log (about 2x faster).

    Raises :exc:`struct.error` or :exc:`_Malformed` on a bad payload; :func:`decode` then runs
    the generic decoder, which names the bad field, so both paths report the same error.
    """
    global _last_names
    size = len(data)
    (message_id,) = _U64.unpack_from(data, 0)
    names, decoded = _last_names  # (one read: another thread may replace it)
    if data.startswith(names, 8):
        pos = 8 + len(names)
        vhost, queues, exchange, routing_key = decoded
    else:
        vhost, queues, exchange, routing_key, pos = _decode_published_names(data, size)
        _last_names = (data[8:pos], (vhost, queues, exchange, routing_key))
    timestamp, length = _F64_U32.unpack_from(data, pos)
    start = pos + 12
    pos = start + length
    if pos > size:
        raise _Malformed
    header = data[start:pos]
    (length,) = _U32.unpack_from(data, pos)
    start = pos + 4
    pos = start + length
    if pos != size:
        raise _Malformed
    return Published(message_id, vhost, queues, exchange, routing_key, timestamp, header, data[start:pos])


def _decode_published_names(data: bytes, size: int) -> tuple[str, tuple[str, ...], str, str, int]:
    """The names of a ``Published`` payload, and where its timestamp starts."""
    (length,) = _U16.unpack_from(data, 8)
    pos = 10 + length
    if pos > size:
        raise _Malformed
    vhost = data[10:pos].decode(_ENCODING, _ERRORS)
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    queues = []
    for _ in range(count):
        (length,) = _U16.unpack_from(data, pos)
        start = pos + 2
        pos = start + length
        if pos > size:
            raise _Malformed
        queues.append(data[start:pos].decode(_ENCODING, _ERRORS))
    (length,) = _U16.unpack_from(data, pos)
    start = pos + 2
    pos = start + length
    if pos > size:
        raise _Malformed
    exchange = data[start:pos].decode(_ENCODING, _ERRORS)
    (length,) = _U16.unpack_from(data, pos)
    start = pos + 2
    pos = start + length
    if pos > size:
        raise _Malformed
    routing_key = data[start:pos].decode(_ENCODING, _ERRORS)
    return vhost, tuple(queues), exchange, routing_key, pos


def _decode_strs(data: bytes, pos: int, size: int) -> tuple[tuple[str, ...], int]:
    """A ``tuple[str, ...]`` at ``pos``, and the position after it."""
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    items = []
    for _ in range(count):
        (length,) = _U16.unpack_from(data, pos)
        start = pos + 2
        pos = start + length
        if pos > size:
            raise _Malformed
        items.append(data[start:pos].decode(_ENCODING, _ERRORS))
    return tuple(items), pos


def _decode_str(data: bytes, pos: int, size: int) -> tuple[str, int]:
    (length,) = _U16.unpack_from(data, pos)
    start = pos + 2
    pos = start + length
    if pos > size:
        raise _Malformed
    return data[start:pos].decode(_ENCODING, _ERRORS), pos


def _decode_ints(data: bytes, pos: int, size: int) -> tuple[tuple[int, ...], int]:
    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    end = pos + 8 * count
    if end > size:
        raise _Malformed
    return struct.unpack_from(f">{count}Q", data, pos), end


_U64_F64 = struct.Struct(">Qd")  # delivery_count, time


def _decode_dead_lettered(data: bytes) -> DeadLettered:
    """:func:`_decode_fields` unrolled for :class:`DeadLettered`, the bulk of the dead-letter
    stream (about 3x faster: the Spark job and the export decode millions of them).

    Raises :exc:`struct.error` or :exc:`_Malformed` on a bad payload, as :func:`_decode_published`.
    """
    size = len(data)
    (dead_letter_id,) = _U64.unpack_from(data, 0)
    vhost, pos = _decode_str(data, 8, size)
    queue, pos = _decode_str(data, pos, size)
    reason, pos = _decode_str(data, pos, size)
    delivery_count, time = _U64_F64.unpack_from(data, pos)
    exchange, pos = _decode_str(data, pos + 16, size)
    routing_keys, pos = _decode_strs(data, pos, size)
    dead_letter_exchange, pos = _decode_str(data, pos, size)
    dead_letter_queues, pos = _decode_strs(data, pos, size)
    message_id, pos = _decode_str(data, pos, size)
    header_names, pos = _decode_strs(data, pos, size)
    header_values, pos = _decode_strs(data, pos, size)
    death_queues, pos = _decode_strs(data, pos, size)
    death_reasons, pos = _decode_strs(data, pos, size)
    death_exchanges, pos = _decode_strs(data, pos, size)
    death_counts, pos = _decode_ints(data, pos, size)
    death_times, pos = _decode_ints(data, pos, size)
    (body_size,) = _U64.unpack_from(data, pos)
    (length,) = _U32.unpack_from(data, pos + 8)
    start = pos + 12
    if start + length != size:
        raise _Malformed
    return DeadLettered(
        dead_letter_id,
        vhost,
        queue,
        reason,
        delivery_count,
        time,
        exchange,
        routing_keys,
        dead_letter_exchange,
        dead_letter_queues,
        message_id,
        header_names,
        header_values,
        death_queues,
        death_reasons,
        death_exchanges,
        death_counts,
        death_times,
        body_size,
        data[start:],
    )


_FAST_DECODERS: dict[type, Callable[[bytes], Record]] = {
    Published: _decode_published,
    DeadLettered: _decode_dead_lettered,
}

_DECODERS: dict[int, tuple[type, _Spec, Callable[[bytes], Record] | None]] = {
    int(t): (cls, _SPECS[cls], _FAST_DECODERS.get(cls)) for t, cls in RECORD_CLASSES.items()
}


def decode(record_type: int, payload: Buffer) -> Record:
    """The record of type ``record_type`` whose payload is ``payload`` (no frame header).

    :param record_type: a :class:`RecordType` value
    :param payload: the payload bytes exactly (no more, no less)
    :raises WALCorruption: unknown type, or the payload does not decode as that type (too
        short, trailing bytes, unknown flag bits); ``offset`` and ``segment`` are not set
    """
    try:
        cls, spec, fast = _DECODERS[record_type]
    except KeyError:
        raise WALCorruption(f"unknown record type {record_type}") from None
    data = payload if type(payload) is bytes else bytes(payload)
    if fast is not None:
        try:
            return fast(data)
        except (struct.error, _Malformed):
            pass  # the generic decoder says exactly what is wrong
    return _decode_fields(cls, spec, data)


def published_content(data: bytes, pos: int, length: int) -> tuple[int, bytes, bytes, bytes, bytes] | None:
    """What a delivery needs of the ``Published`` record that starts at ``pos`` in ``data`` and
    is ``length`` bytes long: ``(message_id, exchange, routing_key, header, body)``, names as
    UTF-8 bytes. ``None`` unless exactly such a valid record (CRC checked) is there.

    Reads only those fields (the vhost and queue names are skipped, nothing is copied but the
    results): bringing spooled messages back is a drain's hot path.
    """
    end = pos + length
    if pos < 0 or len(data) < end or length < RECORD_HEADER_BYTES:
        return None
    size, crc, record_type = RECORD_HEADER.unpack_from(data, pos)
    if size != length - RECORD_HEADER_BYTES or record_type != _PUBLISHED_TYPE:
        return None
    at = pos + RECORD_HEADER_BYTES
    # A small payload is cheaper to copy than to view.
    payload = data[at:end] if size < 4096 else memoryview(data)[at:end]
    try:
        if zlib.crc32(payload, _PUBLISHED_CRC) != crc:
            return None
        message_id, skip = _PUBLISHED_HEAD.unpack_from(data, at)
        at += 10 + skip
        (count,) = _U16.unpack_from(data, at)
        at += 2
        for _ in range(count):
            at += 2 + _U16.unpack_from(data, at)[0]
        (skip,) = _U16.unpack_from(data, at)
        exchange = data[at + 2 : at + 2 + skip]
        at += 2 + skip
        (skip,) = _U16.unpack_from(data, at)
        routing_key = data[at + 2 : at + 2 + skip]
        at += 2 + skip
        (skip,) = _U32.unpack_from(data, at + 8)
        header = data[at + 12 : at + 12 + skip]
        at += 12 + skip
        (skip,) = _U32.unpack_from(data, at)
        at += 4
    except struct.error:
        return None
    if at + skip != end or len(exchange) > 255 or len(routing_key) > 255:
        return None
    return message_id, exchange, routing_key, header, data[at:end]


class _Placed(Protocol):
    @property
    def offset(self) -> int: ...

    @property
    def length(self) -> int: ...


@functools.lru_cache(maxsize=64)
def _tail(header_size: int) -> Callable[[bytes, int], tuple[float, int, bytes, int]]:
    """Unpacks what follows a ``Published`` payload's names when its header is ``header_size``
    bytes long: timestamp, header length, header, body length."""
    return struct.Struct(f">dI{header_size}sI").unpack_from


def published_contents(
    data: bytes, base: int, places: Iterable[_Placed]
) -> list[tuple[int, bytes, bytes, bytes, bytes] | None]:
    """:func:`published_content` of each ``Published`` record of ``places`` (its ``offset`` and
    ``length``; ``data`` holds the bytes from offset ``base`` on), ``None`` for one that is not
    exactly such a valid record.

    A span of a deep queue's records mostly came the same way: once one's names (vhost, queues,
    exchange, routing key) are read, a record whose bytes there are the same is read without
    parsing them again.
    """
    contents: list[tuple[int, bytes, bytes, bytes, bytes] | None] = []
    append = contents.append
    unpack_head = _HEAD_AND_ID.unpack_from
    crc32 = zlib.crc32
    names = b""
    exchange = routing_key = b""
    # The timestamp, header and body length of records whose header has the last one's length.
    header_size = 0
    unpack_tail = _tail(0)
    for place in places:
        pos = place.offset - base
        length = place.length
        end = pos + length
        if pos < 0 or len(data) < end or length < _HEAD_AND_ID.size:
            append(None)
            continue
        size, crc, record_type, message_id = unpack_head(data, pos)
        at = pos + RECORD_HEADER_BYTES
        if (
            size != length - RECORD_HEADER_BYTES
            or record_type != _PUBLISHED_TYPE
            or crc32(data[at:end] if size < 4096 else memoryview(data)[at:end], _PUBLISHED_CRC) != crc
        ):
            append(None)
            continue
        try:
            if names and data.startswith(names, at + 8):
                at += 8 + len(names)
            else:
                content = published_content(data, pos, length)
                if content is None:
                    append(None)
                    continue
                _id, exchange, routing_key, _header, body = content
                # The names end where the timestamp, the header's length and the header start.
                names_end = end - len(body) - 16 - len(_header)
                names = data[at + 8 : names_end]
                at = names_end
            try:
                _timestamp, found, header, body_size = unpack_tail(data, at)
            except struct.error:  # (the data ends before a header of the last one's length would)
                found = -1
            if found != header_size:
                (header_size,) = _U32.unpack_from(data, at + 8)
                unpack_tail = _tail(header_size)
                _timestamp, _found, header, body_size = unpack_tail(data, at)
            at += 16 + header_size
        except struct.error:
            append(None)
            continue
        if at + body_size != end:
            append(None)
            continue
        append((message_id, exchange, routing_key, header, data[at:end]))
    return contents

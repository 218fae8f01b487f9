"""Field tables, exactly: decoded without recursion, encoded back to the same bytes.

A message is immutable bytes once it is accepted. Where the broker must read a table
(queue arguments, ``x-death``) or change one (``x-delivery-count`` on a redelivery, the
dead-letter headers), it reads and splices the publisher's bytes; where it decodes a table,
every value keeps its wire type, so encoding the decoded value gives the bytes it came from:

* integers keep their width and signedness (:class:`Int8` ``b``, :class:`UInt8` ``B``,
  :class:`Int16` ``s``, :class:`UInt16` ``u``, :class:`Int32` ``I``, :class:`UInt32` ``i``,
  :class:`Int64` ``l``); they are ``int`` subclasses, so they compare and print as integers;
* ``f`` (float32) decodes to :class:`Float32`, ``d`` (float64) to ``float``;
* ``S`` (long string) decodes to ``str`` when it is UTF-8 and to :class:`LongBytes` when it
  is not; ``x`` (byte array) to ``bytearray``;
* ``T`` (timestamp) to an aware ``datetime`` when one can hold it, ``D`` to ``Decimal``
  with its scale, ``t`` to ``bool``, ``V`` to ``None``, ``A`` to ``list``, ``F`` to ``dict``;
* ``L``, which RabbitMQ reads as a signed 64-bit integer too, decodes to :class:`Int64` and
  is written back as ``l``, as RabbitMQ writes it back;
* a value that Python cannot hold faithfully (a table or array nested deeper than
  :data:`MAX_DECODED_DEPTH`, a timestamp past year 9999) stays a :class:`Raw` value: its
  type octet and bytes, written back unchanged.

RabbitMQ puts no limit on nesting (its parser is recursive in Erlang, where that is cheap),
so neither do we: the decoder walks nested tables with an explicit stack, and values past
:data:`MAX_DECODED_DEPTH` are kept as bytes, so nothing downstream (comparisons, JSON,
the log) recurses over them either.

Field types: AMQP 0-9-1 with RabbitMQ's errata (https://www.rabbitmq.com/amqp-0-9-1-errata.html).
Content properties: AMQP 0-9-1 §4.2.6.1, basic class.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

#: Nesting depth to which tables and arrays are decoded into dicts and lists; deeper ones are
#: kept as :class:`Raw` bytes. Real arguments and headers nest two or three levels; 64 leaves
#: room for anything reasonable and keeps every later walk over a decoded value shallow.
MAX_DECODED_DEPTH = 64

#: The largest timestamp a ``datetime`` holds (9999-12-31T23:59:59Z).
_MAX_DATETIME_SECONDS = 253402300799


class TableError(ValueError):
    """A field table that does not parse (a length past its end, an unknown type octet)."""


class Int8(int):
    """A ``b`` field: signed 8-bit."""

    tag = b"b"


class UInt8(int):
    """A ``B`` field: unsigned 8-bit."""

    tag = b"B"


class Int16(int):
    """An ``s`` field: signed 16-bit."""

    tag = b"s"


class UInt16(int):
    """A ``u`` field: unsigned 16-bit."""

    tag = b"u"


class Int32(int):
    """An ``I`` field: signed 32-bit."""

    tag = b"I"


class UInt32(int):
    """An ``i`` field: unsigned 32-bit."""

    tag = b"i"


class Int64(int):
    """An ``l`` field: signed 64-bit (RabbitMQ's ``long``, as in ``x-death`` counts)."""

    tag = b"l"


class Float32(float):
    """An ``f`` field: a float32 value (a plain ``float`` is encoded as ``d``, float64)."""


class LongBytes(bytes):
    """An ``S`` field whose bytes are not UTF-8 (a plain ``bytes`` is encoded as ``S`` too)."""


class Raw:
    """A value kept as its wire bytes: its type octet and encoding, written back unchanged.

    :param tag: the field type octet (``b"F"``, ``b"A"``, ``b"T"`` ...)
    :param data: the encoded value after the type octet
    """

    __slots__ = ("tag", "data")

    def __init__(self, tag: bytes, data: bytes) -> None:
        self.tag = tag
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Raw) and other.tag == self.tag and other.data == self.data

    def __hash__(self) -> int:
        return hash((self.tag, self.data))

    def __repr__(self) -> str:
        return f"Raw({self.tag!r}, {len(self.data)} bytes)"


_INTS: dict[int, tuple[struct.Struct, type[int]]] = {
    ord("b"): (struct.Struct(">b"), Int8),
    ord("B"): (struct.Struct(">B"), UInt8),
    ord("s"): (struct.Struct(">h"), Int16),
    ord("u"): (struct.Struct(">H"), UInt16),
    ord("I"): (struct.Struct(">i"), Int32),
    ord("i"): (struct.Struct(">I"), UInt32),
    ord("l"): (struct.Struct(">q"), Int64),
}
_ENCODE_INTS = {cls: (bytes((tag,)), fmt) for tag, (fmt, cls) in _INTS.items()}
# RabbitMQ also reads ``L`` as a signed 64-bit integer (and writes it back as ``l``); so do we.
_INTS[ord("L")] = _INTS[ord("l")]
#: Bytes after the type octet of each fixed-size type.
_FIXED = {ord("t"): 1, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0}
_FIXED.update({tag: fmt.size for tag, (fmt, _) in _INTS.items()})
#: Types whose value is a 4-byte length and that many bytes.
_SIZED = frozenset(b"SAFx")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_f32 = struct.Struct(">f")
_f64 = struct.Struct(">d")
_decimal = struct.Struct(">Bi")


def value_end(data: bytes, tag: int, pos: int, end: int) -> int:
    """Where the value of type ``tag`` that starts at ``pos`` ends (no decoding, O(1)).

    :raises TableError: an unknown type, or a value running past ``end``
    """
    size = _FIXED.get(tag)
    if size is None:
        if tag not in _SIZED:
            raise TableError(f"unknown field type {chr(tag)!r}")
        if pos + 4 > end:
            raise TableError("field length runs past the table")
        size = 4 + _u32.unpack_from(data, pos)[0]
    if pos + size > end:
        raise TableError("field value runs past the table")
    return pos + size


def iter_table(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int, int]]:
    """The entries of a table's content ``data[start:end]`` (after its length prefix), undecoded.

    Yields ``(key, type octet, value start, value end)``; nested values are skipped by their
    length, so the walk is linear and never recurses.

    :raises TableError: the content does not parse
    """
    pos = start
    while pos < end:
        key_start = pos + 1
        key_end = key_start + data[pos]
        if key_end >= end:
            raise TableError("field name runs past the table")
        tag = data[key_end]
        pos = value_end(data, tag, key_end + 1, end)
        yield bytes(data[key_start:key_end]), tag, key_end + 1, pos


def _scalar(data: bytes, tag: int, pos: int, end: int) -> Any:
    """Decode a value that is not a table or an array (its bytes are ``data[pos:end]``)."""
    known = _INTS.get(tag)
    if known is not None:
        fmt, cls = known
        return cls(fmt.unpack_from(data, pos)[0])
    if tag == 0x53:  # S
        raw = bytes(data[pos + 4 : end])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return LongBytes(raw)
    if tag == 0x74:  # t
        return data[pos] != 0
    if tag == 0x64:  # d
        return _f64.unpack_from(data, pos)[0]
    if tag == 0x66:  # f
        return Float32(_f32.unpack_from(data, pos)[0])
    if tag == 0x54:  # T
        seconds = _u64.unpack_from(data, pos)[0]
        if seconds > _MAX_DATETIME_SECONDS:
            return Raw(b"T", bytes(data[pos:end]))
        return datetime.fromtimestamp(seconds, timezone.utc)
    if tag == 0x44:  # D
        scale, value = _decimal.unpack_from(data, pos)
        return Decimal(value).scaleb(-scale)
    if tag == 0x78:  # x
        return bytearray(data[pos + 4 : end])
    return None  # V


_TABLE = 0x46  # F
_ARRAY = 0x41  # A


def decode_value(data: bytes, tag: int, pos: int, end: int, depth: int = 0) -> Any:
    """Decode the value of type ``tag`` held in ``data[pos:end]``, nested ones included.

    Walks nested tables and arrays with an explicit stack; those deeper than
    :data:`MAX_DECODED_DEPTH` (counting from ``depth``) are kept as :class:`Raw`.

    :raises TableError: the value does not parse
    """
    if tag != _TABLE and tag != _ARRAY:
        return _scalar(data, tag, pos, end)
    if depth >= MAX_DECODED_DEPTH:
        return Raw(bytes((tag,)), bytes(data[pos:end]))
    root: dict[str, Any] | list[Any] = {} if tag == _TABLE else []
    # Each frame: the container being filled, where its next entry starts, where it ends, its depth.
    stack: list[tuple[dict[str, Any] | list[Any], int, int, int]] = [(root, pos + 4, end, depth + 1)]
    while stack:
        container, at, stop, level = stack[-1]
        if at >= stop:
            stack.pop()
            continue
        key = ""
        if type(container) is dict:
            key_end = at + 1 + data[at]
            if key_end >= stop:
                raise TableError("field name runs past the table")
            key = bytes(data[at + 1 : key_end]).decode("utf-8", "surrogateescape")
            at = key_end
        value_tag = data[at]
        value_start = at + 1
        value_stop = value_end(data, value_tag, value_start, stop)
        stack[-1] = (container, value_stop, stop, level)
        value: Any
        if value_tag == _TABLE or value_tag == _ARRAY:
            if level >= MAX_DECODED_DEPTH:
                value = Raw(bytes((value_tag,)), bytes(data[value_start:value_stop]))
            else:
                value = {} if value_tag == _TABLE else []
                stack.append((value, value_start + 4, value_stop, level + 1))
        else:
            value = _scalar(data, value_tag, value_start, value_stop)
        if type(container) is dict:
            container[key] = value
        else:
            container.append(value)  # type: ignore[union-attr]
    return root


def decode_table(data: bytes, start: int = 0) -> tuple[dict[str, Any], int]:
    """Decode the table whose 4-byte length prefix is at ``data[start]``: ``(table, end)``.

    :raises TableError: the table does not parse
    """
    if start + 4 > len(data):
        raise TableError("field table length runs past the data")
    end = start + 4 + _u32.unpack_from(data, start)[0]
    if end > len(data):
        raise TableError("field table runs past the data")
    table = decode_value(data, _TABLE, start, end)
    assert isinstance(table, dict)
    return table, end


# -- encoding ------------------------------------------------------------------------------

#: Nesting depth past which :func:`encode_value` refuses a value built in Python (decoded ones
#: nest at most :data:`MAX_DECODED_DEPTH` levels before they are :class:`Raw`).
MAX_ENCODED_DEPTH = 256


def _integer(value: int) -> bytes:
    """A plain ``int`` in the smallest signed type that holds it (as pamqp and the clients do)."""
    for fmt, tag, low, high in _PLAIN_INTS:
        if low <= value <= high:
            return tag + fmt.pack(value)
    raise TableError(f"integer {value} does not fit a field")


_PLAIN_INTS = (
    (struct.Struct(">b"), b"b", -(2**7), 2**7 - 1),
    (struct.Struct(">h"), b"s", -(2**15), 2**15 - 1),
    (struct.Struct(">i"), b"I", -(2**31), 2**31 - 1),
    (struct.Struct(">q"), b"l", -(2**63), 2**63 - 1),
)


def _decimal_bytes(value: Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise TableError(f"decimal {value} has no field encoding")
    scale = max(0, -exponent)
    unscaled = int(value.scaleb(scale))
    if scale > 255 or not -(2**31) <= unscaled < 2**31:
        raise TableError(f"decimal {value} does not fit a field")
    return _decimal.pack(scale, unscaled)


def _sized(tag: bytes, raw: bytes) -> bytes:
    if len(raw) >= 2**32:
        raise TableError("field longer than 4 GiB")
    return tag + _u32.pack(len(raw)) + raw


def encode_value(value: Any, depth: int = 0) -> bytes:
    """A value's wire form: its type octet and bytes (the inverse of :func:`decode_value`).

    :raises TableError: a value of no field type, out of its type's range, or nested past
        :data:`MAX_ENCODED_DEPTH`
    """
    if isinstance(value, Raw):
        return value.tag + value.data
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        known = _ENCODE_INTS.get(type(value))
        if known is None:
            return _integer(value)
        tag, fmt = known
        try:
            return tag + fmt.pack(value)
        except struct.error as err:
            raise TableError(f"{value} does not fit field type {tag.decode()}") from err
    if isinstance(value, float):
        if isinstance(value, Float32):
            try:
                return b"f" + _f32.pack(value)
            except OverflowError as err:
                raise TableError(f"{value} does not fit a float32 field") from err
        return b"d" + _f64.pack(value)
    if isinstance(value, str):
        return _sized(b"S", value.encode("utf-8", "surrogateescape"))
    if isinstance(value, bytearray):
        return _sized(b"x", bytes(value))
    if isinstance(value, (bytes, memoryview)):
        return _sized(b"S", bytes(value))
    if value is None:
        return b"V"
    if isinstance(value, datetime):
        seconds = int(value.timestamp())
        if seconds < 0:
            raise TableError(f"timestamp {value} is before 1970")
        return b"T" + _u64.pack(seconds)
    if isinstance(value, Decimal):
        return b"D" + _decimal_bytes(value)
    if depth >= MAX_ENCODED_DEPTH:
        raise TableError(f"field value nested more than {MAX_ENCODED_DEPTH} levels deep")
    if isinstance(value, dict):
        return b"F" + encode_table(value, depth + 1)
    if isinstance(value, (list, tuple)):
        return _sized(b"A", b"".join(encode_value(item, depth + 1) for item in value))
    raise TableError(f"{type(value).__name__} value {value!r} has no field type")


def encode_entry(key: str | bytes, value: Any) -> bytes:
    """One table entry: the key as a short string, then the value's wire form."""
    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise TableError("field name longer than 255 bytes")
    return bytes((len(raw),)) + raw + encode_value(value)


def encode_table(table: Any, depth: int = 0) -> bytes:
    """A table with its 4-byte length prefix, entries in the mapping's order (not sorted).

    :raises TableError: as :func:`encode_value`
    """
    if not table:
        return b"\x00\x00\x00\x00"
    parts = []
    for key, value in table.items():
        raw = key if isinstance(key, bytes) else str(key).encode("utf-8", "surrogateescape")
        if len(raw) > 255:
            raise TableError("field name longer than 255 bytes")
        parts.append(bytes((len(raw),)) + raw + encode_value(value, depth))
    return _sized(b"", b"".join(parts))


def check_table(data: bytes, start: int, end: int) -> None:
    """Check that ``data[start:end]`` (a table's entries) parses, nested values included,
    without building any value: a walk with an explicit stack, O(length).

    :raises TableError: where it does not parse (a length past its container, an unknown type)
    """
    stack = [(start, end, True)]  # (next entry, container end, is a table)
    while stack:
        at, stop, is_table = stack.pop()
        while at < stop:
            if is_table:
                at += 1 + data[at]
                if at >= stop:
                    raise TableError("field name runs past the table")
            tag = data[at]
            value_stop = value_end(data, tag, at + 1, stop)
            if tag == _TABLE or tag == _ARRAY:
                stack.append((value_stop, stop, is_table))
                at, stop, is_table = at + 5, value_stop, tag == _TABLE
                continue
            at = value_stop

"""The exact field-table codec: every wire type comes back as the same bytes, at any depth."""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postroom.broker.wire.codec import decode_properties, encode_content_header
from postroom.broker.wire.table import (
    MAX_DECODED_DEPTH,
    Float32,
    Int8,
    Int64,
    LongBytes,
    Raw,
    TableError,
    UInt8,
    check_table,
    decode_table,
    encode_table,
    encode_value,
)


def sized(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


#: One value of each of the 19 field types (and the awkward cases of some), as wire bytes.
ALL_TYPES = [
    (b"t", b"\x01"),
    (b"b", b"\xff"),
    (b"B", b"\xff"),
    (b"s", b"\x80\x00"),
    (b"u", b"\xff\xff"),
    (b"I", b"\x80\x00\x00\x00"),
    (b"i", b"\xff\xff\xff\xff"),
    (b"l", b"\x80" + b"\x00" * 7),
    (b"f", struct.pack(">f", 0.1)),
    (b"d", struct.pack(">d", 0.1)),
    (b"d", struct.pack(">d", 1e300)),  # beyond float32
    (b"D", b"\x02\x00\x00\x00\x96"),
    (b"S", sized(b"\xff\xfe not utf-8")),
    (b"S", sized("заказы".encode())),
    (b"A", sized(b"b\x01S" + sized(b"x"))),
    (b"T", struct.pack(">Q", 1_700_000_000)),
    (b"T", struct.pack(">Q", 2**63)),  # past year 9999
    (b"F", sized(b"\x01kb\x05")),
    (b"V", b""),
    (b"x", sized(b"\x00\x01")),
]


def table_of(values: list[tuple[bytes, bytes]]) -> bytes:
    content = b"".join(
        bytes((len(key),)) + key + tag + data for key, (tag, data) in ((b"k%d" % i, v) for i, v in enumerate(values))
    )
    return sized(content)


def nested(depth: int) -> bytes:
    table = b"\x00\x00\x00\x00"
    for _ in range(depth):
        table = sized(b"\x01kF" + table)
    return table


def test_every_field_type_round_trips_to_the_same_bytes() -> None:
    raw = table_of(ALL_TYPES)
    table, end = decode_table(raw)
    assert end == len(raw)
    assert encode_table(table) == raw


def test_decoded_values_keep_their_wire_type_and_compare_as_plain_values() -> None:
    table, _ = decode_table(table_of(ALL_TYPES))
    assert table["k1"] == -1 and type(table["k1"]) is Int8
    assert table["k2"] == 255 and type(table["k2"]) is UInt8
    assert type(table["k8"]) is Float32 and type(table["k9"]) is float and table["k9"] == 0.1
    assert table["k11"] == Decimal("1.50")
    assert table["k12"] == b"\xff\xfe not utf-8" and type(table["k12"]) is LongBytes
    assert table["k13"] == "заказы"
    assert table["k15"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert table["k16"] == Raw(b"T", struct.pack(">Q", 2**63))
    assert table["k19"] == bytearray(b"\x00\x01")


@pytest.mark.parametrize("depth", [1_000, 3_000])
def test_tables_nested_thousands_deep_decode_without_recursion_and_keep_their_bytes(depth: int) -> None:
    raw = nested(depth)
    table, _ = decode_table(raw)
    assert encode_table(table) == raw
    level = table
    for _ in range(MAX_DECODED_DEPTH - 1):
        level = level["k"]
    assert isinstance(level["k"], Raw)  # deeper levels stay bytes


def test_tables_decoded_as_pamqp_properties_are_exact() -> None:
    # pamqp reads the headers property through the same codec: no float32 for a double, no
    # TypeError for bytes, no reordering of keys.
    header = encode_content_header(
        1, decode_properties(b"\x00<\x00\x00" + b"\x00" * 7 + b"\x01\x20\x00" + table_of(ALL_TYPES))
    )
    assert header[14:] == table_of(ALL_TYPES)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x00\x00\x05\x01kZ\x00\x00",  # unknown type octet
        b"\x00\x00\x00\x09\x01kS\x00\x00\x00\x09x",  # long string past the table
        b"\x00\x00\x00\x02\x05k",  # key past the table
        b"\x00\x00\x00\x09",  # table past the data
    ],
)
def test_malformed_tables_raise_table_error_only(raw: bytes) -> None:
    with pytest.raises(TableError):
        decode_table(raw)


def test_values_out_of_their_types_range_are_refused_not_truncated() -> None:
    with pytest.raises(TableError):
        encode_value(Int8(300))
    with pytest.raises(TableError):
        encode_value(Float32(1e300))
    with pytest.raises(TableError):
        encode_value(object())
    assert encode_value(Int64(1)) == b"l" + struct.pack(">q", 1)
    assert encode_value(0.1) == b"d" + struct.pack(">d", 0.1)  # a Python float is a double


values = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=20),
        st.binary(max_size=20).map(LongBytes),
        st.binary(max_size=20).map(bytearray),
        st.none(),
        st.integers(0, 2**8 - 1).map(UInt8),
    ),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_encoding_a_decoded_table_gives_the_same_bytes(table: dict) -> None:
    raw = encode_table(table)
    decoded, _ = decode_table(raw)
    assert encode_table(decoded) == raw
    assert decode_table(encode_table(decoded))[0] == decoded


@given(st.binary(max_size=200))
def test_garbage_raises_only_table_error(data: bytes) -> None:
    try:
        decode_table(sized(data))
    except TableError:
        pass


@given(st.binary(max_size=300))
def test_checking_a_table_agrees_with_decoding_it(data: bytes) -> None:
    # check_table (at publish, building nothing) refuses exactly what the decoder refuses.
    raw = sized(data)
    try:
        decode_table(raw)
        decodes = True
    except TableError:
        decodes = False
    try:
        check_table(raw, 4, len(raw))
        checks = True
    except TableError:
        checks = False
    assert checks == decodes


@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_every_encoded_table_passes_the_check(table: dict) -> None:
    raw = encode_table(table)
    check_table(raw, 4, len(raw))

"""The WAL record format: framing, every record type, strict decoding and scanning past damage."""

from __future__ import annotations

import pickle
import struct
import zlib
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.broker.tools.fuzzing import sub_entry_batch
from postroom.broker.wal import chunks, codec
from postroom.broker.wal.chunks import (
    BATCHED,
    RAW,
    STREAM_CHUNK_HEAD,
    STREAM_CHUNK_OVERHEAD,
    STREAM_CHUNK_TYPES,
    TRACKING_SEQUENCE,
    TRACKING_SNAPSHOT,
    batch_records,
    count_entries,
    encode_stream_chunk,
    pack_raw_entries,
    pack_stream_entries,
    pack_tracking,
    unpack_batched_messages,
    unpack_raw_messages,
    unpack_tracking,
)
from postroom.broker.wal.codec import (
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    decode,
    encode,
    encode_published,
    published_content,
    published_contents,
)
from postroom.broker.wal.crc import crc32_before, crc32_shifted, stream_entries_crc
from postroom.broker.wal.records import (
    RECORD_CLASSES,
    Bound,
    DeadLettered,
    DeadLetterSettled,
    Defined,
    DeliveryCounted,
    ExchangeDeclared,
    ExchangeDeleted,
    PolicyCleared,
    PolicySet,
    Published,
    QueueDeclared,
    QueueDeleted,
    RecordType,
    Removed,
    Snapshot,
    StreamBatchChunk,
    StreamChunk,
    StreamOffset,
    StreamRawChunk,
    StreamTrackedBatchChunk,
    StreamTrackedChunk,
    StreamTrackedRawChunk,
    Unbound,
    Undefined,
    WALCorruption,
)
from postroom.broker.wal.segments import (
    FORMAT_VERSION,
    MAGIC,
    SEGMENT_HEADER_BYTES,
    iter_records,
    parse_segment_header,
    scan,
    segment_header,
)

#: One example of each record type, with every bool set differently from its neighbours.
EXAMPLES = [
    ExchangeDeclared("/", "orders", "topic", True, False, True, b"\x00\x00\x00\x00"),
    ExchangeDeleted("/", "orders"),
    QueueDeclared("prod", "orders.created", True, True, b"\x00\x00\x00\x05table"),
    QueueDeleted("/", "orders.created"),
    Bound("/", "orders", "orders.created", True, "order.*.created", b""),
    Unbound("/", "amq.topic", "orders", False, "#", b"args"),
    Published(1, "/", ("q",), "", "k", 1700000000.25, b"hdr", b"0123456789abcdef"),
    Removed("/", "q", (1, 2, 2**64 - 1)),
    DeliveryCounted("/", "q", 7, 3),
    Snapshot(True),
    Snapshot(False),
    DeadLettered(
        (3 << 40) + 1,
        "/",
        "orders",
        "rejected",
        2,
        1700000000.5,
        "orders",
        ("order.eu", "cc"),
        "dlx",
        ("dlq", "audit"),
        "m-1",
        ("tenant", "x-first-death-reason"),
        ("acme", "rejected"),
        ("orders",),
        ("rejected",),
        ("orders",),
        (1,),
        (1700000000,),
        4096,
        b'{"id": 1',
    ),
    DeadLetterSettled((3 << 40) + 1, "/", "dlq", 1700000001.25),
    PolicySet("prod", "DLX", True, b'{"pattern":"^orders\\.","definition":{"message-ttl":1000}}'),
    PolicyCleared("prod", "DLX", False),
    StreamChunk(1000, 1700000002.5, 2, pack_stream_entries([(b"", b"q", b"\x00\x3c", b"a"), (b"ex", b"k", b"", b"")])),
    StreamRawChunk(1002, 1700000002.75, 2, pack_raw_entries([b"\x00Sw\xa1\x01a", b""])),
    StreamBatchChunk(1004, 1700000002.875, 3, sub_entry_batch([b"a", b"b"]) + pack_raw_entries([b"c"])),
    StreamTrackedChunk(1007, 1700000003.0, 1, pack_stream_entries([(b"", b"q", b"", b"a")]), b""),
    StreamTrackedRawChunk(1008, 1700000003.5, 1, pack_raw_entries([b"a"]), pack_tracking([("p", 9)])),
    StreamTrackedBatchChunk(
        1009, 1700000004.0, 2, sub_entry_batch([b"a", b"b"]), pack_tracking([("q", 2**64 - 1)], snapshot=True)
    ),
    StreamOffset("/", "events", "billing", 300),
    Defined("user", "app", b'{"password_hash":"rabbitmq-sha256$abc=","tags":["monitoring"]}'),
    Undefined("vhost", "staging"),
]

#: Strings as they reach the broker: any text, or bytes that are not UTF-8 decoded with surrogateescape.
names = st.one_of(
    st.text(max_size=12),
    st.binary(max_size=12).map(lambda data: data.decode("utf-8", "surrogateescape")),
)


u64 = st.integers(min_value=0, max_value=2**64 - 1)
blobs = st.binary(max_size=64)
timestamps = st.floats(allow_nan=False)

published = st.builds(
    Published,
    message_id=u64,
    vhost=names,
    queues=st.lists(names, max_size=4).map(tuple),
    exchange=names,
    routing_key=names,
    timestamp=timestamps,
    header=blobs,
    body=blobs,
)
any_record = st.one_of(
    st.builds(ExchangeDeclared, names, names, names, st.booleans(), st.booleans(), st.booleans(), blobs),
    st.builds(ExchangeDeleted, names, names),
    st.builds(QueueDeclared, names, names, st.booleans(), st.booleans(), blobs),
    st.builds(QueueDeleted, names, names),
    st.builds(Bound, names, names, names, st.booleans(), names, blobs),
    st.builds(Unbound, names, names, names, st.booleans(), names, blobs),
    published,
    st.builds(Removed, names, names, st.lists(u64, max_size=8).map(tuple)),
    st.builds(DeliveryCounted, names, names, u64, u64),
    st.builds(Snapshot, st.booleans()),
)


def frame(record_type: int, payload: bytes) -> bytes:
    """A record frame built by hand, independently of encode()."""
    crc = zlib.crc32(bytes((record_type,)) + payload)
    return struct.pack(">IIB", len(payload), crc, record_type) + payload


def payload_of(value: object) -> bytes:
    return encode(value)[RECORD_HEADER_BYTES:]  # type: ignore[arg-type]


# -- segment header ---------------------------------------------------------------------------


def test_segment_header_is_magic_then_big_endian_number() -> None:
    assert segment_header(3) == b"PRWAL\x00\x00\x01" + b"\x00" * 7 + b"\x03"
    assert len(segment_header(3)) == SEGMENT_HEADER_BYTES == 16
    assert MAGIC[-1] == FORMAT_VERSION == 1


def test_segment_header_round_trips() -> None:
    assert parse_segment_header(segment_header(2**64 - 1) + b"records") == 2**64 - 1


def test_bad_magic_is_corruption() -> None:
    with pytest.raises(WALCorruption) as excinfo:
        parse_segment_header(b"NOTAWAL\x01" + bytes(8))
    assert excinfo.value.offset == 0
    assert "bad magic" in excinfo.value.reason


def test_other_format_version_is_refused() -> None:
    with pytest.raises(WALCorruption) as excinfo:
        parse_segment_header(b"PRWAL\x00\x00\x02" + bytes(8))
    assert excinfo.value.reason == "unsupported format version 2 (this reader knows 1)"


def test_short_segment_header_is_corruption() -> None:
    with pytest.raises(WALCorruption) as excinfo:
        parse_segment_header(segment_header(1)[:15])
    assert excinfo.value.reason == "truncated segment header"


def test_segment_number_must_fit_u64() -> None:
    with pytest.raises(ValueError):
        segment_header(2**64)


# -- framing and the encodings ------------------------------------------------------------------


def test_record_is_length_crc_type_payload() -> None:
    # The worked example of docs/wal-format.md.
    assert encode(QueueDeleted("/", "q")) == bytes.fromhex("00000006 920b1d5e 04 0001 2f 0001 71")
    assert encode(QueueDeleted("/", "q")) == frame(RecordType.QUEUE_DELETED, b"\x00\x01/\x00\x01q")


def test_bools_share_one_flags_octet_where_the_first_bool_is() -> None:
    # vhost, name, type, flags (durable=bit 0, auto_delete=bit 1, internal=bit 2), arguments
    payload = payload_of(ExchangeDeclared("/", "x", "direct", True, False, True, b"a"))
    assert payload == b"\x00\x01/" + b"\x00\x01x" + b"\x00\x06direct" + b"\x05" + b"\x00\x00\x00\x01a"


def test_published_payload_layout() -> None:
    payload = payload_of(Published(2, "/", ("a", "bb"), "ex", "k", 1.5, b"h", b"body"))
    assert payload == (
        struct.pack(">Q", 2)
        + b"\x00\x01/"
        + b"\x00\x02"
        + b"\x00\x01a\x00\x02bb"
        + b"\x00\x02ex"
        + b"\x00\x01k"
        + struct.pack(">d", 1.5)
        + b"\x00\x00\x00\x01h"
        + b"\x00\x00\x00\x04body"
    )


def test_int_tuples_are_u32_count_then_u64s() -> None:
    assert payload_of(Removed("", "", (1, 2))) == b"\x00\x00\x00\x00" + struct.pack(">IQQ", 2, 1, 2)


def test_crc_covers_the_type_byte() -> None:
    data = bytearray(encode(ExchangeDeleted("/", "x")))
    data[8] = RecordType.QUEUE_DELETED  # same payload layout: only the CRC can tell
    assert scan(bytes(data)).problem == "bad crc"


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda value: type(value).__name__)
def test_every_record_type_round_trips(value: object) -> None:
    data = encode(value)  # type: ignore[arg-type]
    assert list(iter_records(data)) == [(0, len(data), value)]
    assert decode(data[8], data[RECORD_HEADER_BYTES:]) == value


def test_every_record_type_has_an_example() -> None:
    assert {type(value) for value in EXAMPLES} == set(RECORD_CLASSES.values())
    assert set(RECORD_CLASSES) == set(RecordType)


@settings(max_examples=150)
@given(value=published)
def test_published_round_trips_any_names_bytes_and_ids(value: Published) -> None:
    data = encode(value)
    assert list(iter_records(data)) == [(0, len(data), value)]


@settings(max_examples=150)
@given(values=st.lists(any_record, max_size=6))
def test_any_sequence_of_records_round_trips(values: list[object]) -> None:
    data = b"".join(encode(value) for value in values)  # type: ignore[arg-type]
    assert [value for _, _, value in iter_records(data)] == values


@settings(max_examples=100)
@given(value=published)
def test_unrolled_published_codec_matches_the_generic_one(value: Published) -> None:
    spec = codec._SPECS[Published]
    payload = codec._encode_published(value)
    assert payload == codec._encode_fields(value, spec)
    assert codec._decode_published(payload) == codec._decode_fields(Published, spec, payload) == value


@settings(max_examples=100)
@given(
    first=u64,
    timestamp=timestamps,
    count=u64,
    entries=st.binary(max_size=300),
)
def test_encode_stream_chunk_matches_encode_of_the_record(
    first: int, timestamp: float, count: int, entries: bytes
) -> None:
    data = encode_stream_chunk(first, timestamp, count, entries)
    assert data == encode(StreamChunk(first, timestamp, count, entries))
    assert len(data) == STREAM_CHUNK_OVERHEAD + len(entries)
    raw = encode_stream_chunk(first, timestamp, count, entries, RAW)
    assert raw == encode(StreamRawChunk(first, timestamp, count, entries))
    batched = encode_stream_chunk(first, timestamp, count, entries, BATCHED)
    assert batched == encode(StreamBatchChunk(first, timestamp, count, entries))
    trailer = pack_tracking([("ref", count)])
    tracked = encode_stream_chunk(first, timestamp, count, entries, RAW, trailer)
    assert tracked == encode(StreamTrackedRawChunk(first, timestamp, count, entries, trailer))
    assert len(tracked) == STREAM_CHUNK_OVERHEAD + len(entries) + 4 + len(trailer)


@given(
    references=st.lists(st.tuples(st.text(max_size=300), st.integers(0, 2**64 - 1)), max_size=4),
    snapshot=st.booleans(),
    data=st.binary(max_size=100),
    suffix=st.binary(max_size=40),
)
def test_tracking_entries_come_back_and_a_crc_runs_back_over_a_suffix(
    references: list[tuple[str, int]], snapshot: bool, data: bytes, suffix: bytes
) -> None:
    """osiris's tracking entries (type, id size, id, u64): a reference of 256 bytes or more is
    left out. CRC-32 undone over a suffix gives the CRC of what came before it."""
    packed = pack_tracking(references, snapshot)
    kept = [(name, value) for name, value in references if len(name.encode("utf-8", "surrogateescape")) < 256]
    kind = TRACKING_SEQUENCE | (TRACKING_SNAPSHOT if snapshot else 0)
    assert unpack_tracking(packed) == [(kind, name, value) for name, value in kept]
    if packed:
        with pytest.raises(WALCorruption):
            unpack_tracking(packed[:-1])
    assert crc32_before(zlib.crc32(data + suffix), suffix) == zlib.crc32(data)


@given(messages=st.lists(st.binary(max_size=40), max_size=8), junk=st.binary(min_size=1, max_size=3))
def test_raw_entries_are_simple_entries_and_come_back_as_stream_protocol_messages(
    messages: list[bytes], junk: bytes
) -> None:
    packed = pack_raw_entries(messages)
    assert packed == b"".join(struct.pack(">I", len(m)) + m for m in messages)
    assert unpack_raw_messages(b"head" + packed, 4, len(messages)) == [(b"\x00\x00", b"", m) for m in messages]
    with pytest.raises(WALCorruption):
        unpack_raw_messages(packed + junk, 0, len(messages))
    if messages:
        with pytest.raises(WALCorruption):
            unpack_raw_messages(packed[:-1], 0, len(messages))


@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["simple", "batch", "gzip"]), st.lists(st.binary(max_size=20), min_size=1, max_size=4)
        ),
        max_size=6,
    ),
    junk=st.binary(min_size=1, max_size=3),
)
def test_batched_entries_give_a_message_for_each_offset_but_in_compressed_batches(
    entries: list[tuple[str, list[bytes]]], junk: bytes
) -> None:
    packed, expected, kinds = b"", [], []
    for kind, messages in entries:
        if kind == "simple":
            entry = pack_raw_entries(messages[:1])
            expected.append((b"\x00\x00", b"", messages[0]))
        else:
            entry = sub_entry_batch(messages, 1 if kind == "gzip" else 0)
            expected += [None] * len(messages) if kind == "gzip" else [(b"\x00\x00", b"", m) for m in messages]
        packed += entry
        kinds.append(batch_records(entry))
    assert sum(kinds) == len(expected)
    assert unpack_batched_messages(b"head" + packed, 4, len(expected)) == expected
    assert count_entries(memoryview(b"head" + packed), 4) == len(entries)
    for damaged, count in ((packed + junk, len(expected)), (packed, len(expected) + 1)):
        with pytest.raises(WALCorruption):
            unpack_batched_messages(damaged, 0, count)
    if entries:
        with pytest.raises(WALCorruption):
            unpack_batched_messages(packed[:-1], 0, len(expected))
        with pytest.raises(WALCorruption):
            count_entries(packed[:-1], 0)


def test_an_uncompressed_batch_that_does_not_hold_its_count_is_corrupt() -> None:
    batch = sub_entry_batch([b"a", b"b"])
    for records in (1, 3):
        lying = batch[:1] + struct.pack(">H", records) + batch[3:]
        with pytest.raises(WALCorruption):
            unpack_batched_messages(lying, 0, records)


def test_encode_stream_chunk_refuses_what_encode_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        encode_stream_chunk(-1, 0.0, 1, b"x")
    monkeypatch.setattr(chunks, "MAX_RECORD_BYTES", 100)
    encode_stream_chunk(0, 0.0, 1, b"x" * 50)
    with pytest.raises(ValueError) as excinfo:
        encode_stream_chunk(0, 0.0, 1, b"x" * 100)
    assert "over 100" in str(excinfo.value)


u64 = st.integers(min_value=0, max_value=2**64 - 1)
dead_letters = st.builds(
    DeadLettered,
    u64,
    names,
    names,
    names,
    u64,
    st.floats(allow_nan=False),
    names,
    st.tuples(names),
    names,
    st.lists(names, max_size=3).map(tuple),
    names,
    st.lists(names, max_size=3).map(tuple),
    st.lists(names, max_size=3).map(tuple),
    st.tuples(names),
    st.tuples(names),
    st.tuples(names),
    st.tuples(u64),
    st.tuples(u64),
    u64,
    st.binary(max_size=64),
)


@settings(max_examples=100)
@given(value=dead_letters, cut=st.integers(min_value=1, max_value=40))
def test_unrolled_dead_lettered_decoder_matches_the_generic_one(value: DeadLettered, cut: int) -> None:
    spec = codec._SPECS[DeadLettered]
    payload = codec._encode_fields(value, spec)
    assert codec._decode_dead_lettered(payload) == codec._decode_fields(DeadLettered, spec, payload) == value
    with pytest.raises(WALCorruption):
        decode(RecordType.DEAD_LETTERED, payload[:-cut] if cut < len(payload) else b"")
    with pytest.raises(WALCorruption):
        decode(RecordType.DEAD_LETTERED, payload + b"\x00")


def test_names_that_were_not_utf8_round_trip_byte_for_byte() -> None:
    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    data = encode(QueueDeleted("/", name))
    assert b"caf\xe9" in data
    assert decode(RecordType.QUEUE_DELETED, data[RECORD_HEADER_BYTES:]) == QueueDeleted("/", name)


@pytest.mark.parametrize(
    "value",
    [
        QueueDeleted("/", "x" * 65536),  # over a u16 length
        QueueDeleted("/", "\ud800"),  # a surrogate that surrogateescape did not make
        DeliveryCounted("/", "q", -1, 0),
        DeliveryCounted("/", "q", 2**64, 0),
        Removed("/", "q", (-1,)),
        Published(1, "/", ("q",) * 65536, "", "", 0.0, b"", b""),
    ],
    ids=["long-name", "lone-surrogate", "negative-id", "id-over-u64", "negative-in-tuple", "too-many-queues"],
)
def test_values_that_do_not_fit_raise_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        encode(value)  # type: ignore[arg-type]


def test_payload_over_the_limit_is_refused_by_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_RECORD_BYTES", 100)
    encode(Published(1, "/", ("q",), "", "", 0.0, b"", b"x" * 60))
    with pytest.raises(ValueError) as excinfo:
        encode(Published(1, "/", ("q",), "", "", 0.0, b"", b"x" * 100))
    assert "over 100" in str(excinfo.value)


def test_encode_refuses_what_is_not_a_record() -> None:
    with pytest.raises(TypeError):
        encode(("not", "a", "record"))  # type: ignore[arg-type]


def test_max_record_bytes_is_64_mib_body_plus_1_mib() -> None:
    assert MAX_RECORD_BYTES == 65 * 1024 * 1024


# -- strict decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda value: type(value).__name__)
def test_every_shortened_payload_is_malformed(value: object) -> None:
    payload = payload_of(value)
    record_type = encode(value)[8]  # type: ignore[arg-type]
    for size in range(len(payload)):
        with pytest.raises(WALCorruption):
            decode(record_type, payload[:size])


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda value: type(value).__name__)
def test_trailing_bytes_are_malformed(value: object) -> None:
    record_type = encode(value)[8]  # type: ignore[arg-type]
    with pytest.raises(WALCorruption) as excinfo:
        decode(record_type, payload_of(value) + b"\x00")
    assert "1 trailing bytes" in excinfo.value.reason


def test_unknown_flag_bits_are_malformed() -> None:
    with pytest.raises(WALCorruption) as excinfo:
        decode(RecordType.SNAPSHOT, b"\x03")
    assert excinfo.value.reason == "Snapshot has unknown flag bits set: 0x03"


def test_unknown_record_type_is_malformed() -> None:
    with pytest.raises(WALCorruption) as excinfo:
        decode(42, b"")
    assert excinfo.value.reason == "unknown record type 42"


def test_malformed_payload_names_the_field() -> None:
    payload = payload_of(Published(1, "/", ("q",), "", "", 0.0, b"", b"body"))
    with pytest.raises(WALCorruption) as excinfo:
        decode(RecordType.PUBLISHED, payload[:-1])
    assert excinfo.value.reason == "Published.body runs past the end"


def test_huge_tuple_count_is_malformed_without_allocating() -> None:
    payload = b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff"  # vhost "", queue "", 4 billion ids
    with pytest.raises(WALCorruption):
        decode(RecordType.REMOVED, payload)


@settings(max_examples=300)
@given(record_type=st.integers(min_value=0, max_value=255), payload=st.binary(max_size=80))
def test_garbage_payload_raises_only_wal_corruption(record_type: int, payload: bytes) -> None:
    try:
        decode(record_type, payload)
    except WALCorruption:
        pass


@settings(max_examples=300)
@given(data=st.binary(max_size=200), start=st.integers(min_value=0, max_value=20))
def test_scanning_garbage_never_raises(data: bytes, start: int) -> None:
    result = scan(data, start)
    assert (result.problem is None) == (result.end >= len(data))
    assert [entry for entry in iter_records(data, start)] == result.records


# -- scanning: where valid data stops and why ------------------------------------------------------

FIRST = encode(QueueDeclared("/", "a", True, False, b""))
SECOND = encode(QueueDeclared("/", "b", True, False, b""))
THIRD = encode(QueueDeclared("/", "c", True, False, b""))


def test_clean_data_scans_to_its_end() -> None:
    data = FIRST + SECOND
    result = scan(data)
    assert (result.end, result.problem, result.resync) == (len(data), None, None)
    assert [(start, end) for start, end, _ in result.records] == [(0, len(FIRST)), (len(FIRST), len(data))]


def test_scan_starts_at_start() -> None:
    data = segment_header(1) + FIRST
    assert scan(data, SEGMENT_HEADER_BYTES).records == [(16, len(data), decode(3, FIRST[9:]))]


def test_truncated_header_is_reported() -> None:
    result = scan(FIRST + SECOND[:8])
    assert (result.end, result.problem, result.resync) == (len(FIRST), "truncated header", None)
    assert len(result.records) == 1


def test_truncated_payload_is_reported() -> None:
    result = scan(FIRST + SECOND[:-1])
    assert (result.end, result.problem, result.resync) == (len(FIRST), "truncated payload", None)


def test_checksum_mismatch_is_reported() -> None:
    damaged = SECOND[:-1] + bytes((SECOND[-1] ^ 1,))
    result = scan(FIRST + damaged)
    assert (result.end, result.problem, result.resync) == (len(FIRST), "bad crc", None)


def test_length_over_limit_is_reported() -> None:
    huge = struct.pack(">IIB", MAX_RECORD_BYTES + 1, 0, 1)
    result = scan(FIRST + huge + bytes(100))
    assert (result.end, result.problem) == (len(FIRST), "length over limit")


def test_well_framed_but_malformed_payload_is_reported() -> None:
    result = scan(FIRST + frame(RecordType.SNAPSHOT, b"\x01\x00"))
    assert (result.end, result.problem) == (len(FIRST), "malformed payload: Snapshot has 1 trailing bytes")


def test_unknown_type_with_good_crc_is_reported() -> None:
    result = scan(FIRST + frame(200, b""))
    assert result.problem == "malformed payload: unknown record type 200"


def test_resync_finds_the_next_record_after_a_damaged_payload() -> None:
    damaged = SECOND[:-1] + bytes((SECOND[-1] ^ 0x80,))
    result = scan(FIRST + damaged + THIRD)
    assert (result.end, result.problem, result.resync) == (len(FIRST), "bad crc", len(FIRST) + len(SECOND))
    assert result.resync is not None
    after = scan(FIRST + damaged + THIRD, result.resync)
    assert [value for _, _, value in after.records] == [decode(3, THIRD[9:])]


def test_resync_scans_byte_by_byte_when_the_length_is_damaged() -> None:
    damaged = b"\x00\x00\x01\x00" + SECOND[4:]  # length 256: runs past the data
    result = scan(FIRST + damaged + THIRD)
    assert (result.problem, result.resync) == ("truncated payload", len(FIRST) + len(SECOND))


def test_resync_skips_garbage_between_records() -> None:
    garbage = bytes(range(256)) * 3
    result = scan(FIRST + garbage + THIRD)
    assert result.resync == len(FIRST) + len(garbage)


def test_resync_prefers_where_the_damaged_record_claims_to_end() -> None:
    # A body that holds a valid record must not be mistaken for the next record when only
    # another byte of its payload is damaged.
    inner = encode(Removed("/", "q", (1,)))
    outer = bytearray(encode(Published(1, "/", ("q",), "", "", 0.0, b"", inner)))
    outer[20] ^= 0x01
    result = scan(bytes(outer) + THIRD)
    assert result.resync == len(outer)


def test_zeros_after_the_records_do_not_resync() -> None:
    result = scan(FIRST + bytes(4096))
    assert (result.end, result.problem, result.resync) == (len(FIRST), "bad crc", None)


def test_iter_records_stops_at_the_first_problem() -> None:
    damaged = SECOND[:-1] + bytes((SECOND[-1] ^ 1,))
    assert [start for start, _, _ in iter_records(FIRST + damaged + THIRD)] == [0]


def test_iter_records_accepts_bytearray_and_memoryview() -> None:
    data = FIRST + SECOND
    assert list(iter_records(bytearray(data))) == list(iter_records(memoryview(data))) == list(iter_records(data))


# -- the error ---------------------------------------------------------------------------------


def test_corruption_says_where() -> None:
    assert str(WALCorruption("bad crc", 3, 4096)) == "segment 3 offset 4096: bad crc"
    assert str(WALCorruption("bad crc", offset=16)) == "offset 16: bad crc"
    assert str(WALCorruption("bad crc")) == "bad crc"


def test_corruption_pickles_for_spark() -> None:
    error = pickle.loads(pickle.dumps(WALCorruption("bad crc", 3, 4096)))
    assert (error.reason, error.segment, error.offset, str(error)) == (
        "bad crc",
        3,
        4096,
        "segment 3 offset 4096: bad crc",
    )


@given(
    message_id=st.integers(min_value=1, max_value=2**64 - 1),
    queues=st.lists(st.text(max_size=20), min_size=1, max_size=3).map(tuple),
    body=st.binary(max_size=64),
)
def test_encode_published_matches_encode_of_the_record(message_id: int, queues: tuple[str, ...], body: bytes) -> None:
    record = Published(message_id, "/", queues, "ex", "rk", 1.5, b"h" * 14, body)
    assert encode_published(message_id, "/", queues, "ex", "rk", 1.5, b"h" * 14, body) == encode(record)


@pytest.mark.parametrize("queues", [(), ("q",), ("a", "bb", "ccc")])
def test_published_content_reads_what_a_delivery_needs_and_only_from_a_valid_record(queues: tuple[str, ...]) -> None:
    header = b"\x00<\x00\x00" + bytes(8) + b"\x10\x00\x02"
    record = encode_published(7, "/", queues, "ex\u00e9", "key", 1.5, header, b"body")
    data = b"pad" + record + b"tail"
    assert published_content(data, 3, len(record)) == (7, "ex\u00e9".encode(), b"key", header, b"body")
    assert published_content(data, 3, len(record) - 1) is None  # not exactly that record
    assert published_content(data, 4, len(record)) is None
    damaged = data[:-10] + bytes([data[-10] ^ 1]) + data[-9:]  # a bit of the body
    assert published_content(damaged, 3, len(record)) is None
    other = encode(Removed("/", "q", (7,)))
    assert published_content(other, 0, len(other)) is None


@given(
    routes=st.lists(
        st.tuples(
            st.sampled_from([("q",), ("q", "r"), ("qq",)]), st.sampled_from(["", "ex"]), st.sampled_from(["k", "kk"])
        ),
        min_size=1,
        max_size=12,
    ),
    damaged=st.integers(min_value=-1, max_value=11),
    kinds=st.lists(st.integers(min_value=0, max_value=3), min_size=12, max_size=12),
)
def test_published_contents_of_a_span_read_each_record_as_published_content_does(
    routes: list[tuple[tuple[str, ...], str, str]], damaged: int, kinds: list[int]
) -> None:
    """Records read alike skip their names (headers repeat or not, of several lengths); one
    that differs, or is damaged, is read on its own."""
    headers = [b"\x00<\x00\x00" + bytes(8) + b"\x10\x00" + bytes([kind]) * (1 + kind % 3) for kind in kinds]
    records = [
        encode_published(n + 1, "/", queues, exchange, key, 1.5, headers[n], b"b%d" % n)
        for n, (queues, exchange, key) in enumerate(routes)
    ]
    data = bytearray(b"pad" + b"".join(records))
    places, offset = [], 103
    for encoded in records:
        places.append(SimpleNamespace(offset=offset, length=len(encoded)))
        offset += len(encoded)
    if 0 <= damaged < len(records):
        data[places[damaged].offset - 100 + RECORD_HEADER_BYTES + 9] ^= 1  # a byte of its names
    contents = published_contents(bytes(data), 100, places)
    expected = [published_content(bytes(data), place.offset - 100, place.length) for place in places]
    assert contents == expected
    assert [content is None for content in contents] == [n == damaged for n in range(len(records))]


def test_decoding_published_records_that_came_different_ways_keeps_each_ones_names() -> None:
    first = Published(1, "/", ("a",), "ex", "k", 1.0, b"h" * 14, b"x")
    longer = Published(2, "/", ("a", "b"), "ex", "k", 1.0, b"h" * 14, b"y")
    other = Published(3, "v", ("a",), "ex", "k", 1.0, b"h" * 14, b"z")
    for published in [first, first, longer, first, other, other, longer]:
        assert decode(RecordType.PUBLISHED, encode(published)[RECORD_HEADER_BYTES:]) == published


@given(head=st.binary(max_size=40), data=st.binary(max_size=3000), record_type=st.integers(0, 255))
def test_a_crc_over_data_after_a_head_gives_the_datas_own_crc(head: bytes, data: bytes, record_type: int) -> None:
    start = zlib.crc32(bytes((record_type,)) + head)
    assert zlib.crc32(data, start) ^ crc32_shifted(start, len(data)) == zlib.crc32(data)
    whole = zlib.crc32(bytes((record_type,)) + head + data)
    assert stream_entries_crc(whole, record_type, head, len(data)) == zlib.crc32(data)


def test_a_stream_chunk_records_entries_crc_comes_from_its_own() -> None:
    entries = pack_raw_entries([b"x" * 70_000, b"y"])
    data = encode_stream_chunk(5, 1.5, 2, [entries[:1000], entries[1000:]], RAW)
    crc, record_type = struct.unpack_from(">IB", data, 4)
    head = data[RECORD_HEADER_BYTES : RECORD_HEADER_BYTES + STREAM_CHUNK_HEAD.size]
    assert record_type == STREAM_CHUNK_TYPES[RAW]
    assert stream_entries_crc(crc, record_type, head, len(entries)) == zlib.crc32(entries)
    assert data == encode(StreamRawChunk(5, 1.5, 2, entries))

"""Reading dead-letter segments into events: every kind of damage is a counted row, never an error."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from postroom.broker.wal.codec import encode  # noqa: E402
from postroom.broker.wal.records import Published  # noqa: E402
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, segment_header  # noqa: E402
from postroom.spark.events import list_segments, segment_batches  # noqa: E402
from postroom.spark.schema import ARROW_SCHEMA  # noqa: E402
from tests.spark.records import dead_lettered, segment, settled  # noqa: E402


def events(data: bytes, number: int = 1) -> list[dict[str, object]]:
    return [row for batch in segment_batches(data, number) for row in batch.to_pylist()]


def kinds(data: bytes) -> list[str]:
    return [str(row["kind"]) for row in events(data)]


def test_every_field_of_a_dead_letter_reaches_its_column() -> None:
    data = segment(1, [dead_lettered(7, headers={"tenant": "acme"}, delivery_count=3, time=1_795_000_000.25)])
    (row,) = events(data)
    assert row["kind"] == "dead_lettered"
    assert row["dead_letter_id"] == 7
    assert row["queue"] == "work"
    assert row["reason"] == "rejected"
    assert row["delivery_count"] == 3
    assert row["headers"] == [("tenant", "acme")]
    assert row["dead_letter_queues"] == ["dlq"]
    assert row["routing_keys"] == ["order.created"]
    assert row["message_id"] == "m-7"
    assert row["body_preview"] == b'{"id": 1}'
    assert row["body_size"] == 9
    assert row["time"].timestamp() == 1_795_000_000.25
    assert row["deaths"][0]["queue"] == "work"
    assert row["deaths"][0]["time"].timestamp() == 1_795_000_000
    assert row["date"] == "2026-11-18"
    assert (row["segment"], row["offset"], row["problem"]) == (1, SEGMENT_HEADER_BYTES, None)


def test_settled_events_name_the_dead_letter_and_its_queue() -> None:
    (row,) = events(segment(1, [settled(7, queue="dlq.b")]))
    assert (row["kind"], row["dead_letter_id"], row["queue"]) == ("settled", 7, "dlq.b")


def test_an_empty_file_is_one_corrupt_record() -> None:
    (row,) = events(b"")
    assert row["kind"] == "corrupt"
    assert "bad segment header" in str(row["problem"])
    assert row["date"] == "unknown"


def test_a_segment_holding_only_its_header_has_no_events() -> None:
    assert events(segment_header(1)) == []


def test_a_header_for_another_segment_number_is_corrupt() -> None:
    assert kinds(segment(2, [dead_lettered(1)])) == ["corrupt"]


def test_a_torn_tail_is_counted_after_the_complete_records() -> None:
    whole = segment(1, [dead_lettered(1), dead_lettered(2)])
    torn = whole[:-5]
    rows = events(torn)
    assert [row["kind"] for row in rows] == ["dead_lettered", "corrupt"]
    assert "torn tail" in str(rows[1]["problem"])
    assert rows[1]["date"] == rows[0]["date"]  # a corrupt row is filed with its segment's events


def test_a_flipped_byte_skips_one_record_and_reads_on() -> None:
    data = bytearray(segment(1, [dead_lettered(1), dead_lettered(2), dead_lettered(3)]))
    second = SEGMENT_HEADER_BYTES + len(encode(dead_lettered(1)))
    data[second + 30] ^= 0x40
    rows = events(bytes(data))
    assert [row["kind"] for row in rows] == ["dead_lettered", "corrupt", "dead_lettered"]
    assert [row["dead_letter_id"] for row in rows if row["kind"] == "dead_lettered"] == [1, 3]
    assert str(rows[1]["problem"]).startswith("bad crc")


def test_write_ahead_log_records_are_not_dead_letter_events() -> None:
    data = segment_header(1) + encode(Published(1, "/", ("q",), "", "k", 1.0, b"", b"x"))
    (row,) = events(data)
    assert row["kind"] == "corrupt"
    assert "Published" in str(row["problem"])


def test_batches_are_bounded_and_keep_every_row() -> None:
    data = segment(1, [dead_lettered(n) for n in range(1, 11)])
    batches = list(segment_batches(data, 1, batch_rows=4))
    assert [batch.num_rows for batch in batches] == [4, 4, 2]
    assert all(batch.schema == ARROW_SCHEMA for batch in batches)


def test_segment_files_are_listed_in_order_and_other_files_ignored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name in ("00000000000000000010.wal", "00000000000000000002.wal", "notes.txt", "2.wal"):
        (tmp_path / name).write_bytes(b"")
    assert [number for number, _path in list_segments(str(tmp_path))] == [2, 10]
    assert list_segments(str(tmp_path / "missing")) == []


@pytest.mark.spark
def test_the_arrow_and_spark_schemas_agree(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.pandas.types import from_arrow_schema

    from postroom.spark.schema import spark_schema

    assert from_arrow_schema(ARROW_SCHEMA).simpleString() == spark_schema().simpleString()

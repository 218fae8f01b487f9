"""The analysis over small event frames, and the raw-segment Data Source that feeds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from postroom.spark.events import segment_batches  # noqa: E402
from postroom.spark.schema import ARROW_SCHEMA  # noqa: E402
from postroom.spark.transforms import analyze, dead_letters, redrive_list  # noqa: E402
from tests.spark.records import dead_lettered, segment, settled, write_segment  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture
def frame(spark: Any, tmp_path: Path) -> Any:
    """Make the events of segments (numbered 1, 2, ...) a DataFrame, through Parquet as an export would."""
    import pyarrow.parquet as pq

    from postroom.spark.schema import spark_schema

    made = iter(range(1_000_000))

    def make(*segments: bytes) -> Any:
        batches = [batch for number, data in enumerate(segments, 1) for batch in segment_batches(data, number)]
        path = tmp_path / f"events-{next(made)}.parquet"
        pq.write_table(pa.Table.from_batches(batches, schema=ARROW_SCHEMA), path)
        return spark.read.schema(spark_schema()).parquet(str(path))

    return make


def read_raw(spark: Any, directory: Path, exclude: str = "") -> Any:
    from postroom.spark.source import FORMAT, register

    register(spark)
    return spark.read.format(FORMAT).option("path", str(directory)).option("exclude", exclude).load()


def test_a_dead_letter_is_pending_until_settled_in_that_queue(frame: Any) -> None:
    events = frame(
        segment(1, [dead_lettered(1), dead_lettered(2), dead_lettered(3, dlqs=("dlq", "audit"))]),
        segment(2, [settled(1), settled(3, queue="audit"), settled(99)]),
    )
    rows = {(r["dead_letter_id"], r["dead_letter_queue"]): r["pending"] for r in dead_letters(events).collect()}
    assert rows == {(1, "dlq"): False, (2, "dlq"): True, (3, "dlq"): True, (3, "audit"): False}


def test_summary_counts_by_reason_queue_and_dead_letter_queue(frame: Any) -> None:
    events = frame(
        segment(
            1,
            [
                dead_lettered(1, queue="a", reason="rejected", headers={"tenant": "acme"}),
                dead_lettered(2, queue="a", reason="expired", headers={"tenant": "acme"}, time=1_795_000_120.0),
                dead_lettered(3, queue="b", reason="delivery_limit", dlqs=("dlq.b",), delivery_count=5),
                settled(1),
            ],
        )
        + b"\x00\x00\x00",  # a torn tail
    )
    summary = analyze(events)
    figures = summary.as_json()
    contract = ("total", "pending", "by_reason", "by_queue", "by_dlq", "corrupt_records")
    assert {key: figures[key] for key in contract} == {
        "total": 3,
        "pending": 2,
        "by_reason": {"delivery_limit": 1, "expired": 1, "rejected": 1},
        "by_queue": {"a": 2, "b": 1},
        "by_dlq": {"dlq": 2, "dlq.b": 1},
        "corrupt_records": 1,
    }
    assert summary.delivery_counts == [(0, 2), (5, 1)]
    assert summary.top_headers[0] == ("tenant", "acme", 2)
    assert summary.per_minute == [  # 1_795_000_000 is 2026-11-18T11:06:40Z
        ("2026-11-18T11:06", "delivery_limit", 1),
        ("2026-11-18T11:06", "rejected", 1),
        ("2026-11-18T11:08", "expired", 1),
    ]
    assert (summary.first_death, summary.last_death) == ("2026-11-18T11:06:40", "2026-11-18T11:08:40")
    assert summary.by_queue_reason == [("a", "expired", 1), ("a", "rejected", 1), ("b", "delivery_limit", 1)]


def test_an_empty_input_gives_zeros(frame: Any) -> None:
    summary = analyze(frame())
    assert (summary.total, summary.pending, summary.by_reason, summary.corrupt_records) == (0, 0, {}, 0)


def test_redrive_list_takes_pending_dead_letters_matching_the_filter(frame: Any) -> None:
    events = frame(
        segment(
            1,
            [
                dead_lettered(1, reason="rejected", headers={"tenant": "acme"}),
                dead_lettered(2, reason="rejected", headers={"tenant": "other"}),
                dead_lettered(3, reason="expired", headers={"tenant": "acme"}),
                dead_lettered(4, reason="rejected", headers={"tenant": "acme"}),
                settled(4),
            ],
        ),
    )
    chosen = redrive_list(dead_letters(events), "reason = 'rejected' AND headers['tenant'] = 'acme'")
    assert [row["dead_letter_id"] for row in chosen.collect()] == [1]


def test_a_bad_redrive_filter_is_an_analysis_error(frame: Any) -> None:
    from pyspark.errors import AnalysisException, ParseException

    rows = dead_letters(frame(segment(1, [dead_lettered(1)])))
    with pytest.raises((AnalysisException, ParseException)):
        redrive_list(rows, "no_such_column = 1").collect()


def test_the_data_source_reads_one_partition_per_segment(spark: Any, tmp_path: Path) -> None:
    for number in (1, 2, 3):
        write_segment(tmp_path, number, segment(number, [dead_lettered(number * 10 + i) for i in range(4)]))
    events = read_raw(spark, tmp_path)
    assert events.rdd.getNumPartitions() == 3
    ids = sorted(row["dead_letter_id"] for row in events.collect())
    assert ids == sorted(n * 10 + i for n in (1, 2, 3) for i in range(4))
    assert sorted({row["segment"] for row in read_raw(spark, tmp_path, exclude="1,3").collect()}) == [2]


def test_the_data_source_counts_damage_and_agrees_with_the_plain_decoder(
    spark: Any, frame: Any, tmp_path: Path
) -> None:
    good = segment(1, [dead_lettered(1), settled(1)])
    flipped = bytearray(segment(2, [dead_lettered(2), dead_lettered(3)]))
    flipped[40] ^= 0xFF
    write_segment(tmp_path, 1, good)
    write_segment(tmp_path, 2, bytes(flipped))
    write_segment(tmp_path, 3, b"")  # created, never written: counted, not fatal
    write_segment(tmp_path, 4, segment(4, [dead_lettered(4)])[:-3])
    raw = read_raw(spark, tmp_path)
    plain = frame(good, bytes(flipped), b"", segment(4, [dead_lettered(4)])[:-3])
    columns = ["kind", "dead_letter_id", "segment", "offset", "problem"]
    assert sorted(map(tuple, raw.select(*columns).collect()), key=str) == sorted(
        map(tuple, plain.select(*columns).collect()), key=str
    )
    kinds = sorted((row["segment"], row["kind"]) for row in raw.collect())
    assert kinds == [
        (1, "dead_lettered"),
        (1, "settled"),
        (2, "corrupt"),
        (2, "dead_lettered"),
        (3, "corrupt"),
        (4, "corrupt"),
    ]


def test_an_empty_directory_reads_no_events(spark: Any, tmp_path: Path) -> None:
    assert read_raw(spark, tmp_path).count() == 0


def test_times_in_the_summary_are_utc_whatever_the_host_s_zone(frame: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    events = frame(segment(1, [dead_lettered(1, time=1_795_000_000.5)]))
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        summary = analyze(events)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (summary.first_death, summary.last_death) == ("2026-11-18T11:06:40", "2026-11-18T11:06:40.500000")
    assert [minute for minute, _reason, _n in summary.per_minute] == ["2026-11-18T11:06"]


def test_exported_segments_are_known_by_file_name_else_by_column(spark: Any, frame: Any, tmp_path: Path) -> None:
    from postroom.spark.export import export
    from postroom.spark.job import _exported_segments
    from postroom.spark.schema import spark_schema

    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    for number in (4, 9):
        write_segment(source, number, segment(number, [dead_lettered(number)]))
    export(str(source), str(out), include_last=True)
    exported = spark.read.schema(spark_schema()).parquet(str(out))
    assert _exported_segments(exported) == {4, 9}
    other = frame(segment(1, [dead_lettered(6)]), segment(2, [dead_lettered(7)]))  # files not named by the export
    assert _exported_segments(other) == {1, 2}

"""``postroom dlq export``: sealed segments to Parquet, one file per segment and date, idempotent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from postroom.spark.export import MANIFEST_DIR, ExpireReport, expire, export, exported_segments  # noqa: E402
from tests.spark.records import dead_lettered, segment, settled, write_segment  # noqa: E402

DAY = 86400.0
MIDNIGHT = 1_795_046_400.0  # 2026-11-19T00:00:00Z


def files(out: Path) -> list[str]:
    return sorted(str(path.relative_to(out)) for path in out.rglob("*.parquet"))


def test_sealed_segments_become_one_zstd_file_per_date(tmp_path: Path) -> None:
    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    write_segment(
        source, 1, segment(1, [dead_lettered(1, time=MIDNIGHT - 1), dead_lettered(2, time=MIDNIGHT + 1), settled(1)])
    )
    write_segment(source, 2, segment(2, [dead_lettered(3, time=MIDNIGHT + DAY)]))
    write_segment(source, 3, segment(3, [dead_lettered(4)]))  # the last one: maybe still active
    report = export(str(source), str(out))
    assert report.exported == (1, 2)
    assert report.rows == 4
    assert files(out) == [
        "date=2026-11-18/segment-00000000000000000001.parquet",
        "date=2026-11-19/segment-00000000000000000001.parquet",
        "date=2026-11-20/segment-00000000000000000002.parquet",
    ]
    metadata = pq.ParquetFile(out / files(out)[0]).metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    assert "date" not in pq.read_schema(out / files(out)[0]).names  # it is the partition directory
    manifest = json.loads((out / MANIFEST_DIR / "00000000000000000001.json").read_text())
    assert manifest["rows"] == 3


def test_running_it_again_exports_nothing_new(tmp_path: Path) -> None:
    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    for number in (1, 2):
        write_segment(source, number, segment(number, [dead_lettered(number)]))
    export(str(source), str(out))
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
    again = export(str(source), str(out))
    assert (again.exported, again.skipped) == ((), (1,))
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before
    assert export(str(source), str(out), include_last=True).exported == (2,)
    assert exported_segments(str(out)) == {1, 2}


def test_a_run_cut_short_before_the_manifest_is_redone(tmp_path: Path) -> None:
    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    write_segment(source, 1, segment(1, [dead_lettered(1)]))
    export(str(source), str(out), include_last=True)
    (out / MANIFEST_DIR / "00000000000000000001.json").unlink()
    (out / files(out)[0]).write_bytes(b"half a file")
    assert export(str(source), str(out), include_last=True).exported == (1,)
    assert pq.read_table(out / files(out)[0]).num_rows == 1


def test_corrupt_records_are_exported_and_counted(tmp_path: Path) -> None:
    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    write_segment(source, 1, segment(1, [dead_lettered(1), dead_lettered(2)])[:-4])
    write_segment(source, 2, b"")
    report = export(str(source), str(out), include_last=True)
    assert (report.rows, report.corrupt_records) == (3, 2)
    assert "date=unknown/segment-00000000000000000002.parquet" in files(out)


def test_a_missing_stream_directory_exports_nothing(tmp_path: Path) -> None:
    report = export(str(tmp_path / "missing"), str(tmp_path / "parquet"))
    assert (report.exported, report.rows) == ((), 0)


def test_the_command_exports_the_data_directory_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from postroom.broker.tools.cli import main

    data = tmp_path / "data"
    write_segment(data / "deadletters", 1, segment(1, [dead_lettered(1), settled(1)]))
    write_segment(data / "deadletters", 2, segment(2, [dead_lettered(2)]))
    assert main(["dlq", "export", "--data-dir", str(data)]) == 0
    assert "exported 1 segment(s) (2 event(s), 0 corrupt, 1 file(s)); 0 already exported" in capsys.readouterr().out
    assert exported_segments(str(data / "deadletters-parquet")) == {1}


def test_a_file_left_half_written_is_hidden_from_readers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    write_segment(source, 1, segment(1, [dead_lettered(1)]))

    def crash(_source: str, _target: str) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        export(str(source), str(out), include_last=True)
    monkeypatch.undo()
    (partial,) = out.rglob("*.partial")
    assert partial.name.startswith("_")
    assert export(str(source), str(out), include_last=True).exported == (1,)


def test_worker_processes_export_the_same_files_as_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import postroom.spark.export
    pools: list[int] = []

    class Recorded(postroom.spark.export.ProcessPoolExecutor):  # type: ignore[misc]
        def __init__(self, max_workers: int, **options: object) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(postroom.spark.export, "ProcessPoolExecutor", Recorded)
    source = tmp_path / "deadletters"
    for number in range(1, 6):
        records = [dead_lettered(number * 10 + n, time=MIDNIGHT + number * DAY / 2) for n in range(3)]
        write_segment(source, number, segment(number, records))
    one, two = tmp_path / "one", tmp_path / "two"
    seen: list[int] = []
    serial = export(str(source), str(one), include_last=True)
    parallel = export(str(source), str(two), include_last=True, jobs=2, on_segment=lambda n, _rows: seen.append(n))
    assert parallel == serial and parallel.exported == (1, 2, 3, 4, 5) and sorted(seen) == [1, 2, 3, 4, 5]
    assert pools == [2]  # the serial run started no pool
    assert files(two) == files(one)
    for name in files(one):
        assert pq.read_table(two / name).equals(pq.read_table(one / name))


def test_exported_segment_files_are_deleted_when_asked_but_never_the_newest(tmp_path: Path) -> None:
    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    for number in (1, 2, 3):
        write_segment(source, number, segment(number, [dead_lettered(number)]))
    export(str(source), str(out), delete_exported=True)
    assert sorted(p.name for p in source.iterdir()) == ["00000000000000000003.wal"]  # not exported yet
    report = export(str(source), str(out), include_last=True, delete_exported=True)
    assert report.exported == (3,)
    assert sorted(p.name for p in source.iterdir()) == ["00000000000000000003.wal"]  # the broker numbers after it
    assert exported_segments(str(out)) == {1, 2, 3}


def test_expiry_deletes_old_days_then_segments_with_nothing_left(tmp_path: Path) -> None:
    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    write_segment(source, 1, segment(1, [dead_lettered(1, time=MIDNIGHT - DAY)]))  # 2026-11-18 only
    write_segment(source, 2, segment(2, [dead_lettered(2, time=MIDNIGHT - 1), dead_lettered(3, time=MIDNIGHT)]))
    write_segment(source, 3, segment(3, [dead_lettered(4, time=MIDNIGHT - DAY)]))  # old too, but the newest
    export(str(source), str(out), include_last=True)
    report = expire(str(source), str(out), "2026-11-19")
    assert report.dates == ("2026-11-18",) and report.segments == (1,)
    assert files(out) == ["date=2026-11-19/segment-00000000000000000002.parquet"]
    assert sorted(p.name for p in source.iterdir()) == ["00000000000000000002.wal", "00000000000000000003.wal"]
    assert exported_segments(str(out)) == {2, 3}  # 2 keeps a day; 3 stays exported, so never read raw
    assert export(str(source), str(out), include_last=True).exported == ()
    assert expire(str(source), str(out), "2026-11-19") == ExpireReport((), ())
    (out / MANIFEST_DIR / "00000000000000000007.json").write_text("{not json")
    assert expire(str(source), str(out), "2026-11-20").segments == (2,)  # the stray file is left alone
    assert (out / MANIFEST_DIR / "00000000000000000007.json").exists()


def test_the_command_takes_jobs_deletion_and_retention(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from postroom.broker.tools.cli import main

    data, now = tmp_path / "data", time.time()  # --retention counts back from now
    write_segment(data / "deadletters", 1, segment(1, [dead_lettered(1, time=now - 400 * DAY)]))
    write_segment(data / "deadletters", 2, segment(2, [dead_lettered(2, time=now)]))
    write_segment(data / "deadletters", 3, segment(3, [dead_lettered(3, time=now)]))
    argv = ["dlq", "export", "--data-dir", str(data), "--jobs", "2", "--delete-exported", "--retention", "365d"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exported 2 segment(s)" in out and "expired 1 day(s) before" in out
    assert sorted(p.name for p in (data / "deadletters").iterdir()) == ["00000000000000000003.wal"]
    assert exported_segments(str(data / "deadletters-parquet")) == {2}
    with pytest.raises(SystemExit):
        main(["dlq", "export", "--data-dir", str(data), "--retention", "365"])
    assert "--retention: must be a duration with a unit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dlq", "export", "--data-dir", str(data), "--jobs", "0"])
    assert "--jobs: must be a whole number of at least 1, not '0'" in capsys.readouterr().err


def test_expiry_takes_the_files_of_undated_damaged_segments_by_the_day_they_were_written(tmp_path: Path) -> None:
    import os

    source, out = tmp_path / "deadletters", tmp_path / "parquet"
    write_segment(source, 1, b"")  # no event at all: one corrupt row, date unknown
    write_segment(source, 2, b"")
    write_segment(source, 3, segment(3, [dead_lettered(3)]))
    export(str(source), str(out), include_last=True)
    old = out / "date=unknown" / "segment-00000000000000000001.parquet"
    os.utime(old, (MIDNIGHT - DAY, MIDNIGHT - DAY))  # written 2026-11-18
    report = expire(str(source), str(out), "2026-11-18")
    assert report.segments == () and old.exists()
    report = expire(str(source), str(out), "2026-11-19")
    assert report.segments == (1,) and not old.exists()
    assert (out / "date=unknown" / "segment-00000000000000000002.parquet").exists()  # written today

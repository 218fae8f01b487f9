"""``postroom dlq export``: sealed dead-letter segments to Parquet, one file per segment and date.

Runs as a plain process (pyarrow, no JVM, no reactor): from cron or a systemd timer beside a
running broker. Each sealed segment (every one but the last, which may be active; all of
them with ``include_last`` when the broker is stopped) becomes
``OUT/date=YYYY-MM-DD/segment-<number:020d>.parquet`` (zstd), one file per date its events
fall on, then a manifest ``OUT/_segments/<number:020d>.json`` written last. A segment with a
manifest is skipped, so running it again does nothing; a crash before the manifest leaves
files that the next run overwrites (each is written to a temporary name and renamed).

The Spark job reads the Parquet natively and the segments without a manifest raw.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark.events import list_segments, segment_batches
from spark.schema import ARROW_SCHEMA

__all__ = ["MANIFEST_DIR", "ExportReport", "export", "exported_segments"]

#: Where the per-segment manifests live under the output directory.
MANIFEST_DIR = "_segments"

#: zstd level 3 (Parquet's default for zstd): about gzip's ratio at several times its speed.
COMPRESSION = "zstd"


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What one export run did."""

    exported: tuple[int, ...]
    skipped: tuple[int, ...]
    rows: int
    corrupt_records: int
    files: int


def exported_segments(out: str) -> set[int]:
    """The segment numbers that have a manifest under ``out`` (a local directory)."""
    try:
        names = os.listdir(os.path.join(out, MANIFEST_DIR))
    except FileNotFoundError:
        return set()
    return {int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()}


def _write_atomically(path: str, write: Callable[[str], None]) -> None:
    # Spark and pyarrow skip files whose names start with "_" or ".": a partial file left by
    # a crash is never read as data (and the next run replaces it).
    partial = os.path.join(os.path.dirname(path), f"_{os.path.basename(path)}.partial")
    write(partial)
    with open(partial, "rb") as file:
        os.fsync(file.fileno())
    os.replace(partial, path)


def export(
    segments_dir: str,
    out: str,
    include_last: bool = False,
    on_segment: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Export every sealed segment of ``segments_dir`` that ``out`` does not have yet.

    :param segments_dir: the stream directory (``<storage.dir>/deadletters``)
    :param out: the Parquet dataset directory
    :param include_last: export the last segment too (only when the broker is stopped: a
        running broker is still appending to it)
    :param on_segment: called with ``(segment, rows)`` after each segment (progress)
    :raises OSError: reading a segment or writing the output failed
    """
    segments = list_segments(segments_dir)
    sealed = segments if include_last else segments[:-1]
    done = exported_segments(out)
    os.makedirs(os.path.join(out, MANIFEST_DIR), exist_ok=True)
    exported, skipped = [], []
    rows = corrupt = files = 0
    for number, path in sealed:
        if number in done:
            skipped.append(number)
            continue
        with open(path, "rb") as file:
            data = file.read()
        table = pa.Table.from_batches(list(segment_batches(data, number)), schema=ARROW_SCHEMA)
        written = []
        dates = sorted(set(table.column("date").to_pylist())) if table.num_rows else []
        for date in dates:
            part = table.filter(pc.equal(table.column("date"), date)).drop_columns(["date"])
            directory = os.path.join(out, f"date={date}")
            os.makedirs(directory, exist_ok=True)
            name = os.path.join(directory, f"segment-{number:020d}.parquet")
            _write_atomically(name, lambda target, part=part: pq.write_table(part, target, compression=COMPRESSION))
            written.append({"file": os.path.relpath(name, out), "rows": part.num_rows})
        count = table.num_rows
        bad = int(pc.sum(pc.equal(table.column("kind"), "corrupt")).as_py() or 0) if count else 0
        manifest = os.path.join(out, MANIFEST_DIR, f"{number:020d}.json")
        record = {"segment": number, "rows": count, "corrupt_records": bad, "files": written}

        def write_manifest(target: str, record: dict[str, object] = record) -> None:
            with open(target, "w") as file:
                json.dump(record, file)

        _write_atomically(manifest, write_manifest)
        exported.append(number)
        rows += count
        corrupt += bad
        files += len(written)
        if on_segment is not None:
            on_segment(number, count)
    return ExportReport(tuple(exported), tuple(skipped), rows, corrupt, files)

"""``postroom dlq export``: sealed dead-letter segments to Parquet, one file per segment and date.

Runs as a plain process (pyarrow, no JVM, no reactor): from cron or a systemd timer beside a
running broker. Each sealed segment (every one but the last, which may be active; all of
them with ``include_last`` when the broker is stopped) becomes
``OUT/date=YYYY-MM-DD/segment-<number:020d>.parquet`` (zstd), one file per date its events
fall on, then a manifest ``OUT/_segments/<number:020d>.json`` written last. A segment with a
manifest is skipped, so running it again does nothing; a crash before the manifest leaves
files that the next run overwrites (each is written to a temporary name and renamed).

Segments are independent, so ``jobs`` worker processes export several at once (the decoder
is pure Python: one core each). :func:`expire` is the retention: it deletes the date
partitions older than a cutoff, then the exported segment files all of whose Parquet is gone,
so that nothing expired comes back through the raw path.

The Spark job reads the Parquet natively and the segments without a manifest raw.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from postroom.spark.events import list_segments, segment_batches
from postroom.spark.schema import ARROW_SCHEMA
from postroom.spark.streams import Selection, stream_segment_batches

__all__ = [
    "FILE_NAME",
    "FILE_PATTERN",
    "MANIFEST_DIR",
    "ExportReport",
    "ExpireReport",
    "expire",
    "export",
    "exported_segments",
]

#: Where the per-segment manifests live under the output directory.
MANIFEST_DIR = "_segments"

#: The name of an exported file (one per segment in each ``date=`` directory), and its pattern.
FILE_NAME = "segment-{:020d}.parquet"
FILE_PATTERN = re.compile(r"segment-(\d{20})\.parquet$")

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


def _export_segment(number: int, path: str, out: str, stream: Selection | None = None) -> tuple[int, int, int, int]:
    """Export one segment (in a worker process, or inline); returns ``(segment, rows, corrupt,
    files)``. Its manifest is written last."""
    with open(path, "rb") as file:
        data = file.read()
    batches = segment_batches(data, number) if stream is None else stream_segment_batches(data, number, stream)
    table = pa.Table.from_batches(list(batches), schema=ARROW_SCHEMA)
    del data
    written = []
    dates = pc.unique(table.column("date")).to_pylist() if table.num_rows else []
    for date in sorted(dates):
        part = table if len(dates) == 1 else table.filter(pc.equal(table.column("date"), date))
        part = part.drop_columns(["date"])
        directory = os.path.join(out, f"date={date}")
        os.makedirs(directory, exist_ok=True)
        name = os.path.join(directory, FILE_NAME.format(number))
        _write_atomically(name, lambda target, part=part: pq.write_table(part, target, compression=COMPRESSION))
        written.append({"file": os.path.relpath(name, out), "rows": part.num_rows})
    count = table.num_rows
    bad = int(pc.sum(pc.equal(table.column("kind"), "corrupt")).as_py() or 0) if count else 0
    record = {"segment": number, "rows": count, "corrupt_records": bad, "files": written}

    def write_manifest(target: str) -> None:
        with open(target, "w") as file:
            json.dump(record, file)

    _write_atomically(os.path.join(out, MANIFEST_DIR, f"{number:020d}.json"), write_manifest)
    return number, count, bad, len(written)


def export(
    segments_dir: str,
    out: str,
    include_last: bool = False,
    on_segment: Callable[[int, int], None] | None = None,
    jobs: int = 1,
    delete_exported: bool = False,
    stream: Selection | None = None,
) -> ExportReport:
    """Export every sealed segment of ``segments_dir`` that ``out`` does not have yet.

    :param segments_dir: the stream directory (``<storage.dir>/deadletters``), or with
        ``stream`` that stream's directory
    :param stream: read a stream's segments (``spark.streams``), the messages it selects;
        then nothing is deleted (``delete_exported`` is for the event stream: the broker's
        retention removes a stream's segments)
    :param out: the Parquet dataset directory
    :param include_last: export the last segment too (only when the broker is stopped: a
        running broker is still appending to it)
    :param on_segment: called with ``(segment, rows)`` after each segment (progress), in the
        order they finish
    :param jobs: worker processes (1: this process exports them one after another)
    :param delete_exported: then delete the sealed segment files that have a manifest (their
        events are all in ``out``)
    :raises OSError: reading a segment or writing the output failed (the segments exported
        before that keep their manifests)
    """
    segments = list_segments(segments_dir)
    sealed = segments if include_last else segments[:-1]
    done = exported_segments(out)
    os.makedirs(os.path.join(out, MANIFEST_DIR), exist_ok=True)
    todo = [(number, path) for number, path in sealed if number not in done]
    skipped = tuple(number for number, _path in sealed if number in done)
    results = []

    def finished(result: tuple[int, int, int, int]) -> None:
        results.append(result)
        if on_segment is not None:
            on_segment(result[0], result[1])

    if jobs > 1 and len(todo) > 1:
        # spawn: the caller may have threads (a reactor's pool), which fork would copy mid-flight.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context) as pool:
            futures = [pool.submit(_export_segment, number, path, out, stream) for number, path in todo]
            for future in as_completed(futures):
                finished(future.result())
    else:
        for number, path in todo:
            finished(_export_segment(number, path, out, stream))
    if delete_exported and stream is None:
        have = exported_segments(out)
        for number, path in segments[:-1]:  # the newest stays, as in expire()
            if number in have:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    results.sort()
    return ExportReport(
        tuple(number for number, *_ in results),
        skipped,
        sum(rows for _n, rows, _bad, _files in results),
        sum(bad for _n, _rows, bad, _files in results),
        sum(files for _n, _rows, _bad, files in results),
    )


def _written_on(path: str) -> str:
    """The UTC day (``YYYY-MM-DD``) a file was last written."""
    return datetime.fromtimestamp(os.stat(path).st_mtime, timezone.utc).strftime("%Y-%m-%d")


@dataclass(frozen=True, slots=True)
class ExpireReport:
    """What one :func:`expire` run deleted."""

    dates: tuple[str, ...]
    segments: tuple[int, ...]


def expire(segments_dir: str, out: str, before: str) -> ExpireReport:
    """Delete the exported events of days before ``before`` (``YYYY-MM-DD``, UTC).

    Removes each ``date=...`` partition older than that (and, in ``date=unknown``, the files
    of damaged segments written before that day); then, for every manifest none of
    whose files remain, the segment file (if the broker has not pruned it already) and the
    manifest, in that order, so that an expired segment is never exported or read raw again.
    A segment partly in kept days keeps its segment file and manifest.

    :raises OSError: a deletion failed
    """
    import shutil

    dates = []
    try:
        names = sorted(os.listdir(out))
    except FileNotFoundError:
        return ExpireReport((), ())
    for name in names:
        if name.startswith("date=") and name[5:] < before and os.path.isdir(os.path.join(out, name)):
            shutil.rmtree(os.path.join(out, name))
            dates.append(name[5:])
    # Segments with no readable event (only damage) have no date: their files go by the day
    # they were written.
    unknown = os.path.join(out, "date=unknown")
    for name in sorted(os.listdir(unknown)) if os.path.isdir(unknown) else []:
        path = os.path.join(unknown, name)
        if _written_on(path) < before:
            os.unlink(path)
    gone = []
    found = list_segments(segments_dir)
    # The newest segment file is never deleted: the broker numbers its next segment (and its
    # dead-letter ids) after the last one it finds.
    paths = dict(found)
    newest = found[-1][0] if found else None
    for number in sorted(exported_segments(out)):
        manifest = os.path.join(out, MANIFEST_DIR, f"{number:020d}.json")
        try:
            with open(manifest) as file:
                files = [entry["file"] for entry in json.load(file)["files"]]
        except (ValueError, KeyError, TypeError):  # not a manifest of ours: leave it and its segment
            continue
        if number == newest or any(os.path.exists(os.path.join(out, name)) for name in files):
            continue
        if number in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths[number])
        os.unlink(manifest)
        gone.append(number)
    return ExpireReport(tuple(dates), tuple(gone))

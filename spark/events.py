"""Decoding dead-letter segments into event rows, with the broker's own record decoder.

Shared by ``postroom dlq export`` (pyarrow, no JVM), the Python Data Source of the Spark job
and the benchmark's single-process baseline, so all three read segments the same way:
:func:`segment_events` walks a segment with :func:`broker.wal.record.scan`, reads past damage
(resynchronising as ``docs/wal-format.md`` describes) and turns each damaged span, torn tail or
bad header into one ``corrupt`` event instead of raising. Records of other types (a write-ahead
log segment given by mistake) are counted as ``corrupt`` too, with the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from broker.wal.record import (
    SEGMENT_HEADER_BYTES,
    DeadLettered,
    DeadLetterSettled,
    WALCorruption,
    parse_segment_header,
    scan,
)
from spark.schema import ARROW_SCHEMA

__all__ = ["BATCH_ROWS", "SEGMENT_NAME", "list_segments", "segment_batches", "segment_events", "segment_number"]

#: Rows per Arrow batch: big enough that per-batch overhead vanishes, small enough that a
#: batch of 1 KiB previews stays around 4 MiB on an executor.
BATCH_ROWS = 4096

#: A segment's file name, as the broker writes them (``broker/wal/files.py``).
SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")

_COLUMNS = [field.name for field in ARROW_SCHEMA]
_UTC = timezone.utc
_EPOCH_DAY_CACHE: dict[int, str] = {}


def _micros(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def _date(seconds: float) -> str:
    day = int(seconds // 86400)
    text = _EPOCH_DAY_CACHE.get(day)
    if text is None:
        text = _EPOCH_DAY_CACHE[day] = datetime.fromtimestamp(day * 86400, _UTC).strftime("%Y-%m-%d")
    return text


def segment_number(path: str) -> int | None:
    """The segment number in a segment file's name, or None when it is not a segment file."""
    match = SEGMENT_NAME.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def list_segments(directory: str) -> list[tuple[int, str]]:
    """``(number, path)`` of the segment files in ``directory``, ascending; [] if it is missing."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(segment_number(name), os.path.join(directory, name)) for name in names]
    return sorted((number, path) for number, path in found if number is not None)


def _corrupt(segment: int, offset: int, problem: str) -> dict[str, Any]:
    return {"kind": "corrupt", "segment": segment, "offset": offset, "problem": problem}


def segment_events(data: bytes, segment: int) -> Iterator[dict[str, Any]]:
    """One event dict per record (and per damaged span) of a dead-letter segment file.

    Never raises for bad data: a bad header gives one ``corrupt`` event and nothing else; a
    damaged span one ``corrupt`` event, then reading resumes at the next valid record; a torn
    tail (no valid record after the damage) one ``corrupt`` event. Keys are column names of
    :data:`spark.schema.ARROW_SCHEMA` except ``date``; times are epoch microseconds.

    :param data: the whole segment file
    :param segment: its number (from its name), for the ``segment`` column
    """
    try:
        found = parse_segment_header(data)
    except WALCorruption as err:
        yield _corrupt(segment, 0, f"bad segment header: {err.reason}")
        return
    if found != segment:
        yield _corrupt(segment, 0, f"bad segment header: it says segment {found}")
        return
    pos = SEGMENT_HEADER_BYTES
    while pos < len(data):
        result = scan(data, pos)
        for offset, _end, record in result.records:
            if type(record) is DeadLettered:
                yield {
                    "kind": "dead_lettered",
                    "dead_letter_id": record.dead_letter_id,
                    "vhost": record.vhost,
                    "queue": record.queue,
                    "time": record.time,
                    "reason": record.reason,
                    "delivery_count": record.delivery_count,
                    "exchange": record.exchange,
                    "routing_keys": record.routing_keys,
                    "dead_letter_exchange": record.dead_letter_exchange,
                    "dead_letter_queues": record.dead_letter_queues,
                    "message_id": record.message_id or None,
                    # The writer keeps these tuples the same length; a record that does not is
                    # read as far as they pair up rather than dropped.
                    "headers": list(zip(record.header_names, record.header_values, strict=False)),
                    "deaths": [
                        {"queue": q, "reason": r, "exchange": e, "count": c, "time": t * 1_000_000}
                        for q, r, e, c, t in zip(
                            record.death_queues,
                            record.death_reasons,
                            record.death_exchanges,
                            record.death_counts,
                            record.death_times,
                            strict=False,
                        )
                    ],
                    "body_size": record.body_size,
                    "body_preview": record.body_preview,
                    "segment": segment,
                    "offset": offset,
                }
            elif type(record) is DeadLetterSettled:
                yield {
                    "kind": "settled",
                    "dead_letter_id": record.dead_letter_id,
                    "vhost": record.vhost,
                    "queue": record.queue,
                    "time": record.time,
                    "segment": segment,
                    "offset": offset,
                }
            else:
                yield _corrupt(segment, offset, f"not a dead-letter event: {type(record).__name__}")
        if result.problem is None:
            return
        if result.resync is None:
            yield _corrupt(segment, result.end, f"{result.problem}; no valid record follows (torn tail)")
            return
        yield _corrupt(segment, result.end, f"{result.problem}; skipped {result.resync - result.end} bytes")
        pos = result.resync


def _signed(value: int | None) -> int | None:
    # Ids and counts are u64 on disk and BIGINT in Spark; only garbage is >= 2**63.
    if value is None or value < 1 << 63:
        return value
    return value - (1 << 64)


def _batch(rows: list[dict[str, Any]], default_date: str) -> pa.RecordBatch:
    columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    for row in rows:
        seconds = row.get("time")
        for name in _COLUMNS:
            columns[name].append(row.get(name))
        if seconds is not None:
            columns["time"][-1] = _micros(seconds)
            columns["date"][-1] = _date(seconds)
        else:
            columns["date"][-1] = default_date
    columns["dead_letter_id"] = [_signed(v) for v in columns["dead_letter_id"]]
    columns["delivery_count"] = [_signed(v) for v in columns["delivery_count"]]
    columns["body_size"] = [_signed(v) for v in columns["body_size"]]
    arrays = [pa.array(columns[field.name], type=field.type) for field in ARROW_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def segment_batches(data: bytes, segment: int, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The events of a segment file as Arrow record batches of :data:`ARROW_SCHEMA`.

    ``corrupt`` events have no time; their ``date`` is that of the segment's first event, or
    ``unknown`` for a segment with none.
    """
    rows: list[dict[str, Any]] = []
    default_date = "unknown"
    for event in segment_events(data, segment):
        if default_date == "unknown" and event.get("time") is not None:
            default_date = _date(event["time"])
        rows.append(event)
        if len(rows) >= batch_rows:
            yield _batch(rows, default_date)
            rows = []
    if rows:
        yield _batch(rows, default_date)

"""Decoding dead-letter segments into event rows, with the broker's own record decoder.

Shared by ``postroom dlq export`` (pyarrow, no JVM), the Python Data Source of the Spark job
and the benchmark's single-process baseline, so all three read segments the same way:
:func:`segment_records` walks a segment with :func:`broker.wal.segments.scan`, reads past damage
(resynchronising as ``docs/wal-format.md`` describes) and turns each damaged span, torn tail or
bad header into one ``corrupt`` row instead of raising. Records of other types (a write-ahead
log segment given by mistake) are counted as ``corrupt`` too, with the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime, timezone

import pyarrow as pa

from postroom.broker.wal.records import DeadLettered, DeadLetterSettled, WALCorruption
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, parse_segment_header, scan
from postroom.spark.schema import ARROW_SCHEMA

__all__ = [
    "BATCH_ROWS",
    "walk_segment",
    "SEGMENT_NAME",
    "list_segments",
    "segment_batches",
    "segment_file_batches",
    "segment_number",
    "segment_records",
]

#: Rows per Arrow batch: big enough that per-batch overhead vanishes, small enough that a
#: batch of 1 KiB previews stays around 4 MiB on an executor.
BATCH_ROWS = 4096

#: A segment's file name, as the broker writes them (``broker/wal/files.py``).
SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")

_UTC = timezone.utc
_EPOCH_DAY_CACHE: dict[int, str] = {}


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


def walk_segment(data: bytes, segment: int) -> Iterator[tuple[int, object]]:
    """``(offset, record)`` for each record of a segment file, ``(offset, problem)`` (a string)
    for each damaged span.

    Never raises for bad data: a bad header gives one problem and nothing else; a damaged span
    one problem, then reading resumes at the next valid record; a torn tail (no valid record
    after the damage) one problem.

    :param data: the whole segment file
    :param segment: its number (from its name)
    """
    try:
        found = parse_segment_header(data)
    except WALCorruption as err:
        yield 0, f"bad segment header: {err.reason}"
        return
    if found != segment:
        yield 0, f"bad segment header: it says segment {found}"
        return
    pos = SEGMENT_HEADER_BYTES
    while pos < len(data):
        result = scan(data, pos)
        for offset, _end, record in result.records:
            yield offset, record
        if result.problem is None:
            return
        if result.resync is None:
            yield result.end, f"{result.problem}; no valid record follows (torn tail)"
            return
        yield result.end, f"{result.problem}; skipped {result.resync - result.end} bytes"
        pos = result.resync


def segment_records(data: bytes, segment: int) -> Iterator[tuple[int, DeadLettered | DeadLetterSettled | str]]:
    """``(offset, record)`` for each event of a dead-letter segment file, ``(offset, problem)``
    for each damaged span (:func:`walk_segment`), and for each record of another type."""
    for offset, record in walk_segment(data, segment):
        if type(record) is DeadLettered or type(record) is DeadLetterSettled or type(record) is str:
            yield offset, record  # type: ignore[misc]
        else:
            yield offset, f"not a dead-letter event: {type(record).__name__}"


def _signed(value: int) -> int:
    # Ids and counts are u64 on disk and BIGINT in Spark; only garbage is >= 2**63.
    return value if value < 1 << 63 else value - (1 << 64)


class _Columns:
    """Column lists of one batch, filled record by record (no per-row dicts: this is the
    per-event cost of the export and of the Data Source)."""

    def __init__(self) -> None:
        self.rows = 0
        self.kind: list[str] = []
        self.dead_letter_id: list[int | None] = []
        self.vhost: list[str | None] = []
        self.queue: list[str | None] = []
        self.time: list[int | None] = []
        self.reason: list[str | None] = []
        self.delivery_count: list[int | None] = []
        self.exchange: list[str | None] = []
        self.routing_keys: list[tuple[str, ...] | None] = []
        self.dead_letter_exchange: list[str | None] = []
        self.dead_letter_queues: list[tuple[str, ...] | None] = []
        self.message_id: list[str | None] = []
        self.body_size: list[int | None] = []
        self.body_preview: list[bytes | None] = []
        self.offset: list[int] = []
        self.problem: list[str | None] = []
        self.date: list[str] = []
        # headers (map) and deaths (list of structs) as flat children and offsets
        self.header_offsets = [0]
        self.header_valid: list[bool] = []
        self.header_keys: list[str] = []
        self.header_values: list[str] = []
        self.death_offsets = [0]
        self.death_valid: list[bool] = []
        self.death_queue: list[str] = []
        self.death_reason: list[str] = []
        self.death_exchange: list[str] = []
        self.death_count: list[int] = []
        self.death_time: list[int] = []

    def add(self, offset: int, record: DeadLettered | DeadLetterSettled | str) -> None:
        self.rows += 1
        self.offset.append(offset)
        if type(record) is DeadLettered:
            self.kind.append("dead_lettered")
            self.dead_letter_id.append(_signed(record.dead_letter_id))
            self.vhost.append(record.vhost)
            self.queue.append(record.queue)
            self.time.append(int(record.time * 1_000_000))
            self.reason.append(record.reason)
            self.delivery_count.append(_signed(record.delivery_count))
            self.exchange.append(record.exchange)
            self.routing_keys.append(record.routing_keys)
            self.dead_letter_exchange.append(record.dead_letter_exchange)
            self.dead_letter_queues.append(record.dead_letter_queues)
            self.message_id.append(record.message_id or None)
            self.body_size.append(_signed(record.body_size))
            self.body_preview.append(record.body_preview)
            self.problem.append(None)
            self.date.append(_date(record.time))
            # The writer keeps the paired tuples the same length; a record that does not is
            # read as far as they pair up rather than dropped.
            pairs = min(len(record.header_names), len(record.header_values))
            self.header_keys += record.header_names[:pairs]
            self.header_values += record.header_values[:pairs]
            self.header_offsets.append(len(self.header_keys))
            self.header_valid.append(True)
            deaths = min(
                len(record.death_queues),
                len(record.death_reasons),
                len(record.death_exchanges),
                len(record.death_counts),
                len(record.death_times),
            )
            self.death_queue += record.death_queues[:deaths]
            self.death_reason += record.death_reasons[:deaths]
            self.death_exchange += record.death_exchanges[:deaths]
            self.death_count += [_signed(c) for c in record.death_counts[:deaths]]
            self.death_time += [t * 1_000_000 for t in record.death_times[:deaths]]
            self.death_offsets.append(len(self.death_queue))
            self.death_valid.append(True)
            return
        if type(record) is DeadLetterSettled:
            self.kind.append("settled")
            self.dead_letter_id.append(_signed(record.dead_letter_id))
            self.vhost.append(record.vhost)
            self.queue.append(record.queue)
            self.time.append(int(record.time * 1_000_000))
            self.problem.append(None)
            self.date.append(_date(record.time))
        else:
            self.kind.append("corrupt")
            self.dead_letter_id.append(None)
            self.vhost.append(None)
            self.queue.append(None)
            self.time.append(None)
            self.problem.append(record)
            self.date.append("")  # filled in by batch(): the segment's date
        for column in (
            self.reason,
            self.delivery_count,
            self.exchange,
            self.routing_keys,
            self.dead_letter_exchange,
            self.dead_letter_queues,
            self.message_id,
            self.body_size,
            self.body_preview,
        ):
            column.append(None)
        self.header_offsets.append(len(self.header_keys))
        self.header_valid.append(False)
        self.death_offsets.append(len(self.death_queue))
        self.death_valid.append(False)

    def batch(self, segment: int, default_date: str) -> pa.RecordBatch:
        dates = [date or default_date for date in self.date]
        headers = pa.MapArray.from_arrays(
            pa.array(self.header_offsets, pa.int32()),
            pa.array(self.header_keys, pa.string()),
            pa.array(self.header_values, pa.string()),
            mask=pa.array([not valid for valid in self.header_valid]),
        )
        death = ARROW_SCHEMA.field("deaths").type.value_type
        deaths = pa.ListArray.from_arrays(
            pa.array(self.death_offsets, pa.int32()),
            pa.StructArray.from_arrays(
                [
                    pa.array(self.death_queue, pa.string()),
                    pa.array(self.death_reason, pa.string()),
                    pa.array(self.death_exchange, pa.string()),
                    pa.array(self.death_count, pa.int64()),
                    pa.array(self.death_time, death.field("time").type),
                ],
                fields=list(death),
            ),
            mask=pa.array([not valid for valid in self.death_valid]),
        )
        columns = {
            "kind": self.kind,
            "dead_letter_id": self.dead_letter_id,
            "vhost": self.vhost,
            "queue": self.queue,
            "time": self.time,
            "reason": self.reason,
            "delivery_count": self.delivery_count,
            "exchange": self.exchange,
            "routing_keys": self.routing_keys,
            "dead_letter_exchange": self.dead_letter_exchange,
            "dead_letter_queues": self.dead_letter_queues,
            "message_id": self.message_id,
            "body_size": self.body_size,
            "body_preview": self.body_preview,
            "segment": [segment] * self.rows,
            "offset": self.offset,
            "problem": self.problem,
            "date": dates,
        }
        arrays = [
            headers if f.name == "headers" else deaths if f.name == "deaths" else pa.array(columns[f.name], f.type)
            for f in ARROW_SCHEMA
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def segment_batches(data: bytes, segment: int, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The events of a segment file (:func:`segment_records`) as Arrow record batches of
    :data:`~spark.schema.ARROW_SCHEMA`, ``batch_rows`` rows at most each.

    A damaged span is one ``corrupt`` row with its ``problem``; it has no time, and its
    ``date`` is that of the segment's first event (``unknown`` for a segment with none).
    """
    columns = _Columns()
    default_date = "unknown"
    for offset, record in segment_records(data, segment):
        if default_date == "unknown" and type(record) is not str:
            default_date = _date(record.time)  # type: ignore[union-attr]
        columns.add(offset, record)
        if columns.rows >= batch_rows:
            yield columns.batch(segment, default_date)
            columns = _Columns()
    if columns.rows:
        yield columns.batch(segment, default_date)


def segment_file_batches(path: str, segment: int) -> Iterator[pa.RecordBatch]:
    """:func:`segment_batches` of the segment file at ``path``; nothing when the file is gone
    (exported and pruned since it was listed: the Parquet copy has its events)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return
    yield from segment_batches(data, segment)

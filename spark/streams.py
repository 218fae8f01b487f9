"""A stream's segments as dead-letter events: the input of ``postroom dlq export --stream`` and
of the Spark job's ``--stream``.

A stream that a dead-letter exchange feeds keeps the whole dead-letter history, each message
with its ``x-death`` headers. Read straight from the stream's segment files (the broker's own
record decoder, no broker running needed), each message becomes one ``dead_lettered`` row of
the event schema (``spark/schema.py``), made as the broker makes its dead-letter events
(:func:`broker.wal.dead_letter_fields.stream_dead_letter`): ``dead_letter_id`` is the message's
offset, ``queue`` and ``reason`` those of its latest death, ``dead_letter_queues`` the stream,
``time`` when its chunk was appended, ``segment`` and ``offset`` where the chunk is. Nothing
settles a stream's messages: every row is pending. Damage is a ``corrupt`` row, as in the
event stream.

Segments are offset ranges: the Spark job reads one per partition, in parallel. A
:class:`Selection` keeps a range of offsets (``--from``/``--to`` numbers) or of append times
(``--from``/``--to`` ISO 8601 times), whole segments outside it unread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Union

import pyarrow as pa

from postroom.broker.wal.chunks import unpack_batched_messages, unpack_raw_messages, unpack_stream_messages
from postroom.broker.wal.dead_letter_fields import stream_dead_letter
from postroom.broker.wal.paths import incarnations, stream_directory
from postroom.broker.wal.records import (
    StreamBatchChunk,
    StreamChunk,
    StreamRawChunk,
    StreamTrackedBatchChunk,
    StreamTrackedChunk,
    StreamTrackedRawChunk,
)
from postroom.broker.wire.amqp10 import delivered_as_amqp091
from postroom.spark.events import BATCH_ROWS, _Columns, _date, list_segments, walk_segment

__all__ = ["Selection", "parse_bound", "stream_segment_batches", "stream_segments"]

#: A stream chunk record of any kind.
_Chunk = Union[
    StreamChunk, StreamRawChunk, StreamBatchChunk, StreamTrackedChunk, StreamTrackedRawChunk, StreamTrackedBatchChunk
]

#: Where the broker keeps its streams, under its ``storage.dir``.
STREAMS_DIR = "streams"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which messages of which stream: ``vhost`` and ``stream``, offsets from ``first`` up to
    (not including) ``end``, appended from ``since`` up to (not including) ``until`` (seconds
    since the epoch); ``None``: no bound."""

    vhost: str
    stream: str
    first: int | None = None
    end: int | None = None
    since: float | None = None
    until: float | None = None

    def bounded(self, lower: str | None, upper: str | None) -> Selection:
        """This selection with ``--from`` ``lower`` and ``--to`` ``upper`` (:func:`parse_bound`)."""
        first, since = parse_bound(lower)
        end, until = parse_bound(upper)
        return Selection(self.vhost, self.stream, first, end, since, until)


def parse_bound(text: str | None) -> tuple[int | None, float | None]:
    """``--from``/``--to``: an offset (digits), or a time (ISO 8601, UTC when it names no zone).

    :raises ValueError: neither
    """
    if text is None:
        return None, None
    if text.isdigit():
        return int(text), None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither an offset nor an ISO 8601 time (2026-11-24T14:00)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return None, moment.timestamp()


def stream_segments(data_dir: str, vhost: str, stream: str) -> list[tuple[int, str]]:
    """``(number, path)`` of the stream's segment files (its newest incarnation's), ascending;
    [] when the broker's data directory ``data_dir`` holds no such stream."""
    found = incarnations(stream_directory(os.path.join(data_dir, STREAMS_DIR), vhost, stream))
    return list_segments(found[-1][1]) if found else []


def stream_segment_batches(
    data: bytes, segment: int, selection: Selection, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """The selected messages of one stream segment file as Arrow batches of the event schema.

    Never raises for bad data: damage is a ``corrupt`` row and reading goes on after it.
    """
    columns = _Columns()
    default_date = "unknown"
    for position, item in _chunks(data, segment):
        if isinstance(item, str):
            columns.add(position, item)
        else:
            if not _wanted_chunk(item, selection):
                continue
            if default_date == "unknown":
                default_date = _date(item.timestamp)
            messages: list[tuple[bytes, bytes, bytes] | None]
            if type(item) in (StreamChunk, StreamTrackedChunk):
                messages = unpack_stream_messages(item.entries, 0, item.count)  # type: ignore[assignment]
            elif type(item) in (StreamRawChunk, StreamTrackedRawChunk):
                messages = unpack_raw_messages(item.entries, 0, item.count)  # type: ignore[assignment]
            else:
                messages = unpack_batched_messages(item.entries, 0, item.count)
            for offset, message in enumerate(messages, item.first_offset):
                if (
                    message is None  # in a compressed sub-entry batch: the stream protocol's clients read it
                    or (selection.first is not None and offset < selection.first)
                    or (selection.end is not None and offset >= selection.end)
                ):
                    continue
                names, header, body = message
                vhost, stream = selection.vhost, selection.stream
                if not header:  # published over the stream protocol: its AMQP 0-9-1 form
                    names, header, body = delivered_as_amqp091(body, stream)
                through = names[1 : 1 + names[0]].decode("utf-8", "surrogateescape")
                columns.add(position, stream_dead_letter(vhost, stream, offset, item.timestamp, through, header, body))
        if columns.rows >= batch_rows:
            yield columns.batch(segment, default_date)
            columns = _Columns()
    if columns.rows:
        yield columns.batch(segment, default_date)


def stream_file_batches(path: str, segment: int, selection: Selection) -> Iterator[pa.RecordBatch]:
    """:func:`stream_segment_batches` of the file at ``path``; nothing when it is gone
    (retention removed it since it was listed)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return
    yield from stream_segment_batches(data, segment, selection)


def _wanted_chunk(chunk: _Chunk, selection: Selection) -> bool:
    """Whether any of ``chunk``'s messages may be selected."""
    if selection.end is not None and chunk.first_offset >= selection.end:
        return False
    if selection.first is not None and chunk.first_offset + chunk.count <= selection.first:
        return False
    if selection.since is not None and chunk.timestamp < selection.since:
        return False
    return selection.until is None or chunk.timestamp < selection.until


_CHUNK_RECORDS = (
    StreamChunk,
    StreamRawChunk,
    StreamBatchChunk,
    StreamTrackedChunk,
    StreamTrackedRawChunk,
    StreamTrackedBatchChunk,
)


def _chunks(data: bytes, segment: int) -> Iterator[tuple[int, _Chunk | str]]:
    """``(position, chunk)`` for each chunk of a stream segment file, ``(position, problem)``
    for each damaged span and each record of another type (:func:`spark.events.walk_segment`)."""
    for position, record in walk_segment(data, segment):
        if type(record) in _CHUNK_RECORDS or type(record) is str:
            yield position, record  # type: ignore[misc]
        else:
            yield position, f"not a stream chunk: {type(record).__name__}"

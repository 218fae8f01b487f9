"""Dead-letter records and segment files as the broker writes them, for the Spark tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import DeadLettered, DeadLetterSettled
from postroom.broker.wal.segments import segment_header


def dead_lettered(
    dead_letter_id: int,
    queue: str = "work",
    reason: str = "rejected",
    dlqs: tuple[str, ...] = ("dlq",),
    delivery_count: int = 0,
    time: float = 1_795_000_000.0,
    headers: dict[str, str] | None = None,
    body: bytes = b'{"id": 1}',
) -> DeadLettered:
    """A ``DEAD_LETTERED`` record with one ``x-death`` entry, as the broker writes it."""
    headers = headers or {}
    return DeadLettered(
        dead_letter_id,
        "/",
        queue,
        reason,
        delivery_count,
        time,
        "orders",
        ("order.created",),
        "dlx",
        dlqs,
        f"m-{dead_letter_id}",
        tuple(headers),
        tuple(headers.values()),
        (queue,),
        (reason,),
        ("orders",),
        (1,),
        (int(time),),
        len(body),
        body,
    )


def settled(dead_letter_id: int, queue: str = "dlq", time: float = 1_795_000_100.0) -> DeadLetterSettled:
    """A ``DEAD_LETTER_SETTLED`` record."""
    return DeadLetterSettled(dead_letter_id, "/", queue, time)


def segment(number: int, records: list[Any]) -> bytes:
    """A whole segment file: header, then the encoded records."""
    return segment_header(number) + b"".join(encode(record) for record in records)


def write_segment(directory: Path, number: int, data: bytes) -> Path:
    """Write ``data`` as segment ``number`` of the stream in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{number:020d}.wal"
    path.write_bytes(data)
    return path

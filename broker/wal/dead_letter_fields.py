"""What a dead-letter event says of a dead-lettered message, from its headers.

Shared by the broker, which records a :class:`~broker.wal.records.DeadLettered` event when a
message dies (``broker.core.dead_letter_events``), and by the readers of a stream that a dead-letter
exchange feeds (``spark.streams``), which make the same event of each message the stream
holds: a stream keeps the whole dead-letter history, and reads as the event stream does.
Pure: standard library, the record format and the wire format's table and property readers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from postroom.broker.wal.records import DEAD_LETTER_HEADER_VALUE_BYTES, DEAD_LETTER_PREVIEW_BYTES, DeadLettered
from postroom.broker.wire.content import MESSAGE_ID, ContentError, headers_content, property_value
from postroom.broker.wire.table import TableError, decode_table

__all__ = [
    "DEAD_LETTER_ID_HEADER",
    "MAX_DEATHS",
    "MAX_HEADERS",
    "SEAL_HEADER",
    "dead_lettered",
    "header_table",
    "stream_dead_letter",
    "text",
]

#: The header in which a dead-lettered copy carries its id in the dead-letter event stream;
#: ``postroom dlq redrive --ids`` selects messages by it.
DEAD_LETTER_ID_HEADER = "x-postroom-dead-letter-id"
#: The header that carries a dead-lettered copy's seal (``broker.core.seal``).
SEAL_HEADER = "x-postroom-dead-letter-seal"

#: Header values kept per dead letter: the analysis counts values of labels (tenant, type,
#: error); a message with thousands of headers must not make one event huge.
MAX_HEADERS = 64

#: ``x-death`` entries kept per dead letter (most recent first); the history of a message
#: bouncing between queues for days is summarised by its counts anyway.
MAX_DEATHS = 64

#: Headers an event does not list among the message's headers (it has them in its own fields).
_NOT_LISTED = frozenset({"x-death", DEAD_LETTER_ID_HEADER, SEAL_HEADER})


def text(value: Any) -> str:
    """A header value as bounded text: bytes decoded leniently, tables and lists as ``repr``."""
    if isinstance(value, bytes):
        result = value.decode("utf-8", "replace")
    elif isinstance(value, datetime):
        result = value.isoformat()
    else:
        result = str(value)
    data = result.encode("utf-8", "surrogateescape")
    if len(data) > DEAD_LETTER_HEADER_VALUE_BYTES:
        result = data[:DEAD_LETTER_HEADER_VALUE_BYTES].decode("utf-8", "ignore")
    return result


def _seconds(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp())
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def _count(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def header_table(header: bytes) -> dict[str, Any]:
    """The ``headers`` table of a content header, empty when there is none or it does not
    decode (an event is made of what a message holds, whatever it holds)."""
    try:
        content = headers_content(header)
        if content is None:
            return {}
        table, _end = decode_table(len(content).to_bytes(4, "big") + content)
    except (ContentError, TableError):
        return {}
    return table


def message_id(header: bytes) -> str:
    """The ``message-id`` property as text ("" when absent)."""
    value = property_value(header, MESSAGE_ID)  # (None for a header that does not parse)
    return text(value) if value else ""


def dead_lettered(
    dead_letter_id: int,
    vhost: str,
    queue: str,
    reason: str,
    delivery_count: int,
    time: float,
    dead_letter_exchange: str,
    dead_letter_queues: Sequence[str],
    headers: Mapping[str, Any],
    header: bytes,
    body: bytes,
) -> DeadLettered:
    """The event of a message that died in ``queue`` for ``reason`` and went through
    ``dead_letter_exchange`` to ``dead_letter_queues``.

    :param headers: its headers, ``x-death`` already updated (most recent death first)
    :param header: its content header (for the ``message-id`` property)
    """
    deaths = headers.get("x-death")
    deaths = [d for d in deaths if isinstance(d, dict)][:MAX_DEATHS] if isinstance(deaths, list) else []
    latest = deaths[0] if deaths else {}
    names: list[str] = []
    values: list[str] = []
    for key, value in headers.items():
        if key in _NOT_LISTED or len(names) >= MAX_HEADERS:
            continue
        names.append(key)
        values.append(text(value))
    routing_keys = latest.get("routing-keys")
    return DeadLettered(
        dead_letter_id=dead_letter_id,
        vhost=vhost,
        queue=queue,
        reason=reason,
        delivery_count=delivery_count,
        time=time,
        exchange=str(latest.get("exchange", "")),
        routing_keys=tuple(str(key) for key in routing_keys) if isinstance(routing_keys, list) else (),
        dead_letter_exchange=dead_letter_exchange,
        dead_letter_queues=tuple(dead_letter_queues),
        message_id=message_id(header),
        header_names=tuple(names),
        header_values=tuple(values),
        death_queues=tuple(str(d.get("queue", "")) for d in deaths),
        death_reasons=tuple(str(d.get("reason", "")) for d in deaths),
        death_exchanges=tuple(str(d.get("exchange", "")) for d in deaths),
        death_counts=tuple(_count(d.get("count")) for d in deaths),
        death_times=tuple(_seconds(d.get("time")) for d in deaths),
        body_size=len(body),
        body_preview=body[:DEAD_LETTER_PREVIEW_BYTES],
    )


def stream_dead_letter(
    vhost: str, stream: str, offset: int, time: float, exchange: str, header: bytes, body: bytes
) -> DeadLettered:
    """The event of the message at ``offset`` of ``stream``, appended at ``time`` through
    ``exchange`` (the dead-letter exchange): it died where its latest ``x-death`` entry says
    (a message that never died has an empty queue and reason), and its id is its offset."""
    headers = header_table(header)
    deaths = headers.get("x-death")
    latest = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    return dead_lettered(
        offset,
        vhost,
        str(latest.get("queue", "")),
        text(latest.get("reason", "")),
        _count(headers.get("x-delivery-count")),
        time,
        exchange,
        (stream,),
        headers,
        header,
        body,
    )

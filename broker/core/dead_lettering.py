"""Dead-lettering as RabbitMQ 3.10 does it: the ``x-death`` history, first-death headers, cycles.

A dead-lettered message is republished to its queue's dead-letter exchange with
(``rabbit_dead_letter:make_msg`` and ``update_x_death_header``):

* ``x-death``: a list of tables, one per ``(queue, reason)``, most recent first. The first
  death's table is ``count`` (long), ``reason``, ``queue``, ``time`` (timestamp),
  ``exchange``, ``routing-keys`` (array) and, when the message had a per-message TTL,
  ``original-expiration``, in that order. A death in a new ``(queue, reason)`` is the same
  table sorted by key; a repeat of a pair adds one to that table's ``count``, keeps its other
  fields as they were, sorts it by key and moves it to the front.
* ``x-first-death-reason``, ``-queue``, ``-exchange``: set at the first death only;
* the whole headers table sorted by key (``rabbit_misc:set_table_value`` sorts it), ``CC``
  removed when the queue has a dead-letter routing key, no ``expiration`` property (it would
  expire again in the dead-letter queue), and no ``x-delivery-count`` (the next queue counts
  its own returns).

Everything is done on the publisher's bytes (:mod:`broker.wire.content`): its entries are moved
whole, never decoded and encoded again, so whatever types they hold they keep. Only the
``x-death`` table of a repeated death is decoded, with the exact codec, to raise its count.

Reference: RabbitMQ's "Dead Letter Exchanges" guide, section "Dead-Lettered Effects on Messages".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from enum import Enum
from typing import Any

from postroom.broker.core.message import Message
from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER, SEAL_HEADER, Sealer
from postroom.broker.wire.codec import shortstr
from postroom.broker.wire.content import (
    EXPIRATION,
    HEADERS,
    ContentError,
    property_spans,
    replace_property,
    with_header_entry,
    with_headers_content,
)
from postroom.broker.wire.table import Int64, Raw, TableError, decode_value, encode_entry, iter_table, value_end

#: The header Postroom adds to redeliveries (see ``x-delivery-limit``).
DELIVERY_COUNT_HEADER = "x-delivery-count"

_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
#: Entries no dead-lettered copy keeps: ``BCC`` (as RabbitMQ), and Postroom's own, which each
#: copy gets anew.
_DROPPED_ENTRIES = frozenset((b"BCC", DEAD_LETTER_ID_HEADER.encode(), SEAL_HEADER.encode()))


class DeadLetterReason(Enum):
    """Why a message was dead-lettered (the ``reason`` field of ``x-death``)."""

    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"


def _deaths(headers: dict[str, Any] | None) -> list[dict[str, Any]]:
    deaths = (headers or {}).get("x-death")
    return [death for death in deaths if isinstance(death, dict)] if isinstance(deaths, list) else []


def is_cycle(message: Message, queue_name: str, reason: DeadLetterReason) -> bool:
    """Whether dead-lettering ``message`` into ``queue_name`` would close a loop with no rejection.

    Walks ``x-death`` from the most recent death: a ``rejected`` death first means a consumer
    acted in between (no cycle); reaching ``queue_name`` first means the message is going
    round on its own (expiry, length, delivery limits) and RabbitMQ drops it.
    A rejection now is never a cycle.
    """
    if reason is DeadLetterReason.REJECTED:
        return False
    for death in _deaths(message.lenient_headers()):
        if death.get("reason") == DeadLetterReason.REJECTED.value:
            return False
        if death.get("queue") == queue_name:
            return True
    return False


def _entries(content: bytes) -> list[tuple[bytes, bytes]] | None:
    """A table's entries as ``(key, whole entry bytes)``, ``None`` when they do not parse."""
    entries = []
    try:
        for key, _tag, start, end in iter_table(content, 0, len(content)):
            entries.append((key, content[start - 2 - len(key) : end]))
    except TableError:
        return None
    return entries


def _store(entries: list[tuple[bytes, bytes]], key: bytes, entry: bytes) -> None:
    """Erlang's ``lists:keystore``: replace the first entry named ``key``, or add it last."""
    for index, (name, _) in enumerate(entries):
        if name == key:
            entries[index] = (key, entry)
            return
    entries.append((key, entry))


def _text(value: Any) -> bytes | None:
    """A long-string field's bytes (``None`` for any other type)."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes) and not isinstance(value, bytearray):
        return bytes(value)
    return None


def _items(entry: bytes, key: bytes) -> Iterator[tuple[int, int, int]]:
    """The elements of the array ``entry`` (an encoded entry named ``key``): ``(tag, start, end)``."""
    pos = 2 + len(key) + 4  # key length, key, type octet, array length
    end = len(entry)
    while pos < end:
        tag = entry[pos]
        stop = value_end(entry, tag, pos + 1, end)
        yield tag, pos + 1, stop
        pos = stop


def dead_lettered(
    message: Message,
    queue_name: str,
    reason: DeadLetterReason,
    now: float,
    exchange: str,
    routing_key: str | None,
    delivery_count: int,
    dead_letter_id: int = 0,
    sealer: Sealer | None = None,
    vhost: str = "",
) -> Message:
    """The message to publish to the dead-letter exchange.

    Never fails on what the message holds: headers that do not parse keep their bytes, and
    the dead-letter entries are added after them.

    :param message: the message as it sat in the queue
    :param queue_name: the queue it dies in
    :param now: the time of death (seconds since the epoch)
    :param exchange: the dead-letter exchange it is published to
    :param routing_key: ``x-dead-letter-routing-key``, or ``None`` to keep the original key
    :param delivery_count: returns counted in that queue before it died (for the event stream;
        not written into the message: RabbitMQ's ``x-death`` has no such field)
    :param dead_letter_id: the dead-letter event log's id for this copy, set as header
        ``x-postroom-dead-letter-id`` (0: no event log, no header)
    :param sealer: seals a copy with an id, for ``vhost`` (see :mod:`broker.core.seal`)
    """
    header = message.header
    try:
        spans = property_spans(header)[1]
    except ContentError:
        spans = {}
    content = b""
    span = spans.get(HEADERS)
    if span is not None:
        content = bytes(header[span[0] + 4 : span[1]])
    parsed = _entries(content)
    entries = parsed if parsed is not None else []
    entries = [(key, entry) for key, entry in entries if key != b"x-delivery-count"]
    expiration = spans.get(EXPIRATION)
    queue_raw = queue_name.encode("utf-8", "surrogateescape")
    exchange_raw = message.exchange.encode("utf-8", "surrogateescape")
    reason_raw = reason.value.encode()
    routing_keys: list[Any] = [message.routing_key]
    deaths: bytes | None = None
    for key, entry in entries:
        if key == b"CC" and entry[1 + len(key)] == ord("A"):
            try:
                routing_keys += [
                    Raw(b"S", entry[start:stop]) for tag, start, stop in _items(entry, key) if tag == ord("S")
                ]
            except TableError:
                pass
        elif key == b"x-death" and deaths is None:
            deaths = entry
    info: list[tuple[str, Any]] = [
        ("reason", reason.value),
        ("queue", queue_name),
        ("time", Raw(b"T", _u64.pack(int(now)))),
        ("exchange", message.exchange),
        ("routing-keys", routing_keys),
    ]
    if expiration is not None:
        info.append(("original-expiration", bytes(header[expiration[0] + 1 : expiration[1]])))
    first = [("count", Int64(1)), *info]
    if deaths is None:
        for key, value in (
            (b"x-first-death-reason", reason_raw),
            (b"x-first-death-queue", queue_raw),
            (b"x-first-death-exchange", exchange_raw),
        ):
            _store(entries, key, encode_entry(key, value))
        tables = [_table(first)]
    elif deaths[1 + len(b"x-death")] != ord("A"):
        tables = [_table(first)]  # not an array: RabbitMQ resets it
    else:
        try:
            tables = _updated_deaths(deaths, queue_raw, reason_raw, first)
        except TableError:  # a count at the top of its type: the history starts again
            tables = [_table(first)]
    _store(
        entries, b"x-death", encode_entry(b"x-death", Raw(b"A", _u32.pack(sum(map(len, tables))) + b"".join(tables)))
    )
    if routing_key is not None:
        entries = [(key, entry) for key, entry in entries if key != b"CC"]
    entries = [(key, entry) for key, entry in entries if key not in _DROPPED_ENTRIES]
    if dead_letter_id:
        entries.append((DEAD_LETTER_ID_HEADER.encode(), encode_entry(DEAD_LETTER_ID_HEADER, Int64(dead_letter_id))))
    if parsed is not None:
        entries.sort(key=lambda item: item[0])
        new_content = b"".join(entry for _, entry in entries)
    else:  # headers that do not parse: kept as sent, ours after them
        new_content = content + b"".join(entry for key, entry in entries)
    try:
        new_header = replace_property(header, HEADERS, _u32.pack(len(new_content)) + new_content)
        if expiration is not None:
            new_header = replace_property(new_header, EXPIRATION, None)
        if sealer is not None and dead_letter_id and parsed is not None:
            seal = sealer.seal(vhost, dead_letter_id, queue_name, new_header, message.body)
            entries.append((SEAL_HEADER.encode(), encode_entry(SEAL_HEADER, seal)))
            entries.sort(key=lambda item: item[0])
            new_header = with_headers_content(new_header, b"".join(entry for _, entry in entries))
    except ContentError:
        new_header = header
    dead_key = message.routing_key if routing_key is None else routing_key
    return Message(exchange, dead_key, shortstr(exchange) + shortstr(dead_key), new_header, message.body)


def _table(fields: list[tuple[str, Any]]) -> bytes:
    """An ``F`` array element from ordered fields."""
    content = b"".join(encode_entry(key, value) for key, value in fields)
    return b"F" + _u32.pack(len(content)) + content


def _updated_deaths(deaths: bytes, queue: bytes, reason: bytes, first: list[tuple[str, Any]]) -> list[bytes]:
    """The ``x-death`` elements after one more death in ``(queue, reason)``: that table first.

    As ``update_x_death_header``: tables of one pair left by old clients are grouped first
    (the first of each pair kept, with a ``count`` of how many there were when it had none;
    grouping two or more tables reverses their order, as RabbitMQ's fold does); then the
    pair's table gets one more ``count`` and goes first, sorted by key; the others keep their bytes.
    """
    try:
        elements = list(_items(deaths, b"x-death"))
    except TableError:
        elements = []
    decoded: list[tuple[bytes, dict[str, Any] | None, tuple[bytes | None, bytes | None]]] = []
    for tag, start, stop in elements:
        table = None
        if tag == ord("F"):
            try:
                table = decode_value(deaths, tag, start, stop)
            except TableError:
                table = None
        pair = (_text(table.get("queue")), _text(table.get("reason"))) if table is not None else (None, None)
        decoded.append((deaths[start - 1 : stop], table, pair))
    if len(decoded) > 1:
        grouped: list[tuple[bytes, dict[str, Any] | None, tuple[bytes | None, bytes | None]]] = []
        seen: set[tuple[bytes | None, bytes | None]] = set()
        for element, table, pair in decoded:
            if table is None:
                grouped.insert(0, (element, table, pair))
                continue
            if pair in seen:
                continue
            seen.add(pair)
            same = sum(1 for other in decoded if other[2] == pair)
            if "count" not in table:
                table = {"count": Int64(same), **table}
                element = _table(list(table.items()))
            grouped.insert(0, (element, table, pair))
        decoded = grouped
    match: dict[str, Any] | None = None
    others: list[bytes] = []
    for element, table, pair in decoded:
        if match is None and table is not None and pair == (queue, reason):
            match = table
        else:
            others.append(element)
    if match is None:
        fields = sorted(first, key=lambda item: item[0].encode())
    else:
        count = match.get("count")
        if "count" not in match:
            fields = [("count", Int64(1)), *match.items()]
        else:
            match["count"] = Int64(count + 1) if isinstance(count, int) and not isinstance(count, bool) else count
            fields = list(match.items())
        fields.sort(key=lambda item: item[0].encode("utf-8", "surrogateescape"))
    return [_table(fields), *others]


def with_delivery_count(message: Message, delivery_count: int) -> bytes:
    """The message's content header with ``x-delivery-count`` (long) set, for a redelivery.

    Spliced into the publisher's bytes: an existing entry of that name is replaced where it
    stands, otherwise the entry goes last; nothing else changes, whatever it holds.
    """
    return with_header_entry(message.header, DELIVERY_COUNT_HEADER, Int64(delivery_count))

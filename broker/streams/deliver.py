"""``deliver`` frames of a stream's chunks, as RabbitMQ sends them to the stream protocol's
subscribers: osiris's chunk format, each message a simple entry, as AMQP 1.0."""

from __future__ import annotations

import struct
import zlib
from dataclasses import replace

from postroom.broker.core.stream import MAX_CHUNK_ENTRIES, StreamQueue
from postroom.broker.streams.session import Outgoing
from postroom.broker.wal.chunks import BATCHED, TRACKING_SNAPSHOT, count_entries, split_entries, unpack_tracking
from postroom.broker.wal.records import WALCorruption
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES
from postroom.broker.wal.streamlog import ENTRIES_AT, Chunk
from postroom.broker.wire import streamframes as wire
from postroom.broker.wire.amqp10 import from_amqp091

_CHUNK_HEAD = struct.Struct(">HHBBBHIqQQIIII")  # frame key, version, subscription; osiris's head
_CHUNK_HEAD_V2 = struct.Struct(">HHBQBBHIqQQIIII")  # the same with the committed chunk id first
_ENTRY = struct.Struct(">I")
_SIZES = struct.Struct(">II")  # an AMQP 0-9-1 message's header and body sizes


def deliver(
    subscription: int, chunk: Chunk, payload: bytes, committed: int | None = None, trailer: int = 0
) -> list[Outgoing]:
    """A ``deliver`` frame of ``chunk`` (its record ``payload``), as its head and its data (not
    joined: one copy less of a chunk that may be a megabyte; see :func:`deliver_head` for a
    chunk too large for one): RabbitMQ's chunk format (osiris's), each message a simple entry,
    as AMQP 1.0.

    A chunk of messages published over this protocol (``chunk.raw``) holds them as simple
    entries already, and goes out as it is stored. In a chunk of AMQP 0-9-1's, such a message
    (from before those chunks existed) is ``0 | 0 | header size 0 | body size | body``: from
    its sixth byte on, a simple entry, sliced out as it is. Other messages are converted."""
    if chunk.raw:
        return deliver_head(subscription, chunk, memoryview(payload)[ENTRIES_AT:], committed, trailer)
    entries: list[bytes] = []
    pack, sizes = _ENTRY.pack, _SIZES.unpack_from
    at = ENTRIES_AT
    try:
        for _ in range(chunk.count):
            names_end = at + 1 + payload[at]
            names_end += 1 + payload[names_end]
            header_size, body_size = sizes(payload, names_end)
            end = names_end + 8 + header_size + body_size
            if header_size == 0 and names_end == at + 2:
                entries.append(payload[names_end + 4 : end])
            else:
                header = payload[names_end + 8 : names_end + 8 + header_size]
                message = from_amqp091(payload[at:names_end], header, payload[end - body_size : end])
                entries += (pack(len(message)), message)
            at = end
    except (IndexError, struct.error):
        at = -1
    if at != len(payload):
        raise WALCorruption(f"stream chunk at offset {chunk.first_offset}: its entries do not add up")
    return deliver_head(subscription, chunk, b"".join(entries), committed, trailer)


def deliver_head(
    subscription: int, chunk: Chunk, data: bytes | memoryview, committed: int | None = None, trailer: int = 0
) -> list[Outgoing]:
    """The frame head of a ``deliver`` of ``chunk`` holding ``data`` (its entries), and ``data``.

    A chunk of more entries than a chunk head counts (16 bits: one stored before chunks were
    capped at :data:`~broker.core.stream.MAX_CHUNK_ENTRIES`) goes as several ``deliver``
    frames of that many entries each, heads and data in turn, as if stored so."""
    entries = count_entries(data, 0) if chunk.raw == BATCHED else chunk.count
    if entries <= 0xFFFF:
        return [chunk_head(subscription, chunk, entries, zlib.crc32(data), len(data), committed, trailer), data]
    parts: list[Outgoing] = []
    view, at, first = memoryview(data), 0, chunk.first_offset
    while entries:
        take = min(entries, MAX_CHUNK_ENTRIES)
        cut, messages = split_entries(view[at:], take)
        piece = view[at : at + cut]
        part = replace(chunk, first_offset=first, count=messages)
        parts += (chunk_head(subscription, part, take, zlib.crc32(piece), cut, committed), piece)
        at, first, entries = at + cut, first + messages, entries - take
    return parts


def chunk_head(
    subscription: int,
    chunk: Chunk,
    entries: int,
    crc: int,
    size: int,
    committed: int | None = None,
    trailer: int = 0,
) -> bytes:
    """The frame head of a ``deliver`` of ``chunk``: its ``entries`` (simple entries and
    sub-entry batches) are ``size`` bytes whose CRC-32 is ``crc``; its ``trailer`` bytes
    (what its trailer length says; the trailer itself is not sent, as RabbitMQ sends none to
    the stream protocol's subscribers). With ``committed`` (the first offset of the stream's
    newest committed chunk), ``deliver`` version 2 (RabbitMQ 3.11's, for a client that asked
    for it in ``exchange_command_versions``), which carries it."""
    fields = (
        0x50, 0, entries, chunk.count, int(chunk.timestamp * 1000), 1, chunk.first_offset, crc, size, trailer, 0,
    )  # fmt: skip
    if committed is None:
        head = _CHUNK_HEAD.pack(wire.DELIVER, 1, subscription, *fields)
    else:
        head = _CHUNK_HEAD_V2.pack(wire.DELIVER, 2, subscription, committed, *fields)
    return wire.u32(len(head) + size) + head


def trailer_bytes(stream: StreamQueue, chunk: Chunk) -> int:
    """The bytes of ``chunk``'s trailer that RabbitMQ's chunk would have: its publishers' own
    entries (a segment's first chunk also holds the other publishers', marked as a snapshot).

    :raises OSError: the storage failed
    :raises WALCorruption: the trailer does not add up
    """
    if not chunk.trailer or chunk.position != SEGMENT_HEADER_BYTES:
        return chunk.trailer
    tracked = unpack_tracking(stream.log.read_trailer(chunk))
    own = [name.encode("utf-8", "surrogateescape") for kind, name, _ in tracked if kind < TRACKING_SNAPSHOT]
    return sum(10 + len(name) for name in own)

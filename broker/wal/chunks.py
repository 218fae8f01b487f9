"""A stream's chunk records: their kinds, and the packing of their messages and trailers.

A stream queue keeps its messages in its own segments (``broker.wal.streamlog``), a chunk
record per group commit: a :class:`~broker.wal.records.StreamChunk` of AMQP 0-9-1 messages, a
:class:`~broker.wal.records.StreamRawChunk` of messages published over the stream protocol as
its clients encoded them, a :class:`~broker.wal.records.StreamBatchChunk` with sub-entry
batches among them, each with a trailer of publishers' tracking entries or without.
:func:`stream_chunk_pieces` frames one without copying its entries; the ``pack_*`` and
``unpack_*`` functions turn messages into a chunk's entries and back.

Standard library only: ``spark/`` reads streams' chunks with it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

from postroom.broker.wal.codec import MAX_RECORD_BYTES, RECORD_HEADER
from postroom.broker.wal.crc import TYPE_CRC
from postroom.broker.wal.records import RecordType, WALCorruption

__all__ = [
    "STREAM_CHUNK_HEAD",
    "STREAM_CHUNK_OVERHEAD",
    "STREAM_CHUNK_TYPES",
    "STREAM_TRACKED_TYPES",
    "RAW",
    "BATCHED",
    "TRACKING_SEQUENCE",
    "TRACKING_SNAPSHOT",
    "pack_tracking",
    "unpack_tracking",
    "encode_stream_chunk",
    "stream_chunk_pieces",
    "pack_stream_entries",
    "pack_stream_messages",
    "unpack_stream_entries",
    "unpack_stream_messages",
    "pack_raw_entries",
    "unpack_raw_messages",
    "unpack_batched_messages",
    "BATCH_HEAD",
    "batch_records",
    "count_entries",
    "split_entries",
    "as_entries",
]

_U32 = struct.Struct(">I")


#: A :class:`StreamChunk` payload's head: first_offset, timestamp, count, then its entries' length.
STREAM_CHUNK_HEAD = struct.Struct(">QdQI")
#: A stream chunk's kind, as :class:`~broker.wal.streamlog.Chunk` keeps it (0: a
#: :class:`StreamChunk`): a :class:`StreamRawChunk`, a :class:`StreamBatchChunk`.
RAW, BATCHED = 1, 2
#: The record type of each kind of stream chunk.
STREAM_CHUNK_TYPES = (
    int(RecordType.STREAM_CHUNK),
    int(RecordType.STREAM_RAW_CHUNK),
    int(RecordType.STREAM_BATCH_CHUNK),
)
#: The record type of each kind of stream chunk with a trailer (:class:`StreamTrackedChunk`).
STREAM_TRACKED_TYPES = (
    int(RecordType.STREAM_TRACKED_CHUNK),
    int(RecordType.STREAM_TRACKED_RAW_CHUNK),
    int(RecordType.STREAM_TRACKED_BATCH_CHUNK),
)
#: Bytes a :class:`StreamChunk` record takes besides its packed entries.
STREAM_CHUNK_OVERHEAD = RECORD_HEADER.size + STREAM_CHUNK_HEAD.size

#: osiris's tracking entry type of a publisher's last publishing id (``TRK_TYPE_SEQUENCE``),
#: and the bit that marks one of a segment's opening snapshot (a publisher without messages
#: in the chunk: not part of the trailer RabbitMQ's chunk would carry).
TRACKING_SEQUENCE = 0
TRACKING_SNAPSHOT = 0x80
_TRACKING_ID = struct.Struct(">BB")
_TRACKING_VALUE = struct.Struct(">Q")


def pack_tracking(sequences: Iterable[tuple[str, int]], snapshot: bool = False) -> bytes:
    """osiris's tracking entries (``type u8, id size u8, id, value u64``) of publishers'
    last publishing ids, in the order given; with ``snapshot``, marked
    :data:`TRACKING_SNAPSHOT`. References longer than 255 bytes are left out (the stream
    protocol takes up to 255)."""
    kind = TRACKING_SEQUENCE | (TRACKING_SNAPSHOT if snapshot else 0)
    parts: list[bytes] = []
    for reference, sequence in sequences:
        name = reference.encode("utf-8", "surrogateescape")
        if len(name) < 256:
            parts += (_TRACKING_ID.pack(kind, len(name)), name, _TRACKING_VALUE.pack(sequence))
    return b"".join(parts)


def unpack_tracking(data: bytes | memoryview) -> list[tuple[int, str, int]]:
    """``(type, reference, value)`` of each of :func:`pack_tracking`'s entries in ``data``.

    :raises WALCorruption: they do not add up
    """
    found, at, end = [], 0, len(data)
    while at < end:
        if end - at < 2:
            raise WALCorruption(f"stream chunk trailer cut short at byte {at} of {end}")
        kind, size = _TRACKING_ID.unpack_from(data, at)
        stop = at + 2 + size + 8
        if stop > end:
            raise WALCorruption(f"stream chunk trailer cut short at byte {at} of {end}")
        name = bytes(data[at + 2 : at + 2 + size]).decode("utf-8", "surrogateescape")
        found.append((kind, name, _TRACKING_VALUE.unpack_from(data, at + 2 + size)[0]))
        at = stop
    return found


def encode_stream_chunk(
    first_offset: int, timestamp: float, count: int, entries: bytes | list[bytes], kind: int = 0, trailer: bytes = b""
) -> bytes:
    """:func:`stream_chunk_pieces`, joined."""
    return b"".join(stream_chunk_pieces(first_offset, timestamp, count, entries, kind, trailer))


def stream_chunk_pieces(
    first_offset: int, timestamp: float, count: int, entries: bytes | list[bytes], kind: int = 0, trailer: bytes = b""
) -> list[bytes]:
    """``encode(StreamChunk(first_offset, timestamp, count, entries))`` (of a
    :class:`StreamRawChunk` for the kind :data:`RAW`, a :class:`StreamBatchChunk` for
    :data:`BATCHED`; with a ``trailer``, of the same kind of :class:`StreamTrackedChunk`) in
    pieces, for a write that takes them so (``writev``): its header and head, then ``entries``
    (which may come in pieces), not copied (the CRC runs over them without the GIL), then the
    trailer. A chunk is most of what a stream writes.

    :raises ValueError: as :func:`encode`
    """
    record_type = STREAM_TRACKED_TYPES[kind] if trailer else STREAM_CHUNK_TYPES[kind]
    pieces = [entries] if isinstance(entries, bytes) else entries
    size = sum(map(len, pieces))
    if trailer:
        pieces = [*pieces, _U32.pack(len(trailer)) + trailer]
    payload_bytes = STREAM_CHUNK_HEAD.size + size + (4 + len(trailer) if trailer else 0)
    if payload_bytes > MAX_RECORD_BYTES:
        raise ValueError(f"StreamChunk payload of {payload_bytes} bytes is over {MAX_RECORD_BYTES}")
    try:
        head = STREAM_CHUNK_HEAD.pack(first_offset, timestamp, count, size)
    except struct.error as err:
        raise ValueError(f"StreamChunk does not fit the WAL format: {err}") from err
    crc = zlib.crc32(head, TYPE_CRC[record_type])
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return [RECORD_HEADER.pack(payload_bytes, crc, record_type) + head, *pieces]


_STREAM_SIZES = struct.Struct(">II")  # lengths of the content header and the body


def pack_stream_entries(entries: Iterable[tuple[bytes, bytes, bytes, bytes]]) -> bytes:
    """A :class:`StreamChunk`'s ``entries``: for each message its exchange name and routing key
    (shortstrs, as the AMQP method carried them), content header and body, in order:
    ``len u8 | exchange | len u8 | routing key | len u32 | header | len u32 | body``.

    :raises ValueError: a name longer than 255 bytes
    """
    parts: list[bytes] = []
    for exchange, routing_key, header, body in entries:
        if len(exchange) > 255 or len(routing_key) > 255:
            raise ValueError("an exchange name or routing key over 255 bytes")
        parts += (bytes((len(exchange),)), exchange, bytes((len(routing_key),)), routing_key)
        parts += (_STREAM_SIZES.pack(len(header), len(body)), header, body)
    return b"".join(parts)


def pack_stream_messages(messages: Iterable[tuple[bytes, bytes, bytes]]) -> bytes:
    """:func:`pack_stream_entries` of messages given as ``(names, header, body)``: ``names`` is
    the exchange name and routing key as the ``basic.publish`` carried them (two shortstrs,
    which is how an entry starts), so nothing is split or checked again."""
    parts: list[bytes] = []
    sizes = _STREAM_SIZES.pack
    for names, header, body in messages:
        parts += (names, sizes(len(header), len(body)), header, body)
    return b"".join(parts)


def unpack_stream_messages(data: bytes, start: int, count: int) -> list[tuple[bytes, bytes, bytes]]:
    """The ``count`` messages packed in ``data`` from ``start`` to its end, as
    :func:`pack_stream_messages` takes them: ``(names, header, body)``, ``names`` being the
    exchange and routing key as two shortstrs (how ``basic.deliver`` carries them).

    :raises WALCorruption: as :func:`unpack_stream_entries`
    """
    messages = []
    pos = start
    size = len(data)
    sizes = _STREAM_SIZES.unpack_from
    try:
        for _ in range(count):
            end = pos + 1 + data[pos]
            end += 1 + data[end]
            names = data[pos:end]
            header_size, body_size = sizes(data, end)
            pos = end + 8
            header = data[pos : pos + header_size]
            pos += header_size
            body = data[pos : pos + body_size]
            pos += body_size
            if pos > size:
                raise IndexError(pos)
            messages.append((names, header, body))
    except (IndexError, struct.error):
        raise WALCorruption(f"stream chunk entries cut short at byte {pos - start} of {size - start}") from None
    if pos != size:
        raise WALCorruption(f"{size - pos} bytes after the stream chunk's {count} entries")
    return messages


_RAW_SIZE = struct.Struct(">I")
#: The names a message published over the stream protocol has among AMQP 0-9-1's (two empty
#: shortstrs), and its content header (none: that marks it).
_RAW_NAMES = b"\x00\x00"


def pack_raw_entries(messages: Iterable[bytes]) -> bytes:
    """A :class:`StreamRawChunk`'s ``entries``: each message as a simple entry (size, bytes)."""
    size = _RAW_SIZE.pack
    return b"".join([part for message in messages for part in (size(len(message)), message)])


def unpack_raw_messages(data: bytes, start: int, count: int) -> list[tuple[bytes, bytes, bytes]]:
    """The ``count`` messages of a :class:`StreamRawChunk`'s entries in ``data`` from ``start``,
    as :func:`unpack_stream_messages` gives a stream's messages: ``(names, header, body)`` with
    empty names and no content header (a message published over the stream protocol).

    :raises WALCorruption: the entries do not add up
    """
    messages = []
    pos, size = start, len(data)
    unpack = _RAW_SIZE.unpack_from
    try:
        for _ in range(count):
            length = unpack(data, pos)[0]
            pos += 4
            messages.append((_RAW_NAMES, b"", data[pos : pos + length]))
            pos += length
            if pos > size:
                raise IndexError(pos)
    except (IndexError, struct.error):
        raise WALCorruption(f"stream chunk entries cut short at byte {pos - start} of {size - start}") from None
    if pos != size:
        raise WALCorruption(f"{size - pos} bytes after the stream chunk's {count} entries")
    return messages


#: A sub-entry batch's head: its flags (1, compression u3, reserved u4), how many messages it
#: holds, their size uncompressed, and its size (the messages, compressed or not, follow).
BATCH_HEAD = struct.Struct(">BHII")


def batch_records(entry: bytes | memoryview) -> int:
    """How many messages (offsets) one entry of a :class:`StreamBatchChunk` holds: 1 for a
    simple entry, its count for a sub-entry batch (whose first bit is set)."""
    return 1 if entry[0] < 0x80 else entry[1] << 8 | entry[2]


def count_entries(data: bytes | memoryview, start: int) -> int:
    """How many entries (simple entries and sub-entry batches) a :class:`StreamBatchChunk`'s
    entries in ``data`` from ``start`` are.

    :raises WALCorruption: they do not add up
    """
    pos, size, entries = start, len(data), 0
    unpack = _RAW_SIZE.unpack_from
    try:
        while pos < size:
            word = unpack(data, pos)[0]
            pos += 4 + word if word < 0x80000000 else BATCH_HEAD.size + unpack(data, pos + 7)[0]
            entries += 1
    except struct.error:
        pos = -1
    if pos != size:
        raise WALCorruption(f"stream chunk entries do not add up ({size - start} bytes)")
    return entries


def split_entries(data: bytes | memoryview, entries: int, size: int | None = None) -> tuple[int, int]:
    """Where the first ``entries`` entries (simple entries and sub-entry batches) of ``data``
    end, and how many messages (offsets) they hold. With ``size``, every entry is a simple
    entry of a message of ``size`` bytes (nothing is read).

    :raises WALCorruption: ``data`` holds fewer entries, or they do not add up
    """
    if size is not None:
        return entries * (4 + size), entries
    pos, end, messages = 0, len(data), 0
    unpack = _RAW_SIZE.unpack_from
    try:
        for _ in range(entries):
            word = unpack(data, pos)[0]
            if word < 0x80000000:
                pos += 4 + word
                messages += 1
            else:
                messages += data[pos + 1] << 8 | data[pos + 2]
                pos += BATCH_HEAD.size + unpack(data, pos + 7)[0]
    except (IndexError, struct.error):
        pos = end + 1
    if pos > end:
        raise WALCorruption(f"stream entries end before entry {entries} ({end} bytes)")
    return pos, messages


def unpack_batched_messages(data: bytes, start: int, count: int) -> list[tuple[bytes, bytes, bytes] | None]:
    """The ``count`` messages of a :class:`StreamBatchChunk`'s entries in ``data`` from
    ``start``, one for each offset, as :func:`unpack_raw_messages` gives them: an uncompressed
    sub-entry batch's messages each on its own, ``None`` for each of a compressed one's (the
    stream protocol's clients read those; RabbitMQ's AMQP readers pass over them too).

    :raises WALCorruption: the entries do not add up
    """
    messages: list[tuple[bytes, bytes, bytes] | None] = []
    pos, size = start, len(data)
    unpack = _RAW_SIZE.unpack_from
    try:
        while pos < size:
            word = unpack(data, pos)[0]
            if word < 0x80000000:
                pos += 4
                messages.append((_RAW_NAMES, b"", data[pos : pos + word]))
                pos += word
                continue
            flags, records, _uncompressed, length = BATCH_HEAD.unpack_from(data, pos)
            pos += BATCH_HEAD.size
            end = pos + length
            if end > size:
                break
            if flags & 0x70:
                messages += [None] * records
            else:
                messages += unpack_raw_messages(data[pos:end], 0, records)
            pos = end
    except struct.error:
        pos = -1
    if pos != size or len(messages) != count:
        raise WALCorruption(f"stream chunk entries do not add up to its {count} messages")
    return messages


def unpack_stream_entries(data: bytes, count: int) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """The ``count`` messages :func:`pack_stream_entries` packed into ``data``.

    :raises WALCorruption: ``data`` does not hold exactly ``count`` of them
    """
    return as_entries(unpack_stream_messages(data, 0, count))


def as_entries(messages: list[tuple[bytes, bytes, bytes]]) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """Messages as :func:`unpack_stream_messages` gives them, each with its names split into
    the exchange and the routing key (as :func:`pack_stream_entries` takes them)."""
    return [(names[1 : 1 + names[0]], names[2 + names[0] :], header, body) for names, header, body in messages]

"""A segment file of the write-ahead log: its header, and scanning the records that follow.

A segment file starts with a 16-byte header: :data:`MAGIC` (whose last byte is the format
version) and the segment number as a big-endian u64; then framed records
(:mod:`broker.wal.codec`). The framing follows LevelDB's log format (``doc/log_format.md``: a
checksum, a length and a type in front of each payload) without its 32 KiB blocks: a damaged
record is skipped by :func:`scan`ning forward for the next place where a header, a sane length
and a matching CRC line up.

Standard library only: ``spark/`` scans archived segments with it.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from postroom.broker.wal.codec import MAX_RECORD_BYTES, RECORD_HEADER, RECORD_HEADER_BYTES, Buffer, decode
from postroom.broker.wal.crc import TYPE_CRC
from postroom.broker.wal.records import Record, RecordType, WALCorruption

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "SEGMENT_HEADER_BYTES",
    "segment_header",
    "parse_segment_header",
    "ScanResult",
    "iter_records",
    "scan",
]

#: Version of the record format; the last byte of :data:`MAGIC`. A reader refuses other versions
#: rather than guess: a newer writer may have changed any payload.
FORMAT_VERSION = 1

#: The first 8 bytes of every segment file: "PRWAL", two zero bytes, the format version.
MAGIC = b"PRWAL\x00\x00" + bytes((FORMAT_VERSION,))

_U32 = struct.Struct(">I")
_SEGMENT_HEADER = struct.Struct(">8sQ")

#: Size of a segment file's header (magic and segment number).
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size


def segment_header(number: int) -> bytes:
    """The 16-byte header of segment ``number``.

    :raises ValueError: ``number`` is negative or over 64 bits
    """
    try:
        return _SEGMENT_HEADER.pack(MAGIC, number)
    except struct.error as err:
        raise ValueError(f"bad segment number {number}: {err}") from err


def parse_segment_header(data: Buffer) -> int:
    """The segment number in the header at the start of ``data``.

    :raises WALCorruption: ``data`` is shorter than a header, or does not start with
        :data:`MAGIC` (not a segment, or another format version)
    """
    if len(data) < SEGMENT_HEADER_BYTES:
        raise WALCorruption("truncated segment header", offset=0)
    magic, number = _SEGMENT_HEADER.unpack_from(data, 0)
    if magic[:7] == MAGIC[:7] and magic != MAGIC:
        raise WALCorruption(f"unsupported format version {magic[7]} (this reader knows {FORMAT_VERSION})", offset=0)
    if magic != MAGIC:
        raise WALCorruption(f"bad magic {magic!r}", offset=0)
    return int(number)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What :func:`scan` found.

    ``records`` are ``(offset, end_offset, record)``; ``end`` is where valid data stops. When
    ``end`` is before the end of the data, ``problem`` says why and ``resync`` is the offset of
    the next valid record, or None when none follows (a torn tail, if this is the last segment).
    """

    records: list[tuple[int, int, Record]]
    end: int
    problem: str | None
    resync: int | None


def _walk(data: bytes, start: int) -> Generator[tuple[int, int, Record], None, tuple[int, str | None]]:
    """Yield the valid records from ``start``; return ``(offset, problem)`` where they stop.

    Cost O(bytes): one CRC pass and one decode pass over each record.
    """
    size = len(data)
    pos = start
    while pos < size:
        if size - pos < RECORD_HEADER_BYTES:
            return pos, "truncated header"
        length, crc, record_type = RECORD_HEADER.unpack_from(data, pos)
        # Checked before the payload is touched: a garbage length must not make us read (or, in
        # a streaming reader, allocate) up to 4 GiB.
        if length > MAX_RECORD_BYTES:
            return pos, "length over limit"
        payload_at = pos + RECORD_HEADER_BYTES
        end = payload_at + length
        if end > size:
            return pos, "truncated payload"
        payload = data[payload_at:end]
        if zlib.crc32(payload, TYPE_CRC[record_type]) != crc:
            return pos, "bad crc"
        try:
            record = decode(record_type, payload)
        except WALCorruption as err:
            return pos, f"malformed payload: {err.reason}"
        yield pos, end, record
        pos = end
    return pos, None


def iter_records(data: Buffer, start: int = 0) -> Iterator[tuple[int, int, Record]]:
    """Yield ``(offset, end_offset, record)`` for each valid record from ``start``.

    Stops, without raising, at the first position where no complete valid record starts (the
    end of the data, a torn tail or damage); :func:`scan` says which.

    :param data: segment bytes (pass ``start=SEGMENT_HEADER_BYTES`` for a whole segment file);
        anything but ``bytes`` is copied once
    :param start: offset of the first record
    """
    yield from _walk(data if type(data) is bytes else bytes(data), start)


# A record can only start where the length's top byte fits MAX_RECORD_BYTES and the type byte
# is a known type; this lookahead finds such positions in C, so resynchronising over a 64 MiB
# segment of garbage does not run a Python loop per byte.
_CANDIDATE = re.compile(
    b"(?=[\\x00-%c][\\x00-\\xff]{7}[%c-%c])" % (MAX_RECORD_BYTES >> 24, min(RecordType), max(RecordType)),
)


def _is_record_at(data: bytes, pos: int) -> bool:
    """Whether a complete valid record (header, sane length, matching CRC, decodable) starts at ``pos``."""
    size = len(data)
    if size - pos < RECORD_HEADER_BYTES:
        return False
    length, crc, record_type = RECORD_HEADER.unpack_from(data, pos)
    end = pos + RECORD_HEADER_BYTES + length
    if length > MAX_RECORD_BYTES or end > size:
        return False
    payload = data[pos + RECORD_HEADER_BYTES : end]
    if zlib.crc32(payload, TYPE_CRC[record_type]) != crc:
        return False
    try:
        decode(record_type, payload)
    except WALCorruption:
        return False
    return True


def _resync(data: bytes, bad: int) -> int | None:
    """The offset of the first valid record after the damaged one at ``bad``, or None.

    First tries where the damaged record claims to end: bit rot in a payload leaves the length
    right, and then the next record is there (and no search runs through the damaged payload).
    Otherwise scans forward byte by byte. Cost O(n) candidate tests for n bytes left, each
    O(1) unless its length and CRC need checking; worst case O(n * record size), paid only
    when the log is damaged.
    """
    size = len(data)
    if size - bad >= RECORD_HEADER_BYTES:
        length: int = _U32.unpack_from(data, bad)[0]
        claimed = bad + RECORD_HEADER_BYTES + length
        if length <= MAX_RECORD_BYTES and claimed < size and _is_record_at(data, claimed):
            return claimed
    for match in _CANDIDATE.finditer(data, bad + 1):
        if _is_record_at(data, match.start()):
            return match.start()
    return None


def scan(data: Buffer, start: int = 0) -> ScanResult:
    """Read the valid records from ``start`` and explain where and why they stop.

    A bad record followed by no valid record is a torn tail (if this is the last segment);
    one followed by a valid record (``resync``) is corruption in the middle. Call again with
    ``start=resync`` to read past the damage.

    :param data: segment bytes; anything but ``bytes`` is copied once
    :param start: offset of the first record
    """
    if type(data) is not bytes:
        data = bytes(data)
    records: list[tuple[int, int, Record]] = []
    walk = _walk(data, start)
    while True:
        try:
            records.append(next(walk))
        except StopIteration as stop:
            end, problem = stop.value
            break
    resync = _resync(data, end) if problem is not None else None
    return ScanResult(records, end, problem, resync)

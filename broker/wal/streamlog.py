"""A stream's log: its messages in order, each at an offset, in segment files of its own.

A stream (``x-queue-type: stream``) keeps every message it is given, in chunks: the messages
appended together (one group commit) form one :class:`~broker.wal.records.StreamChunk` record,
in the write-ahead log's record format (length, CRC, type), in numbered segments with the
log's segment header. Offsets start at 0 and stay with their messages for the stream's life:
a chunk records its first offset, so they survive restarts and the removal of old segments.

Reading never needs the whole stream in memory: a reader is placed with :meth:`StreamLog.locate`
(an offset) or :meth:`StreamLog.locate_time` (a timestamp) and reads chunks from there with
:meth:`StreamLog.read`, through the storage's ``read_at``. A sparse index per segment (a
chunk's place every :data:`INDEX_EVERY` bytes) keeps placing a reader cheap; a segment's index
is built when a reader first needs it.

Retention (:meth:`StreamLog.retain`) removes whole segments from the head, never the one being
appended to, by size and by age, as RabbitMQ's streams do (``osiris_log:evaluate_retention``).

Threads: the broker's thread places chunks (:meth:`StreamLog.stage`), drops old segments
(:meth:`StreamLog.retain`) and reads (``locate``, ``locate_time``, ``next_chunk``, ``read``);
the log's writer thread writes what was staged (:meth:`StreamLog.write`) and deletes the
files of dropped segments (:meth:`StreamLog.remove`). Nothing reads a chunk before its write
has returned (segments only grow, so a read does not race a later write).
"""

from __future__ import annotations

import bisect
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from postroom.broker.wal.chunks import (
    RAW,
    STREAM_CHUNK_HEAD,
    STREAM_CHUNK_OVERHEAD,
    STREAM_CHUNK_TYPES,
    STREAM_TRACKED_TYPES,
    TRACKING_SEQUENCE,
    TRACKING_SNAPSHOT,
    as_entries,
    pack_stream_entries,
    stream_chunk_pieces,
    unpack_batched_messages,
    unpack_raw_messages,
    unpack_stream_messages,
    unpack_tracking,
)
from postroom.broker.wal.codec import MAX_RECORD_BYTES, RECORD_HEADER_BYTES, decode
from postroom.broker.wal.crc import crc32_before, stream_entries_crc
from postroom.broker.wal.files import ISegmentStorage
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.records import StreamBatchChunk, StreamChunk, StreamRawChunk, StreamTrackedChunk, WALCorruption
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, parse_segment_header, segment_header

__all__ = ["DEFAULT_STREAM_SEGMENT_BYTES", "ENTRIES_AT", "INDEX_EVERY", "Chunk", "Region", "Staged", "StreamLog"]

#: A segment is rolled once it holds this many bytes (RabbitMQ's default for
#: ``x-stream-max-segment-size-bytes``).
DEFAULT_STREAM_SEGMENT_BYTES = 500_000_000

#: The sparse index keeps the place of one chunk in every this many bytes of a segment.
INDEX_EVERY = 64 << 10

_RECORD_HEAD = struct.Struct(">IIB")  # length, crc, type
#: Where a chunk's packed entries start in its record payload (:meth:`StreamLog.read_entries`).
ENTRIES_AT = _ENTRIES_AT = STREAM_CHUNK_HEAD.size
#: Each chunk record type's CRC seed.
_CHUNK_CRCS = {kind: zlib.crc32(bytes((kind,))) for kind in (*STREAM_CHUNK_TYPES, *STREAM_TRACKED_TYPES)}
#: Each chunk record type's kind (:attr:`Chunk.raw`).
_KINDS = {
    **{kind: at for at, kind in enumerate(STREAM_CHUNK_TYPES)},
    **{kind: at for at, kind in enumerate(STREAM_TRACKED_TYPES)},
}
_TRACKED = frozenset(STREAM_TRACKED_TYPES)
#: Bytes read to learn a chunk's place: its record header and its head.
_PEEK = RECORD_HEADER_BYTES + STREAM_CHUNK_HEAD.size
#: Where a chunk may start: a sane length's top byte, then the chunk type byte (found in C, so
#: looking past damage does not run a Python loop per byte).
_CANDIDATE = re.compile(b"(?=[\\x00-%c][\\x00-\\xff]{7}[%s])" % (MAX_RECORD_BYTES >> 24, bytes(_CHUNK_CRCS)))


@dataclass(frozen=True, slots=True)
class Chunk:
    """Where a chunk is, and which offsets it holds."""

    first_offset: int
    count: int
    timestamp: float
    segment: int
    position: int
    #: Bytes of its record (header included): the next chunk starts at ``position + length``.
    length: int
    #: Its kind: 0 for a :class:`~broker.wal.records.StreamChunk`, :data:`~broker.wal.chunks.RAW`
    #: for a :class:`~broker.wal.records.StreamRawChunk` (stream-protocol messages as simple
    #: entries), :data:`~broker.wal.chunks.BATCHED` for a
    #: :class:`~broker.wal.records.StreamBatchChunk` (sub-entry batches among them).
    raw: int = 0
    #: Bytes of its trailer (:class:`~broker.wal.records.StreamTrackedChunk`), after its entries
    #: and their length; 0: it has none.
    trailer: int = 0

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.count

    @property
    def tail(self) -> int:
        """Bytes of its record after its entries (the trailer and its length)."""
        return 4 + self.trailer if self.trailer else 0


class Region:
    """Where a chunk's entries are in its segment: to send them as they are stored."""

    __slots__ = ("storage", "segment", "offset", "length")

    def __init__(self, storage: ISegmentStorage, segment: int, offset: int, length: int) -> None:
        self.storage = storage
        self.segment = segment
        self.offset = offset
        self.length = length

    @property
    def sendable(self) -> bool:
        """Whether its storage sends from the file itself (:meth:`send`)."""
        return hasattr(self.storage, "send_at")

    def read(self, start: int = 0) -> bytes:
        """Its bytes from ``start`` on.

        :raises OSError: the storage failed (or its segment was removed)
        """
        return self.storage.read_at(self.segment, self.offset + start, self.length - start)

    def send(self, out: int, start: int = 0) -> int:
        """Send its bytes from ``start`` on to the socket ``out``, as many as it takes now.

        :raises BlockingIOError: the socket takes nothing now
        :raises OSError: the storage or the socket failed
        """
        return int(self.storage.send_at(self.segment, self.offset + start, self.length - start, out))  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"Region({self.segment}, {self.offset}, {self.length})"


class Staged:
    """A chunk :meth:`StreamLog.stage` placed, for :meth:`StreamLog.write` to write.

    Its record is encoded when first asked for (:attr:`data`): by the writer, off the thread
    that staged it.
    """

    __slots__ = ("chunk", "roll", "_entries", "_data", "_trailer")

    def __init__(self, chunk: Chunk, entries: bytes | list[bytes], roll: bool, trailer: bytes = b"") -> None:
        self.chunk = chunk
        #: Whether it opens a new segment.
        self.roll = roll
        self._entries = entries
        self._data: list[bytes] | None = None
        self._trailer = trailer

    @property
    def data(self) -> list[bytes]:
        """Its record's bytes (``chunk.length`` of them), in pieces (:func:`~broker.wal.chunks.stream_chunk_pieces`)."""
        if self._data is None:
            chunk = self.chunk
            self._data = stream_chunk_pieces(
                chunk.first_offset, chunk.timestamp, chunk.count, self._entries, chunk.raw, self._trailer
            )
            self._entries = b""
        return self._data

    def __repr__(self) -> str:
        return f"Staged({self.chunk!r}, roll={self.roll!r})"


@dataclass(slots=True)
class _Segment:
    number: int
    size: int
    #: The first chunk's offset and timestamp (``None``: the segment holds no chunk yet).
    first_offset: int | None = None
    first_timestamp: float = 0.0
    #: ``(first offset, timestamp, position)`` of a chunk in every :data:`INDEX_EVERY` bytes,
    #: the first chunk included; ``None`` until a reader needs it (older segments).
    index: list[tuple[int, float, int]] | None = None
    #: The last chunk read or appended here (the active segment's, after :meth:`StreamLog.open`).
    last: Chunk | None = field(default=None)


class StreamLog:
    """One stream's chunks over ``storage`` (see the module's docstring).

    :param storage: the stream's own segments
    :param segment_bytes: roll to a new segment once the active one holds this many bytes
    """

    def __init__(self, storage: ISegmentStorage, segment_bytes: int = DEFAULT_STREAM_SEGMENT_BYTES) -> None:
        self.storage = storage
        self.segment_bytes = segment_bytes
        self._log = WriteAheadLog(storage, max(segment_bytes, SEGMENT_HEADER_BYTES + 1))
        self._segments: list[_Segment] = []
        #: The offset the next message gets.
        self.next_offset = 0
        #: Bytes of torn tail cut at :meth:`open`.
        self.truncated = 0
        #: The end of what :meth:`write` has written: ``(segment, position)``.
        self._written = (0, 0)
        #: Each stream-protocol publisher's last publishing id, from the trailers of the last
        #: segment's chunks (read at :meth:`open`; the first chunk of a segment has every
        #: publisher's).
        self.tracking: dict[str, int] = {}

    # -- opening ------------------------------------------------------------------------------

    def open(self) -> None:
        """Recover the stream: cut a torn tail off its last segment (a chunk whose append was
        never synced, so never confirmed), learn where each segment starts, and make the last
        segment the one appended to. Reads the last segment once, a block at a time, and the
        first chunk's head of each other segment.

        :raises WALCorruption: a segment header is bad, or a damaged chunk in the last segment
            is followed by a valid one (confirmed messages may be lost: the operator decides)
        :raises OSError: the storage failed
        """
        storage = self.storage
        numbers = storage.list_segments()
        if not numbers:
            self._log.open()
            self._segments = [_Segment(1, SEGMENT_HEADER_BYTES, index=[])]
            self._written = (1, SEGMENT_HEADER_BYTES)
            return
        for number in numbers[:-1]:
            segment = _Segment(number, storage.size(number))
            self._check_header(segment)
            head = self._peek(segment, SEGMENT_HEADER_BYTES)
            if head is not None:
                segment.first_offset, segment.first_timestamp = head.first_offset, head.timestamp
            self._segments.append(segment)
        last = self._recover_last(numbers[-1])
        self._segments.append(last)
        self._log.open_at(last.number, last.size)
        self._written = (last.number, last.size)
        if last.last is not None:
            self.next_offset = last.last.next_offset
        else:
            previous = next((s for s in reversed(self._segments[:-1]) if s.first_offset is not None), None)
            if previous is not None:
                self.next_offset = self._scan_to_end(previous).next_offset

    def _check_header(self, segment: _Segment) -> None:
        data = self.storage.read_at(segment.number, 0, SEGMENT_HEADER_BYTES)
        try:
            found = parse_segment_header(data)
        except WALCorruption as error:
            raise WALCorruption(error.reason, segment.number, 0) from None
        if found != segment.number:
            raise WALCorruption(f"header says segment {found}", segment.number, 0)

    def _recover_last(self, number: int) -> _Segment:
        """Read the last segment's chunks, index them, and cut a torn tail."""
        storage = self.storage
        size = storage.size(number)
        header = segment_header(number)
        head = storage.read_at(number, 0, min(size, SEGMENT_HEADER_BYTES))
        if (size < SEGMENT_HEADER_BYTES and header.startswith(head)) or (
            # Some file systems show zeros where data never reached the disk.
            head.count(0) == len(head) and storage.read_at(number, 0, size).count(0) == size
        ):
            # Created, and its header never synced: start it again.
            storage.truncate(number, 0)
            storage.append(number, header)
            storage.sync(number)
            self.truncated += size
            return _Segment(number, SEGMENT_HEADER_BYTES, index=[])
        segment = _Segment(number, size, index=[])
        self._check_header(segment)
        position = SEGMENT_HEADER_BYTES
        while position < size:
            chunk = self._read_chunk(number, position, size)
            if chunk is None:
                self._torn(number, position, size)
                segment.size = position
                break
            self._indexed(segment, chunk)
            position += chunk.length
        return segment

    def _torn(self, number: int, position: int, size: int) -> None:
        """A chunk that does not read at ``position``: cut it and what follows if no valid
        chunk follows (a torn append), else refuse (damage in the middle)."""
        data = self.storage.read_at(number, position, size - position)
        for match in _CANDIDATE.finditer(data, 1):
            if self._valid_at(data, match.start()):
                follows = position + match.start()
                raise WALCorruption(f"damaged chunk (valid chunk at offset {follows})", number, position)
        self.storage.truncate(number, position)
        self.storage.sync(number)
        self.truncated += size - position

    @staticmethod
    def _valid_at(data: bytes, start: int) -> bool:
        length, crc, record_type = _RECORD_HEAD.unpack_from(data, start)
        end = start + RECORD_HEADER_BYTES + length
        if record_type not in _CHUNK_CRCS or length > MAX_RECORD_BYTES or end > len(data):
            return False
        return bool(zlib.crc32(data[start + RECORD_HEADER_BYTES : end], _CHUNK_CRCS[record_type]) == crc)

    def _read_chunk(self, number: int, position: int, size: int) -> Chunk | None:
        """The chunk at ``position`` if a whole valid one is there (CRC checked), else ``None``."""
        if size - position < _PEEK:
            return None
        head = self.storage.read_at(number, position, RECORD_HEADER_BYTES)
        length, crc, record_type = _RECORD_HEAD.unpack(head)
        end = position + RECORD_HEADER_BYTES + length
        if record_type not in _CHUNK_CRCS or length > MAX_RECORD_BYTES or end > size:
            return None
        payload = self.storage.read_at(number, position + RECORD_HEADER_BYTES, length)
        if len(payload) != length or zlib.crc32(payload, _CHUNK_CRCS[record_type]) != crc:
            return None
        try:
            record = decode(record_type, payload)
        except WALCorruption:
            return None
        assert isinstance(record, (StreamChunk, StreamRawChunk, StreamBatchChunk, StreamTrackedChunk))
        kind = _KINDS[record_type]
        trailer = b""
        if isinstance(record, StreamTrackedChunk):  # (and its raw and batched kinds)
            trailer = record.trailer
            try:
                tracked = unpack_tracking(trailer)
            except WALCorruption:
                return None
            for entry_type, reference, value in tracked:
                if entry_type & ~TRACKING_SNAPSHOT == TRACKING_SEQUENCE:
                    self.tracking[reference] = max(value, self.tracking.get(reference, value))
        return Chunk(
            record.first_offset, record.count, record.timestamp, number, position, end - position, kind, len(trailer)
        )

    def _peek(self, segment: _Segment, position: int) -> Chunk | None:
        """The place of the chunk at ``position`` from its head alone (no CRC check: the
        segment was recovered or written by this process)."""
        if segment.size - position < _PEEK:
            return None
        head = self.storage.read_at(segment.number, position, _PEEK)
        length, _crc, record_type = _RECORD_HEAD.unpack_from(head)
        if record_type not in _CHUNK_CRCS:
            raise WALCorruption("not a stream chunk", segment.number, position)
        first_offset, timestamp, count, size = STREAM_CHUNK_HEAD.unpack_from(head, RECORD_HEADER_BYTES)
        kind = _KINDS[record_type]
        trailer = length - _ENTRIES_AT - size - 4 if record_type in _TRACKED else 0
        return Chunk(
            first_offset, count, timestamp, segment.number, position, RECORD_HEADER_BYTES + length, kind, trailer
        )

    @staticmethod
    def _indexed(segment: _Segment, chunk: Chunk) -> None:
        """``chunk`` is the segment's newest: note it (and in the sparse index, now and then)."""
        if segment.first_offset is None:
            segment.first_offset, segment.first_timestamp = chunk.first_offset, chunk.timestamp
        index = segment.index
        if index is not None and (not index or chunk.position - index[-1][2] >= INDEX_EVERY):
            index.append((chunk.first_offset, chunk.timestamp, chunk.position))
        segment.last = chunk

    def _index_of(self, segment: _Segment) -> list[tuple[int, float, int]]:
        """The segment's sparse index, built from its chunk heads when first needed."""
        if segment.index is None:
            built: list[tuple[int, float, int]] = []
            position = SEGMENT_HEADER_BYTES
            last = None
            while True:
                chunk = self._peek(segment, position)
                if chunk is None:
                    break
                if not built or position - built[-1][2] >= INDEX_EVERY:
                    built.append((chunk.first_offset, chunk.timestamp, position))
                last = chunk
                position += chunk.length
            segment.index = built
            segment.last = last
        return segment.index

    def _scan_to_end(self, segment: _Segment) -> Chunk:
        self._index_of(segment)
        assert segment.last is not None
        return segment.last

    # -- what it holds ------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The offset of the oldest message held (:attr:`next_offset` when it holds none)."""
        for segment in self._segments:
            if segment.first_offset is not None:
                return segment.first_offset
        return self.next_offset

    @property
    def size(self) -> int:
        """Bytes in the stream's segments."""
        return sum(segment.size for segment in self._segments)

    @property
    def segments(self) -> list[int]:
        """The segments' numbers, oldest first (the last one is appended to)."""
        return [segment.number for segment in self._segments]

    def last_chunk(self) -> Chunk | None:
        """The newest chunk (where RabbitMQ's ``last`` offset attaches), if there is one."""
        segments = self._holding()
        return self._scan_to_end(segments[-1]) if segments else None

    # -- appending ----------------------------------------------------------------------------

    def stage(self, entries: Iterable[tuple[bytes, bytes, bytes, bytes]], timestamp: float) -> Staged:
        """Place one chunk of messages (exchange, routing key, content header, body each) at
        the next offsets, after every chunk staged before it, in a new segment when the last
        one is full. Nothing is written: :meth:`write` does that (and nothing may read the
        chunk before it has).

        :raises ValueError: no entries
        """
        entries = list(entries)
        return self.stage_packed(pack_stream_entries(entries), len(entries), timestamp)

    def stage_packed(
        self,
        packed: bytes | list[bytes],
        count: int,
        timestamp: float,
        raw: int = 0,
        trailer: bytes = b"",
        snapshot: Callable[[], bytes] | None = None,
    ) -> Staged:
        """:meth:`stage` of ``count`` messages already packed, whole or in pieces to be joined
        (:func:`~broker.wal.chunks.pack_stream_entries` or
        :func:`~broker.wal.chunks.pack_stream_messages`; with ``raw`` :data:`~broker.wal.chunks.RAW`,
        :func:`~broker.wal.chunks.pack_raw_entries`, as a :class:`~broker.wal.records.StreamRawChunk`;
        with :data:`~broker.wal.chunks.BATCHED`, simple entries and sub-entry batches, as a
        :class:`~broker.wal.records.StreamBatchChunk`), with ``trailer`` after them (a
        :class:`~broker.wal.records.StreamTrackedChunk`), and when the chunk opens a segment,
        what ``snapshot()`` gives after that.

        :raises ValueError: no messages
        """
        if not count:
            raise ValueError("a chunk holds at least one message")
        entries = STREAM_CHUNK_OVERHEAD + (len(packed) if isinstance(packed, bytes) else sum(map(len, packed)))
        active = self._segments[-1]
        roll = active.size + entries + (4 + len(trailer) if trailer else 0) > self.segment_bytes
        roll = roll and active.first_offset is not None
        if roll and snapshot is not None:
            trailer += snapshot()
        length = entries + (4 + len(trailer) if trailer else 0)
        if length - RECORD_HEADER_BYTES > MAX_RECORD_BYTES:
            raise ValueError(f"StreamChunk payload of {length - RECORD_HEADER_BYTES} bytes is over {MAX_RECORD_BYTES}")
        if roll:
            active = _Segment(active.number + 1, SEGMENT_HEADER_BYTES, index=[])
            self._segments.append(active)
        chunk = Chunk(self.next_offset, count, timestamp, active.number, active.size, length, raw, len(trailer))
        active.size += length
        self._indexed(active, chunk)
        self.next_offset = chunk.next_offset
        return Staged(chunk, packed, roll, trailer)

    def write(self, staged: Iterable[Staged]) -> None:
        """Write staged chunks, in the order they were staged, and make them durable (one
        ``fsync`` per segment written). After a failure, call again with the same chunks and
        those after them: what was written is not written twice.

        :raises OSError: the storage failed
        """
        for item in staged:
            if item.roll and self._log.active < item.chunk.segment:
                self._log.rotate()
            if (item.chunk.segment, item.chunk.position) < self._written:
                continue
            self._log.append(item.data)
            self._written = (item.chunk.segment, item.chunk.position + item.chunk.length)
        self._log.sync()

    def append(self, entries: Iterable[tuple[bytes, bytes, bytes, bytes]], timestamp: float) -> Chunk:
        """Stage one chunk and write it, on one thread (see :meth:`stage` and :meth:`write`)."""
        staged = self.stage(entries, timestamp)
        self.write((staged,))
        return staged.chunk

    # -- reading ------------------------------------------------------------------------------

    def locate(self, offset: int) -> Chunk | None:
        """The chunk holding ``offset``, or the first one after it (an offset removed by
        retention: the oldest chunk); ``None`` when ``offset`` is at or past the end."""
        segments = self._holding()
        if offset >= self.next_offset or not segments:
            return None
        at = max(0, bisect.bisect_right([s.first_offset or 0 for s in segments], offset) - 1)
        return self._find(segments[at], 0, offset, lambda chunk: chunk.next_offset > offset)

    def locate_time(self, timestamp: float) -> Chunk | None:
        """The first chunk appended at ``timestamp`` or later; ``None`` when none was."""
        segments = self._holding()
        at = max(0, bisect.bisect_right([s.first_timestamp for s in segments], timestamp) - 1)
        for segment in segments[at:]:
            chunk = self._find(segment, 1, timestamp, lambda chunk: chunk.timestamp >= timestamp)
            if chunk is not None:
                return chunk
        return None

    def _holding(self) -> list[_Segment]:
        """The segments that hold a chunk, oldest first."""
        return [segment for segment in self._segments if segment.first_offset is not None]

    def _find(self, segment: _Segment, field: int, value: float, wanted: Callable[[Chunk], bool]) -> Chunk | None:
        """The first chunk of ``segment`` that is ``wanted``, looked for from the last place in
        its sparse index whose ``field`` (0: first offset, 1: timestamp) is at most ``value``."""
        index = self._index_of(segment)
        place = max(0, bisect.bisect_right([entry[field] for entry in index], value) - 1)
        position = index[place][2]
        while (chunk := self._peek(segment, position)) is not None:
            if wanted(chunk):
                return chunk
            position += chunk.length
        return None

    def next_chunk(self, chunk: Chunk) -> Chunk | None:
        """The chunk after ``chunk``; ``None`` at the end (or once ``chunk`` was removed)."""
        for index, segment in enumerate(self._segments):
            if segment.number == chunk.segment:
                following = self._peek(segment, chunk.position + chunk.length)
                if following is not None:
                    return following
                for later in self._segments[index + 1 :]:
                    if later.first_offset is not None:
                        return self._peek(later, SEGMENT_HEADER_BYTES)
                return None
        return self.locate(chunk.next_offset)

    def read(self, chunk: Chunk) -> list[tuple[bytes, bytes, bytes, bytes]]:
        """The messages of ``chunk`` (exchange, routing key, content header, body each), but
        those of compressed sub-entry batches (which only the stream protocol's clients read).

        :raises WALCorruption: the chunk's bytes are damaged
        :raises OSError: the storage failed (or its segment was removed)
        """
        return as_entries([message for message in self.read_messages(chunk) if message is not None])

    def read_messages(self, chunk: Chunk) -> Sequence[tuple[bytes, bytes, bytes] | None]:
        """The messages of ``chunk`` as :func:`~broker.wal.chunks.unpack_stream_messages` gives
        them (``names``, content header, body each), for delivery: one for each offset, ``None``
        where it is in a compressed sub-entry batch
        (:func:`~broker.wal.chunks.unpack_batched_messages`).

        :raises WALCorruption: the chunk's bytes are damaged
        :raises OSError: the storage failed (or its segment was removed)
        """
        if chunk.raw == RAW:
            return unpack_raw_messages(self.read_entries(chunk), _ENTRIES_AT, chunk.count)
        if chunk.raw:
            return unpack_batched_messages(self.read_entries(chunk), _ENTRIES_AT, chunk.count)
        return unpack_stream_messages(self.read_entries(chunk), _ENTRIES_AT, chunk.count)

    def read_entries(self, chunk: Chunk) -> bytes:
        """``chunk``'s record payload, its packed entries from :data:`ENTRIES_AT` on (checked
        against what its head says, not decoded).

        :raises WALCorruption: the chunk's bytes are damaged
        :raises OSError: the storage failed (or its segment was removed)
        """
        payload = self.storage.read_at(
            chunk.segment, chunk.position + RECORD_HEADER_BYTES, chunk.length - RECORD_HEADER_BYTES - chunk.tail
        )
        if len(payload) < _ENTRIES_AT:
            raise WALCorruption(f"stream chunk at offset {chunk.first_offset}: {len(payload)} bytes")
        first_offset, _timestamp, count, length = STREAM_CHUNK_HEAD.unpack_from(payload)
        if (first_offset, count, length) != (chunk.first_offset, chunk.count, len(payload) - _ENTRIES_AT):
            raise WALCorruption(f"stream chunk at offset {chunk.first_offset} does not hold what its head says")
        return payload

    def entries_region(self, chunk: Chunk) -> tuple[int, Region]:
        """Where ``chunk``'s packed entries are, and their CRC-32 (osiris's, worked out from the
        record's own: the entries are not read).

        :raises WALCorruption: the chunk's head is damaged
        :raises OSError: the storage failed (or its segment was removed)
        """
        head = self.storage.read_at(chunk.segment, chunk.position, RECORD_HEADER_BYTES + STREAM_CHUNK_HEAD.size)
        length, crc, record_type = _RECORD_HEAD.unpack_from(head)
        first_offset, _timestamp, count, size = STREAM_CHUNK_HEAD.unpack_from(head, RECORD_HEADER_BYTES)
        if (first_offset, count, length, _KINDS.get(record_type)) != (
            chunk.first_offset,
            chunk.count,
            chunk.length - RECORD_HEADER_BYTES,
            chunk.raw,
        ) or size != length - _ENTRIES_AT - chunk.tail:
            raise WALCorruption(f"stream chunk at offset {chunk.first_offset} does not hold what its head says")
        entries_crc = stream_entries_crc(crc, record_type, head[RECORD_HEADER_BYTES:], size + chunk.tail)
        if chunk.tail:
            # (the record's CRC runs over the trailer too: run back over it)
            at = chunk.position + RECORD_HEADER_BYTES + _ENTRIES_AT + size
            tail = self.storage.read_at(chunk.segment, at, chunk.tail)
            if len(tail) != chunk.tail:
                raise WALCorruption(f"stream chunk at offset {chunk.first_offset} is cut short")
            entries_crc = crc32_before(entries_crc, tail)
        return entries_crc, Region(
            self.storage, chunk.segment, chunk.position + RECORD_HEADER_BYTES + _ENTRIES_AT, size
        )

    def read_trailer(self, chunk: Chunk) -> bytes:
        """``chunk``'s trailer (:func:`~broker.wal.chunks.pack_tracking`'s entries; empty when
        it has none).

        :raises OSError: the storage failed (or its segment was removed)
        """
        if not chunk.trailer:
            return b""
        return self.storage.read_at(chunk.segment, chunk.position + chunk.length - chunk.trailer, chunk.trailer)

    # -- retention ----------------------------------------------------------------------------

    def retain(self, max_bytes: int | None, max_age: float | None, now: float) -> list[int]:
        """Drop whole segments from the head, never the last one: while the stream is over
        ``max_bytes`` (the newest segments are kept while they fit), and those whose newest
        chunk is older than ``max_age`` seconds. Readers no longer find them; their files go
        with :meth:`remove`. Returns their numbers.
        """
        segments = self._segments
        drop = 0
        if max_bytes is not None:
            kept = 0
            for at in range(len(segments) - 1, -1, -1):
                kept += segments[at].size
                if kept > max_bytes and at < len(segments) - 1:
                    drop = at + 1
                    break
        if max_age is not None:
            cutoff = now - max_age
            for at in range(drop, len(segments) - 1):
                following = segments[at + 1]
                # The next segment's first chunk came after this one's newest.
                newest = following.first_timestamp if following.first_offset is not None else now
                if newest >= cutoff:
                    break
                drop = at + 1
        dropped = [segment.number for segment in segments[:drop]]
        del segments[:drop]
        return dropped

    def remove(self, numbers: Iterable[int]) -> None:
        """Delete the files of segments :meth:`retain` dropped (on the thread that writes).

        :raises OSError: the storage failed (the segments before the failing one are removed)
        """
        for number in numbers:
            self._log.retire(number)

    def sync(self) -> None:
        """Make every chunk written durable (:meth:`write` does so already)."""
        self._log.sync()

"""The write-ahead log: numbered segments of framed records over an :class:`ISegmentStorage`.

:class:`WriteAheadLog` recovers the log (:meth:`~WriteAheadLog.open`), then appends encoded
records to the active (last) segment, syncs it and rotates to a new segment when it is full.
:func:`check` and :func:`dump` read a log without changing it, for operators.

Recovery rules (LevelDB's log reader has the same two cases, ``doc/log_format.md``):

* A bad record with no valid record after it in the **last** segment is a *torn tail*: the
  crash interrupted an append that was never synced, hence never confirmed. It is truncated and
  reported; nothing confirmed is lost.
* Any other bad record (in an earlier segment, or followed by a valid record) is *corruption*:
  it may hold confirmed data, so :meth:`~WriteAheadLog.open` raises :exc:`WALCorruption` unless
  the operator asks to repair, which skips the damaged bytes and keeps what follows.

The log is single-threaded: the broker calls :meth:`~WriteAheadLog.append`,
:meth:`~WriteAheadLog.sync` and :meth:`~WriteAheadLog.rotate` from one writer thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields

from postroom.broker.wal.files import ISegmentStorage
from postroom.broker.wal.records import RECORD_CLASSES, Published, Record, WALCorruption
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, parse_segment_header, scan, segment_header

__all__ = ["DEFAULT_SEGMENT_BYTES", "RecoveryReport", "WriteAheadLog", "check", "dump"]

#: Rotate after this many bytes. Big enough that rotation (an fsync, a file create and a
#: topology snapshot) is rare next to appends, small enough that a retired segment is a
#: convenient unit for the archive and the Spark job, and that recovery rereads little past the
#: last snapshot. One record may overshoot it (a 64 MiB body makes a segment of about 128 MiB).
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery (or :func:`check`) found.

    :ivar segments: segments in the log (after :meth:`WriteAheadLog.open`, counting a segment
        it created)
    :ivar records: valid records read
    :ivar bytes: bytes of valid content (segment headers and records kept)
    :ivar truncated_bytes: bytes of torn tail cut from the last segment (by :func:`check`:
        that would be cut)
    :ivar torn_at: ``(segment, offset)`` where the torn tail began, or None
    :ivar skipped_spans: damaged spans skipped (only with ``repair=True``, or by :func:`check`)
    :ivar problems: one line per damaged span or unreadable segment
    """

    segments: int
    records: int
    bytes: int
    truncated_bytes: int
    torn_at: tuple[int, int] | None
    skipped_spans: int
    problems: tuple[str, ...]


@dataclass(slots=True)
class _Segment:
    """What reading one segment found; the caller decides what to do about it."""

    number: int
    size: int
    records: list[tuple[int, int, Record]] = field(default_factory=list)
    #: Byte ranges of valid records, in order; the first starts right after the header.
    spans: list[tuple[int, int]] = field(default_factory=list)
    #: ``(offset, problem, resync)`` of each damaged span, in order.
    damage: list[tuple[int, str, int | None]] = field(default_factory=list)
    #: Where a torn tail begins (the last segment only), or None.
    torn_at: int | None = None
    #: The segment is the last one and holds part of its header, or only zeros: a crash hit
    #: ``create`` before the header was durable.
    torn_header: bool = False


def _read_segment(number: int, data: bytes, last: bool, start: int = SEGMENT_HEADER_BYTES) -> _Segment:
    """Validate ``data`` as segment ``number`` and read its records, from ``start``, past any damage.

    Cost O(size) (plus a resync search per damaged span, see :func:`broker.wal.segments.scan`).

    :raises WALCorruption: the header is not a valid header for ``number``, or ``start`` is past the end
    """
    segment = _Segment(number, len(data))
    if last and (
        (len(data) < SEGMENT_HEADER_BYTES and segment_header(number).startswith(data))
        # Some file systems (XFS, ext4 data=writeback) show zeros where data never reached the
        # disk; zeros never form a valid record (crc32(b"\0") != 0), so nothing is lost.
        or data.count(0) == len(data)
    ):
        segment.torn_header = True
        return segment
    try:
        found = parse_segment_header(data)
    except WALCorruption as err:
        raise WALCorruption(err.reason, number, 0) from None
    if found != number:
        raise WALCorruption(f"header says segment {found}", number, 0)
    if start > len(data):
        raise WALCorruption(f"the segment ends at {len(data)}, before {start}", number, start)
    pos = start
    while True:
        result = scan(data, pos)
        segment.records += result.records
        segment.spans.append((pos, result.end))
        if result.problem is None:
            return segment
        if result.resync is None and last:
            segment.torn_at = result.end
            return segment
        segment.damage.append((result.end, result.problem, result.resync))
        if result.resync is None:
            return segment
        pos = result.resync


def _describe(number: int, offset: int, problem: str, resync: int | None) -> str:
    """One line for a damaged span: where, why and how much was skipped."""
    if resync is None:
        return f"segment {number} offset {offset}: {problem}; no valid record follows in this segment"
    return f"segment {number} offset {offset}: {problem}; skipped {resync - offset} bytes to offset {resync}"


@dataclass(slots=True)
class _Recovery:
    """Everything read from a log, in order."""

    numbers: list[int] = field(default_factory=list)
    records: list[tuple[int, int, int, Record]] = field(default_factory=list)
    segments: list[_Segment] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: int = 0
    bytes: int = 0


def _read_log(storage: ISegmentStorage, strict: bool, start: tuple[int, int] | None = None) -> _Recovery:
    """Read every segment in order (from ``start``, ``(segment, offset)``, when given).

    Damaged records always go into ``problems`` (the reader carries on past them).

    :param strict: raise for a bad segment header or a storage error (:meth:`WriteAheadLog.open`);
        otherwise note it in ``problems`` and skip that segment (:func:`check`)
    :raises WALCorruption: only when ``strict`` (and when the ``start`` segment is missing)
    :raises OSError: only when ``strict``
    """
    recovery = _Recovery()
    try:
        recovery.numbers = storage.list_segments()
    except OSError as err:
        if strict:
            raise
        recovery.problems.append(f"cannot list segments: {err}")
        return recovery
    if start is not None and start[0] not in recovery.numbers:
        raise WALCorruption("the segment to start from is missing", start[0], start[1])
    for index, number in enumerate(recovery.numbers):
        last = index == len(recovery.numbers) - 1
        if start is not None and number < start[0]:
            continue
        offset = start[1] if start is not None and number == start[0] else SEGMENT_HEADER_BYTES
        try:
            segment = _read_segment(number, storage.read(number), last, offset)
        except WALCorruption as err:
            if strict:
                raise
            recovery.problems.append(str(err))
            continue
        except OSError as err:
            if strict:
                raise
            recovery.problems.append(f"segment {number}: cannot read: {err}")
            continue
        recovery.segments.append(segment)
        recovery.records += [(number, start, end, record) for start, end, record in segment.records]
        recovery.bytes += SEGMENT_HEADER_BYTES + sum(end - start for start, end in segment.spans)
        for offset, problem, resync in segment.damage:
            recovery.skipped += 1
            recovery.problems.append(_describe(number, offset, problem, resync))
    return recovery


def _torn(recovery: _Recovery) -> tuple[tuple[int, int] | None, int]:
    """Where the last segment's torn tail (or torn header) begins, and its length."""
    if not recovery.segments or recovery.segments[-1].number != recovery.numbers[-1]:
        return None, 0
    last = recovery.segments[-1]
    if last.torn_header:
        return (last.number, 0), last.size
    if last.torn_at is None:
        return None, 0
    return (last.number, last.torn_at), last.size - last.torn_at


def check(storage: ISegmentStorage) -> RecoveryReport:
    """Read the whole log and report what :meth:`WriteAheadLog.open` would find; change nothing.

    Never raises for a damaged or unreadable log: corruption anywhere, a bad segment header or
    a read error goes into ``problems`` (and each damaged span into ``skipped_spans``), and a
    torn tail into ``torn_at`` and ``truncated_bytes``, the bytes ``open()`` would cut.
    """
    recovery = _read_log(storage, strict=False)
    return _report(recovery, *_torn(recovery))


def _report(recovery: _Recovery, torn_at: tuple[int, int] | None, truncated: int) -> RecoveryReport:
    return RecoveryReport(
        segments=len(recovery.numbers),
        records=len(recovery.records),
        bytes=recovery.bytes,
        truncated_bytes=truncated,
        torn_at=torn_at,
        skipped_spans=recovery.skipped,
        problems=tuple(recovery.problems),
    )


def _quote(text: str) -> str:
    """``text`` as is when it is plain, else its repr (spaces, ``=``, ``,``, escapes, non-printables)."""
    if text.isprintable() and not any(c in text for c in " =,'\""):
        return text
    return repr(text)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bytes):
        return f"{len(value)}B"
    if isinstance(value, tuple):
        return ",".join(_value(item) for item in value)
    return repr(value)


def _describe_record(record: Record) -> str:
    """``TYPE field=value ...``; bytes fields show their size, strings are quoted when not plain."""
    if isinstance(record, Published):
        # The fields an operator looks for first; ``id`` is the broker's message id.
        return (
            f"PUBLISHED id={record.message_id} vhost={_quote(record.vhost)} queues={_value(record.queues)}"
            f" exchange={_quote(record.exchange)} routing_key={_quote(record.routing_key)}"
            f" body={len(record.body)}B header={len(record.header)}B timestamp={record.timestamp!r}"
        )
    name = _TYPE_NAMES[type(record)]
    return " ".join([name] + [f"{f.name}={_value(getattr(record, f.name))}" for f in fields(record)])


_TYPE_NAMES = {cls: record_type.name for record_type, cls in RECORD_CLASSES.items()}


def dump(storage: ISegmentStorage) -> Iterator[str]:
    """One human-readable line per record, and per problem, in log order; changes nothing.

    ``segment 1 offset 16 PUBLISHED id=1 vhost=/ queues=q exchange= routing_key=k body=16B ...``;
    a damaged span gives ``segment 3 offset 4096: bad crc; skipped ...`` and a torn tail
    ``segment 3 offset 8000: torn tail, 12 bytes``. Never raises for a damaged log.
    """
    try:
        numbers = storage.list_segments()
    except OSError as err:
        yield f"cannot list segments: {err}"
        return
    for index, number in enumerate(numbers):
        try:
            segment = _read_segment(number, storage.read(number), index == len(numbers) - 1)
        except WALCorruption as err:
            yield str(err)
            continue
        except OSError as err:
            yield f"segment {number}: cannot read: {err}"
            continue
        if segment.torn_header:
            yield f"segment {number} offset 0: torn segment header, {segment.size} bytes"
            continue
        # Records and damaged spans never start at the same offset: merge them by offset.
        lines = [
            (offset, f"segment {number} offset {offset} {_describe_record(r)}") for offset, _, r in segment.records
        ]
        lines += [(offset, _describe(number, offset, problem, resync)) for offset, problem, resync in segment.damage]
        for _, line in sorted(lines, key=lambda item: item[0]):
            yield line
        if segment.torn_at is not None:
            yield f"segment {number} offset {segment.torn_at}: torn tail, {segment.size - segment.torn_at} bytes"


def _pieces(data: bytes | list[bytes]) -> list[bytes]:
    return [data] if isinstance(data, bytes) else data


class WriteAheadLog:
    """Append-only segments of records, one of them active, over ``storage``.

    Call :meth:`open` first; it recovers the log and makes the last segment active.

    Durability: :meth:`append` writes, :meth:`sync` makes the writes durable. Until a sync
    succeeds the log keeps references to the data appended since the last one (at most about a
    segment), because a failed ``fsync`` cannot simply be retried: Linux may drop the dirty
    pages and report success next time ("fsyncgate", PostgreSQL 2018). After a failed append or
    sync the next call first cuts the segment back to its last synced size and writes that data
    again, so a retry that succeeds makes everything durable, and a failed append leaves no
    partial record behind.

    :param storage: where the segments live
    :param segment_bytes: rotate when the active segment would grow past this many bytes
    :raises ValueError: ``segment_bytes`` leaves no room for records
    """

    def __init__(self, storage: ISegmentStorage, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        if segment_bytes <= SEGMENT_HEADER_BYTES:
            raise ValueError(f"segment_bytes must be over {SEGMENT_HEADER_BYTES}, not {segment_bytes}")
        self.segment_bytes = segment_bytes
        self._storage = storage
        self._numbers: list[int] = []
        self._active: int | None = None
        self._size = 0  # bytes of the active segment that are ours (header and whole records)
        self._synced = 0  # of those, bytes known durable
        self._unsynced: list[bytes | list[bytes]] = []  # what was appended after _synced, to write again if need be
        self._damaged = False  # the file may differ from what we wrote past _synced
        self._recovered: list[tuple[int, int, int, Record]] | None = None

    @property
    def active(self) -> int:
        """The number of the segment that :meth:`append` writes to.

        :raises RuntimeError: the log is not open
        """
        if self._active is None:
            raise RuntimeError("the write-ahead log is not open")
        return self._active

    @property
    def size(self) -> int:
        """Bytes in the active segment (header included)."""
        return self._size

    def open(self, repair: bool = False, start: tuple[int, int] | None = None) -> RecoveryReport:
        """Recover the log: read every segment, cut a torn tail, make the last segment active.

        Creates segment 1 if there is none. The records read are kept for :meth:`records`.

        :param start: read only from this ``(segment, offset)`` on (a checkpoint's position:
            what comes before is in the checkpoint); the segments before are kept, unread

        :param repair: skip damaged spans instead of raising, keeping the records after each
            (an operator's decision: the skipped bytes may have held confirmed messages).
            A damaged last segment is rewritten without the damage; an earlier one is left as is.
        :raises WALCorruption: a segment header is bad (even with ``repair``: the file may not
            be ours, or be of a newer format), or, without ``repair``, a record is bad anywhere
            but in the last segment's tail
        :raises OSError: the storage failed
        :raises RuntimeError: the log is already open
        """
        if self._active is not None:
            raise RuntimeError("the write-ahead log is already open")
        recovery = _read_log(self._storage, strict=True, start=start)
        if not repair and recovery.problems:
            # _read_log(strict=True) raised for a bad header; damaged records come out here, and
            # the error names the first.
            segment = next(s for s in recovery.segments if s.damage)
            offset, problem, resync = segment.damage[0]
            follows = "no valid record follows" if resync is None else f"valid record at offset {resync}"
            raise WALCorruption(f"{problem} ({follows})", segment.number, offset)
        torn_at, truncated = _torn(recovery)
        if not recovery.numbers:
            self._storage.create(1, segment_header(1))
            recovery.numbers = [1]
            recovery.bytes = SEGMENT_HEADER_BYTES
        else:
            self._repair_last(recovery.segments[-1], self._storage)
        self._numbers = recovery.numbers
        self._active = recovery.numbers[-1]
        self._size = self._storage.size(self._active)
        # What we read may sit in the page cache only (the previous process died before its
        # fsync); make it durable before the broker acts on it.
        self._storage.sync(self._active)
        self._synced = self._size
        self._recovered = recovery.records
        return _report(recovery, torn_at, truncated)

    def open_at(self, segment: int, size: int) -> RecoveryReport:
        """Open the log as a clean stop left it, without reading its records: ``segment`` must
        be the last segment and hold exactly ``size`` bytes under a valid header (what the stop's
        checkpoint recorded). Nothing is kept for :meth:`records` (a checkpoint holds the state).

        :raises WALCorruption: the log is not as described (it was written to after the
            checkpoint, or changed); the caller recovers with :meth:`open` instead, which reads it
        :raises OSError: the storage failed
        :raises RuntimeError: the log is already open
        """
        if self._active is not None:
            raise RuntimeError("the write-ahead log is already open")
        numbers = self._storage.list_segments()
        if not numbers or numbers[-1] != segment:
            raise WALCorruption(f"the checkpoint names segment {segment} as the last, the log ends at {numbers[-1:]}")
        found = self._storage.size(segment)
        if found != size:
            raise WALCorruption(f"the checkpoint expects {size} bytes, the segment holds {found}", segment, 0)
        if parse_segment_header(self._storage.read_at(segment, 0, SEGMENT_HEADER_BYTES)) != segment:
            raise WALCorruption("its header names another segment", segment, 0)
        self._numbers = numbers
        self._active = segment
        self._size = self._synced = size
        self._recovered = []
        return RecoveryReport(len(numbers), 0, 0, 0, None, 0, ())

    @staticmethod
    def _repair_last(segment: _Segment, storage: ISegmentStorage) -> None:
        """Make the last segment hold only its header and valid records, in order."""
        number = segment.number
        if segment.torn_header:
            storage.truncate(number, 0)
            storage.append(number, segment_header(number))
            storage.sync(number)
        elif segment.damage:
            # Rewrite from the first damage on: cut there, append the valid spans after it. A
            # crash between the two loses those records; the window is one write and one fsync,
            # during an operator-requested repair.
            data = storage.read(number)
            cut = segment.spans[0][1]
            storage.truncate(number, cut)
            rest = b"".join(data[start:end] for start, end in segment.spans[1:])
            if rest:
                storage.append(number, rest)
                storage.sync(number)
        elif segment.torn_at is not None:
            storage.truncate(number, segment.torn_at)

    def records(self) -> Iterator[tuple[int, Record]]:
        """``(segment number, record)`` for every record :meth:`open` read, in log order.

        :raises RuntimeError: the log is not open, or :meth:`forget` dropped the records (an
            empty answer would look like an empty log and lose every message on replay)
        """
        return ((number, record) for number, _start, _end, record in self.located_records())

    def located_records(self) -> Iterator[tuple[int, int, int, Record]]:
        """``(segment number, start offset, end offset, record)`` for every record :meth:`open`
        read, in log order.

        :raises RuntimeError: as :meth:`records`
        """
        if self._recovered is None:
            raise RuntimeError("no recovered records: open() the log first, and read them before forget()")
        return iter(self._recovered)

    def forget(self) -> None:
        """Drop the records kept by :meth:`open` once they are replayed (they may be most of memory)."""
        self._recovered = None

    def _restore(self) -> None:
        """Cut the active segment back to its synced size and write the unsynced data again.

        Clears the damage only if both steps succeed; :exc:`OSError` propagates.
        """
        active = self.active
        self._storage.truncate(active, self._synced)
        if self._unsynced:
            self._storage.append(active, [piece for data in self._unsynced for piece in _pieces(data)])
        self._damaged = False

    def append(self, data: bytes | list[bytes]) -> int:
        """Append encoded records (from :func:`broker.wal.codec.encode`) to the active segment,
        whole or in pieces (written together, not joined first).

        One storage write; not durable until :meth:`sync`. ``data`` is kept until then, so it
        must not change (pass ``bytes``).

        :returns: the active segment's number
        :raises OSError: the write failed; the log holds none of ``data`` and stays usable
        :raises RuntimeError: the log is not open
        """
        active = self.active
        if self._damaged:
            self._restore()
        try:
            self._storage.append(active, data)
        except OSError:
            self._damaged = True  # a prefix of data may be in the file
            raise
        self._size += len(data) if isinstance(data, bytes) else sum(map(len, data))
        self._unsynced.append(data)
        return active

    def sync(self) -> None:
        """Make everything appended so far durable (``fsync`` of the active segment).

        Does nothing when nothing was appended since the last sync.

        :raises OSError: the fsync failed; what was appended since the last successful sync is
            not known to be durable, and the next call writes it again before syncing
        :raises RuntimeError: the log is not open
        """
        active = self.active
        if self._synced == self._size and not self._damaged:
            return
        if self._damaged:
            self._restore()
        try:
            self._storage.sync(active)
        except OSError:
            self._damaged = True
            raise
        self._synced = self._size
        self._unsynced = []

    def should_rotate(self, pending: int = 0) -> bool:
        """Whether appending ``pending`` more bytes would take the active segment past ``segment_bytes``.

        False while the active segment holds only its header, so that a record (or snapshot)
        bigger than a segment still gets written instead of rotating forever.
        """
        return self._size + pending > self.segment_bytes and self._size > SEGMENT_HEADER_BYTES

    def rotate(self, first: bytes = b"") -> int:
        """Sync the active segment, start the next one and write ``first`` into it.

        The broker passes the topology snapshot (``Snapshot(True)``, declarations, bindings,
        ``Snapshot(False)``), so each segment can be read without those before it. ``first`` is
        appended, not synced.

        :returns: the new active segment's number
        :raises OSError: the sync or the create failed (the old segment stays active), or
            writing ``first`` failed (the new segment is active, holding only its header: the
            caller may append the snapshot again)
        """
        self.sync()
        number = self.active + 1
        self._storage.create(number, segment_header(number))
        self._numbers.append(number)
        self._active = number
        self._size = self._synced = SEGMENT_HEADER_BYTES
        self._unsynced = []
        self._damaged = False
        if first:
            self.append(first)
        return number

    @property
    def storage(self) -> ISegmentStorage:
        """The segment storage (its ``read_at`` may be used from another thread)."""
        return self._storage

    def segments(self) -> list[int]:
        """The numbers of the log's segments, ascending; the last is the active one."""
        return list(self._numbers)

    def retire(self, number: int) -> None:
        """Retire segment ``number`` (to the archive, if the storage has one).

        :raises ValueError: ``number`` is the active segment, or not a segment of this log
        :raises OSError: the storage failed
        """
        if number == self._active:
            raise ValueError(f"segment {number} is active and cannot be retired")
        if number not in self._numbers:
            raise ValueError(f"no segment {number} in the log")
        self._storage.retire(number)
        self._numbers.remove(number)

"""An append-only stream of segments in the log's format, for events that are not recovered.

The dead-letter event stream (``<storage.dir>/deadletters``) uses it: segments with the
write-ahead log's header and record framing, written by the broker and read by the exporter
and the Spark job, never replayed at start. So, unlike :class:`~broker.wal.log.WriteAheadLog`,
opening it reads nothing: every run starts a new segment after the last one, which seals
the segments before it (a torn tail of the previous run stays where it is, and readers count
it). A segment is also sealed when it grows past ``segment_bytes`` or gets older than
``max_age``, so that ``postroom dlq export`` run from cron picks events up within that time.

Not thread-safe: one writer thread calls :meth:`append`, :meth:`sync` and :meth:`close`.
"""

from __future__ import annotations

from collections.abc import Callable

from postroom.broker.wal.files import ISegmentStorage
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, segment_header

__all__ = ["DEFAULT_MAX_AGE", "SegmentStream", "sealed_segments"]

#: Seconds after which the active segment is sealed at the next append: the delay before
#: ``postroom dlq export`` (from cron or a timer) can turn recent dead letters into Parquet.
DEFAULT_MAX_AGE = 3600.0


class SegmentStream:
    """Segments appended in order over ``storage``; :meth:`open` starts a new one.

    :param storage: the segment files
    :param segment_bytes: seal the active segment when an append would take it past this
    :param max_age: seal the active segment when it is older than this many seconds
    :param clock: seconds since the epoch (age of segments)
    """

    def __init__(
        self,
        storage: ISegmentStorage,
        segment_bytes: int,
        clock: Callable[[], float],
        max_age: float = DEFAULT_MAX_AGE,
    ) -> None:
        if segment_bytes <= SEGMENT_HEADER_BYTES:
            raise ValueError(f"segment_bytes must be over {SEGMENT_HEADER_BYTES}, not {segment_bytes}")
        self.storage = storage
        self.segment_bytes = segment_bytes
        self.max_age = max_age
        self._clock = clock
        self._active: int | None = None
        self._size = 0
        self._opened_at = 0.0

    @property
    def active(self) -> int:
        """The segment being appended to.

        :raises RuntimeError: the stream is not open
        """
        if self._active is None:
            raise RuntimeError("the segment stream is not open")
        return self._active

    def open(self) -> int:
        """Start a new segment after the last existing one and return its number.

        :raises OSError: the storage failed
        """
        numbers = self.storage.list_segments()
        self._start(numbers[-1] + 1 if numbers else 1)
        return self.active

    def _start(self, number: int) -> None:
        self.storage.create(number, segment_header(number))
        self._active = number
        self._size = SEGMENT_HEADER_BYTES
        self._opened_at = self._clock()

    def append(self, data: bytes) -> int:
        """Append encoded records, first sealing the active segment if it is full or old.

        A segment holding only its header is never sealed for size, so a record bigger than
        ``segment_bytes`` still gets written. Returns the segment written to.

        :raises OSError: the storage failed
        """
        active = self.active
        if self._size > SEGMENT_HEADER_BYTES and (
            self._size + len(data) > self.segment_bytes or self._clock() - self._opened_at > self.max_age
        ):
            self.storage.sync(active)
            self._start(active + 1)
            active = self.active
        self.storage.append(active, data)
        self._size += len(data)
        return active

    def sync(self) -> None:
        """Make everything appended durable (``fsync`` of the active segment)."""
        self.storage.sync(self.active)


def sealed_segments(numbers: list[int], include_last: bool = False) -> list[int]:
    """The segments of a stream that no writer appends to any more: all but the last, which
    may be a running broker's active segment (unless ``include_last``: the broker is stopped).
    """
    ordered = sorted(numbers)
    return ordered if include_last else ordered[:-1]

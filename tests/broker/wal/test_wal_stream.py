"""The dead-letter segment stream: a new segment per run, sealed by size and by age."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import DeadLetterSettled
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, iter_records, segment_header
from postroom.broker.wal.stream import SegmentStream, sealed_segments

EVENT = encode(DeadLetterSettled(1, "/", "dlq", 1.0))


def test_each_open_starts_a_new_segment_after_the_last() -> None:
    storage = MemorySegmentStorage()
    clock = Clock()
    first = SegmentStream(storage, 1 << 20, clock.seconds)
    assert first.open() == 1
    first.append(EVENT)
    second = SegmentStream(storage, 1 << 20, clock.seconds)
    assert second.open() == 2
    assert storage.list_segments() == [1, 2]
    assert storage.read(1) == segment_header(1) + EVENT
    assert storage.read(2) == segment_header(2)


def test_a_full_segment_is_sealed_before_the_append_that_would_overflow_it() -> None:
    storage = MemorySegmentStorage()
    stream = SegmentStream(storage, SEGMENT_HEADER_BYTES + 2 * len(EVENT), Clock().seconds)
    stream.open()
    assert [stream.append(EVENT) for _ in range(5)] == [1, 1, 2, 2, 3]
    for number in (1, 2):
        assert len(list(iter_records(storage.read(number), SEGMENT_HEADER_BYTES))) == 2


def test_an_oversized_batch_still_goes_into_an_empty_segment() -> None:
    storage = MemorySegmentStorage()
    stream = SegmentStream(storage, SEGMENT_HEADER_BYTES + 1, Clock().seconds)
    stream.open()
    assert stream.append(EVENT * 3) == 1
    assert stream.append(EVENT) == 2


def test_an_old_segment_is_sealed_at_the_next_append() -> None:
    storage = MemorySegmentStorage()
    clock = Clock()
    stream = SegmentStream(storage, 1 << 20, clock.seconds, max_age=60)
    stream.open()
    stream.append(EVENT)
    clock.advance(60)
    assert stream.append(EVENT) == 1
    clock.advance(0.5)
    assert stream.append(EVENT) == 2


def test_every_segment_but_the_last_is_sealed() -> None:
    assert sealed_segments([3, 1, 2]) == [1, 2]
    assert sealed_segments([3, 1, 2], include_last=True) == [1, 2, 3]
    assert sealed_segments([]) == []


def test_a_stream_must_be_opened_first() -> None:
    stream = SegmentStream(MemorySegmentStorage(), 1 << 20, Clock().seconds)
    with pytest.raises(RuntimeError) as excinfo:
        stream.append(EVENT)
    assert "not open" in str(excinfo.value)

"""A stream's log: offsets, chunks, recovery, placing readers, retention."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from postroom.broker.tools.fuzzing import sub_entry_batch
from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.chunks import (
    BATCHED,
    RAW,
    pack_raw_entries,
    pack_stream_entries,
    pack_stream_messages,
    unpack_stream_entries,
    unpack_stream_messages,
)
from postroom.broker.wal.files import DirectoryStorage
from postroom.broker.wal.records import WALCorruption
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES
from postroom.broker.wal.streamlog import ENTRIES_AT, StreamLog


def message(n: int, size: int = 10) -> tuple[bytes, bytes, bytes, bytes]:
    """A message whose every part says which one it is."""
    return (b"ex", f"key.{n}".encode(), f"header-{n}".encode(), str(n).encode().ljust(size, b"."))


def opened(storage: object, segment_bytes: int = 1 << 20) -> StreamLog:
    log = StreamLog(storage, segment_bytes)  # type: ignore[arg-type]
    log.open()
    return log


def everything(log: StreamLog) -> list[tuple[int, tuple[bytes, bytes, bytes, bytes]]]:
    """Every message with its offset, read chunk by chunk from the oldest."""
    found = []
    chunk = log.locate(log.first_offset)
    while chunk is not None:
        found += list(enumerate(log.read(chunk), chunk.first_offset))
        chunk = log.next_chunk(chunk)
    return found


def test_offsets_and_messages_survive_a_restart_byte_for_byte(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)))
    first = log.append([message(0), message(1), message(2)], 100.0)
    second = log.append([message(3)], 101.0)
    log.sync()
    assert (first.first_offset, first.count, second.first_offset, log.next_offset) == (0, 3, 3, 4)
    again = opened(DirectoryStorage(str(tmp_path)))
    assert again.next_offset == 4 and again.first_offset == 0 and again.truncated == 0
    assert everything(again) == [(n, message(n)) for n in range(4)]
    assert again.append([message(4)], 102.0).first_offset == 4


def test_a_chunk_never_synced_is_cut_at_the_start_and_its_offsets_are_given_again() -> None:
    storage = MemorySegmentStorage()
    log = opened(storage)
    log.append([message(0), message(1)], 1.0)
    staged = log.stage([message(2), message(3)], 2.0)
    storage.fail_next("sync", OSError(5, "I/O error"))  # written, never on disk
    with pytest.raises(OSError):
        log.write([staged])
    after = storage.crash()
    again = opened(after)
    assert again.next_offset == 2 and everything(again) == [(0, message(0)), (1, message(1))]
    assert again.append([message(9)], 3.0).first_offset == 2


def test_a_torn_chunk_is_cut_and_the_stream_goes_on() -> None:
    storage = MemorySegmentStorage()
    log = opened(storage)
    log.append([message(0)], 1.0)
    log.sync()
    whole = storage.read(1)
    log.append([message(1, 500)], 2.0)
    log.sync()
    torn = storage.read(1)[: len(whole) + 40]  # the second chunk's first bytes only
    storage.put(1, torn)
    again = opened(storage)
    assert again.truncated == 40 and again.next_offset == 1
    assert storage.size(1) == len(whole)


def test_damage_followed_by_a_valid_chunk_is_refused_not_cut() -> None:
    storage = MemorySegmentStorage()
    log = opened(storage)
    first = log.append([message(0)], 1.0)
    log.append([message(1)], 2.0)
    log.sync()
    storage.corrupt(1, first.position + 20, b"\xff\xff")
    with pytest.raises(WALCorruption, match="valid chunk at offset"):
        opened(storage)


def test_an_empty_stream_reopens_empty() -> None:
    storage = MemorySegmentStorage()
    assert opened(storage).next_offset == 0
    again = opened(storage)
    assert (again.first_offset, again.next_offset, again.last_chunk(), again.locate(0)) == (0, 0, None, None)


def test_segments_roll_and_readers_are_placed_in_any_of_them(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    chunks = [log.append([message(2 * n), message(2 * n + 1)], 10.0 + n) for n in range(20)]
    log.sync()
    assert len(log.segments) > 3
    again = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    for offset in (0, 1, 7, 22, 39):
        found = again.locate(offset)
        assert found is not None and found.first_offset <= offset < found.next_offset
        assert (found.segment, found.position) == (chunks[offset // 2].segment, chunks[offset // 2].position)
    assert again.locate(40) is None and again.locate(1000) is None
    assert everything(again) == [(n, message(n)) for n in range(40)]


def test_a_reader_is_placed_by_time_at_the_first_chunk_appended_then_or_later(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    for n in range(20):
        log.append([message(n)], 100.0 + 10 * n)
    log.sync()
    again = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    assert again.locate_time(0.0) == again.locate(0)
    placed = again.locate_time(155.0)
    assert placed is not None and (placed.first_offset, placed.timestamp) == (6, 160.0)
    assert again.locate_time(160.0) == placed
    assert again.locate_time(291.0) is None


def test_last_is_the_newest_chunk_whole(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)), segment_bytes=300)
    log.append([message(0), message(1), message(2)], 1.0)
    log.append([message(3), message(4)], 2.0)
    log.sync()
    last = opened(DirectoryStorage(str(tmp_path)), segment_bytes=300).last_chunk()
    assert last is not None and (last.first_offset, last.count) == (3, 2)


def test_retention_by_size_removes_whole_segments_from_the_head_and_offsets_stay(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    for n in range(30):
        log.append([message(n)], float(n))
    log.sync()
    before = list(log.segments)
    removed = log.retain(max_bytes=900, max_age=None, now=30.0)
    assert removed == before[: len(removed)] and removed and log.segments[-1] == before[-1]
    log.remove(removed)
    assert log.size <= 900 or len(log.segments) == 1
    first = log.first_offset
    assert first > 0 and log.locate(0) == log.locate(first)
    again = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    assert (again.first_offset, again.next_offset) == (first, 30)
    assert everything(again) == [(n, message(n)) for n in range(first, 30)]


def test_retention_by_age_keeps_segments_with_anything_younger_and_never_the_active_one(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    for n in range(30):
        log.append([message(n)], float(n))
    log.sync()
    everything_before = everything(log)
    assert log.retain(max_bytes=None, max_age=1000.0, now=100.0) == []
    removed = log.retain(max_bytes=None, max_age=10.0, now=40.0)  # older than 30 goes
    assert removed
    log.remove(removed)
    survivors = everything(log)
    assert survivors == everything_before[len(everything_before) - len(survivors) :]
    assert min(offset for offset, _ in survivors) <= 30  # the segment holding offset 30 stays
    log.remove(log.retain(max_bytes=None, max_age=0.0, now=1e9))
    assert len(log.segments) == 1 and log.next_offset == 30
    again = opened(DirectoryStorage(str(tmp_path)), segment_bytes=400)
    assert again.segments == log.segments and again.first_offset == log.first_offset


def test_an_interrupted_segment_roll_starts_the_new_segment_again() -> None:
    storage = MemorySegmentStorage()
    log = opened(storage, segment_bytes=200)
    for n in range(6):
        log.append([message(n)], float(n))
    log.sync()
    newest = log.segments[-1]
    storage.put(newest + 1, b"\0" * 7)  # created, its header never synced
    again = opened(storage, segment_bytes=200)
    assert again.segments[-1] == newest + 1 and storage.size(newest + 1) == SEGMENT_HEADER_BYTES
    assert again.next_offset == 6
    assert again.append([message(6)], 7.0).first_offset == 6


def test_chunk_entries_that_do_not_add_up_are_corruption() -> None:
    packed = pack_stream_entries([(b"e", b"k", b"h", b"body")])
    assert unpack_stream_entries(packed, 1) == [(b"e", b"k", b"h", b"body")]
    with pytest.raises(WALCorruption, match="cut short"):
        unpack_stream_entries(packed[:-1], 1)
    with pytest.raises(WALCorruption, match="after the stream chunk"):
        unpack_stream_entries(packed + b"x", 1)
    with pytest.raises(WALCorruption, match="cut short"):
        unpack_stream_entries(packed, 2)


def test_staged_chunks_are_written_once_even_when_a_write_is_retried() -> None:
    storage = MemorySegmentStorage()
    log = opened(storage, segment_bytes=200)
    staged = [log.stage([message(n)], float(n)) for n in range(8)]
    assert len({item.chunk.segment for item in staged}) > 1  # some open a new segment
    storage.fail_next("append", OSError(5, "I/O error"))
    with pytest.raises(OSError):
        log.write(staged)
    log.write(staged)  # the retry: written from where the failure stopped
    again = opened(storage.crash(), segment_bytes=200)
    assert everything(again) == [(n, message(n)) for n in range(8)]


def test_messages_packed_from_their_names_read_back_as_entries() -> None:
    entries = [(b"ex", b"key", b"\x00\x3c", b"body"), (b"", b"q", b"", b""), (b"e" * 255, b"", b"h", b"b" * 70000)]
    names = [(bytes((len(e),)) + e + bytes((len(k),)) + k, h, b) for e, k, h, b in entries]
    assert pack_stream_messages(names) == pack_stream_entries(entries)
    assert unpack_stream_entries(pack_stream_messages(names), 3) == entries
    assert unpack_stream_messages(b"head" + pack_stream_messages(names), 4, 3) == names
    for cut in (b"head" + pack_stream_messages(names)[:-1], b"head" + pack_stream_messages(names) + b"x"):
        with pytest.raises(WALCorruption):
            unpack_stream_messages(cut, 4, 3)


def test_messages_read_for_delivery_are_the_entries_with_their_names_as_sent() -> None:
    log = opened(MemorySegmentStorage())
    log.write([log.stage([message(n) for n in range(3)], 1.0), log.stage([message(3)], 2.0)])
    chunk = log.locate(0)
    while chunk is not None:
        assert log.read_messages(chunk) == [
            (bytes((len(e),)) + e + bytes((len(k),)) + k, h, b) for e, k, h, b in log.read(chunk)
        ]
        chunk = log.next_chunk(chunk)


def test_a_chunk_whose_head_disagrees_with_its_place_is_corruption_when_read_for_delivery() -> None:
    storage = MemorySegmentStorage()
    log = opened(storage)
    log.write([log.stage([message(0), message(1)], 1.0)])
    chunk = log.locate(0)
    assert chunk is not None
    with pytest.raises(WALCorruption):
        log.read_messages(replace(chunk, count=3))
    with pytest.raises(WALCorruption):
        log.read_messages(replace(chunk, first_offset=1))


def test_a_chunk_over_the_record_limit_is_refused_when_staged_and_takes_no_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from postroom.broker.wal import streamlog

    monkeypatch.setattr(streamlog, "MAX_RECORD_BYTES", 200)
    log = opened(MemorySegmentStorage())
    with pytest.raises(ValueError) as excinfo:
        log.stage([message(0, size=300)], 1.0)
    assert "over 200" in str(excinfo.value)
    log.write([log.stage([message(0)], 1.0)])
    assert everything(log) == [(0, message(0))]


def test_raw_chunks_reopen_with_the_others_and_read_back_as_stream_protocol_messages(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)))
    log.append([message(0)], 1.0)
    bodies = [b"\x00Sw\xa1\x01a", b"\x00Sw\xa1\x01bb"]
    raw = log.stage_packed(pack_raw_entries(bodies), 2, 2.0, raw=RAW)
    log.write([raw])
    log.append([message(3)], 3.0)
    again = opened(DirectoryStorage(str(tmp_path)))
    assert again.next_offset == 4
    chunk = again.locate(1)
    assert chunk is not None and chunk.raw and (chunk.first_offset, chunk.count) == (1, 2)
    assert again.read_messages(chunk) == [(b"\x00\x00", b"", body) for body in bodies]
    # As stored: RabbitMQ's simple entries, from ENTRIES_AT on.
    assert again.read_entries(chunk)[ENTRIES_AT:] == b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    later = again.next_chunk(chunk)
    assert later is not None and not later.raw and again.read(later) == [message(3)]


def test_batched_chunks_reopen_holding_an_offset_for_each_message_of_their_batches(tmp_path: Path) -> None:
    log = opened(DirectoryStorage(str(tmp_path)))
    log.append([message(0)], 1.0)
    entries = sub_entry_batch([b"a", b"bb"]) + pack_raw_entries([b"c"]) + sub_entry_batch([b"d", b"e", b"f"], 1)
    log.write([log.stage_packed(entries, 6, 2.0, raw=BATCHED)])
    log.append([message(7)], 3.0)
    again = opened(DirectoryStorage(str(tmp_path)))
    assert again.next_offset == 8
    chunk = again.locate(4)
    assert chunk is not None and chunk.raw == BATCHED and (chunk.first_offset, chunk.count) == (1, 6)
    raw = (b"\x00\x00", b"")
    assert again.read_messages(chunk) == [(*raw, b"a"), (*raw, b"bb"), (*raw, b"c"), None, None, None]
    assert again.read(chunk) == [(b"", b"", b"", body) for body in (b"a", b"bb", b"c")]
    assert again.read_entries(chunk)[ENTRIES_AT:] == entries
    later = again.next_chunk(chunk)
    assert later is not None and later.first_offset == 7 and again.read(later) == [message(7)]


@pytest.mark.parametrize("kind", [RAW, BATCHED])
def test_damage_before_a_valid_raw_chunk_is_refused_not_cut(kind: int) -> None:
    storage = MemorySegmentStorage()
    log = opened(storage)
    first = log.append([message(0)], 1.0)
    log.write([log.stage_packed(pack_raw_entries([b"later"]), 1, 2.0, raw=kind)])
    log.sync()
    storage.corrupt(1, first.position + 20, b"\xff\xff")
    with pytest.raises(WALCorruption, match="valid chunk at offset"):
        opened(storage)

"""WriteAheadLog recovery and writing, after LevelDB's ``log_test.cc``: one named test per failure mode.

Every test runs over :class:`MemorySegmentStorage`, which keeps what a reader sees apart from what
survives a power loss, and fails the operations we tell it to.
"""

from __future__ import annotations

import errno

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.codec import encode
from postroom.broker.wal.log import RecoveryReport, WriteAheadLog, check, dump
from postroom.broker.wal.records import Bound, Published, QueueDeclared, Record, Removed, Snapshot, WALCorruption
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, segment_header

HEADER = SEGMENT_HEADER_BYTES


def published(message_id: int, body: bytes = b"0123456789abcdef") -> Published:
    return Published(message_id, "/", ("q",), "", "k", 1700000000.0, b"", body)


def opened(storage: MemorySegmentStorage, **kwargs: object) -> tuple[WriteAheadLog, RecoveryReport]:
    log = WriteAheadLog(storage, **kwargs)  # type: ignore[arg-type]
    return log, log.open()


def recovered(storage: MemorySegmentStorage, repair: bool = False) -> list[object]:
    """The records a fresh log finds in ``storage``."""
    log = WriteAheadLog(storage)
    log.open(repair=repair)
    return [value for _, value in log.records()]


def segment_of(*values: object, number: int = 1) -> bytes:
    return segment_header(number) + b"".join(encode(value) for value in values)  # type: ignore[arg-type]


def enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def eio() -> OSError:
    return OSError(errno.EIO, "Input/output error")


# -- opening ---------------------------------------------------------------------------------


def test_empty_storage_gets_segment_one() -> None:
    storage = MemorySegmentStorage()
    log, report = opened(storage)
    assert storage.list_segments() == [1] == log.segments()
    assert log.active == 1
    assert storage.durable(1) == segment_header(1)
    assert report == RecoveryReport(1, 0, HEADER, 0, None, 0, ())
    assert list(log.records()) == []


def test_synced_records_are_read_back_in_order() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    values = [QueueDeclared("/", "q", True, False, b""), published(1), published(2), Removed("/", "q", (1,))]
    log.append(b"".join(encode(value) for value in values))  # type: ignore[arg-type]
    log.sync()
    reopened, report = opened(storage.crash())
    assert list(reopened.records()) == [(1, value) for value in values]
    assert (report.records, report.truncated_bytes, report.torn_at) == (4, 0, None)
    assert report.bytes == storage.size(1)


def test_empty_segment_reads_as_empty() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_header(1))
    log, report = opened(storage)
    assert list(log.records()) == []
    assert report == RecoveryReport(1, 0, HEADER, 0, None, 0, ())


def test_open_twice_is_refused() -> None:
    log, _ = opened(MemorySegmentStorage())
    with pytest.raises(RuntimeError):
        log.open()


def test_using_a_log_before_open_is_refused() -> None:
    log = WriteAheadLog(MemorySegmentStorage())
    with pytest.raises(RuntimeError):
        log.append(encode(published(1)))
    with pytest.raises(RuntimeError):
        log.records()


def test_forget_drops_the_recovered_records() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_of(published(1)))
    log, _ = opened(storage)
    log.forget()
    with pytest.raises(RuntimeError):
        log.records()


def test_open_makes_what_it_read_durable() -> None:
    # The previous process appended and died (SIGKILL) before its fsync: the bytes are in the
    # page cache only. Recovery must not build on bytes a power loss would then take away.
    storage = MemorySegmentStorage()
    first, _ = opened(storage)
    first.append(encode(published(1)))
    assert storage.synced_size(1) == HEADER
    opened(storage)
    assert recovered(storage.crash()) == [published(1)]


def test_segment_bytes_must_leave_room_for_records() -> None:
    with pytest.raises(ValueError):
        WriteAheadLog(MemorySegmentStorage(), segment_bytes=HEADER)


# -- torn tails --------------------------------------------------------------------------------------


def test_truncated_tail_is_cut_at_every_offset_of_the_last_record() -> None:
    earlier = [published(1), Removed("/", "q", (1,)), published(2)]
    last = published(3)
    whole = segment_of(*earlier, last)
    start = len(whole) - len(encode(last))
    for cut in range(start, len(whole)):
        storage = MemorySegmentStorage()
        storage.put(1, whole[:cut])
        log, report = opened(storage)
        assert [value for _, value in log.records()] == earlier, cut
        assert storage.read(1) == whole[:start], cut
        assert report.truncated_bytes == cut - start, cut
        assert report.torn_at == ((1, start) if cut > start else None), cut
        assert (report.skipped_spans, report.problems) == (0, ()), cut


def test_log_is_writable_after_a_torn_tail_is_cut() -> None:
    storage = MemorySegmentStorage()
    whole = segment_of(published(1), published(2))
    storage.put(1, whole[:-5])
    log, _ = opened(storage)
    log.append(encode(published(3)))
    log.sync()
    assert recovered(storage.crash()) == [published(1), published(3)]


def test_flipped_bit_in_the_last_record_is_a_torn_tail() -> None:
    earlier = [published(1), published(2)]
    whole = segment_of(*earlier, published(3))
    start = len(segment_of(*earlier))
    for index in range(start, len(whole)):
        for bit in range(8):
            damaged = bytearray(whole)
            damaged[index] ^= 1 << bit
            storage = MemorySegmentStorage()
            storage.put(1, bytes(damaged))
            log, report = opened(storage)
            assert [value for _, value in log.records()] == earlier, (index, bit)
            assert (report.torn_at, report.truncated_bytes) == ((1, start), len(whole) - start), (index, bit)


def test_zero_filled_tail_is_a_torn_tail() -> None:
    # File systems may show zeros past the last durable write after a power loss.
    storage = MemorySegmentStorage()
    good = segment_of(published(1))
    storage.put(1, good + bytes(8192))
    log, report = opened(storage)
    assert [value for _, value in log.records()] == [published(1)]
    assert (report.torn_at, report.truncated_bytes) == ((1, len(good)), 8192)
    assert storage.read(1) == good


@pytest.mark.parametrize(
    "torn",
    [segment_header(2)[:size] for size in range(HEADER)] + [bytes(HEADER), bytes(4096)],
    ids=[f"prefix-{size}" for size in range(HEADER)] + ["zero-header", "zero-page"],
)
def test_torn_segment_header_is_written_again(torn: bytes) -> None:
    # A crash inside create(): the new last segment holds part of its header, nothing, or the
    # zeros some file systems show for data that never reached the disk.
    storage = MemorySegmentStorage()
    storage.put(1, segment_of(published(1), number=1))
    storage.put(2, torn)
    log, report = opened(storage)
    assert [value for _, value in log.records()] == [published(1)]
    assert storage.read(2) == segment_header(2)
    assert (report.torn_at, report.truncated_bytes, log.active) == ((2, 0), len(torn), 2)
    log.append(encode(published(2)))
    log.sync()
    assert recovered(storage.crash()) == [published(1), published(2)]


@settings(max_examples=60)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6),
    cut=st.integers(min_value=0),
)
def test_a_crash_anywhere_keeps_exactly_the_whole_records_before_it(sizes: list[int], cut: int) -> None:
    values = [published(index, bytes(size)) for index, size in enumerate(sizes)]
    whole = segment_of(*values)
    cut = HEADER + cut % (len(whole) - HEADER + 1)
    storage = MemorySegmentStorage()
    storage.put(1, whole[:cut])
    kept = recovered(storage)
    assert kept == values[: len(kept)]
    assert len(segment_of(*kept)) <= cut < len(segment_of(*values[: len(kept) + 1])) or kept == values


# -- corruption in the middle ---------------------------------------------------------------------------


def middle_layout() -> tuple[list[Published], bytes, int, int]:
    """Four records; the second is the one to damage. Returns the records, the segment and its span."""
    values = [published(1), published(2), published(3), published(4)]
    whole = segment_of(*values)
    start = len(segment_of(values[0]))
    return values, whole, start, start + len(encode(values[1]))


def test_every_flipped_bit_in_a_middle_record_is_corruption() -> None:
    values, whole, start, end = middle_layout()
    for index in range(start, end):
        for bit in range(8):
            damaged = bytearray(whole)
            damaged[index] ^= 1 << bit
            storage = MemorySegmentStorage()
            storage.put(1, bytes(damaged))
            with pytest.raises(WALCorruption) as excinfo:
                WriteAheadLog(storage).open()
            assert (excinfo.value.segment, excinfo.value.offset) == (1, start), (index, bit)
            assert storage.read(1) == bytes(damaged), "open() without repair must not change the log"


def test_repair_keeps_the_records_after_a_flipped_bit() -> None:
    values, whole, start, end = middle_layout()
    for index in range(start, end):
        for bit in range(8):
            damaged = bytearray(whole)
            damaged[index] ^= 1 << bit
            storage = MemorySegmentStorage()
            storage.put(1, bytes(damaged))
            log = WriteAheadLog(storage)
            report = log.open(repair=True)
            assert [value for _, value in log.records()] == [values[0], values[2], values[3]], (index, bit)
            assert report.skipped_spans == 1
            assert report.problems[0].startswith(f"segment 1 offset {start}: "), report.problems
            # The last segment was rewritten without the damage: it now opens cleanly.
            assert recovered(storage) == [values[0], values[2], values[3]]
            assert storage.read(1) == segment_of(values[0], values[2], values[3])


def test_checksum_mismatch_is_reported() -> None:
    values, whole, start, end = middle_layout()
    damaged = bytearray(whole)
    damaged[end - 1] ^= 0x40
    storage = MemorySegmentStorage()
    storage.put(1, bytes(damaged))
    with pytest.raises(WALCorruption) as excinfo:
        WriteAheadLog(storage).open()
    assert str(excinfo.value) == f"segment 1 offset {start}: bad crc (valid record at offset {end})"


def test_repair_also_cuts_a_torn_tail_after_the_damage() -> None:
    values, whole, start, end = middle_layout()
    damaged = bytearray(whole[:-3])
    damaged[start + 12] ^= 1
    storage = MemorySegmentStorage()
    storage.put(1, bytes(damaged))
    log = WriteAheadLog(storage)
    report = log.open(repair=True)
    assert [value for _, value in log.records()] == [values[0], values[2]]
    assert (report.skipped_spans, report.torn_at) == (1, (1, len(whole) - len(encode(values[3]))))
    assert storage.read(1) == segment_of(values[0], values[2])


def test_bad_record_at_the_end_of_an_earlier_segment_is_corruption() -> None:
    # Only the last segment can have a torn tail: rotate() synced the earlier ones.
    storage = MemorySegmentStorage()
    first = segment_of(published(1), published(2))
    storage.put(1, first[:-1])
    storage.put(2, segment_of(published(3), number=2))
    with pytest.raises(WALCorruption) as excinfo:
        WriteAheadLog(storage).open()
    assert excinfo.value.segment == 1
    assert "no valid record follows" in excinfo.value.reason


def test_repair_leaves_an_earlier_segment_as_it_is() -> None:
    storage = MemorySegmentStorage()
    damaged = bytearray(segment_of(published(1), published(2), published(3)))
    damaged[HEADER + 30] ^= 1
    storage.put(1, bytes(damaged))
    storage.put(2, segment_of(published(4), number=2))
    log = WriteAheadLog(storage)
    report = log.open(repair=True)
    assert list(log.records()) == [(1, published(2)), (1, published(3)), (2, published(4))]
    assert report.skipped_spans == 1
    assert storage.read(1) == bytes(damaged)


def test_bad_segment_header_is_corruption_even_with_repair() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, b"PRWAL\x00\x00\x02" + bytes(8) + encode(published(1)))
    with pytest.raises(WALCorruption) as excinfo:
        WriteAheadLog(storage).open(repair=True)
    assert (excinfo.value.segment, excinfo.value.offset) == (1, 0)
    assert "unsupported format version 2" in excinfo.value.reason


def test_segment_whose_header_names_another_number_is_corruption() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_of(published(1), number=1))
    storage.put(2, segment_of(published(2), number=7))
    with pytest.raises(WALCorruption) as excinfo:
        WriteAheadLog(storage).open()
    assert str(excinfo.value) == "segment 2 offset 0: header says segment 7"


def test_last_segment_that_is_not_a_torn_header_is_corruption() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, b"PRWAX")
    with pytest.raises(WALCorruption) as excinfo:
        WriteAheadLog(storage).open()
    assert str(excinfo.value) == "segment 1 offset 0: truncated segment header"


def test_zeroed_earlier_segment_is_corruption() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, bytes(HEADER))
    storage.put(2, segment_header(2))
    with pytest.raises(WALCorruption) as excinfo:
        WriteAheadLog(storage).open()
    assert (excinfo.value.segment, excinfo.value.offset) == (1, 0)


def test_short_header_in_an_earlier_segment_is_corruption() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_header(1)[:5])
    storage.put(2, segment_header(2))
    with pytest.raises(WALCorruption):
        WriteAheadLog(storage).open()


# -- rotation and retirement -------------------------------------------------------------------------


def test_rotation_creates_numbered_segments_and_records_span_them() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage, segment_bytes=200)
    snapshot = encode(Snapshot(True)) + encode(Bound("/", "x", "q", True, "k", b"")) + encode(Snapshot(False))
    written = []
    for message_id in range(10):
        data = encode(published(message_id))
        if log.should_rotate(len(data)):
            log.rotate(snapshot)
        written.append((log.append(data), published(message_id)))
    log.sync()
    assert storage.list_segments() == log.segments() == [1, 2, 3, 4, 5]
    assert all(storage.size(number) <= 200 for number in log.segments())
    reopened, report = opened(storage.crash())
    assert [entry for entry in reopened.records() if isinstance(entry[1], Published)] == written
    assert report.segments == 5
    assert reopened.active == 5


def test_rotate_writes_first_at_the_head_of_the_new_segment() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)))
    assert log.rotate(encode(Snapshot(True))) == 2
    assert log.active == 2
    assert storage.read(2) == segment_of(Snapshot(True), number=2)
    assert storage.durable(1) == segment_of(published(1)), "rotate() syncs the segment it leaves"


def test_should_rotate_counts_pending_bytes() -> None:
    log, _ = opened(MemorySegmentStorage(), segment_bytes=100)
    log.append(bytes(50))  # 66 bytes with the header
    assert not log.should_rotate(34)
    assert log.should_rotate(35)


def test_should_rotate_is_false_while_the_segment_holds_only_its_header() -> None:
    # A record bigger than a segment must still be written, not rotate forever.
    log, _ = opened(MemorySegmentStorage(), segment_bytes=100)
    assert not log.should_rotate(1000)


def test_retire_refuses_the_active_segment() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    with pytest.raises(ValueError):
        log.retire(1)
    assert storage.list_segments() == [1]


def test_retire_refuses_an_unknown_segment() -> None:
    log, _ = opened(MemorySegmentStorage())
    with pytest.raises(ValueError):
        log.retire(7)


def test_retired_segment_goes_to_the_archive() -> None:
    storage = MemorySegmentStorage(archive=True)
    log, _ = opened(storage)
    log.append(encode(published(1)))
    log.rotate()
    log.retire(1)
    assert log.segments() == storage.list_segments() == [2]
    assert storage.archived == {1: segment_of(published(1))}


def test_retired_segment_is_deleted_without_an_archive() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.rotate()
    log.retire(1)
    assert (storage.list_segments(), storage.archived) == ([2], {})


# -- power loss and storage faults --------------------------------------------------------------------


def test_crash_keeps_only_synced_records() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)))
    log.sync()
    log.append(encode(published(2)))
    assert recovered(storage.crash()) == [published(1)]
    assert recovered(storage) == [published(1), published(2)]


def test_sync_with_nothing_new_does_not_fsync() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)))
    log.sync()
    calls = len(storage.calls)
    log.sync()
    assert len(storage.calls) == calls


def test_failed_append_raises_and_leaves_no_partial_record() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)))
    storage.fail_next("append", enospc(), written=7)
    with pytest.raises(OSError) as excinfo:
        log.append(encode(published(2)))
    assert excinfo.value.errno == errno.ENOSPC
    log.append(encode(published(3)))
    log.sync()
    storage = storage.crash()
    log, report = opened(storage)
    assert [value for _, value in log.records()] == [published(1), published(3)]
    assert (report.torn_at, report.problems) == (None, ())


def test_failed_sync_raises_and_the_retry_makes_the_data_durable() -> None:
    # After a failed fsync Linux may drop the dirty pages and report success next time; the
    # storage fake does the same, so only writing the data again saves it.
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)))
    storage.fail_next("sync", eio())
    with pytest.raises(OSError) as excinfo:
        log.sync()
    assert excinfo.value.errno == errno.EIO
    log.append(encode(published(2)))
    log.sync()
    assert recovered(storage.crash()) == [published(1), published(2)]


def test_failed_repair_keeps_failing_until_the_storage_recovers() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    storage.fail_next("append", enospc(), written=3)
    with pytest.raises(OSError):
        log.append(encode(published(1)))
    storage.fail_next("truncate", eio())
    with pytest.raises(OSError):
        log.append(encode(published(2)))
    log.append(encode(published(3)))
    log.sync()
    assert recovered(storage.crash()) == [published(3)]


def test_failed_sync_on_rotate_keeps_the_segment_active() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)))
    storage.fail_next("sync", eio())
    with pytest.raises(OSError):
        log.rotate()
    assert (log.active, storage.list_segments()) == (1, [1])
    assert log.rotate() == 2
    assert recovered(storage.crash()) == [published(1)]


def test_failed_create_on_rotate_keeps_the_segment_active() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    storage.fail_next("create", enospc())
    with pytest.raises(OSError):
        log.rotate(encode(Snapshot(True)))
    assert (log.active, log.segments()) == (1, [1])
    log.append(encode(published(1)))
    assert log.rotate(encode(Snapshot(True))) == 2


def test_failed_first_write_on_rotate_leaves_an_empty_active_segment() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    storage.fail_next("append", enospc(), written=2)
    with pytest.raises(OSError):
        log.rotate(encode(Snapshot(True)))
    assert log.active == 2
    log.append(encode(Snapshot(True)))
    log.sync()
    assert storage.crash().read(2) == segment_of(Snapshot(True), number=2)


def test_storage_errors_during_open_propagate() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_header(1))
    storage.fail_next("read", eio())
    with pytest.raises(OSError):
        WriteAheadLog(storage).open()


# -- check() and dump() --------------------------------------------------------------------------------


def test_check_reports_a_torn_tail_without_cutting_it() -> None:
    storage = MemorySegmentStorage()
    whole = segment_of(published(1), published(2))
    storage.put(1, whole[:-4])
    report = check(storage)
    start = len(segment_of(published(1)))
    assert report == RecoveryReport(1, 1, start, len(whole) - 4 - start, (1, start), 0, ())
    assert storage.read(1) == whole[:-4]
    assert {operation for operation, _ in storage.calls} == {"list_segments", "read"}


def test_check_reports_corruption_without_raising() -> None:
    values, whole, start, end = middle_layout()
    damaged = bytearray(whole)
    damaged[start + 9] ^= 1
    storage = MemorySegmentStorage()
    storage.put(1, bytes(damaged))
    report = check(storage)
    assert (report.records, report.skipped_spans) == (3, 1)
    assert report.problems == (f"segment 1 offset {start}: bad crc; skipped {end - start} bytes to offset {end}",)
    assert storage.read(1) == bytes(damaged)


def test_check_reports_bad_headers_and_unreadable_segments() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_of(published(1), number=1))
    storage.put(2, b"garbage!" + bytes(8))
    storage.put(3, segment_of(published(3), number=3))
    storage.fail_next("read", eio())  # segment 1 is read first
    report = check(storage)
    assert report.problems == (
        "segment 1: cannot read: [Errno 5] Input/output error",
        "segment 2 offset 0: bad magic b'garbage!'",
    )
    assert (report.segments, report.records) == (3, 1)


def test_dump_prints_one_line_per_record_and_problem() -> None:
    storage = MemorySegmentStorage()
    values: list[Record] = [
        Published(1, "/", ("q",), "", "k", 1.5, b"", bytes(16)),
        Bound("/", "amq.topic", "my queue", True, "a.#", b""),
        Removed("/", "q", (1, 2)),
    ]
    damaged = bytearray(segment_of(*values))
    bound_at = len(segment_of(values[0]))
    damaged[bound_at + 9] ^= 1
    storage.put(1, bytes(damaged) + b"\x00\x00")
    removed_at = bound_at + len(encode(values[1]))
    assert list(dump(storage)) == [
        "segment 1 offset 16 PUBLISHED id=1 vhost=/ queues=q exchange= routing_key=k body=16B header=0B timestamp=1.5",
        f"segment 1 offset {bound_at}: bad crc; skipped {removed_at - bound_at} bytes to offset {removed_at}",
        f"segment 1 offset {removed_at} REMOVED vhost=/ queue=q message_ids=1,2",
        f"segment 1 offset {len(damaged)}: torn tail, 2 bytes",
    ]


def test_dump_quotes_names_that_are_not_plain() -> None:
    storage = MemorySegmentStorage()
    storage.put(1, segment_of(Bound("/", "amq.topic", "my queue", False, "a=b", b"xyz")))
    assert list(dump(storage)) == [
        "segment 1 offset 16 BOUND vhost=/ source=amq.topic destination='my queue' destination_is_queue=false"
        " routing_key='a=b' arguments=3B"
    ]


def test_a_log_opened_from_a_checkpoint_position_reads_only_what_follows_it() -> None:
    storage = MemorySegmentStorage()
    log, _ = opened(storage)
    log.append(encode(published(1)) + encode(published(2)))
    log.rotate()
    log.append(encode(published(3)))
    position = (log.active, log.size)
    log.append(encode(published(4)) + encode(Removed("/", "q", (1,))))
    log.sync()
    after = WriteAheadLog(storage)
    report = after.open(start=position)
    assert [record for _, record in after.records()] == [published(4), Removed("/", "q", (1,))]
    assert report.records == 2 and after.segments() == [1, 2] and after.active == 2
    at_end = WriteAheadLog(storage)
    assert at_end.open_at(2, storage.size(2)).records == 0 and list(at_end.records()) == []
    with pytest.raises(WALCorruption, match="the checkpoint expects"):
        WriteAheadLog(storage).open_at(2, position[1])  # written to after it
    with pytest.raises(WALCorruption, match="names segment 1 as the last"):
        WriteAheadLog(storage).open_at(1, storage.size(1))
    with pytest.raises(WALCorruption, match="missing"):
        WriteAheadLog(storage).open(start=(7, HEADER))
    with pytest.raises(WALCorruption, match="before"):
        WriteAheadLog(storage).open(start=(2, storage.size(2) + 1))

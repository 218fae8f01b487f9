"""Segment storage: DirectoryStorage on a real directory, and the in-memory fake against the same interface."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from zope.interface.verify import verifyObject

from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.codec import encode
from postroom.broker.wal.files import DirectoryStorage, ISegmentStorage, prune_archive, segment_name
from postroom.broker.wal.log import WriteAheadLog, check
from postroom.broker.wal.records import Published, Snapshot
from postroom.broker.wal.segments import segment_header


def published(message_id: int) -> Published:
    return Published(message_id, "/", ("q",), "", "k", 0.0, b"", b"body")


def test_storages_provide_the_interface(tmp_path: Path) -> None:
    assert verifyObject(ISegmentStorage, DirectoryStorage(tmp_path))
    assert verifyObject(ISegmentStorage, MemorySegmentStorage())


def test_segment_files_are_named_by_zero_padded_number() -> None:
    assert segment_name(1) == "00000000000000000001.wal"
    assert segment_name(2**64 - 1) == "18446744073709551615.wal"


def test_directories_are_created(tmp_path: Path) -> None:
    DirectoryStorage(tmp_path / "wal", tmp_path / "archive")
    assert (tmp_path / "wal").is_dir() and (tmp_path / "archive").is_dir()


def test_segments_and_their_directories_are_the_brokers_alone(tmp_path: Path) -> None:
    # Persistent message bodies live in the segments: no other local user may read them.
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    old.chmod(0o755)  # a directory from before, whatever the umask
    storage = DirectoryStorage(tmp_path / "wal", tmp_path / "archive")
    storage.create(1, b"header")
    assert (tmp_path / "wal").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "archive").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "wal" / segment_name(1)).stat().st_mode & 0o777 == 0o600
    DirectoryStorage(old)
    assert old.stat().st_mode & 0o777 == 0o750
    storage.close()


def test_create_append_read_size_truncate(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path) as storage:
        storage.create(3, b"header")
        storage.append(3, b"-data")
        storage.sync(3)
        assert (tmp_path / segment_name(3)).read_bytes() == b"header-data" == storage.read(3)
        assert storage.size(3) == 11
        storage.truncate(3, 6)
        storage.append(3, b"!")  # appends go to the new end
        assert storage.read(3) == b"header!"


def test_create_refuses_an_existing_segment(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path) as storage:
        storage.create(1, b"header")
        with pytest.raises(FileExistsError):
            storage.create(1, b"other")
        assert storage.read(1) == b"header"


def test_list_segments_is_sorted_and_ignores_other_files(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path) as storage:
        for number in (10, 2, 1):
            storage.create(number, b"")
        (tmp_path / "notes.txt").write_text("x")
        (tmp_path / "1.wal").write_bytes(b"")
        (tmp_path / (segment_name(4) + ".partial")).write_bytes(b"")
        assert storage.list_segments() == [1, 2, 10]


def test_missing_segment_is_file_not_found(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path) as storage:
        with pytest.raises(FileNotFoundError):
            storage.read(1)
        with pytest.raises(FileNotFoundError):
            storage.append(1, b"x")
        with pytest.raises(FileNotFoundError):
            storage.retire(1)


def test_retire_moves_the_segment_to_the_archive(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path / "wal", tmp_path / "archive") as storage:
        storage.create(1, b"header")
        storage.append(1, b"data")
        storage.retire(1)
        assert storage.list_segments() == []
        assert (tmp_path / "archive" / segment_name(1)).read_bytes() == b"headerdata"


def test_retire_copies_to_an_archive_on_another_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = DirectoryStorage(tmp_path / "wal", tmp_path / "archive")
    storage.create(1, b"header")
    replace = os.replace

    def cross_device(source: str, target: str) -> None:
        if os.path.dirname(source) == storage.path:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        replace(source, target)

    monkeypatch.setattr(os, "replace", cross_device)
    storage.retire(1)
    assert storage.list_segments() == []
    assert os.listdir(tmp_path / "archive") == [segment_name(1)]
    assert (tmp_path / "archive" / segment_name(1)).read_bytes() == b"header"


def test_retire_deletes_the_segment_without_an_archive(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path) as storage:
        storage.create(1, b"header")
        storage.retire(1)
        assert os.listdir(tmp_path) == []


def test_close_closes_descriptors_and_they_reopen_on_demand(tmp_path: Path) -> None:
    storage = DirectoryStorage(tmp_path)
    storage.create(1, b"header")
    storage.close()
    storage.append(1, b"+")
    storage.close()
    assert storage.read(1) == b"header+"


def test_create_failure_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = DirectoryStorage(tmp_path)

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError):
        storage.create(1, b"header")
    monkeypatch.undo()
    assert storage.list_segments() == []
    storage.create(1, b"header")


def test_log_round_trips_through_a_directory(tmp_path: Path) -> None:
    with DirectoryStorage(tmp_path / "wal", tmp_path / "archive") as storage:
        log = WriteAheadLog(storage, segment_bytes=100)
        log.open()
        for message_id in range(5):
            data = encode(published(message_id))
            if log.should_rotate(len(data)):
                log.rotate(encode(Snapshot(True)) + encode(Snapshot(False)))
            log.append(data)
        log.sync()
        segments = log.segments()
        log.retire(segments[0])
    with DirectoryStorage(tmp_path / "wal") as storage:
        log = WriteAheadLog(storage)
        log.open()
        kept = [value for _, value in log.records() if isinstance(value, Published)]
    assert len(segments) > 2
    assert kept and kept == [published(message_id) for message_id in range(5 - len(kept), 5)]
    assert (tmp_path / "archive" / segment_name(segments[0])).exists()


def test_torn_tail_on_disk_is_truncated(tmp_path: Path) -> None:
    whole = segment_header(1) + encode(published(1)) + encode(published(2))
    (tmp_path / segment_name(1)).write_bytes(whole[:-3])
    with DirectoryStorage(tmp_path) as storage:
        assert check(storage).truncated_bytes == len(encode(published(2))) - 3
        log = WriteAheadLog(storage)
        report = log.open()
        log.append(encode(published(3)))
        log.sync()
    assert report.truncated_bytes == len(encode(published(2))) - 3
    assert (tmp_path / segment_name(1)).read_bytes() == segment_header(1) + encode(published(1)) + encode(published(3))


def test_memory_storage_crash_keeps_synced_bytes_only() -> None:
    storage = MemorySegmentStorage()
    storage.create(1, b"header")
    storage.append(1, b"synced")
    storage.sync(1)
    storage.append(1, b"lost")
    assert storage.synced_size(1) == 12
    assert storage.crash().read(1) == b"headersynced"


def test_memory_storage_failed_sync_drops_dirty_bytes_like_linux() -> None:
    storage = MemorySegmentStorage()
    storage.create(1, b"header")
    storage.append(1, b"dropped")
    storage.fail_next("sync", OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OSError):
        storage.sync(1)
    storage.append(1, b"later")
    storage.sync(1)
    assert storage.crash().read(1) == b"header" + bytes(7) + b"later"


def test_memory_storage_refuses_unknown_fault() -> None:
    with pytest.raises(ValueError):
        MemorySegmentStorage().fail_next("fsync", OSError())


def test_prune_archive_drops_old_segments_then_the_oldest_over_the_size_limit(tmp_path: Path) -> None:
    now = 1_000_000.0
    for number, age, size in ((1, 10 * 86400, 100), (2, 3600, 400), (3, 60, 400), (4, 1, 400)):
        path = tmp_path / segment_name(number)
        path.write_bytes(b"x" * size)
        os.utime(path, (now - age, now - age))
    (tmp_path / "notes.txt").write_text("not a segment")
    deleted = prune_archive(tmp_path, retention=7 * 86400, max_bytes=900, now=now)
    assert deleted == [segment_name(1), segment_name(2)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [segment_name(3), segment_name(4), "notes.txt"]


def test_prune_archive_keeps_the_newest_segment_even_over_the_size_limit(tmp_path: Path) -> None:
    path = tmp_path / segment_name(9)
    path.write_bytes(b"x" * 1000)
    assert prune_archive(tmp_path, retention=86400, max_bytes=10, now=path.stat().st_mtime) == []
    assert path.exists()


def test_prune_archive_with_keep_newest_never_deletes_a_stream_s_active_segment(tmp_path: Path) -> None:
    now = 1_000_000.0
    for number in (1, 2):
        path = tmp_path / segment_name(number)
        path.write_bytes(b"x" * 100)
        os.utime(path, (now - 30 * 86400, now - 30 * 86400))  # idle for a month, both
    assert prune_archive(tmp_path, retention=86400, max_bytes=10, now=now, keep_newest=True) == [segment_name(1)]
    assert [p.name for p in tmp_path.iterdir()] == [segment_name(2)]
    assert prune_archive(tmp_path, retention=86400, max_bytes=10, now=now) == [segment_name(2)]


@pytest.mark.parametrize("most", [1, 3, 1 << 20])
def test_pieces_are_appended_whole_however_short_each_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, most: int
) -> None:
    writev = os.writev

    def short(fd: int, buffers: list[memoryview]) -> int:  # (a write that takes at most `most` bytes)
        return writev(fd, [bytes(b"".join(buffers)[:most])])

    monkeypatch.setattr(os, "writev", short)
    storage = DirectoryStorage(tmp_path)
    storage.create(1, b"head")
    pieces = [b"ab", b"", b"cdefg", b"h" * 10]
    storage.append(1, pieces)
    storage.append(1, b"tail")
    assert storage.read(1) == b"head" + b"".join(pieces) + b"tail"
    memory = MemorySegmentStorage()
    memory.create(1, b"head")
    memory.append(1, pieces)
    assert memory.read(1) == storage.read(1)[:-4]

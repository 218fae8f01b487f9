"""Stream queues' files: a directory per stream, written with the log's group commit."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.task import Clock

from postroom.broker.core.journal import Journal
from postroom.broker.core.message import Message
from postroom.broker.core.stream import StreamQueue
from postroom.broker.storage.streams import StreamFiles, remove_stream
from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.streamlog import StreamLog
from postroom.broker.wire.codec import shortstr

HEADER = (60).to_bytes(2, "big") + b"\0\0" + (1).to_bytes(8, "big") + b"\0\0"


def publish(stream: StreamQueue, journal: Journal, body: bytes) -> None:
    """A message in, and the writer's next write done (as the log writer does it)."""
    stream.enqueue(Message("", stream.name, shortstr("") + shortstr(stream.name), HEADER, body))
    for each, staged, dropped in journal.take_streams():
        each.log.write(staged)
        each.log.remove(dropped)
        each.written(staged)


def test_a_stream_keeps_its_messages_in_its_directory_across_a_reopen(tmp_path: Path) -> None:
    journal = Journal(1)
    files = StreamFiles(str(tmp_path), journal, Clock())
    stream = files.open("events", "/", {"x-queue-type": "stream"})
    publish(stream, journal, b"a")
    publish(stream, journal, b"b")
    again = StreamFiles(str(tmp_path), Journal(1), Clock()).open("events", "/", {"x-queue-type": "stream"})
    assert (again.log.first_offset, again.log.next_offset, again.committed) == (0, 2, 2)


def test_a_stream_declared_again_before_its_files_are_gone_starts_empty_in_a_directory_of_its_own(
    tmp_path: Path,
) -> None:
    journal = Journal(1)
    files = StreamFiles(str(tmp_path), journal, Clock())
    old = files.open("events", "/", {"x-queue-type": "stream"})
    publish(old, journal, b"old")
    files.delete(old)
    new = files.open("events", "/", {"x-queue-type": "stream"})
    assert new.message_count == 0
    deleted = journal.take_stream_deletions()
    assert deleted == [files.path("/", "events")]
    for path in deleted:
        remove_stream(path)
    publish(new, journal, b"new")
    # After a restart the newest directory is the stream's.
    reopened = StreamFiles(str(tmp_path), Journal(1), Clock()).open("events", "/", {"x-queue-type": "stream"})
    assert reopened.message_count == 1


def test_a_directory_a_crash_left_behind_is_removed_when_the_stream_is_opened(tmp_path: Path) -> None:
    journal = Journal(1)
    files = StreamFiles(str(tmp_path), journal, Clock())
    old = files.open("events", "/", {"x-queue-type": "stream"})
    publish(old, journal, b"old")
    files.delete(old)  # the broker dies before the writer removes it
    new = files.open("events", "/", {"x-queue-type": "stream"})
    publish(new, journal, b"new")
    restarted = StreamFiles(str(tmp_path), Journal(1), Clock())
    stream = restarted.open("events", "/", {"x-queue-type": "stream"})
    assert stream.message_count == 1 and not Path(files.path("/", "events")).exists()


def test_chunks_of_a_failed_write_are_written_by_the_next_and_only_once(tmp_path: Path) -> None:
    journal = Journal(1)
    storage = MemorySegmentStorage()
    log = StreamLog(storage, 1 << 20)
    log.open()
    stream = StreamQueue("events", "/", {"x-queue-type": "stream"}, log, Clock())
    stream.store = StreamFiles(str(tmp_path), journal, Clock())
    stream.enqueue(Message("", "events", shortstr("") + shortstr("events"), HEADER, b"a"))
    [(_stream, staged, dropped)] = journal.take_streams()
    storage.fail_next("sync", OSError(5, "I/O error"))
    try:
        log.write(staged)
    except OSError:
        journal.stream_retry(stream, dropped)  # as the log writer does when its write fails
    assert stream.committed == 0 and journal.has_pending
    stream.enqueue(Message("", "events", shortstr("") + shortstr("events"), HEADER, b"b"))
    [(_stream, staged, _dropped)] = journal.take_streams()
    assert [item.chunk.first_offset for item in staged] == [0, 1]
    log.write(staged)
    stream.written(staged)
    reopened = StreamLog(storage.crash(), 1 << 20)
    reopened.open()
    assert (stream.committed, reopened.next_offset) == (2, 2)


def test_stream_messages_waiting_for_the_writer_count_in_its_backlog(tmp_path: Path) -> None:
    journal = Journal(1)
    journal.max_backlog = 1000
    paused: list[bool] = []
    journal.on_backlog = lambda: paused.append(True)
    stream = StreamFiles(str(tmp_path), journal, Clock()).open("events", "/", {"x-queue-type": "stream"})
    for _ in range(3):
        stream.enqueue(Message("", "events", shortstr("") + shortstr("events"), HEADER, b"x" * 400))
    assert journal.backlog_bytes == 1200 and paused

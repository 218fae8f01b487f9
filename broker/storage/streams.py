"""Stream queues' files: each stream's segments in a directory of its own.

``<storage.dir>/streams/<vhost>/<name>/`` holds one stream's segments (``broker.wal.streamlog``),
the vhost and the name written as hexadecimal UTF-8 so that any name makes a valid path. A
stream's messages are written by the write-ahead log's writer, with the log's records, in the
same group commit (``broker.storage.logwriter.WALService``): the journal hands the writer each
stream's staged chunks (:meth:`broker.core.journal.Journal.take_streams`), a confirm waits for
the write that holds its message, and once written the chunks are readable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from postroom.broker.core.journal import Journal
from postroom.broker.core.stream import StreamQueue
from postroom.broker.wal.files import DirectoryStorage, FileRecorder
from postroom.broker.wal.paths import incarnations, stream_directory
from postroom.broker.wal.streamlog import DEFAULT_STREAM_SEGMENT_BYTES, StreamLog

__all__ = ["StreamFiles", "STREAMS_DIR", "remove_stream", "scratch_streams"]

#: The streams' directory under ``storage.dir``.
STREAMS_DIR = "streams"


class StreamFiles:
    """The streams of one broker (``broker.core.stream.StreamStore``).

    :param directory: ``<storage.dir>/streams``
    :param journal: the broker's journal (the streams' writes go with its group commit)
    :param clock: the reactor (time and timers)
    :param recorder: told of every change to the streams' files (a cluster's leader)
    """

    def __init__(self, directory: str, journal: Journal, clock: Any, recorder: FileRecorder | None = None) -> None:
        self.directory = directory
        self.recorder = recorder
        self.journal = journal
        self.clock = clock
        #: Each open stream's directory, and the directories waiting to be removed.
        self._paths: dict[StreamQueue, str] = {}
        self._deleting: set[str] = set()
        #: (the journal's own, called for every message a stream takes: no call in between)
        self.pending = journal.stream_published  # type: ignore[method-assign]

    def path(self, vhost_name: str, name: str) -> str:
        """The directory of stream ``name`` in ``vhost_name`` (its first incarnation's)."""
        return stream_directory(self.directory, vhost_name, name)

    def open(self, name: str, vhost_name: str, arguments: Mapping[str, Any]) -> StreamQueue:
        """The stream ``name``, with the messages its directory holds (none when it is new).

        A stream deleted and declared again before its files are gone gets a directory of its
        own (``<path>~1``, ``~2`` ...): the newest one not being removed is the stream's, and
        older ones left by a crash are removed here.

        :raises OSError: the storage failed
        :raises broker.wal.records.WALCorruption: its last segment is damaged in the middle
        """
        base = self.path(vhost_name, name)
        self._deleting = {path for path in self._deleting if os.path.exists(path)}
        found = incarnations(base)
        live = [(number, path) for number, path in found if path not in self._deleting]
        if live:
            path = live[-1][1]
            for _number, older in live[:-1]:
                remove_stream(older)
                if self.recorder is not None:
                    self.recorder.removed(older)
        else:
            number = found[-1][0] + 1 if found else 0
            path = base if number == 0 else f"{base}~{number}"
        size = arguments.get("x-stream-max-segment-size-bytes")
        segment_bytes = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
        log = StreamLog(DirectoryStorage(path, recorder=self.recorder), segment_bytes or DEFAULT_STREAM_SEGMENT_BYTES)
        log.open()
        stream = StreamQueue(name, vhost_name, arguments, log, self.clock, store=self)
        self._paths[stream] = path
        return stream

    def pending(self, stream: StreamQueue, size: int, count: int = 1) -> None:
        """``stream`` has messages waiting: the journal has the writer write them next."""
        self.journal.stream_published(stream, size, count)

    def offset_stored(self, stream: StreamQueue, name: str, offset: int) -> None:
        """``stream``'s subscription ``name`` moved: the journal records it with the next write."""
        self.journal.stream_offset(stream.vhost_name, stream.name, name, offset)

    def delete(self, stream: StreamQueue) -> None:
        """``stream`` was deleted: its files go with the writer's next write (after any of its
        chunks in flight)."""
        path = self._paths.pop(stream)
        self._deleting.add(path)
        self.journal.stream_deleted(path)


def remove_stream(path: str) -> None:
    """Remove a deleted stream's directory (the writer's thread)."""
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def scratch_streams(clock: Any) -> Iterator[StreamFiles]:
    """Streams in a temporary directory, removed afterwards: for a node that only checks
    definitions (``postroom config check``), where declaring a stream must work as it will."""
    with tempfile.TemporaryDirectory(prefix="postroom-streams-") as directory:
        yield StreamFiles(directory, Journal(1), clock)

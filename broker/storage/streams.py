"""Stream queues' files: each stream's segments in a directory of its own.

``<storage.dir>/streams/<vhost>/<name>/`` holds one stream's segments (``broker.wal.streamlog``),
the vhost and the name written as hexadecimal UTF-8 so that any name makes a valid path. A
stream's messages are written by the write-ahead log's writer, with the log's records, in the
same group commit (``broker.server.service.WALService``): the journal hands the writer each
stream's staged chunks (:meth:`broker.core.journal.Journal.take_streams`), a confirm waits for
the write that holds its message, and once written the chunks are readable.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from broker.core.journal import Journal
from broker.core.stream import StreamQueue
from broker.wal.files import DirectoryStorage
from broker.wal.streamlog import DEFAULT_STREAM_SEGMENT_BYTES, StreamLog

__all__ = ["StreamFiles", "STREAMS_DIR", "remove_stream"]

#: The streams' directory under ``storage.dir``.
STREAMS_DIR = "streams"


class StreamFiles:
    """The streams of one broker (``broker.core.stream.StreamStore``).

    :param directory: ``<storage.dir>/streams``
    :param journal: the broker's journal (the streams' writes go with its group commit)
    :param clock: the reactor (time and timers)
    """

    def __init__(self, directory: str, journal: Journal, clock: Any) -> None:
        self.directory = directory
        self.journal = journal
        self.clock = clock

    def path(self, vhost_name: str, name: str) -> str:
        """The directory of stream ``name`` in ``vhost_name``."""
        return os.path.join(self.directory, vhost_name.encode().hex() or "-", name.encode().hex())

    def open(self, name: str, vhost_name: str, arguments: Mapping[str, Any]) -> StreamQueue:
        """The stream ``name``, with the messages its directory holds (none when it is new).

        :raises OSError: the storage failed
        :raises broker.wal.record.WALCorruption: its last segment is damaged in the middle
        """
        size = arguments.get("x-stream-max-segment-size-bytes")
        segment_bytes = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
        log = StreamLog(DirectoryStorage(self.path(vhost_name, name)), segment_bytes or DEFAULT_STREAM_SEGMENT_BYTES)
        log.open()
        return StreamQueue(name, vhost_name, arguments, log, self.clock, store=self)

    def pending(self, stream: StreamQueue, size: int) -> None:
        """``stream`` has a message waiting: the journal has the writer write it next."""
        self.journal.stream_published(stream, size)

    def delete(self, stream: StreamQueue) -> None:
        """``stream`` was deleted: its files go with the writer's next write (after any of its
        chunks in flight)."""
        self.journal.stream_deleted(self.path(stream.vhost_name, stream.name))


def remove_stream(path: str) -> None:
    """Remove a deleted stream's directory (the writer's thread)."""
    shutil.rmtree(path, ignore_errors=True)

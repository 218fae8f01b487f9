"""Writing the dead-letter event stream: a Twisted service over :class:`DeadLetterLog`.

The core records dead-letter events into a pending buffer (``broker/core/dead_letter_events.py``); this
service appends what is pending to ``<storage.dir>/deadletters`` on a worker thread of its
own, batched: the first event after a quiet spell schedules one write ``interval`` seconds
later, and everything recorded by then goes out in one append (and one fsync, unless
``fsync: never``). Nothing waits for these writes (no confirm depends on them), so the
reactor thread only joins byte strings. A failed write is logged once and the events of
that batch are lost: the analysis loses them, the broker's messages are untouched.

On a cluster's leader, what each write changed in the stream's files (and the segments the
retention deletes) is sent to the followers right after it (``Replication.flush``), as the
log's writer sends its own writes: a node that takes over holds the stream up to then.

Sealed segments are kept for ``storage.deadletters.retention`` and within
``storage.deadletters.max_bytes`` (oldest deleted first; never the active one), checked at
start and whenever a segment is sealed, so the stream cannot fill the disk when nobody
exports it. ``postroom dlq export`` should run well within that time.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from postroom.broker.core.dead_letter_events import DeadLetterLog, watch_dead_letter_queues
from postroom.broker.core.node import Node
from postroom.broker.core.seal import Sealer
from postroom.broker.storage.logwriter import Replication
from postroom.broker.storage.writer import WorkerWriter
from postroom.broker.wal.files import DirectoryStorage, prune_archive
from postroom.broker.wal.stream import SegmentStream

__all__ = ["DEAD_LETTER_DIR", "WRITE_INTERVAL", "DeadLetterService", "open_dead_letters"]

#: The stream's directory under ``storage.dir``.
DEAD_LETTER_DIR = "deadletters"

#: Seconds between writes of the event stream: dead letters come in bursts (a poison message
#: type, a consumer outage); one write per burst-window keeps the worker's cost per event low,
#: and nothing is waiting on them.
WRITE_INTERVAL = 0.2

#: Segments of the stream are smaller than the log's: a segment is the unit of export (one
#: Parquet file) and of parallelism in the Spark job.
DEAD_LETTER_SEGMENT_BYTES = 32 * 1024 * 1024


class DeadLetterService(WorkerWriter):
    """Appends the dead-letter log's events to their segment stream on a worker thread.

    :param events: the core's dead-letter log
    :param stream: the opened segment stream (touched only from the worker thread from now on)
    :param reactor: timers and the worker thread's results
    :param fsync: ``always``/``batch`` sync every write; ``never`` leaves it to the OS
    :param retention: seconds a sealed segment is kept (by its last write)
    :param max_bytes: the most the stream's segments may hold; the oldest sealed ones go first
    :param replication: a cluster leader's link to its followers (its recorder is the stream's
        storage's): each write is sent to them once synced
    """

    _log = Logger()

    def __init__(
        self,
        events: DeadLetterLog,
        stream: SegmentStream,
        reactor: Any,
        fsync: str = "batch",
        retention: float = float("inf"),
        max_bytes: int = 1 << 62,
        replication: Replication | None = None,
    ) -> None:
        super().__init__("postroom-deadletters")
        self.replication = replication
        self.events = events
        self.stream = stream
        self.reactor = reactor
        self.fsync = fsync
        self.retention = retention
        self.max_bytes = max_bytes
        #: Segments deleted by the retention so far.
        self.pruned = 0
        self.interval = WRITE_INTERVAL
        #: The last write error, or ``None`` once writes succeed.
        self.alarm: str | None = None
        self.writes = 0

    @property
    def has_pending(self) -> bool:
        return self.events.has_pending

    def startService(self) -> None:
        super().startService()
        self.events.on_pending = self._pending
        self._pruned(self.prune())

    def prune(self) -> list[str] | OSError:
        """Apply the retention to the sealed segments (any thread: the active one is never
        touched); returns the file names deleted, or the error that stopped it (which is not
        a failed write: the events are written)."""
        directory = getattr(self.stream.storage, "path", None)
        if directory is None:  # storage without files (tests)
            return []
        try:
            deleted = prune_archive(directory, self.retention, self.max_bytes, time.time(), keep_newest=True)
        except OSError as error:
            return error
        if self.replication is not None:
            for name in deleted:
                self.replication.recorder.removed(os.path.join(directory, name))
        return deleted

    def _pruned(self, result: list[str] | OSError) -> None:
        if isinstance(result, OSError):
            self._log.error("deleting dead-letter segments past the retention failed: {error}", error=str(result))
        elif result:
            self.pruned += len(result)
            self._log.info("dead-letter segments past the retention deleted: {names}", names=", ".join(sorted(result)))

    def _pending(self) -> None:
        if self._call is None and self._writing is None:
            self._call = self.reactor.callLater(self.interval, self._write)

    def _write(self) -> None:
        self._call = None
        if self._writing is not None or not self.events.has_pending:
            return
        data = self.events.take()
        self._writing = deferToThreadPool(self.reactor, self._pool, self._append, data)
        self._writing.addCallbacks(self._written, self._failed)

    def _append(self, data: bytes) -> list[str] | OSError:
        before = self.stream.active
        try:
            self.stream.append(data)
            if self.fsync != "never":
                self.stream.sync()
            return self.prune() if self.stream.active != before else []
        finally:
            if self.replication is not None:
                self.replication.flush()

    def _written(self, pruned: list[str] | OSError) -> None:
        self._writing = None
        self.writes += 1
        self._pruned(pruned)
        if self.alarm is not None:
            self._log.info("dead-letter event writes succeed again")
            self.alarm = None
        if self.events.has_pending:
            self._call = self.reactor.callLater(self.interval, self._write)

    def _failed(self, failure: Failure) -> None:
        self._writing = None
        if self.alarm is None:
            self._log.error(
                "writing dead-letter events failed: {error}; the analysis will miss them", error=str(failure.value)
            )
        self.alarm = str(failure.value)
        if self.events.has_pending:
            self._call = self.reactor.callLater(self.interval, self._write)

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        """Write and sync what is pending, stop the worker thread, close the stream's files."""
        yield super().stopService()
        close = getattr(self.stream.storage, "close", None)  # DirectoryStorage's descriptors
        if close is not None:
            close()


def open_dead_letters(
    data_dir: str,
    node: Node,
    reactor: Any,
    fsync: str,
    retention: float,
    max_bytes: int,
    replication: Replication | None = None,
) -> DeadLetterService:
    """Open the event stream under ``data_dir`` (a new segment), attach its log to every vhost of
    ``node`` and hook the dead-letter queues already declared (their recovered dead letters).

    :param replication: a cluster leader's link to its followers, which get the stream too
    :raises OSError: the directory or the new segment could not be created
    """
    recorder = replication.recorder if replication is not None else None
    storage = DirectoryStorage(os.path.join(data_dir, DEAD_LETTER_DIR), recorder=recorder)
    stream = SegmentStream(storage, DEAD_LETTER_SEGMENT_BYTES, reactor.seconds)
    run = stream.open()
    events = DeadLetterLog(run, reactor.seconds, Sealer.for_directory(data_dir))
    for vhost in node.vhosts.values():
        vhost.dead_letters = events
    watch_dead_letter_queues(
        events, node.vhosts.values(), node.recovered_dead_letters, node.recovered_dead_letter_queues
    )
    node.recovered_dead_letters = Counter()
    if replication is not None:
        replication.flush()  # (the new segment's header)
    return DeadLetterService(events, stream, reactor, fsync, retention, max_bytes, replication)

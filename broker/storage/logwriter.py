"""The write-ahead log's writer: group commit on a worker thread, checkpoints, retired segments.

:class:`WALService` takes the journal's records on the reactor thread and writes them (with
the streams' chunks) on a worker thread of its own (``broker.storage.writer``); confirms are
released once the write that holds their records is synced.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from postroom.broker.core.histogram import Histogram
from postroom.broker.core.journal import Journal, StagedStream
from postroom.broker.core.node import Node
from postroom.broker.storage.body_paging import Pager
from postroom.broker.storage.checkpoint import (
    CHECKPOINT_BYTES,
    CHECKPOINT_DIR,
    Captured,
    CheckpointRefused,
    capture,
    discard_checkpoint,
)
from postroom.broker.storage.streams import remove_stream
from postroom.broker.storage.writer import WorkerWriter
from postroom.broker.wal.files import FileRecorder, prune_archive
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES
from postroom.broker.wal.streamlog import Staged
from postroom.config.schema import BrokerConfig

#: A checkpoint is captured on the reactor thread (each durable queue's messages in memory are
#: turned into records): the next one waits at least this many times as long as the last took.
CAPTURE_SHARE = 20


class Replication(Protocol):
    """Where a cluster's leader sends what it writes (``broker.cluster.leader``): the log's
    writer has the changes its :attr:`recorder` noted cut into a batch and sent at each write
    (:meth:`flush`, from the writer thread) before its fsync, and releases the write's
    confirms once the batch is on the followers in sync as well (:meth:`after`). The
    dead-letter writer flushes after each of its writes too."""

    recorder: Any

    def flush(self) -> int:
        """Cut what was noted since the last batch into the next one and send it (any thread:
        it goes through the reactor); its number, or the last one's when nothing was noted."""

    def after(self, seq: int, release: Callable[[], None], refuse: Callable[[], None]) -> None:
        """Call ``release`` once every follower in sync has batch ``seq``, or ``refuse`` if
        that cannot be promised (reactor thread)."""


@dataclass(frozen=True, slots=True)
class Archive:
    """Where retired segments go and how long they stay (``storage.archive``)."""

    path: str
    retention: float
    max_bytes: int


def archive_of(config: BrokerConfig) -> Archive | None:
    """The configuration's segment archive (``<storage.dir>/archive``), or ``None`` when disabled."""
    archive = config.storage.archive
    if not archive.enabled:
        return None
    return Archive(str(Path(config.storage.dir) / "archive"), archive.retention, archive.max_bytes)


class WALService(WorkerWriter):
    """Writes the journal's records to the log on one worker thread, and releases confirms.

    Group commit: the first record after a quiet spell schedules a write ``interval`` seconds
    later (``fsync: batch``) or at the end of the reactor turn (``always``, ``never``);
    everything recorded by then goes out in one append and one fsync. Records arriving while
    a write is in flight wait for the next one. Confirms are released only when the write
    that holds their records has been synced (written, with ``never``). A failed write or
    fsync refuses those confirms (nacks), raises :attr:`alarm` and the broker keeps serving.

    :param journal: the broker's journal
    :param log: the opened write-ahead log (touched only from the worker thread from now on)
    :param fsync: ``always``, ``batch`` or ``never``
    :param interval: the group-commit window for ``batch``, in seconds
    :param data_dir: where checkpoints go (``broker.storage.checkpoint``): one is taken every
        ``checkpoint_bytes`` of log (less often if capturing them would take over
        1/:data:`CAPTURE_SHARE` of the time), and one at a clean stop (:meth:`checkpoint`)
    """

    _log = Logger()

    def __init__(
        self,
        journal: Journal,
        log: WriteAheadLog,
        reactor: Any,
        fsync: str,
        interval: float,
        node: Node,
        archive: Archive | None = None,
        pager: Pager | None = None,
        max_backlog: int = 64 << 20,
        data_dir: str | None = None,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        replication: Replication | None = None,
    ) -> None:
        super().__init__("postroom-wal")
        #: A cluster leader's link to its followers (``None``: a single node).
        self.replication = replication
        self._recorder: FileRecorder | None = replication.recorder if replication is not None else None
        self.data_dir = data_dir
        #: Log bytes between checkpoints, and written since the last one.
        self.checkpoint_bytes = checkpoint_bytes
        self._since_checkpoint = 0
        self._next_checkpoint = 0.0
        #: Checkpoints written so far; why the last one could not be taken (``None``: it was).
        self.checkpoints = 0
        self.checkpoint_problem: str | None = None
        self.archive = archive
        #: Keeps the bodies in memory within ``storage.memory_budget``: after each write, those of
        #: logged messages past it are dropped (``None``: they all stay).
        self.pager = pager
        self._paging_logged = False
        self._read = log.storage.read_at
        self.journal = journal
        self.wal = log
        self.node = node
        #: Bytes in the active segment, as the reactor thread counts them (the log is the worker's).
        self._filled = log.size
        self._segment_bytes = log.segment_bytes
        #: The segments on disk and the active one, as the reactor thread counts them.
        self._segments = log.segments()
        self._active = log.active
        #: Sizes of the sealed segments (the active one's is ``_filled``), for metrics.
        self._sealed_bytes = {number: log.storage.size(number) for number in self._segments if number != self._active}
        #: Segments retired so far (deleted, or moved to the archive).
        self.retired = 0
        self.reactor = reactor
        self.fsync = fsync
        self.interval = interval if fsync == "batch" else 0.0
        self.alarm: str | None = None
        self.writes = 0
        #: Seconds each append+fsync took, for metrics.
        self.fsync_seconds = Histogram()
        #: Bytes of records waiting for the writer past which publishers are paused.
        self.max_backlog = max_backlog
        #: Times the backlog paused publishers.
        self.backlog_pauses = 0

    @property
    def has_pending(self) -> bool:
        return self.journal.has_pending

    def startService(self) -> None:
        super().startService()
        self.journal.on_pending = self._pending
        self.journal.max_backlog = self.max_backlog
        self.journal.on_backlog = self._backlogged
        if self.journal.has_pending:
            # Recorded while the broker was being built (configured definitions, plugins'
            # recovery): without a write now, later records would never trigger one.
            self._pending()

    def _pending(self) -> None:
        if self._call is None and self._writing is None:
            self._call = self.reactor.callLater(self.interval, self._write)

    def _write(self) -> None:
        self._call = None
        if self._writing is not None or not self.journal.has_pending:
            return
        oldest = self._segments[0]
        if oldest != self._active and self.journal.ledger.sparse(oldest):
            # Copy its few live messages forward; it is retired once the copies are synced.
            self.journal.rewrite(oldest)
        first = b""
        if self._filled + self.journal.pending_bytes > self._segment_bytes and self._filled > SEGMENT_HEADER_BYTES:
            # Rotate: the new segment starts with the topology as it is now (reactor thread).
            first = self.node.topology()
            self._sealed_bytes[self._active] = self._filled
            self._filled = SEGMENT_HEADER_BYTES + len(first)
            self._active += 1
            self._segments.append(self._active)
        streams = self.journal.take_streams()
        deleted_streams = self.journal.take_stream_deletions()
        data, position = self.journal.take(self._active, self._filled, self._read)
        self._filled += len(data)
        self._since_checkpoint += len(first) + len(data)
        captured = None
        if (
            self.data_dir is not None
            and self._since_checkpoint >= self.checkpoint_bytes
            and time.monotonic() >= self._next_checkpoint
        ):
            self._since_checkpoint = 0
            started = time.monotonic()
            captured = self._capture()
            # Capturing holds the reactor thread: at most 1/CAPTURE_SHARE of its time.
            self._next_checkpoint = started + CAPTURE_SHARE * (time.monotonic() - started)
        retire = self.journal.ledger.retirable(self._segments, self._active)
        for number in retire:
            self._segments.remove(number)
            self._sealed_bytes.pop(number, None)
        self.retired += len(retire)
        self._writing = deferToThreadPool(
            self.reactor, self._pool, self._append, data, first, retire, captured, streams, deleted_streams
        )
        self._writing.addCallbacks(
            self._written, self._failed, callbackArgs=(position, streams), errbackArgs=(position, streams)
        )

    def _capture(self) -> Captured | None:
        """Capture a checkpoint at the end of what the journal just handed out (reactor thread).

        When one cannot be taken, the last one is deleted: a start after a crash then reads the
        whole log, and segments are retired as if there were none.
        """
        assert self.data_dir is not None
        try:
            captured = capture(self.data_dir, self.node, self.journal, self._active, self._filled)
        except (CheckpointRefused, OSError) as problem:
            if str(problem) != self.checkpoint_problem:
                self._log.info(
                    "no checkpoint ({reason}); a start after a crash reads the whole write-ahead log",
                    reason=str(problem),
                )
            self.checkpoint_problem = str(problem)
            discard_checkpoint(self.data_dir)
            if self._recorder is not None:
                self._recorder.no_checkpoint(os.path.join(self.data_dir, CHECKPOINT_DIR))
            self.journal.ledger.protect(1 << 62, (), keep=False)
            return None
        if self.checkpoint_problem is not None:
            self._log.info("checkpoints are taken again")
            self.checkpoint_problem = None
        self.journal.ledger.protect(captured.first, captured.segments)
        return captured

    def _append(
        self,
        data: bytes,
        first: bytes,
        retire: list[int],
        captured: Captured | None = None,
        streams: Sequence[tuple[StagedStream, list[Staged], list[int]]] = (),
        deleted_streams: Sequence[str] = (),
    ) -> tuple[float, Captured | None, OSError | None, int]:
        """Worker thread: write the streams' chunks (each stream's with one fsync), then rotate
        first when asked (``first`` opens the new segment), append, fsync, write the checkpoint
        ``captured`` with them, then retire the segments no live message needs (to the archive,
        when enabled), and remove the stream segments retention dropped.

        In a cluster's leader, what was written is sent to the followers before the fsync, as
        one batch, and what was retired and removed after it, as another.

        Returns the seconds the append and fsync took, the checkpoint, why it failed, and the
        number of the batch sent to the followers (0: none).
        """
        started = time.monotonic()
        seq = 0
        try:
            for stream, staged, _dropped in streams:
                if staged:
                    stream.log.write(staged)
            if first:
                self.wal.rotate(first)
            self.wal.append(data)
            if self.replication is not None:
                seq = self._send()
            if self.fsync != "never":
                self.wal.sync()
        except BaseException:
            if self.replication is not None:
                self._send()
            if captured is not None:
                captured.abandon()
            raise
        took = time.monotonic() - started
        problem = None
        if captured is not None:
            try:
                captured.commit()
            except OSError as error:
                problem = error
            else:
                self._checkpoint_written()
        for number in retire:
            self.wal.retire(number)
        for stream, _staged, dropped in streams:
            if dropped:
                stream.log.remove(dropped)
        for path in deleted_streams:
            remove_stream(path)
            if self._recorder is not None:
                self._recorder.removed(path)
        if self.replication is not None:
            self._send()
        if retire and self.archive is not None:
            prune_archive(self.archive.path, self.archive.retention, self.archive.max_bytes, time.time())
        return took, captured, problem, seq

    def _checkpoint_written(self) -> None:
        """A checkpoint was put in place: a cluster's followers get it too (any thread)."""
        if self._recorder is not None and self.data_dir is not None:
            self._recorder.checkpointed(os.path.join(self.data_dir, CHECKPOINT_DIR))

    def _send(self) -> int:
        """Worker thread: send what the recorder noted since the last batch; the number of the
        last batch sent (this one's, or the one before when nothing was noted)."""
        assert self.replication is not None
        return self.replication.flush()

    def _backlogged(self) -> None:
        """The records waiting for the writer passed :attr:`max_backlog`: pause publishers until
        a write brings them under half of it (RabbitMQ's flow control: they are not told)."""
        if self.node.set_alarm("log", True):
            self.backlog_pauses += 1
            self._log.info(
                "publishers paused: {bytes} bytes of records wait for the write-ahead log (storage.max_backlog)",
                bytes=self.journal.backlog_bytes,
            )

    def _caught_up(self) -> None:
        if "log" in self.node.alarms and self.journal.backlog_bytes <= self.max_backlog // 2:
            self.node.set_alarm("log", False)
            self._log.info("publishers resumed: the write-ahead log caught up")

    def _written(
        self,
        result: tuple[float, Captured | None, OSError | None, int],
        position: int,
        streams: Sequence[tuple[StagedStream, list[Staged], list[int]]] = (),
    ) -> None:
        seconds, captured, problem, seq = result
        self._writing = None
        self.writes += 1
        self.fsync_seconds.observe(seconds)
        if captured is not None:
            self._checkpointed(captured, problem)
        pager = self.pager
        if pager is not None and pager.page_logged() and not self._paging_logged:
            self._paging_logged = True
            self._log.info(
                "persistent message bodies over the memory budget ({budget} bytes) are paged out to the log",
                budget=pager.budget,
            )
        if self.alarm is not None:
            self._log.info("write-ahead log writes succeed again")
            self.alarm = None
        if self.replication is not None:
            self.replication.after(
                seq, lambda: self._durable(position, streams), lambda: self.journal.failed(position)
            )
        else:
            self._durable(position, streams)
        self._caught_up()
        if self.journal.has_pending:
            self._call = self.reactor.callLater(0, self._write)

    def _durable(self, position: int, streams: Sequence[tuple[StagedStream, list[Staged], list[int]]]) -> None:
        """What was written up to ``position`` is durable (on every copy in sync, in a
        cluster): release its confirms, and let the streams' readers have their chunks."""
        self.journal.synced_to(position)
        for stream, staged, _dropped in streams:
            # Readable now; a stream whose readers fail here stops neither the others nor the writer.
            try:
                stream.written(staged)
            except Exception:
                self._log.failure("delivering from stream {name!r} failed", name=stream.name)

    def _checkpointed(self, captured: Captured, problem: OSError | None) -> None:
        if problem is None:
            self.checkpoints += 1
            # Only it is needed now (until then, so was the one before).
            self.journal.ledger.protect(captured.first, captured.segments, keep=False)
        elif str(problem) != self.checkpoint_problem:
            self.checkpoint_problem = str(problem)
            self._log.error("cannot write a checkpoint: {error}", error=str(problem))

    def checkpoint(self) -> Captured | None:
        """Write a checkpoint where the log ends (a clean stop: the log is flushed and its worker
        stopped); ``None``, and a log line saying why, when none could be written."""
        if self.alarm is not None:
            self._log.info("no checkpoint: the write-ahead log failed; the next start reads all of it")
            return None
        self._since_checkpoint = 0
        captured = self._capture()
        if captured is not None:
            try:
                captured.commit()
            except OSError as error:
                self._checkpointed(captured, error)
                return None
            self._checkpointed(captured, None)
            self._checkpoint_written()
            if self.replication is not None:
                self._send()
        return captured

    @property
    def segments(self) -> int:
        """Segment files in the log directory, the active one included."""
        return len(self._segments)

    @property
    def size(self) -> int:
        """Bytes in the log's segment files (archived ones not included)."""
        return sum(self._sealed_bytes.values()) + self._filled

    def _failed(
        self,
        failure: Failure,
        position: int,
        streams: Sequence[tuple[StagedStream, list[Staged], list[int]]] = (),
    ) -> None:
        self._writing = None
        error = failure.value
        if self.alarm is None:
            self._log.error("write-ahead log write failed: {error}; refusing confirms", error=str(error))
        self.alarm = str(error)
        for stream, _staged, dropped in streams:
            # Its chunks stay staged: the next write writes them (what was written is not written twice).
            self.journal.stream_retry(stream, dropped)
        self.journal.failed(position)
        self._caught_up()
        if self.journal.has_pending:
            self._call = self.reactor.callLater(max(self.interval, 0.1), self._write)

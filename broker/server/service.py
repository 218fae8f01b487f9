"""Assembling the broker as a Twisted service: the node, the AMQP listener(s), graceful shutdown."""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService, Service
from twisted.internet import defer, endpoints
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure
from zope.interface import implementer

from broker.core.definitions import node_from_config
from broker.core.histogram import Histogram
from broker.core.journal import Journal
from broker.core.node import ListenerInfo, Node
from broker.core.stream import StreamQueue
from broker.server.alarms import ResourceMonitor, memory_total, release_memory
from broker.server.management import RateSampler, management_site
from broker.server.metrics import BrokerCollector, metrics_site
from broker.server.pluginloader import LoadedPlugins, load_plugins
from broker.server.protocol import AMQPServerFactory
from broker.server.shovels import Shovels
from broker.server.streamprotocol import StreamServerFactory
from broker.storage.checkpoint import (
    CHECKPOINT_BYTES,
    Captured,
    Checkpoint,
    CheckpointError,
    CheckpointRefused,
    capture,
    discard_checkpoint,
    read_checkpoint,
    restore_checkpoint,
)
from broker.storage.deadletters import open_dead_letters
from broker.storage.paging import Pager, PageStore
from broker.storage.spooling import SPOOL_DIR, SPOOL_WINDOW, Spooler
from broker.storage.streams import STREAMS_DIR, StreamFiles, remove_stream
from broker.storage.writer import WorkerWriter
from broker.wal.files import DirectoryStorage, prune_archive
from broker.wal.log import RecoveryReport, WriteAheadLog
from broker.wal.records import WALCorruption
from broker.wal.recovery import Snapshot, replay_located
from broker.wal.segments import SEGMENT_HEADER_BYTES
from broker.wal.streamlog import Staged
from config.schema import BrokerConfig, embedded_default
from config.tls import TLSProblem, server_context
from config.values import ConfigError, Problem

#: Allocations between young-generation collections. Messages and queue entries are
#: allocated at 100k+/s and never form cycles; at the default (700) the collector would walk
#: every queued message many times a second.
GC_THRESHOLD = 100_000


#: A checkpoint is captured on the reactor thread (each durable queue's messages in memory are
#: turned into records): the next one waits at least this many times as long as the last took.
CAPTURE_SHARE = 20


def tune_gc() -> None:
    """Collect cycles less often (see :data:`GC_THRESHOLD`) and keep start-up objects out of it."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)


@dataclass(frozen=True, slots=True)
class Archive:
    """Where retired segments go and how long they stay (``storage.archive``)."""

    path: str
    retention: float
    max_bytes: int


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
    ) -> None:
        super().__init__("postroom-wal")
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
        if oldest != self._active and self.journal.sparse(oldest):
            # Copy its few live messages forward; it is retired once the copies are synced.
            self.journal.rewrite(oldest)
        first = b""
        if self._filled + self.journal.pending_bytes > self._segment_bytes and self._filled > SEGMENT_HEADER_BYTES:
            # Rotate: the new segment starts with the topology as it is now (reactor thread).
            first = self.journal.topology(self.node.vhosts.values())
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
        retire = self.journal.retirable(self._segments, self._active)
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
            self.journal.protect(1 << 62, (), keep=False)
            return None
        if self.checkpoint_problem is not None:
            self._log.info("checkpoints are taken again")
            self.checkpoint_problem = None
        self.journal.protect(captured.first, captured.segments)
        return captured

    def _append(
        self,
        data: bytes,
        first: bytes,
        retire: list[int],
        captured: Captured | None = None,
        streams: Sequence[tuple[StreamQueue, list[Staged], list[int]]] = (),
        deleted_streams: Sequence[str] = (),
    ) -> tuple[float, Captured | None, OSError | None]:
        """Worker thread: write the streams' chunks (each stream's with one fsync), then rotate
        first when asked (``first`` opens the new segment), append, fsync, write the checkpoint
        ``captured`` with them, then retire the segments no live message needs (to the archive,
        when enabled), and remove the stream segments retention dropped.

        Returns the seconds the append and fsync took, the checkpoint and why it failed.
        """
        started = time.monotonic()
        try:
            for stream, staged, _dropped in streams:
                if staged:
                    stream.log.write(staged)
            if first:
                self.wal.rotate(first)
            self.wal.append(data)
            if self.fsync != "never":
                self.wal.sync()
        except BaseException:
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
        for number in retire:
            self.wal.retire(number)
        for stream, _staged, dropped in streams:
            if dropped:
                stream.log.remove(dropped)
        for path in deleted_streams:
            remove_stream(path)
        if retire and self.archive is not None:
            prune_archive(self.archive.path, self.archive.retention, self.archive.max_bytes, time.time())
        return took, captured, problem

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
        result: tuple[float, Captured | None, OSError | None],
        position: int,
        streams: Sequence[tuple[StreamQueue, list[Staged], list[int]]] = (),
    ) -> None:
        seconds, captured, problem = result
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
        self.journal.synced_to(position)
        for stream, staged, _dropped in streams:
            # Readable now; a stream whose readers fail here stops neither the others nor the writer.
            try:
                stream.written(staged)
            except Exception:
                self._log.failure("delivering from stream {name!r} failed", name=stream.name)
        self._caught_up()
        if self.journal.has_pending:
            self._call = self.reactor.callLater(0, self._write)

    def _checkpointed(self, captured: Captured, problem: OSError | None) -> None:
        if problem is None:
            self.checkpoints += 1
            # Only it is needed now (until then, so was the one before).
            self.journal.protect(captured.first, captured.segments, keep=False)
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
        streams: Sequence[tuple[StreamQueue, list[Staged], list[int]]] = (),
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


class BrokerService(MultiService):
    """The broker: its listeners (AMQP, metrics, management) as children, and the log writer.

    Stopping is sequential on purpose (``MultiService`` would stop every child at once):
    listeners stop accepting, connections are closed with 320 CONNECTION_FORCED (their unacked
    deliveries go back to their queues), and only then is the log flushed, synced and closed.
    """

    _log = Logger()

    def __init__(
        self,
        factory: AMQPServerFactory,
        wal: WALService | None = None,
        sampler: RateSampler | None = None,
        dead_letters: Service | None = None,
    ) -> None:
        super().__init__()
        self.factory = factory
        self.wal = wal
        self.sampler = sampler
        #: Writes the dead-letter event stream (``broker.storage.deadletters``), with a log directory.
        self.dead_letters = dead_letters

    def startService(self) -> None:
        """Listen first, then start the writers: a listener that cannot bind raises
        :class:`ListenError` with nothing started (no worker thread to keep the process up).

        The reactor is not running yet, so no connection is served before the writers start.
        """
        try:
            super().startService()
        except ListenError:
            for child in self:
                if child.running:
                    child.stopService()
            self.running = False
            raise
        if self.wal is not None:
            self.wal.startService()
        if self.dead_letters is not None:
            self.dead_letters.startService()
        if self.sampler is not None:
            self.sampler.start()

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        self._log.info(
            "shutting down: no new connections; closing {count} connection(s)", count=len(self.factory.protocols)
        )
        yield super().stopService()
        if self.sampler is not None:
            self.sampler.stop()
        yield self.factory.close_all()
        if self.wal is not None:
            yield self.wal.stopService()
            self._log.info("write-ahead log flushed and synced")
        # After the connections closed: their unacked dead letters went back to their queues.
        if self.dead_letters is not None:
            yield self.dead_letters.stopService()
        if self.wal is not None and self.wal.data_dir is not None:
            started = time.monotonic()
            captured = self.wal.checkpoint()
            if captured is not None:
                self._log.info(
                    "checkpoint written: {messages} message(s) in {queues} durable queue(s) in {seconds:.3f} s",
                    messages=captured.messages,
                    queues=len(captured.queues),
                    seconds=time.monotonic() - started,
                )


def archive_of(config: BrokerConfig) -> Archive | None:
    """The configuration's segment archive (``<storage.dir>/archive``), or ``None`` when disabled."""
    archive = config.storage.archive
    if not archive.enabled:
        return None
    return Archive(str(Path(config.storage.dir) / "archive"), archive.retention, archive.max_bytes)


def open_log(
    config: BrokerConfig, checkpoint: Checkpoint | None = None
) -> tuple[WriteAheadLog, RecoveryReport, DirectoryStorage]:
    """Open the configuration's log directory, truncating a torn tail.

    :param checkpoint: the latest checkpoint: the log is read only after its position (not at
        all when it ends there, as after a clean stop)
    :raises WALCorruption: a record is damaged in the middle of what is read (see ``postroom wal
        check``), or a segment ``checkpoint`` needs is missing
    """
    storage = config.storage
    archive = archive_of(config)
    segments = DirectoryStorage(storage.dir, archive.path if archive is not None else None)
    log = WriteAheadLog(segments, storage.segment_bytes)
    if checkpoint is None:
        return log, log.open(), segments
    numbers = segments.list_segments()
    missing = sorted(checkpoint.segments - set(numbers))
    if missing:
        raise WALCorruption(f"segments {missing} are named by the checkpoint and missing", missing[0], 0)
    if numbers and numbers[-1] == checkpoint.segment and segments.size(checkpoint.segment) == checkpoint.offset:
        report = log.open_at(checkpoint.segment, checkpoint.offset)
    else:
        report = log.open(start=(checkpoint.segment, checkpoint.offset))
    return log, report, segments


@dataclass(slots=True)
class _Recovered:
    log: WriteAheadLog
    report: RecoveryReport
    journal: Journal
    pager: Pager
    node: Node
    snapshot: Snapshot
    messages: int
    queues: int


def memory_budget(config: BrokerConfig, memory: int | None = None) -> int:
    """The budget in force for queued messages in memory: ``storage.memory_budget``, but never
    above half the memory alarm's watermark (RabbitMQ's paging ratio), so the broker spools
    before it blocks publishers.

    :param memory: the machine's memory in bytes (default: read it)
    """
    limit = config.limits.memory_limit(memory_total() if memory is None else memory)
    return min(config.storage.memory_budget, limit // 2)


def _recover(
    config: BrokerConfig, reactor: Any, extensions: dict[str, Any], checkpoint: Checkpoint | None, budget: int
) -> _Recovered:
    """The node as the log describes it: all of it, or the latest ``checkpoint`` and the log after it.

    :raises WALCorruption: see :func:`open_log`
    :raises OSError: reading the checkpoint's files failed
    """
    log, report, _storage = open_log(config, checkpoint)
    start = checkpoint.topology if checkpoint is not None else None
    snapshot = replay_located(log.located_records(), start)
    log.forget()
    journal = Journal(snapshot.max_message_id + 1, reactor.seconds)
    pager = Pager(PageStore(str(Path(config.storage.dir) / "paging")), budget, reactor, journal)
    pager.spooler = spooler = Spooler(
        str(Path(config.storage.dir) / SPOOL_DIR), pager.store, journal, log.storage.read_at, SPOOL_WINDOW
    )

    def adopt(node: Node) -> None:
        assert checkpoint is not None
        node.recovered_dead_letter_queues = restore_checkpoint(checkpoint, snapshot, node.vhosts, journal, spooler)

    node = node_from_config(
        config,
        reactor,
        journal,
        snapshot,
        log.storage.read_at,
        pager=pager,
        before_messages=adopt if checkpoint is not None else None,
        streams=StreamFiles(str(Path(config.storage.dir) / STREAMS_DIR), journal, reactor),
        **extensions,
    )
    pager.on_flow = node.set_flow
    messages = snapshot.message_count
    if checkpoint is not None:
        journal.protect(checkpoint.segment, checkpoint.segments, keep=False)
        messages = sum(
            queue.message_count + queue.unacked_count
            for vhost in node.vhosts.values()
            for queue in vhost.queues.values()
            if queue.journal is not None
        )
    return _Recovered(log, report, journal, pager, node, snapshot, messages, len(snapshot.queues))


def _checkpoint(config: BrokerConfig) -> Checkpoint | None:
    """The latest checkpoint, if there is a usable one (any other is deleted)."""
    try:
        checkpoint = read_checkpoint(config.storage.dir)
    except CheckpointError as error:
        _log.warn("the checkpoint is not used ({reason}); reading the whole write-ahead log", reason=str(error))
        checkpoint = None
    if checkpoint is None:
        discard_checkpoint(config.storage.dir)
    return checkpoint


def make_broker_service(
    reactor: Any,
    config: BrokerConfig | None = None,
    amqp_endpoints: list[str] | None = None,
    node: Node | None = None,
    persist: bool = True,
    plugins: LoadedPlugins | None = None,
) -> BrokerService:
    """Build the broker service: load the plugins, recover from the log, apply definitions, listen.

    :param reactor: the reactor (listening, timers, the log's worker thread)
    :param config: the configuration; the embedded default when omitted
    :param amqp_endpoints: AMQP listeners (Twisted endpoint strings) instead of the configuration's
    :param node: a ready node instead of one built from the configuration (nothing is persisted)
    :param persist: keep durable state in the configuration's log directory
    :param plugins: plugins already loaded (default: load the configuration's ``plugins:``)
    :raises ConfigError: the configuration's definitions were refused, or a plugin failed to
        load (``PluginError``, naming the plugin and the reason)
    :raises WALCorruption: the log is damaged in the middle
    """
    config = config or embedded_default()
    wal = None
    if node is None and plugins is None:
        plugins = load_plugins(config.plugins, reactor, source=config.source)
    extensions: dict[str, Any] = {}
    if plugins is not None:
        extensions = {
            "registry": plugins.registry,
            "hooks": plugins.hooks,
            "authenticators": plugins.authenticators,
        }
    dead_letters = None
    pager = None
    if node is None:
        if persist:
            started = time.monotonic()
            budget = memory_budget(config)
            checkpoint = _checkpoint(config)
            try:
                recovered = _recover(config, reactor, extensions, checkpoint, budget)
            except (WALCorruption, OSError) as error:
                if checkpoint is None:
                    raise
                _log.warn("the checkpoint is not used ({reason}); reading the whole write-ahead log", reason=str(error))
                discard_checkpoint(config.storage.dir)
                checkpoint = None
                recovered = _recover(config, reactor, extensions, None, budget)
            log, report, journal, pager, node = (
                recovered.log,
                recovered.report,
                recovered.journal,
                recovered.pager,
                recovered.node,
            )
            if plugins is not None:
                plugins.node_ready(node, recovered.snapshot)
            paged = pager.page_logged()
            messages, durable_queues = recovered.messages, recovered.queues
            del recovered  # its snapshot held every record read from the log
            release_memory()
            stream = config.storage.deadletters
            dead_letters = open_dead_letters(
                config.storage.dir, node, reactor, config.storage.fsync, stream.retention, stream.max_bytes
            )
            wal = WALService(
                journal,
                log,
                reactor,
                config.storage.fsync,
                config.storage.fsync_interval_ms / 1000,
                node,
                archive_of(config),
                pager,
                config.storage.max_backlog,
                config.storage.dir,
                config.storage.checkpoint_bytes,
            )
            read = (
                f"the checkpoint at segment {checkpoint.segment} and the {report.records} record(s)"
                f" ({report.bytes} bytes) logged after it"
                if checkpoint is not None
                else f"{report.segments} segment(s) ({report.bytes} bytes, {report.records} records)"
            )
            _log.info(
                "recovered {messages} message(s) in {queues} durable queue(s) from {read} in {seconds:.3f} s;"
                " torn tail: {truncated} bytes truncated; {paged} bodies left in the log (memory budget)",
                messages=messages,
                queues=durable_queues,
                read=read,
                seconds=time.monotonic() - started,
                truncated=report.truncated_bytes,
                paged=paged,
            )
        else:
            node = node_from_config(config, reactor, **extensions)
            if plugins is not None:
                plugins.node_ready(node)
    elif plugins is not None:
        plugins.node_ready(node)
    factory = AMQPServerFactory(node, reactor)
    sampler = RateSampler(node, reactor) if config.listen.management else None
    service = BrokerService(factory, wal, sampler, dead_letters)
    if pager is not None:
        pager.setServiceParent(service)
    for plugin_service in plugins.services if plugins is not None else ():
        # Children start in order: plugin services before the listeners, stopped with them.
        plugin_service.setServiceParent(service)
    memory = memory_total()
    ResourceMonitor(
        node,
        reactor,
        config.limits.memory_limit(memory),
        config.storage.dir if wal is not None else None,
        config.limits.disk_limit(memory),
    ).setServiceParent(service)
    tls = tls_wrapper(config, reactor)
    certificates = (config.tls.certificate, config.tls.ca) if config.tls is not None else None
    for description in amqp_endpoints or [config.listen.amqp]:
        Listener("amqp", description, factory, reactor, node, "amqp").setServiceParent(service)
    if config.listen.amqps and tls is not None:
        Listener(
            "amqps", config.listen.amqps, tls(factory), reactor, node, "amqp/ssl", certificates
        ).setServiceParent(service)
    plain, secure = stream_addresses(config)
    if config.listen.stream and plain is not None:
        streams = StreamServerFactory(node, reactor, plain)
        Listener("stream", config.listen.stream, streams, reactor, node, "stream").setServiceParent(service)
    if config.listen.stream_tls and tls is not None and secure is not None:
        streams = StreamServerFactory(node, reactor, secure)
        Listener(
            "stream_tls", config.listen.stream_tls, tls(streams), reactor, node, "stream/ssl", certificates
        ).setServiceParent(service)
    http_tls = tls if tls is not None and config.tls is not None and config.tls.http else None
    http, http_certificates = ("https", certificates) if http_tls else ("http", None)
    if config.listen.metrics:
        collector = BrokerCollector(node, wal, config.metrics.rabbitmq_compatible)
        site = metrics_site(collector, reactor)
        site = http_tls(site) if http_tls else site
        Listener(
            "metrics", config.listen.metrics, site, reactor, node, f"{http}/prometheus", http_certificates
        ).setServiceParent(service)
    if sampler is not None and config.listen.management:
        site = management_site(node, sampler, reactor, reports=config.ui.reports)
        site = http_tls(site) if http_tls else site
        Listener(
            "management", config.listen.management, site, reactor, node, http, http_certificates
        ).setServiceParent(service)
    # Last: shovels start once the listeners are bound (one to amqp:// connects to them) and
    # stop first, while the node still serves.
    Shovels(node, reactor).setServiceParent(service)
    return service


def stream_addresses(config: BrokerConfig) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """The host and port the stream protocol's listener and its TLS listener advertise
    (``None`` for one that is off): the ``stream:`` section's, as RabbitMQ's
    ``stream.advertised_*`` (the TLS listener's host defaults to ``advertised_host``), else
    each listener's own (:func:`advertised`)."""
    announced, listen = config.stream, config.listen
    plain = advertised(listen.stream, announced.advertised_host, announced.advertised_port) if listen.stream else None
    secure = None
    if listen.stream_tls:
        host = announced.advertised_tls_host or announced.advertised_host
        secure = advertised(listen.stream_tls, host, announced.advertised_tls_port)
    return plain, secure


def advertised(endpoint: str, host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """The host and port a listener on ``endpoint`` tells stream clients to connect to:
    ``host`` and ``port`` when configured (``stream.advertised_*``), else its interface (the
    machine's name when it listens on all of them) and its port."""
    fields = dict(part.split("=", 1) for part in endpoint.split(":")[2:] if "=" in part)
    parts = endpoint.split(":")
    listening = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 5552
    interface = fields.get("interface", "")
    own = interface if interface not in ("", "0.0.0.0", "::") else socket.gethostname()
    return host or own, port or listening


def tls_wrapper(config: BrokerConfig, reactor: Any) -> Callable[[Any], Any] | None:
    """A function wrapping a listener's factory in TLS with the configuration's ``tls:``
    settings (``None`` without them). ``reactor`` runs the TLS layer's write batching.

    :raises ConfigError: a TLS file is missing or wrong (``config.tls.TLSProblem``, with the key)
    """
    if config.tls is None:
        return None
    try:
        creator = _ServerTLS(server_context(config.tls))
    except TLSProblem as problem:
        raise ConfigError(config.source, [Problem(None, problem.key, problem.reason)]) from None
    return lambda factory: TLSMemoryBIOFactory(creator, False, factory, clock=reactor)


@implementer(IOpenSSLServerConnectionCreator)
class _ServerTLS:
    """One TLS server connection per accepted socket, all from one context."""

    def __init__(self, context: Any) -> None:
        self.context = context

    def serverConnectionForTLS(self, protocol: Any) -> Any:
        from OpenSSL import SSL

        return SSL.Connection(self.context, None)


class ListenError(SystemExit):
    """A listener could not bind: its name, its endpoint and the reason, in one line.

    A ``SystemExit``, so that under ``twistd`` too the process ends with this line and status
    1, not with a traceback.
    """


class Listener(StreamServerEndpointService):
    """A listener that fails loudly: a port in use, no permission or a bad address raises
    :class:`ListenError` from ``startService`` instead of logging a traceback and carrying on
    without the listener.

    :param kind: what it serves (``amqp``, ``metrics``, ``management``), for the message
    :param description: its Twisted endpoint string
    :param node: the node that lists it once it is bound (:attr:`Node.listeners`), as ``protocol``
    :param certificates: a TLS listener's certificate file and CA files
    """

    def __init__(
        self,
        kind: str,
        description: str,
        factory: Any,
        reactor: Any,
        node: Node | None = None,
        protocol: str = "",
        certificates: tuple[str, tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(endpoints.serverFromString(reactor, description), factory)
        self.kind = kind
        self.description = description
        self._raiseSynchronously = True
        self._node = node
        self._protocol = protocol
        self._certificates = certificates
        self._listed: ListenerInfo | None = None

    def privilegedStartService(self) -> None:
        # twistd binds here, before dropping privileges; postroom serve through startService.
        self._refusing(super().privilegedStartService)

    def startService(self) -> None:
        self._refusing(super().startService)

    def _refusing(self, start: Any) -> None:
        try:
            start()
        except Exception as error:
            self.running = False
            reason = getattr(error, "socketError", None) or error
            raise ListenError(f"cannot listen for {self.kind} on {self.description}: {reason}") from None
        if self._node is not None and self._listed is None:
            self._waitingForPort.addCallback(self._list)

    def _list(self, port: Any) -> Any:
        """Add the bound socket to the node's listeners (until the listener stops)."""
        address = port.getHost()
        certfile, cacertfiles = self._certificates or (None, ())
        self._listed = ListenerInfo(self._protocol, address.host, address.port, certfile, cacertfiles)
        self._node.listeners.append(self._listed)  # type: ignore[union-attr]
        return port

    def stopService(self) -> Any:
        if self._listed is not None and self._node is not None and self._listed in self._node.listeners:
            self._node.listeners.remove(self._listed)
        self._listed = None
        return super().stopService()


_log = Logger()

"""Recovering the node from storage at start: the latest checkpoint and the log after it.

:func:`recover` opens the log directory (:func:`open_log`) and replays what it holds onto a node
built from the configuration, with the pager, the spooler and the streams' files in place;
:func:`open_storage` does so and opens the writers (the log's, the dead-letter stream's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.queue import WorkQueue
from postroom.broker.storage.body_paging import Pager
from postroom.broker.storage.checkpoint import (
    Checkpoint,
    CheckpointError,
    discard_checkpoint,
    read_checkpoint,
    restore_checkpoint,
)
from postroom.broker.storage.dead_letter_writer import DeadLetterService, open_dead_letters
from postroom.broker.storage.logwriter import Replication, WALService, archive_of
from postroom.broker.storage.page_store import PageStore
from postroom.broker.storage.spool_files import SPOOL_DIR, SPOOL_WINDOW, Spooler
from postroom.broker.storage.streams import STREAMS_DIR, StreamFiles
from postroom.broker.wal.files import DirectoryStorage, FileRecorder
from postroom.broker.wal.log import RecoveryReport, WriteAheadLog
from postroom.broker.wal.records import WALCorruption
from postroom.broker.wal.recovery import Snapshot, replay_located
from postroom.config.schema import BrokerConfig

_log = Logger()


def open_log(
    config: BrokerConfig, checkpoint: Checkpoint | None = None, recorder: FileRecorder | None = None
) -> tuple[WriteAheadLog, RecoveryReport, DirectoryStorage]:
    """Open the configuration's log directory, truncating a torn tail.

    :param checkpoint: the latest checkpoint: the log is read only after its position (not at
        all when it ends there, as after a clean stop)
    :param recorder: told of every change to the log's files (a cluster's leader)
    :raises WALCorruption: a record is damaged in the middle of what is read (see ``postroom wal
        check``), or a segment ``checkpoint`` needs is missing
    """
    storage = config.storage
    archive = archive_of(config)
    segments = DirectoryStorage(storage.dir, archive.path if archive is not None else None, recorder)
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
class Recovered:
    """What :func:`recover` read and built."""

    log: WriteAheadLog
    report: RecoveryReport
    journal: Journal
    pager: Pager
    node: Node
    snapshot: Snapshot
    messages: int
    queues: int


def recover(
    config: BrokerConfig,
    reactor: Any,
    extensions: dict[str, Any],
    checkpoint: Checkpoint | None,
    budget: int,
    recorder: FileRecorder | None = None,
) -> Recovered:
    """The node as the log describes it: all of it, or the latest ``checkpoint`` and the log after it.

    :param recorder: told of every change to the log's and the streams' files (a cluster's leader)

    :raises WALCorruption: see :func:`open_log`
    :raises OSError: reading the checkpoint's files failed
    """
    log, report, _storage = open_log(config, checkpoint, recorder)
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
        streams=StreamFiles(str(Path(config.storage.dir) / STREAMS_DIR), journal, reactor, recorder),
        **extensions,
    )
    pager.on_flow = node.set_flow
    messages = snapshot.message_count
    if checkpoint is not None:
        journal.ledger.protect(checkpoint.segment, checkpoint.segments, keep=False)
        messages = sum(
            queue.message_count + queue.unacked_count
            for vhost in node.vhosts.values()
            for queue in vhost.queues.values()
            if isinstance(queue, WorkQueue) and queue.journal is not None
        )
    return Recovered(log, report, journal, pager, node, snapshot, messages, len(snapshot.queues))


def latest_checkpoint(config: BrokerConfig) -> Checkpoint | None:
    """The latest checkpoint, if there is a usable one (any other is deleted)."""
    try:
        checkpoint = read_checkpoint(config.storage.dir)
    except CheckpointError as error:
        _log.warn("the checkpoint is not used ({reason}); reading the whole write-ahead log", reason=str(error))
        checkpoint = None
    if checkpoint is None:
        discard_checkpoint(config.storage.dir)
    return checkpoint


@dataclass(slots=True)
class Storage:
    """What :func:`open_storage` opened: the recovered node and the services that write for it."""

    node: Node
    #: Writes the journal's records to the log.
    wal: WALService
    #: Pages the bodies of deep queues.
    pager: Pager
    #: Writes the dead-letter event stream.
    dead_letters: DeadLetterService


def open_storage(
    config: BrokerConfig,
    reactor: Any,
    extensions: dict[str, Any],
    budget: int,
    backlog: int,
    ready: Callable[[Node, Snapshot], None] | None = None,
    replication: Replication | None = None,
) -> Storage:
    """Recover the node from the configuration's storage directory (from its latest checkpoint
    when there is a usable one, else from the whole log) and open its writers.

    :param extensions: what the plugins add to the node (see ``node_from_config``)
    :param budget: the bytes of message bodies kept in memory (see ``Pager``)
    :param backlog: the bytes of records waiting for the log's writer past which publishers
        are paused
    :param ready: called with the node and the log's snapshot once the node is built
    :param replication: a cluster leader's link to its followers: what the log's writer
        writes is sent to them, and confirms wait for those in sync
    :raises WALCorruption: the log is damaged in the middle
    """
    started = time.monotonic()
    recorder = replication.recorder if replication is not None else None
    checkpoint = latest_checkpoint(config)
    try:
        recovered = recover(config, reactor, extensions, checkpoint, budget, recorder)
    except (WALCorruption, OSError) as error:
        if checkpoint is None:
            raise
        _log.warn("the checkpoint is not used ({reason}); reading the whole write-ahead log", reason=str(error))
        discard_checkpoint(config.storage.dir)
        checkpoint = None
        recovered = recover(config, reactor, extensions, None, budget, recorder)
    log, report, journal, pager, node = (
        recovered.log,
        recovered.report,
        recovered.journal,
        recovered.pager,
        recovered.node,
    )
    if ready is not None:
        ready(node, recovered.snapshot)
    paged = pager.page_logged()
    messages, durable_queues = recovered.messages, recovered.queues
    del recovered  # its snapshot held every record read from the log
    stream = config.storage.deadletters
    dead_letters = open_dead_letters(
        config.storage.dir, node, reactor, config.storage.fsync, stream.retention, stream.max_bytes, replication
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
        backlog,
        config.storage.dir,
        config.storage.checkpoint_bytes,
        replication,
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
    return Storage(node, wal, pager, dead_letters)

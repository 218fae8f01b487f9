"""Checkpoints: what a start needs, so that it does not read the whole log.

A checkpoint describes the durable state at one position of the write-ahead log. It is written
under ``<storage.dir>/checkpoint``:

* each durable queue's logged messages in delivery order (unacknowledged ones in their place),
  as spool records (:class:`~broker.core.entry_spool.SpoolRecord`, 44 bytes each) pointing at their
  ``Published`` records in the log: the messages in memory are written out, and the spool
  files already holding records are hard-linked in, not copied;
* the topology (policies, durable exchanges, queues, bindings) as log records, the next
  message id, the log segments each queue's records point into, and which queues hold dead
  letters (one of their messages that leaves with a dead-letter id is then recorded as settled);
* last, ``manifest.json``, naming all of it and the log position.

The broker takes one while running, each time ``storage.checkpoint_bytes`` more of log have
been written (:func:`capture` on the reactor thread, right after the journal hands the log writer
its records; :meth:`Captured.commit` on the writer's thread, once those records are synced),
and one at a clean stop. Files are fsynced, the manifest last, and the directory is swapped
with the last one by two renames: a crash at any point leaves the old checkpoint or the new
one whole (a start without one reads the whole log).

A start with a checkpoint reads the log only from its position (:meth:`~broker.wal.log.WriteAheadLog.open`
with ``start``; after a clean stop there is nothing to read). Messages published after it are
restored as the log describes them, behind each queue's checkpointed records; removals and
delivery counts of checkpointed messages are applied as their records are read back. The
checkpoint's segments are not retired, nor its records' segments rewritten, until the next
checkpoint replaces it (``Journal.protect``).

While logged messages are held outside queues and channels (by a plugin: the delayed-message
exchange holds what it schedules), no checkpoint can be taken: the last one is deleted, and a
start reads the whole log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from postroom.broker.core.entry_spool import IN_LOG, RECORD_BYTES, REDELIVERED, SpoolRecord, pack_record, unpack_records
from postroom.broker.core.queue import CheckpointRefused, WorkQueue
from postroom.broker.storage.page_store import write_all
from postroom.broker.wal.files import _sync_directory
from postroom.broker.wal.recovery import Snapshot, replay
from postroom.broker.wal.segments import scan

if TYPE_CHECKING:
    from postroom.broker.core.entry import Entry
    from postroom.broker.core.journal import Journal
    from postroom.broker.core.node import Node
    from postroom.broker.core.vhost import VirtualHost
    from postroom.broker.storage.spool_files import Spooler

__all__ = [
    "CHECKPOINT_BYTES",
    "CHECKPOINT_DIR",
    "Captured",
    "Checkpoint",
    "CheckpointError",
    "CheckpointRefused",
    "capture",
    "discard_checkpoint",
    "read_checkpoint",
    "restore_checkpoint",
]

#: The checkpoint's directory under ``storage.dir`` (``.new`` while one is being written).
CHECKPOINT_DIR = "checkpoint"
MANIFEST = "manifest.json"
VERSION = 1

#: Bytes of log written after which the broker takes a checkpoint: a start after a crash reads
#: at most about this much log (plus what a write carries), about 200,000 small messages.
CHECKPOINT_BYTES = 16 << 20

#: Records read back at once when a queue that does not spool is restored.
_LOAD_BATCH = 1024


class CheckpointError(Exception):
    """A checkpoint cannot be used; the reason says why (the log is read instead)."""


@dataclass(slots=True)
class CheckpointedQueue:
    """One queue's records: ``files`` as ``(path, bytes to skip, bytes of records)``, in order,
    and how many records point into each log segment."""

    vhost: str
    name: str
    #: Messages (the records of logged messages), and all records in the files (some may
    #: be copies of messages that were not logged: they are skipped).
    count: int
    bytes: int
    files: list[tuple[str, int, int]]
    refs: dict[int, int]
    records: int = 0
    #: Ids among the records that were removed, and delivery counts that changed, before this
    #: checkpoint (it linked in records a start had adopted and not read yet).
    removed: set[int] = field(default_factory=set)
    counts: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Checkpoint:
    """A checkpoint as read back (see the module)."""

    directory: str
    #: Where the log goes on after it: ``(segment, offset)``.
    segment: int
    offset: int
    next_message_id: int
    topology: Snapshot
    queues: list[CheckpointedQueue] = field(default_factory=list)
    #: Durable queues that held dead letters (``DeadLetterLog.unlisted``).
    dead_letter_queues: set[str] = field(default_factory=set)

    @property
    def segments(self) -> set[int]:
        """The log segments its records point into."""
        return {number for queue in self.queues for number in queue.refs}


def _write_file(path: str, parts: list[bytes]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, parts)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _QueueFiles:
    """One queue's part of a checkpoint being captured: records to write, files linked, in order."""

    def __init__(self, directory: str, number: int, vhost: str, name: str) -> None:
        self.prefix = os.path.join(directory, f"{number:08d}")
        self.vhost, self.name = vhost, name
        self.files: list[tuple[str, int, int]] = []
        #: Files still to write, with their records packed.
        self.pending: list[tuple[str, list[bytes]]] = []
        self.linked: list[str] = []
        self.count = self.bytes = self.records = 0
        self.refs: Counter[int] = Counter()
        self.removed: set[int] = set()
        self.counts: dict[int, int] = {}

    def add(self, suffix: str, records: list[SpoolRecord]) -> None:
        if records:
            path = f"{self.prefix}.{suffix}"
            self.pending.append((path, [pack_record(*record) for record in records]))
            self.files.append((path, 0, len(records) * RECORD_BYTES))
            self.count += len(records)
            self.records += len(records)
            self.bytes += sum([record[4] for record in records])  # SpoolRecord.size
            self.refs.update([record[2] for record in records])  # SpoolRecord.segment

    def link(self, storage: Any, start: int, end: int, copies: int, size: int) -> None:
        """Link in the spool files holding bytes ``start`` to ``end`` of ``storage``: records of
        which ``copies`` point at page-store copies, the others at ``size`` body bytes in the
        log. Their references are counted by the caller."""
        for index, (source, skip, length) in enumerate(storage.files(start, end)):
            path = f"{self.prefix}.{index:06d}"
            os.link(source, path)
            self.files.append((path, skip, length))
            self.linked.append(path)
        records = (end - start) // RECORD_BYTES
        self.records += records
        self.count += records - copies
        self.bytes += size

    def manifest(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "count": self.count,
            "records": self.records,
            "bytes": self.bytes,
            "files": [[os.path.basename(path), skip, length] for path, skip, length in self.files],
            "refs": {str(number): count for number, count in sorted(self.refs.items()) if count},
            "removed": sorted(self.removed),
            "counts": {str(message_id): count for message_id, count in self.counts.items()},
        }


@dataclass(slots=True)
class Captured:
    """A checkpoint captured, not yet written: :meth:`commit` writes it (any thread), once the
    log is durable up to its position; :meth:`abandon` throws it away."""

    data_dir: str
    directory: str
    queues: list[_QueueFiles]
    topology: bytes
    manifest: dict[str, Any]

    @property
    def first(self) -> int:
        """The segment the log is read from after it."""
        return int(self.manifest["log"]["segment"])

    @property
    def segments(self) -> set[int]:
        return {number for queue in self.queues for number in queue.refs}

    @property
    def messages(self) -> int:
        return sum(queue.count for queue in self.queues)

    def commit(self) -> None:
        """Write the files, make them durable, and put the checkpoint in place of the last one.

        :raises OSError: it could not be written (the last one stays, in place or as
            ``checkpoint.old``, which a start takes)
        """
        final = os.path.join(self.data_dir, CHECKPOINT_DIR)
        try:
            for queue in self.queues:
                for path, parts in queue.pending:
                    _write_file(path, parts)
                for path in queue.linked:
                    _fsync(path)
            _write_file(os.path.join(self.directory, "topology"), [self.topology])
            _write_file(os.path.join(self.directory, MANIFEST), [json.dumps(self.manifest).encode()])
            _sync_directory(self.directory)
            # Both are whole now: swap them by renames, so that one always is in place.
            shutil.rmtree(final + ".old", ignore_errors=True)
            if os.path.exists(final):
                os.rename(final, final + ".old")
            os.rename(self.directory, final)
            _sync_directory(self.data_dir)
        except BaseException:
            self.abandon()
            raise
        shutil.rmtree(final + ".old", ignore_errors=True)

    def abandon(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def capture(data_dir: str, node: Node, journal: Journal, segment: int, offset: int) -> Captured:
    """Capture the durable state as the journal has recorded it, for a checkpoint at log position
    ``(segment, offset)``: where the records the journal handed out last end. Runs on the
    reactor thread; links spool files into the new checkpoint's directory.

    :raises CheckpointRefused: the state cannot be checkpointed (nothing is left behind)
    :raises OSError: a file could not be linked (nothing is left behind)
    """
    if journal.has_pending:
        raise CheckpointRefused("records are waiting for the write-ahead log")
    vhosts = list(node.vhosts.values())
    directory = os.path.join(data_dir, CHECKPOINT_DIR + ".new")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, mode=0o700)
    try:
        unacked, gone = _unacked(node)
        queues = _capture_queues(directory, vhosts, unacked)
        refs = Counter[int](gone)
        for queue in queues:
            refs.update(queue.refs)
        live = Counter({number: count for number, count in journal.ledger.live.items() if count})
        if +refs != live:
            outside = sum(live.values()) - sum(refs.values())
            if outside > 0:
                raise CheckpointRefused(f"{outside} logged message(s) are held outside queues and channels")
            raise CheckpointRefused(f"the queues hold {-outside or 'other'} message(s) the log does not count")
        topology = node.topology()
        dead_letter_queues = {
            queue.name
            for vhost in vhosts
            for queue in vhost.queues.values()
            if isinstance(queue, WorkQueue) and queue.journal is not None and queue.dead_letter_watch is not None
        }
        manifest = {
            "version": VERSION,
            "log": {"segment": segment, "offset": offset},
            "next_message_id": journal.next_message_id,
            "topology_crc": zlib.crc32(topology),
            "queues": [queue.manifest() for queue in queues],
            "dead_letter_queues": sorted(dead_letter_queues),
        }
        return Captured(data_dir, directory, queues, topology, manifest)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _unacked(node: Node) -> tuple[dict[WorkQueue, list[Entry]], Counter[int]]:
    """The deliveries the channels hold unacknowledged, by queue; and the log references of
    those from durable queues deleted since, by segment (the log says they are gone, but they
    count until the channel lets them go)."""
    held: dict[WorkQueue, list[Entry]] = {}
    gone: Counter[int] = Counter()
    for connection in node.connections:
        for channel in connection.channels.values():
            for entry in channel.consuming.unacked_entries():
                queue = entry.queue
                if not queue.deleted:
                    held.setdefault(queue, []).append(entry)
                elif (
                    isinstance(queue, WorkQueue)
                    and queue.journal is not None
                    and entry.message.wal_id
                    and queue.name in entry.message.wal_queues
                ):
                    gone[entry.message.wal_segment] += 1
    return held, gone


def _capture_queues(
    directory: str, vhosts: list[VirtualHost], unacked: dict[WorkQueue, list[Entry]]
) -> list[_QueueFiles]:
    """Each durable queue's records (the spool files linked in, the rest to write)."""
    queues = []
    number = 0
    for vhost in vhosts:
        for queue in list(vhost.queues.values()):
            if not isinstance(queue, WorkQueue) or queue.journal is None or queue.deleted:
                continue
            state = queue.checkpoint(unacked.get(queue, []))
            number += 1
            files = _QueueFiles(directory, number, vhost.name, queue.name)
            files.add("head", state.head)
            start, end = state.span
            if state.spool is not None and end > start:
                files.link(state.spool.storage, start, end, state.copies, state.span_bytes)
                files.refs.update(state.span_refs)
            files.add("tail", state.tail)
            files.removed, files.counts = state.removed, state.counts
            queues.append(files)
    return queues


def discard_checkpoint(data_dir: str) -> None:
    """Delete any checkpoint (and any half-written or replaced one): the next start reads the whole log."""
    final = os.path.join(data_dir, CHECKPOINT_DIR)
    for directory in (final + ".new", final + ".old", final):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, MANIFEST))
            _sync_directory(directory)
        shutil.rmtree(directory, ignore_errors=True)


def _in_place(data_dir: str) -> str:
    """The checkpoint directory, after a crash while one replaced another: the one in place if
    it is whole, else the new one if it is whole (written after the log it follows was synced),
    else the one it replaced (still whole, and kept until the new one was in place). The others
    are deleted."""
    final = os.path.join(data_dir, CHECKPOINT_DIR)
    for candidate in (final, final + ".new", final + ".old"):
        if os.path.exists(os.path.join(candidate, MANIFEST)):
            if candidate != final:
                shutil.rmtree(final, ignore_errors=True)
                os.rename(candidate, final)
                _sync_directory(data_dir)
            break
    shutil.rmtree(final + ".new", ignore_errors=True)
    shutil.rmtree(final + ".old", ignore_errors=True)
    return final


def read_checkpoint(data_dir: str) -> Checkpoint | None:
    """The checkpoint in ``data_dir``, or ``None`` if there is none (a half-written one is deleted;
    see :func:`_in_place` for one a crash left half replaced).

    :raises CheckpointError: there is one, but it cannot be used (a file is missing, short or
        damaged, or of another version); the reason names what
    """
    try:
        directory = _in_place(data_dir)
        with open(os.path.join(directory, MANIFEST), "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckpointError(f"cannot read its manifest: {error}") from None
    try:
        manifest = json.loads(data)
        if manifest.get("version") != VERSION:
            raise CheckpointError(f"version {manifest.get('version')!r}, not {VERSION}")
        with open(os.path.join(directory, "topology"), "rb") as file:
            topology = file.read()
        if zlib.crc32(topology) != manifest["topology_crc"]:
            raise CheckpointError("its topology is damaged")
        found = scan(topology)
        if found.problem is not None or found.end != len(topology):
            raise CheckpointError(f"its topology is damaged ({found.problem})")
        snapshot = replay(record for _start, _end, record in found.records)
        queues = []
        for item in manifest["queues"]:
            files = []
            for name, skip, length in item["files"]:
                path = os.path.join(directory, name)
                if os.stat(path).st_size < skip + length:
                    raise CheckpointError(f"{name} is shorter than its {skip + length} bytes")
                files.append((path, skip, length))
            if sum(length for _path, _skip, length in files) != item["records"] * RECORD_BYTES:
                raise CheckpointError(f"queue {item['name']!r}: its files do not hold {item['records']} records")
            refs = {int(number): count for number, count in item["refs"].items()}
            queues.append(
                CheckpointedQueue(
                    item["vhost"],
                    item["name"],
                    item["count"],
                    item["bytes"],
                    files,
                    refs,
                    records=item["records"],
                    removed=set(item["removed"]),
                    counts={int(message_id): count for message_id, count in item["counts"].items()},
                )
            )
            if item["count"]:
                snapshot.checkpointed.add((item["vhost"], item["name"]))
        snapshot.max_message_id = manifest["next_message_id"] - 1
        return Checkpoint(
            directory,
            manifest["log"]["segment"],
            manifest["log"]["offset"],
            manifest["next_message_id"],
            snapshot,
            queues,
            set(manifest["dead_letter_queues"]),
        )
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
        raise CheckpointError(f"it is damaged or incomplete ({error})") from None


def restore_checkpoint(
    checkpoint: Checkpoint, snapshot: Snapshot, vhosts: dict[str, VirtualHost], journal: Journal, spooler: Spooler
) -> set[str]:
    """Give each checkpointed queue its records (the topology is declared, no message restored
    yet), with what ``snapshot`` (the log read after the checkpoint) removed and counted since,
    and count their references in the journal. Returns the dead-letter queues among them.

    A queue that spools takes links to its files as its spool (the checkpoint keeps its own);
    one that does not (a priority queue) reads its messages back into memory now.

    :raises OSError: a file could not be linked, opened or read
    """
    for item in checkpoint.queues:
        key = (item.vhost, item.name)
        if key not in snapshot.checkpointed:
            continue  # deleted after the checkpoint (or empty)
        queue = vhosts[item.vhost].queues[item.name]
        assert isinstance(queue, WorkQueue)  # (a checkpoint holds work queues only)
        removed = item.removed | snapshot.removed_after.pop(key, set())
        counts = {**item.counts, **snapshot.counts_after.pop(key, {})}
        for number, count in item.refs.items():
            journal.ledger.restored_spooled(number, count)
        if queue.ready.spooler is not None and not queue.message_count:
            storage = spooler.storage()
            links = []
            for index, (path, skip, length) in enumerate(item.files):
                link = os.path.join(storage.directory, f"checkpoint.{index:06d}")
                os.link(path, link)
                links.append((link, skip, length))
            storage.adopt(links)
            size = item.bytes
            if removed and queue.settings.max_length_bytes is not None:
                size -= sum(record.size for record in _records(item) if record.message_id in removed)
            queue.ready.adopt_spool(storage, item.records * RECORD_BYTES, item.count, size, item.refs, removed, counts)
            continue
        locator = spooler.locator(queue)
        records = [
            record._replace(
                flags=record.flags | REDELIVERED, delivery_count=counts.get(record.message_id, record.delivery_count)
            )
            for record in _records(item)
            if record.flags & IN_LOG
        ]
        journal.ledger.spool_dropped([record for record in records if record.message_id in removed])
        records = [record for record in records if record.message_id not in removed]
        for at in range(0, len(records), _LOAD_BATCH):
            batch = records[at : at + _LOAD_BATCH]
            for message, record in zip(locator.load(batch), batch, strict=True):
                queue.restore_loaded(message, record)
    return {name for _vhost, name in snapshot.queues if name in checkpoint.dead_letter_queues}


def _records(item: CheckpointedQueue) -> Iterator[SpoolRecord]:
    """A checkpointed queue's records, read from its files."""
    for path, skip, length in item.files:
        with open(path, "rb") as file:
            file.seek(skip)
            data = file.read(length)
        if len(data) != length:
            raise OSError(f"{path}: {len(data)} of {length} bytes")
        yield from unpack_records(data)

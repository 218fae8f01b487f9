"""A clean stop's checkpoint: what a start needs, so that it does not read the whole log.

Once the connections are closed and the log is flushed and synced, the broker writes under
``<storage.dir>/checkpoint``:

* each durable queue's logged messages in delivery order, as spool records
  (:class:`~broker.core.spool.SpoolRecord`, 44 bytes each) pointing at their ``Published``
  records in the log: the window and waiting entries are written out, and the spool files
  already holding records are hard-linked in, not copied;
* the topology (policies, durable exchanges, queues, bindings) as log records, the next
  message id, the references each log segment holds, and the dead letters still pending;
* last, ``manifest.json``, naming all of it and where the log ended (segment and size).

Everything is fsynced and the directory is renamed into place, so a checkpoint is whole or
absent. A start that finds one opens the log without reading it
(:meth:`~broker.wal.log.WriteAheadLog.open_at`), declares the topology and hands each queue its
records as its spool: messages are read from the log as consumers take them. The manifest is
deleted at once, before anything is written to the log: a crash later is recovered from the
log, as without a checkpoint. A checkpoint that does not match the log (the log was written
after it, or a file is missing) is discarded with a log line, and the log is read.

Not checkpointed (the next start reads the log): a stop with a durable queue holding
unacknowledged messages (a plugin's: the delayed-message exchange holds what it schedules), or
a write-ahead log that failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.core.queue import CheckpointRefused
from broker.core.spool import IN_LOG, RECORD_BYTES, REDELIVERED, SpoolRecord, unpack_records
from broker.paging import write_all
from broker.wal.files import _sync_directory
from broker.wal.record import scan
from broker.wal.recovery import Snapshot, replay

if TYPE_CHECKING:
    from broker.core.deadlog import DeadLetterLog
    from broker.core.journal import Journal
    from broker.core.vhost import VirtualHost
    from broker.spooling import Locator, Spooler

__all__ = [
    "CHECKPOINT_DIR",
    "Checkpoint",
    "CheckpointError",
    "CheckpointRefused",
    "consume_checkpoint",
    "discard_checkpoint",
    "read_checkpoint",
    "restore_checkpoint",
    "write_checkpoint",
]

#: The checkpoint's directory under ``storage.dir`` (and, while one is written, with ``.new``).
CHECKPOINT_DIR = "checkpoint"
MANIFEST = "manifest.json"
VERSION = 1

_DEAD_LETTER = struct.Struct("<QH")
_NAME = struct.Struct("<H")

#: Records read back at once when a queue that does not spool is restored.
_LOAD_BATCH = 1024


class CheckpointError(Exception):
    """A checkpoint cannot be used; the reason says why (the log is read instead)."""


@dataclass(slots=True)
class CheckpointedQueue:
    """One queue's records: ``files`` as ``(path, bytes to skip, bytes of records)``, in order."""

    vhost: str
    name: str
    count: int
    bytes: int
    files: list[tuple[str, int, int]]


@dataclass(slots=True)
class Checkpoint:
    """What a clean stop wrote (see the module)."""

    directory: str
    segment: int
    size: int
    next_message_id: int
    #: Message references per log segment (each record is one).
    refs: dict[int, int]
    topology: Snapshot
    queues: list[CheckpointedQueue] = field(default_factory=list)
    #: Dead letters still pending: id, and the queues holding them.
    dead_letters: list[tuple[int, set[str]]] = field(default_factory=list)

    @property
    def message_count(self) -> int:
        return sum(queue.count for queue in self.queues)


def _write_file(path: str, parts: list[bytes]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, parts)
        os.fsync(fd)
    finally:
        os.close(fd)


def _pack(records: Iterable[SpoolRecord]) -> list[bytes]:
    return [record.pack() for record in records]


def write_checkpoint(
    data_dir: str,
    vhosts: Iterable[VirtualHost],
    journal: Journal,
    dead_letters: DeadLetterLog | None,
    segment: int,
    size: int,
) -> tuple[int, int]:
    """Write the checkpoint of a clean stop: the log ends at ``size`` bytes of ``segment``, and
    nothing waits to be written to it. Returns ``(queues, messages)`` checkpointed.

    :raises CheckpointRefused: the state cannot be checkpointed (nothing is left behind)
    :raises OSError: writing failed (nothing is left behind that a start would use)
    """
    vhosts = list(vhosts)
    if journal.has_pending or journal.synced < journal.position:
        raise CheckpointRefused("records are waiting for the write-ahead log")
    final = os.path.join(data_dir, CHECKPOINT_DIR)
    new = final + ".new"
    shutil.rmtree(new, ignore_errors=True)
    os.makedirs(new, mode=0o700)
    try:
        queues, refs = _write_queues(new, vhosts, journal)
        live = Counter({number: count for number, count in journal.live.items() if count})
        if +refs != live:
            raise CheckpointRefused(
                f"the log's reference counts disagree with the queues ({sum(live.values())} against"
                f" {sum(refs.values())})"
            )
        topology = journal.topology(vhosts)
        _write_file(os.path.join(new, "topology"), [topology])
        durable = {queue.name for vhost in vhosts for queue in vhost.queues.values() if queue.journal is not None}
        pending = _dead_letter_bytes(dead_letters, durable)
        _write_file(os.path.join(new, "deadletters"), pending)
        manifest = {
            "version": VERSION,
            "log": {"segment": segment, "size": size},
            "next_message_id": journal.next_message_id,
            "refs": {str(number): count for number, count in sorted(refs.items()) if count},
            "topology_crc": zlib.crc32(topology),
            "queues": [
                {
                    "vhost": queue.vhost,
                    "name": queue.name,
                    "count": queue.count,
                    "bytes": queue.bytes,
                    "files": [[os.path.basename(path), skip, length] for path, skip, length in queue.files],
                }
                for queue in queues
            ],
        }
        _write_file(os.path.join(new, MANIFEST), [json.dumps(manifest).encode()])
        _sync_directory(new)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(new, final)
        _sync_directory(data_dir)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return len(queues), sum(queue.count for queue in queues)


class _QueueFiles:
    """One queue's files in a checkpoint being written, in order."""

    def __init__(self, directory: str, number: int) -> None:
        self.prefix = os.path.join(directory, f"{number:08d}")
        self.files: list[tuple[str, int, int]] = []
        self.count = self.bytes = 0

    def write(self, suffix: str, records: list[SpoolRecord]) -> None:
        if records:
            path = f"{self.prefix}.{suffix}"
            _write_file(path, _pack(records))
            self.files.append((path, 0, len(records) * RECORD_BYTES))
            self.count += len(records)
            self.bytes += sum(record.size for record in records)

    def link(self, storage: Any, start: int, end: int, size: int) -> None:
        """Link in the spool files holding bytes ``start`` to ``end`` of ``storage`` (``size``
        body bytes), after making them durable."""
        storage.sync()
        for index, (source, skip, length) in enumerate(storage.files(start, end)):
            path = f"{self.prefix}.{index:06d}"
            os.link(source, path)
            self.files.append((path, skip, length))
        self.count += (end - start) // RECORD_BYTES
        self.bytes += size


def _write_queues(
    directory: str, vhosts: list[VirtualHost], journal: Journal
) -> tuple[list[CheckpointedQueue], Counter[int]]:
    """Each durable queue's records into ``directory``, and the references they make per segment."""
    queues = []
    # References held by spool records (in storage, read ahead or buffered): the records in
    # storage are linked in unread, so only those made from entries are counted one by one.
    refs: Counter[int] = Counter(journal.spooled_refs)
    number = 0
    for vhost in vhosts:
        for queue in list(vhost.queues.values()):
            if queue.journal is None or queue.deleted:
                continue
            state = queue.checkpoint()
            for record in state.made:
                refs[record.segment] += 1
            number += 1
            files = _QueueFiles(directory, number)
            files.write("head", state.head)
            start, end = state.span
            if state.spool is not None and end > start:
                storage: Any = state.spool.storage
                if state.copies:
                    # Some point at page-store copies, gone at the next start: keep the others.
                    records = unpack_records(storage.read(start, end - start))
                    files.write("spool", [record for record in records if record.flags & IN_LOG])
                else:
                    files.link(storage, start, end, state.span_bytes)
            files.write("tail", state.tail)
            queues.append(CheckpointedQueue(vhost.name, queue.name, files.count, files.bytes, files.files))
    return queues, refs


def _dead_letter_bytes(dead_letters: DeadLetterLog | None, durable: set[str]) -> list[bytes]:
    """The pending dead letters in durable queues, packed: id, how many queues, their names."""
    parts = []
    for dead_letter_id, queues in dead_letters.pending() if dead_letters is not None else ():
        names = [name.encode("utf-8", "surrogateescape") for name in sorted(queues & durable)]
        if names:
            parts.append(_DEAD_LETTER.pack(dead_letter_id, len(names)))
            parts += [_NAME.pack(len(name)) + name for name in names]
    return parts


def _unpack_dead_letters(data: bytes) -> Iterator[tuple[int, set[str]]]:
    at = 0
    while at < len(data):
        dead_letter_id, count = _DEAD_LETTER.unpack_from(data, at)
        at += _DEAD_LETTER.size
        names = set()
        for _ in range(count):
            (length,) = _NAME.unpack_from(data, at)
            names.add(data[at + 2 : at + 2 + length].decode("utf-8", "surrogateescape"))
            at += 2 + length
        yield dead_letter_id, names


def discard_checkpoint(data_dir: str) -> None:
    """Delete any checkpoint (and any half-written one)."""
    final = os.path.join(data_dir, CHECKPOINT_DIR)
    shutil.rmtree(final + ".new", ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)


def read_checkpoint(data_dir: str) -> Checkpoint | None:
    """The checkpoint a clean stop left in ``data_dir``, or ``None`` if there is none.

    A half-written one (``checkpoint.new``) is deleted. The manifest is only read here: the
    caller consumes it (:func:`consume_checkpoint`) once it has started from it.

    :raises CheckpointError: there is one, but it cannot be used (a file is missing, short or
        damaged, or of another version); the reason names what
    """
    directory = os.path.join(data_dir, CHECKPOINT_DIR)
    shutil.rmtree(directory + ".new", ignore_errors=True)
    try:
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
        with open(os.path.join(directory, "deadletters"), "rb") as file:
            dead_letters = list(_unpack_dead_letters(file.read()))
        queues = []
        for item in manifest["queues"]:
            files = []
            for name, skip, length in item["files"]:
                path = os.path.join(directory, name)
                if os.stat(path).st_size < skip + length:
                    raise CheckpointError(f"{name} is shorter than its {skip + length} bytes")
                files.append((path, skip, length))
            if sum(length for _path, _skip, length in files) != item["count"] * RECORD_BYTES:
                raise CheckpointError(f"queue {item['name']!r}: its files do not hold {item['count']} records")
            queues.append(CheckpointedQueue(item["vhost"], item["name"], item["count"], item["bytes"], files))
        return Checkpoint(
            directory,
            manifest["log"]["segment"],
            manifest["log"]["size"],
            manifest["next_message_id"],
            {int(number): count for number, count in manifest["refs"].items()},
            snapshot,
            queues,
            dead_letters,
        )
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
        raise CheckpointError(f"it is damaged or incomplete ({error})") from None


def consume_checkpoint(checkpoint: Checkpoint) -> None:
    """Delete the manifest: the broker started from the checkpoint, and will write to the log.

    The record files stay until the queues have read them.

    :raises OSError: it could not be deleted (the broker must not start: a later start would
        take the checkpoint for the state)
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(checkpoint.directory, MANIFEST))
    _sync_directory(checkpoint.directory)


def restore_checkpoint(
    checkpoint: Checkpoint, vhosts: dict[str, VirtualHost], journal: Journal, spooler: Spooler
) -> dict[int, set[str]]:
    """Give each checkpointed queue its records (the topology is declared already), and count
    their references in the journal. Returns the pending dead letters, by id.

    A queue that spools adopts its files as its spool; one that does not (a priority queue)
    reads its messages back into memory now.

    :raises OSError: a file could not be opened or read
    """
    for number, count in checkpoint.refs.items():
        journal.restored_spooled(number, count)
    for item in checkpoint.queues:
        queue = vhosts[item.vhost].queues[item.name]
        if queue.spooler is not None and not queue.message_count:
            storage = spooler.storage(item.files)
            queue.adopt_spool(item.count * RECORD_BYTES, item.count, item.bytes, storage)
            continue
        locator: Locator = spooler.locator(queue)
        for path, skip, length in item.files:
            with open(path, "rb") as file:
                file.seek(skip)
                data = file.read(length)
            if len(data) != length:
                raise OSError(f"{path}: {len(data)} of {length} bytes")
            records = unpack_records(data)
            for at in range(0, len(records), _LOAD_BATCH):
                batch = [record._replace(flags=record.flags | REDELIVERED) for record in records[at : at + _LOAD_BATCH]]
                for message, record in zip(locator.load(batch), batch, strict=True):
                    queue.restore_loaded(message, record)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return {dead_letter_id: queues for dead_letter_id, queues in checkpoint.dead_letters}

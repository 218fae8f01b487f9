"""Spooling deep queues to disk: the files behind :mod:`broker.core.entry_spool`.

Each spooling queue has a directory under ``<storage.dir>/spool`` holding its records in chunk
files (:class:`FileSpoolStorage`), deleted as they are read back. The messages' content is
where it already is for a persistent message in a durable queue (its record in the
write-ahead log); any other message is copied, encoded as a log record, to the page store
(``broker.storage.page_store.PageStore``) and read back from there (:class:`Locator`). Neither is fsynced:
the log is what survives a restart, and it is recovered from the log.

Whatever an earlier run left under ``spool`` is deleted at start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from postroom.broker.core.entry_spool import IN_LOG, REDELIVERED, Spool, SpoolRecord
from postroom.broker.core.message import Message
from postroom.broker.core.ready import NEVER, WRITE
from postroom.broker.storage.page_store import write_all
from postroom.broker.wal.codec import encode_published_after, published_contents, published_prefix

if TYPE_CHECKING:
    from postroom.broker.core.entry import Entry
    from postroom.broker.core.journal import Journal
    from postroom.broker.core.queue import WorkQueue
    from postroom.broker.storage.page_store import PageStore

__all__ = ["CHUNK_BYTES", "SPOOL_DIR", "SPOOL_WINDOW", "FileSpoolStorage", "Locator", "Spooler"]

#: Size at which a queue's spool starts a new chunk file (about 95,000 records).
CHUNK_BYTES = 4 << 20

#: The spools' directory under ``storage.dir``.
SPOOL_DIR = "spool"

#: Ready messages a queue keeps in memory before it spools what arrives (and refills to).
SPOOL_WINDOW = 4096

#: Pairs of exchange and routing key a queue's locator keeps decoded.
NAMES_KEPT = 256

#: Most bytes read at once to bring spooled messages back: contents close together in a file
#: come in one read (what lies between them is read too, and skipped).
SPAN_BYTES = 256 << 10


class FileSpoolStorage:
    """One queue's spool records in chunk files under ``directory`` (see
    :class:`~broker.core.entry_spool.SpoolStorage`)."""

    def __init__(self, directory: str, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.directory = directory
        self.chunk_bytes = chunk_bytes
        os.makedirs(directory, mode=0o700, exist_ok=True)
        #: ``[start offset, path, descriptor, size, sealed]`` of each chunk, oldest first; the
        #: start may be negative (an adopted file's skipped bytes come before offset 0).
        self._chunks: deque[list[Any]] = deque()
        self._end = 0
        self._number = 0

    def adopt(self, files: Sequence[tuple[str, int, int]]) -> None:
        """Start with ``files`` (a checkpoint's), as ``(path, bytes to skip at its start, bytes
        of records)``: they are read, never written, and deleted once read, as chunks are.

        :raises OSError: one cannot be opened (none is adopted)
        """
        assert not self._chunks
        try:
            for path, skip, length in files:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                self._chunks.append([self._end - skip, path, fd, skip + length, True])
                self._end += length
        except OSError:
            while self._chunks:
                _close_and_delete(self._chunks.popleft())
            self._end = 0
            raise

    def append(self, data: bytes) -> None:
        chunks = self._chunks
        if not chunks or chunks[-1][3] >= self.chunk_bytes or chunks[-1][4]:
            self._number += 1
            path = os.path.join(self.directory, f"{self._number:08d}.spool")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            chunks.append([self._end, path, fd, 0, False])
        chunk = chunks[-1]
        try:
            write_all(chunk[2], [data])
        except OSError:
            os.ftruncate(chunk[2], chunk[3])  # nothing of it counts as written
            raise
        chunk[3] += len(data)
        self._end += len(data)

    def read(self, offset: int, length: int) -> bytes:
        parts = []
        for start, _path, fd, size, _sealed in self._chunks:
            if length <= 0:
                break
            if offset >= start + size:
                continue
            part = os.pread(fd, min(length, start + size - offset), offset - start)
            if not part:
                break
            parts.append(part)
            offset += len(part)
            length -= len(part)
        return b"".join(parts)

    def files(self, start: int, end: int) -> list[tuple[str, int, int]]:
        """The files holding bytes ``start`` to ``end``, as ``(path, bytes to skip, bytes)``."""
        found = []
        for chunk_start, path, _fd, size, _sealed in self._chunks:
            first, last = max(start, chunk_start), min(end, chunk_start + size)
            if first < last:
                found.append((path, first - chunk_start, last - first))
        return found

    def sync(self) -> None:
        """Make every chunk durable.

        :raises OSError: one could not be synced
        """
        for _start, _path, fd, _size, sealed in self._chunks:
            if not sealed:
                os.fsync(fd)

    def release(self, offset: int) -> None:
        chunks = self._chunks
        while chunks and chunks[0][0] + chunks[0][3] <= offset:  # read to its end (the last one too)
            _close_and_delete(chunks.popleft())

    def close(self) -> None:
        while self._chunks:
            _close_and_delete(self._chunks.popleft())
        shutil.rmtree(self.directory, ignore_errors=True)


def _close_and_delete(chunk: list[Any]) -> None:
    """A chunk read to its end: it goes; a file left behind (an error) is deleted at the next start."""
    _start, path, fd, _size, _sealed = chunk
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(path)


class _Holds:
    """Page store segments that spool records point into, with how many: a segment lives while held."""

    def __init__(self) -> None:
        self.segments: dict[int, list[Any]] = {}  # number -> [segment, records]

    def hold(self, segment: Any, number: int) -> None:
        held = self.segments.get(number)
        if held is None:
            self.segments[number] = [segment, 1]
        else:
            held[1] += 1

    def read(self, number: int, offset: int, length: int) -> bytes:
        return self.segments[number][0](number, offset, length)  # type: ignore[no-any-return]

    def release(self, number: int) -> None:
        held = self.segments[number]
        held[1] -= 1
        if not held[1]:
            del self.segments[number]


class Locator:
    """Writes and reads one queue's spooled content (see :class:`~broker.core.entry_spool.SpoolLocator`).

    :param read_log: reads ``(segment, offset, length)`` of the write-ahead log (``None``: no log)
    """

    def __init__(
        self,
        queue: WorkQueue,
        journal: Journal | None,
        read_log: Callable[[int, int, int], bytes] | None,
        store: PageStore,
        holds: _Holds,
    ) -> None:
        self.queue = queue
        self.journal = journal
        self.read_log = read_log
        self.store = store
        self.holds = holds
        #: Exchange and routing key bytes read back -> as a message takes them (:meth:`_decode_names`).
        self._names: dict[tuple[bytes, bytes], tuple[str, str, bytes]] = {}
        #: A message's names -> the start of its copy's record (:func:`published_prefix`).
        self._prefixes: dict[bytes, bytes] = {}

    def locatable(self, entry: Entry) -> bool:
        message = entry.message
        if message.wal_id and self.queue.journal is not None and self.queue.name in message.wal_queues:
            return bool(message.wal_segment and message.wal_start)  # 0 while its record is rewritten
        return True

    def locate(self, entries: list[Entry]) -> list[SpoolRecord]:
        queue = self.queue
        journal = self.journal if queue.journal is not None else None
        records: list[tuple[int, int, int, int, int, int, int, float]] = []
        copies: list[tuple[int, bytes]] = []
        in_log: list[Message] = []
        prefixes = self._prefixes
        for entry in entries:
            message = entry.message
            flags = REDELIVERED if entry.redelivered else 0
            expires_at = entry.expires_at or 0.0
            if journal is not None and message.wal_id and queue.name in message.wal_queues:
                _read, segment, body_at = message.wal_location  # type: ignore[misc]
                start = message.wal_start
                records.append(
                    (  # a SpoolRecord's fields
                        message.wal_id,
                        start,
                        segment,
                        body_at + message.size - start,
                        message.size,
                        entry.delivery_count,
                        flags | IN_LOG,
                        expires_at,
                    )
                )
                in_log.append(message)
            else:
                names = message.names
                prefix = prefixes.get(names)
                if prefix is None:
                    if len(prefixes) >= NAMES_KEPT:
                        prefixes.clear()
                    prefix = prefixes[names] = published_prefix(0, "", (), message.exchange, message.routing_key)
                content = encode_published_after(prefix, 0.0, message.header, message.body)
                copies.append((len(records), content))
                records.append((0, 0, 0, len(content), message.size, entry.delivery_count, flags, expires_at))
        if copies:
            placed = self.store.append([content for _index, content in copies])
            for (index, _content), (segment_object, number, offset) in zip(copies, placed, strict=True):
                self.holds.hold(segment_object, number)
                _id, _offset, _segment, length, size, count, flags, expires_at = records[index]
                records[index] = (0, offset, number, length, size, count, flags, expires_at)
        if in_log:
            journal.spooled(in_log, queue.name)  # type: ignore[union-attr]
        if queue.dead_letter_watch is not None:
            queue.dead_letter_watch.spooled(queue, entries)
        return records  # type: ignore[return-value]

    def load(self, records: list[SpoolRecord]) -> list[Message]:
        queue = self.queue
        journal = self.journal
        read_log = self.read_log
        names = self._names
        messages: list[Message] = []
        append = messages.append
        logged: list[SpoolRecord] = []
        logged_messages: list[Message] = []
        exchange: bytes | None = None
        routing_key: bytes | None = None
        decoded_exchange = decoded_key = ""
        encoded = b""
        for span, at, group in self._spans(records):
            # (A span's records are all in the log, or all in the page store.)
            in_log = group[0][6] & IN_LOG
            logging = in_log and journal is not None
            first = len(messages)
            for record, content in zip(group, published_contents(span, at, group), strict=True):
                if content is None or (in_log and content[0] != record[0]):
                    where = "log segment" if in_log else "page store segment"
                    raise OSError(f"spooled message damaged: {where} {record.segment} at offset {record.offset}")
                if content[1] is not exchange or content[2] is not routing_key:
                    # (Records read alike share their names' bytes.)
                    exchange, routing_key = found = content[1], content[2]
                    decoded_exchange, decoded_key, encoded = names.get(found) or self._decode_names(*found)
                message = Message(decoded_exchange, decoded_key, encoded, content[3], content[4])
                if logging:
                    message.wal_id = record[0]
                    message.wal_start = offset = record[1]
                    message.wal_location = (read_log, record[2], offset + record[3] - message.size)  # type: ignore[assignment]
                append(message)
            if logging:
                logged += group
                logged_messages += messages[first:]
        if logged:
            journal.unspooled_all(logged_messages, logged, queue.vhost_name, queue.name)  # type: ignore[union-attr]
        return messages

    def _decode_names(self, exchange: bytes, routing_key: bytes) -> tuple[str, str, bytes]:
        """The exchange and routing key as a :class:`Message` takes them, remembered: a deep
        queue's messages mostly came the same way."""
        names = self._names
        if len(names) >= NAMES_KEPT:
            names.clear()
        decoded = names[exchange, routing_key] = (
            exchange.decode("utf-8", "surrogateescape"),
            routing_key.decode("utf-8", "surrogateescape"),
            bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) + routing_key,
        )
        return decoded

    def _spans(self, records: list[SpoolRecord]) -> Iterator[tuple[bytes, int, list[SpoolRecord]]]:
        """Records whose contents lie close together in one file, each group read at once:
        ``(bytes read, their offset, the records)``. A deep queue's messages were mostly
        written one after another."""
        index = 0
        while index < len(records):
            first = records[index]
            start, end = first.offset, first.offset + first.length
            group = [first]
            index += 1
            while index < len(records):
                record = records[index]
                if (
                    record.segment != first.segment
                    or (record.flags ^ first.flags) & IN_LOG
                    or record.offset < end
                    or record.offset + record.length - start > SPAN_BYTES
                ):
                    break
                group.append(record)
                end = record.offset + record.length
                index += 1
            if first.flags & IN_LOG:
                assert self.read_log is not None
                data = self.read_log(first.segment, start, end - start)
            else:
                data = self.holds.read(first.segment, start, end - start)
            yield data, start, group

    def released(self, records: list[SpoolRecord]) -> None:
        for record in records:
            if not record.flags & IN_LOG:
                self.holds.release(record.segment)

    def dropped(self, records: list[SpoolRecord]) -> None:
        if self.journal is not None:
            self.journal.ledger.spool_dropped(records)


class Spooler:
    """Makes the spools of deep queues: their storage, under ``directory``, and their locators.

    :param window: ready entries a queue keeps in memory before it spools what arrives
    :param window_bytes: body bytes a queue's window is refilled to at most (the pager sets it
        to each watched queue's share of the memory budget)
    """

    def __init__(
        self,
        directory: str,
        store: PageStore,
        journal: Journal | None,
        read_log: Callable[[int, int, int], bytes] | None,
        window: int,
        window_bytes: int = NEVER,
    ) -> None:
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)
        self.store = store
        self.journal = journal
        self.read_log = read_log
        self.window = window
        self.window_bytes = window_bytes
        self.holds = _Holds()
        self._number = 0

    def spool(self, queue: WorkQueue, storage: FileSpoolStorage | None = None) -> Spool:
        """A new spool for ``queue``, over ``storage`` (default: new files of its own)."""
        if storage is None:
            storage = self.storage()
        locator = self.locator(queue)
        journal = self.journal
        return Spool(
            storage,
            locator,
            (lambda: journal.synced) if journal is not None else None,
            lambda error: queue.ready.spool_failed(error, WRITE, "they stay in memory for now"),
        )

    def locator(self, queue: WorkQueue) -> Locator:
        """Reads and writes ``queue``'s spooled content."""
        return Locator(queue, self.journal, self.read_log, self.store, self.holds)

    def storage(self) -> FileSpoolStorage:
        """Files for a new spool."""
        self._number += 1
        return FileSpoolStorage(os.path.join(self.directory, f"{self._number:08d}"))

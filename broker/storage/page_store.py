"""The page store: bodies of messages that left memory and are not in the write-ahead log.

Transient messages of deep queues (and persistent ones outside durable queues) are appended
to segment files under ``<storage.dir>/paging`` when their bodies leave memory, by the pager
(``broker.storage.body_paging``) and by spools (``broker.storage.spool_files``), and read back one by
one as they are delivered. The store is not fsynced and not recovered: what it holds was never
promised to survive a restart. A segment file is deleted once no message refers to it.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from postroom.broker.core.message import Message

#: Size at which the store starts a new segment file.
SEGMENT_BYTES = 64 << 20

#: Most buffers one ``writev`` call takes (Linux's IOV_MAX).
IOV_MAX = 1024

#: Sealed segments kept open for reading at once: a queue of 100 GiB spans 1,600 segments,
#: more than a process may have files open, so the others are opened again when read.
READ_HANDLES = 16


class _Segment:
    """One store file, open for appending while it is the store's active one; deleted with the
    last message using it (messages hold it in their ``wal_location``)."""

    __slots__ = ("store", "path", "fd", "size", "__weakref__")

    def __init__(self, store: PageStore, path: str) -> None:
        self.store = store
        self.path = path
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.size = 0
        weakref.finalize(self, store.forget, path)

    def seal(self) -> None:
        """No more appends: its file is opened for reading only when read (see :data:`READ_HANDLES`)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __call__(self, _number: int, offset: int, size: int) -> bytes:
        fd = self.fd if self.fd is not None else self.store.reader(self.path)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"paged body cut short: {len(data)} of {size} bytes at offset {offset}")
        return data


def write_all(fd: int, buffers: list[bytes]) -> None:
    """Write ``buffers`` in order with as few calls as the kernel allows (the list is consumed)."""
    while buffers:
        batch = buffers[:IOV_MAX]
        written = os.writev(fd, batch)
        total = sum(len(buffer) for buffer in batch)
        if written == total:
            del buffers[:IOV_MAX]
            continue
        # A short write: drop what went out, keep the rest of a partly written buffer.
        index = 0
        while written >= len(buffers[index]):
            written -= len(buffers[index])
            index += 1
        buffers[index] = buffers[index][written:]
        del buffers[:index]


class PageStore:
    """Message bodies written out of memory, in segment files under ``directory``.

    Whatever an earlier run left there is deleted at start: paged bodies are never recovered.
    """

    def __init__(self, directory: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".page"):
                os.unlink(os.path.join(directory, name))
        self._active: _Segment | None = None
        self._number = 0
        #: Read-only descriptors of sealed segments, least recently used first.
        self._readers: OrderedDict[str, int] = OrderedDict()
        #: Bodies written so far.
        self.written = 0

    def _segment(self, size: int) -> _Segment:
        active = self._active
        if active is None or (active.size and active.size + size > self.segment_bytes):
            self.close()
            self._number += 1
            active = self._active = _Segment(self, os.path.join(self.directory, f"{self._number:08d}.page"))
        return active

    def reader(self, path: str) -> int:
        """A descriptor to read the sealed segment at ``path`` (at most :data:`READ_HANDLES` stay open)."""
        readers = self._readers
        fd = readers.get(path)
        if fd is not None:
            readers.move_to_end(path)
            return fd
        fd = readers[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if len(readers) > READ_HANDLES:
            os.close(readers.popitem(last=False)[1])
        return fd

    def forget(self, path: str) -> None:
        """The segment at ``path`` is no longer used by any message: close and delete it."""
        fd = self._readers.pop(path, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def write(self, messages: list[Message]) -> None:
        """Append the bodies of ``messages`` and drop them from memory; each message then reads its
        body back from here. On an error (``OSError``) none of them has lost its body."""
        for message, (segment, number, offset) in zip(messages, self.append([m.body for m in messages]), strict=True):
            message.wal_location = (segment, number, offset)
            message.page_out()
        self.written += len(messages)

    def append(self, contents: list[bytes]) -> list[tuple[_Segment, int, int]]:
        """Append ``contents`` (encoded messages of spooled queues); returns where each went:
        ``(segment, its number, offset)``. A segment is deleted once nothing holds it, so the
        caller keeps the segment objects while it needs the contents.

        :raises OSError: the store could not be written (none of it counts as stored)
        """
        placed: list[tuple[_Segment, int, int]] = []
        start = 0
        while start < len(contents):
            segment = self._segment(len(contents[start]))
            end, offset = start, segment.size
            while end < len(contents) and (end == start or offset + len(contents[end]) <= self.segment_bytes):
                offset += len(contents[end])
                end += 1
            try:
                write_all(segment.fd, contents[start:end])  # type: ignore[arg-type]  # the active one is open
            except OSError:
                self.close()  # what went out of this batch is not to be trusted
                raise
            offset = segment.size
            for content in contents[start:end]:
                placed.append((segment, self._number, offset))
                offset += len(content)
            segment.size = offset
            start = end
        return placed

    def close(self) -> None:
        """Stop appending to the current segment (each segment goes once its messages are gone)."""
        if self._active is not None:
            self._active.seal()
            self._active = None

"""Segment storage: the one module of the write-ahead log that touches the disk.

:class:`ISegmentStorage` is the seam between the write-ahead log and the file system;
:class:`DirectoryStorage` implements it over one directory of segment files with ``os.open``,
``os.write`` and ``os.fsync``, and ``broker.tools.testing.MemorySegmentStorage`` implements it in
memory, with fault injection and simulated power loss, for the tests.

Errors are plain :exc:`OSError`: the log passes them up and the broker turns ``ENOSPC`` or
``EIO`` into nacks. Durability follows the usual POSIX rules: data is on disk after ``fsync``
of the file, and a new or removed name after ``fsync`` of its directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from typing import Protocol

from zope.interface import Interface, implementer

__all__ = ["FileRecorder", "ISegmentStorage", "DirectoryStorage", "segment_name"]


class ISegmentStorage(Interface):
    """Numbered, append-only segment files.

    Every method may raise :exc:`OSError`. A segment that does not exist raises
    :exc:`FileNotFoundError`.
    """

    def list_segments() -> list[int]:
        """The numbers of the existing segments, ascending."""

    def read(number: int) -> bytes:
        """The whole content of segment ``number``."""

    def read_at(number: int, offset: int, length: int) -> bytes:
        """``length`` bytes of segment ``number`` from ``offset`` (a paged-out message body).

        Safe to call from another thread than the one appending: segments only grow.
        """

    def create(number: int, header: bytes) -> None:
        """Create segment ``number`` holding ``header``; durable (file and directory synced) on return.

        Raises :exc:`FileExistsError` if the segment exists.
        """

    def append(number: int, data: bytes | list[bytes]) -> None:
        """Append all of ``data`` (bytes, or pieces of them in order) to segment ``number``
        (not synced).

        On error some prefix of ``data`` may have been written.
        """

    def sync(number: int) -> None:
        """Make everything appended to segment ``number`` durable (``fsync``)."""

    def size(number: int) -> int:
        """The size of segment ``number`` in bytes."""

    def truncate(number: int, size: int) -> None:
        """Cut segment ``number`` to ``size`` bytes; durable on return."""

    def retire(number: int) -> None:
        """Move segment ``number`` to the archive, if there is one, else delete it; durable on return."""


class FileRecorder(Protocol):
    """Told of every change a :class:`DirectoryStorage` makes to its files, once made, and by
    the log's writer of each checkpoint put in place or deleted (a cluster's leader sends them
    to its followers: ``broker.cluster.replication``)."""

    def created(self, path: str, data: bytes) -> None: ...

    def wrote(self, path: str, offset: int, data: bytes | list[bytes]) -> None: ...

    def truncated(self, path: str, size: int) -> None: ...

    def retired(self, path: str, archived: bool) -> None: ...

    def removed(self, path: str) -> None: ...

    def checkpointed(self, directory: str) -> None: ...

    def no_checkpoint(self, directory: str) -> None: ...


#: A segment's file name: its number, zero-padded so names sort like numbers (a u64 has 20 digits).
_NAME = re.compile(r"^(\d{20})\.wal$")


def segment_name(number: int) -> str:
    """The file name of segment ``number``: ``00000000000000000001.wal``."""
    return f"{number:020d}.wal"


def _sync_directory(path: str) -> None:
    """``fsync`` a directory, making names created, renamed or removed in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may be short, e.g. near ENOSPC)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


#: The most pieces one ``writev`` takes.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _writev_all(fd: int, pieces: list[bytes]) -> None:
    """``os.writev`` of ``pieces`` until all of them are written (a write may be short)."""
    views = [memoryview(piece) for piece in pieces if piece]
    at = 0
    while at < len(views):
        written = os.writev(fd, views[at : at + _IOV_MAX])
        while written:
            size = len(views[at])
            if written < size:
                views[at] = views[at][written:]
                break
            written -= size
            at += 1


#: Segments hold message bodies: readable by the broker's user only (RabbitMQ's data
#: directory is 0750; nothing here needs a group).
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def _private_directory(path: str) -> None:
    """Create ``path`` owner-only, or take other users' access away from an existing one.

    A directory from before (created 0755) keeps its owner and group bits; without the
    others' bits nobody else can reach the segments inside, whatever their own modes.
    """
    os.makedirs(path, mode=DIRECTORY_MODE, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o007:
        os.chmod(path, mode & ~0o007)


@implementer(ISegmentStorage)
class DirectoryStorage:
    """Segment files ``<number:020d>.wal`` in ``path``; retired ones go to ``archive_path``.

    Both directories are created if missing. Open segments keep a file descriptor (opened
    ``O_APPEND``) until retired or :meth:`close`; the log appends to one segment at a time, so
    that is one or two descriptors.

    :param path: directory of the live segments
    :param archive_path: directory for retired segments (read by the Spark job), or None to
        delete them
    :param recorder: told of every change made (a cluster's leader)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        archive_path: str | os.PathLike[str] | None = None,
        recorder: FileRecorder | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.recorder = recorder
        self.archive_path = None if archive_path is None else os.fspath(archive_path)
        for directory in (self.path, self.archive_path):
            if directory is not None:
                _private_directory(directory)
        self._fds: dict[int, int] = {}
        self._read_fds: dict[int, int] = {}

    def _path(self, number: int) -> str:
        return os.path.join(self.path, segment_name(number))

    def _fd(self, number: int) -> int:
        fd = self._fds.get(number)
        if fd is None:
            fd = self._fds[number] = os.open(self._path(number), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return fd

    def _read_fd(self, number: int) -> int:
        fd = self._read_fds.get(number)
        if fd is None:
            fd = self._read_fds[number] = os.open(self._path(number), os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def list_segments(self) -> list[int]:
        """The numbers of the segment files in the directory, ascending; other files are ignored."""
        numbers = []
        for name in os.listdir(self.path):
            match = _NAME.match(name)
            if match is not None:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def read(self, number: int) -> bytes:
        """The whole content of segment ``number``."""
        with open(self._path(number), "rb", buffering=0) as file:
            return file.read()

    def read_at(self, number: int, offset: int, length: int) -> bytes:
        """``length`` bytes of segment ``number`` from ``offset``, with ``os.pread`` on a read-only descriptor."""
        data = os.pread(self._read_fd(number), length, offset)
        if len(data) != length:
            raise OSError(errno.EIO, f"short read of segment {number} at {offset}: {len(data)} of {length} bytes")
        return data

    def send_at(self, number: int, offset: int, length: int, out: int) -> int:
        """Send up to ``length`` bytes of segment ``number`` from ``offset`` to the socket
        ``out`` (``os.sendfile``: from the page cache, not copied through the process).
        Returns how many went; a non-blocking socket that is full raises
        :exc:`BlockingIOError`."""
        return os.sendfile(out, self._read_fd(number), offset, length)

    def create(self, number: int, header: bytes) -> None:
        """Create segment ``number`` holding ``header``, then fsync it and the directory.

        If any step fails the file is removed again (best effort), so a retry can create it.

        :raises FileExistsError: the segment exists
        """
        path = self._path(number)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            _write_all(fd, header)
            os.fsync(fd)
            _sync_directory(self.path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass  # the original error is the one to report
            raise
        self._fds[number] = fd
        if self.recorder is not None:
            self.recorder.created(path, header)

    def append(self, number: int, data: bytes | list[bytes]) -> None:
        """Append all of ``data`` to segment ``number`` (pieces of it with one ``writev``, not
        joined first); on error a prefix may be written."""
        fd = self._fd(number)
        recorder = self.recorder
        offset = os.fstat(fd).st_size if recorder is not None else 0
        if isinstance(data, bytes):
            _write_all(fd, data)
        else:
            _writev_all(fd, data)
        if recorder is not None:
            recorder.wrote(self._path(number), offset, data)

    def sync(self, number: int) -> None:
        """``fsync`` segment ``number``."""
        os.fsync(self._fd(number))

    def size(self, number: int) -> int:
        """The size of segment ``number`` in bytes."""
        fd = self._fds.get(number)
        return os.fstat(fd).st_size if fd is not None else os.stat(self._path(number)).st_size

    def truncate(self, number: int, size: int) -> None:
        """Cut segment ``number`` to ``size`` bytes and fsync it."""
        fd = self._fd(number)
        os.ftruncate(fd, size)
        os.fsync(fd)
        if self.recorder is not None:
            self.recorder.truncated(self._path(number), size)

    def retire(self, number: int) -> None:
        """Move segment ``number`` into the archive directory (or delete it), durably.

        The archive copy is durable before the live name goes, so a crash in between leaves
        the segment in both places (retiring it again replaces the archive copy), never in
        neither.
        """
        path = self._path(number)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        for fds in (self._fds, self._read_fds):
            fd = fds.pop(number, None)
            if fd is not None:
                os.close(fd)
        if self.archive_path is None:
            os.unlink(path)
        else:
            target = os.path.join(self.archive_path, segment_name(number))
            try:
                os.replace(path, target)
            except OSError as err:
                if err.errno != errno.EXDEV:
                    raise
                # The archive is on another file system: copy, make the copy durable, then
                # remove the original.
                partial = target + ".partial"
                shutil.copyfile(path, partial)
                os.chmod(partial, FILE_MODE)
                fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(partial, target)
                _sync_directory(self.archive_path)
                os.unlink(path)
            else:
                _sync_directory(self.archive_path)
        _sync_directory(self.path)
        if self.recorder is not None:
            self.recorder.retired(path, self.archive_path is not None)

    def close(self) -> None:
        """Close the open file descriptors (they reopen on demand)."""
        fds, self._fds = self._fds, {}
        read_fds, self._read_fds = self._read_fds, {}
        for fd in [*fds.values(), *read_fds.values()]:
            os.close(fd)

    def __enter__(self) -> DirectoryStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def prune_archive(
    path: str | os.PathLike[str], retention: float, max_bytes: int, now: float, keep_newest: bool = False
) -> list[str]:
    """Delete archived segments older than ``retention`` seconds, then the oldest ones while the
    archive holds more than ``max_bytes``; return the names deleted.

    Age is the file's modification time (when it was retired, or last written). The newest
    segment is never deleted for size alone, so the archive always has the latest retired data
    for the Spark job; with ``keep_newest`` it is never deleted at all (a stream's active
    segment, which a writer still appends to).

    :param now: the current time, seconds since the epoch (a parameter, so tests pick it)
    """
    directory = os.fspath(path)
    entries = []
    for name in os.listdir(directory):
        if _NAME.match(name) is None:
            continue
        try:
            stat = os.stat(os.path.join(directory, name))
        except FileNotFoundError:  # deleted meanwhile (postroom dlq export --delete-exported)
            continue
        entries.append((name, stat.st_mtime, stat.st_size))
    entries.sort()
    deleted = []
    kept = []
    for index, (name, mtime, size) in enumerate(entries):
        if now - mtime > retention and not (keep_newest and index == len(entries) - 1):
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile, as above
                os.unlink(os.path.join(directory, name))
            deleted.append(name)
        else:
            kept.append((name, size))
    total = sum(size for _name, size in kept)
    while total > max_bytes and len(kept) > 1:
        name, size = kept.pop(0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
        deleted.append(name)
        total -= size
    if deleted:
        _sync_directory(directory)
    return deleted

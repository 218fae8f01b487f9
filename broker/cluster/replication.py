"""What a leader sends its followers: the changes to the files of its data directory.

The leader's log and its streams' segments are append-only files, written by the log's
writer thread through ``DirectoryStorage``, and so are the dead-letter event stream's, by a
writer of its own. In cluster mode each of those storages has a :class:`Recorder`, which
notes every change as an :class:`Op` (a file created, bytes written at an offset, a file cut,
retired or removed). The log's writer cuts what was noted into a numbered batch at each group
commit, before its fsync (the dead-letter writer after each of its writes), and the leader
sends the batch to every follower, which applies it to its own data directory, fsyncs it and acknowledges the number.
A follower's directory therefore holds the same bytes as the leader's, file by file, and is
what a start of the leader would read: the log, the streams, and the latest checkpoint (sent
whole once in place: :meth:`Recorder.checkpointed`). The spool and the paging store are the
leader's own.

A follower that connects sends the size and CRC-32 of each of its files; :func:`sync_ops`
turns the leader's files and that index into the ops that make the follower's the same: the
rest of a file whose start matches, a whole file where it does not, and the removal of what
the leader does not have. Every op states its offset, so applying one twice, or applying a
batch over bytes the initial copy already held, changes nothing.

Standard library only; the Twisted parts are in ``leader`` and ``follower``.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from postroom.broker.wal.files import FILE_MODE

__all__ = [
    "Op",
    "OpKind",
    "Recorder",
    "apply_ops",
    "decode_ops",
    "encode_ops",
    "file_index",
    "replicated_files",
    "sync_ops",
]

#: Bytes of one file read and sent at a time by :func:`sync_ops`.
SYNC_CHUNK = 1 << 20

#: The files of a data directory that are replicated besides the log's segments (in its top
#: directory), and the directories replicated whole: the streams' segments and the dead-letter
#: event stream's.
KEY_FILES = ("dead-letter-seal.key",)
STREAMS = "streams"
DEAD_LETTERS = "deadletters"
ARCHIVE = "archive"
CHECKPOINT = "checkpoint"


class OpKind(enum.IntEnum):
    #: Create the file with ``data`` (replacing one that exists).
    CREATE = 1
    #: Write ``data`` at ``offset`` (creating the file), and cut the file where ``data`` ends.
    WRITE = 2
    #: Cut the file to ``offset`` bytes.
    TRUNCATE = 3
    #: Retire a log segment: into ``archive/`` when ``offset`` is 1, else delete it.
    RETIRE = 4
    #: Delete the file, or the directory and all it holds.
    REMOVE = 5
    #: Put the directory ``path`` in place of the one ``data`` names (UTF-8), which is removed:
    #: a checkpoint, written whole under ``checkpoint.new`` first.
    RENAME = 6


@dataclass(frozen=True, slots=True)
class Op:
    """One change to one file; ``path`` is relative to the data directory, with ``/``."""

    kind: OpKind
    path: str
    offset: int = 0
    data: bytes = b""

    @property
    def size(self) -> int:
        return len(self.data) + len(self.path) + _OP_HEAD.size


_OP_HEAD = struct.Struct(">BHQI")


def encode_ops(ops: Iterable[Op]) -> list[bytes]:
    """``ops`` as pieces of bytes to send one after the other."""
    pieces = []
    for op in ops:
        path = op.path.encode()
        pieces.append(_OP_HEAD.pack(op.kind, len(path), op.offset, len(op.data)) + path)
        if op.data:
            pieces.append(op.data)
    return pieces


def decode_ops(data: bytes | memoryview, start: int = 0) -> list[Op]:
    """The ops :func:`encode_ops` wrote from ``start`` to the end of ``data``.

    :raises ValueError: ``data`` does not hold whole ops, or a path leaves the data directory
    """
    view = memoryview(data)
    ops = []
    at = start
    end = len(view)
    while at < end:
        if end - at < _OP_HEAD.size:
            raise ValueError("a replication batch ends inside an op")
        kind, path_length, offset, length = _OP_HEAD.unpack_from(view, at)
        at += _OP_HEAD.size
        if end - at < path_length + length:
            raise ValueError("a replication batch ends inside an op")
        path = bytes(view[at : at + path_length]).decode()
        at += path_length
        ops.append(Op(OpKind(kind), _checked(path), offset, bytes(view[at : at + length])))
        at += length
    return ops


def _checked(path: str) -> str:
    """``path`` if it names something inside the data directory."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in path:
        raise ValueError(f"a replicated path leaves the data directory: {path!r}")
    return path


class Recorder:
    """Notes the changes made to the replicated files of ``data_dir`` (any thread), and cuts
    them into numbered batches (the log's writer thread).

    :param data_dir: the data directory the paths are made relative to
    """

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        #: The number of the last batch cut.
        self.seq = 0

    def _relative(self, path: str) -> str:
        return os.path.relpath(os.path.abspath(path), self.data_dir).replace(os.sep, "/")

    def _note(self, kind: OpKind, path: str, offset: int = 0, data: bytes | list[bytes] = b"") -> None:
        if not isinstance(data, bytes):
            data = b"".join(data)
        op = Op(kind, self._relative(path), offset, data)
        with self._lock:
            self._ops.append(op)

    def _note_all(self, ops: list[Op]) -> None:
        with self._lock:
            self._ops.extend(ops)

    # broker.wal.files.FileRecorder

    def created(self, path: str, data: bytes) -> None:
        self._note(OpKind.CREATE, path, 0, data)

    def wrote(self, path: str, offset: int, data: bytes | list[bytes]) -> None:
        self._note(OpKind.WRITE, path, offset, data)

    def truncated(self, path: str, size: int) -> None:
        self._note(OpKind.TRUNCATE, path, size)

    def retired(self, path: str, archived: bool) -> None:
        self._note(OpKind.RETIRE, path, int(archived))

    def removed(self, path: str) -> None:
        self._note(OpKind.REMOVE, path)

    def checkpointed(self, directory: str) -> None:
        """The checkpoint in ``directory`` (``<data dir>/checkpoint``) was just put in place: the
        followers get its files under ``checkpoint.new``, then put it in place of theirs. A
        follower that takes over starts from it and reads only the log after it. One that
        cannot be read back is not sent, and the followers drop theirs (they read the whole
        log): the log's writer goes on either way."""
        self._note_all(checkpoint_ops(self.data_dir, self._relative(directory)))

    def no_checkpoint(self, directory: str) -> None:
        """The leader deleted its checkpoint: so do the followers (they read the whole log)."""
        self._note_all(_no_checkpoint(self._relative(directory)))

    def cut(self) -> tuple[int, list[Op]]:
        """What was noted since the last cut, as batch number ``seq``; ``(seq, [])`` without a
        new number when nothing was."""
        with self._lock:
            ops, self._ops = self._ops, []
            if ops:
                self.seq += 1
            return self.seq, ops

    def mark(self) -> int:
        """The number of the last batch cut: a follower that joins now is sent every later
        batch, and what was changed up to now is in the files it is copied."""
        with self._lock:
            return self.seq


def replicated_files(data_dir: str) -> Iterator[str]:
    """The replicated files of ``data_dir`` (relative paths with ``/``): the log's segments, the
    dead-letter seal's key, and every file of the streams and of the dead-letter event stream."""
    try:
        names = sorted(os.listdir(data_dir))
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".wal") or name in KEY_FILES:
            if os.path.isfile(os.path.join(data_dir, name)):
                yield name
    for whole in (DEAD_LETTERS, STREAMS):
        for directory, subdirectories, files in os.walk(os.path.join(data_dir, whole)):
            subdirectories.sort()
            for name in sorted(files):
                yield os.path.relpath(os.path.join(directory, name), data_dir).replace(os.sep, "/")


def _tree(directory: str) -> list[str]:
    """The files under ``directory``, as relative paths with ``/``."""
    found = []
    for root, subdirectories, files in os.walk(directory):
        subdirectories.sort()
        for name in sorted(files):
            found.append(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/"))
    return found


def _no_checkpoint(name: str) -> list[Op]:
    """The ops that delete a follower's checkpoint ``name``, whole or half put in place."""
    return [Op(OpKind.REMOVE, name + suffix) for suffix in ("", ".new", ".old")]


def checkpoint_ops(data_dir: str, name: str = CHECKPOINT) -> list[Op]:
    """The ops that give a follower the checkpoint ``data_dir`` holds now, in ``name``: its files
    written under ``<name>.new``, then put in place of the follower's (or its removal, if
    there is none, if it cannot be read, or if it was replaced while being read: the next
    one's ops follow)."""
    directory = os.path.join(data_dir, name)
    manifest = os.path.join(directory, "manifest.json")
    try:
        before = os.stat(manifest)
        ops = [Op(OpKind.REMOVE, name + ".new")]
        for file_name in _tree(directory):
            with open(os.path.join(directory, file_name), "rb") as file:
                ops.append(Op(OpKind.WRITE, f"{name}.new/{file_name}", 0, file.read()))
        after = os.stat(manifest)
    except OSError:
        return _no_checkpoint(name)
    if (before.st_ino, before.st_mtime_ns) != (after.st_ino, after.st_mtime_ns):
        return _no_checkpoint(name)
    return [*ops, Op(OpKind.RENAME, name + ".new", 0, name.encode())]


def _crc(path: str, length: int | None = None) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as file:
        left = length
        while left is None or left > 0:
            block = file.read(SYNC_CHUNK if left is None else min(SYNC_CHUNK, left))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            if left is not None:
                left -= len(block)
    return crc


def file_index(data_dir: str) -> dict[str, tuple[int, int]]:
    """Each replicated file of ``data_dir`` with its size and CRC-32."""
    index = {}
    for name in replicated_files(data_dir):
        path = os.path.join(data_dir, name)
        try:
            size = os.stat(path).st_size
            index[name] = (size, _crc(path, size))
        except FileNotFoundError:
            continue
    return index


def sync_ops(data_dir: str, theirs: dict[str, tuple[int, int]]) -> Iterator[Op]:
    """The ops that make a follower whose files are ``theirs`` (see :func:`file_index`) hold
    what ``data_dir`` holds now: each file's missing end, or all of it where the start
    differs, the removal of files ``data_dir`` does not have, and the checkpoint whole
    (:func:`checkpoint_ops`). A file read meanwhile by the writer is copied as far as it was
    written; the batches after :meth:`Recorder.mark` carry the rest."""
    ours = set()
    for name in replicated_files(data_dir):
        ours.add(name)
        path = os.path.join(data_dir, name)
        try:
            size = os.stat(path).st_size
            start = 0
            if name in theirs:
                their_size, their_crc = theirs[name]
                if their_size <= size and _crc(path, their_size) == their_crc:
                    if their_size == size:
                        continue  # the same file
                    start = their_size
                else:
                    yield Op(OpKind.TRUNCATE, name, 0)
            with open(path, "rb", buffering=0) as file:
                file.seek(start)
                at = start
                while at < size or at == 0:
                    block = file.read(min(SYNC_CHUNK, size - at))
                    yield Op(OpKind.WRITE, name, at, block)
                    at += len(block)
                    if not block:
                        break
        except FileNotFoundError:
            continue  # retired meanwhile: a later batch removes it
    for name in sorted(set(theirs) - ours):
        yield Op(OpKind.REMOVE, name)
    yield from checkpoint_ops(data_dir)


class Applier:
    """Applies ops to a follower's data directory and makes them durable (:meth:`sync`); a
    log segment the leader retired into its archive goes into ``<data_dir>/archive``."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._fds: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._directories: set[str] = set()

    def _path(self, name: str) -> str:
        return os.path.join(self.data_dir, *name.split("/"))

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            path = self._path(name)
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=0o700, exist_ok=True)
                self._directories.add(os.path.dirname(directory))
            existed = os.path.exists(path)
            fd = self._fds[name] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            if not existed:
                self._directories.add(directory)
        return fd

    def _close(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        self._dirty.discard(name)
        if fd is not None:
            os.close(fd)

    def apply(self, ops: Iterable[Op]) -> None:
        for op in ops:
            if op.kind is OpKind.WRITE or op.kind is OpKind.CREATE:
                fd = self._fd(op.path)
                offset = 0 if op.kind is OpKind.CREATE else op.offset
                size = os.fstat(fd).st_size
                if offset > size:
                    raise ValueError(f"{op.path}: a write at {offset} past the end ({size} bytes)")
                view = memoryview(op.data)
                at = offset
                while view:
                    written = os.pwrite(fd, view, at)
                    view = view[written:]
                    at += written
                if size > at:
                    os.ftruncate(fd, at)
                self._dirty.add(op.path)
            elif op.kind is OpKind.TRUNCATE:
                fd = self._fd(op.path)
                os.ftruncate(fd, op.offset)
                self._dirty.add(op.path)
            elif op.kind is OpKind.RENAME:
                self.sync()  # the files are durable before they are put in place
                source, target = self._path(op.path), self._path(_checked(op.data.decode()))
                shutil.rmtree(target + ".old", ignore_errors=True)
                if os.path.exists(target):
                    os.rename(target, target + ".old")
                os.rename(source, target)
                self._directories.add(os.path.dirname(target))
                self.sync()
                shutil.rmtree(target + ".old", ignore_errors=True)
            elif op.kind is OpKind.RETIRE and op.offset == 1:
                self._close(op.path)
                archive = os.path.join(self.data_dir, ARCHIVE)
                os.makedirs(archive, mode=0o700, exist_ok=True)
                try:
                    os.replace(self._path(op.path), os.path.join(archive, os.path.basename(op.path)))
                except FileNotFoundError:
                    pass
                self._directories.update((archive, os.path.dirname(self._path(op.path))))
            else:  # RETIRE (deleted) and REMOVE
                self._close(op.path)
                path = self._path(op.path)
                for name in [name for name in self._fds if name.startswith(op.path + "/")]:
                    self._close(name)
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as error:
                    if error.errno != errno.ENOENT:
                        raise
                self._directories.add(os.path.dirname(path))

    def sync(self) -> None:
        """fsync every file written since the last sync, then the directories changed."""
        for name in sorted(self._dirty):
            fd = self._fds.get(name)
            if fd is not None:
                os.fsync(fd)
        self._dirty.clear()
        for directory in sorted(self._directories):
            if os.path.isdir(directory):
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self._directories.clear()

    def close(self) -> None:
        for name in list(self._fds):
            self._close(name)


def apply_ops(data_dir: str, ops: Iterable[Op]) -> None:
    """Apply ``ops`` to ``data_dir`` and make them durable."""
    applier = Applier(data_dir)
    try:
        applier.apply(ops)
        applier.sync()
    finally:
        applier.close()

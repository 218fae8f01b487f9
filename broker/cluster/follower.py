"""The follower's side of replication: a link to the leader that copies and applies its files.

:class:`FollowerLink` sends the follower's file index (``replication.file_index``), then
applies what the leader sends, in order, on a thread of its own: the copy, then each batch.
Batches that arrive while others are applied are applied together and synced once; the last
one's number is then acknowledged. Nothing is acknowledged before it is synced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from postroom.broker.cluster.frames import SEQ, FrameReader, Kind, hello, seq_frame, tls_failure
from postroom.broker.cluster.replication import Applier, Op, decode_ops

__all__ = ["FollowerLink"]


class FollowerLink(FrameReader):
    """One follower's link to its leader.

    :param files: the follower's file index, sent in the hello
    :param on_refused: called with the leader's reason when it refuses this follower
    """

    _log = Logger()

    def __init__(
        self,
        reactor: Any,
        data_dir: str,
        name: str,
        secret: str,
        files: dict[str, tuple[int, int]],
        pool: ThreadPool,
        on_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        super().__init__()
        self.reactor = reactor
        self.name = name
        self.secret = secret
        self.files = files
        self.pool = pool
        self.applier = Applier(data_dir)
        self.on_refused = on_refused
        #: Frames received and not applied yet: ``(seq or None, ops)``.
        self._queue: list[tuple[int | None, list[Op]]] = []
        self._applying = False
        self._lost = False
        #: Why the copy could not be written, if that is why the link closed.
        self.write_error: OSError | None = None
        #: What failed in the link's TLS, if that is why it closed.
        self.tls_error: str | None = None
        #: Whether the leader sent anything (its TLS handshake, if any, succeeded).
        self.heard = False
        self.closed: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.send(hello(self.name, self.secret, self.files))

    def frameReceived(self, kind: Kind, payload: memoryview) -> None:
        self.heard = True
        if kind is Kind.COPY:
            self._queue.append((None, decode_ops(payload)))
        elif kind is Kind.COPIED:
            (seq,) = SEQ.unpack_from(payload)
            self._queue.append((seq, []))
        elif kind is Kind.BATCH:
            (seq,) = SEQ.unpack_from(payload)
            self._queue.append((seq, decode_ops(payload, SEQ.size)))
        elif kind is Kind.REFUSED:
            self.on_refused(bytes(payload).decode(errors="replace"))
            self.transport.loseConnection()
            return
        else:
            self.bad(f"an unexpected {kind.name} frame")
            return
        self._apply()

    def _apply(self) -> None:
        if self._applying or not self._queue:
            return
        queue, self._queue = self._queue, []
        self._applying = True
        applied = deferToThreadPool(self.reactor, self.pool, self._write, queue)
        applied.addCallbacks(self._written, self._failed)

    def _write(self, queue: list[tuple[int | None, list[Op]]]) -> int | None:
        """The link's thread: apply ``queue``; sync it when it ends a copy or a batch."""
        last = None
        for seq, ops in queue:
            self.applier.apply(ops)
            if seq is not None:
                last = seq
        if last is not None:
            self.applier.sync()
        return last

    def _written(self, seq: int | None) -> None:
        self._applying = False
        if self._lost:
            self.applier.close()  # (the link ended while this was applied)
            return
        if seq is not None:
            self.send(seq_frame(Kind.ACK, seq))
        self._apply()

    def _failed(self, failure: Failure) -> None:
        self._applying = False
        error = failure.value
        if isinstance(error, OSError):
            # A full disk, a quota, a failing device: the node's own trouble, not a bug. What
            # was half written is found by the next hello's index and copied again.
            self.write_error = error
            self._log.error(
                "cluster node {name} cannot write its copy of the leader's files ({error}); the link is closed",
                name=self.name,
                error=f"{error.strerror or error}" + (f": {error.filename}" if error.filename else ""),
            )
        else:
            self._log.failure("applying what the leader sent failed; the link is closed", failure)
        if self._lost:
            self.applier.close()
        else:
            self.transport.loseConnection()

    def bad(self, reason: str) -> None:
        self._log.warn("the leader sent something unreadable ({reason}); the link is closed", reason=reason)
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self.tls_error = tls_failure(reason)
        self._lost = True
        self._queue.clear()
        if not self._applying:
            self.applier.close()
        if not self.closed.called:
            self.closed.callback(None)

"""The leader's side of replication: followers' links, the in-sync set, and the confirm gate.

:class:`Replication` is what the log's writer sends its batches to (``storage.logwriter``'s
``Replication``), and the factory of the followers' links. A follower connects and says
which files it has; its link marks the batch number reached (:meth:`Recorder.mark`), copies it
what it lacks (``replication.sync_ops``) while later batches wait, then sends those, then each
new batch as it is cut. The follower acknowledges each batch once it is applied and synced.

**The in-sync set.** A follower that has the copy and is at most :data:`JOIN_LAG` batches
behind joins it: confirms wait for it from then on, then its key is put in etcd
(``<prefix>/isr/<name>``, only while this node holds the leader key: the caller's
``set_in_sync``). One that disconnects, or leaves a batch unacknowledged for
``in_sync_timeout``, leaves: its key is deleted first, and only then do confirms stop waiting
for it. Since only a node whose key is there may take the leader key, a confirm always means
that whoever leads next has the message.

**The gate** (:meth:`after`) releases a write's confirms once every follower in the set has
its batch and the set, with the leader, holds at least ``min_in_sync`` copies. Below that it
waits, and refuses (nacks) what waited longer than ``confirm_timeout``. It releases nothing
once the leader's lease may have run out (``valid``): a node paused past its lease confirms
nothing when it resumes.
"""

from __future__ import annotations

import hmac
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IAddress, IPushProducer
from twisted.internet.protocol import Factory
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from postroom.broker.cluster.frames import SEQ, FrameReader, Kind, frame, read_hello, seq_frame, tls_failure
from postroom.broker.cluster.replication import Op, Recorder, encode_ops, sync_ops

__all__ = ["Replication", "LeaderLink"]

#: A follower this many batches behind, or fewer, joins the in-sync set.
JOIN_LAG = 2
#: Bytes of the initial copy read and sent at a time.
COPY_BYTES = 4 << 20
#: Bytes of batches a follower may leave unacknowledged (or waiting behind its copy): past
#: them its link is cut, so that a follower slow for good does not fill the leader's memory
#: (it copies what it lacks when it connects again).
MAX_UNACKED_BYTES = 256 << 20


def _copy_chunk(ops: Any) -> list[Op]:
    """Up to :data:`COPY_BYTES` of the copy's next ops (a thread)."""
    chunk: list[Op] = []
    size = 0
    for op in ops:
        chunk.append(op)
        size += op.size
        if size >= COPY_BYTES:
            break
    return chunk


@implementer(IPushProducer)
class LeaderLink(FrameReader):
    """One follower's link, on the leader."""

    _log = Logger()

    def __init__(self, replication: Replication) -> None:
        super().__init__()
        self.replication = replication
        self.name: str | None = None
        #: ``hello``, ``copying`` (batches wait in :attr:`waiting`), ``streaming``.
        self.state = "hello"
        self.waiting: list[tuple[int, list[bytes]]] = []
        #: The last batch sent, the last acknowledged, and when each unacknowledged one was sent.
        self.sent = 0
        self.acked = 0
        self.sent_at: deque[tuple[int, float, int]] = deque()
        #: Bytes of the batches in :attr:`sent_at` and :attr:`waiting`.
        self.unacked_bytes = 0
        self._paused: defer.Deferred[None] | None = None

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.transport.registerProducer(self, True)

    # IPushProducer: the copy waits while the socket's buffer is full.
    def pauseProducing(self) -> None:
        if self._paused is None:
            self._paused = defer.Deferred()

    def resumeProducing(self) -> None:
        paused, self._paused = self._paused, None
        if paused is not None:
            paused.callback(None)

    def stopProducing(self) -> None:
        self.resumeProducing()

    def frameReceived(self, kind: Kind, payload: memoryview) -> None:
        if kind is Kind.HELLO and self.state == "hello":
            try:
                name, secret, files = read_hello(bytes(payload))
            except (ValueError, KeyError, TypeError):
                self.bad("a hello the leader cannot read")
                return
            if not hmac.compare_digest(secret.encode(), self.replication.secret.encode()):
                self.refuse("the cluster's secret does not match")
                return
            if name == self.replication.name:
                self.refuse("a follower named as the leader")
                return
            self.name = name
            self.replication.joined(self)
            self.state = "copying"
            defer.ensureDeferred(self._copy(files)).addErrback(self._copy_failed)
        elif kind is Kind.ACK and self.state != "hello":
            (seq,) = SEQ.unpack_from(payload)
            self.acked = max(self.acked, seq)
            while self.sent_at and self.sent_at[0][0] <= seq:
                self.unacked_bytes -= self.sent_at.popleft()[2]
            self.replication.acknowledged(self)
        else:
            self.bad(f"an unexpected {kind.name} frame")

    async def _copy(self, theirs: dict[str, tuple[int, int]]) -> None:
        mark = self.replication.recorder.mark()
        ops = sync_ops(self.replication.data_dir, theirs)
        copied = 0
        while self.state == "copying":
            chunk = await deferToThread(_copy_chunk, ops)
            if not chunk or self.state != "copying":
                break
            copied += sum(len(op.data) for op in chunk)
            self.send(frame(Kind.COPY, encode_ops(chunk)))
            if self._paused is not None:
                await self._paused
        if self.state != "copying":
            return
        self.send(seq_frame(Kind.COPIED, mark))
        self._log.info(
            "follower {name}: copied {bytes} bytes of files, up to batch {seq}", name=self.name, bytes=copied, seq=mark
        )
        self.sent = mark
        self.sent_at.append((mark, self.replication.clock(), 0))
        self.state = "streaming"
        waiting, self.waiting = self.waiting, []
        self.unacked_bytes = 0
        for seq, pieces in waiting:
            if seq > mark:
                self._batch(seq, pieces)

    def _copy_failed(self, failure: Failure) -> None:
        self._log.failure("copying files to follower {name} failed", failure, name=self.name)
        if self.transport is not None:
            self.transport.loseConnection()

    def batch(self, seq: int, pieces: list[bytes]) -> None:
        if self.state == "copying":
            self.waiting.append((seq, pieces))
            self._hold(sum(len(piece) for piece in pieces))
        elif self.state == "streaming":
            self._batch(seq, pieces)

    def _batch(self, seq: int, pieces: list[bytes]) -> None:
        size = sum(len(piece) for piece in pieces)
        self.send(seq_frame(Kind.BATCH, seq, pieces))
        self.sent = seq
        self.sent_at.append((seq, self.replication.clock(), size))
        self._hold(size)

    def _hold(self, size: int) -> None:
        self.unacked_bytes += size
        if self.unacked_bytes > MAX_UNACKED_BYTES and self.transport is not None:
            self._log.warn(
                "follower {name}: {bytes} bytes unacknowledged; link cut (it copies again when it reconnects)",
                name=self.name,
                bytes=self.unacked_bytes,
            )
            self.state = "closed"
            self.transport.abortConnection()

    def lag(self, now: float) -> float:
        """Seconds the oldest unacknowledged batch has waited."""
        return now - self.sent_at[0][1] if self.sent_at else 0.0

    @property
    def lag_bytes(self) -> int:
        """Bytes of the batches sent and not acknowledged (or waiting behind the copy)."""
        return self.unacked_bytes

    def refuse(self, reason: str) -> None:
        self._log.warn("refused a follower from {peer}: {reason}", peer=str(self.transport.getPeer()), reason=reason)
        self.send(frame(Kind.REFUSED, reason.encode()))
        self.transport.loseConnection()

    def bad(self, reason: str) -> None:
        self._log.warn("follower {name}: {reason}; link closed", name=self.name, reason=reason)
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self.name is None and (failed := tls_failure(reason)) is not None:
            peer = self.transport.getPeer() if self.transport is not None else "?"
            self._log.warn("refused a follower from {peer}: TLS failed ({reason})", peer=str(peer), reason=failed)
        self.state = "closed"
        self.resumeProducing()
        self.replication.left(self)


class Replication(Factory):
    """The leader's followers and its confirm gate.

    :param name: this node's name
    :param data_dir: the data directory replicated
    :param secret: what a follower must send to be served (kept in etcd)
    :param min_in_sync: copies, the leader's counted, a confirm needs
    :param in_sync_timeout: seconds a follower in sync may leave a batch unacknowledged
    :param confirm_timeout: seconds a write may wait for ``min_in_sync`` copies before it is refused
    :param set_in_sync: ``set_in_sync(name, True/False)`` records a follower's place in the
        in-sync set in etcd; it returns whether it could (this node still leads)
    :param valid: whether this node may still act as the leader (its lease cannot have run out)
    """

    _log = Logger()
    protocol = LeaderLink
    noisy = False

    def __init__(
        self,
        reactor: Any,
        name: str,
        data_dir: str,
        secret: str,
        min_in_sync: int,
        in_sync_timeout: float,
        confirm_timeout: float,
        set_in_sync: Callable[[str, bool], Awaitable[bool]],
        valid: Callable[[], bool],
    ) -> None:
        self.reactor = reactor
        #: Seconds, for how long writes and batches have waited (the reactor's clock).
        self.clock: Callable[[], float] = reactor.seconds
        self.name = name
        self.data_dir = data_dir
        self.secret = secret
        self.recorder = Recorder(data_dir)
        #: Held while a batch is cut and handed to the reactor (the log's writer and the
        #: dead-letter writer each cut on their own thread).
        self._cutting = threading.Lock()
        self.min_in_sync = min_in_sync
        self.in_sync_timeout = in_sync_timeout
        self.confirm_timeout = confirm_timeout
        self.set_in_sync = set_in_sync
        self.valid = valid
        #: Every follower's link, by name, and the names in the in-sync set.
        self.links: dict[str, LeaderLink] = {}
        self.in_sync: set[str] = set()
        #: Names being taken out of the in-sync set (their keys are being deleted).
        self._leaving: set[str] = set()
        #: Writes waiting for their batch: ``(seq, release, refuse, since)``.
        self.pending: deque[tuple[int, Callable[[], None], Callable[[], None], float]] = deque()
        self._watch = task.LoopingCall(self._check_lag)
        self._watch.clock = reactor
        #: Confirms held for replication: count, and seconds they waited in all.
        self.waits = 0
        self.waited = 0.0
        self.stopped = False

    def buildProtocol(self, addr: IAddress | None) -> LeaderLink:
        return LeaderLink(self)

    def start(self) -> None:
        self._watch.start(0.05, now=False)

    def stop(self) -> None:
        self.stopped = True
        if self._watch.running:
            self._watch.stop()
        for link in list(self.links.values()):
            if link.transport is not None:
                link.transport.loseConnection()
        pending, self.pending = self.pending, deque()
        for _seq, _release, refuse, _since in pending:
            refuse()

    # -- the writers (storage.logwriter.Replication) --------------------------------------

    def flush(self) -> int:
        with self._cutting:  # (so batches reach the reactor, and the followers, in their order)
            seq, ops = self.recorder.cut()
            if ops:
                self.reactor.callFromThread(self._send, seq, encode_ops(ops))
        return seq

    def _send(self, seq: int, pieces: list[bytes]) -> None:
        for link in self.links.values():
            link.batch(seq, pieces)

    def after(self, seq: int, release: Callable[[], None], refuse: Callable[[], None]) -> None:
        if self.stopped:
            refuse()
            return
        self.pending.append((seq, release, refuse, self.clock()))
        self._release()

    # -- followers -----------------------------------------------------------------------

    def joined(self, link: LeaderLink) -> None:
        assert link.name is not None
        old = self.links.get(link.name)
        if old is not None and old is not link and old.transport is not None:
            old.transport.loseConnection()
        self.links[link.name] = link

    def left(self, link: LeaderLink) -> None:
        if link.name is None or self.links.get(link.name) is not link:
            return
        del self.links[link.name]
        self._log.info("follower {name} disconnected", name=link.name)
        if link.name in self.in_sync:
            defer.ensureDeferred(self._leave(link.name, "disconnected"))

    def acknowledged(self, link: LeaderLink) -> None:
        name = link.name
        assert name is not None
        if (
            name not in self.in_sync
            and name not in self._leaving
            and link.state == "streaming"
            and link.sent - link.acked <= JOIN_LAG
        ):
            # Confirms wait for it from now on; then the set in etcd names it.
            self.in_sync.add(name)
            defer.ensureDeferred(self._join(name))
        self._release()

    async def _join(self, name: str) -> None:
        if await self.set_in_sync(name, True):
            self._log.info("follower {name} is in sync", name=name)

    async def _leave(self, name: str, why: str) -> None:
        if name in self._leaving:
            return
        self._leaving.add(name)
        try:
            if await self.set_in_sync(name, False):
                self._log.info("follower {name} left the in-sync set ({why})", name=name, why=why)
                self.in_sync.discard(name)
        finally:
            self._leaving.discard(name)
        self._release()

    def _check_lag(self) -> None:
        now = self.clock()
        for name in list(self.in_sync):
            link = self.links.get(name)
            if link is None:
                defer.ensureDeferred(self._leave(name, "disconnected"))
            elif link.lag(now) > self.in_sync_timeout:
                defer.ensureDeferred(self._leave(name, f"a batch unacknowledged for {link.lag(now):.1f} s"))
        self._release()

    # -- the gate ------------------------------------------------------------------------

    def _release(self) -> None:
        pending = self.pending
        if not pending:
            return
        if not self.valid():
            return
        now = self.clock()
        copies = 1 + len(self.in_sync)
        while pending:
            seq, release, refuse, since = pending[0]
            if copies < self.min_in_sync:
                if now - since > self.confirm_timeout:
                    pending.popleft()
                    refuse()
                    continue
                return
            for name in self.in_sync:
                link = self.links.get(name)
                if link is None or link.acked < seq:
                    return
            pending.popleft()
            self.waits += 1
            self.waited += now - since
            release()

    def followers(self) -> dict[str, dict[str, Any]]:
        """Each linked follower's state (``copying``, ``streaming``) and lag, as the management
        API and metrics show them."""
        now = self.clock()
        return {
            name: {
                "state": link.state,
                "lag_batches": link.sent - link.acked,
                "lag_bytes": link.lag_bytes,
                "lag_seconds": round(link.lag(now), 3),
            }
            for name, link in sorted(self.links.items())
        }

"""A channel's publisher confirms (``confirm.select``), as RabbitMQ's channel sends them.

Publishes are numbered 1, 2, 3 ... An accepted publish that waits for nothing is confirmed
with the others of the same read, one ``basic.ack`` (``multiple`` when it covers more than one)
when the connection flushes (:meth:`Confirms.flush`). A persistent one waits until the log is
durable up to its record, and every later confirm queues behind it, so a ``multiple`` ack never
covers a publish that is not durable yet; a write that fails nacks those waiting. A refused
publish is nacked at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from postroom.broker.wire.codec import ack_method, nack_method

if TYPE_CHECKING:
    from postroom.broker.core.node import Node
    from postroom.broker.core.vhost import VirtualHost


class Output(Protocol):
    """What confirms use of their connection (``ServerConnection``): its output, the confirms
    it flushes when it writes, and whether the node knows it has bytes to write."""

    out: list[bytes]
    confirming: list[Confirms]
    dirty: bool
    node: Node


class Confirms:
    """The confirms of one channel in confirm mode.

    :param channel_id: the channel's number, for the acks and nacks
    :param connection: where they are written
    :param vhost: the channel's vhost (its journal, and its count of confirmed publishes)
    """

    __slots__ = ("channel_id", "connection", "vhost", "seq", "pending", "confirmed_upto", "waits")

    def __init__(self, channel_id: int, connection: Output, vhost: VirtualHost) -> None:
        self.channel_id = channel_id
        self.connection = connection
        self.vhost = vhost
        #: The number of the last publish.
        self.seq = 0
        #: The last accepted publish not confirmed yet, when none waits for the log (0: none).
        self.pending = 0
        #: The highest publish number answered (acked or nacked), for metrics.
        self.confirmed_upto = 0
        #: Confirms waiting for the log: (publish number, log position needed, accepted), in order.
        self.waits: deque[tuple[int, int, bool]] = deque()

    @property
    def unconfirmed(self) -> int:
        """Publishes not answered yet."""
        return self.seq - self.confirmed_upto

    def accepted(self) -> None:
        """The last publish was accepted and waits for nothing: confirm it with this read's others."""
        if not self.pending:
            self.connection.confirming.append(self)
        self.pending = self.seq

    def flush(self) -> None:
        """Write one ``basic.ack`` covering every publish accepted so far: ``multiple`` when it
        covers more than one (RabbitMQ's rule; a single confirm is a plain ack)."""
        if self.pending:
            covered = self.pending - self.confirmed_upto
            self.connection.out.append(ack_method(self.channel_id, self.pending, covered > 1))
            self.vhost.confirmed += self.pending - self.confirmed_upto
            self.confirmed_upto = self.pending
            self.pending = 0

    def wait(self, seq: int, position: int, accepted: bool) -> None:
        """Hold the confirm of ``seq`` until the log is durable up to ``position`` (0: no wait of its own).

        Once one confirm waits, later ones queue behind it, so a ``multiple`` ack never covers
        a publish that is not durable yet.
        """
        journal = self.vhost.journal
        assert journal is not None
        if not self.waits:
            self.flush()
            journal.waiters[self] = None
        self.waits.append((seq, position, accepted))
        if position <= journal.synced:
            self.release_confirms(journal.synced)

    def release_confirms(self, position: int) -> None:
        """Confirm waiting publishes whose records are durable (at or before ``position``)."""
        self._settle_waits(position, refuse=False)

    def refuse_confirms(self, position: int) -> None:
        """Nack waiting publishes whose records could not be written (at or before ``position``)."""
        self._settle_waits(position, refuse=True)

    def _settle_waits(self, position: int, refuse: bool) -> None:
        waits = self.waits
        acked: list[int] = []
        refused: list[int] = []
        while waits and waits[0][1] <= position:
            seq, needed, accepted = waits.popleft()
            self.confirmed_upto = seq
            if accepted and not (refuse and needed):
                acked.append(seq)
            else:
                refused.append(seq)
        self.vhost.confirmed += len(acked)
        waiting = waits[0][0] if waits else None
        channel_id, out = self.channel_id, self.connection.out
        if acked and not refused:  # the usual case: every tag settled is below those waiting
            out.append(ack_method(channel_id, acked[-1], len(acked) > 1))
        elif len(acked) == 1:
            out.append(ack_method(channel_id, acked[0], False))
        elif acked:
            self._coalesced(ack_method, acked, refused, waiting)
        if refused:
            self._coalesced(nack_method, refused, acked, waiting)
        if not waits and self.vhost.journal is not None:
            self.vhost.journal.waiters.pop(self, None)
        connection = self.connection
        if not connection.dirty:
            connection.dirty = True
            connection.node.mark_dirty(connection)

    def _coalesced(
        self, build: Callable[[int, int, bool], bytes], tags: list[int], others: list[int], waiting: int | None
    ) -> None:
        """Write the acks (or nacks) of ``tags``, settled together with ``others`` (the nacks, or
        acks), as RabbitMQ's channel coalesces them: the tags below every publish still waiting
        and every one of ``others`` go as one ``multiple``, the rest one by one.
        """
        cutoff = waiting if waiting is not None else tags[-1] + 1
        if others:
            cutoff = min(cutoff, *others)
        below = [tag for tag in tags if tag < cutoff]
        out = self.connection.out
        if below:
            out.append(build(self.channel_id, below[-1], True))
        out += [build(self.channel_id, tag, False) for tag in tags[len(below) :]]

    def nack_last(self) -> None:
        """Refuse the last publish (it could not be accepted): a ``multiple`` nack, as
        RabbitMQ's, unless acks of earlier publishes go out with it."""
        acks_too = bool(self.pending)
        self.flush()
        self.confirmed_upto = self.seq
        self.connection.out.append(nack_method(self.channel_id, self.seq, not acks_too))

    def forget(self) -> None:
        """The channel is closing: confirm nothing more, and wait for the log no more."""
        if self in self.connection.confirming:
            self.connection.confirming.remove(self)
        if self.waits and self.vhost.journal is not None:
            self.waits.clear()
            self.vhost.journal.waiters.pop(self, None)

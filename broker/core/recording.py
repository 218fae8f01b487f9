"""What a work queue records in the write-ahead log: the journal (``broker.core.journal``) as
queues, their ready lines and the channels that publish into them see it.

A durable work queue on a broker with a log holds a :class:`QueueJournal`; the queue tells it
of messages that enter and leave for good, and of returns that raise a delivery count.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from postroom.broker.core.entry import Entry, Queue
from postroom.broker.core.entry_spool import SpoolRecord
from postroom.broker.core.message import Message


class QueueJournal(Protocol):
    """The journal, as a durable work queue uses it."""

    @property
    def position(self) -> int:
        """Bytes encoded so far: a publish is durable once the log is written this far."""

    def published(self, message: Message, vhost: str, queues: Iterable[str]) -> int:
        """Record a persistent message entering durable ``queues``; return its id."""

    def removed(self, queue: Queue, entries: Iterable[Entry]) -> None:
        """Entries of journaled messages left ``queue`` for good."""

    def refused(self, queue: Queue, message: Message) -> None:
        """``queue`` refused a message already recorded as entering it (it was full)."""

    def forget(self, entries: Iterable[Entry]) -> None:
        """Entries left a deleted queue (its deletion is recorded already)."""

    def delivery_counted(self, queue: Queue, entry: Entry) -> None:
        """A return raised ``entry``'s delivery count."""

    def spool_removed(self, queue: Queue, records: Iterable[SpoolRecord]) -> None:
        """Spool records of ``queue`` left it for good (a purge), or with it."""

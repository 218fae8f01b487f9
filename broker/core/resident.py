"""Resident bodies: the logged messages whose bodies are in memory, oldest first, and their
bytes. Such a body can be dropped from memory (:meth:`ResidentBodies.page_out`) and read back
from the log when it is delivered; the pager (``broker.storage.body_paging``) keeps their bytes
within the memory budget.

The journal (``broker.core.journal``) counts a body in once its ``Published`` record is
written, and out when the last durable queue lets the message go.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from postroom.broker.core.message import Message


class ResidentBodies:
    """Logged messages whose bodies are in memory and counted in :attr:`size`, oldest first."""

    def __init__(self) -> None:
        #: Candidates for :meth:`page_out`, newest first; a message no longer counted stays
        #: until it is passed over (:meth:`note_stale`).
        self.messages: deque[Message] = deque()
        #: Body bytes of the counted messages.
        self.size = 0
        #: Messages in :attr:`messages` that no longer count there (removed lazily).
        self._stale = 0
        #: Bodies paged out so far.
        self.paged_out = 0

    def add(self, message: Message) -> None:
        """Count ``message``'s body in (its record is written: it can be read back)."""
        message.wal_counted = True
        self.size += message.size
        self.messages.append(message)

    def add_all(self, messages: list[Message], size: int) -> None:
        """Count ``messages`` in, already marked counted, with ``size`` body bytes in all."""
        self.size += size
        self.messages.extend(messages)

    def uncount(self, message: Message) -> None:
        """The body of a logged message left memory another way, or the message left its last
        durable queue."""
        if message.wal_counted:
            message.wal_counted = False
            self.size -= message.size

    def drop_gone(self) -> None:
        """Forget the oldest messages that no durable queue holds any more."""
        messages = self.messages
        while messages and not messages[0].wal_queues:
            self.uncount(messages.popleft())

    def note_stale(self, count: int) -> None:
        """``count`` messages left without being taken out of :attr:`messages`: compact it once
        they are many."""
        self._stale += count
        if self._stale > max(1024, len(self.messages) // 2):
            self.messages = deque(kept for kept in self.messages if kept.wal_counted)
            self._stale = 0

    def page_out(self, budget: int) -> int:
        """Drop bodies of logged messages from memory, newest first, until at most ``budget``
        bytes of them remain; they are read back from the log when delivered. Returns how many."""
        messages = self.messages
        paged = 0
        while self.size > budget and messages:
            message = messages.pop()
            if not message.wal_counted:
                continue
            message.wal_counted = False
            self.size -= message.size
            if message.wal_queues and message.wal_location is not None:
                message.page_out()
                paged += 1
        self.paged_out += paged
        return paged

"""What the node is given to keep messages out of memory, as the node and its vhosts call them.

The storage layer provides both (``broker.storage.body_paging.Pager``,
``broker.storage.streams.StreamFiles``); the node holds them under these types, so that the
core names no layer above it. Each protocol lists exactly the calls the core makes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from postroom.broker.core.ready import BodyPager
from postroom.broker.core.stream import StreamStore

if TYPE_CHECKING:
    from postroom.broker.core.queue import WorkQueue
    from postroom.broker.core.stream import StreamQueue


class QueuePager(BodyPager["WorkQueue"], Protocol):
    """What pages the bodies of deep queues to disk: a queue asks it when it grows
    (:class:`~broker.core.ready.BodyPager`), the node and its vhosts attach each queue to it."""

    def attach(self, queue: WorkQueue) -> None:
        """A new queue: let it ask to be watched, and spool what is behind its window."""

    def attach_all(self, queues: Iterable[WorkQueue]) -> None:
        """Queues that existed before the pager (recovered, or from the definitions)."""


class StreamStorage(StreamStore, Protocol):
    """Where stream queues keep their messages: a stream writes through it
    (:class:`~broker.core.stream.StreamStore`), a vhost opens and deletes streams with it."""

    def open(self, name: str, vhost_name: str, arguments: Mapping[str, Any]) -> StreamQueue:
        """The stream ``name`` of ``vhost_name`` on its files (created, or read back)."""
        ...

    def delete(self, stream: StreamQueue) -> None:
        """``stream`` was deleted: its files go."""

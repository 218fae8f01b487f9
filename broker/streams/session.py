"""What the parts of a stream-protocol connection share: the connection as they see it
(:class:`Session`: :class:`~broker.streams.connection.StreamConnection` is one), and what it
has to write (:data:`Outgoing`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeAlias

from postroom.broker.core.node import Node
from postroom.broker.core.stream import StreamQueue
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.wal.streamlog import Region

#: What a connection has to write, in order: frames (or parts of one), and chunks to send from
#: their file.
Outgoing: TypeAlias = bytes | memoryview | Region


class Session(Protocol):
    """The connection as its parts see it (its streams, publishing, subscriptions and super
    streams): where frames go, who may do what, its streams, how it ends."""

    node: Node
    #: The host and port ``open`` and ``metadata`` advertise.
    advertised: tuple[str, int]
    #: Frames to write, in order.
    out: list[Outgoing]
    #: Set when the socket is to be closed once :attr:`out` is written.
    finished: bool
    #: Why the connection ended (for the log), when it was not the client's close.
    reason: str
    #: Bytes of chunks in :attr:`out`, how many of its items are a :class:`Region`, whether
    #: the socket is full, and whether a subscription has more to send once it is not
    #: (see :meth:`StreamConnection.resume <broker.streams.connection.StreamConnection.resume>`).
    queued: int
    regions: int
    paused: bool
    behind: bool
    #: Called when something was added to :attr:`out` outside a read.
    wake: Callable[[], None]

    @property
    def opened_vhost(self) -> VirtualHost:
        """The vhost the connection opened (what runs once it is open only asks)."""

    def answer(self, key: int, correlation: int, code: int, extra: bytes = b"") -> None:
        """Answer request ``key`` with ``code``, then ``extra``."""

    def count_error(self, code: int) -> None:
        """One more refusal with ``code``."""

    def end(self, reason: str) -> None:
        """End the connection without a word, for ``reason``."""

    def permitted(self, what: str, name: str, kind: str = "queue") -> bool:
        """Whether the user has ``what`` on queue (or ``kind``) ``name`` now."""

    def stream(self, name: str) -> StreamQueue | None:
        """The stream called ``name`` in the vhost, if there is one."""

    def watch(self, stream: StreamQueue) -> None:
        """Be told of ``stream``'s new chunks, and of its deletion."""

    def unwatch(self, stream: StreamQueue) -> None:
        """Stop watching ``stream`` once no publisher or subscription here uses it."""

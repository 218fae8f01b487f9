"""What the parts of an AMQP 0-9-1 connection see of each other.

The connection (``broker.amqp.connection.ServerConnection``) runs its handshake
(``broker.amqp.handshake``) and its channels (``broker.amqp.channel.ChannelState``); a channel
runs its consumers (``broker.amqp.consuming``) and its exchange and queue methods
(``broker.amqp.topology``). The parts name what they use of the ones above them by the
protocols here, not by their classes, so that no module imports one that imports it: this
module imports none of them (but the confirms' class, for a type).

Also here: the connection's life-cycle :class:`State`, which both the connection and its
handshake set.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pamqp.base import Frame

    from postroom.broker.amqp.confirms import Confirms
    from postroom.broker.core.access import Access
    from postroom.broker.core.entry import Queue
    from postroom.broker.core.node import Node
    from postroom.broker.core.vhost import VirtualHost
    from postroom.broker.errors import AMQPError, ConnectionException

__all__ = ["State", "Link", "Channel"]


class State(Enum):
    """Where a connection is in its life cycle."""

    AWAIT_HEADER = "await header"
    AWAIT_START_OK = "await start-ok"
    AUTHENTICATING = "authenticating"  # the login is being checked; what arrives meanwhile waits
    AWAIT_TUNE_OK = "await tune-ok"
    AWAIT_OPEN = "await open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close and wait for close-ok
    CLOSED = "closed"
    LINGERING = "lingering"  # we answered the client's connection.close; waiting for it to hang up


class Link(Protocol):
    """A connection as its handshake, its channels and their consumers see it
    (``ServerConnection``; its attributes say what each holds)."""

    node: Node
    loopback: bool
    peer: str
    certificate_name: Callable[[], str | None] | None
    state: State
    out: list[bytes]
    dirty: bool
    writable: bool
    pending: bytes
    frame_max: int
    channel_max: int
    heartbeat: int
    confirming: list[Confirms]
    exclusive_queues: list[Queue]
    capabilities: dict[str, Any]
    client_properties: dict[str, Any]
    user_name: str
    user: Any
    vhost: VirtualHost
    access: Access | None
    closed: bool
    teardown_errors: list[BaseException]
    error: AMQPError | None
    replied_bytes: int
    auth_mechanism: str

    def receive_data(self, data: bytes) -> None: ...

    def fail(self, error: ConnectionException) -> None: ...

    def finish(self) -> None: ...


class Channel(Protocol):
    """A channel as its consumers and its exchange and queue methods see it (``ChannelState``)."""

    connection: Link
    id: int
    vhost: VirtualHost
    closing: bool
    last_queue: str | None
    transactional: bool
    tx_ops: list[Callable[[], object]]
    tx_acks: int

    def send(self, method: Frame) -> None: ...

    def readable_queue(self, name: str) -> str: ...

    def current_queue(self, name: str) -> str: ...

    def is_topic(self, exchange_name: str) -> bool: ...

"""The broker node: virtual hosts, users and limits shared by every connection.

The node also keeps the set of connections with bytes waiting to be written. A publish on
one connection can produce deliveries on many; each delivery marks its connection dirty,
and the shell writes every dirty connection once after it has handled the incoming data.
That gives one ``write`` per connection per batch of frames instead of one per frame.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from postroom.broker.core.admin import Administration
from postroom.broker.core.entry import Queue
from postroom.broker.core.login import LoginThrottle, decoy_hash, is_expensive
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.releases import AwaitingRelease
from postroom.broker.core.replyto import DirectReplyTo
from postroom.broker.core.retained import RetainedMessages
from postroom.broker.core.stores import QueuePager, StreamStorage
from postroom.broker.core.timers import Scheduler
from postroom.broker.core.users import User
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import Snapshot

if TYPE_CHECKING:
    from postroom.broker.core.hooks import HookChain
    from postroom.broker.core.journal import Journal
from postroom.exchanges.registry import ExchangeTypeRegistry, default_registry

#: Server limits a client can push on, each with the reason for its value.
DEFAULT_FRAME_MAX = 131072  # RabbitMQ's default: large enough for 128 KiB bodies in one frame
DEFAULT_CHANNEL_MAX = 2047  # RabbitMQ's default; each channel costs a little memory per connection
DEFAULT_HEARTBEAT = 60  # seconds, RabbitMQ's default: a dead peer is found within 2 minutes
DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024  # RabbitMQ 3.x's default; a body is held in memory whole

#: The description RabbitMQ gives the vhost ``/`` it creates on a fresh node.
DEFAULT_VHOST_DESCRIPTION = "Default virtual host"

#: The alarms clients are told of (``connection.blocked``), among :attr:`Node.alarms`.
RESOURCE_ALARMS = frozenset({"memory", "disk"})
#: Consumers on one channel (RabbitMQ 3.12's ``consumer_max_per_channel``, unlimited there):
#: each costs memory no alarm reclaims, so there is a bound, far above what clients use.
DEFAULT_CONSUMER_MAX_PER_CHANNEL = 10_000


def _run_here(fn: Callable[[], Any], callback: Callable[[Any], None]) -> None:
    callback(fn())


@dataclass(slots=True)
class Limits:
    """Negotiated and enforced limits (see the module constants for the reasons)."""

    frame_max: int = DEFAULT_FRAME_MAX
    channel_max: int = DEFAULT_CHANNEL_MAX
    heartbeat: int = DEFAULT_HEARTBEAT
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Open connections the node accepts at once (``limits.max_connections``; ``None``: as the
    #: open file limit allows, see :attr:`Node.socket_limit`): one more is refused, saying which.
    max_connections: int | None = None
    #: Consumers one channel may hold (``limits.consumer_max_per_channel``; ``None``: no limit):
    #: one more closes the connection with 530, as RabbitMQ 3.12 closes it.
    consumer_max_per_channel: int | None = DEFAULT_CONSUMER_MAX_PER_CHANNEL


@dataclass(frozen=True, slots=True)
class ListenerInfo:
    """A socket the node listens on, as RabbitMQ lists its listeners.

    :param protocol: RabbitMQ's name for what it serves: ``amqp``, ``amqp/ssl``, ``http``,
        ``https``, ``http/prometheus``, ``https/prometheus``
    :param certfile: the certificate a TLS listener presents (``None`` without TLS)
    :param cacertfiles: the files of CA certificates it trusts
    """

    protocol: str
    interface: str
    port: int
    certfile: str | None = None
    cacertfiles: tuple[str, ...] = ()


@dataclass
class Node:
    """Everything the connections of one broker share.

    :param users: who may log in
    :param vhosts: virtual host names to create
    :param rng: source of generated names (injected so tests are repeatable)
    """

    users: Iterable[User] = (User("guest", password="guest", loopback_only=True, tags=("administrator",)),)
    vhost_names: Iterable[str] = ("/",)
    limits: Limits = field(default_factory=Limits)
    registry: ExchangeTypeRegistry = field(default_factory=default_registry)
    rng: random.Random = field(default_factory=random.Random)
    #: Time and timers (the reactor; a ``Clock`` in tests). Queues with TTLs, visibility
    #: timeouts or ``x-expires`` need it; the shell's factory fills it in when left out.
    clock: Scheduler | None = None
    product: str = "Postroom"
    version: str = "0.1.0"
    #: Message hooks added by plugins; ``None`` when there are none (the hot path checks only that).
    hooks: HookChain | None = None
    #: Authentication backends added by plugins (``IAuthenticator``), asked after the configured users.
    authenticators: tuple[Any, ...] = ()
    #: The SASL mechanisms clients may use (``auth_mechanisms``); ``EXTERNAL`` only over TLS.
    auth_mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")

    def __post_init__(self) -> None:
        #: Who may log in, by name; changed through :attr:`admin` (then :meth:`users_changed`).
        self.users_by_name: dict[str, User] = {user.name: user for user in self.users}
        self._decoy_hash = decoy_hash(self.users_by_name.values())
        #: Live administration of users and vhosts, recorded in the log.
        self.admin = Administration(self)
        #: The broker's own login for its connections to itself (shovels to ``amqp://``): not
        #: listed, not kept, loopback only; ``None`` until the shell sets one.
        self.internal_user: User | None = None
        #: Runs ``fn`` and then ``callback(fn())``; the shell runs ``fn`` in a worker thread and
        #: the callback back on the reactor. Here: both at once, on the calling thread.
        self.run_blocking: Callable[[Callable[[], Any], Callable[[Any], None]], None] = _run_here
        self.login_throttle = LoginThrottle(lambda: self.clock.seconds() if self.clock is not None else 0.0)
        # In RabbitMQ's order (AMQPLAIN, PLAIN, EXTERNAL), whatever the configured order.
        offered = [name for name in ("AMQPLAIN", "PLAIN", "EXTERNAL") if name in self.auth_mechanisms]
        self._mechanisms = (
            " ".join(name for name in offered if name != "EXTERNAL"),
            " ".join(offered),
        )
        #: The write-ahead log's journal; ``None`` keeps everything in memory only.
        self.journal: Journal | None = None
        #: What pages the bodies of deep queues to disk (``broker.storage.body_paging.Pager``; ``None``: nothing).
        self.pager: QueuePager | None = None
        #: Where stream queues keep their messages (``broker.storage.streams.StreamFiles``;
        #: ``None``: no storage, streams are refused).
        self.streams: StreamStorage | None = None
        #: How many dead letters of earlier runs each queue holds in its spool (not as
        #: messages): the dead-letter log knows them by their headers when they come back
        #: (``broker.core.dead_letter_events``).
        self.recovered_dead_letters: Counter[str] = Counter()
        #: Dead-letter queues restored from a checkpoint (``DeadLetterLog.unlisted``).
        self.recovered_dead_letter_queues: set[str] = set()
        self.vhosts: dict[str, VirtualHost] = {}
        for name in self.vhost_names:
            self.add_vhost(name).description = DEFAULT_VHOST_DESCRIPTION if name == "/" else ""
        #: Event counts for metrics: stale_acks, stale_extends, auth_attempts, auth_failures, auth_successes...
        self.counters: Counter[str] = Counter()
        self.connections: set[Any] = set()
        #: Open connections of the stream protocol (``broker.streams``).
        self.stream_connections: set[Any] = set()
        #: Open MQTT connections (``broker.mqtt``), once connected.
        self.mqtt_connections: set[Any] = set()
        #: MQTT's retained messages, kept in the log.
        self.retained = RetainedMessages()
        #: MQTT's QoS 2 publishes of persistent sessions that wait for PUBREL.
        self.awaiting_release = AwaitingRelease()
        #: The channels' direct reply-to consumers (``amq.rabbitmq.reply-to``).
        self.replies = DirectReplyTo()
        #: Open connections per user name (for users' connection and channel limits).
        self.user_connections: dict[str, set[Any]] = {}
        self.dirty: set[Any] = set()
        #: Queues whose last dispatch stopped at its batch limit; the shell dispatches them again.
        self.backlogged: set[Queue] = set()
        #: Called when the dirty set becomes non-empty outside of the shell's own I/O handling.
        self.on_dirty: Callable[[], None] | None = None
        #: The alarms in force: ``memory`` and ``disk`` (the resource alarms), and ``log`` while
        #: the write-ahead log's backlog is over its bound. While any is, a connection that
        #: publishes is blocked (see :meth:`set_alarm`). Always this one set object.
        self.alarms: set[str] = set()
        #: Whether a queue with consumers is far behind what arrives (``broker.storage.body_paging.Pager``
        #: says so): the shell then reads less from each client at a time, so publishers are
        #: slowed to the pace of deliveries, as RabbitMQ's credit flow slows them.
        self.flow = False
        #: The sockets it listens on, once bound (the shell adds them), for health checks.
        self.listeners: list[ListenerInfo] = []
        #: Connections the open file limit leaves room for, less a reserve (the shell sets it at
        #: start); the limit without ``limits.max_connections``. ``None``: none known.
        self.socket_limit: int | None = None

    @property
    def connections_open(self) -> int:
        """Open connections of every protocol."""
        return len(self.connections) + len(self.stream_connections) + len(self.mqtt_connections)

    def connection_limit_reached(self) -> str | None:
        """Which node-wide limit one more connection would pass, in words; ``None``: none."""
        configured = self.limits.max_connections
        limit = configured if configured is not None else self.socket_limit
        if limit is None or self.connections_open < limit:
            return None
        source = "limits.max_connections" if configured is not None else "the open file limit, less a reserve"
        self.counters["connections_refused_node_limit"] += 1
        return f"node connection limit ({limit}, {source}) is reached"

    def set_alarm(self, resource: str, active: bool) -> bool:
        """Raise or clear the alarm of ``resource`` (``memory``, ``disk`` or ``log``); whether it changed.

        As RabbitMQ: while an alarm is in force, a connection is blocked once it publishes
        (``connection.blocked`` to a client that has the capability, and nothing more is read
        from it); when the last alarm clears, every blocked connection is unblocked. Clients
        are told of the resource alarms only: the log's backlog pauses publishers silently,
        as RabbitMQ's flow control does.
        """
        if active == (resource in self.alarms):
            return False
        if active:
            self.alarms.add(resource)
        else:
            self.alarms.discard(resource)
        for connection in [*self.connections, *self.mqtt_connections]:
            connection.alarm_changed()
        return True

    def set_flow(self, flow: bool) -> None:
        """Slow publishers down (``True``) or let them go at their own pace: see :attr:`flow`."""
        self.flow = flow

    def alarm_text(self) -> str:
        """``connection.blocked``'s reason, in RabbitMQ's words (``low on memory & disk``)."""
        return "low on " + " & ".join(sorted(self.alarms & RESOURCE_ALARMS, key=("memory", "disk").index))

    def add_vhost(self, name: str) -> VirtualHost:
        """Create a virtual host (with the node's clock and journal) and return it."""
        vhost = VirtualHost(name, self.registry, self.rng, self.clock)
        vhost.on_backlog = self.note_backlog
        vhost.journal = self.journal
        vhost.pager = self.pager
        vhost.streams = self.streams
        vhost.hooks = self.hooks
        self.vhosts[name] = vhost
        return vhost

    def users_changed(self) -> None:
        """A user was added, changed or deleted in :attr:`users_by_name`."""
        self._decoy_hash = decoy_hash(self.users_by_name.values())

    def topology(self) -> bytes:
        """The node's definitions (users, vhosts), then every vhost's durable state
        (:meth:`VirtualHost.snapshot_records`), as records between ``Snapshot`` markers.

        Written at the head of each new segment of the log, so that older segments never hold
        the only record of something still declared, and can be retired once their messages
        are gone; and into each checkpoint.
        """
        parts = [encode(Snapshot(True)), *self.admin.records()]
        for vhost in self.vhosts.values():
            parts += vhost.snapshot_records()
        parts.append(encode(Snapshot(False)))
        return b"".join(parts)

    def set_journal(self, journal: Journal) -> None:
        """Persist durable state from now on: every vhost records into ``journal``."""
        self.journal = journal
        self.retained.journal = journal
        self.awaiting_release.journal = journal
        for vhost in self.vhosts.values():
            vhost.journal = journal

    def set_pager(self, pager: QueuePager) -> None:
        """Page the bodies of deep queues with ``pager`` from now on, in every queue."""
        self.pager = pager
        for vhost in self.vhosts.values():
            vhost.pager = pager
            pager.attach_all(queue for queue in vhost.queues.values() if isinstance(queue, WorkQueue))

    def set_streams(self, streams: StreamStorage) -> None:
        """Keep stream queues' messages in ``streams`` (``broker.storage.streams.StreamFiles``)."""
        self.streams = streams
        for vhost in self.vhosts.values():
            vhost.streams = streams

    def set_clock(self, clock: Scheduler) -> None:
        """Give the node (and its virtual hosts, for queues declared from now on) a clock."""
        self.clock = clock
        for vhost in self.vhosts.values():
            vhost.clock = clock

    def note_backlog(self, queue: Queue) -> None:
        """A queue stopped dispatching at its batch limit: dispatch it again soon."""
        self.backlogged.add(queue)

    def dispatch_backlogged(self) -> None:
        """Dispatch again every queue that stopped at its batch limit."""
        queues, self.backlogged = self.backlogged, set()
        for queue in queues:
            if not queue.deleted:
                queue.dispatch()

    def mark_dirty(self, connection: Any) -> None:
        """Note that ``connection`` has bytes to write."""
        if not self.dirty and self.on_dirty is not None:
            self.dirty.add(connection)
            self.on_dirty()
        else:
            self.dirty.add(connection)

    def authenticate(self, username: str, password: str, loopback: bool) -> User | None:
        """The user for these credentials, or ``None`` when they are refused, at once (the
        password is checked on the calling thread; connections use :meth:`login`).

        The configured users are asked first, then each plugin backend in load order (as
        RabbitMQ's ``auth_backends``): the first to return a user lets the client in.
        """
        user = self.users_by_name.get(username)
        ok = user is not None and user.check_password(password)
        return self._accepted(user, ok, username, password, loopback)[0]

    def login(
        self,
        username: str,
        password: str | None,
        loopback: bool,
        host: str,
        done: Callable[[User | None, str], None],
    ) -> None:
        """Check a connection's login and call ``done(user, "")``, or ``done(None, reason)``
        with the reason for the log, now or later (see :mod:`broker.core.login`: expensive
        hashes are checked through :attr:`run_blocking`, and a name with many recent failures
        from one host has its refusals slowed).

        :param password: ``None`` for ``EXTERNAL``: ``username`` comes from a verified client
            certificate and no password is asked
        :param host: the peer's address (failures are counted by address and name)
        """
        self.counters["auth_attempts"] += 1
        user = self.users_by_name.get(username)
        if user is None and self.internal_user is not None and username == self.internal_user.name:
            user = self.internal_user  # (the broker's own connections: shovels to the node itself)

        def finish(ok: bool) -> None:
            accepted, reason = self._accepted(user, ok, username, password, loopback)
            if accepted is not None:
                self.counters["auth_successes"] += 1
                done(accepted, reason)
                return
            self.counters["auth_failures"] += 1
            delay = self.login_throttle.failed(host, username)
            if delay and self.clock is not None:
                self.clock.callLater(delay, done, None, reason)
            else:
                done(None, reason)

        if password is None:
            finish(user is not None)
            return
        stored = user.password_hash if user is not None else self._decoy_hash
        if is_expensive(stored):
            # An unknown name is checked against the decoy, at the same cost.
            target = user if user is not None else User("", password_hash=stored)
            self.run_blocking(lambda: target.check_password(password), finish)
        else:
            finish(user is not None and user.check_password(password))

    def _accepted(
        self, user: User | None, ok: bool, username: str, password: str | None, loopback: bool
    ) -> tuple[User | None, str]:
        """The configured user when its check passed and it may connect from here, else the
        first plugin backend's user (not for ``EXTERNAL``); or ``None`` and why."""
        if ok and user is not None and (loopback or not user.loopback_only):
            return user, ""
        if password is not None:
            for authenticator in self.authenticators:
                found = authenticator.authenticate(username, password, loopback)
                if found is not None:
                    return found, ""
        if ok and user is not None:
            return None, f"user '{username}' can only connect via localhost"
        return None, f"user '{username}' - invalid credentials"

    def mechanisms(self, tls: bool) -> str:
        """The mechanisms ``connection.start`` offers, space-separated: ``EXTERNAL`` only on TLS."""
        return self._mechanisms[tls]

    def random_tag(self, prefix: str) -> str:
        """A generated name such as ``amq.ctag-Xy…`` (22 random characters, as in RabbitMQ)."""
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        return prefix + "".join(self.rng.choice(alphabet) for _ in range(22))

"""One connection of RabbitMQ's stream protocol (port 5552), sans-IO, as RabbitMQ 3.10.8's
``rabbit_stream_reader`` runs it.

Each frame is read as its command (:func:`broker.wire.streamframes.parse_request`) and goes by
its type to the part of the connection whose job it is, each owning its state:

* :class:`~broker.streams.handshake.Handshake`: ``peer_properties``, SASL, ``tune``, ``open``
  (each step has one next step: :class:`~broker.streams.handshake.Step`), and ``close``;
* :class:`~broker.streams.topology.Topology`: streams created, deleted and described
  (``metadata``, ``stream_stats``);
* :class:`~broker.streams.publishing.Publishing`: publishers publish, confirmed once the log's
  group commit synced their chunk and deduplicated by reference;
* :class:`~broker.streams.subscriptions.Subscriptions`: subscriptions get whole chunks while
  they have credit; offsets are stored and queried; its
  :class:`~broker.streams.superstreams.ConsumerGroups` run single-active-consumer groups;
* :class:`~broker.streams.superstreams.SuperStreams`: super streams, their ``partitions`` and
  ``route``.

They see the connection as a :class:`~broker.streams.session.Session`. A command the open
connection does not read is answered with ``close`` 13 "unknown frame".

Bytes come in through :meth:`StreamConnection.receive`; what is to be written collects in
:attr:`StreamConnection.out` for the transport to take. Some of it comes later, outside a
read (a login checked later, confirms, chunks written, a stream deleted): :attr:`wake` tells
the transport. Frames that arrive while the login is checked wait.
"""

from __future__ import annotations

from collections.abc import Callable

from postroom.broker.core.node import Node
from postroom.broker.core.sockets import SocketDetails
from postroom.broker.core.stream import StreamQueue
from postroom.broker.core.users import User
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.errors import ChannelException
from postroom.broker.streams.handshake import FRAME_MAX, HEARTBEAT, Handshake, Step
from postroom.broker.streams.publishing import Publisher, Publishing
from postroom.broker.streams.session import Outgoing
from postroom.broker.streams.subscriptions import Subscription, Subscriptions
from postroom.broker.streams.superstreams import SuperStreams
from postroom.broker.streams.topology import Topology
from postroom.broker.wire import streamframes as wire


def error_counter(code: int) -> str:
    """The key of :attr:`Node.counters <broker.core.node.Node.counters>` that counts the
    stream protocol's refusals with ``code``."""
    return f"stream_error:{code}"


class StreamConnection:
    """One client of the stream protocol (see the module's docstring).

    :param node: the broker
    :param peer: the client's address, ``host:port``
    :param loopback: whether the client connects from a loopback address
    :param advertised: the host and port ``open`` advertises (this listener's)
    :param certificate_name: over TLS, what names the client's certificate (``EXTERNAL``)
    """

    def __init__(
        self,
        node: Node,
        peer: str,
        loopback: bool,
        advertised: tuple[str, int],
        certificate_name: Callable[[], str | None] | None = None,
    ) -> None:
        self.node = node
        self.peer = peer
        self.loopback = loopback
        self.advertised = advertised
        #: Over TLS: the common names of the client's certificate (``None`` from it: it
        #: presented none), for ``EXTERNAL``; ``None`` on a plain socket.
        self.certificate_name = certificate_name
        self.reader = wire.FrameReader()
        #: Frames to write, in order.
        self.out: list[Outgoing] = []
        self.step = Step.TCP_CONNECTED
        #: Set when the socket is to be closed once :attr:`out` is written.
        self.finished = False
        #: Set while the login is checked: what arrives waits in :attr:`_held`.
        self.waiting = False
        self._held: list[bytes] = []
        self.user: User | None = None
        self.user_name = ""
        #: The vhost opened (``None`` until then).
        self.vhost: VirtualHost | None = None
        self.frame_max = FRAME_MAX
        self.heartbeat = HEARTBEAT
        #: Whether the client sent anything since the last heartbeat check.
        self.heard = True
        #: The reason the connection ended (for the log), when it was not the client's close.
        self.reason = ""
        #: Called when something was added to :attr:`out` outside :meth:`receive`.
        self.wake: Callable[[], None] = lambda: None
        #: What the client said of itself (``peer_properties``), and how it logged in.
        self.client_properties: dict[str, str] = {}
        self.auth_mechanism = ""
        #: When it connected, in milliseconds since the epoch, and what it counts of its
        #: socket (bytes and reads and writes each way, the socket's details): the shell sets them.
        self.connected_at = 0
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.socket: SocketDetails | None = None
        #: Bytes of chunks in :attr:`out` (the shell zeroes it as it writes them), and whether
        #: the socket is full (the shell says so): either stops deliveries until
        #: :meth:`resume`; :attr:`behind` says that a subscription has more to send then.
        self.queued = 0
        self.paused = False
        self.behind = False
        #: How many of :attr:`out`'s items are a :class:`~broker.wal.streamlog.Region` (a
        #: chunk to send from its file) rather than bytes (the shell zeroes it too).
        self.regions = 0
        self.handshake = Handshake(self)
        self.topology = Topology(self)
        self.publishing = Publishing(self)
        self.subscribing = Subscriptions(self)
        self.super_streams = SuperStreams(self)

    @property
    def publishers(self) -> dict[int, Publisher]:
        """The publishers, by the ids the client gave them."""
        return self.publishing.publishers

    @property
    def subscriptions(self) -> dict[int, Subscription]:
        """The subscriptions, by the ids the client gave them."""
        return self.subscribing.subscriptions

    @property
    def pending_updates(self) -> dict[int, tuple[Subscription, bool]]:
        """``consumer_update`` requests sent and not answered yet, by correlation id."""
        return self.subscribing.groups.pending

    # -- input ----------------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Bytes from the client: act on each whole frame, in order."""
        if self.finished:
            return
        self.heard = True
        frames = self.reader.feed(data)
        if self.waiting:
            self._held += frames
            return
        self._act(frames)

    def act_on_held(self) -> None:
        """The login was checked: act on what arrived meanwhile."""
        held, self._held = self._held, []
        self._act(held)

    def _act(self, frames: list[bytes]) -> None:
        for index, raw in enumerate(frames):
            if self.finished:
                return
            if self.waiting:
                self._held += frames[index:]
                return
            command = wire.parse_request(raw)
            step = self.step
            if step is Step.OPENED:
                self._open_command(command)
            elif step is Step.CLOSE_SENT or step is Step.CLOSING:
                self.handshake.after_close(command)
            else:
                self.handshake.receive(command)

    def _open_command(self, command: wire.Command) -> None:
        """A command once open, to the part whose job it is (the most frequent first)."""
        match command:
            case wire.Publish():
                self.publishing.publish(command)
            case wire.Credit():
                self.subscribing.credit(command)
            case wire.StoreOffset():
                self.subscribing.store_offset(command)
            case wire.Heartbeat():
                pass
            case wire.DeclarePublisher():
                self.publishing.declare(command)
            case wire.QueryPublisherSequence():
                self.publishing.query_sequence(command)
            case wire.DeletePublisher():
                self.publishing.delete(command)
            case wire.Subscribe():
                self.subscribing.subscribe(command)
            case wire.Unsubscribe():
                self.subscribing.unsubscribe(command)
            case wire.QueryOffset():
                self.subscribing.query_offset(command)
            case wire.ExchangeCommandVersions():
                self.subscribing.exchange_command_versions(command)
            case wire.ConsumerUpdateResponse():
                self.subscribing.groups.answered(command)
            case wire.CreateStream():
                self.topology.create(command)
            case wire.DeleteStream():
                self.topology.delete(command)
            case wire.Metadata():
                self.topology.metadata(command)
            case wire.StreamStats():
                self.topology.stats(command)
            case wire.Route():
                self.super_streams.route(command)
            case wire.Partitions():
                self.super_streams.partitions(command)
            case wire.CreateSuperStream():
                self.super_streams.create(command)
            case wire.DeleteSuperStream():
                self.super_streams.delete(command)
            case wire.Close():
                self.handshake.close(command)
            case _:  # (the handshake's commands, a response, or one not read)
                self.handshake.unknown()

    # -- what the parts share (broker.streams.session.Session) ------------------------------------

    @property
    def opened_vhost(self) -> VirtualHost:
        """The vhost opened (what runs once the connection is open only asks)."""
        assert self.vhost is not None
        return self.vhost

    def answer(self, key: int, correlation: int, code: int, extra: bytes = b"") -> None:
        """Answer request ``key`` with ``code``. Once open, each code but OK and 19 is counted,
        as RabbitMQ 3.10 counts them (``rabbitmq_global_stream_error_*``; not the handshake's)."""
        if code != wire.OK and code != wire.NO_OFFSET and self.step is Step.OPENED:
            self.count_error(code)
        self.out.append(wire.response(key, correlation, code, extra))

    def count_error(self, code: int) -> None:
        """One more refusal with ``code`` (``rabbitmq_global_stream_error_*``)."""
        self.node.counters[error_counter(code)] += 1

    def end(self, reason: str) -> None:
        """End the connection without a word (where RabbitMQ's reader fails), for ``reason``."""
        self.reason = reason
        self.finished = True

    def permitted(self, what: str, name: str, kind: str = "queue") -> bool:
        """Whether the user has ``what`` on queue (or ``kind``) ``name`` now (permissions
        change live)."""
        vhost = self.opened_vhost
        user = self.node.users_by_name.get(self.user_name)
        if user is None or not user.may_open(vhost.name):
            return False
        access = user.access(vhost.name)
        try:
            if access is not None:
                access.check(what, kind, name)
        except ChannelException:
            return False
        return True

    def stream(self, name: str) -> StreamQueue | None:
        """The stream called ``name`` in the vhost, if there is one."""
        queue = self.vhost.queues.get(name) if self.vhost is not None else None
        return queue if isinstance(queue, StreamQueue) else None

    def watch(self, stream: StreamQueue) -> None:
        """Be told of ``stream``'s new chunks, and of its deletion (:meth:`_stream_changed`)."""
        stream.watchers.add(self._stream_changed)

    def unwatch(self, stream: StreamQueue) -> None:
        """Stop watching ``stream`` once no publisher or subscription here uses it."""
        users: list[Subscription | Publisher] = [*self.subscriptions.values(), *self.publishers.values()]
        if not any(user.stream is stream for user in users):
            stream.watchers.discard(self._stream_changed)

    def _stream_changed(self, stream: StreamQueue) -> None:
        """``stream`` has new chunks written: deliver them. Or it was deleted: its publishers
        and subscriptions here go, and the client is told (``metadata_update``, 6)."""
        if stream.deleted:
            self.publishing.forget(stream)
            self.subscribing.forget(stream)
            stream.watchers.discard(self._stream_changed)
            if not self.finished:
                self.count_error(wire.STREAM_NOT_AVAILABLE)
                self.out.append(wire.metadata_update(wire.STREAM_NOT_AVAILABLE, stream.name))
        else:
            self.subscribing.written(stream)
        self.wake()

    # -- the shell's ----------------------------------------------------------------------------

    def resume(self) -> None:
        """The shell wrote what was queued and the socket takes more: deliveries go on."""
        self.behind = False
        self.subscribing.resume()

    def force_close(self, reason: str) -> None:
        """Close the socket without a word (RabbitMQ's way when its management closes a
        stream connection)."""
        self.end(reason)
        self.wake()

    def connection_lost(self) -> None:
        """The socket closed: the connection is gone from the node, with its publishers and
        subscriptions."""
        self.finished = True
        self.node.stream_connections.discard(self)
        readers, publishers = self.subscribing.release(), self.publishing.release()
        users: list[Subscription | Publisher] = [*readers, *publishers]
        for user in users:
            user.stream.watchers.discard(self._stream_changed)
        self.subscribing.groups.released(readers)

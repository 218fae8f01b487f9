"""One connection of RabbitMQ's stream protocol (port 5552), sans-IO, as RabbitMQ 3.10.8's
``rabbit_stream_reader`` runs it.

The handshake goes ``peer_properties``, ``sasl_handshake``, ``sasl_authenticate`` (the
server then sends ``tune``), ``tune`` back, ``open``. Each step has one next step: a frame
that leads anywhere else (a step left out, a heartbeat before ``open``, a failed login or
vhost) gets its answer, then the socket is closed without a word, as RabbitMQ closes it.
Once open: streams are created, deleted and described (``metadata``, and ``partitions`` and
``route`` of super streams); publishers publish, confirmed once the log's group commit synced
their chunk and deduplicated by reference; subscriptions get whole chunks while they have
credit; offsets are stored and queried. A command the connection does not read is answered
with ``close`` 13 "unknown frame".

Bytes come in through :meth:`StreamConnection.receive`; what is to be written collects in
:attr:`StreamConnection.out` for the transport to take. Some of it comes later, outside a
read (a login checked later, confirms, chunks written, a stream deleted): :attr:`wake` tells
the transport. Frames that arrive while the login is checked wait.
"""

from __future__ import annotations

import operator
import struct
import zlib
from collections.abc import Callable
from dataclasses import replace
from itertools import islice
from typing import Any

from twisted.logger import Logger

from broker.core.login import sasl_credentials
from broker.core.node import Node
from broker.core.sockets import SocketDetails
from broker.core.stream import MAX_CHUNK_ENTRIES, StreamQueue
from broker.errors import ChannelCrash, ChannelException
from broker.wal.chunks import (
    BATCH_HEAD,
    BATCHED,
    RAW,
    TRACKING_SNAPSHOT,
    batch_records,
    count_entries,
    split_entries,
    unpack_batched_messages,
    unpack_tracking,
)
from broker.wal.records import WALCorruption
from broker.wal.segments import SEGMENT_HEADER_BYTES
from broker.wal.streamlog import ENTRIES_AT, Chunk, Region
from broker.wire import streamframes as wire
from broker.wire.amqp10 import from_amqp091
from exchanges.partitions import PARTITION_ORDER, SUPER_STREAM, partition_order

_log = Logger()

#: The longest offset reference stored (the protocol's limit: 256 characters).
MAX_REFERENCE = 256

#: The most partitions ``create_super_stream`` makes (a partitioned stream's in the YAML).
MAX_SUPER_STREAM_PARTITIONS = 1024

#: Bytes of chunks queued for the socket at which deliveries pause until the shell has written
#: them and the socket takes more (:meth:`StreamConnection.resume`).
DELIVERY_BOUND = 1 << 20

#: Chunks of stream-protocol messages from this size on (their record, in bytes) go out from
#: their segment as they are stored (:class:`~broker.wal.streamlog.Region`: by ``sendfile``
#: where the socket allows), their CRC worked out from the record's; smaller ones are read.
SENT_FROM_FILE = 64 << 10


def error_counter(code: int) -> str:
    """The key of :attr:`Node.counters <broker.core.node.Node.counters>` that counts the
    stream protocol's refusals with ``code``."""
    return f"stream_error:{code}"


#: The commands served, with the least and the most version of each, as
#: ``exchange_command_versions`` answers them: RabbitMQ 3.13's list (its
#: ``rabbit_stream_utils:command_versions``), ``publish`` at version 1 only (no filtering).
COMMAND_VERSIONS = [
    (key, 1, 1)
    for key in (
        wire.DECLARE_PUBLISHER, wire.PUBLISH, wire.QUERY_PUBLISHER_SEQUENCE, wire.DELETE_PUBLISHER,
        wire.SUBSCRIBE, wire.CREDIT, wire.STORE_OFFSET, wire.QUERY_OFFSET, wire.UNSUBSCRIBE,
        wire.CREATE_STREAM, wire.DELETE_STREAM, wire.METADATA, wire.CLOSE, wire.HEARTBEAT,
        wire.ROUTE, wire.PARTITIONS, wire.STREAM_STATS, wire.CREATE_SUPER_STREAM, wire.DELETE_SUPER_STREAM,
    )
]  # fmt: skip

#: The frame size and heartbeat (seconds) the server offers in ``tune`` (RabbitMQ's defaults).
FRAME_MAX = 1_048_576
HEARTBEAT = 60

#: ``create`` arguments and the stream arguments they become (``rabbit_stream_manager``);
#: others are ignored, as RabbitMQ ignores them.
CREATE_ARGUMENTS = {
    "max-length-bytes": ("x-max-length-bytes", int),
    "max-age": ("x-max-age", str),
    "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
    "initial-cluster-size": ("x-initial-cluster-size", int),
    "queue-leader-locator": ("x-queue-leader-locator", str),
}

#: The step each handshake step must lead to (RabbitMQ's state functions).
_NEXT = {
    "tcp_connected": ("peer_properties_exchanged",),
    "peer_properties_exchanged": ("authenticating",),
    "authenticating": ("authenticated",),
    "tuning": ("tuned", "opened"),
    "tuned": ("opened",),
}


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
        self.out: list[bytes] = []
        #: The handshake's step, ``"open"``, ``"close_sent"`` or ``"closing"``.
        self.step = "tcp_connected"
        #: Set when the socket is to be closed once :attr:`out` is written.
        self.finished = False
        #: Set while the login is checked: what arrives waits in :attr:`_held`.
        self._waiting = False
        self._held: list[bytes] = []
        self.user: Any = None
        self.user_name = ""
        self.vhost: Any = None
        #: ``consumer_update`` requests sent and not answered yet, by correlation id.
        self.pending_updates: dict[int, tuple[_Subscription, bool]] = {}
        self._updates = 0
        #: Publishers and subscriptions by the ids the client gave them.
        self.publishers: dict[int, _Publisher] = {}
        self.subscriptions: dict[int, _Subscription] = {}
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
        #: The version of ``deliver`` the client reads (2 once it said so).
        self.deliver_version = 1

    # -- input ----------------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Bytes from the client: act on each whole frame, in order."""
        if self.finished:
            return
        self.heard = True
        frames = self.reader.feed(data)
        if self._waiting:
            self._held += frames
            return
        self._act(frames)

    def _act(self, frames: list[bytes]) -> None:
        for index, raw in enumerate(frames):
            if self.finished:
                return
            if self._waiting:
                self._held += frames[index:]
                return
            command = wire.parse_request(raw)
            if self.step in ("close_sent", "closing"):
                self._after_close(command)
            elif self.step == "open":
                self._open_command(command)
            else:
                self._handshake(command)

    # -- the handshake ------------------------------------------------------------------------

    def _handshake(self, command: tuple[Any, ...]) -> None:
        before = self.step
        name, correlation = command[0], command[1]
        if name == "peer_properties":
            self.client_properties = command[2]
            self._answer(wire.PEER_PROPERTIES, correlation, wire.OK, wire.string_map(self._server_properties()))
            after = "peer_properties_exchanged"
        elif name == "sasl_handshake":
            self._answer(wire.SASL_HANDSHAKE, correlation, wire.OK, wire.strings(self._mechanisms()))
            after = "authenticating"
        elif name == "sasl_authenticate":
            self._authenticate(correlation, command[2], command[3])
            return  # (it goes on in _login_done, now or later)
        elif name == "tune":
            self.frame_max, self.heartbeat = command[2], command[3]
            after = "tuned"
        elif name == "open":
            after = self._open(correlation, command[2])
        else:  # a heartbeat, or anything else, before the connection is open
            after = before if name == "heartbeat" else "failure"
        self._step(before, after)

    def _step(self, before: str, after: str) -> None:
        if after not in _NEXT.get(before, ()):
            self.reason = self.reason or f"invalid transition from {before} to {after}"
            self.finished = True
            return
        self.step = "open" if after == "opened" else after

    def _server_properties(self) -> dict[str, str]:
        node = self.node
        return {
            "cluster_name": node.admin.cluster_name or "postroom",
            "copyright": "Postroom authors",
            "information": "Postroom: an AMQP 0-9-1 routing broker, with RabbitMQ's stream protocol",
            "platform": "Python/Twisted",
            "product": node.product,
            "version": node.version,
        }

    def _mechanisms(self) -> list[str]:
        """The mechanisms offered here (``EXTERNAL`` over TLS only), in the order RabbitMQ
        lists them: its registry's, which is PLAIN before AMQPLAIN, unless the plugin that
        brings EXTERNAL is in it too."""
        offered = self.node.mechanisms(tls=self.certificate_name is not None).split()
        order = ("AMQPLAIN", "PLAIN", "EXTERNAL") if "EXTERNAL" in self.node.auth_mechanisms else ("PLAIN", "AMQPLAIN")
        return [mechanism for mechanism in order if mechanism in offered]

    def _authenticate(self, correlation: int, mechanism: str, response: bytes) -> None:
        if mechanism not in self._mechanisms():
            self._answer(wire.SASL_AUTHENTICATE, correlation, wire.SASL_MECHANISM_NOT_SUPPORTED)
            self._step(self.step, "failure")
            return
        self.auth_mechanism = mechanism
        password: str | None = None
        if mechanism == "EXTERNAL":
            # The user named by the verified client certificate's common name, with no
            # password (RabbitMQ's rabbitmq_auth_mechanism_ssl, ssl_cert_login_from = common_name).
            assert self.certificate_name is not None  # (offered over TLS only)
            username = self.certificate_name()
            if not username:
                self._answer(wire.SASL_AUTHENTICATE, correlation, wire.AUTHENTICATION_FAILURE)
                self.reason = "EXTERNAL: " + ("no name found" if username == "" else "no client certificate")
                self._step(self.step, "failure")
                return
        else:
            credentials = sasl_credentials(mechanism, response)
            if credentials is None or None in credentials:
                # RabbitMQ answers a response that does not parse (or an AMQPLAIN table
                # without LOGIN or PASSWORD) as a SASL error.
                self._answer(wire.SASL_AUTHENTICATE, correlation, wire.SASL_ERROR)
                self._step(self.step, "failure")
                return
            username, password = credentials[0] or "", credentials[1] or ""
        self._waiting = True
        self.node.login(
            username,
            password,
            self.loopback,
            self.peer.rpartition(":")[0],
            lambda user, reason: self._login_done(correlation, username, user, reason),
        )

    def _login_done(self, correlation: int, username: str, user: Any, reason: str) -> None:
        self._waiting = False
        if self.finished:
            return
        before = self.step
        if user is None:
            loopback_only = reason.endswith("can only connect via localhost")
            code = wire.SASL_AUTHENTICATION_FAILURE_LOOPBACK if loopback_only else wire.AUTHENTICATION_FAILURE
            self._answer(wire.SASL_AUTHENTICATE, correlation, code)
            self.reason = f"login refused for user '{username}': {reason}"
            self._step(before, "failure")
        else:
            self.user, self.user_name = user, user.name
            self._answer(wire.SASL_AUTHENTICATE, correlation, wire.OK)
            self.out.append(wire.tune(FRAME_MAX, HEARTBEAT))
            self._step(before, "authenticated")
            if self.step == "authenticated":
                self.step = "tuning"
        held, self._held = self._held, []
        self._act(held)
        self.wake()

    def _open(self, correlation: int, vhost_name: str) -> str:
        node, user = self.node, self.user
        vhost = node.vhosts.get(vhost_name)
        if user is None or vhost is None or not user.may_open(vhost_name):
            self._answer(wire.OPEN, correlation, wire.VHOST_ACCESS_FAILURE)
            self.reason = f"access to vhost '{vhost_name}' refused for user '{self.user_name}'"
            return "failure"
        self.vhost = vhost
        host, port = self.advertised
        properties = {"advertised_host": host, "advertised_port": str(port)}
        self._answer(wire.OPEN, correlation, wire.OK, wire.string_map(properties))
        node.stream_connections.add(self)
        return "opened"

    # -- once open ----------------------------------------------------------------------------

    def _open_command(self, command: tuple[Any, ...]) -> None:
        name, correlation = command[0], command[1]
        if name == "heartbeat":
            return
        if name == "create_stream":
            self._create(correlation, command[2], command[3])
        elif name == "delete_stream":
            self._delete(correlation, command[2])
        elif name == "metadata":
            self._metadata(correlation, command[2])
        elif name == "declare_publisher":
            self._declare_publisher(correlation, *command[2:])
        elif name == "publish":
            self._publish(*command[2:])
        elif name == "query_publisher_sequence":
            self._query_publisher_sequence(correlation, *command[2:])
        elif name == "delete_publisher":
            self._delete_publisher(correlation, command[2])
        elif name == "subscribe":
            self._subscribe(correlation, *command[2:])
        elif name == "credit":
            self._credit(*command[2:])
        elif name == "unsubscribe":
            self._unsubscribe(correlation, command[2])
        elif name == "store_offset":
            self._store_offset(*command[2:])
        elif name == "query_offset":
            self._query_offset(correlation, *command[2:])
        elif name == "route":
            self._route(correlation, command[2], command[3])
        elif name == "partitions":
            self._partitions(correlation, command[2])
        elif name == "stream_stats":
            self._stream_stats(correlation, command[2])
        elif name == "create_super_stream":
            self._create_super_stream(correlation, *command[2:])
        elif name == "delete_super_stream":
            self._delete_super_stream(correlation, command[2])
        elif name == "consumer_update":
            self._updated(correlation, *command[2:])
        elif name == "exchange_command_versions":
            self._exchange_command_versions(correlation, command[2])
        elif name == "close":
            self._answer(wire.CLOSE, correlation, wire.OK)
            self.step = "closing"
            self.finished = True  # (RabbitMQ closes the socket once it answered)
        else:
            self._count_error(wire.UNKNOWN_FRAME)
            self.out.append(wire.close(1, wire.UNKNOWN_FRAME, "unknown frame"))
            self.step = "close_sent"

    def _answer(self, key: int, correlation: int, code: int, extra: bytes = b"") -> None:
        """Answer request ``key`` with ``code``. Once open, each code but OK and 19 is counted,
        as RabbitMQ 3.10 counts them (``rabbitmq_global_stream_error_*``; not the handshake's)."""
        if code != wire.OK and code != wire.NO_OFFSET and self.step == "open":
            self._count_error(code)
        self.out.append(wire.response(key, correlation, code, extra))

    def _refuse(self, publisher_id: int, ids: list[int], code: int) -> None:
        """``publish_error`` with ``code`` for each of ``ids`` (one counted error a frame)."""
        self._count_error(code)
        publisher = self.publishers.get(publisher_id)
        if publisher is not None:
            publisher.errored += len(ids)
        self.out.append(_publish_error(publisher_id, ids, code))

    def _count_error(self, code: int) -> None:
        """One more refusal with ``code`` (``rabbitmq_global_stream_error_*``)."""
        self.node.counters[error_counter(code)] += 1

    def force_close(self, reason: str) -> None:
        """Close the socket without a word (RabbitMQ's way when its management closes a
        stream connection)."""
        self._end(reason)
        self.wake()

    def _end(self, reason: str) -> None:
        """End the connection without a word (where RabbitMQ's reader fails), for ``reason``."""
        self.reason = reason
        self.finished = True

    def _after_close(self, command: tuple[Any, ...]) -> None:
        """After our ``close``: the client's answer ends the connection; after theirs, nothing
        more is read (RabbitMQ ignores what follows)."""
        if self.step == "close_sent" and command[0] == "response" and command[2] == wire.CLOSE:
            self.finished = True

    def _permitted(self, what: str, name: str, kind: str = "queue") -> bool:
        """Whether the user has ``what`` on queue (or ``kind``) ``name`` now (permissions
        change live)."""
        user = self.node.users_by_name.get(self.user_name)
        if user is None or not user.may_open(self.vhost.name):
            return False
        access = user.access(self.vhost.name)
        try:
            if access is not None:
                access.check(what, kind, name)
        except ChannelException:
            return False
        return True

    def _stream_arguments(self, name: str, arguments: dict[str, str]) -> dict[str, Any] | None:
        """A stream's declaration arguments from ``create``'s; ``None`` (the connection ends,
        as RabbitMQ's reader fails on the conversion) for a number that is not one."""
        declared: dict[str, Any] = {"x-queue-type": "stream"}
        for key, value in arguments.items():
            if key in CREATE_ARGUMENTS:
                argument, kind = CREATE_ARGUMENTS[key]
                try:
                    declared[argument] = int(value) if kind is int else value
                except ValueError:
                    self._end(f"create of stream '{name}': '{key}' is not an integer: {value!r}")
                    return None
        return declared

    def _create(self, correlation: int, name: str, arguments: dict[str, str]) -> None:
        name = name.replace("\n", "").replace("\r", "")
        if not name or name.startswith("amq."):
            self._answer(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED)
            return
        if not self._permitted("configure", name):
            self._answer(wire.CREATE_STREAM, correlation, wire.ACCESS_REFUSED)
            return
        declared = self._stream_arguments(name, arguments)
        if declared is None:
            return
        vhost = self.vhost
        existed = name in vhost.queues
        try:
            # (an existing queue is checked as a declaration checks it: the same stream is
            # "already exists", another queue or other arguments "precondition failed")
            vhost.declare_queue(name, self, durable=True, arguments=declared)
        except ChannelCrash:
            # (a max-age that is not one: RabbitMQ's stream coordinator fails, and so does
            # the reader waiting on it)
            self._end(f"create of stream '{name}': its arguments do not hold: {arguments!r}")
            return
        except ChannelException:
            self._answer(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED)
            return
        code = wire.STREAM_ALREADY_EXISTS if existed else wire.OK
        self._answer(wire.CREATE_STREAM, correlation, code)

    def _delete(self, correlation: int, name: str) -> None:
        if not self._permitted("configure", name):
            self._answer(wire.DELETE_STREAM, correlation, wire.ACCESS_REFUSED)
            return
        stream = self._stream(name)
        if stream is None:
            self._answer(wire.DELETE_STREAM, correlation, wire.STREAM_DOES_NOT_EXIST)
            return
        self._answer(wire.DELETE_STREAM, correlation, wire.OK)
        self.vhost.remove_queue(stream)  # (this connection's metadata_update follows the answer)

    def _create_super_stream(
        self, correlation: int, name: str, partitions: list[str], keys: list[str], arguments: dict[str, str]
    ) -> None:
        """RabbitMQ 3.13's ``create_super_stream``: a direct exchange ``name`` (``x-super-stream``)
        and its ``partitions``, each bound with its key and its place; all or nothing."""

        def answer(code: int) -> None:
            self._answer(wire.CREATE_SUPER_STREAM, correlation, code)

        name = name.replace("\n", "").replace("\r", "")
        if not name or name.startswith("amq."):
            answer(wire.PRECONDITION_FAILED)
            return
        allowed = (
            self._permitted("configure", name, "exchange")
            and self._permitted("read", name, "exchange")
            and all(self._permitted("configure", p) and self._permitted("write", p) for p in partitions)
        )
        if not allowed:
            answer(wire.ACCESS_REFUSED)
            return
        valid = all(p and not p.startswith("amq.") for p in partitions) and len(set(partitions)) == len(partitions)
        if not partitions or len(partitions) != len(keys) or not valid or len(partitions) > MAX_SUPER_STREAM_PARTITIONS:
            answer(wire.PRECONDITION_FAILED)
            return
        vhost = self.vhost
        if name in vhost.exchanges or any(p in vhost.queues for p in partitions):
            answer(wire.STREAM_ALREADY_EXISTS)
            return
        declared = self._stream_arguments(name, arguments)
        if declared is None:
            return
        made: list[Any] = []
        try:
            vhost.declare_exchange(name, "direct", durable=True, arguments={SUPER_STREAM: True})
            for order, (partition, key) in enumerate(zip(partitions, keys, strict=True)):
                made.append(vhost.declare_queue(partition, self, durable=True, arguments=declared))
                vhost.bind_queue(partition, name, key, {PARTITION_ORDER: order}, self)
        except (ChannelException, ChannelCrash):
            for queue in made:  # (RabbitMQ rolls back what it made, in the same way)
                vhost.remove_queue(queue)
            vhost.delete_exchange(name)
            answer(wire.PRECONDITION_FAILED)
            return
        answer(wire.OK)

    def _delete_super_stream(self, correlation: int, name: str) -> None:
        """RabbitMQ 3.13's ``delete_super_stream``: the exchange and its partitions' streams."""
        partitions = self._super_stream(name)
        allowed = self._permitted("configure", name, "exchange") and (
            partitions is None
            or all(self._permitted("configure", p) and self._permitted("write", p) for p, _key, _order in partitions)
        )
        if not allowed:
            self._answer(wire.DELETE_SUPER_STREAM, correlation, wire.ACCESS_REFUSED)
            return
        if partitions is None:
            self._answer(wire.DELETE_SUPER_STREAM, correlation, wire.STREAM_DOES_NOT_EXIST)
            return
        self._answer(wire.DELETE_SUPER_STREAM, correlation, wire.OK)
        vhost = self.vhost
        vhost.delete_exchange(name)
        for partition, _key, _order in partitions:
            stream = self._stream(partition)
            if stream is not None:
                vhost.remove_queue(stream)

    def _metadata(self, correlation: int, names: list[str]) -> None:
        host, port = self.advertised
        streams = []
        found = False
        # (RabbitMQ folds a map of the names: each once, the last in byte order first)
        for name in sorted(set(names), key=lambda n: n.encode("utf-8", "surrogateescape"), reverse=True):
            if self._stream(name) is None:
                streams.append((name, wire.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
            else:
                found = True
                streams.append((name, wire.OK, 0, []))
        brokers = [(0, host, port)] if found else []
        self.out.append(wire.metadata_response(correlation, brokers, streams))

    def _stream(self, name: str) -> StreamQueue | None:
        queue = self.vhost.queues.get(name) if self.vhost is not None else None
        return queue if isinstance(queue, StreamQueue) else None

    # -- publishing ---------------------------------------------------------------------------

    def _declare_publisher(self, correlation: int, publisher: int, reference: str, name: str) -> None:
        def answer(code: int) -> None:
            self._answer(wire.DECLARE_PUBLISHER, correlation, code)

        if not self._permitted("write", name):
            answer(wire.ACCESS_REFUSED)
        elif publisher in self.publishers:
            answer(wire.PRECONDITION_FAILED)
        elif (stream := self._stream(name)) is None:
            answer(wire.STREAM_DOES_NOT_EXIST)
        elif reference and any(p.reference == reference and p.stream is stream for p in self.publishers.values()):
            answer(wire.PRECONDITION_FAILED)
        else:
            self.publishers[publisher] = _Publisher(publisher, reference, stream)
            stream.watchers.add(self._stream_changed)
            answer(wire.OK)

    def _publish(self, publisher_id: int, count: int, data: memoryview) -> None:
        publisher = self.publishers.get(publisher_id)
        refused: list[int] = []
        entries: list[bytes | memoryview] | None = None
        try:
            simple = _published(data, count)
            if simple is None:  # sub-entry batches among the messages
                ids, entries, refused = _published_entries(data)
                block, size = b"", None
            else:
                ids, block, size = simple
        except wire.Malformed:
            # A frame whose messages do not add up: refused whole.
            self._refuse(publisher_id, [], wire.PRECONDITION_FAILED)
            return
        if publisher is None or publisher.stream.deleted:
            self._refuse(publisher_id, ids + refused, wire.PUBLISHER_DOES_NOT_EXIST)
            return
        publisher.published += len(ids) + len(refused)
        self.node.counters["stream_messages_received"] += len(ids) + len(refused)
        stream = publisher.stream
        if not self._permitted("write", stream.name):
            self._refuse(publisher_id, ids + refused, wire.ACCESS_REFUSED)
            return
        if refused:
            self._refuse(publisher_id, refused, wire.PRECONDITION_FAILED)
        tracked: tuple[str, list[int]] | None = None
        if publisher.reference and ids:
            # Deduplication, as RabbitMQ's stream writer does it: a message is written only if
            # its publishing id is above every id this publisher wrote before it, in earlier
            # frames and earlier in this one; the others are confirmed, not written again.
            known = stream.publisher_sequence(publisher.reference)
            last = -1 if known is None else known
            written = ids
            if ids[0] <= last or not all(map(operator.lt, ids, islice(ids, 1, None))):
                if entries is None:
                    entries = _published_entries(data)[1]
                kept, written = [], []
                for number, entry in zip(ids, entries, strict=True):
                    if number > last:
                        kept.append(entry)
                        written.append(number)
                        last = number
                entries = kept
            else:
                last = ids[-1]
            stream.set_publisher_sequence(publisher.reference, last)
            tracked = (publisher.reference, written)
        fresh, batched, held = len(ids), False, len(ids)
        if entries is not None:
            fresh = sum(map(batch_records, entries))
            batched = any([entry[0] & 0x80 for entry in entries])
            block, size, held = b"".join(entries), None, len(entries)
        if block:
            stream.append_raw(block, fresh, batched, held, size, tracked)
        journal = getattr(stream.store, "journal", None)
        if journal is None or not block:
            self._confirm(publisher, ids)
            return
        journal.when_durable(lambda durable: self._written(publisher, ids, durable))

    def _written(self, publisher: _Publisher, ids: list[int], durable: bool) -> None:
        if self.finished:
            return
        if durable:
            self._confirm(publisher, ids)
        else:
            self._refuse(publisher.id, ids, wire.INTERNAL_ERROR)
        self.wake()

    def _confirm(self, publisher: _Publisher, ids: list[int]) -> None:
        publisher.confirmed += len(ids)
        self.node.counters["stream_messages_confirmed"] += len(ids)
        self.out.append(_publish_confirm(publisher.id, ids))

    def _query_publisher_sequence(self, correlation: int, reference: str, name: str) -> None:
        stream = self._stream(name)
        if stream is None:
            self._answer(wire.QUERY_PUBLISHER_SEQUENCE, correlation, wire.STREAM_DOES_NOT_EXIST, wire.u64(0))
            return
        sequence = max(stream.publisher_sequence(reference) or 0, 0)
        self._answer(wire.QUERY_PUBLISHER_SEQUENCE, correlation, wire.OK, wire.u64(sequence))

    def _delete_publisher(self, correlation: int, publisher: int) -> None:
        gone = self.publishers.pop(publisher, None)
        code = wire.OK if gone is not None else wire.PUBLISHER_DOES_NOT_EXIST
        self._answer(wire.DELETE_PUBLISHER, correlation, code)
        if gone is not None:
            self._unwatch(gone.stream)

    # -- subscribing ----------------------------------------------------------------------------

    def _subscribe(
        self,
        correlation: int,
        subscription: int,
        name: str,
        offset: tuple[Any, ...],
        credit: int,
        properties: dict[str, str],
    ) -> None:
        def answer(code: int) -> None:
            self._answer(wire.SUBSCRIBE, correlation, code)

        stream = self._stream(name)
        if stream is None:
            answer(wire.STREAM_DOES_NOT_EXIST)
            return
        if subscription in self.subscriptions:
            answer(wire.SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        if not self._permitted("read", name):
            answer(wire.ACCESS_REFUSED)
            return
        reader = _Subscription(self, subscription, stream, _start(stream, offset), credit)
        reader.properties, reader.spec = properties, offset
        self.subscriptions[subscription] = reader
        stream.watchers.add(self._stream_changed)
        answer(wire.OK)
        group = properties.get("name") if properties.get("single-active-consumer") == "true" else None
        if group:
            reader.group, reader.waiting = group, True
            reader.partition = self._partition_index(stream, properties.get("super-stream"))
            stream.stream_groups.setdefault(group, []).append(reader)
            _rebalance(stream, group)
        else:
            self._pump(reader)

    def consumer_update(self, reader: _Subscription, active: bool) -> None:
        """Tell the client ``reader`` becomes its group's active member (it answers where to
        read from) or stops being it."""
        self._updates += 1
        self.pending_updates[self._updates] = (reader, active)
        body = wire.u32(self._updates) + bytes((reader.id, 1 if active else 0))
        self.out.append(wire.frame(wire.CONSUMER_UPDATE, body))
        self.wake()

    def _updated(self, correlation: int, code: int, kind: int, value: int) -> None:
        """The client's answer to ``consumer_update``. A member made active reads from where it
        says, unless it was told to step down since; one that stepped down lets its group's next
        member be made active (RabbitMQ's reader: ``activate_consumer``)."""
        pending = self.pending_updates.pop(correlation, None)
        if pending is None:
            return  # (its subscription went, or its stream)
        reader, active = pending
        group = reader.group or ""
        if reader not in reader.stream.stream_groups.get(group, []):
            return
        if not active:
            _rebalance(reader.stream, group)
        elif _activating(reader) is None:
            # (whatever the code, as RabbitMQ's reader, which logs one that is not OK)
            # (an answer of no offset, or one of no kind there is: where it subscribed from)
            spec = wire.offset_spec(kind, value) or reader.spec
            reader.chunk, reader.next_offset, reader.waiting = None, _start(reader.stream, spec), False
            self._pump(reader)

    def _stream_changed(self, stream: StreamQueue) -> None:
        """``stream`` has new chunks written: deliver them. Or it was deleted: its publishers
        and subscriptions here go, and the client is told (``metadata_update``, 6)."""
        if stream.deleted:
            self.publishers = {k: p for k, p in self.publishers.items() if p.stream is not stream}
            self.subscriptions = {k: r for k, r in self.subscriptions.items() if r.stream is not stream}
            stream.stream_groups.clear()
            stream.watchers.discard(self._stream_changed)
            if not self.finished:
                self._count_error(wire.STREAM_NOT_AVAILABLE)
                self.out.append(wire.metadata_update(wire.STREAM_NOT_AVAILABLE, stream.name))
        else:
            for reader in list(self.subscriptions.values()):
                if reader.stream is stream:
                    self._pump(reader)
        self.wake()

    def _pump(self, reader: _Subscription) -> None:
        """Deliver the written chunks ``reader`` has not had while it has credit, a chunk each."""
        stream = reader.stream
        while reader.credit > 0 and not self.finished and reader.active and not reader.waiting:
            if self.paused or self.queued >= DELIVERY_BOUND:
                self.behind = True
                return
            try:
                chunk = _next_chunk(stream, reader)
                if chunk is None:
                    return
                if chunk.raw == RAW and chunk.length >= SENT_FROM_FILE and chunk.count <= MAX_CHUNK_ENTRIES:
                    # Sent from its file as it is (the shell sends it, or reads it).
                    crc, region = stream.log.entries_region(chunk)
                    committed, trailer = self._committed(stream), _trailer(stream, chunk)
                    head = _chunk_head(reader.id, chunk, chunk.count, crc, region.length, committed, trailer)
                    parts = [head, region]
                    self.regions += 1
                else:
                    payload = stream.log.read_entries(chunk)
                    parts = _deliver(reader.id, chunk, payload, self._committed(stream), _trailer(stream, chunk))
            except (OSError, WALCorruption) as error:
                reader.active = False
                self.reason = f"reading stream '{stream.name}' at offset {reader.next_offset} failed: {error}"
                _log.error(
                    "stream protocol subscription {id} on {stream!r}: {reason}",
                    id=reader.id,
                    stream=stream.name,
                    reason=self.reason,
                )
                return
            reader.chunk = chunk
            reader.next_offset = chunk.next_offset
            reader.credit -= 1
            reader.consumed += chunk.count
            reader.offset = chunk.first_offset
            for part in parts[1::2]:
                self.queued += part.length if type(part) is Region else len(part)
            self.out += parts

    def resume(self) -> None:
        """The shell wrote what was queued and the socket takes more: deliveries go on."""
        self.behind = False
        for reader in list(self.subscriptions.values()):
            self._pump(reader)

    def _credit(self, subscription: int, credit: int) -> None:
        reader = self.subscriptions.get(subscription)
        if reader is None:
            self._count_error(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            self.out.append(
                wire.frame(
                    wire.CREDIT | wire.RESPONSE, wire.u16(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST) + bytes((subscription,))
                )
            )
            return
        reader.credit += credit
        self._pump(reader)

    def _unsubscribe(self, correlation: int, subscription: int) -> None:
        reader = self.subscriptions.pop(subscription, None)
        if reader is None:
            self._answer(wire.UNSUBSCRIBE, correlation, wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            return
        self._unwatch(reader.stream)
        _leave(reader)
        self._answer(wire.UNSUBSCRIBE, correlation, wire.OK)

    def _unwatch(self, stream: StreamQueue) -> None:
        """Stop watching ``stream`` once no publisher or subscription here uses it."""
        users = [*self.subscriptions.values(), *self.publishers.values()]
        if not any(user.stream is stream for user in users):
            stream.watchers.discard(self._stream_changed)

    # -- super streams ----------------------------------------------------------------------------

    def _super_stream(self, name: str) -> list[tuple[str, str, int | None]] | None:
        """The streams bound to exchange ``name``: ``(stream, binding key, partition order)``
        each, in their partition order (those without one last); ``None``: no such exchange."""
        exchange = self.vhost.exchanges.get(name)
        if exchange is None:
            return None
        bound = []
        for index, (destination, key, arguments) in enumerate(exchange.router.bindings()):
            if isinstance(destination, StreamQueue):
                order = partition_order(arguments)
                bound.append((order is None, order or 0, index, destination.name, key, order))
        return [(stream, key, order) for *_, stream, key, order in sorted(bound)]

    def _partition_index(self, stream: StreamQueue, super_stream: str | None) -> int:
        """``stream``'s place in super stream ``super_stream`` (a subscription's property), as
        RabbitMQ 3.11 finds it (``rabbit_stream_manager``'s ``partition_index``): its binding's
        partition order, else the number after the last ``-`` of its name, else -1 (its group
        then follows a lone stream's rules), -1 as well without such a super stream or binding."""
        bound = self._super_stream(super_stream) if super_stream is not None else None
        orders = [order for name, _key, order in bound or () if name == stream.name]
        if not orders:
            return -1
        if orders[0] is not None:
            return orders[0]
        suffix = stream.name.rpartition("-")[2] if "-" in stream.name else ""
        return int(suffix) if suffix.isascii() and suffix.isdigit() else -1

    def _route(self, correlation: int, routing_key: str, name: str) -> None:
        """``route``: the partitions whose binding key is ``routing_key`` (as RabbitMQ routes it
        through the super stream's direct exchange); answered in the protocol's list form."""
        bound = self._super_stream(name)
        if bound is None:
            self._answer(wire.ROUTE, correlation, wire.STREAM_DOES_NOT_EXIST, wire.strings([]))
            return
        streams = list(dict.fromkeys(stream for stream, key, _ in bound if key == routing_key))
        self._answer(wire.ROUTE, correlation, wire.OK, wire.strings(streams))

    def _partitions(self, correlation: int, name: str) -> None:
        bound = self._super_stream(name)
        if bound is None:
            self._answer(wire.PARTITIONS, correlation, wire.STREAM_DOES_NOT_EXIST, wire.strings([]))
            return
        streams = list(dict.fromkeys(stream for stream, _, _ in bound))
        self._answer(wire.PARTITIONS, correlation, wire.OK, wire.strings(streams))

    def _exchange_command_versions(self, correlation: int, theirs: list[tuple[int, int, int]]) -> None:
        """RabbitMQ 3.11's ``exchange_command_versions``: answered with the commands served here
        and their versions (:data:`COMMAND_VERSIONS`); a client that reads ``deliver`` version 2
        gets it from then on, as from RabbitMQ."""
        body = wire.u32(len(COMMAND_VERSIONS)) + b"".join(struct.pack(">HHH", *each) for each in COMMAND_VERSIONS)
        self._answer(wire.EXCHANGE_COMMAND_VERSIONS, correlation, wire.OK, body)
        for key, _least, most in theirs:
            if key == wire.DELIVER and most >= 2:
                self.deliver_version = 2

    def _committed(self, stream: StreamQueue) -> int | None:
        """What a ``deliver`` of ``stream`` carries as its committed chunk id: ``None`` for
        version 1 (nothing), else the first offset of its newest chunk written."""
        if self.deliver_version == 1:
            return None
        last = stream.log.locate(stream.committed - 1) if stream.committed > stream.log.first_offset else None
        return last.first_offset if last is not None else -1

    def _stream_stats(self, correlation: int, name: str) -> None:
        """RabbitMQ 3.11's ``stream_stats``: osiris's (1.4 on) ``committed_chunk_id``,
        ``first_chunk_id`` and ``last_chunk_id`` (the first offsets of the newest chunk every
        copy has, of the oldest chunk and of the newest one written; -1 when there is none),
        in that order (RabbitMQ folds a map of them, whose keys go in byte order), for a user
        who may read the stream. One node's newest chunk written is the newest committed."""
        if not self._permitted("read", name):
            self._answer(wire.STREAM_STATS, correlation, wire.ACCESS_REFUSED, wire.u32(0))
            return
        stream = self._stream(name)
        if stream is None:
            self._answer(wire.STREAM_STATS, correlation, wire.STREAM_DOES_NOT_EXIST, wire.u32(0))
            return
        log = stream.log
        first = log.locate(log.first_offset) if stream.committed else None
        last = log.locate(stream.committed - 1) if stream.committed else None
        newest = last.first_offset if last is not None else -1
        stats = {
            "committed_chunk_id": newest,
            "first_chunk_id": first.first_offset if first is not None else -1,
            "last_chunk_id": newest,
        }
        body = wire.u32(len(stats)) + b"".join(
            wire.string(key) + struct.pack(">q", value) for key, value in stats.items()
        )
        self._answer(wire.STREAM_STATS, correlation, wire.OK, body)

    # -- offsets ----------------------------------------------------------------------------------

    def _store_offset(self, reference: str, name: str, offset: int) -> None:
        """No answer, as RabbitMQ: for a stream missing or that the user may not write to (as
        RabbitMQ checks it), or a reference longer than 256 characters, nothing is stored."""
        stream = self._stream(name)
        if stream is None or not reference or len(reference) > MAX_REFERENCE or not self._permitted("write", name):
            return
        stream.store_offset(reference, offset)

    def _query_offset(self, correlation: int, reference: str, name: str) -> None:
        stream = self._stream(name)
        if stream is None:
            self._answer(wire.QUERY_OFFSET, correlation, wire.STREAM_DOES_NOT_EXIST, wire.u64(0))
            return
        stored = stream.subscriptions.get(reference)
        if stored is None:
            self._answer(wire.QUERY_OFFSET, correlation, wire.NO_OFFSET, wire.u64(0))
            return
        self._answer(wire.QUERY_OFFSET, correlation, wire.OK, wire.u64(stored))

    # -- the end ----------------------------------------------------------------------------------

    def connection_lost(self) -> None:
        """The socket closed: the connection is gone from the node, with its publishers and
        subscriptions."""
        self.finished = True
        self.node.stream_connections.discard(self)
        readers, publishers = list(self.subscriptions.values()), list(self.publishers.values())
        self.subscriptions.clear()
        self.publishers.clear()
        for user in [*readers, *publishers]:
            user.stream.watchers.discard(self._stream_changed)
        for reader in readers:
            _leave(reader, rebalance=False)
        for reader in readers:  # (once all of them left: a group's next member is told on its own connection)
            if reader.group is not None:
                _rebalance(reader.stream, reader.group)


class _Publisher:
    __slots__ = ("id", "reference", "stream", "published", "confirmed", "errored")

    def __init__(self, publisher_id: int, reference: str, stream: StreamQueue) -> None:
        self.id = publisher_id
        self.reference = reference
        self.stream = stream
        #: Messages it sent, confirmed and refused (RabbitMQ's counts of a publisher).
        self.published = self.confirmed = self.errored = 0


class _Subscription:
    """Where one subscription is in its stream, and the chunks it may still be sent."""

    __slots__ = (
        "connection", "id", "stream", "chunk", "next_offset", "credit", "active", "group",
        "partition", "waiting", "properties", "consumed", "offset", "spec",
    )  # fmt: skip

    def __init__(
        self, connection: StreamConnection, subscription: int, stream: StreamQueue, start: int, credit: int
    ) -> None:
        self.connection = connection
        self.id = subscription
        self.stream = stream
        #: The last chunk sent (its successor comes next), or ``None``: the chunk holding
        #: :attr:`next_offset` comes next.
        self.chunk: Chunk | None = None
        self.next_offset = start
        self.credit = credit
        self.active = True
        #: Its single-active-consumer group (``None``: none), its stream's place in the super
        #: stream the group is over (-1: none, a lone stream's group), and whether it waits
        #: (not its group's active member).
        self.group: str | None = None
        self.partition = -1
        self.waiting = False
        #: The subscription's properties and offset specification as sent; the messages sent
        #: so far, and the first offset of the last chunk sent (RabbitMQ's ``consumed`` and
        #: ``offset``).
        self.properties: dict[str, str] = {}
        self.spec: tuple[Any, ...] = ("next",)
        self.consumed = 0
        self.offset = 0


def _rebalance(stream: StreamQueue, group: str) -> None:
    """Give ``group`` the active member RabbitMQ's coordinator gives it
    (``rabbit_stream_sac_coordinator``): over the partition at place ``p`` of a super stream,
    member ``p mod n`` of the ``n`` members in the order they came; on a lone stream, the active
    member while it stays, then the first to have come. An active member that should no longer
    be is told to step down, and the next one is told it is active only once it answered (or
    left), so that it reads on from where the last stopped."""
    members = stream.stream_groups.get(group)
    if not members:
        stream.stream_groups.pop(group, None)
        return
    asked = [_activating(member) for member in members]
    active = next((m for m, told in zip(members, asked, strict=True) if not m.waiting or told), None)
    if active is not None:
        if members[0].partition >= 0 and active is not _chosen(stream, members):
            active.waiting = True  # (sent nothing more: it answers once it handled what it has)
            active.connection.consumer_update(active, False)
        return
    if False in asked:
        return  # (a member steps down: the next is made active once it answered, or left)
    chosen = _chosen(stream, members)
    chosen.connection.consumer_update(chosen, True)


def _chosen(stream: StreamQueue, members: list[_Subscription]) -> _Subscription:
    """The member a group of ``members`` should have active (see :func:`_rebalance`)."""
    if members[0].partition >= 0:
        return members[members[0].partition % len(members)]
    return members[0]


def _activating(member: _Subscription) -> bool | None:
    """What ``member`` was last asked and has not answered yet: ``True``, to become its group's
    active member; ``False``, to step down; ``None``: nothing."""
    asked = None
    for reader, active in member.connection.pending_updates.values():  # (in the order asked)
        if reader is member:
            asked = active
    return asked


def _leave(reader: _Subscription, rebalance: bool = True) -> None:
    """``reader`` leaves its group (unsubscribed, or its connection gone), and what it was asked
    and did not answer with it: the next member is made active if it was the active one or was
    stepping down (as RabbitMQ's reader does for a subscription gone meanwhile), or the active
    one steps down if the group's change moves the partition (with ``rebalance``)."""
    if reader.group is None:
        return
    members = reader.stream.stream_groups.get(reader.group, [])
    if reader in members:
        members.remove(reader)
        pending = reader.connection.pending_updates
        for correlation in [key for key, (asked, _) in pending.items() if asked is reader]:
            del pending[correlation]
        if rebalance:
            _rebalance(reader.stream, reader.group)


def _start(stream: StreamQueue, offset: tuple[Any, ...]) -> int:
    """The offset a subscription starts at (the chunk holding it is sent whole)."""
    log = stream.log
    first, end = log.first_offset, stream.committed
    kind = offset[0]
    if kind == "first":
        return first
    if kind == "last":
        last = log.locate(end - 1) if end > first else None
        return last.first_offset if last is not None else end
    if kind == "offset":
        return min(max(int(offset[1]), first), end)
    if kind == "timestamp" and first < end:
        chunk = log.locate_time(offset[1] / 1000.0)
        return chunk.first_offset if chunk is not None and chunk.first_offset < end else end
    return end


def _next_chunk(stream: StreamQueue, reader: _Subscription) -> Chunk | None:
    if reader.next_offset >= stream.committed:
        return None
    chunk = stream.log.next_chunk(reader.chunk) if reader.chunk is not None else stream.log.locate(reader.next_offset)
    if chunk is None or chunk.first_offset >= stream.committed:
        return None
    return chunk


_CHUNK_HEAD = struct.Struct(">HHBBBHIqQQIIII")  # frame key, version, subscription; osiris's head
_CHUNK_HEAD_V2 = struct.Struct(">HHBQBBHIqQQIIII")  # the same with the committed chunk id first
_ENTRY = struct.Struct(">I")


def _deliver(
    subscription: int, chunk: Chunk, payload: bytes, committed: int | None = None, trailer: int = 0
) -> list[Any]:
    """A ``deliver`` frame of ``chunk`` (its record ``payload``), as its head and its data (not
    joined: one copy less of a chunk that may be a megabyte; see :func:`_deliver_head` for a
    chunk too large for one): RabbitMQ's chunk format
    (osiris's), each message a simple entry, as AMQP 1.0.

    A chunk of messages published over this protocol (``chunk.raw``) holds them as simple
    entries already, and goes out as it is stored. In a chunk of AMQP 0-9-1's, such a message
    (from before those chunks existed) is ``0 | 0 | header size 0 | body size | body``: from
    its sixth byte on, a simple entry, sliced out as it is. Other messages are converted."""
    if chunk.raw:
        return _deliver_head(subscription, chunk, memoryview(payload)[ENTRIES_AT:], committed, trailer)
    entries = []
    pack, sizes = _ENTRY.pack, _SIZES.unpack_from
    at = ENTRIES_AT
    try:
        for _ in range(chunk.count):
            names_end = at + 1 + payload[at]
            names_end += 1 + payload[names_end]
            header_size, body_size = sizes(payload, names_end)
            end = names_end + 8 + header_size + body_size
            if header_size == 0 and names_end == at + 2:
                entries.append(payload[names_end + 4 : end])
            else:
                header = payload[names_end + 8 : names_end + 8 + header_size]
                message = from_amqp091(payload[at:names_end], header, payload[end - body_size : end])
                entries += (pack(len(message)), message)
            at = end
    except (IndexError, struct.error):
        at = -1
    if at != len(payload):
        raise WALCorruption(f"stream chunk at offset {chunk.first_offset}: its entries do not add up")
    return _deliver_head(subscription, chunk, b"".join(entries), committed, trailer)


def _deliver_head(
    subscription: int, chunk: Chunk, data: bytes | memoryview, committed: int | None = None, trailer: int = 0
) -> list[Any]:
    """The frame head of a ``deliver`` of ``chunk`` holding ``data`` (its entries), and ``data``.

    A chunk of more entries than a chunk head counts (16 bits: one stored before chunks were
    capped at :data:`~broker.core.stream.MAX_CHUNK_ENTRIES`) goes as several ``deliver``
    frames of that many entries each, heads and data in turn, as if stored so."""
    entries = count_entries(data, 0) if chunk.raw == BATCHED else chunk.count
    if entries <= 0xFFFF:
        return [_chunk_head(subscription, chunk, entries, zlib.crc32(data), len(data), committed, trailer), data]
    parts: list[Any] = []
    view, at, first = memoryview(data), 0, chunk.first_offset
    while entries:
        take = min(entries, MAX_CHUNK_ENTRIES)
        cut, messages = split_entries(view[at:], take)
        piece = view[at : at + cut]
        part = replace(chunk, first_offset=first, count=messages)
        parts += (_chunk_head(subscription, part, take, zlib.crc32(piece), cut, committed), piece)
        at, first, entries = at + cut, first + messages, entries - take
    return parts


def _chunk_head(
    subscription: int,
    chunk: Chunk,
    entries: int,
    crc: int,
    size: int,
    committed: int | None = None,
    trailer: int = 0,
) -> bytes:
    """The frame head of a ``deliver`` of ``chunk``: its ``entries`` (simple entries and
    sub-entry batches) are ``size`` bytes whose CRC-32 is ``crc``; its ``trailer`` bytes
    (what its trailer length says; the trailer itself is not sent, as RabbitMQ sends none to
    the stream protocol's subscribers). With ``committed`` (the
    first offset of the stream's newest committed chunk), ``deliver`` version 2 (RabbitMQ 3.11's,
    for a client that asked for it in ``exchange_command_versions``), which carries it."""
    fields = (
        0x50, 0, entries, chunk.count, int(chunk.timestamp * 1000), 1, chunk.first_offset, crc, size, trailer, 0,
    )  # fmt: skip
    if committed is None:
        head = _CHUNK_HEAD.pack(wire.DELIVER, 1, subscription, *fields)
    else:
        head = _CHUNK_HEAD_V2.pack(wire.DELIVER, 2, subscription, committed, *fields)
    return wire.u32(len(head) + size) + head


def _trailer(stream: StreamQueue, chunk: Chunk) -> int:
    """The bytes of ``chunk``'s trailer that RabbitMQ's chunk would have: its publishers' own
    entries (a segment's first chunk also holds the other publishers', marked as a snapshot).

    :raises OSError: the storage failed
    :raises WALCorruption: the trailer does not add up
    """
    if not chunk.trailer or chunk.position != SEGMENT_HEADER_BYTES:
        return chunk.trailer
    tracked = unpack_tracking(stream.log.read_trailer(chunk))
    own = [name.encode("utf-8", "surrogateescape") for kind, name, _ in tracked if kind < TRACKING_SNAPSHOT]
    return sum(10 + len(name) for name in own)


_SIZES = struct.Struct(">II")
#: The layout of a ``publish`` frame's messages when they are all of one size, by their count
#: and size (a producer's frames mostly are): their ids and sizes read by one call (and the
#: messages too, when they are small).
_UNIFORM: dict[tuple[int, int], struct.Struct] = {}
_UNIFORM_MOST = 1024
#: Messages from this size on are copied out of the frame by slices of it, once.
_SLICED = 256


def _published(data: bytes | memoryview, count: int) -> tuple[list[int], bytes, int | None] | None:
    """The publishing ids and the messages of a ``publish`` frame of ``count`` messages, the
    messages as the simple entries of a chunk (each its size, then its bytes: as the frame
    carries it after its id), joined, and the messages' size when they are all of one;
    ``None`` when sub-entry batches are among them.

    :raises wire.Malformed: the frame's messages do not add up
    """
    end = len(data)
    if 0 < count <= _UNIFORM_MOST and end >= 12:
        size = _ID_SIZE.unpack_from(data, 0)[1]
        if end == count * (12 + size) and size < 0x80000000:
            layout = _UNIFORM.get((count, size))
            if layout is None:
                if len(_UNIFORM) >= 64:
                    _UNIFORM.clear()
                shape = f"QI{size}x" if size >= _SLICED else f"QI{size}s"
                layout = _UNIFORM[count, size] = struct.Struct(">" + shape * count)
            values = layout.unpack(data)
            if size >= _SLICED and values[1::2].count(size) == count:
                view = memoryview(data)
                return (
                    list(values[0::2]),
                    b"".join([view[at : at + 4 + size] for at in range(8, end, 12 + size)]),
                    size,
                )
            if size < _SLICED and values[1::3].count(size) == count:
                return list(values[0::3]), wire.u32(size).join((b"", *values[2::3])), size
    ids: list[int] = []
    entries: list[bytes | memoryview] = []
    at = 0
    unpack = _ID_SIZE.unpack_from
    while at < end:
        if end - at < 12:
            raise wire.Malformed("short")
        publishing_id, size = unpack(data, at)
        if size & 0x80000000:
            return None
        stop = at + 12 + size
        if stop > end:
            raise wire.Malformed("short")
        ids.append(publishing_id)
        entries.append(data[at + 8 : stop])
        at = stop
    return ids, b"".join(entries), None


_ID_SIZE = struct.Struct(">QI")


def _published_entries(data: bytes | memoryview) -> tuple[list[int], list[bytes | memoryview], list[int]]:
    """The messages of a ``publish`` frame one by one, sub-entry batches among them, each
    batch one entry (kept as osiris keeps it: its reserved bits cleared). Returns the ids and
    entries taken, and the ids of batches refused: one of no messages, or an uncompressed one
    whose messages do not add up to its count (RabbitMQ takes those, and its AMQP 0-9-1
    readers then fail on them).

    :raises wire.Malformed: the frame's messages do not add up
    """
    ids: list[int] = []
    entries: list[bytes | memoryview] = []
    refused: list[int] = []
    at, end = 0, len(data)
    while at < end:
        if end - at < 12:
            raise wire.Malformed("short")
        publishing_id, size = _ID_SIZE.unpack_from(data, at)
        if size & 0x80000000:
            if end - at < 8 + BATCH_HEAD.size:
                raise wire.Malformed("short")
            flags, records, _uncompressed, length = BATCH_HEAD.unpack_from(data, at + 8)
            stop = at + 8 + BATCH_HEAD.size + length
            entry = bytes((flags & 0xF0,)) + data[at + 9 : stop]
            taken = stop <= end and records > 0 and _holds(entry, records)
        else:
            stop = at + 12 + size
            entry, taken = data[at + 8 : stop], True
        if stop > end:
            raise wire.Malformed("short")
        if taken:
            ids.append(publishing_id)
            entries.append(entry)
        else:
            refused.append(publishing_id)
        at = stop
    return ids, entries, refused


def _holds(entry: bytes, records: int) -> bool:
    """Whether a sub-entry batch holds its ``records`` messages (as far as can be told without
    uncompressing it)."""
    try:
        unpack_batched_messages(entry, 0, records)
    except WALCorruption:
        return False
    return True


def _publish_confirm(publisher: int, ids: list[int]) -> bytes:
    count = len(ids)
    return wire.frame(wire.PUBLISH_CONFIRM, bytes((publisher,)) + struct.pack(f">I{count}Q", count, *ids))


def _publish_error(publisher: int, ids: list[int], code: int) -> bytes:
    errors = b"".join(wire.u64(i) + wire.u16(code) for i in ids)
    return wire.frame(wire.PUBLISH_ERROR, bytes((publisher,)) + wire.u32(len(ids)) + errors)

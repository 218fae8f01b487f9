"""One connection of RabbitMQ's stream protocol (port 5552), sans-IO, as RabbitMQ 3.10.8's
``rabbit_stream_reader`` runs it.

The handshake goes ``peer_properties``, ``sasl_handshake``, ``sasl_authenticate`` (the
server then sends ``tune``), ``tune`` back, ``open``. Each step has one next step: a frame
that leads anywhere else (a step left out, a heartbeat before ``open``, a failed login or
vhost) gets its answer, then the socket is closed without a word, as RabbitMQ closes it.
Once open: streams are created, deleted and described (``metadata``); a command the
connection does not read is answered with ``close`` 13 "unknown frame".

Bytes come in through :meth:`StreamConnection.receive`; what is to be written collects in
:attr:`StreamConnection.out` for the transport to take. The node's login may answer later
(an expensive hash): frames that arrive meanwhile wait.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from broker.core.node import Node
from broker.errors import ChannelException
from broker.wire import streamframes as wire
from broker.wire.codec import decode_table

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
    """

    def __init__(self, node: Node, peer: str, loopback: bool, advertised: tuple[str, int]) -> None:
        self.node = node
        self.peer = peer
        self.loopback = loopback
        self.advertised = advertised
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
        self.client_properties: dict[str, str] = {}
        self.user: Any = None
        self.user_name = ""
        self.vhost: Any = None
        self.frame_max = FRAME_MAX
        self.heartbeat = HEARTBEAT
        #: Whether the client sent anything since the last heartbeat check.
        self.heard = True
        #: The reason the connection ended (for the log), when it was not the client's close.
        self.reason = ""
        #: Called when something was added to :attr:`out` outside :meth:`receive` (a login
        #: answered later).
        self.wake: Callable[[], None] = lambda: None

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
            self.out.append(
                wire.response(wire.PEER_PROPERTIES, correlation, wire.OK, wire.string_map(self._server_properties()))
            )
            after = "peer_properties_exchanged"
        elif name == "sasl_handshake":
            self.out.append(wire.response(wire.SASL_HANDSHAKE, correlation, wire.OK, wire.strings(self._mechanisms())))
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
        offered = self.node.mechanisms(tls=False).split()
        return [m for m in ("PLAIN", "AMQPLAIN") if m in offered]  # (in RabbitMQ's registry order)

    def _authenticate(self, correlation: int, mechanism: str, response: bytes) -> None:
        if mechanism not in self._mechanisms():
            self.out.append(wire.response(wire.SASL_AUTHENTICATE, correlation, wire.SASL_MECHANISM_NOT_SUPPORTED))
            self._step(self.step, "failure")
            return
        parts = response.split(b"\x00")
        if mechanism != "PLAIN" or len(parts) != 3:
            # RabbitMQ's PLAIN answers a response without two NULs as a protocol error;
            # AMQPLAIN's table is read as the AMQP listener reads it.
            credentials = _amqplain(response) if mechanism == "AMQPLAIN" else None
            if credentials is None:
                self.out.append(wire.response(wire.SASL_AUTHENTICATE, correlation, wire.SASL_ERROR))
                self._step(self.step, "failure")
                return
            username, password = credentials
        else:
            username, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
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
            self.out.append(wire.response(wire.SASL_AUTHENTICATE, correlation, code))
            self.reason = f"login refused for user '{username}': {reason}"
            self._step(before, "failure")
        else:
            self.user, self.user_name = user, user.name
            self.out.append(wire.response(wire.SASL_AUTHENTICATE, correlation, wire.OK))
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
            self.out.append(wire.response(wire.OPEN, correlation, wire.VHOST_ACCESS_FAILURE))
            self.reason = f"access to vhost '{vhost_name}' refused for user '{self.user_name}'"
            return "failure"
        self.vhost = vhost
        host, port = self.advertised
        properties = {"advertised_host": host, "advertised_port": str(port)}
        self.out.append(wire.response(wire.OPEN, correlation, wire.OK, wire.string_map(properties)))
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
        elif name == "close":
            self.out.append(wire.response(wire.CLOSE, correlation, wire.OK))
            self.step = "closing"
        else:
            self.out.append(wire.close(1, wire.UNKNOWN_FRAME, "unknown frame"))
            self.step = "close_sent"

    def _after_close(self, command: tuple[Any, ...]) -> None:
        """After our ``close``: the client's answer ends the connection; after theirs, nothing
        more is read (RabbitMQ ignores what follows)."""
        if self.step == "close_sent" and command[0] == "response" and command[2] == wire.CLOSE:
            self.finished = True

    def _permitted(self, what: str, name: str) -> bool:
        """Whether the user has ``what`` on queue ``name`` now (permissions change live)."""
        user = self.node.users_by_name.get(self.user_name)
        if user is None or not user.may_open(self.vhost.name):
            return False
        access = user.access(self.vhost.name)
        try:
            if access is not None:
                access.check(what, "queue", name)
        except ChannelException:
            return False
        return True

    def _create(self, correlation: int, name: str, arguments: dict[str, str]) -> None:
        name = name.replace("\n", "").replace("\r", "")
        if not name or name.startswith("amq."):
            self.out.append(wire.response(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED))
            return
        if not self._permitted("configure", name):
            self.out.append(wire.response(wire.CREATE_STREAM, correlation, wire.ACCESS_REFUSED))
            return
        declared: dict[str, Any] = {"x-queue-type": "stream"}
        try:
            for key, value in arguments.items():
                if key in CREATE_ARGUMENTS:
                    argument, kind = CREATE_ARGUMENTS[key]
                    declared[argument] = int(value) if kind is int else value
        except ValueError:
            self.out.append(wire.response(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED))
            return
        vhost = self.vhost
        if name in vhost.queues:
            self.out.append(wire.response(wire.CREATE_STREAM, correlation, wire.STREAM_ALREADY_EXISTS))
            return
        try:
            vhost.declare_queue(name, self, durable=True, arguments=declared)
        except ChannelException:
            self.out.append(wire.response(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED))
            return
        self.out.append(wire.response(wire.CREATE_STREAM, correlation, wire.OK))

    def _delete(self, correlation: int, name: str) -> None:
        if not self._permitted("configure", name):
            self.out.append(wire.response(wire.DELETE_STREAM, correlation, wire.ACCESS_REFUSED))
            return
        queue = self.vhost.queues.get(name)
        if queue is None or queue.kind != "stream":
            self.out.append(wire.response(wire.DELETE_STREAM, correlation, wire.STREAM_DOES_NOT_EXIST))
            return
        self.vhost.remove_queue(queue)
        self.out.append(wire.response(wire.DELETE_STREAM, correlation, wire.OK))

    def _metadata(self, correlation: int, names: list[str]) -> None:
        host, port = self.advertised
        streams = []
        found = False
        # (RabbitMQ folds a map of the names: each once, the last in byte order first)
        for name in sorted(set(names), key=lambda n: n.encode("utf-8", "surrogateescape"), reverse=True):
            queue = self.vhost.queues.get(name)
            if queue is None or queue.kind != "stream":
                streams.append((name, wire.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
            else:
                found = True
                streams.append((name, wire.OK, 0, []))
        brokers = [(0, host, port)] if found else []
        self.out.append(wire.metadata_response(correlation, brokers, streams))

    # -- the end ----------------------------------------------------------------------------------

    def connection_lost(self) -> None:
        """The socket closed: the connection is gone from the node."""
        self.finished = True
        self.node.stream_connections.discard(self)


def _amqplain(response: bytes) -> tuple[str, str] | None:
    """The LOGIN and PASSWORD of an AMQPLAIN response (a field table without its length)."""
    try:
        table = decode_table(response)
    except (ValueError, struct.error, IndexError):
        return None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if login is None or password is None:
        return None
    as_text = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in (login, password)]
    return as_text[0], as_text[1]

"""A stream-protocol connection's handshake and its end, as RabbitMQ 3.10.8's
``rabbit_stream_reader`` runs them.

The handshake goes ``peer_properties``, ``sasl_handshake``, ``sasl_authenticate`` (the
server then sends ``tune``), ``tune`` back, ``open``. Each step has one next step
(:data:`NEXT`): a frame that leads anywhere else (a step left out, a heartbeat before
``open``, a failed login or vhost) gets its answer, then the socket is closed without a word,
as RabbitMQ closes it. Once open, the client's ``close`` is answered and the socket closed; a
command the connection does not read is answered with ``close`` 13 "unknown frame", and the
client's answer to it closes the socket. Heartbeats themselves are the shell's
(``broker.server.streamprotocol``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from postroom.broker.core.login import sasl_credentials
from postroom.broker.core.users import User
from postroom.broker.streams.session import Session
from postroom.broker.wire import streamframes as wire

if TYPE_CHECKING:
    from postroom.broker.core.vhost import VirtualHost

#: The frame size and heartbeat (seconds) the server offers in ``tune`` (RabbitMQ's defaults).
FRAME_MAX = 1_048_576
HEARTBEAT = 60


class Step(Enum):
    """Where a connection is: RabbitMQ's steps of the handshake (its ``connection_step``), and
    once open, its ends."""

    TCP_CONNECTED = "tcp_connected"
    PEER_PROPERTIES_EXCHANGED = "peer_properties_exchanged"
    AUTHENTICATING = "authenticating"
    AUTHENTICATED = "authenticated"
    TUNING = "tuning"
    TUNED = "tuned"
    OPENED = "opened"
    #: We sent ``close`` (an unknown command): the client's answer ends the connection.
    CLOSE_SENT = "close_sent"
    #: The client's ``close`` was answered: nothing more is read.
    CLOSING = "closing"
    #: Where a frame out of order leads: no connection is ever there (it ends).
    FAILURE = "failure"


#: The step each step of the handshake must lead to (RabbitMQ's state functions).
NEXT: dict[Step, tuple[Step, ...]] = {
    Step.TCP_CONNECTED: (Step.PEER_PROPERTIES_EXCHANGED,),
    Step.PEER_PROPERTIES_EXCHANGED: (Step.AUTHENTICATING,),
    Step.AUTHENTICATING: (Step.AUTHENTICATED,),
    Step.TUNING: (Step.TUNED, Step.OPENED),
    Step.TUNED: (Step.OPENED,),
}

#: The steps past the handshake (the shell's step timer does not run there).
HANDSHAKE_DONE = frozenset({Step.OPENED, Step.CLOSE_SENT, Step.CLOSING})


class Greeted(Session, Protocol):
    """The connection as its handshake sees it (``broker.streams.connection.StreamConnection``):
    who is there, what was agreed, and where it is."""

    #: The client's address, whether it is a loopback one, and over TLS what names its
    #: certificate (``EXTERNAL``).
    peer: str
    loopback: bool
    certificate_name: Callable[[], str | None] | None
    step: Step
    #: A login is being checked: frames wait until it is.
    waiting: bool
    user: User | None
    user_name: str
    vhost: VirtualHost | None
    frame_max: int
    heartbeat: int
    client_properties: dict[str, str]
    auth_mechanism: str

    def act_on_held(self) -> None:
        """The login was checked: act on what arrived meanwhile."""


class Handshake:
    """The steps of ``connection`` up to ``open`` and after ``close`` (see the module's
    docstring): it sets what the client said of itself, its login, tuning and vhost."""

    def __init__(self, connection: Greeted) -> None:
        self.connection = connection

    def receive(self, command: wire.Command) -> None:
        """A command before the connection is open."""
        connection = self.connection
        before = connection.step
        match command:
            case wire.PeerProperties(correlation, properties):
                connection.client_properties = properties
                extra = wire.string_map(self._server_properties())
                connection.answer(wire.PEER_PROPERTIES, correlation, wire.OK, extra)
                after = Step.PEER_PROPERTIES_EXCHANGED
            case wire.SaslHandshake(correlation):
                connection.answer(wire.SASL_HANDSHAKE, correlation, wire.OK, wire.strings(self.mechanisms()))
                after = Step.AUTHENTICATING
            case wire.SaslAuthenticate():
                self._authenticate(command)
                return  # (it goes on in _login_done, now or later)
            case wire.Tune(frame_max, heartbeat):
                connection.frame_max, connection.heartbeat = frame_max, heartbeat
                after = Step.TUNED
            case wire.Open(correlation, vhost):
                after = self._open(correlation, vhost)
            case wire.Heartbeat():
                after = before
            case _:  # anything else before the connection is open
                after = Step.FAILURE
        self._move(before, after)

    def _move(self, before: Step, after: Step) -> None:
        connection = self.connection
        if after not in NEXT.get(before, ()):
            connection.reason = connection.reason or f"invalid transition from {before.value} to {after.value}"
            connection.finished = True
            return
        connection.step = after

    def _server_properties(self) -> dict[str, str]:
        node = self.connection.node
        return {
            "cluster_name": node.admin.cluster_name or "postroom",
            "copyright": "Postroom authors",
            "information": "Postroom: an AMQP 0-9-1 routing broker, with RabbitMQ's stream protocol",
            "platform": "Python/Twisted",
            "product": node.product,
            "version": node.version,
        }

    def mechanisms(self) -> list[str]:
        """The mechanisms offered here (``EXTERNAL`` over TLS only), in the order RabbitMQ
        lists them: its registry's, which is PLAIN before AMQPLAIN, unless the plugin that
        brings EXTERNAL is in it too."""
        node = self.connection.node
        offered = node.mechanisms(tls=self.connection.certificate_name is not None).split()
        order = ("AMQPLAIN", "PLAIN", "EXTERNAL") if "EXTERNAL" in node.auth_mechanisms else ("PLAIN", "AMQPLAIN")
        return [mechanism for mechanism in order if mechanism in offered]

    def _authenticate(self, command: wire.SaslAuthenticate) -> None:
        connection = self.connection
        correlation, mechanism = command.correlation, command.mechanism
        if mechanism not in self.mechanisms():
            connection.answer(wire.SASL_AUTHENTICATE, correlation, wire.SASL_MECHANISM_NOT_SUPPORTED)
            self._move(connection.step, Step.FAILURE)
            return
        connection.auth_mechanism = mechanism
        password: str | None = None
        if mechanism == "EXTERNAL":
            # The user named by the verified client certificate's common name, with no
            # password (RabbitMQ's rabbitmq_auth_mechanism_ssl, ssl_cert_login_from = common_name).
            assert connection.certificate_name is not None  # (offered over TLS only)
            username = connection.certificate_name()
            if not username:
                connection.answer(wire.SASL_AUTHENTICATE, correlation, wire.AUTHENTICATION_FAILURE)
                connection.reason = "EXTERNAL: " + ("no name found" if username == "" else "no client certificate")
                self._move(connection.step, Step.FAILURE)
                return
        else:
            credentials = sasl_credentials(mechanism, command.response)
            if credentials is None or None in credentials:
                # RabbitMQ answers a response that does not parse (or an AMQPLAIN table
                # without LOGIN or PASSWORD) as a SASL error.
                connection.answer(wire.SASL_AUTHENTICATE, correlation, wire.SASL_ERROR)
                self._move(connection.step, Step.FAILURE)
                return
            username, password = credentials[0] or "", credentials[1] or ""
        connection.waiting = True
        connection.node.login(
            username,
            password,
            connection.loopback,
            connection.peer.rpartition(":")[0],
            lambda user, reason: self._login_done(correlation, username, user, reason),
        )

    def _login_done(self, correlation: int, username: str, user: User | None, reason: str) -> None:
        connection = self.connection
        connection.waiting = False
        if connection.finished:
            return
        before = connection.step
        if user is None:
            loopback_only = reason.endswith("can only connect via localhost")
            code = wire.SASL_AUTHENTICATION_FAILURE_LOOPBACK if loopback_only else wire.AUTHENTICATION_FAILURE
            connection.answer(wire.SASL_AUTHENTICATE, correlation, code)
            connection.reason = f"login refused for user '{username}': {reason}"
            self._move(before, Step.FAILURE)
        else:
            connection.user, connection.user_name = user, user.name
            connection.answer(wire.SASL_AUTHENTICATE, correlation, wire.OK)
            connection.out.append(wire.tune(FRAME_MAX, HEARTBEAT))
            self._move(before, Step.AUTHENTICATED)
            if connection.step is Step.AUTHENTICATED:
                connection.step = Step.TUNING
        connection.act_on_held()
        connection.wake()

    def _open(self, correlation: int, vhost_name: str) -> Step:
        connection = self.connection
        node, user = connection.node, connection.user
        vhost = node.vhosts.get(vhost_name)
        if user is None or vhost is None or not user.may_open(vhost_name):
            connection.answer(wire.OPEN, correlation, wire.VHOST_ACCESS_FAILURE)
            connection.reason = f"access to vhost '{vhost_name}' refused for user '{connection.user_name}'"
            return Step.FAILURE
        connection.vhost = vhost
        host, port = connection.advertised
        properties = {"advertised_host": host, "advertised_port": str(port)}
        connection.answer(wire.OPEN, correlation, wire.OK, wire.string_map(properties))
        node.stream_connections.add(connection)
        return Step.OPENED

    def close(self, command: wire.Close) -> None:
        """The client's ``close``, once open: answered, then the socket is closed (as RabbitMQ
        closes it once it answered)."""
        connection = self.connection
        connection.answer(wire.CLOSE, command.correlation, wire.OK)
        connection.step = Step.CLOSING
        connection.finished = True

    def unknown(self) -> None:
        """A command the open connection does not read: ``close`` 13 "unknown frame"."""
        connection = self.connection
        connection.count_error(wire.UNKNOWN_FRAME)
        connection.out.append(wire.close(1, wire.UNKNOWN_FRAME, "unknown frame"))
        connection.step = Step.CLOSE_SENT

    def after_close(self, command: wire.Command) -> None:
        """After our ``close``: the client's answer ends the connection; after theirs, nothing
        more is read (RabbitMQ ignores what follows)."""
        if self.connection.step is Step.CLOSE_SENT and command == wire.Response(wire.CLOSE):
            self.connection.finished = True

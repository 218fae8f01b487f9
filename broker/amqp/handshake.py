"""A connection's handshake, as RabbitMQ 3.10's reader runs it: ``connection.start``, the
login (``start-ok``, checked now or later for an expensive hash), ``tune``/``tune-ok`` and
``connection.open`` with its limits and the user's access to the vhost.

Functions of the connection (:class:`broker.amqp.connection.ServerConnection`, seen as a
:class:`~broker.amqp.seams.Link`), which calls them for the methods of channel 0 before it is
open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.constants import FRAME_MIN_SIZE

from postroom.broker.amqp.seams import State
from postroom.broker.core.login import sasl_credentials
from postroom.broker.errors import ConnectionException, ReplyCode
from postroom.broker.wire.codec import encode_method

if TYPE_CHECKING:
    from postroom.broker.amqp.seams import Link


#: Capabilities announced in connection.start, as RabbitMQ names them.
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


#: Mechanisms RabbitMQ always has, offered or not: asking for one it does not offer gets
#: "invalid authentication mechanism", one it lacks "unknown authentication mechanism".
KNOWN_MECHANISMS = frozenset({"PLAIN", "AMQPLAIN", "RABBIT-CR-DEMO"})


def start(connection: Link) -> None:
    """Send ``connection.start`` (once the protocol header came): properties, mechanisms, locale."""
    connection.state = State.AWAIT_START_OK
    node = connection.node
    connection.out.append(
        encode_method(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties={  # in RabbitMQ's order
                    "capabilities": dict(CAPABILITIES),
                    "cluster_name": "postroom",
                    "copyright": "Postroom authors",
                    "information": "Postroom: an AMQP 0-9-1 routing broker",
                    "platform": "Python/Twisted",
                    "product": node.product,
                    "version": node.version,
                },
                mechanisms=node.mechanisms(tls=connection.certificate_name is not None),
                locales="en_US",
            ),
        )
    )


def credentials(method: commands.Connection.StartOk) -> tuple[str, str]:
    """The user name and password in a ``PLAIN`` or ``AMQPLAIN`` response."""
    response = method.response
    raw = response if isinstance(response, bytes) else response.encode("utf-8", "surrogateescape")
    found = sasl_credentials(method.mechanism, raw)
    if found is None:
        raise ConnectionException(ReplyCode.ACCESS_REFUSED, f"malformed {method.mechanism} response")
    login, password = found
    return login or "", password or ""


def start_ok(connection: Link, method: commands.Connection.StartOk) -> None:
    """``start-ok``: the mechanism offered, the credentials it carries, and the login asked of the node."""
    connection.client_properties = method.client_properties or {}
    capabilities = connection.client_properties.get("capabilities")
    connection.capabilities = capabilities if isinstance(capabilities, dict) else {}
    mechanism = method.mechanism
    if mechanism not in connection.node.mechanisms(tls=connection.certificate_name is not None).split():
        # RabbitMQ tells a mechanism it has but does not offer here from one it lacks.
        known = mechanism in KNOWN_MECHANISMS or mechanism in connection.node.auth_mechanisms
        raise ConnectionException(
            ReplyCode.COMMAND_INVALID,
            f"{'invalid' if known else 'unknown'} authentication mechanism '{mechanism}'",
            10,
            11,
        )
    if mechanism == "EXTERNAL":
        # The user named in the verified client certificate; no password (RabbitMQ's
        # rabbitmq_auth_mechanism_ssl with ssl_cert_login_from = common_name).
        assert connection.certificate_name is not None
        username, password = connection.certificate_name(), None
        if not username:
            reason = "no name found" if username == "" else "connection peer presented no TLS (x.509) certificate"
            login_done(connection, mechanism, None, reason)
            return
    else:
        username, password = credentials(method)
    connection.state = State.AUTHENTICATING
    connection.node.login(
        username,
        password,
        connection.loopback,
        connection.peer.rpartition(":")[0],
        lambda user, reason: login_done(connection, mechanism, user, reason),
    )


def login_done(connection: Link, mechanism: str, user: Any, reason: str) -> None:
    """The login was checked (now, or later for an expensive hash): go on to tune, or
    refuse it, then act on what the client sent meanwhile."""
    if connection.closed:
        return
    connection.node.mark_dirty(connection)
    connection.state = State.AWAIT_START_OK
    if user is None:
        error = ConnectionException(
            ReplyCode.ACCESS_REFUSED,
            f"Login was refused using authentication mechanism {mechanism}. For details see the broker logfile.",
            10,
            11,
        )
        if connection.capabilities.get("authentication_failure_close"):
            connection.fail(error)
        else:
            connection.finish()
        # The log gets the reason; the client only the text above (RabbitMQ's split).
        connection.error = ConnectionException(ReplyCode.ACCESS_REFUSED, f"{mechanism} login refused: {reason}")
        return
    connection.user_name = user.name
    connection.user = user
    connection.auth_mechanism = mechanism
    connection.state = State.AWAIT_TUNE_OK
    connection.out.append(
        encode_method(
            0,
            commands.Connection.Tune(
                channel_max=connection.channel_max,
                frame_max=connection.frame_max,
                heartbeat=connection.node.limits.heartbeat,
            ),
        )
    )
    if connection.pending:
        connection.receive_data(b"")


def tune_ok(connection: Link, method: commands.Connection.TuneOk) -> None:
    """``tune-ok``: take the client's ``frame_max``, ``channel_max`` and heartbeat, within the limits."""
    limits = connection.node.limits
    negotiated("frame_max", method.frame_max, FRAME_MIN_SIZE, limits.frame_max)
    negotiated("channel_max", method.channel_max, 1, limits.channel_max)
    # 0 passes the checks only where the server sets no limit either.
    connection.frame_max = method.frame_max or limits.frame_max
    connection.channel_max = method.channel_max or limits.channel_max
    connection.heartbeat = method.heartbeat
    connection.state = State.AWAIT_OPEN


def open_vhost(connection: Link, method: commands.Connection.Open) -> None:
    """``connection.open``, checked in RabbitMQ's order: the vhost exists and is under its
    connection limit (the node under its own first: ``limits.max_connections``, or the open
    file limit), the user under theirs, then the user's access to the vhost."""
    node, user = connection.node, connection.user
    vhost = node.vhosts.get(method.virtual_host)
    if vhost is None:
        raise ConnectionException(ReplyCode.NOT_ALLOWED, f"vhost {method.virtual_host} not found", 10, 40)
    reached = node.connection_limit_reached()
    if reached is not None:
        raise ConnectionException(ReplyCode.NOT_ALLOWED, f"connection refused: {reached}", 10, 40)
    limit = vhost.max_connections
    if limit is not None and 0 <= limit <= vhost.connection_count:  # (a negative limit is none, as in RabbitMQ)
        raise ConnectionException(
            ReplyCode.NOT_ALLOWED,
            f"access to vhost '{vhost.name}' refused for user '{connection.user_name}': "
            f"connection limit ({limit}) is reached",
            10,
            40,
        )
    own = node.user_connections.get(user.name)
    if user.max_connections is not None and 0 <= user.max_connections <= len(own or ()):
        raise ConnectionException(
            ReplyCode.NOT_ALLOWED,
            f"connection refused for user '{connection.user_name}': user connection limit ({user.max_connections}) "
            "is reached",
            10,
            40,
        )
    if not user.may_open(vhost.name):
        raise ConnectionException(
            ReplyCode.NOT_ALLOWED,
            f"access to vhost '{vhost.name}' refused for user '{connection.user_name}'",
            10,
            40,
        )
    connection.vhost = vhost
    connection.access = user.access(vhost.name)
    connection.state = State.OPEN
    node.connections.add(connection)
    vhost.connection_count += 1
    node.user_connections.setdefault(user.name, set()).add(connection)
    node.counters["connections_opened"] += 1
    connection.out.append(encode_method(0, commands.Connection.OpenOk()))


def negotiated(field: str, value: int, minimum: int, maximum: int) -> None:
    """RabbitMQ's check of a ``tune-ok`` value: 0 means "no limit", above any server maximum.

    :raises ConnectionException: 530 NOT_ALLOWED, as RabbitMQ words it
    """
    if value != 0 and value < minimum:
        raise ConnectionException(
            ReplyCode.NOT_ALLOWED,
            f"negotiated {field} = {value} is lower than the minimum allowed value ({minimum})",
            10,
            31,
        )
    if maximum != 0 and (value == 0 or value > maximum):
        detail = " (no limit)" if field == "channel_max" and value == 0 else ""
        raise ConnectionException(
            ReplyCode.NOT_ALLOWED,
            f"negotiated {field} = {value}{detail} is higher than the maximum allowed value ({maximum})",
            10,
            31,
        )

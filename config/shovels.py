"""Dynamic shovels' definitions, as RabbitMQ's ``shovel`` runtime parameters (protocol
``amqp091``) are written and checked: :func:`validate` gives RabbitMQ's messages refusing one,
in RabbitMQ's order, and :func:`parse` turns one into a :class:`ShovelSpec` with RabbitMQ's
defaults filled in. The YAML's ``shovels:``, a definitions import and the management API
check them here.

What a shovel does with its definition (connect, consume, publish, acknowledge) is
``broker.server.shovels``; the definitions are kept with the node's other runtime parameters
(``broker.core.admin``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

#: The runtime parameters' component of shovels.
COMPONENT = "shovel"
#: RabbitMQ's defaults: messages a shovel may hold unacknowledged, and seconds between a
#: failure and the next start.
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp10", "amqp091")

#: Queue arguments a shovel may declare a queue with, and consumer arguments it may consume
#: with (RabbitMQ 3.10's ``declare_args`` and ``consume_args``).
QUEUE_ARGUMENTS = (
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-max-priority",
    "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer", "x-queue-type",
    "x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
    "x-queue-leader-locator",
)  # fmt: skip
CONSUMER_ARGUMENTS = ("x-priority", "x-cancel-on-ha-failover", "x-stream-offset")
#: Postroom's own consumer argument a shovel may also consume with: from a Postroom queue, each
#: message comes with its remaining TTL as its ``expiration`` (``postroom migrate`` asks for it).
REMAINING_TTL = "x-remaining-ttl"
#: The properties ``dest-publish-properties`` may set, and which of them are numbers.
PUBLISH_PROPERTIES = (
    "content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to", "expiration",
    "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id",
)  # fmt: skip
NUMERIC_PROPERTIES = ("delivery_mode", "priority", "timestamp")
#: Query keys an ``amqp://`` URI may carry, and those an ``amqps://`` one may carry besides.
URI_QUERY = ("heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism")
TLS_QUERY = (
    "cacertfile", "certfile", "keyfile", "verify", "fail_if_no_peer_cert", "password", "server_name_indication",
    "depth",
)  # fmt: skip


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ's messages print it (``~p``): a string is a binary, an object
    a map, ``null`` the atom ``null``."""
    if isinstance(value, str):
        text = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{text}"/utf8>>' if not text.isascii() else f'<<"{text}">>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(item) for item in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items())
        return "#{" + ",".join(f"{erlang_term(key)} => {erlang_term(item)}" for key, item in items) + "}"
    return str(value)


def _string(text: str) -> str:
    """A string as Erlang prints a list of characters."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ShovelInvalid(ValueError):
    """A shovel's definition refused: RabbitMQ's messages, in its order."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a shovel connects: one of a definition's URIs, parsed.

    ``host`` ``None``: the node itself (RabbitMQ's ``amqp://``, a direct connection).
    """

    uri: str
    tls: bool
    host: str | None
    port: int
    vhost: str
    user: str
    password: str
    query: dict[str, str]

    @property
    def shown(self) -> str:
        """The URI without credentials or query, as RabbitMQ shows it in a shovel's status."""
        if self.host is None:
            return "amqp://" + (self.uri.split("://", 1)[1].split("?", 1)[0] if "://" in self.uri else "")
        parts = urlsplit(self.uri)
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return f"{parts.scheme}://{netloc}{parts.path}"


class UriError(ValueError):
    """A URI RabbitMQ's parser refuses: the Erlang term of its reason."""


def parse_uri(uri: str, default_vhost: str = "/") -> Endpoint:
    """An ``amqp://`` or ``amqps://`` URI as RabbitMQ's ``amqp_uri:parse`` reads it."""
    scheme, separator, rest = uri.partition("://")
    if not separator:
        raise UriError("{unable_to_parse_uri,no_scheme}")
    scheme = scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise UriError(f"{{unexpected_uri_scheme,{_string(scheme)}}}")
    tls = scheme == "amqps"
    authority, slash, path_query = rest.partition("/")
    if not slash and "?" in authority:
        authority, _mark, query_text = authority.partition("?")
        path = None
    else:
        path_text, _mark, query_text = path_query.partition("?")
        path = path_text if slash else None
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        userinfo, hostport = "", authority
    host, colon, port_text = hostport.rpartition(":") if not hostport.startswith("[") else hostport.partition("]:")
    if not colon:
        host, port_text = hostport, ""
    host = host.strip("[]")
    port: int | None = None
    if port_text:
        if not port_text.isdigit():
            raise UriError("{unable_to_parse_uri,{invalid_port," + _string(port_text) + "}}")
        port = int(port_text)
        if not 0 < port <= 65535:
            raise UriError(f"{{port_out_of_range,{port}}}")
    if path is None:
        vhost = default_vhost
    elif "/" in path:
        raise UriError(f"{{invalid_vhost,{_string(path)}}}")
    else:
        vhost = unquote(path)
    if not host and port is not None:
        raise UriError("port_requires_host")
    user, _colon, password = userinfo.partition(":")
    query: dict[str, str] = {}
    for pair in filter(None, query_text.split("&")):
        key, _equals, value = pair.partition("=")
        query[unquote(key)] = unquote(value)
    return Endpoint(
        uri=uri,
        tls=tls,
        host=host or None,
        port=port or (5671 if tls else 5672),
        vhost=vhost,
        user=unquote(user) if userinfo else "guest",
        password=unquote(password) if userinfo and _colon else "guest",
        query=query,
    )


@dataclass(frozen=True, slots=True)
class ShovelSpec:
    """One dynamic shovel's definition, with RabbitMQ's defaults filled in."""

    vhost: str
    name: str
    #: The value as it was set (listed, exported and compared as it is).
    value: Mapping[str, Any]
    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_queue_args: Mapping[str, Any] = field(default_factory=dict)
    src_consumer_args: Mapping[str, Any] = field(default_factory=dict)
    prefetch: int = DEFAULT_PREFETCH
    #: ``"never"``, ``"queue-length"`` or a number of messages.
    delete_after: str | int = "never"
    ack_mode: str = "on-confirm"
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: Mapping[str, Any] = field(default_factory=dict)
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: Mapping[str, Any] = field(default_factory=dict)
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY


Check = Callable[[str, Any], "str | list[str] | None"]


def _number(key: str, value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None
    return f"{key} should be a number, actually was {erlang_term(value)}"


def _binary(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erlang_term(value)}"


def _boolean(key: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erlang_term(value)}"


def _queue_name(key: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{key} should be binary, actually was {erlang_term(value)}"
    size = len(value.encode())
    return None if size <= 255 else f"{key} should be less than 255 bytes, actually was {size}"


def _enum(options: tuple[str, ...]) -> Check:
    def check(key: str, value: Any) -> str | None:
        if not isinstance(value, str):
            return f"{key} should be binary, actually was {erlang_term(value)}"
        if value in options:
            return None
        return f"{key} should be one of {erlang_term(list(options))}, actually was {erlang_term(value)}"

    return check


def _delete_after(key: str, value: Any) -> str | None:
    if value in ("never", "queue-length") or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return (
        f'{key} should be a number greater than or equal to 0, "never" or "queue-length", actually was '
        f"{erlang_term(value)}"
    )


#: The user a definition is set by, and whether it may open a vhost: a URI naming the node
#: itself (``amqp://``, no host) must name a vhost that user may open, as RabbitMQ checks.
Acting = tuple[str, Callable[[str], bool]]


def _uri_check(acting: Acting | None) -> Check:
    def check(key: str, value: Any) -> str | None:
        if isinstance(value, str):
            try:
                endpoint = parse_uri(value)
            except UriError as error:
                return f'"{value}" not a valid URI: {{{error},{_string(value)}}}'
            if endpoint.host is None and acting is not None and not acting[1](endpoint.vhost):
                return f'user "{acting[0]}" may not connect to vhost "{endpoint.vhost}"'
            return None
        if not isinstance(value, list):
            return f"{key} should be list, actually was {erlang_term(value)}"
        for uri in value:
            problem = check(key, uri)
            if problem is not None:
                return problem
        return None

    return check


def _keys_of(allowed: tuple[str, ...], checks: dict[str, Check] | None = None) -> Check:
    """A table whose keys must be ``allowed`` (values checked by ``checks`` where given)."""

    def check(key: str, value: Any) -> list[str] | str | None:
        if not isinstance(value, dict):
            return f"{key} not a list {erlang_term(value)}"
        constraints = [(name, (checks or {}).get(name), False) for name in allowed]
        return _proplist(key, constraints, value)

    return check


_PROPERTY_CHECKS: dict[str, Check] = {
    name: (_number if name in NUMERIC_PROPERTIES else _binary) for name in PUBLISH_PROPERTIES
}


def _constraints(acting: Acting | None) -> list[tuple[str, Check | None, bool]]:
    """Each key a definition may hold, its check, and whether it must be there, in RabbitMQ's
    order (its messages come in the reverse of this order)."""
    uri = _uri_check(acting)
    return [
        ("reconnect-delay", _number, False),
        ("ack-mode", _enum(ACK_MODES), False),
        ("src-protocol", _enum(PROTOCOLS), False),
        ("dest-protocol", _enum(PROTOCOLS), False),
        ("src-uri", uri, True),
        ("src-exchange", _binary, False),
        ("src-exchange-key", _binary, False),
        ("src-queue", _binary, False),
        ("src-queue-args", _keys_of(QUEUE_ARGUMENTS), False),
        ("src-consumer-args", _keys_of((*CONSUMER_ARGUMENTS, REMAINING_TTL), {REMAINING_TTL: _boolean}), False),
        ("prefetch-count", _number, False),
        ("src-prefetch-count", _number, False),
        ("delete-after", _delete_after, False),
        ("src-delete-after", _delete_after, False),
        ("dest-uri", uri, True),
        ("dest-exchange", _binary, False),
        ("dest-exchange-key", _binary, False),
        ("dest-queue", _queue_name, False),
        ("dest-queue-args", _keys_of(QUEUE_ARGUMENTS), False),
        ("add-forward-headers", _boolean, False),
        ("add-timestamp-header", _boolean, False),
        ("dest-add-forward-headers", _boolean, False),
        ("dest-add-timestamp-header", _boolean, False),
        ("publish-properties", _keys_of(PUBLISH_PROPERTIES, _PROPERTY_CHECKS), False),
        ("dest-publish-properties", _keys_of(PUBLISH_PROPERTIES, _PROPERTY_CHECKS), False),
    ]


def _proplist(name: str, constraints: list[tuple[str, Check | None, bool]], value: Mapping[str, Any]) -> list[str]:
    """RabbitMQ's ``rabbit_parameter_validation:proplist``: each key checked, the messages in
    reverse order, those of keys no constraint names first."""
    results: list[str] = []
    left = dict(value)
    for key, check, mandatory in constraints:
        if key in left:
            item = left.pop(key)
            problem = check(key, item) if check is not None else None
            if isinstance(problem, list):
                results[:0] = problem
            elif problem is not None:
                results.insert(0, problem)
        elif mandatory:
            results.insert(0, f'Key "{key}" not found in {name}')
    if left:
        terms = ",".join(f"{{{erlang_term(key)},{erlang_term(item)}}}" for key, item in sorted(left.items()))
        results.insert(0, f"Unrecognised terms [{terms}] in {name}")
    return results


def _given(value: Mapping[str, Any], key: str) -> bool:
    return value.get(key) is not None


def validate(name: str, value: Any, acting: Acting | None = None) -> list[str]:
    """RabbitMQ's messages refusing a shovel's definition, in its order; none: it is valid.

    :param acting: who sets it (through the API; ``None``: the configuration or an import,
        where RabbitMQ checks no user either)
    """
    if not isinstance(value, dict):
        return [f"{name} not a list {erlang_term(value)}"]
    problems: list[str] = []
    if not _given(value, "src-exchange") and not _given(value, "src-queue"):
        problems.append("Must specify 'src-exchange' or 'src-queue'")
    elif _given(value, "src-exchange") and _given(value, "src-queue"):
        problems.append("Cannot specify 'src-exchange' and 'src-queue'")
    delete_after = value.get("src-delete-after", value.get("delete-after"))
    if isinstance(delete_after, int) and not isinstance(delete_after, bool) and value.get("ack-mode") == "no-ack":
        problems.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if _given(value, "dest-exchange") and _given(value, "dest-queue"):
        problems.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    problems += _proplist(name, _constraints(acting), value)
    for key in ("src-protocol", "dest-protocol"):
        if value.get(key) == "amqp10":
            problems.append(f"{key} amqp10 is not supported by Postroom's shovels (amqp091 only)")
    return problems


def _uris(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def parse(vhost: str, name: str, value: Any) -> ShovelSpec:
    """A shovel's definition, checked as RabbitMQ checks it.

    :raises ShovelInvalid: with RabbitMQ's messages
    """
    problems = validate(name, value)
    if problems:
        raise ShovelInvalid(problems)

    def either(new: str, legacy: str, default: Any) -> Any:
        found = value.get(new, value.get(legacy))
        return default if found is None else found

    return ShovelSpec(
        vhost=vhost,
        name=name,
        value=value,
        src_uris=_uris(value["src-uri"]),
        dest_uris=_uris(value["dest-uri"]),
        src_queue=value.get("src-queue"),
        src_exchange=value.get("src-exchange"),
        src_exchange_key=value.get("src-exchange-key") or "",
        src_queue_args=value.get("src-queue-args") or {},
        src_consumer_args=value.get("src-consumer-args") or {},
        prefetch=int(either("src-prefetch-count", "prefetch-count", DEFAULT_PREFETCH)),
        delete_after=either("src-delete-after", "delete-after", "never"),
        ack_mode=value.get("ack-mode") or "on-confirm",
        dest_queue=value.get("dest-queue"),
        dest_exchange=value.get("dest-exchange"),
        dest_exchange_key=value.get("dest-exchange-key"),
        dest_queue_args=value.get("dest-queue-args") or {},
        add_forward_headers=bool(either("dest-add-forward-headers", "add-forward-headers", False)),
        add_timestamp_header=bool(either("dest-add-timestamp-header", "add-timestamp-header", False)),
        publish_properties=either("dest-publish-properties", "publish-properties", {}) or {},
        reconnect_delay=float(value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)),
    )

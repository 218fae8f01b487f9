"""What every part of the management API shares: the answer to a refused request, the
request as a handler sees it (:class:`Call`, with what it reads: :class:`Context`), and
RabbitMQ's names and constants. It imports none of the API's other parts but the rates (for
their type), so that each part may import it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote_to_bytes

from postroom.broker.amqp.connection import reply_text
from postroom.broker.core.sockets import PLAIN_TCP
from postroom.broker.errors import ChannelException

if TYPE_CHECKING:
    from twisted.web.server import Request

    from postroom.broker.amqp.connection import ServerConnection
    from postroom.broker.core.entry import Queue
    from postroom.broker.core.node import Node
    from postroom.broker.core.users import User
    from postroom.broker.core.vhost import VirtualHost
    from postroom.broker.server.clusterview import ClusterView
    from postroom.broker.server.management.rates import RateSampler
    from postroom.broker.server.shovels import Shovels
    from postroom.broker.streams.connection import StreamConnection

#: Tags that let a user into the management API (RabbitMQ's; any other tag does not).
MANAGEMENT_TAGS = frozenset({"administrator", "monitoring", "policymaker", "management"})
#: Tags that see every connection and channel (not only the user's own) and every vhost in
#: the vhost list and the overview.
SEE_ALL_TAGS = frozenset({"administrator", "monitoring"})

#: The RabbitMQ version whose definitions format ``GET /api/definitions`` follows.
RABBITMQ_FORMAT_VERSION = "3.10.8"

#: The realm of the 401 challenge: RabbitMQ's, which HTTP clients register credentials for.
REALM = "RabbitMQ Management"


class Problem(Exception):
    """A refused request: its status, and RabbitMQ's ``error`` and ``reason`` (text, or a
    list where RabbitMQ shows an Erlang term such as ``["no_such_user", "bob"]``)."""

    def __init__(self, status: int, error: str, reason: str | list[Any]) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def not_found() -> Problem:
    """RabbitMQ's answer for anything that is not there (the same whatever is missing)."""
    return Problem(404, "Object Not Found", "Not Found")


def not_authorised(reason: str) -> Problem:
    return Problem(401, "not_authorised", reason)


def required(body: dict[str, Any], keys: tuple[str, ...]) -> list[Any]:
    """The values of ``keys`` in ``body``; 400 naming every one missing, as RabbitMQ does (its
    Erlang term, one to a line once the list is past a line's width)."""
    missing = [f"{{key_missing,{key}}}" for key in keys if key not in body]
    if missing:
        line = "[" + ",".join(missing) + "]"
        raise Problem(400, "bad_request", line if len(line) < 79 else "[" + ",\n ".join(missing) + "]")
    return [body[key] for key in keys]


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ's messages print it (a string is an Erlang binary)."""
    if isinstance(value, str):
        return '<<"' + value + '">>'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return str(value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_object(body: bytes) -> dict[str, Any]:
    """A request body as RabbitMQ's management plugin reads one: an object; empty, ``null``
    or another literal as an empty one.

    :raises Problem: 400 ``not_json`` for anything else (``NaN`` and ``Infinity`` included)
    """
    if body.strip() in (b"", b"null", b"undefined"):
        return {}
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        raise Problem(400, "bad_request", "not_json") from None
    if isinstance(value, dict):
        return value
    if value is None or isinstance(value, bool):
        return {}
    raise Problem(400, "bad_request", "not_json")


def segments(uri: bytes) -> list[str]:
    """The path segments after ``/api/``, each percent-decoded once (``%2F`` is a vhost's ``/``).

    Twisted's ``postpath`` was decoded once already, so it is not used: decoding it again
    turned ``%2541`` into ``A``. A segment that is not UTF-8 once decoded, or a ``.`` or
    ``..`` segment, is refused with 400, never silently dropped.

    :raises Problem: 400
    """
    path = uri.split(b"?", 1)[0]
    raw = [part for part in path.split(b"/") if part][1:]  # after "api"
    decoded = []
    for part in raw:
        try:
            segment = unquote_to_bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            raise Problem(400, "bad_request", "a path segment is not UTF-8") from None
        if segment in (".", ".."):
            raise Problem(400, "bad_request", "'.' and '..' are not path segments here")
        decoded.append(segment)
    return decoded


class Context:
    """What the management API's handlers read: the node, its rates and its shovels, and what
    a user may see of them.

    :param node: the broker node
    :param sampler: rates for ``message_stats``, and the node's resource readings
    :param reports: the folder of the dead-letter analysis' reports (``ui.reports``; ``None``: none)
    :param shovels: the node's running shovels (``None``: it runs none)
    :param cluster: the cluster this node leads (``None``: a single node)
    """

    def __init__(
        self,
        node: Node,
        sampler: RateSampler,
        reports: str | None = None,
        shovels: Shovels | None = None,
        cluster: ClusterView | None = None,
    ) -> None:
        self.node = node
        self.sampler = sampler
        self.reports = reports
        self.shovels = shovels
        self.cluster = cluster

    def vhosts(self, user: User, name: str | None = None, visible: bool = False) -> list[VirtualHost]:
        """The vhosts a list shows ``user`` (RabbitMQ's management plugin): every one to an
        administrator (and, where ``visible``, to a monitoring user: the vhost list and the
        overview), else those the user may open. With ``name``: that one.

        :raises Problem: 401 for a vhost that exists but is not the user's, 404 for a missing one
        """
        administrator = "administrator" in user.tags
        if name is None:
            sees_all = administrator or (visible and "monitoring" in user.tags)
            return [v for v in self.node.vhosts.values() if sees_all or user.may_open(v.name)]
        vhost = self.node.vhosts.get(name)
        if vhost is None:
            raise not_found()
        if not administrator and not user.may_open(name):
            raise not_authorised("User not authorised to access virtual host")
        return [vhost]

    def queue(self, user: User, vhost_name: str, name: str) -> Queue:
        queue = self.vhosts(user, vhost_name)[0].queues.get(name)
        if queue is None:
            raise not_found()
        return queue

    def readable_queue(self, user: User, vhost_name: str, name: str) -> Queue:
        """A queue whose messages ``user`` wants (get, purge): it needs the vhost, read
        permission on the queue, and the queue must not be another connection's exclusive one
        (RabbitMQ does these through an AMQP channel as the user, with its answers).

        :raises Problem: 401 (no vhost access or no read permission), 400 (exclusive), 404
        """
        if not user.may_open(vhost_name):
            raise not_authorised(f"access to vhost '{vhost_name}' refused for user '{user.name}'")
        queue = self.queue(user, vhost_name, name)
        access = user.access(vhost_name)
        if access is not None:
            try:
                access.check("read", "queue", name)
            except ChannelException as refused:
                raise not_authorised(reply_text(refused)) from None
        if queue.owner is not None:
            raise Problem(
                400,
                "bad_request",
                f"405 RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost "
                f"'{vhost_name}'. It could be originally declared on another connection or the exclusive "
                "property value does not match that of the original declaration.",
            )
        return queue

    def visible_connections(self, user: User) -> list[ServerConnection]:
        return [
            connection
            for connection in self.node.connections
            if not SEE_ALL_TAGS.isdisjoint(user.tags) or connection.user_name == user.name
        ]

    def visible_mqtt_connections(self, user: User) -> list[Any]:
        """MQTT's open connections ``user`` sees (as for AMQP's), by name."""
        return self._visible(self.node.mqtt_connections, user)

    def visible_stream_connections(self, user: User) -> list[StreamConnection]:
        """The stream protocol's open connections ``user`` sees (as for AMQP's), by name."""
        return self._visible(self.node.stream_connections, user)

    @staticmethod
    def _visible(connections: Iterable[Any], user: User) -> list[Any]:
        see_all = not SEE_ALL_TAGS.isdisjoint(user.tags)
        shown = (connection for connection in connections if see_all or connection.user_name == user.name)
        return sorted(shown, key=lambda connection: connection.peer)

#: A handler's answer: its status and the body to send as JSON (``None``: none).
Answer = tuple[int, object]


@dataclass
class Call:
    """One request as its handler sees it: who asks, the route's parameters (``:vhost`` and
    the like, decoded) and the query string."""

    context: Context
    user: User
    request: Request
    params: dict[str, str]
    query: dict[str, list[str]] = field(default_factory=dict)

    @property
    def node(self) -> Node:
        return self.context.node

    @property
    def sampler(self) -> RateSampler:
        return self.context.sampler

    def body(self) -> dict[str, Any]:
        """The request's JSON object (see :func:`json_object`)."""
        content = self.request.content
        return json_object(content.read() if content is not None else b"")

    def flag(self, name: str) -> bool:
        """Whether the query string sets ``name`` to ``true`` (``?if-unused=true``)."""
        return self.query.get(name, [""])[-1] == "true"


def query_of(uri: bytes) -> dict[str, list[str]]:
    """The query string's parameters, decoded as UTF-8 (what does not decode is replaced)."""
    _path, _, query = uri.partition(b"?")
    return parse_qs(query.decode("utf-8", "replace"), keep_blank_values=True)


#: How RabbitMQ sorts a list it is not asked to sort otherwise.
DEFAULT_SORTS = ("vhost", "name")


#: Items on a page unless ``page_size`` says, and the most it may say (RabbitMQ's).
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500


class Lazy(list):  # type: ignore[type-arg]
    """The objects of a list answer (queues, say), each view built only when it is shown.

    :attr:`fields` reads, of an object, each field of its view that a sort or a name filter
    may read without building the view. A paginated answer sorted by those fields builds the
    views of its page only; any other answer builds them all (:meth:`built`).
    """

    def __init__(
        self, objects: list[Any], build: Callable[[Any], dict[str, Any]], fields: dict[str, Callable[[Any], Any]]
    ) -> None:
        super().__init__(objects)
        self.build, self.fields = build, fields

    def built(self, objects: Iterable[Any] | None = None) -> list[dict[str, Any]]:
        return [self.build(item) for item in (self if objects is None else objects)]


def shaped(
    items: list[Any],
    query: dict[str, list[str]],
    default_sorts: tuple[str, ...] = DEFAULT_SORTS,
    paginated: bool = False,
) -> Any:
    """A list answer as RabbitMQ's ``reply_list`` shapes it: sorted by ``sort`` (a dotted
    path), then by ``default_sorts``, reversed with ``sort_reverse=true`` (an empty ``sort``
    leaves the order alone), each item cut to the (dotted) paths of ``columns`` (before the sort
    where RabbitMQ cuts first, after it on the lists that paginate, as RabbitMQ's do). Where
    ``paginated``, a ``page`` (with ``page_size``, and ``name`` to keep the items whose name
    holds it, any case, or matches it with ``use_regex=true``) answers that page and its counts.

    :raises Problem: 400 for pagination parameters that are not valid, or a page past the end
    """
    pagination = _pagination(query) if paginated else None
    columns = [column for column in query.get("columns", [""])[-1].split(",") if column]
    lazy = items if isinstance(items, Lazy) else None
    if lazy is not None:
        sort = query.get("sort", [None])[-1]
        keys = [*([sort] if sort else []), *default_sorts]
        if pagination is None or sort == "" or not all(key in lazy.fields for key in keys):
            items, lazy = lazy.built(), None
        else:
            return _page_of(lazy, keys, query.get("sort_reverse", [""])[-1] == "true", pagination, columns)
    if columns and not paginated:  # RabbitMQ's reply_list cuts first: a sort by a field left out sorts by nothing
        items = [_columns(item, columns) for item in items]
    sort = query.get("sort", [None])[-1]
    if sort != "":
        keys = ([sort] if sort else []) + list(default_sorts)
        items = sorted(items, key=lambda item: [_term_order(_at(item, key)) for key in keys])
        if query.get("sort_reverse", [""])[-1] == "true":
            items.reverse()
    if columns and paginated:  # its lists that paginate sort the whole items, then cut
        items = [_columns(item, columns) for item in items]
    if pagination is None:
        return items
    return _page(items, pagination, lambda item: str(item.get("name", "")))


def _page_of(
    lazy: Lazy, keys: list[str], reverse: bool, pagination: tuple[int, int, str, bool], columns: list[str]
) -> dict[str, Any]:
    """:func:`shaped`'s page of a :class:`Lazy` list sorted by its fields: the objects are
    sorted and filtered by what :attr:`Lazy.fields` reads, and the page's views only built. (A
    field holds one kind of value, so Python's order is Erlang's here: text by code point,
    which is UTF-8's byte order, numbers by value, ``false`` before ``true``.)"""
    getters = [lazy.fields[key] for key in keys]
    items = sorted(lazy, key=lambda item: [get(item) for get in getters], reverse=reverse)
    return _page(items, pagination, lazy.fields["name"], lazy.built, columns)


def _page(
    items: list[Any],
    pagination: tuple[int, int, str, bool],
    name_of: Callable[[Any], str],
    build: Callable[[list[Any]], list[Any]] | None = None,
    columns: list[str] | None = None,
) -> dict[str, Any]:
    """The page of sorted ``items`` that ``pagination`` asks for, with RabbitMQ's counts: the
    items whose name (``name_of``) holds the filter (any case) or matches it (``use_regex``);
    ``build`` makes the page's views (and ``columns`` cuts them) when the items are not views."""
    page, size, name, use_regex = pagination
    kept = items
    if name:
        if use_regex:
            try:
                pattern = re.compile(name, re.IGNORECASE)
            except re.error:
                raise Problem(400, "bad_request", "Pagination parameters are invalid") from None
            kept = [item for item in items if pattern.search(name_of(item))]
        else:
            lowered = name.lower()
            kept = [item for item in items if lowered in name_of(item).lower()]
    start = (page - 1) * size
    if start > len(kept):
        reason = f"Page out of range, page: {page} page size: {size}, len: {len(kept)}"
        raise Problem(400, "page_out_of_range", reason)
    shown = kept[start : start + size]
    if build is not None:
        shown = build(shown)
        if columns:
            shown = [_columns(item, columns) for item in shown]
    return {
        "total_count": len(items),
        "item_count": len(shown),
        "filtered_count": len(kept),
        "page": page,
        "page_size": size,
        "page_count": (len(kept) + size - 1) // size,
        "items": shown,
    }


def _pagination(query: dict[str, list[str]]) -> tuple[int, int, str, bool] | None:
    """``(page, page_size, name, use_regex)`` of a query, as RabbitMQ validates them;
    ``None`` without ``page``."""
    raw_page, raw_size = query.get("page", [None])[-1], query.get("page_size", [None])[-1]
    try:
        page = int(raw_page) if raw_page is not None else None
        size = int(raw_size) if raw_size is not None else None
    except ValueError:
        raise Problem(400, "bad_request", "Pagination parameters are invalid") from None
    if page is None:
        return None
    if page < 1 or (size is not None and not 0 < size <= MAX_PAGE_SIZE):
        shown = "undefined" if size is None else size
        reason = f"Invalid pagination parameters: page number {page}, page size {shown}"
        raise Problem(400, "invalid_pagination_parameters", reason)
    name = query.get("name", [""])[-1]
    return page, size or DEFAULT_PAGE_SIZE, name, query.get("use_regex", [""])[-1] == "true"


def _at(item: Any, path: str) -> Any:
    """The value at a dotted ``path`` of ``item``; 0 where there is none (RabbitMQ's
    ``get_dotted_value``: nothing sorts before everything else)."""
    for part in path.split("."):
        if not isinstance(item, dict) or part not in item:
            return 0
        item = item[part]
    return item


def _term_order(value: Any) -> tuple[int, Any]:
    """A JSON value's place in Erlang's term order (numbers, then atoms, then lists and maps,
    then binaries, byte by byte), the order RabbitMQ sorts by."""
    if isinstance(value, bool) or value is None:
        return (1, str(value).lower())
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, str):
        return (3, value.encode("utf-8", "surrogateescape"))
    return (2, json.dumps(value, sort_keys=True))


def _columns(item: Any, columns: list[str]) -> Any:
    if not isinstance(item, dict):
        return item
    kept: dict[str, Any] = {}
    for column in columns:
        head, _, rest = column.partition(".")
        if head not in item:
            continue
        if rest and isinstance(item[head], dict):
            inner = _columns(item[head], [rest])
            kept[head] = {**kept.get(head, {}), **inner} if isinstance(kept.get(head), dict) else inner
        else:
            kept[head] = item[head]
    return kept


def socket_fields(sampler: RateSampler, connection: ServerConnection | StreamConnection | Any) -> dict[str, Any]:
    """A connection's socket as RabbitMQ's connection objects show it: its two ends, how it
    logged in, TLS (Erlang's names), and bytes and socket reads and writes each way, with
    their rates over the last sample."""
    socket = connection.socket
    if socket is not None:
        ends: dict[str, Any] = {
            "host": socket.host, "port": socket.port, "peer_host": socket.peer_host, "peer_port": socket.peer_port
        }  # fmt: skip
        pending = socket.pending()
    else:  # (a connection made in a test, without a socket)
        host, _, port = connection.peer.rpartition(":")
        ends = {"host": "", "port": 0, "peer_host": host, "peer_port": int(port) if port.isdigit() else None}
        pending = 0
    session = socket.tls if socket is not None else None
    received, sent = sampler.socket_rates(connection)
    return {
        **ends,
        "auth_mechanism": connection.auth_mechanism,
        "connected_at": connection.connected_at,
        "ssl": session is not None,
        **(session() if session is not None else PLAIN_TCP),
        "recv_oct": connection.recv_oct,
        "recv_oct_details": {"rate": received},
        "recv_cnt": connection.recv_cnt,
        "send_oct": connection.send_oct,
        "send_oct_details": {"rate": sent},
        "send_cnt": connection.send_cnt,
        "send_pend": pending,
    }

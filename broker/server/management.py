"""The management API: JSON over HTTP, in the shape of RabbitMQ's management plugin.

Read: ``/api/overview``, ``/api/vhosts``, ``/api/queues[/{vhost}[/{name}]]``,
``/api/exchanges[/{vhost}[/{name}]]``, ``/api/bindings[/{vhost}]``, ``/api/connections``,
``/api/channels``, ``/api/policies``, ``/api/operator-policies``, ``/api/definitions[/{vhost}]``
(RabbitMQ's export, for RabbitMQ to import). Act: ``DELETE
/api/queues/{vhost}/{name}/contents`` (purge), ``POST /api/queues/{vhost}/{name}/get`` (peek
at ready messages: nothing is consumed or marked redelivered), ``DELETE
/api/connections/{name}`` (close with 320 CONNECTION_FORCED), ``PUT``/``DELETE
/api/policies/{vhost}/{name}`` and ``/api/operator-policies/{vhost}/{name}``.
A request that changes what the write-ahead log keeps (a policy, a purge of persistent
messages) is answered once the change is durable.

Requests authenticate with HTTP Basic and the AMQP users (a ``loopback_only`` user only from
loopback); a user limited to some vhosts sees only those. Everything runs on the reactor
thread, reading the broker's state directly. Rates come from :class:`RateSampler`, which
reads the counters every few seconds; nothing here runs per message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from pamqp import commands
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from broker.amqp.connection import reply_text
from broker.core.deadletter import DeadLetterReason
from broker.core.entry import Consumer
from broker.core.policy import Policy, PolicyRefused, effective_definition, from_value
from broker.core.queue import WorkQueue
from broker.core.stream import OffsetSpec, StreamQueue
from broker.errors import AMQPError, ChannelException, ReplyCode
from broker.server.http import BoundedSite
from broker.server.protocol import is_loopback
from config.rabbitmq import HASHING_ALGORITHMS
from config.schema import Permission

if TYPE_CHECKING:
    from broker.core.node import Node, User
    from broker.core.vhost import Exchange, VirtualHost

#: The node's name, as RabbitMQ names a node (``name@host``).
NODE_NAME = "postroom@localhost"

#: Seconds between rate samples: RabbitMQ's management plugin samples every 5 s too.
RATE_INTERVAL = 5.0

#: At most this many messages per peek: each is rendered into the JSON reply whole.
MAX_PEEK = 1000
#: Payload bytes one peek answer carries at most: later payloads are cut short (``payload_bytes``
#: still gives their size), so that a client that never reads its answers costs little.
MAX_PEEK_BYTES = 4 << 20

#: Counters that get a ``*_details.rate`` in ``message_stats`` (RabbitMQ's names -> ours).
_QUEUE_STATS = {"publish": "published", "deliver_get": "delivered", "ack": "acked", "redeliver": "redelivered"}
_VHOST_STATS = {"publish": "published", "return_unroutable": "unroutable"}


class RateSampler:
    """Per-second rates of the queue and vhost counters, from samples ``interval`` seconds apart.

    :param node: the broker node
    :param clock: the reactor (``Clock`` in tests)
    """

    def __init__(self, node: Node, clock: Any, interval: float = RATE_INTERVAL) -> None:
        self.node = node
        self.clock = clock
        self.interval = interval
        self._last: dict[tuple[str, str, str], int] = {}
        self._last_at: float | None = None
        self.rates: dict[tuple[str, str, str], float] = {}
        self._loop = LoopingCall(self.sample)
        self._loop.clock = clock

    def start(self) -> None:
        """Sample now and every ``interval`` seconds."""
        self._loop.start(self.interval, now=True)

    def stop(self) -> None:
        """Stop sampling."""
        if self._loop.running:
            self._loop.stop()

    def _counts(self) -> dict[tuple[str, str, str], int]:
        counts = {}
        for vhost in self.node.vhosts.values():
            for stat, attribute in _VHOST_STATS.items():
                counts[(vhost.name, "", stat)] = getattr(vhost, attribute)
            for queue in vhost.queues.values():
                for stat, attribute in _QUEUE_STATS.items():
                    counts[(vhost.name, queue.name, stat)] = getattr(queue, attribute)
        return counts

    def sample(self) -> None:
        """Read the counters and update the rates.

        A queue created since the last sample counts from 0; a counter that went down reads 0.
        """
        now = self.clock.seconds()
        counts = self._counts()
        if self._last_at is not None and now > self._last_at:
            elapsed = now - self._last_at
            self.rates = {key: max(0, count - self._last.get(key, 0)) / elapsed for key, count in counts.items()}
        self._last, self._last_at = counts, now

    def rate(self, vhost: str, queue: str, stat: str) -> float:
        """Messages per second of ``stat`` over the last interval (``queue`` ``""`` for the vhost's)."""
        return self.rates.get((vhost, queue, stat), 0.0)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return str(value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_object(body: bytes) -> dict[str, Any]:
    """A request body as RabbitMQ's management plugin reads one: an object; empty, ``null``
    or another literal as an empty one.

    :raises _Problem: 400 ``not_json`` for anything else (``NaN`` and ``Infinity`` included)
    """
    if body.strip() in (b"", b"null", b"undefined"):
        return {}
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        raise _Problem(400, "bad_request", "not_json") from None
    if isinstance(value, dict):
        return value
    if value is None or isinstance(value, bool):
        return {}
    raise _Problem(400, "bad_request", "not_json")


def _segments(uri: bytes) -> list[str]:
    """The path segments after ``/api/``, each percent-decoded once (``%2F`` is a vhost's ``/``).

    Twisted's ``postpath`` was decoded once already, so it is not used: decoding it again
    turned ``%2541`` into ``A``. A segment that is not UTF-8 once decoded, or a ``.`` or
    ``..`` segment, is refused with 400, never silently dropped.

    :raises _Problem: 400
    """
    path = uri.split(b"?", 1)[0]
    raw = [part for part in path.split(b"/") if part][1:]  # after "api"
    segments = []
    for part in raw:
        try:
            segment = unquote_to_bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            raise _Problem(400, "bad_request", "a path segment is not UTF-8") from None
        if segment in (".", ".."):
            raise _Problem(400, "bad_request", "'.' and '..' are not path segments here")
        segments.append(segment)
    return segments


#: Tags that let a user into the management API (RabbitMQ's; any other tag does not).
MANAGEMENT_TAGS = frozenset({"administrator", "monitoring", "policymaker", "management"})
#: Tags that see every connection and channel (not only the user's own) and every vhost in
#: the vhost list and the overview.
SEE_ALL_TAGS = frozenset({"administrator", "monitoring"})


class _Problem(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def _not_found() -> _Problem:
    """RabbitMQ's answer for anything that is not there (the same whatever is missing)."""
    return _Problem(404, "Object Not Found", "Not Found")


#: The RabbitMQ version whose definitions format ``GET /api/definitions`` follows.
RABBITMQ_FORMAT_VERSION = "3.10.8"

#: ``password_hash`` prefixes of RabbitMQ's hashes and RabbitMQ's name for each algorithm.
_HASHING_ALGORITHMS = {prefix: algorithm for algorithm, (prefix, _size) in HASHING_ALGORITHMS.items()}


def export_users(
    node: Node, salt: Callable[[], bytes] = lambda: os.urandom(4)
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The node's users, permissions and topic permissions as RabbitMQ's definitions hold them.

    A password hash from RabbitMQ is exported as it came; a password in clear is hashed as
    RabbitMQ hashes it (salted SHA-256, ``salt()`` giving the 4 bytes); a Postroom scrypt hash
    has no RabbitMQ equivalent, so that user is exported with an empty hash (no password login
    until one is set there). A user whose vhosts are not limited by permissions gets ``.*``
    on each vhost it may open: RabbitMQ needs permissions to open one at all.
    """
    users, permissions, topic_permissions = [], [], []
    for user in node.users:
        scheme, _, encoded = (user.password_hash or "").partition("$")
        if scheme in _HASHING_ALGORITHMS:
            password_hash, algorithm = encoded, _HASHING_ALGORITHMS[scheme]
        else:
            password_hash, algorithm = "", "rabbit_password_hashing_sha256"
            if user.password is not None:
                salted = salt()
                password_hash = base64.b64encode(
                    salted + hashlib.sha256(salted + user.password.encode("utf-8")).digest()
                ).decode()
        limits = {
            key: value
            for key, value in (("max-connections", user.max_connections), ("max-channels", user.max_channels))
            if value is not None
        }
        users.append(
            {
                "name": user.name,
                "password_hash": password_hash,
                "hashing_algorithm": algorithm,
                "tags": sorted(user.tags),
                "limits": limits,
            }
        )
        granted = dict(user.permissions or {})
        if user.permissions is None:
            granted = {name: Permission() for name in node.vhosts if user.may_open(name)}
        permissions += [
            {"user": user.name, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
            for vhost, p in granted.items()
        ]
        topic_permissions += [
            {"user": user.name, "vhost": vhost, "exchange": exchange, "write": t.write, "read": t.read}
            for vhost, exchanges in (user.topic_permissions or {}).items()
            for exchange, t in exchanges.items()
        ]
    return users, permissions, topic_permissions


def _not_a_stream(queue: WorkQueue, operation: str) -> WorkQueue:
    """``queue``, unless it is a stream, which does not do ``operation`` (refused as over AMQP)."""
    if queue.kind == "stream":
        raise _Problem(400, "bad_request", queue.refusal(operation).reply_text)  # type: ignore[attr-defined]
    return queue


def _stream_view(vhost: VirtualHost, stream: StreamQueue) -> dict[str, Any]:
    """A stream as ``/api/streams`` shows it."""
    log = stream.log
    max_bytes, max_age = stream.retention()
    return {
        "name": stream.name,
        "vhost": vhost.name,
        "messages": stream.message_count,
        "bytes": log.size,
        "segments": len(log.segments),
        "first_offset": log.first_offset,
        "next_offset": stream.committed,
        "max_length_bytes": max_bytes,
        "max_age_seconds": max_age,
        "max_segment_size_bytes": log.segment_bytes,
        "partition": stream.partition_of(),
        "consumers": stream.consumer_count,
        "subscriptions": stream.subscription_view(),
    }


def _reset_spec(value: Any) -> OffsetSpec:
    """Where ``postroom streams reset --to`` moves a subscription.

    :raises _Problem: 400 for anything else
    """
    if value in ("first", "last", "next"):
        return OffsetSpec(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return OffsetSpec("offset", value)
    if isinstance(value, float):
        return OffsetSpec("timestamp", value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            return OffsetSpec("timestamp", moment.timestamp())
    raise _Problem(
        400, "bad_request", f"'to' must be first, last, next, an offset or a time (ISO 8601 or seconds), not {value!r}"
    )


class ManagementAPI(Resource):
    """The ``/api`` tree (a leaf resource: it routes the path itself).

    :param node: the broker node
    :param sampler: rates for ``message_stats``
    """

    isLeaf = True
    _log = Logger()

    def __init__(self, node: Node, sampler: RateSampler) -> None:
        super().__init__()
        self.node = node
        self.sampler = sampler

    # -- plumbing -------------------------------------------------------------------------------

    def render(self, request: Request) -> bytes | int:
        """Check the request's login (off the reactor for an expensive hash, see
        ``Node.login``), then answer it."""
        request.setHeader(b"Content-Type", b"application/json")
        header = (request.getHeader(b"authorization") or b"").decode("latin-1")
        scheme, _, encoded = header.partition(" ")
        try:
            username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            username = password = ""
        if scheme.lower() != "basic" or not username:
            return self._answer(request, None)
        gone: list[bool] = []
        request.notifyFinish().addBoth(gone.append)
        host = getattr(request.getClientAddress(), "host", "")

        def checked(user: User | None, reason: str) -> None:
            if gone:  # the client hung up while its login was checked
                return
            journal = self.node.journal
            before = journal.position if journal is not None else 0
            answer = self._answer(request, user)
            if journal is None or journal.position == before:
                send(answer)
            else:
                journal.when_durable(lambda durable: send(answer if durable else self._not_written(request)))

        def send(answer: bytes) -> None:
            if not gone:
                request.write(answer)
                request.finish()

        self.node.login(username, password, is_loopback(host), host, checked)
        return NOT_DONE_YET

    def _answer(self, request: Request, user: User | None) -> bytes:
        try:
            if user is None:
                raise _Problem(401, "not_authorised", "Login failed")
            if not user.tags & MANAGEMENT_TAGS:
                raise _Problem(401, "not_authorised", "Not management user")
            segments = _segments(request.uri)
            status, body = self._dispatch(request.method.decode(), segments, request, user)
        except _Problem as problem:
            if problem.status == 401:
                request.setHeader(b"WWW-Authenticate", b'Basic realm="Postroom Management"')
            status, body = problem.status, {"error": problem.error, "reason": problem.reason}
        except Exception:
            self._log.failure("management API request {path} failed", path=request.path)
            status, body = 500, {"error": "internal_error", "reason": "internal error (see the broker log)"}
        request.setResponseCode(status)
        if status in (204, 415):  # RabbitMQ's 415 (cowboy's) has no body either
            return b""
        return json.dumps(body, default=_json_default).encode()

    @staticmethod
    def _not_written(request: Request) -> bytes:
        """The answer to a change the write-ahead log could not keep (it holds in memory)."""
        request.setResponseCode(500)
        reason = "the change was made but could not be written to the write-ahead log (see the broker log)"
        return json.dumps({"error": "internal_error", "reason": reason}).encode()

    def _vhosts(self, user: User, name: str | None = None, visible: bool = False) -> list[VirtualHost]:
        """The vhosts a list shows ``user`` (RabbitMQ's management plugin): every one to an
        administrator (and, where ``visible``, to a monitoring user: the vhost list and the
        overview), else those the user may open. With ``name``: that one.

        :raises _Problem: 401 for a vhost that exists but is not the user's, 404 for a missing one
        """
        administrator = "administrator" in user.tags
        if name is None:
            sees_all = administrator or (visible and "monitoring" in user.tags)
            return [v for v in self.node.vhosts.values() if sees_all or user.may_open(v.name)]
        vhost = self.node.vhosts.get(name)
        if vhost is None:
            raise _not_found()
        if not administrator and not user.may_open(name):
            raise _Problem(401, "not_authorised", "User not authorised to access virtual host")
        return [vhost]

    def _queue(self, user: User, vhost_name: str, name: str) -> WorkQueue:
        queue = self._vhosts(user, vhost_name)[0].queues.get(name)
        if queue is None:
            raise _not_found()
        return queue

    def _readable_queue(self, user: User, vhost_name: str, name: str) -> WorkQueue:
        """A queue whose messages ``user`` wants (get, purge): it needs the vhost, read
        permission on the queue, and the queue must not be another connection's exclusive one
        (RabbitMQ does these through an AMQP channel as the user, with its answers).

        :raises _Problem: 401 (no vhost access or no read permission), 400 (exclusive), 404
        """
        if not user.may_open(vhost_name):
            raise _Problem(401, "not_authorised", f"access to vhost '{vhost_name}' refused for user '{user.name}'")
        queue = self._queue(user, vhost_name, name)
        access = user.access(vhost_name)
        if access is not None:
            try:
                access.check("read", "queue", name)
            except ChannelException as refused:
                raise _Problem(401, "not_authorised", reply_text(refused)) from None
        if queue.owner is not None:
            raise _Problem(
                400,
                "bad_request",
                f"405 RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost "
                f"'{vhost_name}'. It could be originally declared on another connection or the exclusive "
                "property value does not match that of the original declaration.",
            )
        return queue

    def _dispatch(self, method: str, path: list[str], request: Request, user: User) -> tuple[int, Any]:
        if not path:
            raise _not_found()
        kind, rest = path[0], path[1:]
        if method == "GET":
            views: dict[str, Callable[[User, list[str]], Any]] = {
                "overview": self._overview,
                "vhosts": self._vhost_list,
                "queues": self._queues,
                "exchanges": self._exchanges,
                "bindings": self._bindings,
                "connections": self._connections,
                "channels": self._channels,
                "nodes": self._nodes,
                "policies": self._policies,
                "operator-policies": self._operator_policies,
                "definitions": self._definitions,
                "consumers": self._consumers,
                "streams": self._streams,
            }
            view = views.get(kind)
            if view is not None:
                return 200, view(user, rest)
        elif method == "DELETE" and kind == "queues" and len(rest) == 3 and rest[2] == "contents":
            _not_a_stream(self._readable_queue(user, rest[0], rest[1]), "queue.purge").purge()
            return 204, None
        elif method == "POST" and kind == "queues" and len(rest) == 3 and rest[2] == "get":
            return 200, self._peek(_not_a_stream(self._readable_queue(user, rest[0], rest[1]), "basic.get"), request)
        elif method == "PUT" and kind == "streams" and len(rest) == 4 and rest[2] == "subscriptions":
            return 200, self._reset_subscription(user, rest[0], rest[1], rest[3], request)
        elif method == "DELETE" and kind == "connections" and len(rest) == 1:
            return self._close_connection(user, rest[0])
        elif method in ("PUT", "DELETE") and kind in ("policies", "operator-policies") and len(rest) == 2:
            operator = kind == "operator-policies"
            if method == "PUT":
                return self._set_policy(user, rest[0], rest[1], request, operator)
            return self._clear_policy(user, rest[0], rest[1], operator)
        else:
            raise _Problem(405, "method_not_allowed", f"{method} is not allowed here")
        raise _not_found()

    # -- views ----------------------------------------------------------------------------------

    def _overview(self, user: User, rest: list[str]) -> dict[str, Any]:
        vhosts = self._vhosts(user, visible=True)
        queues = [self._queue_view(vhost, queue) for vhost in vhosts for queue in vhost.queues.values()]
        connections = self._visible_connections(user)
        stats: dict[str, Any] = {}
        for stat in ("publish", "return_unroutable"):
            attribute = _VHOST_STATS[stat]
            stats[stat] = sum(getattr(vhost, attribute) for vhost in vhosts)
            stats[f"{stat}_details"] = {"rate": sum(self.sampler.rate(v.name, "", stat) for v in vhosts)}
        for stat in ("deliver_get", "ack", "redeliver"):
            stats[stat] = sum(queue["message_stats"][stat] for queue in queues)
            stats[f"{stat}_details"] = {
                "rate": sum(queue["message_stats"][f"{stat}_details"]["rate"] for queue in queues)
            }
        return {
            "product_name": self.node.product,
            "product_version": self.node.version,
            "management_version": self.node.version,
            "node": NODE_NAME,
            "object_totals": {
                "connections": len(connections),
                "channels": sum(len(connection.channels) for connection in connections),
                "exchanges": sum(len(vhost.exchanges) for vhost in vhosts),
                "queues": len(queues),
                "consumers": sum(queue["consumers"] for queue in queues),
            },
            "queue_totals": {
                "messages": sum(queue["messages"] for queue in queues),
                "messages_ready": sum(queue["messages_ready"] for queue in queues),
                "messages_unacknowledged": sum(queue["messages_unacknowledged"] for queue in queues),
            },
            "message_stats": stats,
        }

    def _nodes(self, user: User, rest: list[str]) -> Any:
        """``/api/nodes[/{name}]``: the one node, with its memory and disk readings and alarms
        (for monitoring users and administrators, as RabbitMQ)."""
        if not user.tags & SEE_ALL_TAGS:
            raise _Problem(401, "not_authorised", "Not monitor user")
        node = self.node
        monitor = node.resource_monitor
        view = {
            "name": NODE_NAME,
            "type": "disc",
            "running": True,
            "mem_used": monitor.memory_used if monitor is not None else None,
            "mem_limit": monitor.memory_limit if monitor is not None else None,
            "mem_alarm": "memory" in node.alarms,
            "disk_free": monitor.disk_free if monitor is not None else None,
            "disk_free_limit": monitor.disk_limit if monitor is not None and monitor.disk_path else None,
            "disk_free_alarm": "disk" in node.alarms,
        }
        if not rest:
            return [view]
        if rest[0] != view["name"]:
            raise _not_found()
        return view

    def _vhost_list(self, user: User, rest: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "name": vhost.name,
                "messages": sum(q.message_count + q.unacked_count for q in vhost.queues.values()),
                "messages_ready": sum(q.message_count for q in vhost.queues.values()),
                "messages_unacknowledged": sum(q.unacked_count for q in vhost.queues.values()),
            }
            for vhost in self._vhost_objects(user, rest)
        ]

    def _vhost_objects(self, user: User, rest: list[str]) -> list[VirtualHost]:
        """``/api/vhosts`` (every vhost to a monitoring user too) or ``/api/vhosts/NAME``
        (administrators only, as RabbitMQ 3.10)."""
        if not rest:
            return self._vhosts(user, visible=True)
        if "administrator" not in user.tags:
            raise _Problem(401, "not_authorised", "Not administrator user")
        return self._vhosts(user, rest[0])

    def _queue_view(self, vhost: VirtualHost, queue: WorkQueue) -> dict[str, Any]:
        rate = self.sampler.rate
        active = queue.active_consumer
        stats: dict[str, Any] = {}
        for stat, attribute in _QUEUE_STATS.items():
            stats[stat] = getattr(queue, attribute)
            stats[f"{stat}_details"] = {"rate": rate(vhost.name, queue.name, stat)}
        view = {
            "name": queue.name,
            "vhost": vhost.name,
            "node": NODE_NAME,
            "durable": queue.durable,
            "auto_delete": queue.auto_delete,
            "exclusive": queue.exclusive,
            "type": queue.kind,
            "arguments": queue.arguments,
            "messages": queue.message_count + queue.unacked_count,
            "messages_ready": queue.message_count,
            "messages_unacknowledged": queue.unacked_count,
            "consumers": queue.consumer_count,
            "message_stats": stats,
            "dead_lettered": {reason.value: queue.dead_lettered.get(reason, 0) for reason in DeadLetterReason},
            "visibility_timeouts": queue.visibility_timeouts,
            "policy": queue.policy.name if queue.policy is not None else None,
            "operator_policy": queue.operator_policy.name if queue.operator_policy is not None else None,
            "effective_policy_definition": effective_definition(queue.policy, queue.operator_policy),
        }
        if isinstance(queue, StreamQueue):
            # RabbitMQ's stream fields: one node holds the stream, its only member; ``readers``
            # counts the consumers reading it there.
            view.update(members=[NODE_NAME], online=[NODE_NAME], readers={NODE_NAME: queue.consumer_count})
            view["state"] = "running"
        else:
            view["single_active_consumer_tag"] = active.tag if active is not None else None
            view["exclusive_consumer_tag"] = next((c.tag for c in queue.consumers if c.exclusive), None)
        return view

    @staticmethod
    def _consumer_view(vhost: VirtualHost, queue: WorkQueue, consumer: Consumer) -> dict[str, Any]:
        """A consumer as RabbitMQ's ``consumer_details`` show it: ``active`` and
        ``activity_status`` (``single_active``, ``waiting``, or ``up`` on other queues)."""
        channel = consumer.channel
        connection = channel.connection  # type: ignore[attr-defined]
        if queue.settings.single_active_consumer:
            active = queue.active_consumer is consumer
            status = "single_active" if active else "waiting"
        else:
            active, status = True, "up"
        return {
            "queue": {"name": queue.name, "vhost": vhost.name},
            "channel_details": {
                "name": f"{connection.peer} ({channel.id})",  # type: ignore[attr-defined]
                "number": channel.id,  # type: ignore[attr-defined]
                "connection_name": connection.peer,
                "user": connection.user_name,
            },
            "consumer_tag": consumer.tag,
            "exclusive": consumer.exclusive,
            "ack_required": not consumer.no_ack,
            "prefetch_count": consumer.prefetch,
            "active": active,
            "activity_status": status,
            "arguments": dict(consumer.arguments),
        }

    def _consumers(self, user: User, rest: list[str]) -> list[dict[str, Any]]:
        """``GET /api/consumers[/VHOST]``: every consumer of the vhosts ``user`` sees."""
        return [
            self._consumer_view(vhost, queue, consumer)
            for vhost in self._vhosts(user, rest[0] if rest else None)
            for queue in sorted(vhost.queues.values(), key=lambda q: q.name)
            for consumer in queue.consumers
        ]

    def _queues(self, user: User, rest: list[str]) -> Any:
        if len(rest) >= 2:
            vhost = self._vhosts(user, rest[0])[0]
            queue = self._queue(user, rest[0], rest[1])
            view = self._queue_view(vhost, queue)
            view["consumer_details"] = [self._consumer_view(vhost, queue, c) for c in queue.consumers]
            return view
        return [
            self._queue_view(vhost, queue)
            for vhost in self._vhosts(user, rest[0] if rest else None)
            for queue in sorted(vhost.queues.values(), key=lambda q: q.name)
        ]

    def _streams(self, user: User, rest: list[str]) -> Any:
        """``GET /api/streams[/VHOST[/NAME]]`` (Postroom's): streams, their offsets, retention
        and subscriptions."""
        if len(rest) >= 2:
            vhost = self._vhosts(user, rest[0])[0]
            return _stream_view(vhost, self._stream(user, rest[0], rest[1]))
        return [
            _stream_view(vhost, queue)  # type: ignore[arg-type]
            for vhost in self._vhosts(user, rest[0] if rest else None)
            for queue in sorted(vhost.queues.values(), key=lambda q: q.name)
            if queue.kind == "stream"
        ]

    def _stream(self, user: User, vhost_name: str, name: str) -> StreamQueue:
        queue = self._queue(user, vhost_name, name)
        if queue.kind != "stream":
            raise _Problem(400, "bad_request", f"queue '{name}' in vhost '{vhost_name}' is not a stream")
        return queue  # type: ignore[return-value]

    def _reset_subscription(self, user: User, vhost_name: str, name: str, subscription: str, request: Request) -> Any:
        """``PUT /api/streams/VHOST/NAME/subscriptions/SUBSCRIPTION`` with ``{"to": ...}``:
        ``first``, ``last``, ``next``, an offset, or a time (seconds since the epoch, or ISO 8601);
        it needs read permission on the stream. Answers the subscription as it now is."""
        self._readable_queue(user, vhost_name, name)
        stream = self._stream(user, vhost_name, name)
        body = _json_object(request.content.read())
        if "to" not in body:
            raise _Problem(400, "bad_request", "{key_missing,to}")
        spec = _reset_spec(body["to"])
        stream.reset(subscription, spec)
        self._log.info(
            "subscription {subscription} of stream {stream} in vhost {vhost} moved to {spec} by {user}",
            subscription=subscription,
            stream=name,
            vhost=vhost_name,
            spec=body["to"],
            user=user.name,
        )
        return next(view for view in stream.subscription_view() if view["name"] == subscription)

    @staticmethod
    def _exchange_view(vhost: VirtualHost, exchange: Exchange) -> dict[str, Any]:
        view = {
            "name": exchange.name,
            "vhost": vhost.name,
            "type": exchange.type_name,
            "durable": exchange.durable,
            "auto_delete": exchange.auto_delete,
            "internal": exchange.internal,
            "arguments": exchange.arguments,
        }
        if exchange.policy is not None:  # as RabbitMQ: only when one applies
            view["policy"] = exchange.policy.name
        return view

    # -- policies -----------------------------------------------------------------------------

    @staticmethod
    def _policy_view(vhost: VirtualHost, policy: Policy) -> dict[str, Any]:
        return {"vhost": vhost.name, "name": policy.name, **policy.value()}

    def _policy_list(self, user: User, rest: list[str], operator: bool) -> Any:
        """``/api/policies[/VHOST[/NAME]]`` (``operator``: ``/api/operator-policies/...``), as
        RabbitMQ's management plugin answers them: lists to any management user, sorted by
        priority; one policy to an administrator, or a policymaker of that vhost (operator
        policies: administrators only)."""
        if len(rest) >= 2:
            self._may_set_policies(user, rest[0], operator)
            vhost = self._vhosts(user, rest[0])[0]
            policy = (vhost.operator_policies if operator else vhost.policies).get(rest[1])
            if policy is None:
                raise _not_found()
            return self._policy_view(vhost, policy)
        views = [
            self._policy_view(vhost, policy)
            for vhost in self._vhosts(user, rest[0] if rest else None)
            for policy in (vhost.operator_policies if operator else vhost.policies).values()
        ]
        return sorted(views, key=lambda view: (view["priority"], view["name"]))

    def _may_set_policies(self, user: User, vhost_name: str, operator: bool) -> None:
        """RabbitMQ's rule for one policy (to see, set or clear it): an administrator, or a
        policymaker who may open the vhost (a missing vhost is let through to its 404);
        operator policies: administrators only.

        :raises _Problem: 401
        """
        if "administrator" in user.tags:
            return
        if operator:
            raise _Problem(401, "not_authorised", "Not administrator user")
        if "policymaker" not in user.tags or (vhost_name in self.node.vhosts and not user.may_open(vhost_name)):
            raise _Problem(401, "not_authorised", "User not authorised to access object")

    def _set_policy(self, user: User, vhost_name: str, name: str, request: Request, operator: bool) -> tuple[int, None]:
        """``PUT /api/policies/VHOST/NAME``: 201 for a new policy, 204 for a replaced one; 400
        with RabbitMQ's reason for a refused one (for user policies with ``<``, ``>`` and ``&``
        escaped, as RabbitMQ escapes them)."""
        self._may_set_policies(user, vhost_name, operator)
        if operator and not (request.getHeader(b"content-type") or b"").lower().startswith(b"application/json"):
            raise _Problem(415, "unsupported_media_type", "")  # answered without a body
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is None:
            raise _Problem(404, "not_found", "vhost_not_found")
        body = _json_object(request.content.read())
        missing = [key for key in ("pattern", "definition") if key not in body]
        if missing:
            raise _Problem(400, "bad_request", "[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
        value = {key: body[key] for key in ("pattern", "definition", "priority", "apply-to") if key in body}
        try:
            policy = from_value(name, value, operator)
        except PolicyRefused as refused:
            reason = str(refused)
            if not operator:
                reason = reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            raise _Problem(400, "bad_request", reason) from None
        table = vhost.operator_policies if operator else vhost.policies
        created = name not in table
        vhost.set_policy(policy, operator)
        self._log_policy_change("set", user, vhost_name, name, operator)
        return (201 if created else 204), None

    def _clear_policy(self, user: User, vhost_name: str, name: str, operator: bool) -> tuple[int, None]:
        """``DELETE /api/policies/VHOST/NAME``: 204, or 404 when there is no such policy."""
        self._may_set_policies(user, vhost_name, operator)
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is None or not vhost.clear_policy(name, operator):
            raise _not_found()
        self._log_policy_change("cleared", user, vhost_name, name, operator)
        return 204, None

    def _log_policy_change(self, what: str, user: User, vhost_name: str, name: str, operator: bool) -> None:
        self._log.info(
            "{kind} '{name}' in vhost '{vhost}' {what} through the management API by {user}",
            kind="operator policy" if operator else "policy",
            name=name,
            vhost=vhost_name,
            what=what,
            user=user.name,
        )

    def _policies(self, user: User, rest: list[str]) -> Any:
        return self._policy_list(user, rest, operator=False)

    def _operator_policies(self, user: User, rest: list[str]) -> Any:
        return self._policy_list(user, rest, operator=True)

    # -- definitions --------------------------------------------------------------------------

    def _definitions(self, user: User, rest: list[str]) -> dict[str, Any]:
        """``GET /api/definitions[/VHOST]``: what RabbitMQ 3.10's export holds, for
        administrators, in its shape, so that RabbitMQ imports it (``POST /api/definitions``,
        ``rabbitmqctl import_definitions``). Like RabbitMQ's: every queue but exclusive ones,
        every exchange but the default and ``amq.*`` ones, the bindings between what is exported
        (and from ``amq.*`` exchanges), policies, and operator policies and vhost limits as
        ``parameters``; the whole node's adds users, vhosts, permissions and topic permissions.
        One vhost's leaves ``vhost`` out of queues, exchanges and bindings, as RabbitMQ does.
        """
        if "administrator" not in user.tags:
            raise _Problem(401, "not_authorised", "Not administrator user")
        if rest:
            vhost = self.node.vhosts.get(rest[0])
            if vhost is None:
                raise _Problem(400, "bad_request", "vhost_not_found")
            vhosts = [vhost]
        else:
            vhosts = list(self.node.vhosts.values())
        queues, exchanges, bindings, parameters, policies = [], [], [], [], []
        for vhost in vhosts:
            exported = {queue.name for queue in vhost.queues.values() if queue.owner is None}
            for queue in vhost.queues.values():
                if queue.name in exported:
                    queues.append(
                        {
                            "name": queue.name,
                            "vhost": vhost.name,
                            "durable": queue.durable,
                            "auto_delete": queue.auto_delete,
                            "arguments": dict(queue.arguments),
                        }
                    )
            for exchange in vhost.exchanges.values():
                if exchange.name and not exchange.name.startswith("amq."):
                    view = self._exchange_view(vhost, exchange)
                    view.pop("policy", None)
                    exchanges.append(view)
            bindings += [
                binding
                for binding in self._vhost_bindings(vhost)
                if (
                    binding["destination"] in exported
                    if binding["destination_type"] == "queue"
                    else binding["destination"]
                )
            ]
            policies += [self._policy_view(vhost, policy) for policy in vhost.policies.values()]
            parameters += [
                {"value": policy.value(), "vhost": vhost.name, "component": "operator_policy", "name": policy.name}
                for policy in vhost.operator_policies.values()
            ]
            limits = {
                key: value
                for key, value in (("max-connections", vhost.max_connections), ("max-queues", vhost.max_queues))
                if value is not None
            }
            if limits:
                parameters.append({"value": limits, "vhost": vhost.name, "component": "vhost-limits", "name": "limits"})
        if rest:
            for item in (*queues, *exchanges, *bindings):
                del item["vhost"]
            return {
                "rabbit_version": RABBITMQ_FORMAT_VERSION,
                "parameters": parameters,
                "policies": policies,
                "queues": queues,
                "exchanges": exchanges,
                "bindings": bindings,
            }
        users, permissions, topic_permissions = export_users(self.node)
        return {
            "rabbit_version": RABBITMQ_FORMAT_VERSION,
            "rabbitmq_version": RABBITMQ_FORMAT_VERSION,
            "product_name": self.node.product,
            "product_version": self.node.version,
            "users": users,
            "vhosts": [{"name": vhost.name} for vhost in vhosts],
            "permissions": permissions,
            "topic_permissions": topic_permissions,
            "parameters": parameters,
            "global_parameters": [],
            "policies": policies,
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }

    def _exchanges(self, user: User, rest: list[str]) -> Any:
        if len(rest) >= 2:
            vhost = self._vhosts(user, rest[0])[0]
            exchange = vhost.exchanges.get(rest[1])
            if exchange is None:
                raise _not_found()
            return self._exchange_view(vhost, exchange)
        return [
            self._exchange_view(vhost, exchange)
            for vhost in self._vhosts(user, rest[0] if rest else None)
            for exchange in vhost.exchanges.values()
        ]

    def _bindings(self, user: User, rest: list[str]) -> list[dict[str, Any]]:
        return [
            binding
            for vhost in self._vhosts(user, rest[0] if rest else None)
            for binding in self._vhost_bindings(vhost)
        ]

    @staticmethod
    def _vhost_bindings(vhost: VirtualHost) -> list[dict[str, Any]]:
        result = []
        for exchange in vhost.exchanges.values():
            if exchange.name == "":
                continue  # the default exchange's implicit bindings are not listed
            for destination, routing_key, arguments in exchange.router.bindings():
                is_queue = hasattr(destination, "kind")  # a queue of any kind (exchanges have none)
                result.append(
                    {
                        "source": exchange.name,
                        "vhost": vhost.name,
                        "destination": destination.name,  # type: ignore[attr-defined]
                        "destination_type": "queue" if is_queue else "exchange",
                        "routing_key": routing_key,
                        "arguments": dict(arguments),
                    }
                )
        return result

    def _visible_connections(self, user: User) -> list[Any]:
        return [
            connection
            for connection in self.node.connections
            if user.tags & SEE_ALL_TAGS or connection.user_name == user.name
        ]

    def _connections(self, user: User, rest: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "name": connection.peer,
                "user": connection.user_name,
                "vhost": connection.vhost.name if connection.vhost is not None else None,
                "channels": len(connection.channels),
                "frame_max": connection.frame_max,
                "channel_max": connection.channel_max,
                "timeout": connection.heartbeat,
                "client_properties": connection.client_properties,
                "state": "running",
            }
            for connection in sorted(self._visible_connections(user), key=lambda c: c.peer)
        ]

    def _channels(self, user: User, rest: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "name": f"{connection.peer} ({number})",
                "number": number,
                "connection_details": {"name": connection.peer},
                "user": connection.user_name,
                "vhost": connection.vhost.name if connection.vhost is not None else None,
                "consumer_count": len(channel.consuming.consumers),
                "messages_unacknowledged": channel.consuming.unacked_count,
                "prefetch_count": channel.consuming.prefetch_consumer,
                "global_prefetch_count": channel.consuming.prefetch_global,
                "confirm": channel.confirms is not None,
                "transactional": bool(channel.transactional),
            }
            for connection in sorted(self._visible_connections(user), key=lambda c: c.peer)
            for number, channel in sorted(connection.channels.items())
        ]

    # -- actions --------------------------------------------------------------------------------

    def _peek(self, queue: WorkQueue, request: Request) -> list[dict[str, Any]]:
        options = _json_object(request.content.read())
        count = options.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_PEEK:
            raise _Problem(400, "bad_request", f"count must be an integer from 1 to {MAX_PEEK}")
        truncate = options.get("truncate")
        if truncate is not None and (not isinstance(truncate, int) or isinstance(truncate, bool) or truncate < 0):
            raise _Problem(400, "bad_request", "truncate must be a number of bytes")
        entries = queue.ready.peek(count)
        remaining = queue.message_count
        result = []
        room = MAX_PEEK_BYTES  # what one answer may carry, whatever the client asked for
        for entry in entries:
            message = entry.message
            body = message.body
            size = len(body)
            keep = min(size, room, truncate if truncate is not None else size)
            body, room = body[:keep], room - keep
            try:
                properties = message.properties
            except AMQPError:  # accepted unread at publish (docs/rabbitmq-compatibility.md): shown without properties
                properties = commands.Basic.Properties()
            try:
                payload, encoding = body.decode("utf-8"), "string"
            except UnicodeDecodeError:
                payload, encoding = base64.b64encode(body).decode(), "base64"
            remaining -= 1
            result.append(
                {
                    "payload": payload,
                    "payload_bytes": size,
                    "payload_encoding": encoding,
                    "redelivered": entry.redelivered,
                    "exchange": message.exchange,
                    "routing_key": message.routing_key,
                    "message_count": remaining,
                    "delivery_count": entry.delivery_count,
                    "properties": {
                        name: getattr(properties, name)
                        for name in properties.__slots__
                        if getattr(properties, name) is not None
                    },
                }
            )
        return result

    def _close_connection(self, user: User, name: str) -> tuple[int, None]:
        """Close a connection: its own user's or, for an administrator, anyone's (RabbitMQ
        checks this before it looks for the connection: 401 for a missing one too)."""
        found = next((connection for connection in self.node.connections if connection.peer == name), None)
        if "administrator" not in user.tags and (found is None or found.user_name != user.name):
            raise _Problem(401, "not_authorised", "User not authorised to access object")
        if found is None:
            raise _not_found()
        found.close(ReplyCode.CONNECTION_FORCED, "Closed via management plugin")
        self._log.info("connection {peer} closed through the management API by {user}", peer=name, user=user.name)
        return 204, None


def management_site(node: Node, sampler: RateSampler, reactor: Any = None) -> Site:
    """A twisted.web ``Site`` serving the API under ``/api`` (its timeouts on ``reactor``,
    the global one by default)."""
    root = Resource()
    root.putChild(b"api", ManagementAPI(node, sampler))
    return BoundedSite(root, reactor=reactor)

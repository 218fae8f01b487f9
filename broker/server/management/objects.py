"""What the API does to exchanges, queues, bindings and connections, as RabbitMQ's
management plugin does it: declare and delete exchanges and queues, bind and unbind, publish,
get (and peek at) messages, purge, close a connection.

RabbitMQ runs these as AMQP methods of the user's; their refusals come back as its plugin
maps them: 404 ``not_found`` with the method's reason, 401 ``Access refused.`` for a 403, and
400 ``bad_request`` with the reason for the rest.
"""

from __future__ import annotations

import base64
import binascii
import struct
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote_plus

from pamqp import commands
from pamqp.exceptions import PAMQPException
from twisted.logger import Logger

from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.stream import StreamQueue
from postroom.broker.errors import AMQPError, ChannelException, ReplyCode
from postroom.broker.server.management.common import Answer, Call, Problem, not_authorised, not_found, required
from postroom.broker.server.management.router import Router
from postroom.broker.server.management.views import binding_view, properties_key
from postroom.broker.wire.codec import encode_content_header

if TYPE_CHECKING:
    from postroom.broker.core.entry import Queue
    from postroom.broker.core.vhost import VirtualHost

_log = Logger()

#: At most this many messages per peek: each is rendered into the JSON reply whole.
MAX_PEEK = 1000
#: Payload bytes one peek answer carries at most: later payloads are cut short (``payload_bytes``
#: still gives their size), so that a client that never reads its answers costs little.
MAX_PEEK_BYTES = 4 << 20


def install(router: Router) -> None:
    router.add("/connections/:connection", DELETE=close_connection)
    router.add("/exchanges/:vhost/:exchange", PUT=put_exchange, DELETE=delete_exchange)
    router.add("/exchanges/:vhost/:exchange/publish", POST=publish)
    router.add("/queues/:vhost/:queue", PUT=put_queue, DELETE=delete_queue)
    router.add("/queues/:vhost/:queue/contents", DELETE=purge)
    router.add("/queues/:vhost/:queue/get", POST=get)
    router.add("/bindings/:vhost/e/:source/:dtype/:destination", GET=bindings_between, POST=bind)
    router.add("/bindings/:vhost/e/:source/:dtype/:destination/:props", GET=binding, DELETE=unbind)


def refused(error: ChannelException) -> Problem:
    """An AMQP method's refusal as RabbitMQ's management plugin answers it."""
    if error.reply_code == ReplyCode.NOT_FOUND:
        return Problem(404, "not_found", error.reply_text)
    if error.reply_code == ReplyCode.ACCESS_REFUSED:
        return not_authorised("Access refused.")
    return Problem(400, "bad_request", error.reply_text)


def _writable_vhost(call: Call) -> VirtualHost:
    """The request's vhost, for a change: 404 ``vhost_not_found`` when missing, 401 when the
    user may not open it."""
    vhost = call.node.vhosts.get(call.params["vhost"])
    if vhost is None:
        raise Problem(404, "not_found", "vhost_not_found")
    call.context.vhosts(call.user, vhost.name)  # 401 for a vhost that is not the user's
    return vhost


def _boolean(body: dict[str, Any], key: str) -> bool:
    """A flag of a request body as RabbitMQ reads one: ``true``/``false``, or those as strings."""
    value = body.get(key, False)
    if value in (True, False, "true", "false"):
        return value in (True, "true")
    raise Problem(400, "bad_request", ["not_boolean", value])


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise Problem(400, "bad_request", "arguments must be an object")
    return arguments


def put_exchange(call: Call) -> tuple[int, None]:
    """``PUT /api/exchanges/VHOST/NAME``: ``exchange.declare`` (``type`` ``direct`` unless
    given, not durable unless asked): 201 when created, 204 when it was there."""
    vhost = _writable_vhost(call)
    body = call.body()
    name = call.params["exchange"]
    existed = name in vhost.exchanges
    type_name = str(body.get("type", "direct"))
    if type_name not in call.node.registry.names():
        raise Problem(400, "bad_request", f"unknown exchange type '{type_name}'")
    try:
        vhost.declare_exchange(
            name,
            type_name,
            durable=_boolean(body, "durable"),
            auto_delete=_boolean(body, "auto_delete"),
            internal=_boolean(body, "internal"),
            arguments=_arguments(body),
            access=call.user.access(vhost.name),
        )
    except ChannelException as error:
        raise refused(error) from None
    return (204 if existed else 201), None


def delete_exchange(call: Call) -> tuple[int, None]:
    """``DELETE /api/exchanges/VHOST/NAME[?if-unused=true]``."""
    return _delete(call, "exchange")


def delete_queue(call: Call) -> tuple[int, None]:
    """``DELETE /api/queues/VHOST/NAME[?if-unused=true][&if-empty=true]``."""
    return _delete(call, "queue")


def _delete(call: Call, kind: str) -> tuple[int, None]:
    """Delete the exchange or queue of the path: 404 when missing, then as ``exchange.delete``
    or ``queue.delete`` (configure permission, the ``if-`` conditions of the query)."""
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    name = call.params[kind]
    if name not in (vhost.exchanges if kind == "exchange" else vhost.queues):
        raise not_found()
    try:
        access = call.user.access(vhost.name)
        if access is not None:
            access.check("configure", kind, name)
        if kind == "exchange":
            vhost.delete_exchange(name, if_unused=call.flag("if-unused"))
        else:
            vhost.delete_queue(name, None, if_unused=call.flag("if-unused"), if_empty=call.flag("if-empty"))
    except ChannelException as error:
        raise refused(error) from None
    return 204, None


def put_queue(call: Call) -> tuple[int, None]:
    """``PUT /api/queues/VHOST/NAME``: ``queue.declare`` (``exclusive`` is ignored, as
    RabbitMQ ignores it here): 201 when created, 204 when it was there."""
    vhost = _writable_vhost(call)
    body = call.body()
    name = call.params["queue"]
    existed = name in vhost.queues
    arguments = _arguments(body)
    kind = arguments.get("x-queue-type")
    if isinstance(kind, str) and kind not in QUEUE_TYPES:
        where = f"for queue '{name}' in vhost '{vhost.name}'"
        raise Problem(400, "bad_request", f"invalid arg 'x-queue-type' {where}: \"unsupported queue type '{kind}'\"")
    if name.startswith("amq."):  # a reserved name: RabbitMQ's 403, as the plugin maps it
        raise not_authorised("Access refused.")
    try:
        vhost.declare_queue(
            name,
            None,
            durable=_boolean(body, "durable"),
            auto_delete=_boolean(body, "auto_delete"),
            arguments=arguments,
            access=call.user.access(vhost.name),
        )
    except ChannelException as error:
        raise refused(error) from None
    vhost.tallies.queues_declared += 1
    return (204 if existed else 201), None


def _between(call: Call) -> tuple[VirtualHost, str, str, bool]:
    """The vhost, source, destination and whether it is a queue, of a binding path.

    :raises Problem: 404 for a missing vhost, source or destination, or a type other than ``q`` or ``e``
    """
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    source, destination, kind = call.params["source"], call.params["destination"], call.params["dtype"]
    if kind not in ("q", "e"):
        raise not_found()
    is_queue = kind == "q"
    if source not in vhost.exchanges or destination not in (vhost.queues if is_queue else vhost.exchanges):
        raise not_found()
    return vhost, source, destination, is_queue


def _bindings_between(vhost: VirtualHost, source: str, destination: str, is_queue: bool) -> list[dict[str, Any]]:
    exchange = vhost.exchanges[source]
    views = [
        binding_view(vhost, source, destination, is_queue, key, dict(arguments))
        for target, key, arguments in exchange.router.bindings()
        if getattr(target, "name", None) == destination and hasattr(target, "kind") == is_queue
    ]
    return sorted(views, key=lambda view: (view["routing_key"], view["properties_key"]))


def bindings_between(call: Call) -> Answer:
    """``GET /api/bindings/VHOST/e/SOURCE/q|e/DESTINATION``."""
    return 200, _bindings_between(*_between(call))


def _named(bindings: list[dict[str, Any]], props: str) -> dict[str, Any]:
    """The binding ``props`` names, read as RabbitMQ reads it: the routing key (unquoted) and,
    after a ``~``, the hash of its arguments (none: a binding without arguments).

    :raises Problem: 404 when none is
    """
    key, _, hashed = props.partition("~")
    key = unquote_plus(key)
    for found in bindings:
        if found["routing_key"] != key:
            continue
        if (not hashed and not found["arguments"]) or (hashed and found["properties_key"].endswith("~" + hashed)):
            return found
    raise not_found()


def binding(call: Call) -> Answer:
    """``GET /api/bindings/VHOST/e/SOURCE/q|e/DESTINATION/PROPS``."""
    return 200, _named(_bindings_between(*_between(call)), call.params["props"])


def bind(call: Call) -> Answer:
    """``POST /api/bindings/VHOST/e/SOURCE/q|e/DESTINATION`` with ``routing_key`` and
    ``arguments``: 201, and the new binding's path (relative) in ``Location``."""
    vhost = _writable_vhost(call)
    source, destination, kind = call.params["source"], call.params["destination"], call.params["dtype"]
    if kind not in ("q", "e"):
        raise not_found()
    body = call.body()
    key = body.get("routing_key", "")
    if not isinstance(key, str):
        raise Problem(400, "bad_request", "routing_key must be a string")
    arguments = _arguments(body)
    try:
        access = call.user.access(vhost.name)
        if access is not None:
            access.check("write", "queue" if kind == "q" else "exchange", destination)
            access.check("read", "exchange", source)
        if kind == "q":
            vhost.bind_queue(destination, source, key, arguments, None)
        else:
            vhost.bind_exchange(destination, source, key, arguments)
    except ChannelException as error:
        raise refused(error) from None
    location = f"{quote(destination, safe='~')}/{quote(properties_key(key, arguments), safe='~')}"
    call.request.setHeader(b"Location", location.encode())
    return 201, None


def unbind(call: Call) -> tuple[int, None]:
    """``DELETE /api/bindings/VHOST/e/SOURCE/q|e/DESTINATION/PROPS``."""
    vhost, source, destination, is_queue = _between(call)
    found = _named(_bindings_between(vhost, source, destination, is_queue), call.params["props"])
    key, arguments = found["routing_key"], found["arguments"]
    try:
        access = call.user.access(vhost.name)
        if access is not None:
            access.check("write", "queue" if is_queue else "exchange", destination)
            access.check("read", "exchange", source)
        if is_queue:
            vhost.unbind_queue(destination, source, key, arguments, None)
        else:
            vhost.unbind_exchange(destination, source, key, arguments)
    except ChannelException as error:
        raise refused(error) from None
    return 204, None


def publish(call: Call) -> Answer:
    """``POST /api/exchanges/VHOST/NAME/publish``: publish one message as the user (``amq.default``
    is the default exchange), mandatory and confirmed; answers whether a queue took it."""
    vhost = _writable_vhost(call)
    body = call.body()
    keys = ("routing_key", "properties", "payload", "payload_encoding")
    routing_key, properties, payload, encoding = required(body, keys)
    if not isinstance(payload, str):
        raise Problem(400, "bad_request", "payload_not_string")
    if encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise Problem(400, "bad_request", "payload_not_base64") from None
    elif encoding == "string":
        data = payload.encode("utf-8")
    else:
        raise Problem(400, "bad_request", "invalid_payload_encoding")
    if not isinstance(properties, dict) or not isinstance(routing_key, str):
        raise Problem(400, "bad_request", "properties must be an object and routing_key a string")
    name = call.params["exchange"]
    name = "" if name == "amq.default" else name
    exchange = vhost.exchanges.get(name)
    if exchange is None and name:
        raise Problem(400, "bad_request", f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost.name}'")
    user_id = properties.get("user_id")
    if user_id is not None and user_id != call.user.name:
        raise Problem(
            400,
            "bad_request",
            f"406 PRECONDITION_FAILED - user_id property set to '{user_id}' but authenticated user was "
            f"'{call.user.name}'",
        )
    access = call.user.access(vhost.name)
    if access is not None:
        try:
            access.check("write", "exchange", name)
        except ChannelException as error:
            raise Problem(400, "bad_request", f"403 {error.reply_text}") from None
    message = Message.build(name, routing_key, data, basic_properties(properties))
    vhost.published += 1
    queues = vhost.route(exchange if name else None, message)  # (the default exchange: None)
    if exchange is not None and name:
        exchange.published_in += 1
        exchange.published_out += len(queues)
    elif not queues:
        vhost.tallies.default_unroutable += 1
    vhost.enqueue_routed(queues, message)
    if not queues:
        vhost.unroutable += 1
    return 200, {"routed": bool(queues)}


#: The properties of RabbitMQ's JSON (``type`` is pamqp's ``message_type``).
_PROPERTY_NAMES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "headers": "headers",
    "delivery_mode": "delivery_mode",
    "priority": "priority",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "timestamp": "timestamp",
    "type": "message_type",
    "user_id": "user_id",
    "app_id": "app_id",
    "cluster_id": "cluster_id",
}


def basic_properties(properties: dict[str, Any]) -> commands.Basic.Properties:
    """A message's properties from the JSON of RabbitMQ's API (``timestamp`` in seconds).

    :raises Problem: 400 for a property that is not one, or a value that does not fit it
    """
    values: dict[str, Any] = {}
    for key, value in properties.items():
        name = _PROPERTY_NAMES.get(key)
        if name is None:
            raise Problem(400, "bad_request", f"unknown property '{key}'")
        if name == "timestamp" and isinstance(value, int):
            value = datetime.fromtimestamp(value, timezone.utc)
        values[name] = value
    try:
        result = commands.Basic.Properties(**values)
        encode_content_header(0, result)  # a value that does not fit its property fails here
    except (TypeError, ValueError, OverflowError, AttributeError, struct.error, PAMQPException) as problem:
        raise Problem(400, "bad_request", f"invalid properties: {problem}") from None
    return result


def _not_a_stream(queue: Queue, operation: str) -> WorkQueue:
    """``queue``, unless it is a stream, which does not do ``operation`` (refused as over AMQP)."""
    if isinstance(queue, StreamQueue):
        raise Problem(400, "bad_request", queue.refusal(operation).reply_text)
    assert isinstance(queue, WorkQueue)  # (the other kind)
    return queue


def purge(call: Call) -> tuple[int, None]:
    queue = call.context.readable_queue(call.user, call.params["vhost"], call.params["queue"])
    _not_a_stream(queue, "queue.purge").purge()
    return 204, None


#: The queue types a declare may name (others are refused as RabbitMQ's API refuses them).
QUEUE_TYPES = ("classic", "quorum", "stream")

#: ``ackmode`` of ``POST .../get``: RabbitMQ's four, and Postroom's ``peek``.
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false", "peek")


def get(call: Call) -> Answer:
    """``POST /api/queues/VHOST/NAME/get`` with ``count``, ``ackmode`` and ``encoding`` (and
    ``truncate``), as RabbitMQ: take up to ``count`` ready messages, then put them back marked
    redelivered (``ack_requeue_true``, ``reject_requeue_true``), acknowledge them
    (``ack_requeue_false``) or reject them to their dead-letter exchange
    (``reject_requeue_false``). Postroom's ``peek`` shows them and changes nothing."""
    queue = call.context.readable_queue(call.user, call.params["vhost"], call.params["queue"])
    queue = _not_a_stream(queue, "basic.get")
    body = call.body()
    ackmode, count, encoding = required(body, ("ackmode", "count", "encoding"))
    if encoding not in ("auto", "base64"):
        raise Problem(400, "bad_request", "Unsupported encoding. Please use auto or base64.")
    if ackmode not in ACKMODES:
        raise Problem(400, "bad_request", f"ackmode must be one of {', '.join(ACKMODES)}")
    count = _integer(count, "count")
    truncate = body.get("truncate")
    truncate = None if truncate is None else _integer(truncate, "truncate")
    if not 0 <= count <= MAX_PEEK:
        raise Problem(400, "bad_request", f"count must be an integer from 0 to {MAX_PEEK}")
    if ackmode == "peek":
        remaining = queue.message_count
        taken = [(entry, remaining - at - 1) for at, entry in enumerate(queue.ready.peek(count))]
    else:
        taken = []
        for _ in range(count):
            entry = queue.get()
            if entry is None:
                queue.got_empty += 1
                break
            queue.delivered += 1
            queue.got += 1
            taken.append((entry, queue.message_count))
    answer = _rendered(taken, encoding, truncate)
    entries = [entry for entry, _remaining in taken]
    if ackmode in ("ack_requeue_true", "reject_requeue_true"):
        queue.return_entries(entries)
    elif ackmode == "ack_requeue_false":
        queue.acked += len(entries)
        queue.settle(entries)
    elif ackmode == "reject_requeue_false":
        queue.reject(entries)
    return 200, answer


def _integer(value: Any, name: str) -> int:
    """An integer of a request body, or its digits as a string (RabbitMQ's ``parse_int``)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Problem(400, "bad_request", f"{name} must be an integer")
    return value


def _rendered(taken: list[tuple[Any, int]], encoding: str, truncate: int | None) -> list[dict[str, Any]]:
    """Messages as RabbitMQ's get shows them: with ``auto`` a payload that is UTF-8 as a
    string, else base64; ``payload_bytes`` the whole size, whatever ``truncate`` keeps. One
    answer carries at most :data:`MAX_PEEK_BYTES` of payloads."""
    result = []
    room = MAX_PEEK_BYTES  # what one answer may carry, whatever the client asked for
    for entry, remaining in taken:
        message = entry.message
        body = message.body
        size = len(body)
        keep = min(size, room, truncate if truncate is not None else size)
        body, room = body[:keep], room - keep
        try:
            properties = message.properties
        except AMQPError:  # accepted unread at publish (docs/rabbitmq-compatibility.md): shown without properties
            properties = commands.Basic.Properties()
        payload, shown_as = base64.b64encode(body).decode(), "base64"
        if encoding == "auto":
            try:
                payload, shown_as = body.decode("utf-8"), "string"
            except UnicodeDecodeError:
                pass
        result.append(
            {
                "payload_bytes": size,
                "redelivered": entry.redelivered,
                "exchange": message.exchange,
                "routing_key": message.routing_key,
                "message_count": remaining,
                "properties": _properties_json(properties) or [],  # RabbitMQ's empty list
                "payload": payload,
                "payload_encoding": shown_as,
            }
        )
    return result


def _properties_json(properties: commands.Basic.Properties) -> dict[str, Any]:
    shown = {}
    for key, name in _PROPERTY_NAMES.items():
        value = getattr(properties, name)
        if value is None or (name == "cluster_id" and not value):  # (pamqp's absent cluster_id is '')
            continue
        shown[key] = _plain(value)
    return shown


def _plain(value: Any) -> Any:
    """A property's value as RabbitMQ's API shows it: a timestamp as seconds, in a table or an
    array too (``x-death``'s ``time``)."""
    if isinstance(value, datetime):
        return int(value.timestamp())
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def close_connection(call: Call) -> tuple[int, None]:
    """Close a connection: its own user's or, for an administrator, anyone's (RabbitMQ
    checks this before it looks for the connection: 401 for a missing one too), with the
    ``X-Reason`` header's text, or RabbitMQ's default."""
    name, user = call.params["connection"], call.user
    found = next((connection for connection in call.node.connections if connection.peer == name), None)
    streaming = next((connection for connection in call.node.stream_connections if connection.peer == name), None)
    mqtt = next((connection for connection in call.node.mqtt_connections if connection.peer == name), None)
    target = found or streaming or mqtt
    if "administrator" not in user.tags and (target is None or target.user_name != user.name):
        raise not_authorised("User not authorised to access object")
    if streaming is not None and found is None:
        streaming.force_close(f"closed through the management API by {user.name}")
        _log.info("stream connection {peer} closed through the management API by {user}", peer=name, user=user.name)
        return 204, None
    if mqtt is not None and found is None:
        mqtt.close(ReplyCode.CONNECTION_FORCED, f"closed through the management API by {user.name}")
        _log.info("MQTT connection {peer} closed through the management API by {user}", peer=name, user=user.name)
        return 204, None
    if found is None:
        raise not_found()
    # RabbitMQ's X-Reason header gives the text the client reads in connection.close.
    reason = call.request.getHeader("x-reason") or "Closed via management plugin"
    found.close(ReplyCode.CONNECTION_FORCED, reason[:200])
    _log.info("connection {peer} closed through the management API by {user}", peer=name, user=user.name)
    return 204, None

"""Postroom's ``/api/streams``: streams, their offsets and retention, their subscriptions,
and moving a subscription (what ``postroom streams`` runs over). And RabbitMQ's
``/api/stream/...`` (its ``rabbitmq_stream_management`` plugin): the stream protocol's
connections, publishers and consumers."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from postroom.broker.core.stream import OffsetSpec, StreamQueue
from postroom.broker.server.identity import node_name
from postroom.broker.server.management.common import Answer, Call, Problem, not_authorised, not_found, socket_fields
from postroom.broker.server.management.router import Router

if TYPE_CHECKING:
    from postroom.broker.core.vhost import VirtualHost
    from postroom.broker.server.management.rates import RateSampler
    from postroom.broker.streams.connection import StreamConnection

_log = Logger()


def install(router: Router) -> None:
    router.add("/streams", GET=streams)
    router.add("/streams/:vhost", GET=streams)
    router.add("/streams/:vhost/:stream", GET=streams)
    router.add("/streams/:vhost/:stream/subscriptions/:subscription", PUT=reset_subscription)
    router.add("/stream/connections", GET=stream_connections)
    router.add("/stream/connections/:vhost", GET=stream_connections)
    router.add("/stream/connections/:vhost/:connection", GET=stream_connections, DELETE=close_stream_connection)
    router.add("/stream/connections/:vhost/:connection/publishers", GET=stream_publishers)
    router.add("/stream/connections/:vhost/:connection/consumers", GET=stream_consumers)
    router.add("/stream/publishers", GET=stream_publishers)
    router.add("/stream/publishers/:vhost", GET=stream_publishers)
    router.add("/stream/publishers/:vhost/:stream", GET=stream_publishers)
    router.add("/stream/consumers", GET=stream_consumers)
    router.add("/stream/consumers/:vhost", GET=stream_consumers)


def stream_view(vhost: VirtualHost, stream: StreamQueue) -> dict[str, Any]:
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


def streams(call: Call) -> Answer:
    """``GET /api/streams[/VHOST[/NAME]]``: streams, their offsets, retention and subscriptions."""
    params = call.params
    if "stream" in params:
        vhost = call.context.vhosts(call.user, params["vhost"])[0]
        return 200, stream_view(vhost, _stream(call, params["vhost"], params["stream"]))
    return 200, [
        stream_view(vhost, queue)  # type: ignore[arg-type]
        for vhost in call.context.vhosts(call.user, params.get("vhost"))
        for queue in sorted(vhost.queues.values(), key=lambda q: q.name)
        if queue.kind == "stream"
    ]


def _stream(call: Call, vhost_name: str, name: str) -> StreamQueue:
    queue = call.context.queue(call.user, vhost_name, name)
    if queue.kind != "stream":
        raise Problem(400, "bad_request", f"queue '{name}' in vhost '{vhost_name}' is not a stream")
    return queue  # type: ignore[return-value]


def reset_subscription(call: Call) -> Answer:
    """``PUT /api/streams/VHOST/NAME/subscriptions/SUBSCRIPTION`` with ``{"to": ...}``:
    ``first``, ``last``, ``next``, an offset, or a time (seconds since the epoch, or ISO 8601);
    it needs read permission on the stream. Answers the subscription as it now is."""
    vhost_name, name, subscription = call.params["vhost"], call.params["stream"], call.params["subscription"]
    call.context.readable_queue(call.user, vhost_name, name)
    stream = _stream(call, vhost_name, name)
    body = call.body()
    if "to" not in body:
        raise Problem(400, "bad_request", "{key_missing,to}")
    stream.reset(subscription, reset_spec(body["to"]))
    _log.info(
        "subscription {subscription} of stream {stream} in vhost {vhost} moved to {spec} by {user}",
        subscription=subscription,
        stream=name,
        vhost=vhost_name,
        spec=body["to"],
        user=call.user.name,
    )
    return 200, next(view for view in stream.subscription_view() if view["name"] == subscription)


def reset_spec(value: Any) -> OffsetSpec:
    """Where ``postroom streams reset --to`` moves a subscription.

    :raises Problem: 400 for anything else
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
    raise Problem(
        400, "bad_request", f"'to' must be first, last, next, an offset or a time (ISO 8601 or seconds), not {value!r}"
    )


# -- the stream protocol's connections, publishers and consumers --------------------------------


def stream_connection_view(sampler: RateSampler, connection: StreamConnection) -> dict[str, Any]:
    """A stream-protocol connection as ``/api/stream/connections`` (and ``/api/connections``)
    show it: RabbitMQ's fields."""
    view = {
        "name": connection.peer,
        "node": node_name(),
        "protocol": "stream",
        "user": connection.user_name,
        "user_who_performed_action": connection.user_name,
        "vhost": connection.vhost.name if connection.vhost is not None else None,
        "client_properties": connection.client_properties,
        "user_provided_name": connection.client_properties.get("connection_name"),
        "channel_max": 0,
        "frame_max": connection.frame_max,
        "timeout": connection.heartbeat,
        "state": "running",
    }
    view.update(socket_fields(sampler, connection))
    view["host"], view["port"] = connection.advertised
    return view


def _details(connection: StreamConnection) -> dict[str, Any]:
    peer_host, _, peer_port = connection.peer.rpartition(":")
    return {
        "name": connection.peer,
        "node": node_name(),
        "peer_host": peer_host,
        "peer_port": int(peer_port) if peer_port.isdigit() else None,
        "user": connection.user_name,
    }


def publisher_view(connection: StreamConnection, publisher: Any) -> dict[str, Any]:
    """One publisher as ``/api/stream/publishers`` shows it."""
    stream = publisher.stream
    return {
        "connection_details": _details(connection),
        "publisher_id": publisher.id,
        "reference": publisher.reference,
        "queue": {"name": stream.name, "vhost": stream.vhost_name},
        "published": publisher.published,
        "confirmed": publisher.confirmed,
        "errored": publisher.errored,
    }


def consumer_view(connection: StreamConnection, reader: Any) -> dict[str, Any]:
    """One subscription as ``/api/stream/consumers`` shows it: its offset is the first of the
    last chunk sent, its lag what the stream committed beyond it (RabbitMQ's measures)."""
    stream = reader.stream
    last_chunk = stream.log.locate(max(stream.committed - 1, 0)) if stream.committed else None
    committed_chunk = last_chunk.first_offset if last_chunk is not None else 0
    return {
        "connection_details": _details(connection),
        "subscription_id": reader.id,
        "queue": {"name": stream.name, "vhost": stream.vhost_name},
        "credits": reader.credit,
        "consumed": reader.consumed,
        "offset": reader.offset,
        "offset_lag": max(committed_chunk - reader.offset, 0),
        "properties": reader.properties,
        "active": reader.active and not reader.waiting,  # (RabbitMQ 3.11's, with its groups)
    }


def stream_connections_shown(call: Call, required: bool = True) -> list[StreamConnection]:
    """The stream connections the user sees, of the path's vhost and connection when it names
    them (404 for a vhost that is not there, and with ``required`` for a connection)."""
    params = call.params
    shown = call.context.visible_stream_connections(call.user)
    if "vhost" in params:
        vhost = call.context.vhosts(call.user, params["vhost"])[0]
        shown = [connection for connection in shown if connection.vhost is vhost]
    if "connection" in params:
        shown = [connection for connection in shown if connection.peer == params["connection"]]
        if not shown and required:
            raise not_found()
    return shown


def stream_connections(call: Call) -> Answer:
    """``GET /api/stream/connections[/VHOST[/NAME]]`` (one connection shows its TLS fields as
    empty strings where the list shows nulls, as RabbitMQ's plugin does)."""
    views = [stream_connection_view(call.sampler, connection) for connection in stream_connections_shown(call)]
    if "connection" not in call.params:
        return 200, views
    tls = ("ssl_", "peer_cert_")
    return 200, {key: "" if value is None and key.startswith(tls) else value for key, value in views[0].items()}


def stream_publishers(call: Call) -> Answer:
    """``GET /api/stream/publishers[/VHOST[/STREAM]]`` and a connection's (404 for a stream
    that is not there)."""
    stream = call.params.get("stream")
    if stream is not None:
        call.context.queue(call.user, call.params["vhost"], stream)
    return 200, [
        publisher_view(connection, publisher)
        for connection in stream_connections_shown(call)
        for _id, publisher in sorted(connection.publishers.items())
        if stream is None or publisher.stream.name == stream
    ]


def stream_consumers(call: Call) -> Answer:
    """``GET /api/stream/consumers[/VHOST]`` and a connection's."""
    return 200, [
        consumer_view(connection, reader)
        for connection in stream_connections_shown(call)
        for _id, reader in sorted(connection.subscriptions.items())
    ]


def close_stream_connection(call: Call) -> tuple[int, None]:
    """``DELETE /api/stream/connections/VHOST/NAME``: its own user's, or for an administrator
    anyone's; the socket is closed without a frame, as RabbitMQ closes it."""
    user = call.user
    found = next((c for c in call.node.stream_connections if c.peer == call.params["connection"]), None)
    if "administrator" not in user.tags and (found is None or found.user_name != user.name):
        raise not_authorised("User not authorised to access object")
    if found is None:
        raise not_found()
    found.force_close(f"closed through the management API by {user.name}")
    _log.info("stream connection {peer} closed through the management API by {user}", peer=found.peer, user=user.name)
    return 204, None

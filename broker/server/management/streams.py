"""Postroom's ``/api/streams``: streams, their offsets and retention, their subscriptions,
and moving a subscription (what ``postroom streams`` runs over)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from broker.core.stream import OffsetSpec, StreamQueue
from broker.server.management.common import Call, Problem
from broker.server.management.router import Router

if TYPE_CHECKING:
    from broker.core.vhost import VirtualHost

_log = Logger()


def install(router: Router) -> None:
    router.add("/streams", GET=streams)
    router.add("/streams/:vhost", GET=streams)
    router.add("/streams/:vhost/:stream", GET=streams)
    router.add("/streams/:vhost/:stream/subscriptions/:subscription", PUT=reset_subscription)


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


def streams(call: Call) -> tuple[int, Any]:
    """``GET /api/streams[/VHOST[/NAME]]``: streams, their offsets, retention and subscriptions."""
    params = call.params
    if "stream" in params:
        vhost = call.api.vhosts(call.user, params["vhost"])[0]
        return 200, stream_view(vhost, _stream(call, params["vhost"], params["stream"]))
    return 200, [
        stream_view(vhost, queue)  # type: ignore[arg-type]
        for vhost in call.api.vhosts(call.user, params.get("vhost"))
        for queue in sorted(vhost.queues.values(), key=lambda q: q.name)
        if queue.kind == "stream"
    ]


def _stream(call: Call, vhost_name: str, name: str) -> StreamQueue:
    queue = call.api.queue(call.user, vhost_name, name)
    if queue.kind != "stream":
        raise Problem(400, "bad_request", f"queue '{name}' in vhost '{vhost_name}' is not a stream")
    return queue  # type: ignore[return-value]


def reset_subscription(call: Call) -> tuple[int, Any]:
    """``PUT /api/streams/VHOST/NAME/subscriptions/SUBSCRIPTION`` with ``{"to": ...}``:
    ``first``, ``last``, ``next``, an offset, or a time (seconds since the epoch, or ISO 8601);
    it needs read permission on the stream. Answers the subscription as it now is."""
    vhost_name, name, subscription = call.params["vhost"], call.params["stream"], call.params["subscription"]
    call.api.readable_queue(call.user, vhost_name, name)
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

"""What the API shows: the overview, the node, vhosts, queues, exchanges, bindings,
consumers, connections and channels, in the shape of RabbitMQ's management plugin.

Every view reads the broker's state as it is; rates come from the
:class:`~broker.server.management.rates.RateSampler`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus

from postroom.broker.core.dead_lettering import DeadLetterReason
from postroom.broker.core.policy import effective_definition
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.stream import StreamQueue
from postroom.broker.server.identity import node_name
from postroom.broker.server.management.common import (
    RABBITMQ_FORMAT_VERSION,
    SEE_ALL_TAGS,
    Answer,
    Call,
    Lazy,
    not_authorised,
    not_found,
    socket_fields,
)
from postroom.broker.server.management.rates import (
    HISTORY_STATS,
    RATE_INTERVAL,
    VHOST_STATS,
    RateSampler,
    channel_counts,
    descriptors_open,
    queue_counts,
    with_rates,
)
from postroom.broker.server.management.router import Router
from postroom.broker.server.management.streams import stream_connection_view, stream_connections_shown

if TYPE_CHECKING:
    from postroom.broker.amqp.channel import ChannelState
    from postroom.broker.amqp.connection import ServerConnection
    from postroom.broker.core.entry import Consumer, Queue
    from postroom.broker.core.exchange import Exchange
    from postroom.broker.core.node import Node
    from postroom.broker.core.vhost import VirtualHost
    from postroom.broker.mqtt.connection import MqttConnection


#: When the process started, near enough (this module is loaded at start): the node's uptime.
_STARTED = time.monotonic()


def install(router: Router) -> None:
    router.add("/overview", GET=overview)
    router.add("/nodes", GET=nodes)
    router.add("/nodes/:node", GET=nodes)
    router.add("/connections", GET=connections)
    router.add("/connections/:connection", GET=connections)
    router.add("/connections/:connection/channels", GET=channels)
    router.add("/vhosts/:vhost/connections", GET=connections)
    router.add("/vhosts/:vhost/channels", GET=channels)
    router.add("/channels", GET=channels)
    router.add("/channels/:channel", GET=channels)
    router.add("/consumers", GET=consumers)
    router.add("/consumers/:vhost", GET=consumers)
    router.add("/exchanges", GET=exchanges)
    router.add("/exchanges/:vhost", GET=exchanges)
    router.add("/exchanges/:vhost/:exchange", GET=exchanges)
    router.add("/exchanges/:vhost/:exchange/bindings/source", GET=exchange_bindings)
    router.add("/exchanges/:vhost/:exchange/bindings/destination", GET=exchange_bindings)
    router.add("/queues", GET=queues)
    router.add("/queues/:vhost", GET=queues)
    router.add("/queues/:vhost/:queue", GET=queues)
    router.add("/queues/:vhost/:queue/bindings", GET=queue_bindings)
    router.add("/bindings", GET=bindings)
    router.add("/bindings/:vhost", GET=bindings)
    router.add("/vhosts", GET=vhosts)
    router.add("/vhosts/:vhost", GET=vhosts)


def overview(call: Call) -> Answer:
    node, sampler = call.node, call.sampler
    shown = call.context.vhosts(call.user, visible=True)
    queues = [(vhost, queue) for vhost in shown for queue in vhost.queues.values()]
    visible = call.context.visible_connections(call.user)
    stats = vhost_stats(sampler, shown)
    age, increment = _history_window(call)
    if age:
        names = [vhost.name for vhost in shown]
        for stat in HISTORY_STATS:
            details = stats.setdefault(f"{stat}_details", {"rate": 0.0})
            details["samples"] = history = sampler.samples(names, stat, age, increment)
            if history:
                details["avg_rate"] = (history[0]["sample"] - history[-1]["sample"]) / age
                details["avg"] = sum(sample["sample"] for sample in history) / len(history)
        dead = stats["dead_lettered_details"]["samples"]
        stats["dead_lettered"] = dead[0]["sample"] if dead else 0  # (Postroom's: dead letters so far)
    return 200, {
        "product_name": node.product,
        "product_version": node.version,
        "management_version": node.version,
        # The RabbitMQ whose behaviour this broker follows (tools read it to know what to ask).
        "rabbitmq_version": RABBITMQ_FORMAT_VERSION,
        "cluster_name": call.node.admin.cluster_name or node_name(),
        "node": node_name(),
        "listeners": [
            {
                "node": node_name(),
                "protocol": info.protocol,
                "ip_address": info.interface,
                "port": info.port,
                "socket_opts": {},
            }
            for info in node.listeners
        ],  # fmt: skip
        "object_totals": {
            "connections": len(visible) + len(call.context.visible_mqtt_connections(call.user)),
            "channels": sum(len(connection.channels) for connection in visible),
            "exchanges": sum(len(vhost.exchanges) for vhost in shown),
            "queues": len(queues),
            "consumers": sum(queue.consumer_count for _vhost, queue in queues),
        },
        "queue_totals": queue_totals(sampler, queues),
        "message_stats": stats,
        "rates_mode": "basic",
        "disable_stats": False,
        "enable_queue_totals": False,
        "statistics_db_event_queue": 0,
        "sample_retention_policies": {"global": [600], "basic": [600], "detailed": [600]},
        "exchange_types": exchange_types(node),
        "churn_rates": sampler.churn(),
    }


#: The descriptions RabbitMQ gives its built-in exchange types.
_TYPE_DESCRIPTIONS = {
    kind: f"AMQP {kind} exchange, as per the AMQP specification" for kind in ("direct", "fanout", "headers", "topic")
}


def exchange_types(node: Node) -> list[dict[str, Any]]:
    """The exchange types the node has (plugins' too), as RabbitMQ's overview lists them."""
    shown = []
    for name in sorted(node.registry.names()):
        description = _TYPE_DESCRIPTIONS.get(name)
        if description is None:
            doc = (type(node.registry.get(name)).__doc__ or "").strip()
            description = doc.splitlines()[0] if doc else name
        shown.append({"name": name, "description": description, "enabled": True})
    return shown


def vhost_stats(sampler: RateSampler, vhosts: list[VirtualHost]) -> dict[str, Any]:
    """``message_stats`` over ``vhosts``, with rates: what their channels published, confirmed
    and had returned or dropped, and what their queues delivered, got and had acknowledged."""
    counts: dict[str, int] = {}
    rates: dict[str, float] = {}
    for vhost in vhosts:
        own = {
            "publish": vhost.published,
            "return_unroutable": vhost.returned,
            "confirm": vhost.confirmed,
            "drop_unroutable": max(0, vhost.unroutable - vhost.returned),
        }
        for stat, count in own.items():
            counts[stat] = counts.get(stat, 0) + count
        for stat in VHOST_STATS:
            rates[stat] = rates.get(stat, 0.0) + sampler.rate(vhost.name, "", stat)
        for queue in vhost.queues.values():
            for stat, count in queue_counts(queue).items():
                if stat == "publish":  # (into queues; the vhost's are its channels')
                    continue
                counts[stat] = counts.get(stat, 0) + count
                rates[stat] = rates.get(stat, 0.0) + sampler.rate(vhost.name, queue.name, stat)
    for stat in ("publish", "return_unroutable", "confirm", "drop_unroutable"):
        counts.setdefault(stat, 0)
    return with_rates(counts, rates, families=True)


def queue_totals(sampler: RateSampler, queues: list[tuple[VirtualHost, Queue]]) -> dict[str, Any]:
    """Messages in ``queues``, ready and unacknowledged, with their rates of change."""
    ready = sum(queue.message_count for _vhost, queue in queues)
    unacked = sum(queue.unacked_count for _vhost, queue in queues)
    ready_rate = sum(sampler.rate(vhost.name, queue.name, "messages_ready") for vhost, queue in queues)
    unacked_rate = sum(sampler.rate(vhost.name, queue.name, "messages_unacknowledged") for vhost, queue in queues)
    return {
        "messages": ready + unacked,
        "messages_details": {"rate": ready_rate + unacked_rate},
        "messages_ready": ready,
        "messages_ready_details": {"rate": ready_rate},
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": unacked_rate},
    }


#: Samples one answer's history holds, at most (RabbitMQ's UI asks for a few hundred).
MAX_SAMPLES = 10_000


def _history_window(call: Call) -> tuple[float, float]:
    """``msg_rates_age`` and ``msg_rates_incr`` (seconds), as RabbitMQ reads them; none, or
    values that are not positive numbers: no history (RabbitMQ too answers without it)."""
    values = {key: call.query.get(key, [""])[-1] for key in ("msg_rates_age", "msg_rates_incr")}
    try:
        age, increment = float(values["msg_rates_age"]), float(values["msg_rates_incr"] or RATE_INTERVAL)
    except ValueError:
        return 0.0, 0.0
    if not (0 < age < 1e9 and 0 < increment < 1e9) or age / increment > MAX_SAMPLES:
        return 0.0, 0.0
    return age, increment


def nodes(call: Call) -> Answer:
    """``/api/nodes[/{name}]``: the one node, with its memory and disk readings and alarms
    (for monitoring users and administrators, as RabbitMQ); in a cluster, every node."""
    if SEE_ALL_TAGS.isdisjoint(call.user.tags):
        raise not_authorised("Not monitor user")
    node = call.node
    monitor = call.sampler.monitor
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    view = {
        "name": node_name(),
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((time.monotonic() - _STARTED) * 1000),
        "mem_used": monitor.memory_used if monitor is not None else None,
        "mem_limit": monitor.memory_limit if monitor is not None else None,
        "mem_alarm": "memory" in node.alarms,
        "disk_free": monitor.disk_free if monitor is not None else None,
        "disk_free_limit": monitor.disk_limit if monitor is not None and monitor.disk_path else None,
        "disk_free_alarm": "disk" in node.alarms,
        "mem_calculation_strategy": "rss",
        "fd_used": descriptors_open(),
        "fd_total": open_files,
        "sockets_used": node.connections_open,
        "sockets_total": node.limits.max_connections or node.socket_limit or open_files,
        "processors": len(os.sched_getaffinity(0)),
        "rates_mode": "basic",
        "partitions": [],
        "cluster_links": [],
        "exchange_types": exchange_types(node),
        "auth_mechanisms": [
            {"name": name, "description": _MECHANISMS[name], "enabled": name in node.auth_mechanisms}
            for name in _MECHANISMS
        ],
        **call.sampler.churn(),
    }
    for stat in ("mem_used", "fd_used", "sockets_used", "disk_free"):
        view[f"{stat}_details"] = {"rate": call.sampler.node_rate(stat)}
    views = [view]
    cluster = call.context.cluster
    if cluster is not None:
        # Every node of the cluster: this one (the leader) with its readings, the others as etcd
        # knows them, each with its place in the cluster (``postroom_cluster``).
        views = [{**view, **member} if member["name"] == view["name"] else member for member in cluster.members()]
    if "node" not in call.params:
        return 200, views
    for shown in views:
        if call.params["node"] == shown["name"]:
            return 200, shown
    raise not_found()


#: The login mechanisms Postroom has, with the descriptions RabbitMQ gives them.
_MECHANISMS = {
    "PLAIN": "SASL PLAIN authentication mechanism",
    "AMQPLAIN": "QPid AMQPLAIN mechanism",
    "EXTERNAL": (
        "TLS peer verification-based authentication plugin. Used in combination with the EXTERNAL SASL mechanism."
    ),
}


def vhosts(call: Call) -> Answer:
    """``/api/vhosts`` (every vhost to a monitoring user too) or ``/api/vhosts/NAME``
    (administrators only, as RabbitMQ 3.10)."""
    name = call.params.get("vhost")
    if name is None:
        shown = call.context.vhosts(call.user, visible=True)
    elif "administrator" not in call.user.tags:
        raise not_authorised("Not administrator user")
    else:
        shown = call.context.vhosts(call.user, name)
    views = [vhost_view(call.sampler, vhost) for vhost in shown]
    return 200, views if name is None else views[0]


def vhost_view(sampler: RateSampler, vhost: VirtualHost) -> dict[str, Any]:
    """A vhost as RabbitMQ 3.10 shows it: message counts once it has queues, ``message_stats``
    once it has had traffic, and the bytes its connections received and sent."""
    view: dict[str, Any] = {
        "name": vhost.name,
        "description": vhost.description,
        "tags": list(vhost.tags),
        "default_queue_type": "undefined",
        "metadata": {"description": vhost.description, "tags": list(vhost.tags)},
        "tracing": False,
        "cluster_state": {node_name(): "running"},
    }
    if vhost.queues:
        view.update(queue_totals(sampler, [(vhost, queue) for queue in vhost.queues.values()]))
    stats = vhost_stats(sampler, [vhost])
    if stats:  # (as RabbitMQ: once it has had traffic)
        view["message_stats"] = stats
    received, sent = sampler.vhost_bytes.get(vhost.name, (0, 0))
    for connection in (*sampler.node.connections, *sampler.node.stream_connections, *sampler.node.mqtt_connections):
        if connection.vhost is vhost:  # (and what they did since the last sample)
            before = sampler.sampled_bytes(connection)
            received += connection.recv_oct - before[0]
            sent += connection.send_oct - before[1]
    if received or sent:
        rates = sampler.vhost_byte_rates(vhost.name)
        view.update(
            recv_oct=received, recv_oct_details={"rate": rates[0]}, send_oct=sent, send_oct_details={"rate": rates[1]}
        )
    return view


def unacked_bytes(node: Node) -> dict[Any, int]:
    """Body bytes of each queue's unacknowledged deliveries (one pass over every channel's)."""
    found: dict[Any, int] = {}
    for connection in node.connections:
        for channel in connection.channels.values():
            for entry in channel.consuming.unacked_entries():
                found[entry.queue] = found.get(entry.queue, 0) + entry.message.size
    return found


def queue_view(
    sampler: RateSampler, vhost: VirtualHost, queue: Queue, unacked: dict[Any, int] | None = None
) -> dict[str, Any]:
    """A queue as RabbitMQ's ``/api/queues`` shows it. ``unacked``: :func:`unacked_bytes`, when
    the answer shows several queues (found once for all of them)."""
    name = queue.name
    rate = sampler.rate
    active = queue.active_consumer
    counts = queue_counts(queue)
    stats = with_rates(counts, {stat: rate(vhost.name, name, stat) for stat in counts})
    ready, unacked_count = queue.message_count, queue.unacked_count
    view = {
        "name": name,
        "vhost": vhost.name,
        "node": node_name(),
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive,
        "type": queue.kind,
        "arguments": queue.arguments,
        "messages": ready + unacked_count,
        "messages_ready": ready,
        "messages_unacknowledged": unacked_count,
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
        view.update(members=[node_name()], online=[node_name()], readers={node_name(): queue.consumer_count})
        view["state"] = "running"
    elif isinstance(queue, WorkQueue):
        view["single_active_consumer_tag"] = active.tag if active is not None else None
        view["exclusive_consumer_tag"] = next((c.tag for c in queue.consumers if c.exclusive), None)
        if unacked is None:
            unacked = unacked_bytes(sampler.node) if unacked_count else {}
        view.update(_held(sampler, vhost, queue, unacked.get(queue, 0)))
    return view


def _held(sampler: RateSampler, vhost: VirtualHost, queue: WorkQueue, unacked_size: int) -> dict[str, Any]:
    """What a classic queue holds, as RabbitMQ 3.10 counts it: messages and body bytes, ready
    and unacknowledged, in memory and paged out (to the log, here), with the counts' rates
    of change; the head message's timestamp."""
    ready, unacked = queue.message_count, queue.unacked_count
    ready_rate = sampler.rate(vhost.name, queue.name, "messages_ready")
    unacked_rate = sampler.rate(vhost.name, queue.name, "messages_unacknowledged")
    ready_size = queue.ready.queued_bytes
    ready_in_memory, ready_bytes_in_memory = queue.ready.memory_use
    return {
        "state": "running",
        "messages_details": {"rate": ready_rate + unacked_rate},
        "messages_ready_details": {"rate": ready_rate},
        "messages_unacknowledged_details": {"rate": unacked_rate},
        "messages_ram": ready_in_memory + unacked,
        "messages_ready_ram": ready_in_memory,
        "messages_unacknowledged_ram": unacked,
        "messages_paged_out": ready - ready_in_memory,
        "message_bytes": ready_size + unacked_size,
        "message_bytes_ready": ready_size,
        "message_bytes_unacknowledged": unacked_size,
        "message_bytes_ram": ready_bytes_in_memory + unacked_size,
        "message_bytes_paged_out": ready_size - ready_bytes_in_memory,
        "head_message_timestamp": _head_timestamp(queue),
        "recoverable_slaves": None,
    }


def _head_timestamp(queue: WorkQueue) -> int | None:
    """The ``timestamp`` property of the queue's first ready message, in seconds (RabbitMQ's
    ``head_message_timestamp``); ``None`` when it has none, or the queue is a stream."""
    if not queue.message_count:
        return None
    head = queue.ready.peek(1)
    if not head:
        return None
    stamp = head[0].message.properties.timestamp
    return int(stamp.timestamp()) if stamp is not None else None


def consumer_view(vhost: VirtualHost, queue: Queue, consumer: Consumer) -> dict[str, Any]:
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


def consumers(call: Call) -> Answer:
    """``GET /api/consumers[/VHOST]``: every consumer of the vhosts the user sees."""
    return 200, [
        consumer_view(vhost, queue, consumer)
        for vhost in call.context.vhosts(call.user, call.params.get("vhost"))
        for queue in sorted(vhost.queues.values(), key=lambda q: q.name)
        for consumer in queue.consumers
    ]


def queues(call: Call) -> Answer:
    user, params = call.user, call.params
    if "queue" in params:
        vhost = call.context.vhosts(user, params["vhost"])[0]
        queue = call.context.queue(user, params["vhost"], params["queue"])
        view = queue_view(call.sampler, vhost, queue)
        view["consumer_details"] = [consumer_view(vhost, queue, c) for c in queue.consumers]
        if not isinstance(queue, StreamQueue):
            # (per publisher and per channel in RabbitMQ's "detailed" rates mode; "basic" here)
            view.update(incoming=[], deliveries=[])
        return 200, view
    vhosts = call.context.vhosts(user, params.get("vhost"))
    if "page" in call.query:
        shown = [(vhost, queue) for vhost in vhosts for queue in vhost.queues.values()]
    else:
        shown = [(vhost, queue) for vhost in vhosts for queue in sorted(vhost.queues.values(), key=lambda q: q.name)]
    if "page" not in call.query:
        unacked = unacked_bytes(call.node)
        return 200, [queue_view(call.sampler, vhost, queue, unacked) for vhost, queue in shown]
    # A page: views are built for the queues shown only (50,000 queues answer in milliseconds).
    found: list[dict[Any, int]] = []  # (the unacknowledged bytes, found for the first view built)

    def build(pair: tuple[VirtualHost, Queue]) -> dict[str, Any]:
        if not found:
            found.append(unacked_bytes(call.node))
        return queue_view(call.sampler, *pair, found[0])

    return 200, Lazy(shown, build, QUEUE_FIELDS)


#: Of a ``(vhost, queue)``, the fields of its view a page sorts and filters by without building it.
QUEUE_FIELDS: dict[str, Callable[[tuple[VirtualHost, Queue]], Any]] = {
    "name": lambda pair: pair[1].name,
    "vhost": lambda pair: pair[0].name,
    "messages_ready": lambda pair: pair[1].message_count,
    "messages_unacknowledged": lambda pair: pair[1].unacked_count,
    "messages": lambda pair: pair[1].message_count + pair[1].unacked_count,
    "consumers": lambda pair: pair[1].consumer_count,
    "durable": lambda pair: pair[1].durable,
    "auto_delete": lambda pair: pair[1].auto_delete,
}


def exchange_definition(vhost: VirtualHost, exchange: Exchange) -> dict[str, Any]:
    """An exchange as a definitions file has it (and its object in the API begins)."""
    return {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.type_name,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": dict(exchange.arguments),
    }


def exchange_view(sampler: RateSampler, vhost: VirtualHost, exchange: Exchange) -> dict[str, Any]:
    view = exchange_definition(vhost, exchange)
    if exchange.policy is not None:  # as RabbitMQ: only when one applies
        view["policy"] = exchange.policy.name
    stats = sampler.exchange_stats(vhost.name, exchange.name, exchange.published_in, exchange.published_out)
    if stats:
        view["message_stats"] = stats
    return view


def default_exchange_view(sampler: RateSampler, vhost: VirtualHost) -> dict[str, Any]:
    """The default exchange, which RabbitMQ lists as ``""`` (and finds as ``amq.default``)."""
    view = {
        "name": "",
        "vhost": vhost.name,
        "type": "direct",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
    }
    stats = sampler.exchange_stats(vhost.name, "", *vhost.default_exchange_counts())
    if stats:
        view["message_stats"] = stats
    return view


def exchanges(call: Call) -> Answer:
    user, params = call.user, call.params
    if "exchange" in params:
        vhost = call.context.vhosts(user, params["vhost"])[0]
        name = params["exchange"]
        if name == "amq.default":
            view = default_exchange_view(call.sampler, vhost)
        else:
            exchange = vhost.exchanges.get(name)
            if exchange is None:
                raise not_found()
            view = exchange_view(call.sampler, vhost, exchange)
        view.update(incoming=[], outgoing=[])  # (per channel and per queue in RabbitMQ's "detailed" mode)
        return 200, view
    views = []
    for vhost in call.context.vhosts(user, params.get("vhost")):
        views.append(default_exchange_view(call.sampler, vhost))
        views += [
            exchange_view(call.sampler, vhost, exchange) for exchange in vhost.exchanges.values() if exchange.name
        ]
    return 200, views


def bindings(call: Call) -> Answer:
    shown = call.context.vhosts(call.user, call.params.get("vhost"))
    return 200, [binding for vhost in shown for binding in vhost_bindings(vhost)]


def queue_bindings(call: Call) -> Answer:
    """``GET /api/queues/VHOST/NAME/bindings``: the default exchange's, then each exchange's
    bindings to the queue (the exchanges it is bound from only are looked at)."""
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    queue = vhost.queues.get(call.params["queue"])
    if queue is None:
        raise not_found()
    result = [binding_view(vhost, "", queue.name, True, queue.name, {})]
    for source in sorted(queue.sources, key=lambda exchange: exchange.name):
        for destination, routing_key, arguments in source.router.bindings():
            if destination is queue:
                result.append(binding_view(vhost, source.name, queue.name, True, routing_key, dict(arguments)))
    return 200, result


def exchange_bindings(call: Call) -> Answer:
    """``GET /api/exchanges/VHOST/NAME/bindings/source`` (the exchange's own bindings) or
    ``.../destination`` (the exchange-to-exchange bindings into it)."""
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    name = call.params["exchange"]
    name = "" if name == "amq.default" else name
    if name not in vhost.exchanges:
        return 200, []  # (RabbitMQ lists no bindings for an exchange that is not there)
    if call.request.path.endswith(b"/source"):
        return 200, [binding for binding in vhost_bindings(vhost) if binding["source"] == name]
    return 200, [
        binding
        for binding in vhost_bindings(vhost)
        if binding["destination_type"] == "exchange" and binding["destination"] == name
    ]


def vhost_bindings(vhost: VirtualHost) -> list[dict[str, Any]]:
    """Every binding of ``vhost``: first the default exchange's to each queue (by its name,
    as RabbitMQ lists them), then those of each exchange."""
    result = [binding_view(vhost, "", name, True, name, {}) for name in sorted(vhost.queues)]
    for exchange in vhost.exchanges.values():
        if exchange.name == "":
            continue
        for destination, routing_key, arguments in exchange.router.bindings():
            is_queue = hasattr(destination, "kind")  # a queue of any kind (exchanges have none)
            name = destination.name  # type: ignore[attr-defined]
            result.append(binding_view(vhost, exchange.name, name, is_queue, routing_key, dict(arguments)))
    return result


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """What names one binding in a path: its routing key (``~`` alone for an empty key and
    no arguments), then ``~`` and a hash of its arguments when it has any."""
    if not arguments:
        return quoted(routing_key) if routing_key else "~"
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode()).digest()[:4]
    return f"{quoted(routing_key)}~{quoted(base64.urlsafe_b64encode(digest).decode().rstrip('='))}"


def quoted(text: str) -> str:
    """``text`` as RabbitMQ quotes a binding's key for a path (``quote_plus``, ``~`` too)."""
    return quote_plus(text, safe="").replace("~", "%7E")


def binding_view(
    vhost: VirtualHost, source: str, destination: str, is_queue: bool, key: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost.name,
        "destination": destination,
        "destination_type": "queue" if is_queue else "exchange",
        "routing_key": key,
        "arguments": arguments,
        "properties_key": properties_key(key, arguments),
    }


def connection_view(node: Node, sampler: RateSampler, connection: ServerConnection) -> dict[str, Any]:
    view = {
        "name": connection.peer,
        "node": node_name(),
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "user": connection.user_name,
        "user_who_performed_action": connection.user_name,
        "vhost": connection.vhost.name if connection.vhost is not None else None,
        "channels": len(connection.channels),
        "frame_max": connection.frame_max,
        "channel_max": connection.channel_max,
        "timeout": connection.heartbeat,
        "client_properties": connection.client_properties,
        "state": connection_state(node, connection),
    }
    name = connection.client_properties.get("connection_name")
    if isinstance(name, str):  # (as RabbitMQ: only when the client gave one)
        view["user_provided_name"] = name
    view.update(socket_fields(sampler, connection))
    return view


def mqtt_connection_view(sampler: RateSampler, connection: MqttConnection) -> dict[str, Any]:
    """An MQTT connection as ``/api/connections`` shows it: RabbitMQ 3.10's fields for one
    (its MQTT plugin's connections are direct AMQP ones, of up to two channels; an MQTT
    connection here has none)."""
    vhost = connection.vhost
    view = {
        "name": connection.peer,
        "node": node_name(),
        "type": "direct",
        "protocol": connection.protocol,
        "user": connection.user_name,
        "user_who_performed_action": connection.user_name,
        "vhost": vhost.name if vhost is not None else None,
        "channels": 0,
        "channel_max": 1,
        "frame_max": 0,
        "client_properties": {"client_id": connection.client_id, "product": "MQTT client"},
        "variable_map": {"client_id": connection.client_id},
        "state": "blocked" if connection.blocked else "running",
    }
    socket = socket_fields(sampler, connection)
    view.update((key, value) for key, value in socket.items() if key in _MQTT_SOCKET_FIELDS)
    return view


#: The socket's fields RabbitMQ 3.10 shows for an MQTT connection (a direct connection: no
#: login mechanism or TLS details).
_MQTT_SOCKET_FIELDS = frozenset(
    {"host", "port", "peer_host", "peer_port", "connected_at", "ssl", "recv_oct", "recv_oct_details"}
    | {"recv_cnt", "send_oct", "send_oct_details", "send_cnt", "send_pend"}
)


def _connections(call: Call) -> list[ServerConnection]:
    """The connections the user sees, of the path's vhost or connection when it names one
    (404 for a vhost or a connection that is not there)."""
    shown = sorted(call.context.visible_connections(call.user), key=lambda c: c.peer)
    if "vhost" in call.params:
        vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
        shown = [connection for connection in shown if connection.vhost is vhost]
    if "connection" in call.params:
        shown = [connection for connection in shown if connection.peer == call.params["connection"]]
        if not shown:
            raise not_found()
    return shown


def connections(call: Call) -> Answer:
    """``/api/connections``, ``/api/vhosts/VHOST/connections``, ``/api/connections/NAME``: AMQP's
    and the stream protocol's, by name."""
    streaming = stream_connections_shown(call, required=False)
    if "connection" in call.params and streaming:
        return 200, stream_connection_view(call.sampler, streaming[0])
    mqtt = call.context.visible_mqtt_connections(call.user)
    if "vhost" in call.params:
        vhost = call.params["vhost"]
        mqtt = [connection for connection in mqtt if connection.vhost is not None and connection.vhost.name == vhost]
    if "connection" in call.params:
        named = [connection for connection in mqtt if connection.peer == call.params["connection"]]
        if named:
            return 200, mqtt_connection_view(call.sampler, named[0])
    views = [connection_view(call.node, call.sampler, connection) for connection in _connections(call)]
    if "connection" in call.params:
        return 200, views[0]
    views += [stream_connection_view(call.sampler, connection) for connection in streaming]
    views += [mqtt_connection_view(call.sampler, connection) for connection in mqtt]
    return 200, sorted(views, key=lambda view: view["name"])


def connection_state(node: Node, connection: ServerConnection) -> str:
    """RabbitMQ's ``state`` of a connection: ``blocked`` once it published under an alarm and
    is no longer read, ``blocking`` while an alarm is in force and it has not published yet,
    ``flow`` while the node slows every client down to the pace of deliveries (see
    ``broker.core.node.Node.flow``), else ``running``."""
    if connection.blocked:
        return "blocked"
    if node.alarms:
        return "blocking"
    return "flow" if node.flow else "running"


def channel_view(
    node: Node, sampler: RateSampler, connection: ServerConnection, number: int, channel: ChannelState
) -> dict[str, Any]:
    consuming, confirms = channel.consuming, channel.confirms
    socket = connection.socket
    details: dict[str, Any] = {"name": connection.peer}
    if socket is not None:
        details.update(peer_host=socket.peer_host, peer_port=socket.peer_port)
    view = {
        "name": f"{connection.peer} ({number})",
        "number": number,
        "node": node_name(),
        "connection_details": details,
        "user": connection.user_name,
        "user_who_performed_action": connection.user_name,
        "vhost": connection.vhost.name if connection.vhost is not None else None,
        "state": "flow" if node.flow else "running",
        "consumer_count": len(consuming.consumers),
        "messages_unacknowledged": consuming.unacked_count,
        "messages_unconfirmed": confirms.unconfirmed if confirms is not None else 0,
        "messages_uncommitted": channel.tx_messages,
        "acks_uncommitted": channel.tx_acks,
        "prefetch_count": consuming.prefetch_consumer,
        "global_prefetch_count": consuming.prefetch_global,
        "confirm": confirms is not None,
        "transactional": bool(channel.transactional),
        "pending_raft_commands": 0,  # (no quorum queues here: nothing waits for a raft log)
    }
    stats = with_rates(channel_counts(channel), sampler.channel_rates(channel), families=True)
    if stats:  # (as RabbitMQ: once it has had traffic)
        view["message_stats"] = stats
    return view


def channels(call: Call) -> Answer:
    """``/api/channels``, ``/api/vhosts/VHOST/channels``, ``/api/connections/NAME/channels``
    and ``/api/channels/NAME`` (one, by its name: ``CONNECTION (NUMBER)``)."""
    views = [
        channel_view(call.node, call.sampler, connection, number, channel)
        for connection in _connections(call)
        for number, channel in sorted(connection.channels.items())
    ]
    if "channel" in call.params:
        views = [view for view in views if view["name"] == call.params["channel"]]
        if not views:
            raise not_found()
        return 200, views[0]
    return 200, views

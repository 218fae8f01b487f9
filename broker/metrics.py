"""Prometheus metrics: a collector that reads the broker's state at scrape time, served by twisted.web.

Nothing here runs per message. Queues and virtual hosts keep plain integer counters
(``WorkQueue.published``, ``delivered``, ``acked``, ...), and :class:`BrokerCollector` turns
them into metric families when Prometheus scrapes ``/metrics``, on the reactor thread, so it
reads a consistent state without locks. Names and labels are those of ``CONTRACT.md``
(prefix ``postroom_``, labels ``vhost``, ``queue``, ``reason`` only).

With ``rabbitmq_compatible``, the collector also exports the ``rabbitmq_*`` series that
RabbitMQ's own Grafana dashboard (RabbitMQ-Overview, Grafana ID 10991) reads, computed from
the same counters, so a team moving from RabbitMQ keeps its dashboards.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from twisted.web.resource import Resource
from twisted.web.server import Request

from broker.alarms import disk_free, memory_total, resident_memory
from broker.core.deadletter import DeadLetterReason
from broker.core.histogram import Histogram

if TYPE_CHECKING:
    from broker.core.node import Node
    from broker.service import WALService

_QUEUE_LABELS = ["vhost", "queue"]


def _histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], histogram.cumulative(), histogram.sum)
    return family


class BrokerCollector:
    """Metric families of one broker node, read from its state at each scrape.

    :param node: the broker node (virtual hosts, queues, connections, counters)
    :param wal: the log writer, for ``postroom_wal_*``; ``None`` when nothing is persisted
    :param rabbitmq_compatible: also export the ``rabbitmq_*`` names of RabbitMQ's dashboards
    :param node_name: the ``rabbitmq_node`` label of ``rabbitmq_identity_info``
    """

    def __init__(
        self,
        node: Node,
        wal: WALService | None = None,
        rabbitmq_compatible: bool = False,
        node_name: str = "postroom@localhost",
    ) -> None:
        self.node = node
        self.wal = wal
        self.rabbitmq_compatible = rabbitmq_compatible
        self.node_name = node_name

    def collect(self) -> Iterator[Metric]:
        """Every metric family, computed now (called by the registry on the reactor thread)."""
        yield from self._queues()
        yield from self._vhosts()
        yield from self._node()
        if self.wal is not None:
            yield from self._wal(self.wal)
        if self.rabbitmq_compatible:
            yield from RabbitMQNames(self).collect()

    def _queues(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily("postroom_queue_messages_ready", "Messages ready for delivery.", labels=_QUEUE_LABELS)
        unacked = GaugeMetricFamily(
            "postroom_queue_messages_unacked", "Messages delivered and not yet acknowledged.", labels=_QUEUE_LABELS
        )
        consumers = GaugeMetricFamily("postroom_queue_consumers", "Consumers of the queue.", labels=_QUEUE_LABELS)
        enqueued = CounterMetricFamily(
            "postroom_queue_messages_published_total", "Messages routed into the queue.", labels=_QUEUE_LABELS
        )
        delivered = CounterMetricFamily(
            "postroom_messages_delivered_total",
            "Deliveries to consumers and basic.get, redeliveries included.",
            labels=_QUEUE_LABELS,
        )
        acked = CounterMetricFamily(
            "postroom_messages_acked_total", "Deliveries acknowledged by clients.", labels=_QUEUE_LABELS
        )
        redelivered = CounterMetricFamily(
            "postroom_messages_redelivered_total",
            "Messages returned to the queue for another delivery (requeue, visibility timeout, channel closed).",
            labels=_QUEUE_LABELS,
        )
        timeouts = CounterMetricFamily(
            "postroom_visibility_timeouts_total",
            "Deliveries taken back because their visibility timeout passed.",
            labels=_QUEUE_LABELS,
        )
        dead = CounterMetricFamily(
            "postroom_messages_dead_lettered_total",
            "Messages dead-lettered out of the queue, by reason.",
            labels=[*_QUEUE_LABELS, "reason"],
        )
        for vhost in self.node.vhosts.values():
            for queue in vhost.queues.values():
                labels = [vhost.name, queue.name]
                ready.add_metric(labels, queue.message_count)
                unacked.add_metric(labels, queue.unacked_count)
                consumers.add_metric(labels, queue.consumer_count)
                enqueued.add_metric(labels, queue.published)
                delivered.add_metric(labels, queue.delivered)
                acked.add_metric(labels, queue.acked)
                redelivered.add_metric(labels, queue.redelivered)
                timeouts.add_metric(labels, queue.visibility_timeouts)
                for reason in DeadLetterReason:
                    dead.add_metric([*labels, reason.value], queue.dead_lettered.get(reason, 0))
        yield from (ready, unacked, consumers, enqueued, delivered, acked, redelivered, timeouts, dead)

    def _vhosts(self) -> Iterator[Metric]:
        published = CounterMetricFamily(
            "postroom_messages_published_total", "Messages published by clients.", labels=["vhost"]
        )
        unroutable = CounterMetricFamily(
            "postroom_messages_unroutable_total", "Published messages that no queue took.", labels=["vhost"]
        )
        dropped = CounterMetricFamily(
            "postroom_dead_letters_dropped_total",
            "Dead-lettered messages dropped: missing dead-letter exchange, no route, or a cycle.",
            labels=["vhost"],
        )
        latency = HistogramMetricFamily(
            "postroom_publish_to_deliver_seconds",
            "Seconds from a message's arrival in a queue to its delivery (one message in 1024 sampled).",
            labels=["vhost"],
        )
        for vhost in self.node.vhosts.values():
            published.add_metric([vhost.name], vhost.published)
            unroutable.add_metric([vhost.name], vhost.unroutable)
            dropped.add_metric([vhost.name], vhost.dead_letters_dropped)
            latency.add_metric([vhost.name], vhost.latency.cumulative(), vhost.latency.sum)
        yield from (published, unroutable, dropped, latency)

    def _node(self) -> Iterator[Metric]:
        counters = self.node.counters
        yield CounterMetricFamily(
            "postroom_stale_acks_total",
            "Acks, nacks and rejects of deliveries already taken back by a visibility timeout.",
            value=counters["stale_acks"],
        )
        yield CounterMetricFamily(
            "postroom_stale_extends_total",
            "Lease extensions refused: stale or unknown delivery tag, or malformed headers.",
            value=counters["stale_extends"],
        )
        yield CounterMetricFamily(
            "postroom_auth_attempts_total",
            "Logins checked (AMQP connections and management API requests).",
            value=counters["auth_attempts"],
        )
        yield CounterMetricFamily(
            "postroom_auth_attempts_failed_total", "Logins refused.", value=counters["auth_failures"]
        )
        alarm = GaugeMetricFamily(
            "postroom_alarm", "1 while the resource's alarm is in force (publishers are blocked).", labels=["resource"]
        )
        for kind in ("memory", "disk"):
            alarm.add_metric([kind], kind in self.node.alarms)
        yield alarm
        monitor = self.node.resource_monitor
        if monitor is not None:
            yield GaugeMetricFamily("postroom_memory_used_bytes", "Resident memory.", value=monitor.memory_used)
            yield GaugeMetricFamily(
                "postroom_memory_watermark_bytes", "The memory alarm's watermark.", value=monitor.memory_limit
            )
            if monitor.disk_free is not None:
                yield GaugeMetricFamily(
                    "postroom_disk_free_bytes", "Free space where the log is.", value=monitor.disk_free
                )
                yield GaugeMetricFamily(
                    "postroom_disk_free_limit_bytes", "The disk alarm's free-space limit.", value=monitor.disk_limit
                )
        connections = self.node.connections
        yield GaugeMetricFamily("postroom_connections", "Open AMQP connections.", value=len(connections))
        yield GaugeMetricFamily(
            "postroom_channels", "Open AMQP channels.", value=sum(len(c.channels) for c in connections)
        )

    def _wal(self, wal: WALService) -> Iterator[Metric]:
        yield GaugeMetricFamily("postroom_wal_bytes", "Bytes in the write-ahead log's segment files.", value=wal.size)
        yield GaugeMetricFamily("postroom_wal_segments", "Segment files of the write-ahead log.", value=wal.segments)
        yield CounterMetricFamily(
            "postroom_wal_segments_retired_total", "Segments retired (deleted or archived).", value=wal.retired
        )
        yield GaugeMetricFamily(
            "postroom_wal_alarm", "1 while writes to the log fail (confirms are refused).", value=wal.alarm is not None
        )
        yield _histogram(
            "postroom_wal_fsync_seconds", "Seconds each group commit took (write and fsync).", wal.fsync_seconds
        )


class RabbitMQNames:
    """The ``rabbitmq_*`` series that RabbitMQ's Overview dashboard (Grafana ID 10991) reads.

    Every one of the dashboard's 35 names is exported, from Postroom's own counters: RabbitMQ's
    per-node aggregates are sums over queues and virtual hosts. ``rabbitmq_identity_info``
    carries ``rabbitmq_node`` and ``rabbitmq_cluster`` (the dashboard joins on ``instance``,
    which Prometheus adds). Process figures come from ``/proc`` where it exists.
    """

    def __init__(self, collector: BrokerCollector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        node = self.collector.node
        vhosts = list(node.vhosts.values())
        queues = [queue for vhost in vhosts for queue in vhost.queues.values()]
        connections = node.connections
        channels = [channel for connection in connections for channel in connection.channels.values()]
        counters = node.counters
        name = self.collector.node_name
        identity = GaugeMetricFamily(
            "rabbitmq_identity_info", "Node and cluster identity.", labels=["rabbitmq_node", "rabbitmq_cluster"]
        )
        identity.add_metric([name, name], 1)
        yield identity
        build = GaugeMetricFamily(
            "rabbitmq_build_info",
            "Build information (Postroom's version; no Erlang).",
            labels=["rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version", "erlang_version"],
        )
        build.add_metric([node.version, node.version, node.version, "none"], 1)
        yield build

        def total(items: list[Any], attribute: str) -> int:
            return sum(getattr(item, attribute) for item in items)

        ready, unacked = total(queues, "message_count"), total(queues, "unacked_count")
        unconfirmed = sum(c._publish_seq - c.confirmed_upto for c in channels if c.confirm)
        monitor = node.resource_monitor
        rss = resident_memory()
        limit = monitor.memory_limit if monitor is not None else memory_total()
        disk = _disk_free(self.collector.wal)
        open_fds, max_fds = _fds()
        sockets = len(connections)
        gauges = {
            "rabbitmq_queue_messages_ready": ("Messages ready to be delivered.", ready),
            "rabbitmq_queue_messages_unacked": ("Messages delivered and not acknowledged.", unacked),
            "rabbitmq_queue_messages": ("Messages ready and unacknowledged.", ready + unacked),
            "rabbitmq_queues": ("Queues.", len(queues)),
            "rabbitmq_consumers": ("Consumers.", total(queues, "consumer_count")),
            "rabbitmq_channel_consumers": ("Consumers on channels.", sum(len(c.consumers) for c in channels)),
            "rabbitmq_connections": ("Open connections.", len(connections)),
            "rabbitmq_channels": ("Open channels.", len(channels)),
            "rabbitmq_channel_messages_unconfirmed": ("Publishes not confirmed yet.", unconfirmed),
            "rabbitmq_process_resident_memory_bytes": ("Resident memory.", rss),
            "rabbitmq_resident_memory_limit_bytes": ("The memory alarm's watermark.", limit),
            "rabbitmq_disk_space_available_bytes": ("Free disk space where the log is.", disk),
            "rabbitmq_disk_space_available_limit_bytes": (
                "The disk alarm's free-space limit.",
                monitor.disk_limit if monitor is not None else 0,
            ),
            "rabbitmq_alarms_memory_used_watermark": ("1 while the memory alarm is in force.", "memory" in node.alarms),
            "rabbitmq_alarms_free_disk_space_watermark": ("1 while the disk alarm is in force.", "disk" in node.alarms),
            "rabbitmq_process_open_fds": ("Open file descriptors.", open_fds),
            "rabbitmq_process_max_fds": ("File descriptor limit.", max_fds),
            "rabbitmq_process_open_tcp_sockets": ("Open AMQP sockets.", sockets),
            "rabbitmq_process_max_tcp_sockets": ("Socket limit (the file descriptor limit).", max_fds),
        }
        for metric, (documentation, value) in gauges.items():
            yield GaugeMetricFamily(metric, documentation, value=value)
        published, unroutable = total(vhosts, "published"), total(vhosts, "unroutable")
        returned, delivered = total(vhosts, "returned"), total(queues, "delivered")
        gets = total(vhosts, "gets")
        counts = {
            "rabbitmq_channel_messages_published_total": ("Messages published.", published),
            "rabbitmq_channel_messages_confirmed_total": ("Publishes confirmed.", total(vhosts, "confirmed")),
            "rabbitmq_queue_messages_published_total": ("Messages routed into queues.", total(queues, "published")),
            "rabbitmq_channel_messages_unroutable_dropped_total": ("Unroutable, dropped.", unroutable - returned),
            "rabbitmq_channel_messages_unroutable_returned_total": ("Unroutable, returned.", returned),
            # Postroom counts consume and get deliveries together; the dashboard adds these up.
            "rabbitmq_channel_messages_delivered_total": ("Deliveries without ack.", 0),
            "rabbitmq_channel_messages_delivered_ack_total": ("Deliveries (consume and get).", delivered - gets),
            "rabbitmq_channel_get_total": ("basic.get without ack.", 0),
            "rabbitmq_channel_get_ack_total": ("basic.get answered with a message.", gets),
            "rabbitmq_channel_get_empty_total": ("basic.get answered empty.", total(vhosts, "gets_empty")),
            "rabbitmq_channel_messages_redelivered_total": ("Redeliveries.", total(queues, "redelivered")),
            "rabbitmq_channel_messages_acked_total": ("Acknowledgements.", total(queues, "acked")),
            "rabbitmq_queues_declared_total": ("Queues created.", total(vhosts, "queues_created")),
            "rabbitmq_queues_created_total": ("Queues created.", total(vhosts, "queues_created")),
            "rabbitmq_queues_deleted_total": ("Queues deleted.", total(vhosts, "queues_deleted")),
            "rabbitmq_channels_opened_total": ("Channels opened.", counters["channels_opened"]),
            "rabbitmq_channels_closed_total": ("Channels closed.", counters["channels_closed"]),
            "rabbitmq_connections_opened_total": ("Connections opened.", counters["connections_opened"]),
            "rabbitmq_connections_closed_total": ("Connections closed.", counters["connections_closed"]),
            "rabbitmq_auth_attempts_total": ("Logins checked.", counters["auth_attempts"]),
            "rabbitmq_auth_attempts_failed_total": ("Logins refused.", counters["auth_failures"]),
            "rabbitmq_auth_attempts_succeeded_total": ("Logins accepted.", counters["auth_successes"]),
        }
        for metric, (documentation, value) in counts.items():
            yield CounterMetricFamily(metric, documentation, value=max(0, value))


def _disk_free(wal: WALService | None) -> int:
    path = getattr(getattr(wal, "wal", None), "storage", None)
    try:
        return disk_free(getattr(path, "path", "."))
    except OSError:
        return 0


def _fds() -> tuple[int, int]:
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    return open_fds, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def make_registry(collector: BrokerCollector) -> CollectorRegistry:
    """A registry holding only this broker's collector (no process-global state)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return registry


class MetricsResource(Resource):
    """``GET /metrics`` in Prometheus's text format, rendered on the reactor thread."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self.registry = registry

    def render_GET(self, request: Request) -> bytes:  # noqa: N802 (twisted.web calls it)
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode())
        return generate_latest(self.registry)


def metrics_site(registry: CollectorRegistry, reactor: Any = None) -> Any:
    """A twisted.web ``Site`` serving ``/metrics`` (and 404 elsewhere; its timeouts on
    ``reactor``, the global one by default)."""
    from broker.http import BoundedSite

    root = Resource()
    root.putChild(b"metrics", MetricsResource(registry))
    return BoundedSite(root, reactor=reactor)

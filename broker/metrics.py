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
    """The ``rabbitmq_*`` series of RabbitMQ's Prometheus plugin that its Overview dashboard reads.

    Values come from Postroom's counters; RabbitMQ's per-node aggregates are sums over queues.
    Series whose meaning has no equivalent here (Erlang VM internals) are not invented.
    """

    def __init__(self, collector: BrokerCollector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        node = self.collector.node
        queues = [queue for vhost in node.vhosts.values() for queue in vhost.queues.values()]
        connections = node.connections
        identity = GaugeMetricFamily(
            "rabbitmq_identity_info",
            "RabbitMQ node and cluster identity (Postroom: one node, its own cluster).",
            labels=["rabbitmq_node", "rabbitmq_cluster"],
        )
        identity.add_metric([self.collector.node_name, self.collector.node_name], 1)
        yield identity
        build = GaugeMetricFamily(
            "rabbitmq_build_info", "Build information.", labels=["rabbitmq_version", "prometheus_plugin_version"]
        )
        build.add_metric([node.version, node.version], 1)
        yield build

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, value=value)

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, documentation, value=value)

        ready = sum(queue.message_count for queue in queues)
        unacked = sum(queue.unacked_count for queue in queues)
        yield gauge("rabbitmq_queue_messages_ready", "Messages ready to be delivered.", ready)
        yield gauge("rabbitmq_queue_messages_unacked", "Messages delivered and not acknowledged.", unacked)
        yield gauge("rabbitmq_queue_messages", "Messages ready and unacknowledged.", ready + unacked)
        yield gauge("rabbitmq_queues", "Queues available.", len(queues))
        yield gauge("rabbitmq_consumers", "Consumers.", sum(queue.consumer_count for queue in queues))
        yield gauge("rabbitmq_connections", "Connections currently open.", len(connections))
        yield gauge("rabbitmq_channels", "Channels currently open.", sum(len(c.channels) for c in connections))
        published = sum(vhost.published for vhost in node.vhosts.values())
        unroutable = sum(vhost.unroutable for vhost in node.vhosts.values())
        delivered = sum(queue.delivered for queue in queues)
        acked = sum(queue.acked for queue in queues)
        redelivered = sum(queue.redelivered for queue in queues)
        yield counter("rabbitmq_channel_messages_published_total", "Messages published.", published)
        yield counter("rabbitmq_global_messages_received_total", "Messages received from publishers.", published)
        yield counter("rabbitmq_global_messages_routed_total", "Messages routed to queues.", published - unroutable)
        yield counter("rabbitmq_channel_messages_unroutable_dropped_total", "Unroutable messages dropped.", unroutable)
        yield counter("rabbitmq_global_messages_unroutable_dropped_total", "Unroutable messages dropped.", unroutable)
        yield counter("rabbitmq_channel_messages_delivered_total", "Messages delivered.", delivered)
        yield counter(
            "rabbitmq_channel_messages_delivered_ack_total", "Messages delivered in manual ack mode.", delivered
        )
        yield counter("rabbitmq_global_messages_delivered_total", "Messages delivered.", delivered)
        yield counter("rabbitmq_channel_messages_acked_total", "Messages acknowledged.", acked)
        yield counter("rabbitmq_global_messages_acknowledged_total", "Messages acknowledged.", acked)
        yield counter("rabbitmq_channel_messages_redelivered_total", "Messages redelivered.", redelivered)
        yield counter("rabbitmq_global_messages_redelivered_total", "Messages redelivered.", redelivered)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        yield gauge("rabbitmq_process_resident_memory_bytes", "Resident memory (peak).", usage.ru_maxrss * 1024)
        try:
            open_fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            open_fds = 0
        yield gauge("rabbitmq_process_open_fds", "Open file descriptors.", open_fds)
        yield gauge("rabbitmq_process_max_fds", "File descriptor limit.", resource.getrlimit(resource.RLIMIT_NOFILE)[0])


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


def metrics_site(registry: CollectorRegistry) -> Any:
    """A twisted.web ``Site`` serving ``/metrics`` (and 404 elsewhere)."""
    from twisted.web.server import Site

    root = Resource()
    root.putChild(b"metrics", MetricsResource(registry))
    return Site(root)

"""Prometheus metrics: a collector that reads the broker's state at scrape time, served by twisted.web.

Nothing here runs per message. Queues and virtual hosts keep plain integer counters
(``WorkQueue.published``, ``delivered``, ``acked``, ...), and :class:`BrokerCollector` turns
them into metric families when Prometheus scrapes ``/metrics``, on the reactor thread, so it
reads the state without locks. Names and labels are those ``docs/operations.md`` lists (prefix
``postroom_``, labels ``vhost``, ``queue``, ``reason`` only).

The per-queue series grow with the number of queues (50,000 queues: 650,000 samples), so
``/metrics`` writes them in slices of a few milliseconds each (:func:`queue_text`, run by a
:class:`~twisted.internet.task.Cooperator`), with the socket's back-pressure pausing it: a
scrape never stalls the broker's clients, and a scraper that reads slowly costs its buffer.

With ``rabbitmq_compatible``, the collector also exports the ``rabbitmq_*`` series that
RabbitMQ's own Grafana dashboard (RabbitMQ-Overview, Grafana ID 10991) reads, computed from
the same counters, so a team moving from RabbitMQ keeps its dashboards.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterator
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString
from twisted.internet.task import CooperativeTask, Cooperator, TaskFinished
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from postroom.broker.core.dead_lettering import DeadLetterReason
from postroom.broker.core.histogram import Histogram
from postroom.broker.server.alarms import ResourceMonitor, disk_free, memory_total, resident_memory
from postroom.broker.server.identity import node_name as current_node_name
from postroom.broker.streams.connection import error_counter
from postroom.broker.wire.streamframes import ERROR_NAMES

if TYPE_CHECKING:
    from postroom.broker.core.entry import Queue
    from postroom.broker.core.node import Node
    from postroom.broker.server.clusterview import ClusterView
    from postroom.broker.server.shovels import Shovels
    from postroom.broker.storage.logwriter import WALService

_QUEUE_LABELS = ["vhost", "queue"]

#: The per-queue families: name, type, help text, and how to read the value from a queue.
QUEUE_FAMILIES: list[tuple[str, str, str, Callable[[Queue], int]]] = [
    ("postroom_queue_messages_ready", "gauge", "Messages ready for delivery.", attrgetter("message_count")),
    (
        "postroom_queue_messages_unacked",
        "gauge",
        "Messages delivered and not yet acknowledged.",
        attrgetter("unacked_count"),
    ),
    ("postroom_queue_consumers", "gauge", "Consumers of the queue.", attrgetter("consumer_count")),
    (
        "postroom_queue_messages_published_total",
        "counter",
        "Messages routed into the queue.",
        attrgetter("published"),
    ),
    (
        "postroom_messages_delivered_total",
        "counter",
        "Deliveries to consumers and basic.get, redeliveries included.",
        attrgetter("delivered"),
    ),
    ("postroom_messages_acked_total", "counter", "Deliveries acknowledged by clients.", attrgetter("acked")),
    (
        "postroom_messages_redelivered_total",
        "counter",
        "Messages returned to the queue for another delivery (requeue, visibility timeout, channel closed).",
        attrgetter("redelivered"),
    ),
    (
        "postroom_visibility_timeouts_total",
        "counter",
        "Deliveries taken back because their visibility timeout passed.",
        attrgetter("visibility_timeouts"),
    ),
]
_DEAD_LETTERED = ("postroom_messages_dead_lettered_total", "Messages dead-lettered out of the queue, by reason.")
_POLICY = (
    "postroom_queue_policy_info",
    "The policy (kind=policy) and the operator policy (kind=operator) that apply to the queue.",
)

#: Queues visited between two checks of the time a slice has taken.
SLICE_QUEUES = 100

#: Seconds of rendering before the reactor gets its turn back.
SLICE_SECONDS = 0.003

_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


def _value(value: int) -> str:
    """A sample value exactly as ``prometheus_client`` writes it (``3.0``, ``1.234567e+06``)."""
    return f"{value}.0" if 0 <= value < 1_000_000 else floatToGoString(value)


def _label(value: str) -> str:
    """A label value in Prometheus's text format (backslash, quote and newline escaped)."""
    return value.translate(_LABEL_ESCAPES)


class QueueTotals:
    """Sums over every queue, gathered while the per-queue series are written (for the
    ``rabbitmq_*`` per-node series, so they cost no second pass)."""

    __slots__ = (
        "queues",
        "message_count",
        "unacked_count",
        "consumer_count",
        "published",
        "delivered",
        "redelivered",
        "acked",
    )

    def __init__(self) -> None:
        self.queues = self.message_count = self.unacked_count = self.consumer_count = 0
        self.published = self.delivered = self.redelivered = self.acked = 0

    def add(self, queue: Queue) -> None:
        self.queues += 1
        self.message_count += queue.message_count
        self.unacked_count += queue.unacked_count
        self.consumer_count += queue.consumer_count
        self.published += queue.published
        self.delivered += queue.delivered
        self.redelivered += queue.redelivered
        self.acked += queue.acked


def queue_text(node: Node, totals: QueueTotals | None = None) -> Iterator[bytes | None]:
    """The per-queue families in Prometheus's text format, in pieces: ``None`` now and then
    (a point where the caller may yield to the reactor) and ``bytes`` to write.

    The queues are listed once, then each family is written over that list; a queue deleted
    meanwhile still appears with its last values in this scrape.
    """
    queues: list[tuple[str, str, Queue]] = []
    for vhost in list(node.vhosts.values()):
        vhost_label = f'vhost="{_label(vhost.name)}"'
        for queue in list(vhost.queues.values()):
            queues.append((f'queue="{_label(queue.name)}"', vhost_label, queue))
            if totals is not None:
                totals.add(queue)
            if len(queues) % SLICE_QUEUES == 0:
                yield None
    for name, kind, documentation, read in QUEUE_FAMILIES:
        yield from _family(
            name,
            kind,
            documentation,
            queues,
            partial(_queue_sample, name, read),
        )

    def dead_lettered(q: str, v: str, queue: Queue) -> list[str]:
        counts = queue.dead_lettered
        return [
            f'{_DEAD_LETTERED[0]}{{{q},reason="{reason.value}",{v}}} {_value(counts.get(reason, 0))}\n'
            for reason in DeadLetterReason
        ]

    def policies(q: str, v: str, queue: Queue) -> list[str]:
        return [
            f'{_POLICY[0]}{{kind="{kind}",policy="{_label(policy.name)}",{q},{v}}} 1.0\n'
            for kind, policy in (("operator", queue.operator_policy), ("policy", queue.policy))
            if policy is not None
        ]

    yield from _family(_DEAD_LETTERED[0], "counter", _DEAD_LETTERED[1], queues, dead_lettered)
    yield from _family(_POLICY[0], "gauge", _POLICY[1], queues, policies)


def _queue_sample(name: str, read: Callable[[Queue], int], q: str, v: str, queue: Queue) -> list[str]:
    """The sample of family ``name`` for ``queue`` (labelled ``q`` and ``v``): ``read(queue)``."""
    return [f"{name}{{{q},{v}}} {_value(read(queue))}\n"]


def _family(
    name: str,
    kind: str,
    documentation: str,
    queues: list[tuple[str, str, Queue]],
    samples: Callable[[str, str, Queue], list[str]],
) -> Iterator[bytes]:
    """One family over ``queues``: its header, then ``samples(queue label, vhost label, queue)``
    (text lines) for each, in pieces of :data:`SLICE_QUEUES` queues."""
    lines = [f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"]
    for index, (queue_label, vhost_label, queue) in enumerate(queues, 1):
        lines += samples(queue_label, vhost_label, queue)
        if index % SLICE_QUEUES == 0:
            yield "".join(lines).encode()
            lines.clear()
    yield "".join(lines).encode()


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
    :param shovels: the node's running shovels, for ``postroom_shovel_*`` (``None``: it runs none)
    :param monitor: what reads memory and free disk, for their gauges (``None``: none)
    """

    def __init__(
        self,
        node: Node,
        wal: WALService | None = None,
        rabbitmq_compatible: bool = False,
        node_name: str | None = None,
        shovels: Shovels | None = None,
        monitor: ResourceMonitor | None = None,
        cluster: ClusterView | None = None,
    ) -> None:
        self.node = node
        self.cluster = cluster
        self.wal = wal
        self.shovels = shovels
        self.monitor = monitor
        self.rabbitmq_compatible = rabbitmq_compatible
        self.node_name = node_name if node_name is not None else current_node_name()

    def collect(self) -> Iterator[Metric]:
        """Every metric family, computed now in one go (``/metrics`` writes the per-queue ones
        in slices instead: :func:`queue_text`, then :meth:`collect_rest`)."""
        yield from self._queues()
        yield from self.collect_rest()

    def collect_rest(self, totals: QueueTotals | None = None) -> Iterator[Metric]:
        """The families that are not per queue (``totals``: sums over the queues, when known)."""
        yield from self._vhosts()
        yield from self._streams()
        yield from self._shovels()
        yield from self._node()
        if self.wal is not None:
            yield from self._wal(self.wal)
        if self.cluster is not None:
            yield from self._cluster(self.cluster)
        if self.rabbitmq_compatible:
            yield from RabbitMQNames(self, totals).collect()

    def _cluster(self, cluster: ClusterView) -> Iterator[Metric]:
        """The cluster this node leads: copies in sync, elections, each follower's lag, and the
        time confirms waited for the followers."""
        figures = cluster.figures()
        yield GaugeMetricFamily(
            "postroom_cluster_in_sync_copies",
            "Copies a confirm waits for now: the leader and the followers in the in-sync set.",
            value=figures["copies"],
        )
        yield CounterMetricFamily(
            "postroom_cluster_leader_elections",
            "Times this node became the cluster's leader.",
            value=figures["elections"],
        )
        lag = {
            unit: GaugeMetricFamily(
                f"postroom_cluster_follower_lag_{unit}",
                f"What a follower has not acknowledged yet, in {unit}.",
                labels=["follower"],
            )
            for unit in ("batches", "bytes", "seconds")
        }
        for name, follower in sorted(figures["followers"].items()):
            for unit, family in lag.items():
                family.add_metric([name], follower[unit])
        yield from lag.values()
        yield CounterMetricFamily(
            "postroom_cluster_replication_waits",
            "Writes whose confirms waited for the followers in sync.",
            value=figures["held"],
        )
        yield CounterMetricFamily(
            "postroom_cluster_replication_wait_seconds",
            "Seconds those writes' confirms waited for the followers, after the leader's own sync.",
            value=figures["held_seconds"],
        )

    def _shovels(self) -> Iterator[Metric]:
        """Each dynamic shovel's state (1 for the one it is in) and what it moved."""
        labels = ["vhost", "shovel"]
        state = GaugeMetricFamily(
            "postroom_shovel_state",
            "A shovel's state (starting, running, terminated): 1 for its own.",
            labels=[*labels, "state"],
        )
        moved = CounterMetricFamily(
            "postroom_shovel_messages",
            "Messages a shovel moved (settled at the source as its ack mode asks).",
            labels=labels,
        )
        again = CounterMetricFamily(
            "postroom_shovel_redelivered",
            "Messages a shovel got again from its source after a failure: each may reach the destination twice.",
            labels=labels,
        )
        refused = CounterMetricFamily(
            "postroom_shovel_nacked", "Messages the destination refused (put back at the source).", labels=labels
        )
        restarts = CounterMetricFamily(
            "postroom_shovel_restarts", "Times a shovel started again after a failure.", labels=labels
        )
        for shovel in self.shovels or ():
            names = [shovel.spec.vhost, shovel.spec.name]
            for name in ("starting", "running", "terminated"):
                state.add_metric([*names, name], 1 if shovel.state == name else 0)
            moved.add_metric(names, shovel.moved)
            again.add_metric(names, shovel.redelivered)
            refused.add_metric(names, shovel.nacked)
            restarts.add_metric(names, shovel.restarts)
        yield from (state, moved, again, refused, restarts)

    def _queues(self) -> Iterator[Metric]:
        families = []
        for name, kind, documentation, read in QUEUE_FAMILIES:
            kind_of = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            families.append((kind_of(name, documentation, labels=_QUEUE_LABELS), read))
        name, documentation = _DEAD_LETTERED
        dead = CounterMetricFamily(name, documentation, labels=[*_QUEUE_LABELS, "reason"])
        policies = GaugeMetricFamily(*_POLICY, labels=[*_QUEUE_LABELS, "kind", "policy"])
        for vhost in self.node.vhosts.values():
            for queue in vhost.queues.values():
                labels = [vhost.name, queue.name]
                for family, read in families:
                    family.add_metric(labels, read(queue))
                for reason in DeadLetterReason:
                    dead.add_metric([*labels, reason.value], queue.dead_lettered.get(reason, 0))
                for kind, policy in (("operator", queue.operator_policy), ("policy", queue.policy)):
                    if policy is not None:
                        policies.add_metric([*labels, kind, policy.name], 1)
        yield from (family for family, _read in families)
        yield dead
        yield policies

    def _streams(self) -> Iterator[Metric]:
        """Each stream's size and each subscription's stored offset and lag."""
        labels = ["vhost", "stream"]
        size = GaugeMetricFamily("postroom_stream_bytes", "Bytes of a stream's segments.", labels=labels)
        segments = GaugeMetricFamily("postroom_stream_segments", "Segment files of a stream.", labels=labels)
        first = GaugeMetricFamily(
            "postroom_stream_first_offset", "The oldest offset a stream holds (retention moves it).", labels=labels
        )
        end = GaugeMetricFamily(
            "postroom_stream_next_offset", "The offset the next message written to a stream gets.", labels=labels
        )
        offset = GaugeMetricFamily(
            "postroom_stream_subscription_offset",
            "Where a durable subscription (x-stream-consumer-name) reads on from.",
            labels=[*labels, "subscription"],
        )
        lag = GaugeMetricFamily(
            "postroom_stream_subscription_lag",
            "Messages a stream holds past a durable subscription's stored offset.",
            labels=[*labels, "subscription"],
        )
        for vhost in self.node.vhosts.values():
            for queue in vhost.queues.values():
                if queue.kind != "stream":
                    continue
                stream = [vhost.name, queue.name]
                log = queue.log  # type: ignore[attr-defined]
                size.add_metric(stream, log.size)
                segments.add_metric(stream, len(log.segments))
                first.add_metric(stream, log.first_offset)
                end.add_metric(stream, queue.committed)  # type: ignore[attr-defined]
                for view in queue.subscription_view():  # type: ignore[attr-defined]
                    if view["offset"] is not None:
                        offset.add_metric([*stream, view["name"]], view["offset"])
                    lag.add_metric([*stream, view["name"]], view["lag"])
        yield from (size, segments, first, end, offset, lag)

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
        yield GaugeMetricFamily(
            "postroom_publishers_slowed",
            "1 while a queue with consumers is far behind and publishers are read in smaller pieces (credit flow).",
            value=self.node.flow,
        )
        monitor = self.monitor
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
        yield from self._stream_protocol()

    def _stream_protocol(self) -> Iterator[Metric]:
        streaming = self.node.stream_connections
        counters = self.node.counters
        mqtt = len(self.node.mqtt_connections)
        yield GaugeMetricFamily("postroom_mqtt_connections", "Open MQTT connections.", value=mqtt)
        yield GaugeMetricFamily(
            "postroom_stream_protocol_connections", "Open connections of the stream protocol.", value=len(streaming)
        )
        yield GaugeMetricFamily(
            "postroom_stream_protocol_publishers",
            "Publishers declared on the stream protocol's connections.",
            value=sum(len(c.publishers) for c in streaming),
        )
        yield GaugeMetricFamily(
            "postroom_stream_protocol_consumers",
            "Subscriptions on the stream protocol's connections.",
            value=sum(len(c.subscriptions) for c in streaming),
        )
        yield CounterMetricFamily(
            "postroom_stream_protocol_messages_received_total",
            "Messages published over the stream protocol (deduplicated ones included).",
            value=counters["stream_messages_received"],
        )
        yield CounterMetricFamily(
            "postroom_stream_protocol_messages_confirmed_total",
            "Messages confirmed to stream-protocol publishers.",
            value=counters["stream_messages_confirmed"],
        )
        errors = CounterMetricFamily(
            "postroom_stream_protocol_errors_total",
            "Commands of the stream protocol refused, by the reason's name (RabbitMQ's codes).",
            labels=["reason"],
        )
        for code, name in ERROR_NAMES.items():
            errors.add_metric([name], counters[error_counter(code)])
        yield errors

    def _wal(self, wal: WALService) -> Iterator[Metric]:
        yield GaugeMetricFamily("postroom_wal_bytes", "Bytes in the write-ahead log's segment files.", value=wal.size)
        yield GaugeMetricFamily("postroom_wal_segments", "Segment files of the write-ahead log.", value=wal.segments)
        yield CounterMetricFamily(
            "postroom_wal_segments_retired_total", "Segments retired (deleted or archived).", value=wal.retired
        )
        yield GaugeMetricFamily(
            "postroom_wal_alarm", "1 while writes to the log fail (confirms are refused).", value=wal.alarm is not None
        )
        yield GaugeMetricFamily(
            "postroom_wal_backlog_bytes",
            "Bytes of records waiting for the log's writer.",
            value=wal.journal.pending_bytes,
        )
        yield GaugeMetricFamily(
            "postroom_wal_publishers_paused",
            "1 while the backlog is over storage.max_backlog (publishers are paused).",
            value="log" in self.node.alarms,
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

    def __init__(self, collector: BrokerCollector, totals: QueueTotals | None = None) -> None:
        self.collector = collector
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        node = self.collector.node
        vhosts = list(node.vhosts.values())
        tallies = [vhost.tallies for vhost in vhosts]
        totals = self.totals
        if totals is None:
            totals = QueueTotals()
            for vhost in vhosts:
                for queue in vhost.queues.values():
                    totals.add(queue)
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

        ready, unacked = totals.message_count, totals.unacked_count
        unconfirmed = sum(c.confirms.unconfirmed for c in channels if c.confirms is not None)
        monitor = self.collector.monitor
        rss = resident_memory()
        limit = monitor.memory_limit if monitor is not None else memory_total()
        disk = _disk_free(self.collector.wal)
        open_fds, max_fds = _fds()
        sockets = len(connections) + len(node.mqtt_connections)
        gauges = {
            "rabbitmq_queue_messages_ready": ("Messages ready to be delivered.", ready),
            "rabbitmq_queue_messages_unacked": ("Messages delivered and not acknowledged.", unacked),
            "rabbitmq_queue_messages": ("Messages ready and unacknowledged.", ready + unacked),
            "rabbitmq_queues": ("Queues.", totals.queues),
            "rabbitmq_consumers": ("Consumers.", totals.consumer_count),
            "rabbitmq_channel_consumers": ("Consumers on channels.", sum(len(c.consuming.consumers) for c in channels)),
            "rabbitmq_connections": ("Open connections.", len(connections) + len(node.mqtt_connections)),
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
        returned, delivered = total(vhosts, "returned"), totals.delivered
        gets = total(vhosts, "gets")
        counts = {
            "rabbitmq_channel_messages_published_total": ("Messages published.", published),
            "rabbitmq_channel_messages_confirmed_total": ("Publishes confirmed.", total(vhosts, "confirmed")),
            "rabbitmq_queue_messages_published_total": ("Messages routed into queues.", totals.published),
            "rabbitmq_channel_messages_unroutable_dropped_total": ("Unroutable, dropped.", unroutable - returned),
            "rabbitmq_channel_messages_unroutable_returned_total": ("Unroutable, returned.", returned),
            # Postroom counts consume and get deliveries together; the dashboard adds these up.
            "rabbitmq_channel_messages_delivered_total": ("Deliveries without ack.", 0),
            "rabbitmq_channel_messages_delivered_ack_total": ("Deliveries (consume and get).", delivered - gets),
            "rabbitmq_channel_get_total": ("basic.get without ack.", 0),
            "rabbitmq_channel_get_ack_total": ("basic.get answered with a message.", gets),
            "rabbitmq_channel_get_empty_total": ("basic.get answered empty.", total(vhosts, "gets_empty")),
            "rabbitmq_channel_messages_redelivered_total": ("Redeliveries.", totals.redelivered),
            "rabbitmq_channel_messages_acked_total": ("Acknowledgements.", totals.acked),
            "rabbitmq_queues_declared_total": ("Queues declared.", total(tallies, "queues_declared")),
            "rabbitmq_queues_created_total": ("Queues created.", total(tallies, "queues_created")),
            "rabbitmq_queues_deleted_total": ("Queues deleted.", total(tallies, "queues_deleted")),
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
        yield from _global_stream_counters(node)


#: RabbitMQ's protocol counters (``rabbit_global_counters``) that the stream protocol never
#: moves in Postroom: exported at 0 with it, as RabbitMQ exports them.
_GLOBAL_UNUSED = [
    ("messages_routed_total", "counter"), ("messages_unroutable_dropped_total", "counter"),
    ("messages_unroutable_returned_total", "counter"), ("messages_delivered_total", "counter"),
    ("messages_delivered_consume_manual_ack_total", "counter"),
    ("messages_delivered_consume_auto_ack_total", "counter"),
    ("messages_delivered_get_manual_ack_total", "counter"), ("messages_delivered_get_auto_ack_total", "counter"),
    ("messages_get_empty_total", "counter"), ("messages_redelivered_total", "counter"),
    ("messages_acknowledged_total", "counter"),
]  # fmt: skip


def _global_stream_counters(node: Node) -> Iterator[Metric]:
    """RabbitMQ's ``rabbitmq_global_*{protocol="stream"}``: the stream protocol's messages,
    publishers, consumers and refusals by code."""
    counters = node.counters
    streaming = node.stream_connections
    received = counters["stream_messages_received"]
    values: list[tuple[str, str, int]] = [
        ("messages_received_total", "counter", received),
        ("messages_received_confirm_total", "counter", received),
        ("messages_confirmed_total", "counter", counters["stream_messages_confirmed"]),
        ("publishers", "gauge", sum(len(c.publishers) for c in streaming)),
        ("consumers", "gauge", sum(len(c.subscriptions) for c in streaming)),
    ]
    values += [(name, kind, 0) for name, kind in _GLOBAL_UNUSED]
    values += [
        (f"stream_error_{name}_total", "counter", counters[error_counter(code)]) for code, name in ERROR_NAMES.items()
    ]
    for name, kind, value in values:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            f"rabbitmq_global_{name.removesuffix('_total') if kind == 'counter' else name}",
            f"The stream protocol's {name.removesuffix('_total').replace('_', ' ')}.",
            labels=["protocol"],
        )
        family.add_metric(["stream"], value)
        yield family


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
    registry.register(collector)
    return registry


class _Rest:
    """A registry-like view of a collector's families that are not per queue, for ``generate_latest``."""

    def __init__(self, collector: BrokerCollector, totals: QueueTotals) -> None:
        self.collector = collector
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        return self.collector.collect_rest(self.totals)


class _Slice:
    """``Cooperator`` rounds of at most :data:`SLICE_SECONDS`."""

    def __init__(self) -> None:
        self.end = time.monotonic() + SLICE_SECONDS

    def __call__(self) -> bool:
        return time.monotonic() >= self.end


class _Pausable:
    """The socket's back-pressure, passed on to a cooperative task (a streaming producer).

    Pausing, resuming or stopping a task that has already finished does nothing.
    """

    def __init__(self, task: CooperativeTask[Iterator[None]]) -> None:
        self.task = task
        self.paused = False

    def pauseProducing(self) -> None:  # noqa: N802 (IPushProducer)
        if not self.paused:
            try:
                self.task.pause()
            except TaskFinished:
                return
            self.paused = True

    def resumeProducing(self) -> None:  # noqa: N802 (IPushProducer)
        if self.paused:
            self.paused = False
            self.task.resume()

    def stopProducing(self) -> None:  # noqa: N802 (IPushProducer)
        try:
            self.task.stop()
        except TaskFinished:
            pass


class MetricsResource(Resource):
    """``GET /metrics`` in Prometheus's text format: the per-queue series in slices that leave
    the reactor to the broker's clients in between, then the rest.

    :param reactor: runs the slices (the global reactor by default)
    """

    isLeaf = True

    def __init__(self, collector: BrokerCollector, reactor: Any = None) -> None:
        super().__init__()
        self.collector = collector
        if reactor is None:
            from twisted.internet import reactor
        self.cooperator = Cooperator(
            terminationPredicateFactory=_Slice, scheduler=lambda run: reactor.callLater(0, run)
        )

    def render_GET(self, request: Request) -> Any:  # noqa: N802 (twisted.web calls it)
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode())
        task = self.cooperator.cooperate(self._write(request))
        producer = _Pausable(task)
        request.registerProducer(producer, True)
        state = {"written": False, "gone": False}

        def gone(_failure: Failure) -> None:
            state["gone"] = True
            producer.stopProducing()

        def written(_: object) -> None:
            state["written"] = True
            request.unregisterProducer()
            if not state["gone"]:
                request.finish()

        request.notifyFinish().addErrback(gone)
        task.whenDone().addCallbacks(written, lambda _failure: None)  # a stopped task: the scraper left
        return NOT_DONE_YET

    def _write(self, request: Request) -> Iterator[None]:
        totals = QueueTotals()
        for piece in queue_text(self.collector.node, totals):
            if piece:
                request.write(piece)
            yield None
        request.write(generate_latest(_Rest(self.collector, totals)))


def metrics_site(collector: BrokerCollector, reactor: Any = None) -> Site:
    """A twisted.web ``Site`` serving ``/metrics`` (and 404 elsewhere; its slices and timeouts
    on ``reactor``, the global one by default)."""
    from postroom.broker.server.http import BoundedSite

    root = Resource()
    root.putChild(b"metrics", MetricsResource(collector, reactor))
    return BoundedSite(root, reactor=reactor)

"""Per-second rates for ``message_stats``, sampled as RabbitMQ's management plugin samples them."""

from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.internet.task import LoopingCall

if TYPE_CHECKING:
    from postroom.broker.amqp.channel import ChannelState
    from postroom.broker.amqp.connection import ServerConnection
    from postroom.broker.core.entry import Queue
    from postroom.broker.core.node import Node
    from postroom.broker.server.alarms import ResourceMonitor
    from postroom.broker.streams.connection import StreamConnection

#: What a counter is kept under: its vhost, its queue's name (``""`` for the vhost's or the
#: node's own; ``("exchange", name)`` for an exchange's) and the statistic.
Key = tuple[str, Any, str]

#: Seconds between rate samples: RabbitMQ's management plugin samples every 5 s too.
RATE_INTERVAL = 5.0

#: Counters that get a ``*_details.rate`` in ``message_stats`` (RabbitMQ's names -> ours).
QUEUE_STATS = {"publish": "published", "deliver_get": "delivered", "ack": "acked", "redeliver": "redelivered"}
VHOST_STATS = {"publish": "published", "return_unroutable": "returned"}


#: A queue's counters as the sampler keeps them (see ``RateSampler._queue_counts``).
QUEUE_ORDER = {
    stat: position
    for position, stat in enumerate(
        ("publish", "deliver_get", "ack", "redeliver", "get", "get_no_ack", "get_empty", "deliver_no_ack", "deliver",
         "messages_ready", "messages_unacknowledged")
    )
}  # fmt: skip

#: What a queue or the node holds rather than counts: their rates may be below 0.
LEVELS = frozenset({"messages_ready", "messages_unacknowledged", "mem_used", "fd_used", "sockets_used", "disk_free"})


def descriptors_open() -> int:
    """File descriptors the broker has open (``/proc/self/fd``; 0 where there is none)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def node_levels(node: Node, monitor: ResourceMonitor | None) -> dict[str, int]:
    """What the node uses: memory, file descriptors, client sockets, and the disk space left
    (as ``monitor`` last read them; 0 without one)."""
    return {
        "mem_used": (monitor.memory_used or 0) if monitor is not None else 0,
        "fd_used": descriptors_open(),
        "sockets_used": node.connections_open,
        "disk_free": (monitor.disk_free or 0) if monitor is not None else 0,
    }


def queue_counts(queue: Queue) -> dict[str, int]:
    """A queue's ``message_stats`` counters, RabbitMQ's names (``deliver_get`` is the sum of
    deliveries with and without acks and gets with and without acks)."""
    counts = {stat: getattr(queue, attribute) for stat, attribute in QUEUE_STATS.items()}
    counts["get"], counts["get_no_ack"], counts["get_empty"] = queue.got, queue.got_no_ack, queue.got_empty
    counts["deliver_no_ack"] = queue.delivered_no_ack
    counts["deliver"] = queue.delivered - queue.delivered_no_ack - queue.got - queue.got_no_ack
    return counts


def churn_counts(node: Node) -> dict[str, int]:
    """Connections, channels and queues opened, declared and closed since the start, RabbitMQ's
    ``churn_rates`` (AMQP 0-9-1 connections, as RabbitMQ's count)."""
    counters, vhosts = node.counters, node.vhosts.values()
    return {
        "connection_created": counters["connections_opened"],
        "connection_closed": counters["connections_closed"],
        "channel_created": counters["channels_opened"],
        "channel_closed": counters["channels_closed"],
        "queue_declared": sum(vhost.tallies.queues_declared for vhost in vhosts),
        "queue_created": sum(vhost.tallies.queues_created for vhost in vhosts),
        "queue_deleted": sum(vhost.tallies.queues_deleted for vhost in vhosts),
    }


def channel_counts(channel: ChannelState) -> dict[str, int]:
    """An AMQP channel's ``message_stats`` counters, RabbitMQ's names."""
    consuming, confirms = channel.consuming, channel.confirms
    counts = {
        "publish": channel.published,
        "confirm": confirms.confirmed_upto if confirms is not None else 0,
        "return_unroutable": channel.returned,
        "drop_unroutable": channel.dropped,
        "deliver": consuming.delivery_tag - consuming.delivered_no_ack - consuming.got - consuming.got_no_ack,
        "deliver_no_ack": consuming.delivered_no_ack,
        "get": consuming.got,
        "get_no_ack": consuming.got_no_ack,
        "get_empty": consuming.got_empty,
        "ack": consuming.acked,
        "redeliver": consuming.redelivered,
    }
    counts["deliver_get"] = counts["deliver"] + counts["deliver_no_ack"] + counts["get"] + counts["get_no_ack"]
    return counts


#: RabbitMQ keeps a channel's or a vhost's counters in two families, each shown once one of
#: its counters moved: what was published, and what was delivered or got.
PUBLISHING = ("publish", "confirm", "return_unroutable", "drop_unroutable")
DELIVERING = ("deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack", "deliver_get")


def with_rates(counts: dict[str, int], rates: dict[str, float], families: bool = False) -> dict[str, Any]:
    """``message_stats`` as RabbitMQ shows them: each counter, then its ``*_details`` rate.

    :param families: leave out each of :data:`PUBLISHING` and :data:`DELIVERING` whose
        counters are all 0, as RabbitMQ shows a channel's and a vhost's
    """
    stats: dict[str, Any] = {}
    for stat, count in counts.items():
        if families:
            family = PUBLISHING if stat in PUBLISHING else DELIVERING if stat in DELIVERING else None
            if family is not None and not any(counts.get(other) for other in family):
                continue
        stats[stat] = count
        stats[f"{stat}_details"] = {"rate": rates.get(stat, 0.0)}
    return stats


#: The counters kept as history for the overview's charts: each vhost's totals at each sample.
HISTORY_STATS = ("publish", "return_unroutable", "deliver_get", "ack", "redeliver", "dead_lettered")
#: Samples of history kept: ten minutes at one every 5 s.
HISTORY_SAMPLES = 120


class RateSampler:
    """Per-second rates of the queue and vhost counters, from samples ``interval`` seconds apart.

    :param node: the broker node
    :param clock: the reactor (``Clock`` in tests)
    :param monitor: what reads the node's memory and free disk (``None``: they read 0)
    """

    def __init__(
        self, node: Node, clock: Any, interval: float = RATE_INTERVAL, monitor: ResourceMonitor | None = None
    ) -> None:
        self.node = node
        #: The node's memory and disk readings, sampled as levels and shown by ``/api/nodes``.
        self.monitor = monitor
        self.clock = clock
        self.interval = interval
        self._last: dict[Key, int] = {}
        #: Each queue's counters at the last sample and the one before, and the time between.
        self._queues: dict[tuple[str, str], tuple[int, ...]] = {}
        self._queues_before: dict[tuple[str, str], tuple[int, ...]] = {}
        self._queues_elapsed = 0.0
        self._last_at: float | None = None
        self.rates: dict[Key, float] = {}
        #: ``(milliseconds since the epoch, {vhost: {stat: count}})``, oldest first.
        self.history: deque[tuple[int, dict[str, dict[str, int]]]] = deque(maxlen=HISTORY_SAMPLES)
        #: Each open connection's bytes received and sent at the last sample, and their rates.
        self._sockets: dict[ServerConnection | StreamConnection, tuple[int, int]] = {}
        self._socket_rates: dict[ServerConnection | StreamConnection, tuple[float, float]] = {}
        #: Each open AMQP channel's counters at the last sample, and their rates.
        self._channels: dict[ChannelState, dict[str, int]] = {}
        self._channel_rates: dict[ChannelState, dict[str, float]] = {}
        #: Bytes received and sent by each vhost's connections, closed ones too, as of the last
        #: sample (RabbitMQ's vhost ``recv_oct`` and ``send_oct``).
        self.vhost_bytes: dict[str, list[int]] = {}
        self._vhost_byte_rates: dict[str, tuple[float, float]] = {}
        self._loop = LoopingCall(self.sample)
        self._loop.clock = clock

    def start(self) -> None:
        """Sample now and every ``interval`` seconds."""
        self._loop.start(self.interval, now=True)

    def stop(self) -> None:
        """Stop sampling."""
        if self._loop.running:
            self._loop.stop()

    def _counts(self) -> dict[Key, int]:
        counts: dict[Key, int] = {("", "", stat): count for stat, count in churn_counts(self.node).items()}
        counts.update({("", "", stat): level for stat, level in node_levels(self.node, self.monitor).items()})
        for vhost in self.node.vhosts.values():
            for stat, attribute in VHOST_STATS.items():
                counts[(vhost.name, "", stat)] = getattr(vhost, attribute)
            # (exchanges under ("exchange", name): no queue's name is a tuple)
            default_in, default_out = vhost.default_exchange_counts()
            counts[(vhost.name, ("exchange", ""), "publish_in")] = default_in
            counts[(vhost.name, ("exchange", ""), "publish_out")] = default_out
            for exchange in vhost.exchanges.values():
                counts[(vhost.name, ("exchange", exchange.name), "publish_in")] = exchange.published_in
                counts[(vhost.name, ("exchange", exchange.name), "publish_out")] = exchange.published_out
        return counts

    def _queue_counts(self) -> dict[tuple[str, str], tuple[int, ...]]:
        """Each queue's counters, in :data:`QUEUE_ORDER`: one tuple a queue, so that a sample
        of 50,000 queues stays short (their rates are worked out when asked for)."""
        found: dict[tuple[str, str], tuple[int, ...]] = {}
        for vhost in self.node.vhosts.values():
            name = vhost.name
            for queue in vhost.queues.values():
                got, got_no_ack, no_ack, delivered = (
                    queue.got,
                    queue.got_no_ack,
                    queue.delivered_no_ack,
                    queue.delivered,
                )
                found[(name, queue.name)] = (
                    queue.published, delivered, queue.acked, queue.redelivered, got, got_no_ack, queue.got_empty,
                    no_ack, delivered - no_ack - got - got_no_ack, queue.message_count, queue.unacked_count,
                )  # fmt: skip
        return found

    def sample(self) -> None:
        """Read the counters and update the rates.

        A queue created since the last sample counts from 0. Message counts (:data:`LEVELS`) go
        down as well as up, so their rates may be below 0, as RabbitMQ's ``messages_details``;
        a counter that went down (a queue deleted and declared again) reads 0.
        """
        now = self.clock.seconds()
        counts = self._counts()
        queues = self._queue_counts()
        if self._last_at is not None and now > self._last_at:
            self._queues_before, self._queues_elapsed = self._queues, now - self._last_at
        self._queues = queues
        if self._last_at is not None and now > self._last_at:
            elapsed = now - self._last_at
            last = self._last
            self.rates = {
                key: (count - last.get(key, 0) if key[2] in LEVELS else max(0, count - last.get(key, 0))) / elapsed
                for key, count in counts.items()
            }
        self._sample_sockets(now - self._last_at if self._last_at is not None else 0.0)
        self._sample_channels(now - self._last_at if self._last_at is not None else 0.0)
        self._last, self._last_at = counts, now
        totals: dict[str, dict[str, int]] = {}
        for vhost in self.node.vhosts.values():
            sums = dict.fromkeys(HISTORY_STATS, 0)
            sums["publish"] = vhost.published
            sums["return_unroutable"] = vhost.returned
            sums["dead_lettered"] = sum(vhost.dead_letter_queues.values())
            for queue in vhost.queues.values():
                sums["deliver_get"] += queue.delivered
                sums["ack"] += queue.acked
                sums["redeliver"] += queue.redelivered
            totals[vhost.name] = sums
        self.history.append((int(now * 1000), totals))

    def _sample_sockets(self, elapsed: float) -> None:
        """Each connection's byte rates since the last sample; what its vhost's connections
        received and sent in all."""
        last, rates, sockets = self._sockets, {}, {}
        totals_before = {name: tuple(totals) for name, totals in self.vhost_bytes.items()}
        for connection in (*self.node.connections, *self.node.stream_connections, *self.node.mqtt_connections):
            now = (connection.recv_oct, connection.send_oct)
            before = last.get(connection, (0, 0))
            sockets[connection] = now
            if elapsed > 0:
                rates[connection] = ((now[0] - before[0]) / elapsed, (now[1] - before[1]) / elapsed)
            vhost = connection.vhost
            if vhost is not None:
                totals = self.vhost_bytes.setdefault(vhost.name, [0, 0])
                totals[0] += now[0] - before[0]
                totals[1] += now[1] - before[1]
        self._sockets, self._socket_rates = sockets, rates
        if elapsed > 0:
            rates_of = {}
            for name, totals in self.vhost_bytes.items():
                earlier = totals_before.get(name, (0, 0))
                rates_of[name] = ((totals[0] - earlier[0]) / elapsed, (totals[1] - earlier[1]) / elapsed)
            self._vhost_byte_rates = rates_of

    def _sample_channels(self, elapsed: float) -> None:
        """Each AMQP channel's ``message_stats`` rates since the last sample."""
        last, counts, rates = self._channels, {}, {}
        for connection in self.node.connections:
            for channel in connection.channels.values():
                now = counts[channel] = channel_counts(channel)
                before = last.get(channel)
                if elapsed > 0 and before is not None:
                    rates[channel] = {stat: (count - before[stat]) / elapsed for stat, count in now.items()}
        self._channels, self._channel_rates = counts, rates

    def channel_rates(self, channel: ChannelState) -> dict[str, float]:
        """Per second of each of a channel's counters over the last interval."""
        return self._channel_rates.get(channel, {})

    def sampled_bytes(self, connection: ServerConnection | StreamConnection) -> tuple[int, int]:
        """A connection's bytes received and sent as of the last sample."""
        return self._sockets.get(connection, (0, 0))

    def vhost_byte_rates(self, vhost: str) -> tuple[float, float]:
        """Bytes per second a vhost's connections received and sent over the last interval."""
        return self._vhost_byte_rates.get(vhost, (0.0, 0.0))

    def socket_rates(self, connection: ServerConnection | StreamConnection) -> tuple[float, float]:
        """Bytes per second a connection received and sent over the last interval."""
        return self._socket_rates.get(connection, (0.0, 0.0))

    def samples(self, vhosts: list[str], stat: str, age: float, increment: float) -> list[dict[str, int]]:
        """``stat``'s total over ``vhosts`` as RabbitMQ's ``*_details.samples`` shows it: one every
        ``increment`` seconds at whole multiples of it, newest first, back ``age`` seconds. Each
        is the last sample taken by then (before the first one kept: the first one kept)."""
        if not self.history:
            return []
        step = max(1, int(increment * 1000))
        newest = self.history[-1][0] // step * step
        kept = list(self.history)
        shown = []
        at = len(kept) - 1
        for number in range(int(age * 1000) // step + 1):
            moment = newest - number * step
            while at > 0 and kept[at][0] > moment + (step if number == 0 else 0):
                at -= 1
            totals = kept[at][1]
            shown.append({"sample": sum(totals.get(vhost, {}).get(stat, 0) for vhost in vhosts), "timestamp": moment})
        return shown

    def node_rate(self, stat: str) -> float:
        """Per second of a node's counter or level (:func:`churn_counts`, :func:`node_levels`)."""
        return self.rates.get(("", "", stat), 0.0)

    def churn(self) -> dict[str, Any]:
        """The node's ``churn_rates``: each counter of :func:`churn_counts` and its rate."""
        counts = churn_counts(self.node)
        return with_rates(counts, {stat: self.rates.get(("", "", stat), 0.0) for stat in counts})

    def exchange_stats(self, vhost: str, exchange: str, published_in: int, published_out: int) -> dict[str, Any]:
        """An exchange's ``message_stats`` (empty before any message reached it, as RabbitMQ's)."""
        if not (published_in or published_out):
            return {}
        key = ("exchange", exchange)
        return with_rates(
            {"publish_in": published_in, "publish_out": published_out},
            {stat: self.rates.get((vhost, key, stat), 0.0) for stat in ("publish_in", "publish_out")},
        )

    def rate(self, vhost: str, queue: str, stat: str) -> float:
        """Messages per second of ``stat`` over the last interval (``queue`` ``""`` for the vhost's)."""
        position = QUEUE_ORDER.get(stat) if queue else None
        if position is None:
            return self.rates.get((vhost, queue, stat), 0.0)
        last = self._queues.get((vhost, queue))
        if last is None or not self._queues_elapsed:
            return 0.0
        before = self._queues_before.get((vhost, queue))
        change = last[position] - (before[position] if before is not None else 0)
        if stat not in LEVELS:
            change = max(0, change)
        return change / self._queues_elapsed

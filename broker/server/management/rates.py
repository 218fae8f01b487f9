"""Per-second rates for ``message_stats``, sampled as RabbitMQ's management plugin samples them."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.internet.task import LoopingCall

if TYPE_CHECKING:
    from broker.core.node import Node

#: Seconds between rate samples: RabbitMQ's management plugin samples every 5 s too.
RATE_INTERVAL = 5.0

#: Counters that get a ``*_details.rate`` in ``message_stats`` (RabbitMQ's names -> ours).
QUEUE_STATS = {"publish": "published", "deliver_get": "delivered", "ack": "acked", "redeliver": "redelivered"}
VHOST_STATS = {"publish": "published", "return_unroutable": "unroutable"}

#: The counters kept as history for the overview's charts: each vhost's totals at each sample.
HISTORY_STATS = ("publish", "return_unroutable", "deliver_get", "ack", "redeliver", "dead_lettered")
#: Samples of history kept: ten minutes at one every 5 s.
HISTORY_SAMPLES = 120


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
        #: ``(milliseconds since the epoch, {vhost: {stat: count}})``, oldest first.
        self.history: deque[tuple[int, dict[str, dict[str, int]]]] = deque(maxlen=HISTORY_SAMPLES)
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
            for stat, attribute in VHOST_STATS.items():
                counts[(vhost.name, "", stat)] = getattr(vhost, attribute)
            for queue in vhost.queues.values():
                for stat, attribute in QUEUE_STATS.items():
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
        totals: dict[str, dict[str, int]] = {}
        for vhost in self.node.vhosts.values():
            sums = dict.fromkeys(HISTORY_STATS, 0)
            sums["publish"] = vhost.published
            sums["return_unroutable"] = vhost.unroutable
            sums["dead_lettered"] = sum(vhost.dead_letter_queues.values())
            for queue in vhost.queues.values():
                sums["deliver_get"] += queue.delivered
                sums["ack"] += queue.acked
                sums["redeliver"] += queue.redelivered
            totals[vhost.name] = sums
        self.history.append((int(now * 1000), totals))

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

    def rate(self, vhost: str, queue: str, stat: str) -> float:
        """Messages per second of ``stat`` over the last interval (``queue`` ``""`` for the vhost's)."""
        return self.rates.get((vhost, queue, stat), 0.0)

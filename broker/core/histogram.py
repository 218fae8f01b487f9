"""A fixed-bucket histogram for the broker's own timings (no dependency on a metrics library).

The core records into it; ``broker.server.metrics`` reads it at scrape time and exports it in
Prometheus's form (cumulative buckets, sum, count). Observing is a binary search and two adds.
"""

from __future__ import annotations

from bisect import bisect_left

#: Seconds, from 100 µs (an idle broker's publish-to-deliver or an fsync on fast storage) to
#: 10 s (a backlog drained slowly, or a disk in trouble); roughly three per decade.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Counts of observations per bucket (upper bounds inclusive, as Prometheus's ``le``).

    :param buckets: ascending upper bounds; observations above the last go to ``+Inf``
    """

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        #: One count per bucket plus one for ``+Inf`` (not cumulative).
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count of observations <= le)`` pairs, ending with ``+Inf``."""
        result = []
        total = 0
        for bound, count in zip((*map(repr, self.buckets), "+Inf"), self.counts, strict=True):
            total += count
            result.append((bound, total))
        return result

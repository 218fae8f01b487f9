"""The pieces behind /metrics and the management API's rates, on a Clock: histogram, rate sampler, settings."""

from __future__ import annotations

from twisted.internet.task import Clock

from broker.core.histogram import Histogram
from broker.core.message import Message
from broker.core.node import Node
from broker.core.queue import LATENCY_SAMPLE_EVERY
from broker.management import RateSampler
from config.loader import loads


def test_histogram_buckets_are_cumulative_and_upper_bounds_inclusive() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert (histogram.count, histogram.sum) == (4, 3.65)


def test_rates_are_per_second_over_the_sampling_interval() -> None:
    clock = Clock()
    node = Node(clock=clock)
    vhost = node.vhosts["/"]
    queue = vhost.declare_queue("work", None)
    sampler = RateSampler(node, clock, interval=5.0)
    sampler.start()
    for _ in range(20):
        queue.enqueue(Message.build("", "work", b"x"))
    clock.advance(5.0)
    assert sampler.rate("/", "work", "publish") == 4.0
    clock.advance(5.0)
    assert sampler.rate("/", "work", "publish") == 0.0
    sampler.stop()
    assert clock.getDelayedCalls() == []


def test_a_queue_created_between_samples_counts_from_zero() -> None:
    clock = Clock()
    node = Node(clock=clock)
    sampler = RateSampler(node, clock, interval=2.0)
    sampler.start()
    queue = node.vhosts["/"].declare_queue("late", None)
    for _ in range(6):
        queue.enqueue(Message.build("", "late", b"x"))
    clock.advance(2.0)
    assert sampler.rate("/", "late", "publish") == 3.0
    sampler.stop()


def test_publish_to_deliver_latency_is_sampled_once_per_interval() -> None:
    clock = Clock()
    node = Node(clock=clock)
    vhost = node.vhosts["/"]
    queue = vhost.declare_queue("work", None)
    for _ in range(LATENCY_SAMPLE_EVERY * 2):
        queue.enqueue(Message.build("", "work", b"x"))
    assert len(queue.latency_samples) == 2
    clock.advance(0.3)
    while (entry := queue.get()) is not None:
        if entry in queue.latency_samples:
            queue.observe_latency(entry)
    assert vhost.latency.count == 2 and vhost.latency.sum == 0.6
    assert queue.latency_samples == {}


def test_listeners_can_be_turned_off_and_rabbitmq_names_turned_on() -> None:
    config = loads("listen: {metrics: false, management: false}\nmetrics: {rabbitmq_compatible: true}\n", "b.yaml")
    assert (config.listen.metrics, config.listen.management) == (None, None)
    assert config.metrics.rabbitmq_compatible

"""The pieces behind /metrics and the management API's rates, on a Clock: histogram, rate sampler, settings."""

from __future__ import annotations

from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from postroom.broker.core.dead_lettering import DeadLetterReason
from postroom.broker.core.histogram import Histogram
from postroom.broker.core.message import Message
from postroom.broker.core.node import Node
from postroom.broker.core.policy import Policy
from postroom.broker.core.queue import LATENCY_SAMPLE_EVERY
from postroom.broker.server import metrics
from postroom.broker.server.management import RateSampler
from postroom.broker.server.metrics import BrokerCollector, make_registry, metrics_site
from postroom.config.loader import loads


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


def test_the_history_is_shown_at_whole_increments_newest_first_padded_with_the_oldest_kept() -> None:
    clock = Clock()
    clock.advance(1000.0)
    node = Node(clock=clock)
    vhost = node.vhosts["/"]
    sampler = RateSampler(node, clock, interval=5.0)
    sampler.start()  # a sample at 1000 s: 0 published
    for published in (10, 30):
        vhost.published = published
        clock.advance(5.0)  # samples at 1005 s and 1010 s
    shown = sampler.samples(["/"], "publish", age=20, increment=5)
    assert [(sample["timestamp"], sample["sample"]) for sample in shown] == [
        (1_010_000, 30), (1_005_000, 10), (1_000_000, 0), (995_000, 0), (990_000, 0),
    ]  # fmt: skip
    assert [sample["sample"] for sample in sampler.samples(["/"], "publish", age=10, increment=10)] == [30, 0]
    assert sampler.samples(["other"], "publish", age=5, increment=5) == [
        {"sample": 0, "timestamp": 1_010_000}, {"sample": 0, "timestamp": 1_005_000},
    ]  # fmt: skip
    sampler.stop()


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


def scrape_node(queues: int) -> Node:
    node = Node(clock=Clock())
    node.add_vhost('odd"vhost\\')
    for number in range(queues):
        vhost = node.vhosts["/" if number % 3 else 'odd"vhost\\']
        queue = vhost.declare_queue(f"q{number}" + ('\n"\\' if number % 7 == 0 else ""), None)
        queue.published, queue.acked = number * 1_002, number // 2
        queue.dead_lettered[DeadLetterReason.EXPIRED] = number % 5
    node.vhosts["/"].set_policy(Policy('ttl"\\', "^q1", {"message-ttl": 1000}))
    node.vhosts["/"].set_policy(Policy("caps", "^q2", {"max-length": 5}), operator=True)
    return node


def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def http_get(site: Any, path: bytes) -> tuple[Any, StringTransport]:
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"GET " + path + b" HTTP/1.1\r\nHost: broker\r\n\r\n")
    return channel, transport


def alongside(clock: Clock, transport: StringTransport, other: Any) -> None:
    """Run ``other(written bytes)`` on every reactor turn, as another client would get served,
    until the response is complete or ``other`` returns ``False``."""

    def turn() -> None:
        if other(len(transport.value())) is not False and not transport.value().endswith(b"\r\n0\r\n\r\n"):
            clock.callLater(0, turn)

    clock.callLater(0, turn)
    clock.advance(0)


def body_of(response: bytes) -> str:
    head, _, chunked = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    body, rest = b"", chunked
    while True:
        size, _, rest = rest.partition(b"\r\n")
        if int(size, 16) == 0:
            return body.decode()
        body, rest = body + rest[: int(size, 16)], rest[int(size, 16) + 2 :]


NOISY = {"rabbitmq_process_resident_memory_bytes", "rabbitmq_disk_space_available_bytes", "rabbitmq_process_open_fds"}


def test_metrics_are_written_in_slices_and_say_what_one_collection_says(monkeypatch: Any) -> None:
    monkeypatch.setattr(metrics, "SLICE_SECONDS", 0.0)  # one step per reactor turn
    node = scrape_node(1_000)
    collector = BrokerCollector(node, rabbitmq_compatible=True)
    clock = Clock()
    _channel, transport = http_get(metrics_site(collector, clock), b"/metrics")
    seen: list[int] = []
    alongside(clock, transport, seen.append)
    # Other clients were served between slices: they saw the response grow in many steps.
    assert len(set(seen)) > 1_000 // metrics.SLICE_QUEUES * len(metrics.QUEUE_FAMILIES)
    text = body_of(transport.value())
    expected = generate_latest(make_registry(collector)).decode()
    assert {s for s in samples(text) if s[0] not in NOISY} == {s for s in samples(expected) if s[0] not in NOISY}
    assert 'queue="q7\\n\\"\\\\",vhost="/"' in text
    # Written as prometheus_client writes them, so nothing that reads the text sees a change.
    assert 'postroom_queue_messages_published_total{queue="q998",vhost="/"} 999996.0\n' in text
    assert r'postroom_queue_messages_published_total{queue="q999",vhost="odd\"vhost\\"} 1.000998e+06' in text
    assert r'postroom_queue_policy_info{kind="policy",policy="ttl\"\\",queue="q10",vhost="/"} 1.0' in text
    assert 'postroom_queue_policy_info{kind="operator",policy="caps",queue="q20",vhost="/"} 1.0' in text
    assert 'policy_info{kind="policy",policy="caps"' not in text


def test_a_scraper_that_stops_reading_pauses_the_writing_and_one_that_leaves_stops_it(monkeypatch: Any) -> None:
    monkeypatch.setattr(metrics, "SLICE_SECONDS", 0.0)
    node = scrape_node(1_000)
    clock = Clock()
    channel, transport = http_get(metrics_site(BrokerCollector(node), clock), b"/metrics")

    def fill_up(written: int, limit: int) -> bool:
        if written < limit:
            return True
        transport.producer.pauseProducing()  # the socket's buffer is full
        return False

    alongside(clock, transport, lambda written: fill_up(written, 10_000))
    written = len(transport.value())
    clock.advance(0)
    assert 10_000 <= written == len(transport.value())
    transport.producer.resumeProducing()
    alongside(clock, transport, lambda now: fill_up(now, written + 10_000))
    assert written < len(transport.value()) < 200_000
    channel.connectionLost(ConnectionDone())
    stopped = len(transport.value())
    clock.advance(0)
    assert len(transport.value()) == stopped
    assert [call for call in clock.getDelayedCalls() if call.getTime() == clock.seconds()] == []


def test_a_queues_message_count_rate_goes_below_zero_and_its_gets_have_rates_of_their_own() -> None:
    clock = Clock()
    node = Node(clock=clock)
    queue = node.vhosts["/"].declare_queue("work", None)
    for _ in range(10):
        queue.enqueue(Message.build("", "work", b"x"))
    sampler = RateSampler(node, clock, interval=5.0)
    sampler.start()
    for _ in range(5):
        queue.settle([queue.get()])
        queue.got_no_ack += 1
        queue.delivered += 1
    clock.advance(5.0)
    assert sampler.rate("/", "work", "messages_ready") == -1.0
    assert (sampler.rate("/", "work", "get_no_ack"), sampler.rate("/", "work", "deliver")) == (1.0, 0.0)
    sampler.stop()

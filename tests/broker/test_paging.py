"""Bodies of deep queues beyond the memory budget go to disk and come back in order."""

from __future__ import annotations

import gc
import os
import random
import shutil
from pathlib import Path

import pytest
from pamqp import commands
from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher

from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.ready import NEVER
from postroom.broker.server.service import log_backlog, memory_budget
from postroom.broker.storage.body_paging import ENTRY_BYTES, MESSAGE_BYTES, Pager
from postroom.broker.storage.page_store import PageStore
from postroom.broker.tools.testing import Client, MemorySegmentStorage, encode, publish_frames
from postroom.broker.wal.log import WriteAheadLog
from postroom.config.schema import BrokerConfig, LimitsConfig, StorageConfig

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def paged_node(tmp_path: Path, budget: int = 10_000, journal: Journal | None = None) -> tuple[Node, Pager, Clock]:
    clock = Clock()
    node = Node(rng=random.Random(3), clock=clock)
    if journal is not None:
        node.set_journal(journal)
    pager = Pager(PageStore(str(tmp_path / "paging"), segment_bytes=8_000), budget, clock, journal)
    node.set_pager(pager)
    pager.startService()
    return node, pager, clock


def client(node: Node) -> Client:
    c = Client(node)
    c.handshake()
    c.open_channel(1)
    return c


def body(number: int, size: int = 1_000) -> bytes:
    return b"%04d" % number + bytes([number % 251]) * (size - 4)


def filled(tmp_path: Path, count: int) -> tuple[Node, Pager, Clock, Client]:
    """A node whose queue ``deep`` got ``count`` bodies of 1,000 bytes (budget 10,000), looked at once."""
    node, pager, clock = paged_node(tmp_path)
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="deep"))
    for n in range(count):
        c.send(publish_frames(1, "", "deep", body(n)))
    clock.advance(0)
    return node, pager, clock, c


def get_all(c: Client, queue: str, count: int) -> list[bytes]:
    got = []
    for _ in range(count):
        frames = c.call(1, commands.Basic.Get(queue=queue, no_ack=True))
        got.append(frames[-1][1].value)
    return got


def test_a_queue_past_the_budget_keeps_its_head_in_memory_and_its_tail_on_disk(tmp_path: Path) -> None:
    node, pager, clock = paged_node(tmp_path)
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="deep"))
    bodies = [body(n) for n in range(40)]
    for data in bodies:
        c.send(publish_frames(1, "", "deep", data))
    queue = node.vhosts["/"].queues["deep"]
    assert queue in pager.watched and queue.ready.ready_bytes == 40_000
    clock.advance(0)
    resident = [entry.message.resident for entry in queue.ready_entries()]
    assert resident == [True] * 10 + [False] * 30
    assert queue.ready.paged_bytes == 30_000 and pager.store.written == 30
    assert sorted(path.name for path in (tmp_path / "paging").iterdir()) == [f"{n:08d}.page" for n in range(1, 5)]
    assert get_all(c, "deep", 40) == bodies
    assert (queue.ready.ready_bytes, queue.ready.paged_bytes) == (0, 0)
    clock.advance(pager.interval)  # nothing watched: the store lets go of its last segment
    gc.collect()
    assert list((tmp_path / "paging").iterdir()) == []


def test_each_look_pages_only_what_arrived_since_the_last_one(tmp_path: Path) -> None:
    node, pager, clock, c = filled(tmp_path, 20)
    assert pager.store.written == 10
    for n in range(20, 25):
        c.send(publish_frames(1, "", "deep", body(n)))
    clock.advance(pager.interval)
    queue = node.vhosts["/"].queues["deep"]
    assert [entry.message.resident for entry in queue.ready_entries()] == [True] * 10 + [False] * 15
    assert pager.store.written == 15
    assert get_all(c, "deep", 25) == [body(n) for n in range(25)]


def test_the_budget_is_shared_by_the_watched_queues(tmp_path: Path) -> None:
    node, pager, clock = paged_node(tmp_path, budget=10_000)
    c = client(node)
    for name in ("a", "b"):
        c.call(1, commands.Queue.Declare(queue=name))
        for n in range(10):
            c.send(publish_frames(1, "", name, body(n)))
    clock.advance(0)
    for name in ("a", "b"):
        queue = node.vhosts["/"].queues[name]
        assert [entry.message.resident for entry in queue.ready_entries()] == [True] * 5 + [False] * 5
    assert get_all(c, "b", 10) == [body(n) for n in range(10)]


def test_a_queue_that_drains_is_no_longer_watched(tmp_path: Path) -> None:
    node, pager, clock, c = filled(tmp_path, 20)
    get_all(c, "deep", 20)
    queue = node.vhosts["/"].queues["deep"]
    clock.advance(pager.interval)
    assert pager.watched == set() and queue.ready.page_at == pager.watch_at
    assert clock.getDelayedCalls() == []
    c.send(publish_frames(1, "", "deep", body(0, size=pager.watch_at + 1)))
    assert queue in pager.watched and queue.ready.page_at == NEVER


def test_priority_queues_page_their_lowest_priorities_first(tmp_path: Path) -> None:
    node, _pager, clock = paged_node(tmp_path, budget=4_000)
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="prio", arguments={"x-max-priority": 5}))
    for n in range(8):
        properties = commands.Basic.Properties(priority=5 if n % 2 else 1)
        c.send(publish_frames(1, "", "prio", body(n), properties))
    clock.advance(0)
    queue = node.vhosts["/"].queues["prio"]
    order = [(int(entry.message.body[:4]), entry.paged) for entry in queue.ready_entries()]
    assert order == [(1, False), (3, False), (5, False), (7, False), (0, True), (2, True), (4, True), (6, True)]
    assert get_all(c, "prio", 8) == [body(n) for n in (1, 3, 5, 7, 0, 2, 4, 6)]


def test_paged_entries_that_expire_or_are_purged_leave_the_counts_right(tmp_path: Path) -> None:
    node, _pager, clock = paged_node(tmp_path)
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="ttl", arguments={"x-message-ttl": 1000}))
    for n in range(30):
        c.send(publish_frames(1, "", "ttl", body(n)))
    clock.advance(0)
    queue = node.vhosts["/"].queues["ttl"]
    assert queue.ready.paged_bytes == 20_000
    clock.advance(1.0)
    assert (queue.message_count, queue.ready.ready_bytes, queue.ready.paged_bytes) == (0, 0, 0)
    c.call(1, commands.Queue.Declare(queue="purged"))
    for n in range(30):
        c.send(publish_frames(1, "", "purged", body(n)))
    clock.advance(0.05)
    c.call(1, commands.Queue.Purge(queue="purged"))
    purged = node.vhosts["/"].queues["purged"]
    assert (purged.ready.ready_bytes, purged.ready.paged_bytes) == (0, 0)


def test_a_logged_body_is_dropped_not_copied_and_one_awaiting_the_log_is_kept(tmp_path: Path) -> None:
    journal = Journal(1, lambda: 0.0)
    node, pager, clock = paged_node(tmp_path, budget=4_000, journal=journal)
    log = WriteAheadLog(MemorySegmentStorage())
    log.open()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="durable", durable=True))
    for n in range(6):
        c.send(publish_frames(1, "", "durable", body(n), PERSISTENT))
    data, _ = journal.take(log.active, log.size, log.storage.read_at)
    log.append(data)
    for n in range(6, 10):  # recorded, not written yet
        c.send(publish_frames(1, "", "durable", body(n), PERSISTENT))
    clock.advance(0)
    queue = node.vhosts["/"].queues["durable"]
    assert [entry.message.resident for entry in queue.ready_entries()] == [True] * 4 + [False] * 2 + [True] * 4
    assert pager.store.written == 0 and journal.bodies.size == 4_000
    data, _ = journal.take(log.active, log.size, log.storage.read_at)
    log.append(data)
    assert get_all(c, "durable", 10) == [body(n) for n in range(10)]


def test_a_body_a_durable_queue_let_go_is_still_readable_by_a_transient_one(tmp_path: Path) -> None:
    journal = Journal(1, lambda: 0.0)
    node, _pager, clock = paged_node(tmp_path, budget=1_000, journal=journal)
    storage = MemorySegmentStorage()
    log = WriteAheadLog(storage)
    log.open()
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="durable", durable=True), commands.Queue.Declare(queue="copy"))
    c.call(1, commands.Queue.Bind(queue="durable", exchange="amq.fanout"))
    c.call(1, commands.Queue.Bind(queue="copy", exchange="amq.fanout"))
    bodies = [body(n) for n in range(10)]
    for data in bodies:
        c.send(publish_frames(1, "amq.fanout", "", data, PERSISTENT))
    data, _ = journal.take(log.active, log.size, log.storage.read_at)
    log.append(data)
    clock.advance(0)
    c.call(1, commands.Queue.Purge(queue="durable"))
    segment = log.active
    assert journal.ledger.live[segment] == 0
    assert journal.ledger.retirable([segment], segment + 1) == []  # "copy" still reads from it
    assert get_all(c, "copy", 10) == bodies
    journal.take(log.active, log.size, log.storage.read_at)  # the next write forgets what left
    gc.collect()
    assert journal.ledger.retirable([segment], segment + 1) == [segment]


def test_a_store_that_cannot_be_written_leaves_the_bodies_in_memory(tmp_path: Path) -> None:
    node, pager, clock = paged_node(tmp_path)
    warnings: list[str] = []

    def observe(event: dict) -> None:
        namespace = event.get("log_namespace", "")
        if event.get("log_level") is LogLevel.warn and namespace.startswith("postroom.broker.storage.body_paging"):
            warnings.append(event["log_format"].format(**event))

    globalLogPublisher.addObserver(observe)
    try:
        shutil.rmtree(tmp_path / "paging")
        c = client(node)
        c.call(1, commands.Queue.Declare(queue="deep"))
        for n in range(20):
            c.send(publish_frames(1, "", "deep", body(n)))
        clock.advance(0)
    finally:
        globalLogPublisher.removeObserver(observe)
    queue = node.vhosts["/"].queues["deep"]
    assert all(entry.message.resident for entry in queue.ready_entries()) and queue.ready.paged_bytes == 0
    assert warnings == ["cannot page message bodies to disk (No such file or directory); they stay in memory for now"]
    (tmp_path / "paging").mkdir()
    clock.advance(1.0)
    assert queue.ready.paged_bytes == 10_000
    assert get_all(c, "deep", 20) == [body(n) for n in range(20)]


@pytest.mark.parametrize("sizes", [[3_000, 3_000, 3_000], [9_000], [100] * 50])
def test_the_store_splits_writes_at_segment_ends_and_reads_every_body_back(tmp_path: Path, sizes: list[int]) -> None:
    from postroom.broker.core.message import Message

    store = PageStore(str(tmp_path), segment_bytes=8_000)
    messages = [Message.build("", "q", body(n, size)) for n, size in enumerate(sizes)]
    store.write(list(messages))
    assert not any(message.resident for message in messages)
    assert [message.body for message in messages] == [body(n, size) for n, size in enumerate(sizes)]
    assert all(path.stat().st_size <= max(8_000, max(sizes)) for path in tmp_path.iterdir())


def test_sealed_segments_are_opened_only_to_be_read_and_few_at_a_time(tmp_path: Path) -> None:
    from postroom.broker.core.message import Message
    from postroom.broker.storage import page_store

    def open_here() -> int:
        return sum(1 for fd in Path("/proc/self/fd").iterdir() if str(tmp_path) in os.path.realpath(fd))

    store = PageStore(str(tmp_path), segment_bytes=1_000)
    messages = [Message.build("", "q", body(n)) for n in range(3 * page_store.READ_HANDLES)]
    for message in messages:
        store.write([message])
    assert len(list(tmp_path.iterdir())) == len(messages) and open_here() == 1  # the active one
    order = list(range(len(messages)))
    random.Random(5).shuffle(order)
    for index in order:
        assert messages[index].body == body(index)
        messages[index].page_out()  # out of memory again: the next read opens its file again
        assert open_here() <= page_store.READ_HANDLES + 1
    del messages, message
    gc.collect()
    assert [path.name for path in tmp_path.iterdir()] == [f"{len(order):08d}.page"]  # the active one
    store.close()
    gc.collect()
    assert list(tmp_path.iterdir()) == [] and open_here() == 0


@pytest.mark.parametrize(
    ("budget", "watermark", "memory", "in_force"),
    [
        (256 << 20, 150 << 20, 24 << 30, 75 << 20),  # an absolute watermark: half of it
        (256 << 20, 0.4, 24 << 30, 256 << 20),  # 0.4 of 24 GiB: the budget
        (256 << 20, 0.4, 1 << 30, int((1 << 30) * 0.4) // 2),  # 0.4 of 1 GiB: half of that
        (64 << 20, 150 << 20, 24 << 30, 64 << 20),
    ],
)
def test_the_budget_in_force_is_at_most_half_the_memory_watermark(
    budget: int, watermark: float | int, memory: int, in_force: int
) -> None:
    config = BrokerConfig(
        storage=StorageConfig(memory_budget=budget), limits=LimitsConfig(memory_high_watermark=watermark)
    )
    assert memory_budget(config, memory) == in_force


@pytest.mark.parametrize(
    ("backlog", "watermark", "in_force"),
    [
        (64 << 20, 128 << 20, 8 << 20),  # a sixteenth of the watermark
        (64 << 20, 1 << 30, 64 << 20),  # storage.max_backlog
        (4 << 20, 128 << 20, 4 << 20),
    ],
)
def test_the_log_backlog_in_force_is_at_most_a_sixteenth_of_the_memory_watermark(
    backlog: int, watermark: int, in_force: int
) -> None:
    config = BrokerConfig(
        storage=StorageConfig(max_backlog=backlog), limits=LimitsConfig(memory_high_watermark=watermark)
    )
    assert log_backlog(config, 24 << 30) == in_force


def test_the_budget_in_force_leaves_what_the_broker_holds_besides_under_half_the_watermark(tmp_path: Path) -> None:
    node, pager, clock = paged_node(tmp_path)  # a budget of 10,000 bytes
    resident = [0]
    pager.follow_memory(100_000, lambda: resident[0])  # kept under 50,000 bytes
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="deep"))
    bodies = [body(n) for n in range(20)]
    for data in bodies:
        c.send(publish_frames(1, "", "deep", data))
    queued = 20 * (ENTRY_BYTES + MESSAGE_BYTES + 1_000)
    assert pager.memory_used() == queued
    assert pager.budget_now() == 10_000  # no reading yet
    resident[0] = queued + 44_000  # 44,000 bytes besides the queue: 6,000 left of 50,000
    clock.advance(0)
    queue = node.vhosts["/"].queues["deep"]
    assert pager.in_force == 6_000 and pager.budget == 10_000
    assert [entry.message.resident for entry in queue.ready_entries()] == [True] * 6 + [False] * 14
    resident[0] = 200_000  # over the watermark: the floor
    assert pager.budget_now() == 10_000 // 16
    resident[0] = 1_000  # less than the queue is counted for: nothing besides
    assert pager.budget_now() == 10_000
    drained: list[bool] = []
    pager.on_drained = lambda: drained.append(True)
    assert get_all(c, "deep", 20) == bodies
    clock.advance(pager.interval)
    assert drained == [True] and not pager.watched  # freed memory goes back once the queue is drained
    assert pager.in_force == 10_000  # and the budget is whole again for logged bodies
    clock.advance(pager.interval)
    assert drained == [True]


def test_publishers_are_slowed_while_a_queue_with_consumers_is_far_behind(tmp_path: Path) -> None:
    node, pager, clock = paged_node(tmp_path, budget=1 << 30)
    pager.watch_at = 4096
    pager.flow_depth = 50
    pager.on_flow = node.set_flow
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="behind"), commands.Queue.Declare(queue="unconsumed"))
    for n in range(100):
        c.send(publish_frames(1, "", "unconsumed", body(n)))
    clock.advance(1)
    assert not node.flow  # a backlog nobody consumes yet is not a reason to slow anyone
    c.call(1, commands.Basic.Qos(prefetch_count=1))
    c.call(1, commands.Basic.Consume(queue="behind", consumer_tag="slow"))
    for n in range(100):
        c.send(publish_frames(1, "", "behind", body(n)))
    clock.advance(1)
    assert node.flow and pager.flow
    queue = node.vhosts["/"].queues["behind"]
    for tag in range(1, 60):
        c.send(encode(1, commands.Basic.Ack(delivery_tag=tag)))
    assert queue.message_count < 50
    clock.advance(1)
    assert not node.flow

"""Deep queues spool what is behind their window to disk, as records, and read it back in order."""

from __future__ import annotations

import contextlib
import gc
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from postroom.broker.core.dead_letter_events import RUN_ID_BITS, DeadLetterLog
from postroom.broker.core.dead_lettering import DeadLetterReason
from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.entry_spool import (
    BATCH,
    BATCH_BYTES,
    IN_LOG,
    RECORD_MAX,
    REDELIVERED,
    MemorySpoolStorage,
    Spool,
    SpoolRecord,
)
from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.queue import WorkQueue
from postroom.broker.storage.body_paging import ENTRY_BYTES, MESSAGE_BYTES, Pager
from postroom.broker.storage.checkpoint import Checkpoint, restore_checkpoint
from postroom.broker.storage.page_store import PageStore
from postroom.broker.storage.spool_files import Spooler
from postroom.broker.tools.testing import Client, MemorySegmentStorage, publish_frames
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.records import DeadLetterSettled, Removed
from postroom.broker.wal.recovery import Snapshot, replay_located
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, iter_records
from postroom.config.schema import BrokerConfig

PERSISTENT = commands.Basic.Properties(delivery_mode=2)
WINDOW = 8
#: Enough behind the window for records, not only waiting entries.
COUNT = WINDOW + 2 * BATCH + 100


@contextlib.contextmanager
def logged_errors() -> Iterator[list[str]]:
    """The errors the broker logs meanwhile."""
    errors: list[str] = []

    def observe(event: dict) -> None:
        if event.get("log_level") is LogLevel.error:
            errors.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        yield errors
    finally:
        globalLogPublisher.removeObserver(observe)


def body(number: int) -> bytes:
    return b"%06d" % number + bytes([number % 251]) * 50


class Broker:
    """A node whose queues spool behind a window of :data:`WINDOW`, with a write-ahead log in memory."""

    def __init__(
        self,
        tmp_path: Path,
        logged: bool = True,
        restore: tuple[Snapshot, WriteAheadLog] | None = None,
        checkpoint: Checkpoint | None = None,
        budget: int = 0,
    ) -> None:
        """:param restore: start from this state and log (the log read, or the log read after
        ``checkpoint`` folded into its topology)
        :param budget: the memory budget (0: memory is always short, so a queue spools behind
            its window at once)"""
        self.clock = Clock()
        if restore is not None:
            snapshot, self.log = restore
            self.journal: Journal | None = Journal(snapshot.max_message_id + 1, self.clock.seconds)
        else:
            self.log = WriteAheadLog(MemorySegmentStorage())
            self.log.open()
            self.journal = Journal(1, self.clock.seconds) if logged else None
        self.store = PageStore(str(tmp_path / "paging"))
        self.pager = Pager(self.store, budget, self.clock, self.journal)
        self.spool_dir = tmp_path / "spool"
        self.pager.spooler = Spooler(str(self.spool_dir), self.store, self.journal, self.log.storage.read_at, WINDOW)
        if restore is not None:

            def adopt(node: Node) -> None:
                assert checkpoint is not None and self.journal is not None and self.pager.spooler is not None
                node.recovered_dead_letter_queues = restore_checkpoint(
                    checkpoint, restore[0], node.vhosts, self.journal, self.pager.spooler
                )

            self.node = node_from_config(
                BrokerConfig(),
                self.clock,
                self.journal,
                restore[0],
                self.log.storage.read_at,
                pager=self.pager,
                before_messages=adopt if checkpoint is not None else None,
            )
        else:
            self.node = Node(rng=random.Random(3), clock=self.clock)
            if self.journal is not None:
                self.node.set_journal(self.journal)
            self.node.set_pager(self.pager)
        self.client = Client(self.node)
        self.client.handshake()
        self.client.open_channel(1)

    def write(self) -> None:
        """What the log's writer does: append what is pending and report it durable."""
        assert self.journal is not None
        data, position = self.journal.take(self.log.active, self.log.size, self.log.storage.read_at)
        self.log.append(data)
        self.journal.synced_to(position)

    def publish(self, queue: str, bodies: list[bytes], properties: commands.Basic.Properties | None = None) -> None:
        for n, data in enumerate(bodies):
            self.client.send(publish_frames(1, "", queue, data, properties))
            if self.journal is not None and n % 500 == 499:
                self.write()
        if self.journal is not None:
            self.write()

    def queue(self, name: str) -> WorkQueue:
        return self.node.vhosts["/"].queues[name]

    def get_all(self, queue: str, count: int, no_ack: bool = True) -> list[bytes]:
        got = []
        for _ in range(count):
            frames = self.client.call(1, commands.Basic.Get(queue=queue, no_ack=no_ack))
            assert isinstance(frames[0][1], commands.Basic.GetOk), frames[0]
            got.append(frames[-1][1].value)
        return got


def test_a_deep_transient_queue_keeps_its_window_in_memory_and_the_rest_as_records(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    broker.client.call(1, commands.Queue.Declare(queue="deep"))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("deep", bodies)
    queue = broker.queue("deep")
    spool = queue.ready.spool
    assert spool is not None
    assert len(queue.ready_entries()) == WINDOW and queue.message_count == COUNT
    assert spool.count == COUNT - WINDOW and spool.recorded_count >= 2 * BATCH
    assert spool.bytes == sum(len(data) for data in bodies[WINDOW:])
    assert list(broker.spool_dir.iterdir())  # the records are on disk
    frames = broker.client.call(1, commands.Queue.Declare(queue="deep", passive=True))
    assert frames[0][1].message_count == COUNT
    assert broker.get_all("deep", COUNT) == bodies
    assert queue.ready.spool is None and queue.message_count == 0 and queue.ready.ready_bytes == 0
    assert list(broker.spool_dir.iterdir()) == []  # each queue's records went with its spool
    gc.collect()
    broker.store.close()
    gc.collect()
    assert list((tmp_path / "paging").iterdir()) == []  # and the copies of its content


def test_under_the_budget_a_queue_past_its_window_stays_in_memory(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False, budget=1 << 30)
    broker.client.call(1, commands.Queue.Declare(queue="deep"))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("deep", bodies)
    queue = broker.queue("deep")
    assert queue.ready.spool is None and len(queue.ready_entries()) == COUNT
    assert queue in broker.pager.watched and queue.ready.spool_at > COUNT  # it asks again much later
    assert not broker.spool_dir.exists() or not list(broker.spool_dir.iterdir())
    assert broker.get_all("deep", COUNT) == bodies


def test_over_the_budget_the_biggest_queue_spools_and_is_back_in_memory_once_memory_is_free(tmp_path: Path) -> None:
    per_message = ENTRY_BYTES + MESSAGE_BYTES + len(body(0))
    broker = Broker(tmp_path, logged=False, budget=(COUNT // 2) * per_message)
    broker.pager.startService()
    c = broker.client
    c.call(1, commands.Queue.Declare(queue="big"))
    c.call(1, commands.Queue.Declare(queue="small"))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("big", bodies)
    big = broker.queue("big")
    assert big.ready.spool is not None and big.ready.spool.recording
    # It filled half the budget in memory, and memory was short when its next window was full:
    # what it held stays in memory, what arrived since is spooled.
    in_memory = len(big.ready_entries())
    assert COUNT // 2 <= in_memory <= COUNT // 2 + WINDOW and big.ready.spool.count == COUNT - in_memory
    assert big.ready.spool.recorded_count >= BATCH and list(broker.spool_dir.iterdir())
    got = broker.get_all("big", in_memory - WINDOW)
    broker.clock.advance(0)  # the pager looks: well under the budget now
    assert not big.ready.spool.recording
    broker.publish("small", [body(n) for n in range(3 * WINDOW)])
    small = broker.queue("small")
    assert small.ready.spool is None and small.message_count == 3 * WINDOW  # memory is not short

    recorded = big.ready.spool.recorded_count
    late = [body(n) for n in range(COUNT, COUNT + 300)]
    broker.publish("big", late)
    assert big.ready.spool.recorded_count == recorded and len(big.ready.spool.waiting) >= 300  # kept in memory
    while big.ready.spool is not None:
        got += broker.get_all("big", 1)
    assert len(got) <= COUNT  # once the records are read back:
    assert big.message_count >= 300 and len(big.ready_entries()) == big.message_count  # all in memory again
    got += broker.get_all("big", big.message_count)
    assert got == bodies + late
    assert broker.get_all("small", 3 * WINDOW) == [body(n) for n in range(3 * WINDOW)]
    assert list(broker.spool_dir.iterdir()) == []


def test_over_the_budget_the_queues_that_hold_the_most_spool_until_the_others_fit_half_of_it(tmp_path: Path) -> None:
    per_message = ENTRY_BYTES + MESSAGE_BYTES + len(body(0))
    broker = Broker(tmp_path, logged=False, budget=1 << 30)
    broker.pager.startService()
    sizes = {"a": 1000, "b": 400, "c": 100}
    for name, count in sizes.items():
        broker.client.call(1, commands.Queue.Declare(queue=name))
        broker.publish(name, [body(n) for n in range(count)])
    queues = {name: broker.queue(name) for name in sizes}
    assert all(queue.ready.spool is None for queue in queues.values())
    broker.pager.budget = 1200 * per_message  # 1,500 held: over it, and "b" and "c" fit half of it
    broker.clock.advance(1)
    assert [name for name, queue in queues.items() if queue.ready.spool is not None] == ["a"]
    broker.pager.budget = 800 * per_message  # "b" and "c" do not fit half of it; "c" does
    broker.clock.advance(1)
    assert [name for name, queue in queues.items() if queue.ready.spool is not None] == ["a", "b"]
    broker.publish("a", [b"late"])
    assert queues["a"].message_count == 1001 and queues["a"].ready.spool.count == 1  # type: ignore[union-attr]
    for name, count in sizes.items():
        assert broker.get_all(name, count)[:2] == [body(0), body(1)]
    assert broker.get_all("a", 1) == [b"late"]


def test_a_message_routed_to_several_queues_counts_once_against_the_budget(tmp_path: Path) -> None:
    queues = [f"q{n}" for n in range(10)]
    shared = ENTRY_BYTES * len(queues) + MESSAGE_BYTES + len(body(0))  # each message, once
    broker = Broker(tmp_path, logged=False, budget=COUNT * shared * 3 // 2)
    c = broker.client
    c.call(1, commands.Exchange.Declare(exchange="all", exchange_type="fanout"))
    for name in queues:
        c.call(1, commands.Queue.Declare(queue=name))
        c.call(1, commands.Queue.Bind(queue=name, exchange="all"))
    first = [body(n) for n in range(COUNT)]
    for data in first:  # counted once per queue, these would be about four times the budget
        c.send(publish_frames(1, "all", "", data))
    assert all(broker.queue(name).ready.spool is None for name in queues)
    assert broker.pager.sharing() == len(queues)
    for data in first:  # twice the budget, counted once
        c.send(publish_frames(1, "all", "", data))
    assert any(broker.queue(name).ready.spool is not None for name in queues)
    for name in queues:
        assert broker.get_all(name, 2 * COUNT) == first + first


def test_persistent_messages_are_spooled_as_pointers_into_the_log_and_acked_there(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    journal = broker.journal
    assert journal is not None
    broker.client.call(1, commands.Queue.Declare(queue="durable", durable=True))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("durable", bodies, PERSISTENT)
    queue = broker.queue("durable")
    assert queue.ready.spool is not None
    recorded = queue.ready.spool.recorded_count
    assert recorded >= BATCH
    assert sum(journal.ledger.spooled_refs.values()) == recorded
    assert not (tmp_path / "paging").exists() or not list((tmp_path / "paging").iterdir())  # nothing copied
    assert sum(journal.ledger.live.values()) == COUNT  # every message still holds its segment
    assert not any(journal.ledger.sparse(segment) for segment in journal.ledger.live)
    got = broker.get_all("durable", COUNT, no_ack=True)
    assert got == bodies
    broker.write()
    assert sum(journal.ledger.live.values()) == 0 and not journal.ledger.spooled_refs
    data = broker.log.storage.read(broker.log.active)
    removed = [r for _s, _e, r in iter_records(data, SEGMENT_HEADER_BYTES) if type(r) is Removed]
    assert sorted(i for r in removed for i in r.message_ids) == list(range(1, COUNT + 1))


def test_a_message_whose_log_record_is_not_written_yet_waits_in_memory(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    broker.client.call(1, commands.Queue.Declare(queue="durable", durable=True))
    for n in range(COUNT):  # nothing written to the log
        broker.client.send(publish_frames(1, "", "durable", body(n), PERSISTENT))
    spool = broker.queue("durable").ready.spool
    assert spool is not None and spool.recorded_count == 0 and len(spool.waiting) == COUNT - WINDOW
    broker.write()
    broker.client.send(publish_frames(1, "", "durable", body(COUNT), PERSISTENT))
    assert spool.recorded_count == COUNT - WINDOW  # the next push records what the log now has
    broker.write()
    assert broker.get_all("durable", COUNT + 1) == [body(n) for n in range(COUNT + 1)]


def test_length_limits_count_spooled_messages_and_drop_from_the_head(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    limit = BATCH + 50
    broker.client.call(1, commands.Queue.Declare(queue="capped", arguments={"x-max-length": limit}))
    broker.client.call(1, commands.Queue.Declare(queue="bytes", arguments={"x-max-length-bytes": limit * len(body(0))}))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("capped", bodies)
    broker.publish("bytes", bodies)
    for name in ("capped", "bytes"):
        assert broker.queue(name).message_count == limit
        assert broker.get_all(name, limit) == bodies[-limit:]


def test_spooled_messages_expire_when_they_come_back(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    broker.client.call(1, commands.Queue.Declare(queue="ttl", arguments={"x-message-ttl": 1000}))
    broker.publish("ttl", [body(n) for n in range(COUNT)])
    queue = broker.queue("ttl")
    broker.clock.advance(0.5)
    broker.publish("ttl", [b"late"])
    assert queue.message_count == COUNT + 1
    for _ in range(COUNT):
        broker.clock.advance(0.6)
        if queue.message_count == 1:
            break
    assert queue.message_count == 1 and queue.dead_lettered
    assert broker.get_all("ttl", 1) == [b"late"]


@pytest.mark.parametrize("method", [commands.Queue.Purge, commands.Queue.Delete])
def test_a_purge_or_delete_takes_the_spool_and_logs_the_removals(tmp_path: Path, method: type) -> None:
    broker = Broker(tmp_path)
    journal = broker.journal
    assert journal is not None
    broker.client.call(1, commands.Queue.Declare(queue="durable", durable=True))
    broker.publish("durable", [body(n) for n in range(COUNT)], PERSISTENT)
    queue = broker.queue("durable")
    frames = broker.client.call(1, method(queue="durable"))
    assert frames[0][1].message_count == COUNT
    assert queue.ready.spool is None and queue.message_count == 0
    broker.write()
    assert sum(journal.ledger.live.values()) == 0 and not journal.ledger.spooled_refs
    assert list(broker.spool_dir.iterdir()) == []
    if method is commands.Queue.Purge:
        broker.publish("durable", [b"after"], PERSISTENT)
        assert broker.get_all("durable", 1) == [b"after"]


class _Entry:
    def __init__(self, number: int) -> None:
        self.message = type("M", (), {"size": 1})()
        self.number = number


class _Taken:
    """What a test's spool makes of a loaded record: the record, with a size."""

    def __init__(self, record: SpoolRecord) -> None:
        self.record = record
        self.message = self
        self.size = 1


def test_a_spool_whose_storage_fails_keeps_its_entries_and_loses_nothing() -> None:
    storage = MemorySpoolStorage()
    storage.fail_appends = True
    records: list[SpoolRecord] = []

    class Locator:
        def locatable(self, _entry: object) -> bool:
            return True

        def locate(self, entries: list) -> list[SpoolRecord]:
            made = [SpoolRecord(entry.number, entry.number, 1, 10, 1, 0, IN_LOG) for entry in entries]
            records.extend(made)
            return made

        def load(self, loaded: list[SpoolRecord]) -> list:
            return [_Entry(record.message_id) for record in loaded]

        def released(self, _records: list[SpoolRecord]) -> None:
            pass

    errors: list[OSError] = []
    spool = Spool(storage, Locator(), on_error=errors.append)  # type: ignore[arg-type]
    for entry in [_Entry(n) for n in range(3 * BATCH)]:
        spool.push(entry)  # type: ignore[arg-type]  # a failed append does not reach the queue
    assert spool.count == 3 * BATCH
    assert [str(error) for error in errors] == ["no space left on device"]  # once, not per batch
    storage.fail_appends = False
    taken = spool.take(3 * BATCH, lambda message, record: message)
    assert [getattr(item, "number", item) for item in taken] == list(range(3 * BATCH))
    assert spool.count == 0


class _RecordsLocator:
    """Records pushed entries as logged (their number as message id); loads records as they are."""

    def __init__(self) -> None:
        self.dropped_ids: list[int] = []

    def locatable(self, _entry: object) -> bool:
        return True

    def locate(self, entries: list) -> list[SpoolRecord]:
        return [SpoolRecord(entry.number, 64 * entry.number, 7, 60, 1, 0, IN_LOG) for entry in entries]

    def load(self, loaded: list[SpoolRecord]) -> list[SpoolRecord]:
        return loaded

    def released(self, _records: list[SpoolRecord]) -> None:
        pass

    def dropped(self, records: list[SpoolRecord]) -> None:
        self.dropped_ids += [record.message_id for record in records]


@pytest.mark.parametrize("changed", [False, True])
def test_records_adopted_from_a_checkpoint_come_back_redelivered_and_what_arrived_after_does_not(
    changed: bool,
) -> None:
    """Adopted records are marked redelivered as they are read, copies among them (their content
    went with the last run) are left out, and with removals and delivery counts logged after the
    checkpoint those apply; records spooled after the start, read in the same batch, stay as
    they were recorded."""
    adopted = [
        SpoolRecord(1, 100, 3, 60, 1, 0, IN_LOG, 0.0),
        SpoolRecord(2, 200, 3, 60, 1, 2, IN_LOG, 1.5),
        SpoolRecord(3, 0, 9, 60, 1, 0, 0, 0.0),  # a copy in the last run's page store
        SpoolRecord(4, 300, 4, 60, 1, 1, IN_LOG | REDELIVERED, 0.0),
    ]
    storage = MemorySpoolStorage()
    storage.append(b"".join(record.pack() for record in adopted))
    locator = _RecordsLocator()
    spool = Spool(storage, locator)  # type: ignore[arg-type]
    removed, counts = ({2}, {4: 5}) if changed else (set(), {})
    spool.adopt(len(storage.data), 3, 3, {3: 2, 4: 1}, set(removed), dict(counts))
    for number in range(10, 10 + BATCH):
        spool.push(_Entry(number))  # type: ignore[arg-type]
    taken = [item.record for item in spool.take(BATCH + 10, lambda record, _record: _Taken(record))]  # type: ignore[arg-type]
    expected = [record._replace(flags=record.flags | REDELIVERED) for record in adopted if record.flags & IN_LOG]
    if changed:
        expected = [record for record in expected if record.message_id not in removed]
        expected = [record._replace(delivery_count=counts.get(record.message_id, record[5])) for record in expected]
    assert taken[: len(expected)] == expected
    assert taken[len(expected) :] == locator.locate([_Entry(number) for number in range(10, 10 + BATCH)])
    assert locator.dropped_ids == sorted(removed)
    assert spool.count == 0


def test_what_a_held_spool_kept_in_memory_is_recorded_a_batch_at_a_time_once_it_records_again() -> None:
    located: list[int] = []

    class Locator:
        def locatable(self, _entry: object) -> bool:
            return True

        def locate(self, entries: list) -> list[SpoolRecord]:
            located.append(len(entries))
            return [SpoolRecord(entry.number, entry.number, 1, 10, 1, 0, IN_LOG) for entry in entries]

    spool = Spool(MemorySpoolStorage(), Locator())  # type: ignore[arg-type]
    spool.hold()
    held = 3 * RECORD_MAX
    for n in range(held):
        spool.push(_Entry(n))  # type: ignore[arg-type]
    assert located == [] and len(spool.waiting) == held  # memory was not short
    spool.resume()
    assert located == [RECORD_MAX]  # one batch now, not all at once
    for n in range(held, held + BATCH - 1):
        spool.push(_Entry(n))  # type: ignore[arg-type]
    assert located == [RECORD_MAX]
    spool.push(_Entry(held + BATCH - 1))  # type: ignore[arg-type]
    assert located == [RECORD_MAX, RECORD_MAX]  # another once a batch more had arrived
    spool.record_batch()  # as the pager does at each look
    assert located == [RECORD_MAX, RECORD_MAX, RECORD_MAX]
    assert spool.recorded_count == 3 * RECORD_MAX and len(spool.waiting) == BATCH


def dead_letter_broker(tmp_path: Path) -> tuple[Broker, DeadLetterLog]:
    """A broker whose queue "work" dead-letters at once into "dlq" and "audit", and its event log."""
    broker = Broker(tmp_path, logged=False)
    events = DeadLetterLog(3, broker.clock.seconds)
    broker.node.vhosts["/"].dead_letters = events
    c = broker.client
    c.call(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    c.call(1, commands.Queue.Declare(queue="dlq"), commands.Queue.Declare(queue="audit"))
    c.call(1, commands.Queue.Bind(queue="dlq", exchange="dlx"), commands.Queue.Bind(queue="audit", exchange="dlx"))
    c.call(1, commands.Queue.Declare(queue="work", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 0}))
    return broker, events


def test_dead_letters_spooled_in_their_queue_are_still_recorded_when_they_leave(tmp_path: Path) -> None:
    broker, events = dead_letter_broker(tmp_path)
    broker.publish("work", [body(n) for n in range(COUNT)])  # each dies at once, into both queues
    assert broker.queue("dlq").ready.spool is not None and broker.queue("dlq").ready.spool.recorded_count >= BATCH
    assert events.dead_lettered_count == COUNT and events.held() == 2 * COUNT
    assert len(events._held) <= WINDOW  # those behind the window cost no memory per dead letter
    events.take()
    assert len(broker.get_all("dlq", COUNT)) == COUNT
    broker.client.call(1, commands.Queue.Purge(queue="audit"))
    settled = [record for _start, _end, record in iter_records(events.take()) if type(record) is DeadLetterSettled]
    assert sorted((record.queue, record.dead_letter_id) for record in settled) == sorted(
        (queue, (3 << RUN_ID_BITS) + n) for queue in ("dlq", "audit") for n in range(1, COUNT + 1)
    )
    assert events.held() == 0


def test_a_dead_letter_behind_one_queues_spool_and_in_anothers_memory_is_recorded_from_both(tmp_path: Path) -> None:
    broker, events = dead_letter_broker(tmp_path)
    broker.publish("dlq", [body(n) for n in range(WINDOW + 2)])  # "dlq" spools from now on; "audit" is empty
    broker.publish("work", [body(n) for n in range(3)])  # the same copies, behind "dlq"'s spool and in "audit"
    assert broker.queue("dlq").ready.spool is not None and broker.queue("audit").ready.spool is None
    assert events.held() == 6
    assert len(broker.get_all("dlq", WINDOW + 5)) == WINDOW + 5
    assert len(broker.get_all("audit", 3)) == 3
    settled = [record for _start, _end, record in iter_records(events.take()) if type(record) is DeadLetterSettled]
    assert sorted((record.queue, record.dead_letter_id) for record in settled) == sorted(
        (queue, (3 << RUN_ID_BITS) + n) for queue in ("dlq", "audit") for n in range(1, 4)
    )
    assert events.held() == 0


def test_deliveries_across_refills_go_back_in_their_order(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    c = broker.client
    c.call(1, commands.Queue.Declare(queue="work"))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("work", bodies)
    c.call(1, commands.Basic.Qos(prefetch_count=5 * WINDOW))
    frames = c.call(1, commands.Basic.Consume(queue="work", consumer_tag="c"))
    tags = [frame.delivery_tag for _channel, frame in frames if isinstance(frame, commands.Basic.Deliver)]
    assert len(tags) == 5 * WINDOW  # the window was refilled several times
    c.call(1, commands.Basic.Cancel(consumer_tag="c"))
    c.call(1, commands.Basic.Nack(delivery_tag=tags[-1], multiple=True, requeue=True))
    # Every message out, records and entries still waiting alike, then all back at once.
    assert broker.get_all("work", COUNT, no_ack=False) == bodies
    c.call(1, commands.Basic.Recover(requeue=True))
    assert broker.get_all("work", COUNT) == bodies


def test_a_spool_that_cannot_be_written_says_so_once_and_keeps_the_messages(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    broker.client.call(1, commands.Queue.Declare(queue="deep"))
    shutil.rmtree(tmp_path / "paging")  # the copies of transient messages cannot be written
    appends = []
    append = broker.store.append
    broker.store.append = lambda contents: appends.append(len(contents)) or append(contents)  # type: ignore[method-assign]
    bodies = [body(n) for n in range(COUNT + BATCH)]
    with logged_errors() as errors:
        broker.publish("deep", bodies[:COUNT])
        spool = broker.queue("deep").ready.spool
        assert spool is not None and spool.recorded_count == 0 and spool.error is not None
        assert len(appends) == (COUNT - WINDOW) // BATCH  # tried once per batch gathered, not at every push
        (tmp_path / "paging").mkdir()
        broker.publish("deep", bodies[COUNT:])  # the next batch records them all
    assert errors == ["cannot spool messages for queue 'deep' (No such file or directory); they stay in memory for now"]
    assert spool.error is None and spool.recorded_count >= COUNT - WINDOW  # those that waited, too
    assert broker.get_all("deep", COUNT + BATCH) == bodies


def test_damaged_spooled_content_is_reported_and_kept_not_delivered_wrong(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    broker.client.call(1, commands.Queue.Declare(queue="deep"))
    bodies = [body(n) for n in range(COUNT)]
    broker.publish("deep", bodies)
    for page in (tmp_path / "paging").glob("*.page"):
        with open(page, "r+b") as file:
            file.seek(40)
            file.write(b"\xff" * 8)  # inside the first copied message
    with logged_errors() as errors:
        got = broker.get_all("deep", WINDOW)
        frames = broker.client.call(1, commands.Basic.Get(queue="deep", no_ack=True))
    assert got == bodies[:WINDOW]
    assert isinstance(frames[0][1], commands.Basic.GetEmpty)  # not a wrong body
    assert broker.queue("deep").message_count == COUNT - WINDOW
    assert (
        errors
        and "cannot read spooled messages back for queue 'deep'" in errors[0]
        and "they stay spooled" in errors[0]
    )
    assert "page store segment 1 at offset 0" in errors[0]


def test_big_messages_are_recorded_without_waiting_for_a_full_batch(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    broker.client.call(1, commands.Queue.Declare(queue="big"))
    size = 120_000  # one body frame each
    bodies = [bytes([n % 256]) * size for n in range(WINDOW + 60)]
    broker.publish("big", bodies)
    spool = broker.queue("big").ready.spool
    assert spool is not None and spool.count == 60
    assert spool.recorded_count >= 60 - BATCH_BYTES // size  # at most 4 MiB of them still in memory
    assert broker.get_all("big", WINDOW + 60) == bodies


def test_a_queue_recovered_from_the_log_spools_behind_its_window_with_counts_and_ttls(tmp_path: Path) -> None:
    before = Broker(tmp_path / "before")
    c = before.client
    c.call(1, commands.Queue.Declare(queue="durable", durable=True, arguments={"x-message-ttl": 60_000}))
    bodies = [body(n) for n in range(COUNT)]
    before.publish("durable", bodies, PERSISTENT)
    before.get_all("durable", 20, no_ack=False)
    c.call(1, commands.Basic.Recover(requeue=True))  # the first 20 were delivered once
    before.write()
    log = WriteAheadLog(before.log.storage)
    log.open()
    snapshot = replay_located(log.located_records())

    after = Broker(tmp_path / "after", restore=(snapshot, log))
    queue = after.queue("durable")
    spool = queue.ready.spool
    assert spool is not None and spool.count == COUNT - WINDOW == spool.recorded_count
    assert after.journal is not None and sum(after.journal.ledger.live.values()) == COUNT
    got = []
    for n in range(COUNT):
        frames = after.client.call(1, commands.Basic.Get(queue="durable", no_ack=True))
        get_ok, header, content = frames[0][1], frames[1][1], frames[-1][1]
        assert get_ok.redelivered
        assert (header.properties.headers or {}).get("x-delivery-count", 0) == (1 if n < 20 else 0), n
        got.append(content.value)
        if n == COUNT // 2:
            after.clock.advance(61)  # the TTL counts from the first publish: the rest expire
            break
    assert got == bodies[: len(got)]
    for _ in range(COUNT):
        after.clock.advance(0.1)
        if not queue.message_count:
            break
    assert queue.message_count == 0 and queue.dead_lettered == {DeadLetterReason.EXPIRED: COUNT - len(got)}


def test_a_queue_whose_spool_cannot_be_read_is_still_deleted(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    broker.client.call(1, commands.Queue.Declare(queue="durable", durable=True))
    broker.publish("durable", [body(n) for n in range(COUNT)], PERSISTENT)
    spool = broker.queue("durable").ready.spool
    assert spool is not None

    def unreadable(_offset: int, _length: int) -> bytes:
        raise OSError(5, "Input/output error")

    spool.storage.read = unreadable  # type: ignore[method-assign]
    with logged_errors() as errors:
        frames = broker.client.call(1, commands.Queue.Delete(queue="durable"))
    assert frames[0][1].message_count == COUNT
    assert "durable" not in broker.node.vhosts["/"].queues and spool.count == 0
    assert errors == [
        "cannot read spooled messages back for queue 'durable' (Input/output error); "
        "they are dropped (their files go at the next start)"
    ]
    assert list(broker.spool_dir.iterdir()) == []


def test_a_window_of_big_messages_is_refilled_to_its_bytes_not_to_its_count(tmp_path: Path) -> None:
    broker = Broker(tmp_path, logged=False)
    size = 20_000
    assert broker.pager.spooler is not None
    broker.pager.spooler.window_bytes = 3 * size  # the queue's share of the budget: 3 of them
    broker.client.call(1, commands.Queue.Declare(queue="big"))
    bodies = [bytes([n % 256]) * size for n in range(WINDOW + 60)]
    broker.publish("big", bodies)
    line = broker.queue("big").ready
    assert line.spool is not None and line.spool.record() == 60  # all recorded now (not 4 MiB of them)
    got = broker.get_all("big", WINDOW)  # what it held before it spooled
    for _ in range(60):
        got += broker.get_all("big", 1)
        assert line.ready_bytes <= 2 * size  # 3 at most came back (WINDOW would be 8)
    assert got == bodies and line.spool is None


def test_a_spool_takes_records_up_to_a_byte_bound_and_waiting_entries_only_after_the_last() -> None:
    spool = Spool(MemorySpoolStorage(), _SizedLocator())  # type: ignore[arg-type]
    for n in range(BATCH):
        spool.push(_Entry(n))  # type: ignore[arg-type]  # a batch: recorded
    for n in range(BATCH, BATCH + 5):
        spool.push(_Entry(n))  # type: ignore[arg-type]  # waiting behind the records
    assert spool.recorded_count == BATCH and len(spool.waiting) == 5

    def take(count: int, max_bytes: int) -> list[int]:
        taken = spool.take(count, lambda message, record: _Taken(record), max_bytes)
        return [item.record.message_id if isinstance(item, _Taken) else item.number for item in taken]

    assert take(10, 250) == [0, 1]  # bodies of 100 bytes
    assert take(10, 50) == [2]  # one at least
    assert take(BATCH + 5, (BATCH - 3) * 100 - 1) == list(range(3, BATCH - 1))  # the last record stays...
    assert take(BATCH + 5, 1 << 30) == list(range(BATCH - 1, BATCH + 5))  # ...and the waiting behind it
    assert spool.count == 0


class _SizedLocator(_RecordsLocator):
    """Records pushed entries with bodies of 100 bytes."""

    def locate(self, entries: list) -> list[SpoolRecord]:
        return [SpoolRecord(entry.number, 64 * entry.number, 7, 160, 100, 0, IN_LOG) for entry in entries]

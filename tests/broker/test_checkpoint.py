"""A clean stop's checkpoint: a start from it answers exactly as a start that reads the log."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from postroom.broker.core import entry_spool
from postroom.broker.core.dead_letter_events import RUN_ID_BITS, DeadLetterLog, watch_dead_letter_queues
from postroom.broker.core.entry_spool import RECORD_BYTES
from postroom.broker.storage.checkpoint import (
    CHECKPOINT_DIR,
    MANIFEST,
    Captured,
    CheckpointRefused,
    capture,
    read_checkpoint,
)
from postroom.broker.tools.testing import publish_frames
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.records import DeadLetterSettled
from postroom.broker.wal.recovery import replay_located
from postroom.broker.wal.segments import iter_records
from tests.broker.test_spooling import COUNT, PERSISTENT, WINDOW, Broker, body

TRANSIENT = commands.Basic.Properties(delivery_mode=1)
QUEUES = {"q": {}, "ttl": {"x-message-ttl": 60_000}, "prio": {"x-max-priority": 2}}


def declare(broker: Broker) -> None:
    for name, arguments in QUEUES.items():
        broker.client.call(1, commands.Queue.Declare(queue=name, durable=True, arguments=arguments))
    broker.client.call(1, commands.Queue.Declare(queue="transient"))


def checkpoint(broker: Broker, data: Path) -> Captured:
    """What the log writer does every so often: write what is pending, then take a checkpoint there."""
    broker.write()
    assert broker.journal is not None
    captured = capture(str(data), broker.node, broker.journal, broker.log.active, broker.log.size)
    captured.commit()
    broker.journal.ledger.protect(captured.first, captured.segments, keep=False)
    return captured


def stop(broker: Broker, data: Path) -> Captured:
    """What a clean stop does: connections close (unacked messages go back), the log is written,
    then the checkpoint."""
    broker.client.connection.connection_lost()
    return checkpoint(broker, data)


def start_from_log(broker: Broker, tmp_path: Path) -> Broker:
    log = WriteAheadLog(broker.log.storage)
    log.open()
    return Broker(tmp_path, restore=(replay_located(log.located_records()), log))


def start_from_checkpoint(broker: Broker, data: Path, tmp_path: Path) -> Broker:
    """A start as the service makes it: the checkpoint, and the log after it."""
    found = read_checkpoint(str(data))
    assert found is not None
    log = WriteAheadLog(broker.log.storage)
    log.open(start=(found.segment, found.offset))
    snapshot = replay_located(log.located_records(), found.topology)
    return Broker(tmp_path, restore=(snapshot, log), checkpoint=found)


def drain(broker: Broker, queue: str) -> list[tuple[bytes, bool, object, object]]:
    """Every message, as ``basic.get`` answers: body, redelivered, delivery count and priority."""
    got = []
    while True:
        frames = broker.client.call(1, commands.Basic.Get(queue=queue, no_ack=True))
        if isinstance(frames[0][1], commands.Basic.GetEmpty):
            return got
        properties = frames[1][1].properties
        count = (properties.headers or {}).get("x-delivery-count")
        got.append((frames[-1][1].value, frames[0][1].redelivered, count, properties.priority))


OPERATIONS = st.lists(
    st.one_of(
        # Mostly to the plain queue, so that it often spools records before the stop.
        st.tuples(
            st.just("publish"),
            st.sampled_from(["q", "q", "q", "ttl", "prio", "transient"]),
            st.integers(1, 30),
            st.booleans(),
        ),
        st.tuples(st.just("get"), st.sampled_from(sorted(QUEUES)), st.integers(0, 0), st.booleans()),
        st.tuples(st.sampled_from(["ack", "requeue", "reject"]), st.just(""), st.integers(0, 5), st.booleans()),
        st.tuples(st.sampled_from(["write", "checkpoint"]), st.just(""), st.integers(0, 0), st.booleans()),
        st.tuples(st.just("purge"), st.sampled_from(sorted(QUEUES)), st.integers(0, 0), st.booleans()),
        st.tuples(st.just("delete"), st.sampled_from(sorted(QUEUES)), st.integers(0, 0), st.booleans()),
    ),
    min_size=3,
    max_size=40,
)


Operation = tuple[str, str, int, bool]


def apply(broker: Broker, data: Path, operations: list[Operation], number: int) -> int:
    """Apply ``operations`` through ``broker``'s client; returns the next message number."""
    client, tags = broker.client, []
    for operation, queue, argument, flag in operations:
        if operation == "publish":
            for _ in range(argument):
                properties = commands.Basic.Properties(delivery_mode=2 if flag else 1, priority=number % 3)
                client.send(publish_frames(1, "", queue, b"m%d" % number, properties))
                number += 1
        elif operation == "get":
            frames = client.call(1, commands.Basic.Get(queue=queue, no_ack=flag))
            if isinstance(frames[0][1], commands.Basic.GetOk) and not flag:
                tags.append(frames[0][1].delivery_tag)
        elif operation == "write":
            broker.write()
        elif operation == "checkpoint":
            checkpoint(broker, data)
        elif operation == "purge":
            client.call(1, commands.Queue.Purge(queue=queue))
        elif operation == "delete":
            client.call(1, commands.Queue.Delete(queue=queue))
            client.call(1, commands.Queue.Declare(queue=queue, durable=True, arguments=QUEUES[queue]))
            tags = []  # deleting a queue drops its unacked deliveries
        elif tags:
            tag = tags.pop(argument % len(tags))
            if operation == "ack":
                client.call(1, commands.Basic.Ack(delivery_tag=tag))
            else:
                client.call(1, commands.Basic.Reject(delivery_tag=tag, requeue=operation == "requeue"))
    return number


def run(runs: list[tuple[list[Operation], list[Operation], bool]]) -> None:
    """Each run applies its operations, takes a checkpoint, applies the later ones, writes the
    log and stops (cleanly, or as a crash would); the next run starts from the checkpoint.
    Last, a start from the log and one from the checkpoint must answer the same in every queue."""
    directory = Path(tempfile.mkdtemp(prefix="postroom-checkpoint-model-"))
    data = directory / "data"
    batch, entry_spool.BATCH = entry_spool.BATCH, 2
    try:
        broker = Broker(directory / "run0")
        declare(broker)
        checkpoint(broker, data)
        number = 0
        for index, (operations, later, clean) in enumerate(runs):
            if index:
                broker = start_from_checkpoint(broker, data, directory / f"run{index}")
            number = apply(broker, data, [*operations, ("checkpoint", "", 0, False), *later], number)
            if clean:
                stop(broker, data)
            else:
                broker.write()
        from_log = start_from_log(broker, directory / "log")
        from_checkpoint = start_from_checkpoint(broker, data, directory / "checkpoint")
        for queue in QUEUES:
            expected = drain(from_log, queue)
            assert drain(from_checkpoint, queue) == expected, queue
        assert from_checkpoint.journal is not None and from_log.journal is not None
        assert +from_checkpoint.journal.ledger.live == +from_log.journal.ledger.live
    finally:
        entry_spool.BATCH = batch
        shutil.rmtree(directory, ignore_errors=True)


RUNS = st.lists(st.tuples(OPERATIONS, OPERATIONS, st.booleans()), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(runs=RUNS)
def test_a_start_from_the_checkpoint_answers_as_a_start_that_reads_the_log(
    runs: list[tuple[list[Operation], list[Operation], bool]],
) -> None:
    run(runs)


def test_a_deep_queue_links_its_spool_files_into_the_checkpoint_and_writes_only_the_rest(tmp_path: Path) -> None:
    before = Broker(tmp_path / "before")
    declare(before)
    bodies = [body(n) for n in range(COUNT)]
    before.publish("q", bodies, PERSISTENT)
    spool_files = list((tmp_path / "before" / "spool").rglob("*.spool"))
    assert spool_files
    data = tmp_path / "data"
    captured = stop(before, data)
    assert len(captured.queues) == len(QUEUES) and captured.messages == COUNT
    found = read_checkpoint(str(data))
    assert found is not None
    (deep,) = [queue for queue in found.queues if queue.count]
    assert deep.count == COUNT and deep.bytes == sum(map(len, bodies))
    linked = [path for path, _skip, _length in deep.files if os.stat(path).st_nlink == 2]
    assert len(linked) == len(spool_files)  # the same files, not copies
    assert sum(length for _path, _skip, length in deep.files) == COUNT * RECORD_BYTES
    assert deep.refs == {before.log.active: COUNT}
    after = start_from_checkpoint(before, data, tmp_path / "after")
    queue = after.queue("q")
    assert queue.message_count == COUNT and not queue.ready_entries()  # nothing read yet
    assert drain(after, "q") == [(content, True, None, None) for content in bodies]  # all recovered: redelivered
    # The queue's links went as it read them; the checkpoint keeps its own until the next one.
    assert not list((tmp_path / "after" / "spool").rglob("checkpoint.*"))
    assert all(os.path.exists(path) for path, _skip, _length in deep.files)


def test_messages_held_by_no_channel_or_unwritten_records_refuse_a_checkpoint(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    declare(broker)
    broker.publish("q", [b"a", b"b", b"c"], PERSISTENT)
    data = tmp_path / "data"
    assert broker.journal is not None
    broker.get_all("q", 1, no_ack=False)  # held by the channel: in the checkpoint, in its place
    held = broker.queue("q").get()  # held by no channel (as a plugin holds messages)
    assert held is not None

    def attempt() -> Captured:
        assert broker.journal is not None
        return capture(str(data), broker.node, broker.journal, broker.log.active, broker.log.size)

    with pytest.raises(CheckpointRefused, match="1 logged message.s. are held outside queues and channels"):
        attempt()
    broker.queue("q").return_entries([held])
    broker.client.send(publish_frames(1, "", "q", b"d", PERSISTENT))  # not written yet
    with pytest.raises(CheckpointRefused, match="waiting"):
        attempt()
    broker.write()
    broker.journal.ledger.live[broker.log.active] += 1  # an account that does not add up
    with pytest.raises(CheckpointRefused, match="1 logged message.s. are held outside"):
        attempt()
    assert not (data / CHECKPOINT_DIR).exists() and not (data / f"{CHECKPOINT_DIR}.new").exists()
    broker.journal.ledger.live[broker.log.active] -= 1
    attempt().commit()
    assert (data / CHECKPOINT_DIR / MANIFEST).exists()
    after = start_from_checkpoint(broker, data, tmp_path / "after")
    assert [content for content, *_ in drain(after, "q")] == [b"a", b"b", b"c", b"d"]


@pytest.mark.parametrize("start", ["log", "checkpoint"])
def test_dead_letters_of_the_last_run_are_recorded_when_they_leave_after_a_start(tmp_path: Path, start: str) -> None:
    """Deeper than the window, most are spooled at start, not in memory: still known by their id."""
    before = Broker(tmp_path / "before")
    events = DeadLetterLog(3, before.clock.seconds)
    before.node.vhosts["/"].dead_letters = events
    c = before.client
    c.call(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout", durable=True))
    c.call(1, commands.Queue.Declare(queue="dlq", durable=True), commands.Queue.Declare(queue="audit", durable=True))
    c.call(1, commands.Queue.Bind(queue="dlq", exchange="dlx"), commands.Queue.Bind(queue="audit", exchange="dlx"))
    arguments = {"x-dead-letter-exchange": "dlx", "x-message-ttl": 0}
    c.call(1, commands.Queue.Declare(queue="work", durable=True, arguments=arguments))
    count = WINDOW * 5
    before.publish("work", [body(n) for n in range(count)], PERSISTENT)  # each dies at once, into both queues
    assert events.held() == 2 * count
    data = tmp_path / "data"
    stop(before, data)
    after = (
        start_from_log(before, tmp_path / "after")
        if start == "log"
        else start_from_checkpoint(before, data, tmp_path / "after")
    )
    later = DeadLetterLog(4, after.clock.seconds)
    after.node.vhosts["/"].dead_letters = later
    watch_dead_letter_queues(
        later, after.node.vhosts.values(), after.node.recovered_dead_letters, after.node.recovered_dead_letter_queues
    )
    assert later.held() == (2 * count if start == "log" else 0)  # a checkpoint names the queues, not each one
    assert len(drain(after, "dlq")) == count
    after.client.call(1, commands.Queue.Purge(queue="audit"))
    settled = [record for _start, _end, record in iter_records(later.take()) if type(record) is DeadLetterSettled]
    assert sorted((record.queue, record.dead_letter_id) for record in settled) == sorted(
        (queue, (3 << RUN_ID_BITS) + n) for queue in ("dlq", "audit") for n in range(1, count + 1)
    )
    assert later.held() == 0
    assert later.settled_count == 2 * count


def test_removals_and_delivery_counts_after_a_checkpoint_hold_through_the_next_ones(tmp_path: Path) -> None:
    """Acks and returns logged after a checkpoint apply to its records when they are read, and a
    checkpoint taken before they are read carries them."""
    first = Broker(tmp_path / "first")
    declare(first)
    bodies = [body(n) for n in range(COUNT)]
    first.publish("q", bodies, PERSISTENT)
    data = tmp_path / "data"
    checkpoint(first, data)
    first.get_all("q", 5, no_ack=False)  # tags 1 to 5
    client = first.client
    client.call(1, commands.Basic.Ack(delivery_tag=2), commands.Basic.Ack(delivery_tag=4))
    client.call(1, commands.Basic.Reject(delivery_tag=1, requeue=True))
    first.write()  # a crash: 3 and 5 stay unacked, once delivered, none returned yet
    second = start_from_checkpoint(first, data, tmp_path / "second")
    queue = second.queue("q")
    assert queue.message_count == COUNT - 2 and not queue.ready_entries()
    assert queue.ready.spool is not None and queue.ready.spool.adopted_changes == ({2, 4}, {1: 1})  # message ids
    checkpoint(second, data)  # before anything was read: it carries the removals and the count
    second.write()
    third = start_from_checkpoint(second, data, tmp_path / "third")
    expected = [(bodies[0], True, 1, None)] + [(content, True, None, None) for content in bodies[2:3] + bodies[4:]]
    assert drain(third, "q") == expected
    assert drain(start_from_log(second, tmp_path / "log"), "q") == expected
    assert third.journal is not None and not +third.journal.ledger.live


def test_a_crash_while_a_checkpoint_replaces_the_last_leaves_one_to_start_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker(tmp_path / "broker")
    declare(broker)
    broker.publish("q", [b"a", b"b", b"c"], PERSISTENT)
    data = tmp_path / "data"
    checkpoint(broker, data)
    broker.publish("q", [b"d", b"e"], PERSISTENT)
    assert broker.journal is not None
    captured = capture(str(data), broker.node, broker.journal, broker.log.active, broker.log.size)
    real_rename = os.rename
    renamed: list[str] = []

    def die_at_the_second(source: str, destination: str) -> None:
        renamed.append(destination)
        if len(renamed) == 2:
            raise KeyboardInterrupt  # the process is killed here: nothing cleans up
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", die_at_the_second)
    monkeypatch.setattr(Captured, "abandon", lambda self: None)
    with pytest.raises(KeyboardInterrupt):
        captured.commit()
    monkeypatch.undo()
    assert sorted(path.name for path in data.iterdir()) == ["checkpoint.new", "checkpoint.old"]
    found = read_checkpoint(str(data))
    assert found is not None and found.offset == broker.log.size  # the new one, whole
    assert sorted(path.name for path in data.iterdir()) == [CHECKPOINT_DIR]
    after = start_from_checkpoint(broker, data, tmp_path / "after")
    assert [content for content, *_ in drain(after, "q")] == [b"a", b"b", b"c", b"d", b"e"]

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

from broker.checkpoint import CHECKPOINT_DIR, MANIFEST, CheckpointRefused, read_checkpoint, write_checkpoint
from broker.core import spool
from broker.core.deadlog import RUN_ID_BITS, DeadLetterLog, watch_dead_letter_queues
from broker.core.spool import RECORD_BYTES
from broker.testing import publish_frames
from broker.wal.log import WriteAheadLog
from broker.wal.record import DeadLetterSettled, iter_records
from broker.wal.recovery import replay_located
from tests.broker.test_spooling import COUNT, PERSISTENT, WINDOW, Broker, body

TRANSIENT = commands.Basic.Properties(delivery_mode=1)
QUEUES = {"q": {}, "ttl": {"x-message-ttl": 60_000}, "prio": {"x-max-priority": 2}}


def declare(broker: Broker) -> None:
    for name, arguments in QUEUES.items():
        broker.client.call(1, commands.Queue.Declare(queue=name, durable=True, arguments=arguments))
    broker.client.call(1, commands.Queue.Declare(queue="transient"))


def stop(broker: Broker, data: Path) -> tuple[int, int]:
    """What a clean stop does: connections close (unacked messages go back), the log is written,
    then the checkpoint."""
    broker.client.connection.connection_lost()
    broker.write()
    assert broker.journal is not None
    return write_checkpoint(
        str(data), broker.node.vhosts.values(), broker.journal, None, broker.log.active, broker.log.size
    )


def start_from_log(broker: Broker, tmp_path: Path) -> Broker:
    log = WriteAheadLog(broker.log.storage)
    log.open()
    return Broker(tmp_path, restore=(replay_located(log.located_records()), log))


def start_from_checkpoint(broker: Broker, data: Path, tmp_path: Path) -> Broker:
    checkpoint = read_checkpoint(str(data))
    assert checkpoint is not None
    log = WriteAheadLog(broker.log.storage)
    log.open_at(checkpoint.segment, checkpoint.size)
    return Broker(tmp_path, restore=(checkpoint.topology, log), checkpoint=checkpoint)


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
        st.tuples(st.just("write"), st.just(""), st.integers(0, 0), st.booleans()),
        st.tuples(st.just("purge"), st.sampled_from(sorted(QUEUES)), st.integers(0, 0), st.booleans()),
    ),
    max_size=60,
)


def run(operations: list[tuple[str, str, int, bool]]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="postroom-checkpoint-model-"))
    batch, spool.BATCH = spool.BATCH, 2
    try:
        before = Broker(directory / "before")
        declare(before)
        client, number, tags = before.client, 0, []
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
                before.write()
            elif operation == "purge":
                client.call(1, commands.Queue.Purge(queue=queue))
            elif tags:
                tag = tags.pop(argument % len(tags))
                if operation == "ack":
                    client.call(1, commands.Basic.Ack(delivery_tag=tag))
                else:
                    client.call(1, commands.Basic.Reject(delivery_tag=tag, requeue=operation == "requeue"))
        stop(before, directory / "data")
        from_log = start_from_log(before, directory / "log")
        from_checkpoint = start_from_checkpoint(before, directory / "data", directory / "checkpoint")
        for queue in QUEUES:
            expected = drain(from_log, queue)
            assert drain(from_checkpoint, queue) == expected, queue
        assert from_checkpoint.journal is not None and from_log.journal is not None
        assert +from_checkpoint.journal.live == +from_log.journal.live
    finally:
        spool.BATCH = batch
        shutil.rmtree(directory, ignore_errors=True)


@settings(max_examples=150, deadline=None)
@given(operations=OPERATIONS)
def test_a_start_from_the_checkpoint_answers_as_a_start_that_reads_the_log(
    operations: list[tuple[str, str, int, bool]],
) -> None:
    run(operations)


def test_a_deep_queue_links_its_spool_files_into_the_checkpoint_and_writes_only_the_rest(tmp_path: Path) -> None:
    before = Broker(tmp_path / "before")
    declare(before)
    bodies = [body(n) for n in range(COUNT)]
    before.publish("q", bodies, PERSISTENT)
    spool_files = list((tmp_path / "before" / "spool").rglob("*.spool"))
    assert spool_files
    data = tmp_path / "data"
    assert stop(before, data) == (len(QUEUES), COUNT)
    checkpoint = read_checkpoint(str(data))
    assert checkpoint is not None
    (deep,) = [queue for queue in checkpoint.queues if queue.count]
    assert deep.count == COUNT and deep.bytes == sum(map(len, bodies))
    linked = [path for path, _skip, _length in deep.files if os.stat(path).st_nlink == 2]
    assert len(linked) == len(spool_files)  # the same files, not copies
    assert sum(length for _path, _skip, length in deep.files) == COUNT * RECORD_BYTES
    assert checkpoint.refs == {before.log.active: COUNT}
    after = start_from_checkpoint(before, data, tmp_path / "after")
    queue = after.queue("q")
    assert queue.message_count == COUNT and not queue.ready_entries()  # nothing read yet
    assert drain(after, "q") == [(content, True, None, None) for content in bodies]  # all recovered: redelivered
    assert not (data / CHECKPOINT_DIR).exists() or not any(
        (data / CHECKPOINT_DIR).glob("00*")
    )  # each file went once read


def test_unacknowledged_messages_or_unwritten_records_refuse_a_checkpoint(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    declare(broker)
    broker.publish("q", [b"a", b"b"], PERSISTENT)
    data = tmp_path / "data"
    broker.get_all("q", 1, no_ack=False)
    assert broker.journal is not None
    with pytest.raises(CheckpointRefused, match="1 message"):
        write_checkpoint(
            str(data), broker.node.vhosts.values(), broker.journal, None, broker.log.active, broker.log.size
        )
    broker.client.call(1, commands.Basic.Recover(requeue=True))
    broker.client.send(publish_frames(1, "", "q", b"c", PERSISTENT))  # not written yet
    with pytest.raises(CheckpointRefused, match="waiting"):
        write_checkpoint(
            str(data), broker.node.vhosts.values(), broker.journal, None, broker.log.active, broker.log.size
        )
    broker.write()
    broker.journal.live[broker.log.active] += 1  # an account that does not add up
    with pytest.raises(CheckpointRefused, match="disagree"):
        write_checkpoint(
            str(data), broker.node.vhosts.values(), broker.journal, None, broker.log.active, broker.log.size
        )
    assert not (data / CHECKPOINT_DIR).exists() and not (data / f"{CHECKPOINT_DIR}.new").exists()
    broker.journal.live[broker.log.active] -= 1
    stop(broker, data)
    assert (data / CHECKPOINT_DIR / MANIFEST).exists()


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
    before.client.connection.connection_lost()
    before.write()
    assert before.journal is not None
    write_checkpoint(str(data), before.node.vhosts.values(), before.journal, events, before.log.active, before.log.size)
    after = (
        start_from_log(before, tmp_path / "after")
        if start == "log"
        else start_from_checkpoint(before, data, tmp_path / "after")
    )
    later = DeadLetterLog(4, after.clock.seconds)
    after.node.vhosts["/"].dead_letters = later
    watch_dead_letter_queues(later, after.node.vhosts.values(), after.node.recovered_dead_letters)
    assert later.held() == 2 * count
    assert len(drain(after, "dlq")) == count
    after.client.call(1, commands.Queue.Purge(queue="audit"))
    settled = [record for _start, _end, record in iter_records(later.take()) if type(record) is DeadLetterSettled]
    assert sorted((record.queue, record.dead_letter_id) for record in settled) == sorted(
        (queue, (3 << RUN_ID_BITS) + n) for queue in ("dlq", "audit") for n in range(1, count + 1)
    )
    assert later.held() == 0

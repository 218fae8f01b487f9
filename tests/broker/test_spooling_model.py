"""A spooling queue answers exactly as the same queue held in memory, whatever the operations.

Hypothesis drives the same random operations (publish, get with or without ack, ack, reject,
requeue, purge) into two queues, one spooling behind a window of 3 with records written in
batches of 2, one never spooling, and compares every answer.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.broker.core import entry_spool
from postroom.broker.core.entry import Entry
from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.storage.page_store import PageStore
from postroom.broker.storage.spool_files import Spooler

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 12)),
        st.tuples(st.just("get"), st.booleans()),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("requeue"), st.integers(0, 5)),
        st.tuples(st.just("reject"), st.integers(0, 5)),
        st.tuples(st.just("purge"), st.just(0)),
    ),
    max_size=60,
)


class Model:
    def __init__(self, queue: WorkQueue) -> None:
        self.queue = queue
        self.unacked: list[Entry] = []

    def apply(self, operation: str, argument: int, number: list[int]) -> object:
        queue = self.queue
        if operation == "publish":
            for _ in range(argument):
                queue.enqueue(Message.build("", "q", b"m%d" % number[0]))
                number[0] += 1
            return queue.message_count
        if operation == "get":
            entry = queue.get()
            if entry is None:
                return None
            if argument:  # no ack
                queue.settle([entry])
            else:
                self.unacked.append(entry)
            return entry.message.body, entry.redelivered, entry.delivery_count, queue.message_count
        if operation == "purge":
            return queue.purge(), queue.message_count
        if not self.unacked:
            return None
        entry = self.unacked.pop(argument % len(self.unacked))
        if operation == "ack":
            queue.settle([entry])
        elif operation == "requeue":
            queue.return_entries([entry])
        else:
            queue.reject([entry])
        return queue.message_count


def run(arguments: dict, operations: list[tuple[str, int]]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="postroom-spool-model-"))
    batch, entry_spool.BATCH = entry_spool.BATCH, 2
    try:
        spooled = WorkQueue("q", arguments=arguments)
        store = PageStore(str(directory / "paging"))
        spooled.ready.attach_spooler(Spooler(str(directory / "spool"), store, None, None, 3))
        models = [Model(spooled), Model(WorkQueue("q", arguments=arguments))]
        numbers = [[0], [0]]
        for operation, argument in operations:
            answers = [model.apply(operation, argument, number) for model, number in zip(models, numbers, strict=True)]
            assert answers[0] == answers[1], (operation, argument)
        while models[1].queue.message_count:
            answers = [model.apply("get", 1, number) for model, number in zip(models, numbers, strict=True)]
            assert answers[0] == answers[1]
        assert models[0].queue.message_count == 0
        store.close()
    finally:
        entry_spool.BATCH = batch
        shutil.rmtree(directory, ignore_errors=True)


@settings(max_examples=300, deadline=None)
@given(operations=OPERATIONS)
def test_a_spooling_queue_answers_as_one_held_in_memory(operations: list[tuple[str, int]]) -> None:
    run({}, operations)


@settings(max_examples=300, deadline=None)
@given(operations=OPERATIONS)
def test_a_spooling_queue_with_a_length_limit_answers_as_one_held_in_memory(operations: list[tuple[str, int]]) -> None:
    run({"x-max-length": 7}, operations)

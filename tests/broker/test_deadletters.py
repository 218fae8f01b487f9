"""The dead-letter event writer: batched off the reactor, flushed at stop, a failed write loses
only its events and the broker carries on."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_twisted
from pamqp import commands
from twisted.internet.task import deferLater
from twisted.logger import Logger, formatEvent

from broker.core.deadlog import DeadLetterLog
from broker.core.node import Node
from broker.deadletters import DeadLetterService
from broker.testing import Client, MemorySegmentStorage, publish_frames
from broker.wal.files import DirectoryStorage, segment_name
from broker.wal.record import SEGMENT_HEADER_BYTES, DeadLettered, iter_records, segment_header
from broker.wal.stream import SegmentStream


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    from twisted.internet import reactor

    waited = 0.0
    while not condition():
        assert waited < timeout, "condition not met in time"
        await deferLater(reactor, 0.01, lambda: None)
        waited += 0.01


def start(storage: MemorySegmentStorage) -> tuple[Client, DeadLetterService, Node]:
    from twisted.internet import reactor

    stream = SegmentStream(storage, 1 << 20, reactor.seconds)
    node = Node(clock=reactor)
    events = DeadLetterLog(stream.open(), reactor.seconds)
    node.vhosts["/"].dead_letters = events
    service = DeadLetterService(events, stream, reactor)
    service.interval = 0.01
    service.startService()
    return connect(node), service, node


def connect(node: Node) -> Client:
    """A client of ``node`` that has declared ``work`` (one message at most), dead-lettering
    through the fanout ``dlx`` to ``dlq``."""
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.call(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    client.call(1, commands.Queue.Declare(queue="dlq"))
    client.call(1, commands.Queue.Bind(queue="dlq", exchange="dlx"))
    client.call(1, commands.Queue.Declare(queue="work", arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1}))
    return client


def written(storage: MemorySegmentStorage) -> list[str]:
    data = storage.read(storage.list_segments()[-1])
    records = [record for _start, _end, record in iter_records(data, SEGMENT_HEADER_BYTES)]
    return [record.reason for record in records if type(record) is DeadLettered]


@pytest_twisted.ensureDeferred
async def test_events_are_written_after_the_interval_and_flushed_at_stop() -> None:
    storage = MemorySegmentStorage()
    client, service, _node = start(storage)
    for body in (b"a", b"b"):  # the second pushes the first out: maxlen
        client.send(publish_frames(1, "", "work", body, commands.Basic.Properties()))
    await wait_until(lambda: written(storage) == ["maxlen"])
    assert service.writes == 1
    client.send(publish_frames(1, "", "work", b"c", commands.Basic.Properties()))
    await service.stopService()
    assert written(storage) == ["maxlen", "maxlen"]


@pytest_twisted.ensureDeferred
async def test_a_failed_write_raises_the_alarm_and_later_events_are_written() -> None:
    storage = MemorySegmentStorage()
    client, service, node = start(storage)
    storage.fail_next("append", OSError(errno.ENOSPC, "No space left on device"))
    for body in (b"a", b"b"):
        client.send(publish_frames(1, "", "work", body, commands.Basic.Properties()))
    await wait_until(lambda: service.alarm is not None)
    assert "No space left" in str(service.alarm)
    client.send(publish_frames(1, "", "work", b"c", commands.Basic.Properties()))
    await wait_until(lambda: service.alarm is None)
    await service.stopService()
    assert written(storage) == ["maxlen"]  # the first batch is lost, the broker was not disturbed
    assert node.vhosts["/"].queues["dlq"].message_count == 2


@pytest_twisted.ensureDeferred
async def test_sealed_segments_past_the_retention_or_the_size_cap_are_deleted_never_the_active_one(
    tmp_path: Path,
) -> None:
    from twisted.internet import reactor

    directory = tmp_path / "deadletters"
    storage = DirectoryStorage(directory)
    for number in (1, 2):
        storage.create(number, segment_header(number))
    month_ago = time.time() - 31 * 86400
    os.utime(directory / segment_name(1), (month_ago, month_ago))
    stream = SegmentStream(storage, SEGMENT_HEADER_BYTES + 64, reactor.seconds)
    node = Node(clock=reactor)
    events = DeadLetterLog(stream.open(), reactor.seconds)
    node.vhosts["/"].dead_letters = events
    service = DeadLetterService(events, stream, reactor, retention=30 * 86400, max_bytes=1 << 20)
    service.interval = 0.01
    service.startService()
    assert storage.list_segments() == [2, 3] and service.pruned == 1  # segment 1 was a month old
    service.max_bytes = 1  # now every sealed segment is over the cap
    client = connect(node)
    for body in (b"a", b"b"):
        client.send(publish_frames(1, "", "work", body, commands.Basic.Properties()))
    await wait_until(lambda: service.writes == 1)
    client.send(publish_frames(1, "", "work", b"c", commands.Basic.Properties()))
    await wait_until(lambda: service.writes == 2)  # this append seals segment 3 first
    await service.stopService()
    assert storage.list_segments() == [4] and service.pruned == 3
    data = (directory / segment_name(4)).read_bytes()
    assert [type(r) for _s, _e, r in iter_records(data, SEGMENT_HEADER_BYTES)] == [DeadLettered]


@pytest_twisted.ensureDeferred
async def test_a_failed_deletion_is_logged_and_the_events_still_count_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twisted.internet import reactor

    import broker.deadletters

    def refuse(*_args: object, **_kwargs: object) -> list[str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(broker.deadletters, "prune_archive", refuse)
    storage = DirectoryStorage(tmp_path / "deadletters")
    stream = SegmentStream(storage, SEGMENT_HEADER_BYTES + 64, reactor.seconds)
    node = Node(clock=reactor)
    events = DeadLetterLog(stream.open(), reactor.seconds)
    node.vhosts["/"].dead_letters = events
    service = DeadLetterService(events, stream, reactor, retention=0, max_bytes=1)
    service.interval = 0.01
    logged: list[str] = []
    service._log = Logger(observer=lambda event: logged.append(formatEvent(event)))
    service.startService()
    client = connect(node)
    for body in (b"a", b"b", b"c"):
        client.send(publish_frames(1, "", "work", body, commands.Basic.Properties()))
        await wait_until(lambda: not events.has_pending and service._writing is None)
    await service.stopService()
    assert service.alarm is None and service.writes == 2 and service.pruned == 0
    assert sum("deleting dead-letter segments past the retention failed: [Errno 13]" in line for line in logged) == 2

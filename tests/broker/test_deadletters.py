"""The dead-letter event writer: batched off the reactor, flushed at stop, a failed write loses
only its events and the broker carries on."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from pamqp import commands
from twisted.internet.task import Clock, deferLater
from twisted.logger import Logger, formatEvent
from twisted.python.failure import Failure

from postroom.broker.core.dead_letter_events import DeadLetterLog
from postroom.broker.core.node import Node
from postroom.broker.storage.dead_letter_writer import DeadLetterService
from postroom.broker.tools.testing import Client, MemorySegmentStorage, publish_frames
from postroom.broker.wal.files import DirectoryStorage, ISegmentStorage, segment_name
from postroom.broker.wal.records import DeadLettered
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, iter_records, segment_header
from postroom.broker.wal.stream import SegmentStream


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    from twisted.internet import reactor

    waited = 0.0
    while not condition():
        assert waited < timeout, "condition not met in time"
        await deferLater(reactor, 0.01, lambda: None)
        waited += 0.01


class ClockReactor(Clock):
    """A Clock that also takes calls from the worker thread (run at once)."""

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        f(*args, **kwargs)


class SyncPool:
    """A ThreadPool's interface without the thread: the write runs when it is handed over, so a
    service on a :class:`ClockReactor` writes exactly when the clock says."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def callInThreadWithCallback(
        self, on_result: Callable[[bool, Any], None], f: Callable[..., Any], *args: Any
    ) -> None:
        try:
            result = f(*args)
        except Exception:
            on_result(False, Failure())
        else:
            on_result(True, result)


def start(
    storage: ISegmentStorage, clock: ClockReactor | None = None, segment_bytes: int = 1 << 20, **options: Any
) -> tuple[Client, DeadLetterService, Node]:
    """The service over ``storage`` and a client of its node; on ``clock`` with no worker
    thread when given one, else on the running reactor."""
    from twisted.internet import reactor

    timer = clock or reactor
    stream = SegmentStream(storage, segment_bytes, timer.seconds)
    node = Node(clock=timer)
    events = DeadLetterLog(stream.open(), timer.seconds)
    node.vhosts["/"].dead_letters = events
    service = DeadLetterService(events, stream, timer, **options)
    if clock is not None:
        service._pool = SyncPool()  # type: ignore[assignment]
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


def dead_letter(client: Client, clock: ClockReactor, service: DeadLetterService) -> None:
    """Publish into the full ``work`` queue (one message dies: maxlen) and let the write happen."""
    writes = service.writes
    client.send(publish_frames(1, "", "work", b"x", commands.Basic.Properties()))
    clock.advance(service.interval)
    assert service.writes == writes + 1


def test_sealed_segments_past_the_retention_or_the_size_cap_are_deleted_never_the_active_one(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "deadletters"
    storage = DirectoryStorage(directory)
    for number in (1, 2):
        storage.create(number, segment_header(number))
    month_ago = time.time() - 31 * 86400
    os.utime(directory / segment_name(1), (month_ago, month_ago))
    clock = ClockReactor()
    client, service, _node = start(
        storage, clock, SEGMENT_HEADER_BYTES + 64, retention=30 * 86400, max_bytes=1 << 20
    )
    assert storage.list_segments() == [2, 3] and service.pruned == 1  # segment 1 was a month old
    service.max_bytes = 1  # now every sealed segment is over the cap,
    service.retention = -1.0  # and every segment, the active one too, past the retention
    client.send(publish_frames(1, "", "work", b"a", commands.Basic.Properties()))  # fills work
    dead_letter(client, clock, service)
    assert storage.list_segments() == [2, 3]  # segment 3 held only its header: not sealed
    dead_letter(client, clock, service)  # this append seals segment 3 first
    assert service.stopService().called  # flushed and closed, no thread to wait for
    assert storage.list_segments() == [4] and service.pruned == 3
    data = (directory / segment_name(4)).read_bytes()
    assert [type(r) for _s, _e, r in iter_records(data, SEGMENT_HEADER_BYTES)] == [DeadLettered]


def test_a_failed_deletion_is_logged_and_the_events_still_count_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import postroom.broker.storage.dead_letter_writer
    def refuse(*_args: object, **_kwargs: object) -> list[str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(postroom.broker.storage.dead_letter_writer, "prune_archive", refuse)
    logged: list[str] = []
    monkeypatch.setattr(DeadLetterService, "_log", Logger(observer=lambda event: logged.append(formatEvent(event))))
    clock = ClockReactor()
    storage = DirectoryStorage(tmp_path / "deadletters")
    client, service, _node = start(storage, clock, SEGMENT_HEADER_BYTES + 64, retention=0, max_bytes=1)
    client.send(publish_frames(1, "", "work", b"a", commands.Basic.Properties()))
    dead_letter(client, clock, service)
    dead_letter(client, clock, service)  # seals a segment: the retention runs, and fails
    assert service.stopService().called  # flushed and closed, no thread to wait for
    assert service.alarm is None and service.writes == 2 and service.pruned == 0
    assert storage.list_segments() == [1, 2]
    assert sum("deleting dead-letter segments past the retention failed: [Errno 13]" in line for line in logged) == 2

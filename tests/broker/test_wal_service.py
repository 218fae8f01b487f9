"""The log writer service with injected disk faults: refused writes are nacked, never confirmed and lost."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest_twisted
from pamqp import commands
from twisted.internet.task import deferLater

from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.storage.logwriter import WALService
from postroom.broker.tools.testing import Client, MemorySegmentStorage, publish_frames
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.recovery import replay_segments

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    from twisted.internet import reactor

    waited = 0.0
    while not condition():
        assert waited < timeout, "condition not met in time"
        await deferLater(reactor, 0.01, lambda: None)
        waited += 0.01


async def start(storage: MemorySegmentStorage, max_backlog: int = 64 << 20) -> tuple[Client, WALService, list]:
    from twisted.internet import reactor

    log = WriteAheadLog(storage)
    log.open()
    journal = Journal(1, reactor.seconds)
    node = Node(clock=reactor)
    node.set_journal(journal)
    service = WALService(journal, log, reactor, "batch", 0.001, node, max_backlog=max_backlog)
    service.startService()
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.call(1, commands.Queue.Declare(queue="jobs", durable=True), commands.Confirm.Select())
    seen: list = []
    return client, service, seen


def confirms(client: Client, seen: list) -> list[tuple[str, int]]:
    seen += [(v.name, v.delivery_tag) for _, v in client.read() if v.name in ("Basic.Ack", "Basic.Nack")]
    return seen


@pytest_twisted.ensureDeferred
async def test_a_failing_fsync_nacks_the_publish_and_raises_the_alarm() -> None:
    storage = MemorySegmentStorage()
    client, service, seen = await start(storage)
    storage.fail_next("sync", OSError(errno.EIO, "Input/output error"))
    client.send(publish_frames(1, "", "jobs", b"refused", PERSISTENT))
    await wait_until(lambda: bool(confirms(client, seen)))
    assert seen == [("Basic.Nack", 1)]
    assert service.alarm is not None and "Input/output error" in service.alarm
    client.send(publish_frames(1, "", "jobs", b"accepted", PERSISTENT))
    await wait_until(lambda: len(confirms(client, seen)) == 2)
    assert seen[1] == ("Basic.Ack", 2)
    assert service.alarm is None
    await service.stopService()
    recovered = replay_segments(_reopen(storage.crash()))
    bodies = [m.record.body for m in recovered.messages[("/", "jobs")].values()]
    assert b"accepted" in bodies  # confirmed: must survive; the nacked one may or may not


@pytest_twisted.ensureDeferred
async def test_a_full_disk_nacks_and_nothing_confirmed_is_lost() -> None:
    storage = MemorySegmentStorage()
    client, service, seen = await start(storage)
    client.send(publish_frames(1, "", "jobs", b"before", PERSISTENT))
    await wait_until(lambda: len(confirms(client, seen)) == 1)
    storage.fail_next("append", OSError(errno.ENOSPC, "No space left on device"), written=10)
    client.send(publish_frames(1, "", "jobs", b"no room", PERSISTENT))
    await wait_until(lambda: len(confirms(client, seen)) == 2)
    client.send(publish_frames(1, "", "jobs", b"after", PERSISTENT))
    await wait_until(lambda: len(confirms(client, seen)) == 3)
    assert seen == [("Basic.Ack", 1), ("Basic.Nack", 2), ("Basic.Ack", 3)]
    await service.stopService()
    recovered = replay_segments(_reopen(storage.crash()))
    bodies = [m.record.body for m in recovered.messages[("/", "jobs")].values()]
    assert {b"before", b"after"} <= set(bodies)


@pytest_twisted.ensureDeferred
async def test_a_stalled_disk_pauses_publishers_at_the_backlog_bound_and_every_publish_is_confirmed() -> None:
    storage = MemorySegmentStorage()
    client, service, seen = await start(storage, max_backlog=10_000)
    stalled = storage.hold("sync")
    try:
        client.send(publish_frames(1, "", "jobs", b"stuck", PERSISTENT))
        await wait_until(lambda: service.journal.pending_bytes == 0)  # taken by a write that waits on the disk
        for number in range(30):
            client.send(publish_frames(1, "", "jobs", b"%04d" % number * 250, PERSISTENT))
        queue = service.node.vhosts["/"].queues["jobs"]
        state = ("log" in service.node.alarms, client.connection.blocked, service.backlog_pauses, queue.message_count)
        pending = service.journal.pending_bytes
    finally:
        stalled.set()
    assert state == (True, True, 1, 1 + 10)
    assert 10_000 < pending < 12_000  # paused at the first publish past the bound
    acked: list[int] = []

    def all_acked() -> bool:
        # The shell reads on whenever the pause ends, starting with what it held.
        frames = client.send(b"")
        acked.extend(value.delivery_tag for _, value in frames if value.name == "Basic.Ack")
        return bool(acked) and acked[-1] == 31

    await wait_until(all_acked)
    assert queue.message_count == 31 and service.backlog_pauses >= 2  # the held publishes filled it again
    assert not client.connection.blocked and service.node.alarms == set()
    await service.stopService()


def _reopen(storage: MemorySegmentStorage) -> list:
    log = WriteAheadLog(storage)
    log.open()
    return list(log.records())


@pytest_twisted.ensureDeferred
async def test_records_made_before_the_service_starts_are_written_and_later_publishes_confirmed() -> None:
    # Start-up declares configured queues (and plugins recover their state) before the
    # service starts: those records must not keep later confirms waiting.
    from twisted.internet import reactor

    storage = MemorySegmentStorage()
    log = WriteAheadLog(storage)
    log.open()
    journal = Journal(1, reactor.seconds)
    node = Node(clock=reactor)
    node.set_journal(journal)
    node.vhosts["/"].declare_queue("configured", None, durable=True)
    service = WALService(journal, log, reactor, "batch", 0.001, node)
    service.startService()
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.call(1, commands.Confirm.Select())
    client.send(publish_frames(1, "", "configured", b"kept", PERSISTENT))
    seen: list = []
    try:
        await wait_until(lambda: confirms(client, seen) == [("Basic.Ack", 1)])
    finally:
        await service.stopService()

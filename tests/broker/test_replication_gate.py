"""The leader's confirm gate and in-sync set, on Twisted's ``Clock`` with followers' links over
``StringTransport``: when a write's confirms may go, and when they must not."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from postroom.broker.cluster import leader
from postroom.broker.cluster.frames import HEAD, SEQ, Kind, frame, hello, seq_frame
from postroom.broker.cluster.leader import LeaderLink, Replication


class Setup:
    def __init__(self, tmp_path: Path, min_in_sync: int = 2, in_sync_timeout: float = 1.0) -> None:
        self.clock = Clock()
        self.etcd: dict[str, bool] = {}
        self.leading = True
        self.released: list[int] = []
        self.refused: list[int] = []

        async def set_in_sync(name: str, member: bool) -> bool:
            if not self.leading:
                return False
            self.etcd[name] = member
            return True

        self.replication = Replication(
            self.clock,
            "leader",
            str(tmp_path),
            "secret",
            min_in_sync,
            in_sync_timeout,
            5.0,
            set_in_sync,
            lambda: self.leading,
        )
        self.replication.start()

    def follower(self, name: str) -> tuple[LeaderLink, StringTransport]:
        link = self.replication.buildProtocol(None)
        transport = StringTransport()
        link.transport = transport
        link.name = name
        link.state = "streaming"
        self.replication.joined(link)
        return link, transport

    def in_sync(self, *names: str) -> list[LeaderLink]:
        """Followers with every batch so far: in the in-sync set."""
        links = [self.follower(name)[0] for name in names]
        for link in links:
            self.ack(link, 0)
        return links

    def write(self, seq: int) -> None:
        self.replication.after(seq, lambda: self.released.append(seq), lambda: self.refused.append(seq))

    def ack(self, link: LeaderLink, seq: int) -> None:
        link.dataReceived(b"".join(seq_frame(Kind.ACK, seq)))


def frames(data: bytes) -> list[tuple[Kind, bytes]]:
    found = []
    while data:
        length, kind = HEAD.unpack_from(data)
        found.append((Kind(kind), data[HEAD.size : 4 + length]))
        data = data[4 + length :]
    return found


def test_a_confirm_waits_for_every_follower_in_sync(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    b, b_wire = setup.follower("b")
    c, _c_wire = setup.follower("c")
    setup.ack(b, 0)
    setup.ack(c, 0)
    assert setup.replication.in_sync == {"b", "c"} and setup.etcd == {"b": True, "c": True}
    setup.replication._send(1, [b"ops"])
    assert frames(b_wire.value()) == [(Kind.BATCH, SEQ.pack(1) + b"ops")]
    setup.write(1)
    assert setup.released == []
    setup.ack(b, 1)
    assert setup.released == []  # c has not got it
    setup.ack(c, 1)
    assert setup.released == [1]


def test_a_slow_follower_leaves_the_set_before_confirms_stop_waiting_for_it(tmp_path: Path) -> None:
    setup = Setup(tmp_path, in_sync_timeout=1.0)
    b, c = setup.in_sync("b", "c")
    setup.replication._send(1, [b"ops"])
    setup.write(1)
    setup.ack(b, 1)
    setup.clock.advance(0.5)
    assert setup.released == [] and setup.replication.in_sync == {"b", "c"}
    setup.clock.pump([0.05] * 12)
    assert setup.etcd["c"] is False and setup.replication.in_sync == {"b"}
    assert setup.released == [1]
    # Caught up, it joins again, and confirms wait for it from then on.
    setup.ack(c, 1)
    assert setup.replication.in_sync == {"b", "c"} and setup.etcd["c"] is True


def test_a_follower_stays_in_the_set_while_etcd_cannot_be_told_it_left(tmp_path: Path) -> None:
    setup = Setup(tmp_path, in_sync_timeout=1.0)
    b, _c = setup.in_sync("b", "c")
    setup.leading = False  # the leader key is gone: the set cannot be written
    setup.replication._send(1, [b"ops"])
    setup.write(1)
    setup.ack(b, 1)
    setup.clock.pump([0.05] * 40)
    assert setup.replication.in_sync == {"b", "c"}
    assert setup.released == []


def test_below_min_in_sync_writes_wait_then_are_refused(tmp_path: Path) -> None:
    setup = Setup(tmp_path, min_in_sync=2)
    setup.write(0)
    setup.clock.pump([0.05] * 80)  # 4 s
    assert setup.released == [] and setup.refused == []
    setup.clock.pump([0.05] * 30)  # past confirm_timeout (5 s)
    assert setup.refused == [0]


def test_one_copy_is_enough_with_min_in_sync_1(tmp_path: Path) -> None:
    setup = Setup(tmp_path, min_in_sync=1)
    setup.write(0)
    assert setup.released == [0]


def test_nothing_is_released_once_the_lease_may_have_run_out(tmp_path: Path) -> None:
    setup = Setup(tmp_path, min_in_sync=1)
    setup.leading = False
    setup.write(0)
    setup.clock.pump([0.05] * 40)
    assert setup.released == []
    setup.replication.stop()
    assert setup.refused == [0]
    setup.write(1)  # after the stop: refused at once
    assert setup.refused == [0, 1]


def test_confirms_are_released_in_order(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    (b,) = setup.in_sync("b")
    for seq in (1, 2, 3):
        setup.write(seq)
    setup.ack(b, 2)
    assert setup.released == [1, 2]
    setup.ack(b, 3)
    assert setup.released == [1, 2, 3]


def test_a_follower_with_the_wrong_secret_is_refused(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    link = setup.replication.buildProtocol(None)
    transport = StringTransport()
    link.transport = transport
    link.dataReceived(b"".join(hello("b", "guess", {})))
    assert frames(transport.value()) == [(Kind.REFUSED, b"the cluster's secret does not match")]
    assert transport.disconnecting
    assert setup.replication.links == {}


@pytest.mark.parametrize(
    "data",
    [b"".join(frame(Kind.BATCH, b"x")), b"\xff\xff\xff\xff\x01", b"".join(frame(Kind.HELLO, b"{not json"))],
)
def test_a_follower_that_sends_nonsense_is_disconnected(tmp_path: Path, data: bytes) -> None:
    setup = Setup(tmp_path)
    link = setup.replication.buildProtocol(None)
    transport = StringTransport()
    link.transport = transport
    link.dataReceived(data)
    assert transport.disconnecting


def test_a_disconnected_follower_leaves_the_set(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    (b,) = setup.in_sync("b")
    setup.write(0)
    setup.replication._send(1, [b"ops"])
    setup.write(1)
    assert setup.released == [0]
    b.connectionLost(None)
    assert setup.etcd["b"] is False and setup.replication.in_sync == set()
    setup.clock.advance(6)
    setup.clock.advance(0.05)
    assert setup.refused == [1]


def test_a_follower_slow_for_good_is_cut_off_past_a_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leader, "MAX_UNACKED_BYTES", 100)
    setup = Setup(tmp_path)
    (b,) = setup.in_sync("b")
    transport = b.transport
    setup.replication._send(1, [b"x" * 60])
    setup.ack(b, 1)
    setup.replication._send(2, [b"x" * 60])
    assert not transport.disconnecting and b.lag_bytes == 60
    setup.replication._send(3, [b"x" * 60])  # 120 bytes unacknowledged
    assert transport.disconnecting


class ThreadedReactor(Clock):
    """A ``Clock`` that also takes calls from other threads, in the order they came."""

    def __init__(self) -> None:
        super().__init__()
        self.from_threads: list[tuple[object, tuple[object, ...]]] = []

    def callFromThread(self, f: object, *args: object) -> None:
        self.from_threads.append((f, args))


def test_batches_cut_on_two_threads_reach_the_reactor_in_their_order(tmp_path: Path) -> None:
    import sys
    import threading

    reactor = ThreadedReactor()

    async def set_in_sync(name: str, member: bool) -> bool:
        return True

    replication = Replication(reactor, "leader", str(tmp_path), "secret", 2, 1.0, 5.0, set_in_sync, lambda: True)
    path = str(tmp_path / "00000000000000000001.wal")

    def writer() -> None:  # as the log's writer and the dead-letter writer each do
        for number in range(2000):
            replication.recorder.wrote(path, number, b"x")
            replication.flush()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (the threads take turns as often as they can)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switching)
    sent = [args[0] for _f, args in reactor.from_threads]
    assert sent == list(range(1, len(sent) + 1))
    assert len(sent) >= 2000

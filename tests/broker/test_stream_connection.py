"""The stream protocol's connection and its Twisted shell, in memory: frames through
StringTransport, timers on a Clock. (RabbitMQ's answers to the same frames are compared in
``tests/conformance/test_stream_protocol_transcripts.py``.)"""

from __future__ import annotations

import random
import socket
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from postroom.broker.core.journal import Journal
from postroom.broker.core.message import Message
from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.server.listeners import stream_addresses
from postroom.broker.server.streamprotocol import (
    REQUEST_TIMEOUT,
    STEP_TIMEOUT,
    StreamServerFactory,
    StreamServerProtocol,
)
from postroom.broker.storage.streams import StreamFiles
from postroom.broker.streams.connection import StreamConnection
from postroom.broker.streams.handshake import FRAME_MAX, HEARTBEAT, Step
from postroom.broker.streams.publishing import _published
from postroom.broker.streams.subscriptions import DELIVERY_BOUND, SENT_FROM_FILE
from postroom.broker.streams.superstreams import partition_index
from postroom.broker.tools.fuzzing import sub_entry_batch
from postroom.broker.wal import chunks
from postroom.broker.wal.files import DirectoryStorage
from postroom.broker.wal.streamlog import Region
from postroom.broker.wire import streamframes as wire
from postroom.config.schema import BrokerConfig, ListenConfig, Permission, StreamProtocolConfig
from tests.broker.core.test_login import SCRYPT
from tests.broker.core.test_stream import content_header
from tests.broker.test_spooling import logged_errors


class Transport(StringTransport):
    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        self.aborted = False
        #: The size of each write.
        self.sizes: list[int] = []
        self.no_delay = False

    def abortConnection(self) -> None:
        self.aborted = True
        self.loseConnection()

    def write(self, data: bytes) -> None:
        self.sizes.append(len(data))
        super().write(data)

    def setTcpNoDelay(self, enabled: bool) -> None:  # noqa: N802 (Twisted's name)
        self.no_delay = enabled


def request(key: int, correlation: int, body: bytes = b"") -> bytes:
    return wire.frame(key, struct.pack(">I", correlation) + body)


def plain(user: str, password: str) -> bytes:
    response = f"\0{user}\0{password}".encode()
    return wire.string("PLAIN") + struct.pack(">I", len(response)) + response


def handshake_frames(vhost: str = "/", password: str = "guest", heartbeat: int = 0) -> list[bytes]:
    return [
        request(wire.PEER_PROPERTIES, 1, wire.string_map({"product": "test"})),
        request(wire.SASL_HANDSHAKE, 2),
        request(wire.SASL_AUTHENTICATE, 3, plain("guest", password)),
        wire.frame(wire.TUNE | wire.RESPONSE, struct.pack(">II", FRAME_MAX, heartbeat)),
        request(wire.OPEN, 4, wire.string(vhost)),
    ]


def responses(out: list[bytes] | bytes) -> list[tuple[int, int, int]]:
    """``(key, correlation id, code)`` of each response written (``tune`` as ``(20, 0, 0)``)."""
    found = []
    for frame in wire.FrameReader().feed(out if isinstance(out, bytes) else b"".join(out)):
        key = struct.unpack_from(">H", frame)[0]
        if key & wire.RESPONSE:
            correlation, code = struct.unpack_from(">IH", frame, 4)
            found.append((key & ~wire.RESPONSE, correlation, code))
        else:
            found.append((key, 0, 0))
    return found


def with_streams(tmp_path: Path, node: Node | None = None) -> Node:
    """A node whose streams keep their files under ``tmp_path``."""
    node = node or Node()
    node.set_streams(StreamFiles(str(tmp_path), Journal(1), Clock()))
    return node


def opened(node: Node | None = None) -> StreamConnection:
    connection = StreamConnection(node or Node(), "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    connection.receive(b"".join(handshake_frames()))
    assert connection.step is Step.OPENED and not connection.finished
    return connection


def test_the_handshake_answers_each_step_and_opens() -> None:
    connection = opened()
    assert responses(connection.out) == [
        (wire.PEER_PROPERTIES, 1, wire.OK),
        (wire.SASL_HANDSHAKE, 2, wire.OK),
        (wire.SASL_AUTHENTICATE, 3, wire.OK),
        (wire.TUNE, 0, 0),
        (wire.OPEN, 4, wire.OK),
    ]
    assert connection in connection.node.stream_connections
    connection.connection_lost()
    assert connection not in connection.node.stream_connections


def test_frames_may_arrive_a_byte_at_a_time() -> None:
    connection = StreamConnection(Node(), "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    for byte in b"".join(handshake_frames()):
        connection.receive(bytes((byte,)))
    assert connection.step is Step.OPENED
    assert [code for _, _, code in responses(connection.out)] == [1, 1, 1, 0, 1]


def test_a_login_checked_later_holds_what_arrives_meanwhile() -> None:
    later: list[Callable[[], None]] = []
    node = Node(users=[User("guest", password_hash=SCRYPT)])

    def run_blocking(work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        later.append(lambda: done(work()))

    node.run_blocking = run_blocking
    connection = StreamConnection(node, "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    connection.receive(b"".join(handshake_frames(password="secret")))
    assert connection.step is Step.AUTHENTICATING and len(responses(connection.out)) == 2
    woken: list[bool] = []
    connection.wake = lambda: woken.append(True)
    later.pop()()
    assert connection.step is Step.OPENED and woken == [True]
    assert [key for key, _, _ in responses(connection.out)][2:] == [wire.SASL_AUTHENTICATE, wire.TUNE, wire.OPEN]


def test_a_wrong_password_is_answered_then_the_connection_ends() -> None:
    connection = StreamConnection(Node(), "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    connection.receive(b"".join(handshake_frames(password="wrong")))
    assert responses(connection.out)[-1] == (wire.SASL_AUTHENTICATE, 3, wire.AUTHENTICATION_FAILURE)
    assert connection.finished and "login refused" in connection.reason


def test_guest_from_another_address_is_refused_as_loopback_only() -> None:
    connection = StreamConnection(Node(), "10.0.0.2:40000", False, ("127.0.0.1", 5552))
    connection.receive(b"".join(handshake_frames()))
    assert responses(connection.out)[-1] == (wire.SASL_AUTHENTICATE, 3, wire.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
    assert connection.finished


def test_a_step_left_out_ends_the_connection() -> None:
    frames = handshake_frames()
    connection = StreamConnection(Node(), "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    connection.receive(frames[0] + frames[2])  # no sasl_handshake
    assert connection.finished and connection.step is Step.PEER_PROPERTIES_EXCHANGED


def test_create_and_delete_once_open(tmp_path: Path) -> None:
    connection = opened(with_streams(tmp_path))
    connection.out.clear()
    connection.receive(
        request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({"max-age": "1h"}))
        + request(wire.CREATE_STREAM, 6, wire.string("events") + wire.string_map({"max-age": "1h"}))
        + request(wire.CREATE_STREAM, 10, wire.string("events") + wire.string_map({}))
        + request(wire.CREATE_STREAM, 7, wire.string("amq.x") + wire.string_map({}))
        + request(wire.DELETE_STREAM, 8, wire.string("events"))
        + request(wire.DELETE_STREAM, 9, wire.string("events"))
    )
    assert responses(connection.out) == [
        (wire.CREATE_STREAM, 5, wire.OK),
        (wire.CREATE_STREAM, 6, wire.STREAM_ALREADY_EXISTS),
        (wire.CREATE_STREAM, 10, wire.PRECONDITION_FAILED),  # (without its max-age: not the same stream)
        (wire.CREATE_STREAM, 7, wire.PRECONDITION_FAILED),
        (wire.DELETE_STREAM, 8, wire.OK),
        (wire.DELETE_STREAM, 9, wire.STREAM_DOES_NOT_EXIST),
    ]


def test_a_user_without_configure_permission_is_refused() -> None:
    node = Node(users=[User("app", "secret", permissions={"/": Permission(configure="^$", write=".*", read=".*")})])
    connection = StreamConnection(node, "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    frames = handshake_frames()
    frames[2] = request(wire.SASL_AUTHENTICATE, 3, plain("app", "secret"))
    connection.receive(b"".join(frames))
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    assert responses(connection.out)[-1] == (wire.CREATE_STREAM, 5, wire.ACCESS_REFUSED)
    assert "events" not in node.vhosts["/"].queues


def test_an_unknown_command_once_open_is_answered_with_close_13() -> None:
    connection = opened()
    connection.out.clear()
    connection.receive(wire.frame(99, b"\x00\x00\x00\x01"))
    (close,) = wire.FrameReader().feed(b"".join(connection.out))
    assert close == wire.close(1, wire.UNKNOWN_FRAME, "unknown frame")[4:]
    connection.receive(wire.frame(wire.CLOSE | wire.RESPONSE, struct.pack(">IH", 1, wire.OK)))
    assert connection.finished


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_garbage_never_raises(garbage: bytes, open_first: bool) -> None:
    connection = opened() if open_first else StreamConnection(Node(), "127.0.0.1:1", True, ("h", 1))
    connection.receive(garbage)
    connection.receive(struct.pack(">I", len(garbage)) + garbage)


def test_every_request_shape_cut_short_is_read_as_unknown() -> None:
    rng = random.Random(3)
    for key in range(1, 32):
        for size in range(0, 24):
            body = bytes(rng.randrange(256) for _ in range(size))
            command = wire.parse_request(struct.pack(">HH", key, 1) + body)
            assert isinstance(command, wire.Command)


def test_requests_and_responses_are_read_as_their_commands() -> None:
    subscribe = struct.pack(">B", 3) + wire.string("s") + struct.pack(">hQH", wire.OFFSET_OFFSET, 42, 10)
    update = struct.pack(">IHHQ", 5, wire.OK, wire.OFFSET_TIMESTAMP, 9)
    expected = {
        request(wire.SUBSCRIBE, 7, subscribe + wire.string_map({"name": "g"})): wire.Subscribe(
            7, 3, "s", wire.Offset("offset", 42), 10, {"name": "g"}
        ),
        wire.frame(wire.PUBLISH, struct.pack(">BI", 1, 1) + b"m"): wire.Publish(1, 1, memoryview(b"m")),
        wire.frame(wire.CREDIT, struct.pack(">Bh", 3, -1)): wire.Credit(3, -1),
        request(wire.DELETE_PUBLISHER, 4, b"\x02"): wire.DeletePublisher(4, 2),
        request(wire.UNSUBSCRIBE, 4, b"\x02"): wire.Unsubscribe(4, 2),
        request(wire.PARTITIONS, 6, wire.string("ss")): wire.Partitions(6, "ss"),
        wire.frame(wire.TUNE | wire.RESPONSE, struct.pack(">II", 1, 2)): wire.Tune(1, 2),
        wire.frame(wire.CONSUMER_UPDATE | wire.RESPONSE, update): wire.ConsumerUpdateResponse(
            5, wire.OK, wire.Offset("timestamp", 9)
        ),
        wire.frame(wire.CLOSE | wire.RESPONSE, struct.pack(">IH", 1, wire.OK)): wire.Response(wire.CLOSE),
        wire.frame(wire.HEARTBEAT, b"\x00"): wire.UNKNOWN,
    }
    for frame, command in expected.items():
        assert wire.parse_request(frame[4:]) == command


# -- the Twisted shell ---------------------------------------------------------------------------


def shell(clock: Clock, node: Node | None = None) -> tuple[StreamServerProtocol, Transport]:
    factory = StreamServerFactory(node or Node(), clock, ("127.0.0.1", 5552))
    protocol = factory.buildProtocol(None)
    transport = Transport()
    protocol.makeConnection(transport)
    return protocol, transport


def test_writes_do_not_wait_for_nagle() -> None:
    """(Else a chunk written while the one before is not acknowledged waits for the client's
    delayed acknowledgement: 40 ms at the start of a subscription.)"""
    _protocol, transport = shell(Clock())
    assert transport.no_delay


def test_each_handshake_step_has_ten_seconds() -> None:
    clock = Clock()
    protocol, transport = shell(clock)
    clock.advance(STEP_TIMEOUT - 1)
    protocol.dataReceived(handshake_frames()[0])  # a step taken: its own ten seconds
    clock.advance(STEP_TIMEOUT - 1)
    assert not transport.aborted
    clock.advance(1)
    assert transport.aborted


def test_an_open_connection_gets_heartbeats_and_is_dropped_when_silent() -> None:
    clock = Clock()
    protocol, transport = shell(clock)
    protocol.dataReceived(b"".join(handshake_frames(heartbeat=5)))
    assert [key for key, _, _ in responses(transport.value())][-1] == wire.OPEN
    transport.clear()
    clock.advance(5)  # the answers to the handshake were written in this interval: no heartbeat
    assert transport.value() == b""
    protocol.dataReceived(wire.HEARTBEAT_FRAME)
    clock.advance(5)  # nothing written in this one: a heartbeat
    assert transport.value() == wire.HEARTBEAT_FRAME
    assert not transport.aborted
    clock.advance(5)
    assert not transport.aborted
    clock.advance(5)  # two intervals without a word from the client
    assert transport.aborted
    protocol.connectionLost()
    assert protocol.connection is not None and protocol.connection not in protocol.factory.node.stream_connections


def test_the_tune_offered_is_rabbitmqs_default() -> None:
    clock = Clock()
    protocol, transport = shell(clock)
    protocol.dataReceived(b"".join(handshake_frames()[:3]))
    assert wire.tune(FRAME_MAX, HEARTBEAT) in transport.value()


def written_chunks(node: Node) -> None:
    """What the log writer does with the streams' waiting messages, then a sync."""
    journal = node.streams.journal
    for stream, staged, dropped in journal.take_streams():
        stream.log.write(staged)
        stream.log.remove(dropped)
        stream.written(staged)
    journal.synced_to(journal.position)


def delivered(data: bytes) -> int:
    """How many ``deliver`` frames ``data`` holds."""
    return sum(1 for key, _, _ in responses(data) if key == wire.DELIVER)


def publishing_shell(tmp_path: Path, clock: Clock) -> tuple[Node, StreamServerProtocol, Transport]:
    """A shell whose client opened, created stream ``big`` and declared publisher 1 on it."""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    protocol, transport = shell(clock, node)
    protocol.dataReceived(b"".join(handshake_frames()))
    protocol.dataReceived(request(wire.CREATE_STREAM, 5, wire.string("big") + wire.string_map({})))
    protocol.dataReceived(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("big")))
    return node, protocol, transport


def test_a_client_that_does_not_read_costs_a_bounded_output(tmp_path: Path) -> None:
    clock = Clock()
    node, protocol, transport = publishing_shell(tmp_path, clock)
    body = b"x" * 100_000
    for number in range(40):  # 40 chunks of 100 kB
        protocol.dataReceived(wire.frame(wire.PUBLISH, struct.pack(">BIQI", 1, 1, number, len(body)) + body))
        written_chunks(node)
    transport.clear()
    subscribe = b"\x01" + wire.string("big") + struct.pack(">hH", wire.OFFSET_FIRST, 1000)
    protocol.dataReceived(request(wire.SUBSCRIBE, 7, subscribe))
    # Whatever the credit, about DELIVERY_BOUND bytes of chunks are queued between two writes
    # (the rest follows in the reactor's next turns).
    first = delivered(transport.value())
    assert 10 <= first <= 12 and max(transport.sizes) < DELIVERY_BOUND + len(body) + 100
    # The socket's buffer is full: nothing more goes out until it drains.
    protocol.pauseProducing()
    clock.advance(0)
    clock.advance(0)
    assert delivered(transport.value()) == first
    # Answers go on, but past OUTPUT_BOUND bytes written to the full buffer, reading stops.
    missing = [f"{number:0>200}" for number in range(2000)]  # (an answer of 400 kB each)
    for correlation in range(100, 200):
        protocol.dataReceived(request(wire.METADATA, correlation, wire.strings(missing)))
        if transport.producerState == "paused":
            break
    assert transport.producerState == "paused"
    protocol.resumeProducing()
    assert transport.producerState == "producing"
    for _ in range(5):
        clock.advance(0)
    assert delivered(transport.value()) == 40
    assert max(transport.sizes) < DELIVERY_BOUND + len(body) + 100
    protocol.connectionLost()


def group_subscribe(connection: StreamConnection, subscription: int, stream: str) -> None:
    """Subscription ``subscription`` to ``stream``, a member of group ``g`` over super stream ``ss``."""
    properties = {"single-active-consumer": "true", "name": "g", "super-stream": "ss"}
    body = bytes((subscription,)) + wire.string(stream) + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    connection.receive(request(wire.SUBSCRIBE, 100 + subscription, body + wire.string_map(properties)))


def sent(connection: StreamConnection) -> tuple[list[tuple[int, int, bool]], set[int]]:
    """What ``connection`` sent since last asked: ``(correlation id, subscription, active)`` of
    each ``consumer_update``, and the subscriptions it delivered to."""
    updates, delivered_to = [], set()
    for frame in wire.FrameReader().feed(b"".join(connection.out)):
        key = struct.unpack_from(">H", frame)[0]
        if key == wire.CONSUMER_UPDATE:
            correlation, subscription, active = struct.unpack_from(">IBB", frame, 4)
            updates.append((correlation, subscription, bool(active)))
        elif key == wire.DELIVER:
            delivered_to.add(frame[4])
    connection.out.clear()
    return updates, delivered_to


def answer_update(connection: StreamConnection, correlation: int) -> None:
    """The client's answer to ``consumer_update`` ``correlation``: read from the next offset."""
    body = struct.pack(">IHHQ", correlation, wire.OK, wire.OFFSET_NEXT, 0)
    connection.receive(wire.frame(wire.CONSUMER_UPDATE | wire.RESPONSE, body))


def test_a_group_over_a_super_stream_hands_a_partition_over_once_the_last_reader_stepped_down(
    tmp_path: Path,
) -> None:
    """RabbitMQ's rules (``rabbit_stream_sac_coordinator``): partition p goes to member p mod n
    of the n members in the order they came; the member reading it is told to step down, and
    the next is told it is active once that one answered, or went meanwhile."""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    admin = opened(node)
    partitions = ["ss-0", "ss-1", "ss-2"]
    layout = wire.string("ss") + wire.strings(partitions) + wire.strings(["0", "1", "2"]) + wire.string_map({})
    admin.receive(request(wire.CREATE_SUPER_STREAM, 5, layout))
    for place, partition in enumerate(partitions):
        declare = bytes((place,)) + wire.string("") + wire.string(partition)
        admin.receive(request(wire.DECLARE_PUBLISHER, 6 + place, declare))

    def publish() -> None:
        """A message to each partition."""
        for place in range(3):
            admin.receive(wire.frame(wire.PUBLISH, struct.pack(">BIQI", place, 1, 0, 1) + b"m"))
        written_chunks(node)

    def told(connection: StreamConnection) -> list[tuple[int, bool]]:
        return [(subscription, active) for _, subscription, active in sent(connection)[0]]

    def join(connection: StreamConnection) -> None:
        for place, partition in enumerate(partitions):  # (subscription p to partition p)
            group_subscribe(connection, place, partition)

    def answer_all(connection: StreamConnection) -> None:
        for correlation, _, _ in sent(connection)[0]:
            answer_update(connection, correlation)

    a, b, c, d, e = (opened(node) for _ in range(5))
    join(a)
    answer_all(a)  # (active on each partition: the only member)
    # b: partition 1 is b's (1 mod 2): a steps down, and b is told once a answered.
    join(b)
    (stepping,) = sent(a)[0]
    assert stepping[1:] == (1, False) and told(b) == []
    publish()
    assert sent(a)[1] == {0, 2} and sent(b)[1] == set()  # (no one reads partition 1 meanwhile)
    answer_update(a, stepping[0])
    assert told(a) == [] and told(c) == []
    (activated,) = sent(b)[0]
    assert activated[1:] == (1, True)
    answer_update(b, activated[0])
    # c: partition 2 is c's (2 mod 3), partition 1 still b's.
    join(c)
    (stepping,) = sent(a)[0]
    assert stepping[1:] == (2, False) and told(b) == [] and told(c) == []
    answer_update(a, stepping[0])
    answer_all(c)
    publish()
    assert (sent(a)[1], sent(b)[1], sent(c)[1]) == ({0}, {1}, {2})
    # d: no partition moves (p mod 4 is p).
    join(d)
    assert told(a) == told(b) == told(c) == told(d) == []
    # b goes: a, c, d. Its partition 1 is c's (1 mod 3), told straight away as b went; c steps
    # down from 2, which is d's.
    b.connection_lost()
    assert told(c) == [(1, True), (2, False)] and told(a) == told(d) == []
    # c goes without answering: a, d. Partition 1 is d's, 2 is a's (2 mod 2).
    c.connection_lost()
    (activating,) = sent(a)[0]
    assert activating[1:] == (2, True)
    answer_all(d)
    assert told(d) == []
    # e comes before a answered: partition 2 is e's (2 mod 3). a, told it is active, is told
    # to step down; its first answer reads nothing, its second lets e read.
    join(e)
    (stepping,) = sent(a)[0]
    assert stepping[1:] == (2, False) and told(e) == []
    answer_update(a, activating[0])
    publish()
    assert sent(a)[1] == {0} and sent(d)[1] == {1} and sent(e) == ([], set())
    answer_update(a, stepping[0])
    answer_all(e)
    publish()
    assert (sent(a)[1], sent(d)[1], sent(e)[1]) == ({0}, {1}, {2})
    for connection in (a, d, e):
        connection.connection_lost()
    assert not any(node.vhosts["/"].queues[partition].stream_groups for partition in partitions)


def stats(connection: StreamConnection, correlation: int, name: str) -> tuple[int, dict[str, int]]:
    """The code and the statistics of a ``stream_stats`` answer."""
    connection.out.clear()
    connection.receive(request(wire.STREAM_STATS, correlation, wire.string(name)))
    (frame,) = wire.FrameReader().feed(b"".join(connection.out))
    key, _version, answered, code, count = struct.unpack_from(">HHIHI", frame)
    assert (key, answered) == (wire.STREAM_STATS | wire.RESPONSE, correlation)
    found, at = {}, 14
    for _ in range(count):
        size = struct.unpack_from(">h", frame, at)[0]
        found[frame[at + 2 : at + 2 + size].decode()] = struct.unpack_from(">q", frame, at + 2 + size)[0]
        at += 2 + size + 8
    return code, found


def test_stream_stats_give_the_first_and_the_committed_chunk(tmp_path: Path) -> None:
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    none = {"committed_chunk_id": -1, "first_chunk_id": -1, "last_chunk_id": -1}
    assert stats(connection, 6, "events") == (wire.OK, none)
    connection.receive(request(wire.DECLARE_PUBLISHER, 7, b"\x01" + wire.string("") + wire.string("events")))
    for number in range(3):  # three chunks of 2 messages: at offsets 0, 2 and 4
        body = struct.pack(">QI", 2 * number, 1) + b"a" + struct.pack(">QI", 2 * number + 1, 1) + b"b"
        connection.receive(wire.frame(wire.PUBLISH, struct.pack(">BI", 1, 2) + body))
        written_chunks(node)
    found = stats(connection, 8, "events")
    assert found == (wire.OK, {"committed_chunk_id": 4, "first_chunk_id": 0, "last_chunk_id": 4})
    # (in RabbitMQ's order: a map's keys in byte order, rabbit_stream_core:response_body)
    assert list(found[1]) == sorted(found[1])
    assert stats(connection, 9, "missing") == (wire.STREAM_DOES_NOT_EXIST, {})
    node.users_by_name["guest"] = User("guest", "guest", permissions={"/": Permission(".*", ".*", "^$")})
    assert stats(connection, 10, "events") == (wire.ACCESS_REFUSED, {})


def test_sub_entry_batches_are_kept_as_they_came_and_take_an_offset_for_each_message(tmp_path: Path) -> None:
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("events")))
    plain_batch = sub_entry_batch([b"b", b"cc"])
    gzipped = sub_entry_batch([b"d", b"e", b"f"], 1)
    lying = plain_batch[:1] + struct.pack(">H", 3) + plain_batch[3:]
    published = [
        struct.pack(">QI", 0, 1) + b"a",
        struct.pack(">Q", 1) + bytes((plain_batch[0] | 0x0F,)) + plain_batch[1:],  # (reserved bits set)
        struct.pack(">Q", 2) + gzipped,
        struct.pack(">Q", 3) + chunks.BATCH_HEAD.pack(0x80, 0, 0, 0),  # no messages
        struct.pack(">Q", 4) + lying,
    ]
    connection.out.clear()
    connection.receive(wire.frame(wire.PUBLISH, struct.pack(">BI", 1, 5) + b"".join(published)))
    (error,) = wire.FrameReader().feed(b"".join(connection.out))
    assert error == b"\x00\x04\x00\x01\x01" + struct.pack(">IQHQH", 2, 3, 17, 4, 17)
    connection.out.clear()
    written_chunks(node)
    (confirm,) = wire.FrameReader().feed(b"".join(connection.out))
    assert confirm == b"\x00\x03\x00\x01\x01" + struct.pack(">I3Q", 3, 0, 1, 2)
    stream = node.vhosts["/"].queues["events"]
    chunk = stream.log.locate(0)
    assert (chunk.count, chunk.raw, stream.committed) == (6, chunks.BATCHED, 6)
    raw = (b"\x00\x00", b"")
    assert stream.log.read_messages(chunk) == [(*raw, b"a"), (*raw, b"b"), (*raw, b"cc"), None, None, None]
    # Delivered as stored (the reserved bits cleared, as osiris stores them): 3 entries, 6 messages.
    connection.out.clear()
    subscribe = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    connection.receive(request(wire.SUBSCRIBE, 7, subscribe))
    deliver = wire.FrameReader().feed(b"".join(connection.out))[-1]
    head = struct.Struct(">HHBBBHIqQQIIII")
    fields = head.unpack_from(deliver)
    entries = deliver[head.size :]
    assert entries == struct.pack(">I", 1) + b"a" + plain_batch + gzipped
    assert (fields[0], fields[5], fields[6], fields[9], fields[11]) == (wire.DELIVER, 3, 6, 0, len(entries))
    assert fields[10] == zlib.crc32(entries)
    # The next message takes offset 6.
    connection.receive(wire.frame(wire.PUBLISH, struct.pack(">BIQI", 1, 1, 5, 1) + b"g"))
    written_chunks(node)
    assert stream.log.locate(6).first_offset == 6 and stream.committed == 7


def test_a_frame_of_batches_cut_short_is_refused_whole(tmp_path: Path) -> None:
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("events")))
    batch = struct.pack(">Q", 0) + sub_entry_batch([b"b", b"cc"])
    for cut in (batch[:12], batch[:18], batch[:-1]):
        connection.out.clear()
        connection.receive(wire.frame(wire.PUBLISH, struct.pack(">BI", 1, 1) + cut))
        (error,) = wire.FrameReader().feed(b"".join(connection.out))
        assert error == b"\x00\x04\x00\x01\x01" + struct.pack(">I", 0)
    written_chunks(node)
    assert node.vhosts["/"].queues["events"].committed == 0


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**64 - 1), max_size=6),
    size=st.sampled_from([0, 5, 255, 256, 300]),
    uneven=st.booleans(),
    lie=st.integers(-1, 1),
)
def test_a_publish_frames_messages_are_read_alike_whatever_their_sizes(
    ids: list[int], size: int, uneven: bool, lie: int
) -> None:
    """(Frames of messages of one size are read by one call; the others one by one.)"""
    messages = [bytes([n % 256]) * (size + (n % 3 if uneven else 0)) for n in range(len(ids))]
    data = b"".join(struct.pack(">QI", i, len(m)) + m for i, m in zip(ids, messages, strict=True))
    expected = (ids, b"".join(struct.pack(">I", len(m)) + m for m in messages))
    for read in (_published(memoryview(data), max(0, len(ids) + lie)), _published(data, len(ids))):
        assert read is not None and read[:2] == expected
        # (a size, when given, is every message's)
        assert read[2] is None or {len(m) for m in messages} == {read[2]}


def deliveries(data: bytes) -> list[tuple[int, int, bytes]]:
    """``(first offset, messages, entries)`` of each ``deliver`` frame in ``data``, each
    checked against the CRC-32 its head carries."""
    found = []
    head = struct.Struct(">HHBBBHIqQQIIII")
    for frame in wire.FrameReader().feed(data):
        if struct.unpack_from(">H", frame)[0] == wire.DELIVER:
            fields = head.unpack_from(frame)
            entries = frame[head.size :]
            assert (fields[10], fields[11]) == (zlib.crc32(entries), len(entries))
            found.append((fields[9], fields[6], entries))
    return found


def test_a_large_chunk_is_sent_as_stored_with_the_crc_of_its_entries(tmp_path: Path) -> None:
    node, protocol, transport = publishing_shell(tmp_path, Clock())
    bodies = [bytes([n]) * (30_000 + n) for n in range(3)]  # one chunk of 90 kB: sent from its file
    published = b"".join(struct.pack(">QI", n, len(b)) + b for n, b in enumerate(bodies))
    protocol.dataReceived(wire.frame(wire.PUBLISH, struct.pack(">BI", 1, 3) + published))
    written_chunks(node)
    protocol.dataReceived(wire.frame(wire.PUBLISH, struct.pack(">BIQI", 1, 1, 3, 1) + b"s"))
    written_chunks(node)
    transport.clear()
    subscribe = b"\x01" + wire.string("big") + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    protocol.dataReceived(request(wire.SUBSCRIBE, 7, subscribe))
    expected = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    found = deliveries(transport.value())
    assert [(first, count) for first, count, _ in found] == [(0, 3), (3, 1)]  # (not their bytes: too long to show)
    assert found[0][2] == expected and found[1][2] == struct.pack(">I", 1) + b"s"
    stream = node.vhosts["/"].queues["big"]
    assert stream.log.locate(0).length >= SENT_FROM_FILE > stream.log.locate(3).length
    protocol.connectionLost()


class SocketTransport:
    """One end of a socket pair, as Twisted's TCP transport looks to the shell: its socket, and
    what is written through it kept in order (its buffer)."""

    disconnecting = False

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0
        self.written: list[bytes] = []
        #: Whether the shell waits for the socket to take more (it calls resumeProducing then).
        self.waiting = False
        self.producerPaused = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self._tempDataLen += len(data)

    def startWriting(self) -> None:  # noqa: N802 (Twisted's name)
        self.waiting = True

    def abortConnection(self) -> None:  # noqa: N802 (Twisted's name)
        self.aborted = True


@pytest.mark.parametrize(
    "sizes",
    [
        [300_000, ("region", 200_000), 10, ("region", 1_000)],  # the socket fills on bytes before a chunk
        [10, ("region", 900_000), 20, ("region", 70_000)],  # ... and in a chunk
        [10, ("region", 70_000)],  # everything fits
    ],
)
def test_chunks_from_their_file_and_bytes_reach_the_client_in_order_however_full_the_socket(
    tmp_path: Path, sizes: list[Any]
) -> None:
    storage = DirectoryStorage(tmp_path)
    storage.create(1, b"")
    out: list[Any] = []
    expected = b""
    at = 0
    for number, size in enumerate(sizes):
        if isinstance(size, tuple):
            data = bytes([number]) * size[1]
            storage.append(1, data)
            out.append(Region(storage, 1, at, size[1]))
            at += size[1]
        else:
            data = bytes([100 + number]) * size
            out.append(data)
        expected += data
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    ours.setblocking(False)
    protocol = StreamServerFactory(Node(), Clock(), ("127.0.0.1", 5552)).buildProtocol(None)
    protocol.transport = transport = SocketTransport(ours)
    protocol.connection = StreamConnection(Node(), "127.0.0.1:1", True, ("127.0.0.1", 5552))
    protocol._send(out)
    received = b""
    rounds = 0
    while transport.waiting:  # the socket filled: what it did not take waits, then goes on
        assert transport.producerPaused and protocol.connection.paused
        received += theirs.recv(1 << 20)
        transport.waiting = False
        protocol.resumeProducing()
        rounds += 1
    assert rounds or len(expected) < 200_000
    ours.close()
    while chunk := theirs.recv(1 << 20):
        received += chunk
    theirs.close()
    got = received + b"".join(transport.written)
    assert len(got) == len(expected) and got == expected  # (not shown whole: too long)


def test_a_chunk_whose_segment_went_ends_the_connection_and_is_not_tried_again(tmp_path: Path) -> None:
    storage = DirectoryStorage(tmp_path)
    storage.create(1, b"")
    storage.append(1, b"x" * 100_000)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    protocol = StreamServerFactory(Node(), Clock(), ("127.0.0.1", 5552)).buildProtocol(None)
    protocol.transport = protocol._socket = transport = SocketTransport(ours)  # (as connectionMade sets them)
    protocol.connection = StreamConnection(Node(), "127.0.0.1:1", True, ("127.0.0.1", 5552))
    storage.retire(1)  # (retention removed it)
    with logged_errors() as errors:
        assert protocol._send([b"head", Region(storage, 1, 0, 100_000)]) == 0
    assert transport.aborted and not transport.waiting and not protocol._unsent
    assert any("sending a chunk failed" in error for error in errors)
    ours.close()
    theirs.close()


def published_frame(publisher: int, ids: list[int], body: Callable[[int], bytes] = lambda n: b"m%d" % n) -> bytes:
    """A ``publish`` frame of one message for each of ``ids``."""
    messages = b"".join(struct.pack(">QI", n, len(body(n))) + body(n) for n in ids)
    return wire.frame(wire.PUBLISH, struct.pack(">BI", publisher, len(ids)) + messages)


def chunk_sizes(node: Node, name: str) -> list[int]:
    """The messages in each of stream ``name``'s chunks, oldest first."""
    stream = node.vhosts["/"].queues[name]
    sizes, chunk = [], stream.log.locate(stream.log.first_offset)
    while chunk is not None:
        sizes.append(chunk.count)
        chunk = stream.log.next_chunk(chunk)
    return sizes


def test_a_burst_goes_into_chunks_that_grow_from_32_entries_as_rabbitmqs_batches(tmp_path: Path) -> None:
    """RabbitMQ 3.10.8 stored a frame of 4,999 messages as chunks of 32, 64 ... 2048 and 935
    entries (tests/conformance/test_stream_protocol_transcripts.py compares them)."""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("events")))
    connection.receive(published_frame(1, list(range(4999)), lambda n: b"b"))
    written_chunks(node)
    assert chunk_sizes(node, "events") == [32, 64, 128, 256, 512, 1024, 2048, 935]
    # The last chunk did not fill: the next start at half the size it had reached (4096).
    uneven = list(range(5000, 5000 + 3000))
    connection.receive(published_frame(1, uneven, lambda n: b"x" * (n % 7)))
    written_chunks(node)
    assert chunk_sizes(node, "events")[8:] == [2048, 952]
    stream = node.vhosts["/"].queues["events"]
    bodies = [body for _names, _header, body in stream.log.read_messages(stream.log.locate(5000 + 2048))]
    assert bodies == [b"x" * (n % 7) for n in uneven[2048:]]
    # Never more than 8,192 entries: 200,000 messages of 10 B from many frames.
    for start in range(10**6, 10**6 + 200_000, 1000):
        connection.receive(published_frame(1, list(range(start, start + 1000)), lambda n: b"0123456789"))
    written_chunks(node)
    sizes = chunk_sizes(node, "events")[10:]
    assert sum(sizes) == 200_000 and max(sizes) == 8192


def test_amqp_0_9_1_messages_and_sub_entry_batches_are_capped_alike(tmp_path: Path) -> None:
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("events")))
    batch = sub_entry_batch([b"b", b"cc", b"d"])
    entries = [struct.pack(">Q", n) + batch for n in range(40)]  # 40 entries of 3 messages
    connection.receive(wire.frame(wire.PUBLISH, struct.pack(">BI", 1, 40) + b"".join(entries)))
    written_chunks(node)
    assert chunk_sizes(node, "events") == [32 * 3, 8 * 3]
    stream = node.vhosts["/"].queues["events"]
    assert stream.chunk_entries == 32
    for n in range(40):
        body = b"%d" % n
        stream.enqueue(Message("", "events", b"\x00\x06events", content_header(None, len(body)), body))
    written_chunks(node)
    assert chunk_sizes(node, "events")[2:] == [32, 8]


def test_a_stored_chunk_of_more_entries_than_a_head_counts_goes_as_several(tmp_path: Path) -> None:
    """(Chunks were not capped before: one of 70,000 entries may be on disk.)"""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    stream = node.vhosts["/"].queues["events"]
    entries = chunks.pack_raw_entries(b"%d" % n for n in range(70_000))
    staged = [stream.log.stage_packed(entries, 70_000, 0.0, chunks.RAW)]
    stream.log.write(staged)
    stream.written(staged)
    connection.out.clear()
    subscribe = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 1)
    connection.receive(request(wire.SUBSCRIBE, 7, subscribe))
    found = deliveries(b"".join(bytes(part) for part in connection.out))
    assert [(first, count) for first, count, _ in found] == [(8192 * n, 8192) for n in range(8)] + [(65536, 4464)]
    assert b"".join(data for _, _, data in found) == entries


def test_ids_repeated_within_a_frame_are_written_once_and_all_confirmed(tmp_path: Path) -> None:
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("ref") + wire.string("events")))
    connection.receive(published_frame(1, [1, 2, 3, 1, 2, 3]))
    connection.receive(published_frame(1, [5, 4, 6, 2, 7]))  # (4 and 2 are below an id before them)
    connection.out.clear()
    written_chunks(node)
    stream = node.vhosts["/"].queues["events"]
    bodies = [body for _n, _h, body in stream.log.read_messages(stream.log.locate(0))]
    assert bodies == [b"m1", b"m2", b"m3", b"m5", b"m6", b"m7"]
    confirms = wire.FrameReader().feed(b"".join(connection.out))
    assert confirms == [
        b"\x00\x03\x00\x01\x01" + struct.pack(">I6Q", 6, 1, 2, 3, 1, 2, 3),
        b"\x00\x03\x00\x01\x01" + struct.pack(">I5Q", 5, 5, 4, 6, 2, 7),
    ]
    assert stream.publisher_sequence("ref") == 7


def test_exchange_command_versions_lists_what_is_served_and_deliver_2_follows_when_asked(tmp_path: Path) -> None:
    """RabbitMQ 3.11's ``exchange_command_versions``: the answer is ``code u16, count u32``, then
    ``key u16, min u16, max u16`` for each command (``rabbit_stream_core:response_body``); a
    client that reads ``deliver`` up to version 2 then gets ``deliver`` v2: the subscription id,
    then the committed chunk id (u64), then the chunk (``rabbit_stream_reader:send_file_callback``)."""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("events")))
    for first in (0, 2):  # two chunks of two: at offsets 0 and 2
        connection.receive(published_frame(1, [first, first + 1]))
        written_chunks(node)
    subscribe = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 1)
    connection.out.clear()
    connection.receive(request(wire.SUBSCRIBE, 7, subscribe))
    (_answer, v1) = wire.FrameReader().feed(b"".join(bytes(part) for part in connection.out))
    assert struct.unpack_from(">HHB", v1) == (wire.DELIVER, 1, 1) and v1[5] == 0x50  # (the chunk's magic next)
    connection.out.clear()
    theirs = [(wire.DELIVER, 1, 2), (wire.PUBLISH, 1, 2), (wire.CONSUMER_UPDATE, 1, 1)]
    offer = struct.pack(">I", len(theirs)) + b"".join(struct.pack(">HHH", *each) for each in theirs)
    connection.receive(request(wire.EXCHANGE_COMMAND_VERSIONS, 8, offer))
    (answer,) = wire.FrameReader().feed(b"".join(connection.out))
    key, version, correlation, code, count = struct.unpack_from(">HHIHI", answer)
    assert (key, version, correlation, code) == (wire.EXCHANGE_COMMAND_VERSIONS | wire.RESPONSE, 1, 8, wire.OK)
    listed = [struct.unpack_from(">HHH", answer, 14 + 6 * n) for n in range(count)]
    assert len(answer) == 14 + 6 * count
    assert {key for key, _, _ in listed} == {
        wire.DECLARE_PUBLISHER, wire.PUBLISH, wire.QUERY_PUBLISHER_SEQUENCE, wire.DELETE_PUBLISHER,
        wire.SUBSCRIBE, wire.CREDIT, wire.STORE_OFFSET, wire.QUERY_OFFSET, wire.UNSUBSCRIBE,
        wire.CREATE_STREAM, wire.DELETE_STREAM, wire.METADATA, wire.CLOSE, wire.HEARTBEAT, wire.ROUTE,
        wire.PARTITIONS, wire.STREAM_STATS, wire.CREATE_SUPER_STREAM, wire.DELETE_SUPER_STREAM,
    }  # fmt: skip
    assert all((least, most) == (1, 1) for _, least, most in listed)
    # The next chunk comes as deliver v2, with the committed chunk's first offset (2).
    connection.out.clear()
    connection.receive(wire.frame(wire.CREDIT, struct.pack(">Bh", 1, 1)))
    (v2,) = wire.FrameReader().feed(b"".join(bytes(part) for part in connection.out))
    assert struct.unpack_from(">HHBQB", v2) == (wire.DELIVER, 2, 1, 2, 0x50)
    chunk = struct.Struct(">BBHIqQQIIII").unpack_from(v2, 13)
    assert (chunk[2], chunk[3], chunk[6]) == (2, 2, 2)  # two entries, two messages, from offset 2
    assert v2[13 + 48 :] == b"".join(struct.pack(">I", len(b"m%d" % n)) + b"m%d" % n for n in (2, 3))
    # Before open, it ends the connection as any command out of turn.
    early = StreamConnection(Node(), "127.0.0.1:40000", True, ("127.0.0.1", 5552))
    early.receive(request(wire.PEER_PROPERTIES, 1, wire.string_map({})))
    early.receive(request(wire.EXCHANGE_COMMAND_VERSIONS, 2, offer))
    assert early.finished


@pytest.mark.parametrize(
    ("arguments", "stream", "index"),
    [
        ({"x-stream-partition-order": 2}, "ss-0", 2),  # RabbitMQ's binding argument
        ({"x-super-stream-partition-order": 1}, "ss-0", 1),  # the one Postroom wrote before
        ({}, "orders-7", 7),  # none: the number after the name's last "-"
        ({}, "orders", -1),  # neither: a lone stream's group
        ({}, "orders-x", -1),
    ],
)
def test_a_groups_partition_index_is_found_as_rabbitmq_finds_it(
    tmp_path: Path, arguments: dict[str, int], stream: str, index: int
) -> None:
    """``rabbit_stream_manager``'s ``partition_index``: over the exchange the ``super-stream``
    property names, the stream's binding's ``x-stream-partition-order``, else its name."""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string(stream) + wire.string_map({})))
    vhost = node.vhosts["/"]
    vhost.declare_exchange("ss", "direct", durable=True)
    vhost.bind_queue(stream, "ss", "0", arguments, None)
    found = partition_index(vhost, vhost.queues[stream], "ss")
    assert found == index
    assert partition_index(vhost, vhost.queues[stream], "missing") == -1
    # The first member is told it is active; once the second comes, the partition is member
    # p mod 2's: an odd p moves it (the first steps down). At -1 it stays with the first.
    for subscription in (1, 2):
        properties = {"single-active-consumer": "true", "name": "g", "super-stream": "ss"}
        body = bytes((subscription,)) + wire.string(stream) + struct.pack(">hH", wire.OFFSET_FIRST, 10)
        connection.receive(request(wire.SUBSCRIBE, 10 + subscription, body + wire.string_map(properties)))
    told = [struct.unpack_from(">IBB", frame, 4)[1:] for frame in wire.FrameReader().feed(b"".join(connection.out))
            if struct.unpack_from(">H", frame)[0] == wire.CONSUMER_UPDATE]  # fmt: skip
    assert told == ([(1, 1), (1, 0)] if index >= 0 and index % 2 else [(1, 1)])


def test_an_activation_answered_with_no_offset_reads_from_where_the_subscription_said(tmp_path: Path) -> None:
    """RabbitMQ's reader takes an answer of offset type 0 (none) as the subscription's own
    offset specification, and passes over what follows a type without a value."""
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    connection.receive(request(wire.DECLARE_PUBLISHER, 6, b"\x01" + wire.string("") + wire.string("events")))
    connection.receive(published_frame(1, [0, 1]))
    written_chunks(node)
    connection.out.clear()
    properties = {"single-active-consumer": "true", "name": "g"}
    body = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    connection.receive(request(wire.SUBSCRIBE, 7, body + wire.string_map(properties)))
    (update,) = sent(connection)[0]
    assert update[1:] == (1, True)
    connection.receive(wire.frame(wire.CONSUMER_UPDATE | wire.RESPONSE, struct.pack(">IHH", update[0], wire.OK, 0)))
    found = deliveries(b"".join(bytes(part) for part in connection.out))
    assert [(first, count) for first, count, _ in found] == [(0, 2)]


def test_each_stream_listener_advertises_its_own_address_or_the_configured_one() -> None:
    """As RabbitMQ's ``rabbit_stream``: ``host()`` and ``port()``, ``tls_host()`` (falling back
    to ``host()``) and ``tls_port()``, each the listener's own when not configured."""
    listen = ListenConfig(stream="tcp:5552:interface=127.0.0.1", stream_tls="tcp:5551:interface=127.0.0.2")
    own = BrokerConfig(listen=listen)
    host = BrokerConfig(listen=listen, stream=StreamProtocolConfig("a.example", advertised_tls_port=30551))
    both = BrokerConfig(listen=listen, stream=StreamProtocolConfig("a.example", advertised_tls_host="b.example"))
    assert stream_addresses(own) == (("127.0.0.1", 5552), ("127.0.0.2", 5551))
    assert stream_addresses(host) == (("a.example", 5552), ("a.example", 30551))
    assert stream_addresses(both) == (("a.example", 5552), ("b.example", 5551))
    assert stream_addresses(BrokerConfig()) == (None, None)


@pytest.mark.parametrize("answered", [False, True])
def test_a_consumer_update_left_unanswered_ends_the_connection_as_rabbitmq_ends_it(
    tmp_path: Path, answered: bool
) -> None:
    """RabbitMQ's reader looks at its requests to the client every 60 s (``request_timeout``)
    and ends the connection when one has waited longer: a member that never answers would
    hold its group's partition."""
    clock = Clock()
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    protocol, transport = shell(clock, node)
    protocol.dataReceived(b"".join(handshake_frames()))
    protocol.dataReceived(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map({})))
    properties = {"single-active-consumer": "true", "name": "g"}
    body = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    transport.clear()
    protocol.dataReceived(request(wire.SUBSCRIBE, 7, body + wire.string_map(properties)))
    (update,) = [frame for frame in wire.FrameReader().feed(transport.value()) if frame[:2] == b"\x00\x1a"]
    correlation = struct.unpack_from(">I", update, 4)[0]
    clock.advance(REQUEST_TIMEOUT)
    assert not transport.aborted  # (sent less than a timeout ago at the first look)
    if answered:
        protocol.dataReceived(wire.frame(wire.CONSUMER_UPDATE | wire.RESPONSE, struct.pack(">IHH", correlation, 1, 0)))
    clock.advance(REQUEST_TIMEOUT)
    assert transport.aborted is not answered
    clock.advance(10 * REQUEST_TIMEOUT)
    assert transport.aborted is not answered
    protocol.connectionLost()
    assert not clock.getDelayedCalls()

"""The Twisted shell, in memory: timers on a Clock, bytes through StringTransport."""

from __future__ import annotations

from pamqp import commands
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from postroom.broker.core.node import Node
from postroom.broker.server.protocol import (
    CLOSE_TIMEOUT,
    FLOW_READ_BYTES,
    HANDSHAKE_TIMEOUT,
    READ_BYTES,
    AMQPServerFactory,
    AMQPServerProtocol,
    is_loopback,
)
from postroom.broker.tools.testing import FramePump, described, encode, publish_frames
from postroom.broker.wire.codec import PROTOCOL_HEADER


class CountingTransport(StringTransport):
    """A StringTransport that counts write calls and records aborts."""

    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        self.writes = 0
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)

    def abortConnection(self) -> None:
        self.aborted = True
        self.loseConnection()


def connect(factory: AMQPServerFactory) -> tuple[AMQPServerProtocol, CountingTransport]:
    protocol = factory.buildProtocol(None)
    transport = CountingTransport()
    protocol.makeConnection(transport)
    return protocol, transport


def handshake(protocol: AMQPServerProtocol, heartbeat: int = 0) -> None:
    protocol.dataReceived(PROTOCOL_HEADER)
    protocol.dataReceived(
        encode(
            0,
            commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"),
            commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=heartbeat),
            commands.Connection.Open(virtual_host="/"),
        )
        + encode(1, commands.Channel.Open())
    )


def test_loopback_addresses_are_recognised() -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1", "10.0.0.1", "x")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]


def test_a_client_that_never_finishes_the_handshake_is_dropped() -> None:
    clock = Clock()
    _, transport = connect(AMQPServerFactory(Node(), clock))
    clock.advance(HANDSHAKE_TIMEOUT - 0.1)
    assert not transport.aborted
    clock.advance(0.1)
    assert transport.aborted


def test_handshake_timer_is_cancelled_once_open() -> None:
    clock = Clock()
    protocol, transport = connect(AMQPServerFactory(Node(), clock))
    handshake(protocol)
    assert clock.getDelayedCalls() == []
    clock.advance(HANDSHAKE_TIMEOUT * 2)
    assert not transport.aborted


def test_silent_peer_is_dropped_after_two_heartbeat_intervals() -> None:
    clock = Clock()
    protocol, transport = connect(AMQPServerFactory(Node(), clock))
    handshake(protocol, heartbeat=10)
    transport.clear()
    clock.advance(5)  # first tick: the handshake was just sent, so no heartbeat
    clock.advance(5)
    assert transport.value() == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    for _ in range(2):
        clock.advance(5)
    assert not transport.aborted
    clock.advance(5)
    assert transport.aborted


def test_deliveries_for_a_batch_of_publishes_are_one_write() -> None:
    clock = Clock()
    factory = AMQPServerFactory(Node(), clock)
    consumer, consumer_transport = connect(factory)
    handshake(consumer)
    consumer.dataReceived(
        encode(1, commands.Queue.Declare(queue="q"), commands.Basic.Consume(queue="q", consumer_tag="c"))
    )
    publisher, publisher_transport = connect(factory)
    handshake(publisher)
    consumer_transport.clear()
    writes = consumer_transport.writes
    publisher.dataReceived(b"".join(publish_frames(1, "", "q", b"%d" % i) for i in range(100)))
    assert consumer_transport.writes == writes + 1
    delivered = [f for _, f in FramePump().feed(consumer_transport.value()) if isinstance(f, commands.Basic.Deliver)]
    assert [d.delivery_tag for d in delivered] == list(range(1, 101))


def test_paused_transport_stops_deliveries_until_resumed() -> None:
    clock = Clock()
    factory = AMQPServerFactory(Node(), clock)
    consumer, transport = connect(factory)
    handshake(consumer)
    consumer.dataReceived(
        encode(1, commands.Queue.Declare(queue="q"), commands.Basic.Consume(queue="q", consumer_tag="c"))
    )
    transport.clear()
    consumer.pauseProducing()
    consumer.dataReceived(publish_frames(1, "", "q", b"held"))
    assert transport.value() == b""
    consumer.resumeProducing()
    assert [name for name, _ in described(f for _, f in FramePump().feed(transport.value()))] == [
        "Basic.Deliver",
        "ContentHeader",
        "ContentBody",
    ]


def test_close_all_sends_320_and_drops_clients_that_never_answer() -> None:
    clock = Clock()
    factory = AMQPServerFactory(Node(), clock)
    protocol, transport = connect(factory)
    handshake(protocol)
    transport.clear()
    factory.close_all()
    ((_, close),) = FramePump().feed(transport.value())
    assert (close.reply_code, close.reply_text) == (
        320,
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
    )
    clock.advance(CLOSE_TIMEOUT)
    assert transport.aborted


def test_connection_lost_requeues_unacked_for_other_consumers() -> None:
    clock = Clock()
    factory = AMQPServerFactory(Node(), clock)
    first, _ = connect(factory)
    handshake(first)
    first.dataReceived(encode(1, commands.Queue.Declare(queue="q"), commands.Basic.Consume(queue="q")))
    second, second_transport = connect(factory)
    handshake(second)
    second.dataReceived(encode(1, commands.Basic.Qos(prefetch_count=1)))
    second.dataReceived(encode(1, commands.Basic.Consume(queue="q", consumer_tag="second")))
    second.dataReceived(publish_frames(1, "", "q", b"one") + publish_frames(1, "", "q", b"two"))
    second_transport.clear()
    first.connectionLost(None)
    assert second_transport.value() == b""  # "one" is back in the queue, but second is at its prefetch
    second.dataReceived(encode(1, commands.Basic.Ack(delivery_tag=1)))
    frames = [f for _, f in FramePump().feed(second_transport.value())]
    assert [(f.delivery_tag, f.redelivered) for f in frames[::3]] == [(2, True)]
    assert frames[2].value == b"one"


def test_a_client_is_read_in_smaller_pieces_while_the_node_is_in_flow() -> None:
    """Past the broker's capacity (a queue with consumers far behind), each read takes less, so
    reading publishes cedes the reactor to deliveries and acks."""
    node = Node()
    factory = AMQPServerFactory(node, Clock())
    protocol = factory.buildProtocol(None)
    transport = CountingTransport()
    transport.bufferSize = READ_BYTES  # type: ignore[attr-defined]  # as a TCP transport has it
    protocol.makeConnection(transport)
    handshake(protocol)
    assert transport.bufferSize == READ_BYTES
    node.set_flow(True)
    protocol.dataReceived(publish_frames(1, "", "nowhere", b"x"))
    assert transport.bufferSize == FLOW_READ_BYTES
    node.set_flow(False)
    protocol.dataReceived(publish_frames(1, "", "nowhere", b"x"))
    assert transport.bufferSize == READ_BYTES


def test_under_tls_the_transport_that_reads_the_socket_is_the_one_slowed() -> None:
    class Socket:
        bufferSize = READ_BYTES

    class Wrapped(CountingTransport):  # as TLS wraps a TCP transport
        transport = Socket()

    node = Node()
    protocol = AMQPServerFactory(node, Clock()).buildProtocol(None)
    transport = Wrapped()
    protocol.makeConnection(transport)
    handshake(protocol)
    node.set_flow(True)
    protocol.dataReceived(publish_frames(1, "", "nowhere", b"x"))
    assert transport.transport.bufferSize == FLOW_READ_BYTES and not hasattr(transport, "bufferSize")


def test_the_shell_counts_a_connections_bytes_reads_and_writes_and_its_sampler_their_rates() -> None:
    from postroom.broker.server.management import RateSampler

    clock = Clock()
    clock.advance(1_800_000_000.0)
    node = Node(clock=clock)
    factory = AMQPServerFactory(node, clock)
    sampler = RateSampler(node, clock, interval=5.0)
    sampler.start()
    protocol, transport = connect(factory)
    connection = protocol.connection
    assert connection is not None and connection.socket is not None
    assert (connection.socket.peer_host, connection.socket.peer_port, connection.socket.tls) == (
        "127.0.0.1",
        40000,
        None,
    )
    assert connection.connected_at == 1_800_000_000_000
    handshake(protocol)
    received = len(PROTOCOL_HEADER) + len(
        encode(
            0,
            commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"),
            commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
            commands.Connection.Open(virtual_host="/"),
        )
        + encode(1, commands.Channel.Open())
    )
    assert (connection.recv_oct, connection.recv_cnt) == (received, 2)
    assert (connection.send_oct, connection.send_cnt) == (len(transport.value()), transport.writes)
    assert connection.auth_mechanism == "PLAIN"
    clock.advance(5.0)
    assert sampler.socket_rates(connection) == (received / 5.0, len(transport.value()) / 5.0)
    assert sampler.vhost_bytes["/"] == [received, len(transport.value())]
    churn = sampler.churn()
    assert (churn["connection_created"], churn["channel_created"]) == (1, 1)
    assert churn["connection_created_details"] == {"rate": 0.2}
    protocol.dataReceived(publish_frames(1, "", "nowhere", b"x"))
    clock.advance(5.0)
    assert sampler.channel_rates(connection.channels[1])["publish"] == 0.2
    assert sampler.socket_rates(connection)[1] == 0.0
    sampler.stop()


class SocketTransport(CountingTransport):
    """As a TCP transport: a read size, and ``doWrite``, which the reactor calls when the socket
    takes what waits to be written."""

    bufferSize = 65536

    def __init__(self) -> None:
        super().__init__()
        self.socket_writes = 0

    def doWrite(self) -> None:
        self.socket_writes += 1


def test_a_cluster_leader_past_its_lease_writes_nothing_more_to_its_sockets() -> None:
    leading = [True]
    factory = AMQPServerFactory(Node(), Clock())
    factory.leading = lambda: leading[0]
    protocol = factory.buildProtocol(None)
    transport = SocketTransport()
    protocol.makeConnection(transport)
    transport.doWrite()
    assert transport.socket_writes == 1 and not transport.aborted
    leading[0] = False  # resumed after a pause past its lease: the reactor may write before any timer runs
    transport.doWrite()
    assert transport.socket_writes == 1 and transport.aborted


def test_a_single_node_leaves_its_sockets_alone() -> None:
    factory = AMQPServerFactory(Node(), Clock())
    transport = SocketTransport()
    factory.buildProtocol(None).makeConnection(transport)
    assert "doWrite" not in vars(transport)  # (the class's own: nothing added on the hot path)
    transport.doWrite()
    assert transport.socket_writes == 1

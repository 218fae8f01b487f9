"""The Twisted client against an in-process broker: over loopback on the same reactor, and in
memory on a ``MemoryReactorClock`` where the timing of reconnection attempts matters."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import deferLater
from twisted.internet.testing import MemoryReactorClock
from twisted.test.iosim import ConnectionCompleter, IOPump

from postroom.broker.clients.client import ConnectionClosed, Message, PublishNacked, PublishReturned, backoff
from postroom.broker.clients.txclient import TwistedConnection, connect_twisted
from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.server.protocol import AMQPServerFactory
from postroom.broker.wire.codec import HEARTBEAT_FRAME


class LoopbackBroker:
    """A broker on the global reactor that can be stopped and started again on the same port."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.number = 0
        self.factory: AMQPServerFactory | None = None
        self.listening: IListeningPort | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.number}/"

    def start(self, node: Node | None = None) -> None:
        from twisted.internet import reactor

        self.node = node if node is not None else self.node
        self.factory = AMQPServerFactory(self.node, reactor)
        self.listening = reactor.listenTCP(self.number, self.factory, interface="127.0.0.1")
        self.number = self.listening.getHost().port

    async def stop(self) -> None:
        """Close every connection (320, as at shutdown; unacked messages go back) and stop listening."""
        assert self.factory is not None and self.listening is not None
        self.factory.close_all()
        await self.listening.stopListening()


@pytest_twisted.async_yield_fixture
async def broker() -> AsyncIterator[LoopbackBroker]:
    broker = LoopbackBroker(Node())
    broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


@pytest_twisted.async_yield_fixture
async def conn(broker: LoopbackBroker) -> AsyncIterator[TwistedConnection]:
    from twisted.internet import reactor

    connection = await connect_twisted(reactor, broker.url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest_twisted.ensureDeferred
async def test_publish_get_and_consume_with_deferreds(conn: TwistedConnection) -> None:
    assert await conn.declare_queue("jobs") == "jobs"
    await conn.publish("", "jobs", b"first", headers={"tenant": "acme"})
    await conn.publish("", "jobs", b"second")
    got = await conn.get("jobs")
    assert got is not None and (got.body, got.headers) == (b"first", {"tenant": "acme"})
    got.ack()
    received: defer.Deferred[Message] = defer.Deferred()
    await conn.consume("jobs", received.callback, prefetch=5)
    message = await received
    assert (message.body, message.redelivered) == (b"second", False)
    message.ack()
    assert await conn.get("jobs") is None


@pytest_twisted.ensureDeferred
async def test_refused_and_returned_publishes_fail_their_deferreds(conn: TwistedConnection) -> None:
    await conn.declare_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    await conn.publish("", "full", b"fits")
    with pytest.raises(PublishNacked):
        await conn.publish("", "full", b"does not")
    with pytest.raises(PublishReturned) as returned:
        await conn.publish("", "nowhere", b"lost", mandatory=True)
    assert returned.value.reply_code == 312


@pytest_twisted.ensureDeferred
async def test_batch_publish_confirms_every_message_within_the_window(conn: TwistedConnection) -> None:
    await conn.declare_queue("bulk")
    in_flight: list[int] = []

    def messages() -> Iterator[tuple[str, str, bytes]]:
        for i in range(2500):
            in_flight.append(conn.unconfirmed)  # read as the batch asks for the next one
            yield "", "bulk", b"%d" % i

    assert await conn.publish_batch(messages(), window=200) == 2500
    assert conn.unconfirmed == 0
    assert max(in_flight) == 199  # it waited for confirms, and never held more than the window
    assert in_flight[200] <= 100  # and went on once half the window was confirmed, as the blocking client does
    bodies = []
    while (message := await conn.get("bulk")) is not None:
        bodies.append(message.body)
        message.ack()
    assert bodies == [b"%d" % i for i in range(2500)]


@pytest_twisted.ensureDeferred
async def test_a_batch_fails_with_the_first_refusal_and_sends_no_more(conn: TwistedConnection) -> None:
    await conn.declare_queue("small", arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    pulled = []

    def messages() -> Iterator[tuple[str, str, bytes]]:
        for i in range(1000):
            pulled.append(i)
            yield "", "small", b"%d" % i

    with pytest.raises(PublishNacked):
        await conn.publish_batch(messages(), window=4)
    assert len(pulled) < 20  # the rest of the generator was never read
    with pytest.raises(PublishReturned) as returned:
        await conn.publish_batch([("", "nowhere", b"lost")], mandatory=True)
    assert returned.value.reply_code == 312


@pytest_twisted.ensureDeferred
async def test_consuming_survives_a_broker_restart_with_nothing_lost(broker: LoopbackBroker) -> None:
    from twisted.internet import reactor

    conn = await connect_twisted(reactor, broker.url)
    await conn.declare_queue("jobs", durable=False)
    await conn.publish_batch((("", "jobs", b"%02d" % i) for i in range(20)), window=5)
    seen: dict[bytes, list[bool]] = {}
    held: list[Message] = []
    all_seen: defer.Deferred[None] = defer.Deferred()

    async def restart() -> None:
        await broker.stop()  # the held delivery goes back to the queue
        await deferLater(reactor, 0.25)  # down long enough for an attempt or two to be refused
        broker.start()

    def on_message(message: Message) -> None:
        seen.setdefault(message.body, []).append(message.redelivered)
        if len(seen) == 5 and not held:
            held.append(message)  # delivered, unacked when the broker goes away
            reactor.callLater(0, lambda: defer.Deferred.fromCoroutine(restart()))
            return
        if held and message.body == held[0].body:
            held[0].ack()  # the stale delivery: a no-op, not an ack of some other message
        message.ack()
        if len(seen) == 20 and not all_seen.called:
            all_seen.callback(None)

    tag = await conn.consume("jobs", on_message, prefetch=5)
    await all_seen
    assert sorted(seen) == [b"%02d" % i for i in range(20)]
    assert conn.reconnections == 1
    assert seen[held[0].body] == [False, True]
    again = [flags for flags in seen.values() if len(flags) > 1]
    assert all(flags[1:] == [True] * (len(flags) - 1) for flags in again)
    await conn.cancel(tag)
    assert await conn.get("jobs") is None  # everything acked, nothing acked twice or lost
    queue = broker.node.vhosts["/"].queues["jobs"]
    assert (queue.message_count, queue.unacked_count) == (0, 0)
    await conn.close()


@pytest_twisted.ensureDeferred
async def test_declarations_and_waiting_publishes_survive_a_restart_onto_an_empty_broker(
    broker: LoopbackBroker,
) -> None:
    from twisted.internet import reactor

    conn = await connect_twisted(reactor, broker.url)
    await conn.declare_exchange("orders", "topic")
    await conn.declare_queue("created")
    await conn.bind("created", "orders", "order.*.created")
    await broker.stop()
    broker.start(Node())  # a broker that knows nothing of them
    # Published while the connection is down: it waits, and goes out after the declarations.
    await conn.publish("orders", "order.eu.created", b"after", mandatory=True)
    assert conn.reconnections == 1
    got = await conn.get("created")
    assert got is not None and got.body == b"after"
    got.ack()
    await conn.close()


@pytest_twisted.ensureDeferred
async def test_an_unconfirmed_publish_is_sent_again_after_a_drop(conn: TwistedConnection) -> None:
    await conn.declare_queue("jobs")
    confirmed = conn.publish("", "jobs", b"once")
    conn.transport.abortConnection()  # the publish's frames are dropped unsent: no confirm can come
    await confirmed
    assert conn.reconnections == 1
    got = await conn.get("jobs")
    assert got is not None and got.body == b"once"
    got.ack()
    assert await conn.get("jobs") is None


@pytest_twisted.ensureDeferred
async def test_without_reconnection_a_drop_fails_unconfirmed_publishes(broker: LoopbackBroker) -> None:
    from twisted.internet import reactor

    conn = await connect_twisted(reactor, broker.url, reconnect=False)
    await conn.declare_queue("jobs")
    confirmed = conn.publish("", "jobs", b"lost")
    conn.transport.abortConnection()
    with pytest.raises(ConnectionClosed) as excinfo:
        await confirmed
    assert excinfo.value.reply_code == 320
    with pytest.raises(ConnectionClosed):
        await conn.get("jobs")


# -- reconnection timing, on a MemoryReactorClock with the broker's protocol in memory ----------


def listen(reactor: MemoryReactorClock) -> AMQPServerFactory:
    # FakeTransport peers are not loopback addresses, so not guest (loopback only) but a user of its own.
    factory = AMQPServerFactory(Node(users=[User("app", password="secret")]), reactor)
    reactor.tcpServers.clear()
    reactor.listenTCP(5672, factory, interface="127.0.0.1")
    return factory


def memory_broker() -> tuple[MemoryReactorClock, AMQPServerFactory, ConnectionCompleter]:
    reactor = MemoryReactorClock()
    return reactor, listen(reactor), ConnectionCompleter(reactor)


def opened(reactor: MemoryReactorClock, completer: ConnectionCompleter) -> tuple[TwistedConnection, IOPump]:
    connecting = connect_twisted(reactor, "amqp://app:secret@127.0.0.1:5672/", retries=4)
    pump = completer.succeedOnce()
    assert pump is not None
    pump.flush()
    assert connecting.called  # the handshake ran during the flush
    return connecting.result, pump


def refuse_attempts(reactor: MemoryReactorClock, completer: ConnectionCompleter, pauses: list[float]) -> None:
    """Refuse the attempt made at once, then one after each pause, checking that none comes early."""
    reactor.advance(0)
    assert len(reactor.tcpClients) == 1
    completer.failOnce()
    for pause in pauses:
        reactor.advance(pause - 0.001)
        assert reactor.tcpClients == [], f"an attempt came before the {pause} s pause was over"
        reactor.advance(0.001)
        assert len(reactor.tcpClients) == 1
        completer.failOnce()


def test_reconnection_backs_off_and_gives_up_failing_what_waited() -> None:
    reactor, factory, completer = memory_broker()
    conn, pump = opened(reactor, completer)
    factory.close_all()
    pump.flush()  # the client answers the 320 and the connection ends
    waiting = conn.publish("", "jobs", b"never")
    declared = conn.declare_queue("jobs")
    assert backoff(4) == [0.1, 0.2, 0.4]
    refuse_attempts(reactor, completer, [0.1, 0.2, 0.4])
    for deferred in (waiting, declared):
        failure = deferred.result
        deferred.addErrback(lambda _: None)
        assert isinstance(failure.value, ConnectionClosed)
        assert str(failure.value) == "320 could not reconnect to 127.0.0.1:5672"
    reactor.advance(60)
    assert reactor.tcpClients == []  # it gave up: no more attempts


def test_reconnection_after_refused_attempts_declares_again_and_sends_what_waited() -> None:
    reactor, factory, completer = memory_broker()
    conn, pump = opened(reactor, completer)
    conn.declare_queue("jobs")
    pump.flush()
    factory.close_all()
    pump.flush()
    waiting = conn.publish("", "jobs", b"later")
    refuse_attempts(reactor, completer, [0.1])
    restarted = listen(reactor)  # a broker that knows nothing of the queue
    reactor.advance(0.2)
    pump = completer.succeedOnce()
    assert pump is not None
    pump.flush()
    assert waiting.called and waiting.result is None  # confirmed on the new connection
    assert conn.reconnections == 1
    assert restarted.node.vhosts["/"].queues["jobs"].message_count == 1


def test_an_idle_client_sends_heartbeats_and_leaves_a_silent_broker() -> None:
    reactor, factory, completer = memory_broker()
    conn, pump = opened(reactor, completer)
    assert conn.heartbeat == 60  # the broker's proposal and ours
    pump.clientIO.getOutBuffer()
    reactor.advance(30)  # idle for half an interval
    assert pump.clientIO.getOutBuffer() == HEARTBEAT_FRAME
    pump.flush()  # the broker hears it, and its own heartbeat arrives: both sides stay
    reactor.advance(60)
    pump.flush()
    assert not pump.clientIO.disconnecting
    for _ in range(3):  # then the broker goes silent (nothing is pumped) ...
        reactor.advance(30)  # (in steps: a Clock runs a timer once per advance)
    reactor.advance(29.9)
    assert not pump.clientIO.disconnecting
    reactor.advance(0.2)  # ... for two intervals: the client drops the connection itself
    assert pump.clientIO.disconnecting
    pump.flush()
    reactor.advance(0)
    assert len(reactor.tcpClients) == 1  # and tries to reconnect

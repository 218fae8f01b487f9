"""The client for Twisted code: the same shape as ``broker.clients.client``, returning Deferreds.

::

    conn = await connect_twisted(reactor, "amqp://guest:guest@127.0.0.1:5672/")
    await conn.declare_queue("jobs")
    await conn.publish("", "jobs", b"work")             # fires once confirmed
    await conn.publish_batch(triples, window=1000)      # fires with the count once all are confirmed
    await conn.consume("jobs", on_message, prefetch=20)  # on_message(msg) for each delivery; msg.ack()

Frames are split here and decoded with the server's codec (``broker.wire.codec``); messages
are ``broker.clients.client.Message`` objects, so ``ack``/``nack``/``reject``/``extend`` work the same.

Reconnection follows the blocking client: when an open connection drops, the client connects
again at once, then after 0.1 s, 0.2 s, 0.4 s ... (``broker.clients.client.backoff``, timed by the
reactor it was given), declares again what it declared, resumes its consumers under their
consumer tags, and publishes again whatever was not confirmed (at least once). Deliveries made
before the drop come again flagged redelivered; acking one of the old ones is a no-op. Calls
made meanwhile wait for the new connection. When every attempt fails, everything waiting fails
with ``ConnectionClosed``. A channel error from the broker (404, 406 ...) ends the connection
for good, as with the blocking client. Heartbeats run on the reactor's clock: a broker silent
for two intervals counts as a drop, so a dead peer is noticed without waiting for TCP.
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pamqp import commands
from pamqp.base import Frame
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IDelayedCall, IStreamClientEndpoint
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from postroom.broker.clients.client import (
    ChannelClosed,
    ClientError,
    ConnectionClosed,
    Message,
    PublishNacked,
    PublishReturned,
    backoff,
    exchange_bind,
    exchange_declare,
    parse_deliver,
    parse_url,
    publish_frames,
    queue_bind,
    queue_declare,
    start_ok,
)
from postroom.broker.wire.codec import (
    BASIC_DELIVER,
    FRAME_END,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    content_body_size,
    decode_method,
    decode_properties,
    encode_method,
)

_frame_head = struct.Struct(">BHI")
_method_index = struct.Struct(">I")


class _State(Enum):
    """Where a :class:`TwistedConnection` is in its life."""

    CONNECTING = "connecting"  # the first connection, not open yet: failures are final
    OPEN = "open"
    RECOVERING = "recovering"  # dropped: connecting again, declaring again, resubscribing
    CLOSED = "closed"  # for good: closed by the client, refused, or out of attempts


@dataclass(slots=True)
class _Publish:
    """A publish until the broker confirms it; kept to be sent again after a reconnection."""

    exchange: str
    routing_key: str
    body: bytes
    options: dict[str, Any]
    deferred: defer.Deferred[None] = field(default_factory=defer.Deferred)


@dataclass(frozen=True, slots=True)
class _Subscription:
    """A consumer to start again after a reconnection."""

    queue: str
    callback: Callable[[Message], Any]
    prefetch: int


class TwistedConnection(Protocol):
    """One connection with one channel in confirm mode, driven by the reactor.

    The same instance serves every TCP connection made for it, so what the application holds
    stays valid across reconnections.

    :param user: login
    :param password: password
    :param vhost: virtual host to open
    :param clock: times the pauses between reconnection attempts (the reactor)
    :param endpoint: where to connect again after a drop (``None``: no reconnection)
    :param reconnect: reconnect after an open connection drops (see the module's docstring)
    :param retries: connection attempts after a drop before giving up
    :param address: ``host:port``, for error messages
    :param heartbeat: seconds proposed to the broker (0: none; heartbeats need a ``clock``).
        Every half interval the client sends one if it sent nothing else, and a broker silent
        for two intervals is taken as gone: the connection is dropped (and reconnected).
    """

    _log = Logger()

    def __init__(
        self,
        user: str,
        password: str,
        vhost: str,
        clock: Any = None,
        endpoint: IStreamClientEndpoint | None = None,
        reconnect: bool = False,
        retries: int = 10,
        address: str = "the broker",
        heartbeat: int = 60,
    ) -> None:
        self.user = user
        self.password = password
        self.vhost = vhost
        #: Fires with the connection once it is open the first time, or fails why not.
        self.ready: defer.Deferred[TwistedConnection] = defer.Deferred()
        self.frame_max = 131072
        #: The heartbeat interval agreed with the broker (0: none).
        self.heartbeat = 0
        self._heartbeat = heartbeat if clock is not None else 0
        self._heartbeat_call: IDelayedCall | None = None
        self._last_sent = 0.0
        self._last_received = 0.0
        self.reconnect = reconnect and endpoint is not None and clock is not None
        self.retries = retries
        #: Successful reconnections so far.
        self.reconnections = 0
        self.address = address
        self._clock = clock
        self._connected = False
        self._endpoint = endpoint
        self._pauses = backoff(retries)
        self._attempts = 0
        self._retry_call: IDelayedCall | None = None
        self._state = _State.CONNECTING
        self._closing = False
        #: Bumped when a connection drops; deliveries from an older one are not acked (see Message).
        self._generation = 0
        self._buffer = b""
        self._calls: deque[tuple[type, defer.Deferred[Any]]] = deque()
        self._confirms: dict[int, _Publish] = {}
        self._outbox: list[_Publish] = []
        self._publish_seq = 0
        self._returned: PublishReturned | None = None
        self._subscriptions: dict[str, _Subscription] = {}
        self._tags = itertools.count(1)
        self._declared: list[tuple[Frame, type]] = []
        self._waiting: list[tuple[Callable[[], Any], defer.Deferred[Any]]] = []
        self._content: tuple[Frame, bytes | None, list[bytes], int] | None = None
        self._header: bytes | None = None
        self._close_reason: ClientError | None = None
        self._closed: ClientError | None = None

    @property
    def unconfirmed(self) -> int:
        """Publishes sent or waiting to be sent that the broker has not confirmed yet."""
        return len(self._confirms) + len(self._outbox)

    # -- I/O ------------------------------------------------------------------------------------

    def connectionMade(self) -> None:
        if self._state is _State.CLOSED:
            self.transport.loseConnection()  # an attempt that completed after close()
            return
        self._connected = True
        self._buffer = b""
        self._content = None
        self._header = None
        self._publish_seq = 0
        self._returned = None
        self._close_reason = None
        self._write(PROTOCOL_HEADER)

    def _send(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._heartbeat:
            self._last_sent = self._clock.seconds()
        self.transport.write(data)

    def _beat(self) -> None:
        """Every half heartbeat interval: send one when idle, give up on a silent broker."""
        now = self._clock.seconds()
        if now - self._last_received >= 2 * self.heartbeat:
            self._heartbeat_call = None
            self._close_reason = ConnectionClosed(320, f"no heartbeat from the broker in {2 * self.heartbeat} s")
            self.transport.abortConnection()  # a dead peer never completes a polite close
            return
        if now - self._last_sent >= self.heartbeat / 2:
            self._write(HEARTBEAT_FRAME)
        self._heartbeat_call = self._clock.callLater(self.heartbeat / 2, self._beat)

    def dataReceived(self, data: bytes) -> None:
        if self.heartbeat:
            self._last_received = self._clock.seconds()
        self._buffer += data
        buffer = self._buffer
        position = 0
        while len(buffer) - position >= FRAME_OVERHEAD:
            frame_type, channel, size = _frame_head.unpack_from(buffer, position)
            end = position + 7 + size
            if len(buffer) <= end:
                break
            if buffer[end] != FRAME_END:
                self._close_reason = ConnectionClosed(501, "bad frame end from the broker")
                self._buffer = b""
                self.transport.loseConnection()
                return
            payload = buffer[position + 7 : end]
            position = end + 1
            self._frame(frame_type, payload)
        self._buffer = buffer[position:]

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._closing:
            error: ClientError = ConnectionClosed(320, "closed by the client")
        else:
            error = self._close_reason or ConnectionClosed(320, "the connection was lost")
        # What was sent and not confirmed goes out again first, in order, on the next connection.
        self._outbox[:0] = self._confirms.values()
        self._confirms = {}
        calls, self._calls = list(self._calls), deque()
        self._connected = False
        if self._heartbeat_call is not None and self._heartbeat_call.active():
            self._heartbeat_call.cancel()
        self._heartbeat_call = None
        self.heartbeat = 0
        if self._state in (_State.OPEN, _State.RECOVERING) and self.reconnect and not self._closing:
            # The broker puts this connection's unacked deliveries back: acks of them are no-ops now.
            self._generation += 1
            self._state = _State.RECOVERING
            for _reply, deferred in calls:
                deferred.errback(error)
            self._retry()
        else:
            self._terminate(error)
            for _reply, deferred in calls:
                deferred.errback(self._closed)

    def _terminate(self, error: ClientError) -> None:
        """End for good: everything waiting fails with ``error`` (or the first such error)."""
        self._state = _State.CLOSED
        if self._closed is None:
            self._closed = error
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None
        waiting = [publish.deferred for publish in [*self._confirms.values(), *self._outbox]]
        waiting += [deferred for _action, deferred in self._waiting]
        self._confirms, self._outbox, self._waiting = {}, [], []
        if not self.ready.called:
            waiting.append(self.ready)
        for deferred in waiting:
            deferred.errback(self._closed)

    # -- reconnection ---------------------------------------------------------------------------

    def _retry(self) -> None:
        """Schedule the next connection attempt, or give up after :attr:`retries` of them."""
        if self._attempts >= self.retries:
            self._terminate(ConnectionClosed(320, f"could not reconnect to {self.address}"))
            return
        pause = self._pauses[self._attempts - 1] if self._attempts else 0.0
        self._retry_call = self._clock.callLater(pause, self._attempt)

    def _attempt(self) -> None:
        self._retry_call = None
        self._attempts += 1
        assert self._endpoint is not None
        # Refused or unreachable: try again after the next pause. Once connected, a failure
        # (a drop during the handshake or the declarations) goes through connectionLost instead.
        connectProtocol(self._endpoint, self).addErrback(lambda _failure: self._retry())

    def _opened(self) -> None:
        """The channel is open and in confirm mode."""
        if self._state is _State.CLOSED:
            return
        if self._state is _State.CONNECTING:
            self._state = _State.OPEN
            self.ready.callback(self)
            self._release()
        else:
            defer.Deferred.fromCoroutine(self._recover())

    async def _recover(self) -> None:
        """Declare again, resubscribe, then send what waited, in that order: a publish must not
        reach a broker that lost its queues before they are declared again."""
        try:
            for method, reply in self._declared:
                await self._call(method, reply)
            for tag, subscription in list(self._subscriptions.items()):
                await self._subscribe(tag, subscription)
        except ClientError:
            return  # dropped again (the next attempt is scheduled) or refused (closed for good)
        self._state = _State.OPEN
        self._attempts = 0
        self.reconnections += 1
        self._log.info("reconnected to the broker ({count} reconnection(s))", count=self.reconnections)
        self._release()

    def _release(self) -> None:
        """Send the publishes and run the calls that waited for an open connection."""
        outbox, self._outbox = self._outbox, []
        for publish in outbox:
            self._send_publish(publish)
        waiting, self._waiting = self._waiting, []
        for action, deferred in waiting:
            defer.maybeDeferred(action).chainDeferred(deferred)

    def _when_open(self, action: Callable[[], Any]) -> defer.Deferred[Any]:
        """Run ``action`` now if the connection is open, or once it is open again."""
        if self._closed is not None:
            return defer.fail(self._closed)
        if self._state is _State.OPEN:
            return defer.maybeDeferred(action)
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._waiting.append((action, deferred))
        return deferred

    # -- frames ---------------------------------------------------------------------------------

    def _frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == FRAME_HEARTBEAT:
            return  # it counted as data received; our own heartbeats go out on their own timer
        if self._content is not None and frame_type != FRAME_METHOD:
            self._content_frame(payload)
            return
        if _method_index.unpack_from(payload)[0] == BASIC_DELIVER:
            self._content = (commands.Basic.Deliver(), payload, [], 0)
            return
        method = decode_method(payload)
        if isinstance(method, (commands.Basic.GetOk, commands.Basic.Return)):
            self._content = (method, None, [], 0)
        elif isinstance(method, commands.Basic.Ack):
            self._confirm(method.delivery_tag, method.multiple, None)
        elif isinstance(method, commands.Basic.Nack):
            self._confirm(method.delivery_tag, method.multiple, PublishNacked(0, "the broker refused the publish"))
        elif isinstance(method, commands.Basic.Cancel):
            self._subscriptions.pop(method.consumer_tag, None)  # the queue was deleted
        elif isinstance(method, commands.Connection.Start):
            self._send(encode_method(0, start_ok(self.user, self.password, "Postroom Twisted client")))
        elif isinstance(method, commands.Connection.Tune):
            self.frame_max = method.frame_max or self.frame_max
            # As RabbitMQ clients do: the smaller of the two proposals, 0 only if both want none.
            offered, wanted = method.heartbeat, self._heartbeat
            self.heartbeat = min(offered, wanted) if offered and wanted else 0
            self._send(
                encode_method(
                    0, commands.Connection.TuneOk(channel_max=1, frame_max=self.frame_max, heartbeat=self.heartbeat)
                )
                + encode_method(0, commands.Connection.Open(virtual_host=self.vhost))
            )
            if self.heartbeat:
                self._last_received = self._clock.seconds()
                self._heartbeat_call = self._clock.callLater(self.heartbeat / 2, self._beat)
        elif isinstance(method, commands.Connection.OpenOk):
            self._handshake_channel()
        elif isinstance(method, commands.Channel.Close):
            self._send(encode_method(1, commands.Channel.CloseOk()))
            error = ChannelClosed(method.reply_code, method.reply_text)
            calls, self._calls = list(self._calls), deque()
            self._terminate(error)
            for _reply, deferred in calls:
                deferred.errback(error)
            self.transport.loseConnection()
        elif isinstance(method, commands.Connection.Close):
            self._send(encode_method(0, commands.Connection.CloseOk()))
            self._close_reason = ConnectionClosed(method.reply_code, method.reply_text)
            self.transport.loseConnection()
        elif self._calls and isinstance(method, self._calls[0][0]):
            _reply, deferred = self._calls.popleft()
            deferred.callback(method)

    def _content_frame(self, payload: bytes) -> None:
        assert self._content is not None
        method, raw, parts, expected = self._content
        if self._header is None:
            self._header = payload
            _class, _weight, size = content_body_size(payload)
            self._content = (method, raw, parts, size)
            if size == 0:
                self._complete()
            return
        parts.append(payload)
        if sum(len(part) for part in parts) >= expected:
            self._complete()

    def _complete(self) -> None:
        assert self._content is not None and self._header is not None
        method, raw, parts, _expected = self._content
        properties = decode_properties(self._header)
        body = b"".join(parts)
        self._content = None
        self._header = None
        if raw is not None:
            consumer_tag, delivery_tag, redelivered, exchange, routing_key = parse_deliver(raw)
            subscription = self._subscriptions.get(consumer_tag)
            if subscription is not None:
                message = Message(self, delivery_tag, redelivered, exchange, routing_key, properties, body)
                try:
                    subscription.callback(message)
                except Exception:
                    # The application's bug must not stop the frames after this one being read.
                    self._log.failure("consumer callback failed for {message!r}", message=message)
        elif isinstance(method, commands.Basic.GetOk):
            _reply, deferred = self._calls.popleft()
            deferred.callback(
                Message(
                    self, method.delivery_tag, method.redelivered, method.exchange, method.routing_key, properties, body
                )
            )
        else:
            self._returned = PublishReturned(method.reply_code, f"{method.reply_text}: {method.routing_key}")

    def _confirm(self, tag: int, multiple: bool, error: Exception | None) -> None:
        tags = sorted(t for t in self._confirms if t <= tag) if multiple else [tag]
        for each in tags:
            publish = self._confirms.pop(each, None)
            if publish is None:
                continue
            # A basic.return comes just before the confirm of the publish it returns.
            failure = error or self._returned
            self._returned = None
            if failure is not None:
                publish.deferred.errback(failure)
            else:
                publish.deferred.callback(None)

    def _handshake_channel(self) -> None:
        opened = self._call(commands.Channel.Open(), commands.Channel.OpenOk)
        opened.addCallback(lambda _: self._call(commands.Confirm.Select(), commands.Confirm.SelectOk))
        # A failure here is a drop or a refusal: connectionLost or _terminate deals with it.
        opened.addCallbacks(lambda _: self._opened(), lambda _failure: None)

    def _call(self, method: Frame, reply: type, remember: bool = False) -> defer.Deferred[Any]:
        """Send a synchronous method on channel 1; fires with its reply.

        :param remember: declare it again after a reconnection
        """
        if remember:
            self._declared.append((method, reply))
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._calls.append((reply, deferred))
        self._send(encode_method(1, method))
        return deferred

    def _settle(self, generation: int, method: Frame | bytes) -> None:
        """Send an ack, nack or reject (or its frame) of a delivery made in connection
        ``generation`` (called by :class:`broker.clients.client.Message`)."""
        if generation != self._generation:
            return  # delivered before a drop: the broker put it back, it comes again
        self._send(method if isinstance(method, bytes) else encode_method(1, method))

    def _send_publish(self, publish: _Publish) -> None:
        self._publish_seq += 1
        self._confirms[self._publish_seq] = publish
        self._write(
            publish_frames(publish.exchange, publish.routing_key, publish.body, self.frame_max, **publish.options)
        )

    def _subscribe(self, tag: str, subscription: _Subscription) -> defer.Deferred[str]:
        qos = self._call(commands.Basic.Qos(prefetch_count=subscription.prefetch), commands.Basic.QosOk)
        qos.addCallback(
            lambda _: self._call(
                commands.Basic.Consume(queue=subscription.queue, consumer_tag=tag), commands.Basic.ConsumeOk
            )
        )

        def subscribed(_ok: Any) -> str:
            self._subscriptions[tag] = subscription
            return tag

        return qos.addCallback(subscribed)

    # -- the API --------------------------------------------------------------------------------

    def declare_queue(
        self, name: str, durable: bool = True, arguments: Mapping[str, Any] | None = None, auto_delete: bool = False
    ) -> defer.Deferred[str]:
        """Declare a queue (declared again after a reconnection); fires with its name."""
        method = queue_declare(name, durable, arguments, auto_delete)
        declared = self._when_open(lambda: self._call(method, commands.Queue.DeclareOk, remember=True))
        return declared.addCallback(lambda ok: str(ok.queue))

    def declare_exchange(
        self,
        name: str,
        exchange_type: str = "direct",
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> defer.Deferred[Any]:
        """Declare an exchange (declared again after a reconnection)."""
        method = exchange_declare(name, exchange_type, durable, auto_delete, internal, arguments)
        return self._when_open(lambda: self._call(method, commands.Exchange.DeclareOk, remember=True))

    def bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: Mapping[str, Any] | None = None
    ) -> defer.Deferred[Any]:
        """Bind ``queue`` to ``exchange`` (bound again after a reconnection)."""
        method = queue_bind(queue, exchange, routing_key, arguments)
        return self._when_open(lambda: self._call(method, commands.Queue.BindOk, remember=True))

    def bind_exchange(
        self, destination: str, source: str, routing_key: str = "", arguments: Mapping[str, Any] | None = None
    ) -> defer.Deferred[Any]:
        """Bind exchange ``destination`` to exchange ``source`` (bound again after a reconnection)."""
        method = exchange_bind(destination, source, routing_key, arguments)
        return self._when_open(lambda: self._call(method, commands.Exchange.BindOk, remember=True))

    def publish(self, exchange: str, routing_key: str, body: bytes, **options: Any) -> defer.Deferred[None]:
        """Publish (persistent by default); fires once the broker confirms.

        Options are those of :func:`broker.clients.client.publish_frames`. A publish not yet confirmed
        when the connection drops is sent again on the next one (at least once).

        :returns: a Deferred that fails with :class:`PublishNacked` (refused),
            :class:`PublishReturned` (``mandatory`` and unroutable) or :class:`ConnectionClosed`
            (the connection is gone for good)
        """
        if self._closed is not None:
            return defer.fail(self._closed)
        publish = _Publish(exchange, routing_key, body, options)
        if self._state is _State.OPEN:
            self._send_publish(publish)
        else:
            self._outbox.append(publish)
        return publish.deferred

    def publish_batch(
        self, messages: Iterable[tuple[str, str, bytes]], window: int = 1000, **options: Any
    ) -> defer.Deferred[int]:
        """Publish ``(exchange, routing_key, body)`` triples with at most ``window`` unconfirmed.

        As with the blocking client, sending pauses when ``window`` publishes are unconfirmed and
        goes on once half of them are confirmed; ``messages`` is read only as fast as that.

        :returns: a Deferred that fires with the count once every publish is confirmed, or fails
            with the first :class:`PublishNacked` or :class:`PublishReturned` (no more are sent
            then; those before it may be confirmed)
        """
        return _Batch(self, messages, window, options).start()

    def get(self, queue: str) -> defer.Deferred[Message | None]:
        """Fires with one message of ``queue`` (to be acked) or ``None`` when it is empty."""

        def get() -> defer.Deferred[Any]:
            deferred: defer.Deferred[Any] = defer.Deferred()
            self._calls.append((commands.Basic.GetEmpty, deferred))
            self._send(encode_method(1, commands.Basic.Get(queue=queue)))
            return deferred

        return self._when_open(get).addCallback(lambda answer: answer if isinstance(answer, Message) else None)

    def consume(self, queue: str, callback: Callable[[Message], Any], prefetch: int = 100) -> defer.Deferred[str]:
        """Call ``callback`` with each delivery from ``queue``; fires with the consumer tag.

        The consumer is started again under the same tag after a reconnection. An exception
        from ``callback`` is logged; the delivery stays unacked.
        """
        tag = f"postroom.ctag-{next(self._tags)}"
        subscription = _Subscription(queue, callback, prefetch)
        return self._when_open(lambda: self._subscribe(tag, subscription))

    def cancel(self, consumer_tag: str) -> defer.Deferred[None]:
        """Stop the consumer ``consumer_tag`` (its unacked deliveries stay to be settled)."""
        self._subscriptions.pop(consumer_tag, None)
        cancelled = self._when_open(
            lambda: self._call(commands.Basic.Cancel(consumer_tag=consumer_tag), commands.Basic.CancelOk)
        )
        return cancelled.addCallback(lambda _ok: None)

    def close(self) -> defer.Deferred[None]:
        """Close the connection politely; nothing reconnects afterwards."""
        self._closing = True
        if self._state is _State.CLOSED:
            return defer.succeed(None)
        if self._state is not _State.OPEN:
            self._terminate(ConnectionClosed(320, "closed by the client"))
            if self._connected:
                self.transport.loseConnection()
            return defer.succeed(None)
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._calls.append((commands.Connection.CloseOk, deferred))
        self._send(
            encode_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        )
        deferred.addBoth(lambda _result: self.transport.loseConnection())
        return deferred


class _Batch:
    """One :meth:`TwistedConnection.publish_batch`: keeps at most ``window`` publishes unconfirmed."""

    def __init__(
        self, connection: TwistedConnection, messages: Iterable[tuple[str, str, bytes]], window: int, options: Any
    ) -> None:
        self._connection = connection
        self._messages = iter(messages)
        self._window = max(window, 1)
        self._options = options
        self._count = 0
        self._unconfirmed = 0
        self._exhausted = False
        self._done: defer.Deferred[int] = defer.Deferred()

    def start(self) -> defer.Deferred[int]:
        self._fill()
        return self._done

    def _fill(self) -> None:
        while not self._done.called and not self._exhausted and self._unconfirmed < self._window:
            try:
                exchange, routing_key, body = next(self._messages)
            except StopIteration:
                self._exhausted = True
                break
            except Exception:
                self._done.errback(Failure())
                return
            self._count += 1
            self._unconfirmed += 1
            publish = self._connection.publish(exchange, routing_key, body, **self._options)
            publish.addCallbacks(self._confirmed, self._refused)
        if self._exhausted and self._unconfirmed == 0 and not self._done.called:
            self._done.callback(self._count)

    def _confirmed(self, _result: None) -> None:
        self._unconfirmed -= 1
        # Refill at half the window, as the blocking client does: fewer, larger writes.
        if self._unconfirmed <= self._window // 2 or self._exhausted:
            self._fill()

    def _refused(self, failure: Failure) -> None:
        self._unconfirmed -= 1
        if not self._done.called:
            self._done.errback(failure)
        # Later refusals in the same batch are consumed here: the first one is what is reported.


def connect_twisted(
    reactor: Any,
    url: str = "amqp://guest:guest@127.0.0.1:5672/",
    reconnect: bool = True,
    retries: int = 10,
    heartbeat: int = 60,
) -> defer.Deferred[TwistedConnection]:
    """Connect and open a confirming channel; fires with the :class:`TwistedConnection`.

    :param reactor: connects, and times the pauses between reconnection attempts
    :param reconnect: when the connection drops later, reconnect with backoff, declare again,
        resume consuming and publish again what was unconfirmed (see the module's docstring)
    :param retries: connection attempts after a drop before giving up
    :param heartbeat: seconds proposed to the broker (0: none)
    :raises ConnectionClosed: (through the Deferred) the broker refused the login or the vhost
    """
    host, port, user, password, vhost = parse_url(url)
    endpoint = TCP4ClientEndpoint(reactor, host, port)
    protocol = TwistedConnection(
        user,
        password,
        vhost,
        clock=reactor,
        endpoint=endpoint,
        reconnect=reconnect,
        retries=retries,
        address=f"{host}:{port}",
        heartbeat=heartbeat,
    )
    return connectProtocol(endpoint, protocol).addCallback(lambda _: protocol.ready)

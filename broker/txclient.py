"""The client for Twisted code: the same shape as ``broker.client``, returning Deferreds.

::

    conn = await connect_twisted(reactor, "amqp://guest:guest@127.0.0.1:5672/")
    await conn.declare_queue("jobs")
    await conn.publish("", "jobs", b"work")             # fires once confirmed
    await conn.consume("jobs", on_message, prefetch=20)  # on_message(msg) for each delivery; msg.ack()

Frames are split here and decoded with the server's codec (``broker.amqp.codec``); messages
are ``broker.client.Message`` objects, so ``ack``/``nack``/``reject``/``extend`` work the same.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlparse

from pamqp import commands
from pamqp.base import Frame
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from broker.amqp.codec import (
    BASIC_DELIVER,
    FRAME_END,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    PROTOCOL_HEADER,
    content_body_size,
    decode_method,
    decode_properties,
    encode_method,
)
from broker.client import (
    ChannelClosed,
    ConnectionClosed,
    Message,
    PublishNacked,
    PublishReturned,
    parse_deliver,
    publish_frames,
)

_frame_head = struct.Struct(">BHI")
_method_index = struct.Struct(">I")


class TwistedConnection(Protocol):
    """One connection with one channel in confirm mode, driven by the reactor.

    :param user: login
    :param password: password
    :param vhost: virtual host to open
    """

    def __init__(self, user: str, password: str, vhost: str) -> None:
        self.user = user
        self.password = password
        self.vhost = vhost
        self.ready: defer.Deferred[TwistedConnection] = defer.Deferred()
        self.frame_max = 131072
        self.reconnect = False
        self._generation = 0
        self._buffer = b""
        self._calls: deque[tuple[type, defer.Deferred[Any]]] = deque()
        self._confirms: dict[int, defer.Deferred[None]] = {}
        self._publish_seq = 0
        self._returned: PublishReturned | None = None
        self._consumers: dict[str, Callable[[Message], Any]] = {}
        self._content: tuple[Frame, bytes | None, list[bytes], int] | None = None
        self._closed: Exception | None = None

    # -- I/O ------------------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.transport.write(PROTOCOL_HEADER)

    def _send(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        self.transport.write(data)

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        buffer = self._buffer
        position = 0
        while len(buffer) - position >= FRAME_OVERHEAD:
            frame_type, channel, size = _frame_head.unpack_from(buffer, position)
            end = position + 7 + size
            if len(buffer) <= end:
                break
            if buffer[end] != FRAME_END:
                self._fail(ConnectionClosed(501, "bad frame end from the broker"))
                self.transport.loseConnection()
                return
            payload = buffer[position + 7 : end]
            position = end + 1
            self._frame(frame_type, payload)
        self._buffer = buffer[position:]

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._fail(self._closed or ConnectionClosed(320, "the connection was lost"))

    def _fail(self, error: Exception) -> None:
        self._closed = error
        waiting = [d for _t, d in self._calls] + list(self._confirms.values())
        self._calls.clear()
        self._confirms.clear()
        if not self.ready.called:
            waiting.append(self.ready)
        for deferred in waiting:
            deferred.errback(error)

    # -- frames ---------------------------------------------------------------------------------

    def _frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == FRAME_HEARTBEAT:
            self.transport.write(b"\x08\x00\x00\x00\x00\x00\x00\xce")
            return
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
        elif isinstance(method, commands.Connection.Start):
            self._send(
                encode_method(
                    0,
                    commands.Connection.StartOk(
                        client_properties={
                            "product": "Postroom Twisted client",
                            "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True},
                        },
                        mechanism="PLAIN",
                        response=f"\0{self.user}\0{self.password}",
                    ),
                )
            )
        elif isinstance(method, commands.Connection.Tune):
            self.frame_max = method.frame_max or self.frame_max
            self._send(
                encode_method(0, commands.Connection.TuneOk(channel_max=1, frame_max=self.frame_max, heartbeat=0))
                + encode_method(0, commands.Connection.Open(virtual_host=self.vhost))
            )
        elif isinstance(method, commands.Connection.OpenOk):
            self._handshake_channel()
        elif isinstance(method, commands.Channel.Close):
            self._send(encode_method(1, commands.Channel.CloseOk()))
            self._fail(ChannelClosed(method.reply_code, method.reply_text))
        elif isinstance(method, commands.Connection.Close):
            self._send(encode_method(0, commands.Connection.CloseOk()))
            self._fail(ConnectionClosed(method.reply_code, method.reply_text))
            self.transport.loseConnection()
        elif self._calls and isinstance(method, self._calls[0][0]):
            _reply, deferred = self._calls.popleft()
            deferred.callback(method)

    def _content_frame(self, payload: bytes) -> None:
        assert self._content is not None
        method, raw, parts, expected = self._content
        if self._header is None:
            self._header = payload
            _class, size = content_body_size(payload)
            self._content = (method, raw, parts, size)
            if size == 0:
                self._complete()
            return
        parts.append(payload)
        if sum(len(part) for part in parts) >= expected:
            self._complete()

    _header: bytes | None = None

    def _complete(self) -> None:
        assert self._content is not None and self._header is not None
        method, raw, parts, _expected = self._content
        properties = decode_properties(self._header)
        body = b"".join(parts)
        self._content = None
        self._header = None
        if raw is not None:
            consumer_tag, delivery_tag, redelivered, exchange, routing_key = parse_deliver(raw)
            handler = self._consumers.get(consumer_tag)
            if handler is not None:
                handler(Message(self, delivery_tag, redelivered, exchange, routing_key, properties, body))
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
            deferred = self._confirms.pop(each, None)
            if deferred is None:
                continue
            failure = error or self._returned
            self._returned = None
            if failure is not None:
                deferred.errback(failure)
            else:
                deferred.callback(None)

    def _handshake_channel(self) -> None:
        opened = self._call(commands.Channel.Open(), commands.Channel.OpenOk)
        opened.addCallback(lambda _: self._call(commands.Confirm.Select(), commands.Confirm.SelectOk))
        opened.addCallbacks(lambda _: self.ready.callback(self), self.ready.errback)

    def _call(self, method: Frame, reply: type) -> defer.Deferred[Any]:
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._calls.append((reply, deferred))
        self._send(encode_method(1, method))
        return deferred

    # -- the API --------------------------------------------------------------------------------

    def declare_queue(
        self, name: str, durable: bool = True, arguments: Mapping[str, Any] | None = None
    ) -> defer.Deferred[str]:
        """Declare a queue; fires with its name."""
        declared = self._call(
            commands.Queue.Declare(queue=name, durable=durable, arguments=dict(arguments or {})),
            commands.Queue.DeclareOk,
        )
        return declared.addCallback(lambda ok: str(ok.queue))

    def declare_exchange(self, name: str, exchange_type: str = "direct", durable: bool = True) -> defer.Deferred[Any]:
        """Declare an exchange."""
        return self._call(
            commands.Exchange.Declare(exchange=name, exchange_type=exchange_type, durable=durable),
            commands.Exchange.DeclareOk,
        )

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> defer.Deferred[Any]:
        """Bind ``queue`` to ``exchange``."""
        return self._call(
            commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key), commands.Queue.BindOk
        )

    def publish(self, exchange: str, routing_key: str, body: bytes, **options: Any) -> defer.Deferred[None]:
        """Publish; fires once the broker confirms, fails with PublishNacked or PublishReturned."""
        self._send(publish_frames(exchange, routing_key, body, self.frame_max, **options))
        self._publish_seq += 1
        deferred: defer.Deferred[None] = defer.Deferred()
        self._confirms[self._publish_seq] = deferred
        return deferred

    def get(self, queue: str) -> defer.Deferred[Message | None]:
        """Fires with one message of ``queue`` (to be acked) or ``None`` when it is empty."""
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._calls.append((commands.Basic.GetEmpty, deferred))
        self._send(encode_method(1, commands.Basic.Get(queue=queue)))
        return deferred.addCallback(lambda answer: answer if isinstance(answer, Message) else None)

    def consume(self, queue: str, callback: Callable[[Message], Any], prefetch: int = 100) -> defer.Deferred[str]:
        """Call ``callback`` with each delivery from ``queue``; fires with the consumer tag."""
        qos = self._call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        qos.addCallback(lambda _: self._call(commands.Basic.Consume(queue=queue), commands.Basic.ConsumeOk))

        def subscribed(ok: Any) -> str:
            self._consumers[str(ok.consumer_tag)] = callback
            return str(ok.consumer_tag)

        return qos.addCallback(subscribed)

    def close(self) -> defer.Deferred[Any]:
        """Close the connection politely."""
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._calls.append((commands.Connection.CloseOk, deferred))
        self._send(
            encode_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        )
        deferred.addBoth(lambda result: self.transport.loseConnection())
        return deferred


def connect_twisted(reactor: Any, url: str = "amqp://guest:guest@127.0.0.1:5672/") -> defer.Deferred[TwistedConnection]:
    """Connect and open a confirming channel; fires with the :class:`TwistedConnection`."""
    parsed = urlparse(url)
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    protocol = TwistedConnection(
        unquote(parsed.username or "guest"), unquote(parsed.password or "guest"), unquote(path) if path else "/"
    )
    endpoint = TCP4ClientEndpoint(reactor, parsed.hostname or "127.0.0.1", parsed.port or 5672)
    return connectProtocol(endpoint, protocol).addCallback(lambda _: protocol.ready)

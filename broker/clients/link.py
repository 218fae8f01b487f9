"""A link: one AMQP 0-9-1 client connection made for moving messages between brokers.

A shovel (``broker.server.shovels``) holds two: one consuming at the source, one publishing at
the destination. Unlike :mod:`broker.clients.txclient`, a link does not reconnect (a shovel
starts over, as RabbitMQ's do) and does not decode what it moves: a delivery is handed on as
its routing, its content header as sent and its body, and a publish sends a content header as
it is given, so properties and headers cross byte for byte. ::

    link = Link("guest", "guest", "/", reactor, confirms=True)
    await connectProtocol(endpoint, link)
    await link.opened
    link.on_deliver = lambda tag, redelivered, exchange, key, header, body: ...
    link.on_confirm = lambda seq, multiple, acked: ...
    await link.call(queue_declare("jobs"), commands.Queue.DeclareOk)
    seq = link.publish("", "jobs", header, body)

The link works on channel 1; :meth:`exists` asks on a channel of its own whether a queue
exists, so that a missing one does not end channel 1. Whatever ends the connection (the
broker, the network, a heartbeat missed, :meth:`close`) fires :attr:`closed` once with a
:class:`LinkClosed` saying why; calls still waiting fail with it.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from pamqp import commands
from pamqp.base import Frame
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from postroom.broker.clients.client import ClientError, parse_deliver, start_ok
from postroom.broker.wire.codec import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    FRAME_END,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    ack_method,
    content_body_size,
    content_frames,
    decode_method,
    encode_method,
    nack_method,
    shortstr,
)

_frame_head = struct.Struct(">BHI")
_method_index = struct.Struct(">I")
_publish_head = struct.Struct(">BHIIH")  # frame header, method index, reserved ticket
_confirm = struct.Struct(">QB")  # delivery tag, bits (basic.ack and basic.nack)
_BASIC_PUBLISH = (60 << 16) | 40

#: Told of each delivery: delivery tag, redelivered, exchange, routing key, content header
#: payload (as sent), body.
Deliver = Callable[[int, bool, str, str, bytes, bytes], None]
#: Told of each publisher confirm: sequence number, multiple, acked (``False``: nacked).
Confirm = Callable[[int, bool, bool], None]


class LinkClosed(ClientError):
    """Why a link ended: the AMQP reply code and text (320 for a lost connection)."""


class Link(Protocol):
    """One client connection with channel 1 open (in confirm mode with ``confirms``).

    :param user: login (PLAIN)
    :param password: password
    :param vhost: virtual host to open
    :param clock: the reactor, for heartbeats
    :param heartbeat: seconds proposed (the smaller of the two proposals wins; 0: none)
    :param name: the ``connection_name`` client property (how the broker lists the connection)
    :param confirms: put channel 1 in confirm mode
    """

    def __init__(
        self,
        user: str,
        password: str,
        vhost: str,
        clock: Any,
        heartbeat: int = 10,
        name: str = "",
        confirms: bool = False,
    ) -> None:
        self.user, self.password, self.vhost = user, password, vhost
        self.clock = clock
        self.name = name
        self.confirms = confirms
        #: Fires with the link once channel 1 is open, or fails with :class:`LinkClosed`.
        self.opened: defer.Deferred[Link] = defer.Deferred()
        #: Fires once with a :class:`LinkClosed`, however the connection ended.
        self.closed: defer.Deferred[LinkClosed] = defer.Deferred()
        self.on_deliver: Deliver | None = None
        self.on_confirm: Confirm | None = None
        #: Told when the broker cancels the consumer (its queue was deleted).
        self.on_cancel: Callable[[], None] | None = None
        #: The last publish's sequence number (confirms count from 1).
        self.sequence = 0
        self.frame_max = 131072
        self.heartbeat = 0
        self._heartbeat = heartbeat
        self._heartbeat_call: IDelayedCall | None = None
        self._last_sent = self._last_received = 0.0
        self._buffer = b""
        self._calls: dict[int, deque[tuple[type, defer.Deferred[Any]]]] = {1: deque(), 2: deque()}
        #: The delivery being read: method payload, content header, body parts, bytes expected.
        self._deliver: bytes | None = None
        self._header: bytes | None = None
        self._parts: list[bytes] = []
        self._expected = 0
        self._received = 0
        self._reason: LinkClosed | None = None
        self._ended = False
        self._close_call: IDelayedCall | None = None

    # -- I/O ------------------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._write(PROTOCOL_HEADER)

    def _write(self, data: bytes) -> None:
        if self._ended:
            return
        if self.heartbeat:
            self._last_sent = self.clock.seconds()
        self.transport.write(data)

    def dataReceived(self, data: bytes) -> None:
        if self.heartbeat:
            self._last_received = self.clock.seconds()
        buffer = self._buffer + data if self._buffer else data
        position = 0
        while len(buffer) - position >= FRAME_OVERHEAD and not self._ended:
            frame_type, channel, size = _frame_head.unpack_from(buffer, position)
            end = position + 7 + size
            if len(buffer) <= end:
                break
            if buffer[end] != FRAME_END:
                self._fail(LinkClosed(501, "FRAME_ERROR - bad frame end from the broker"))
                return
            payload = buffer[position + 7 : end]
            position = end + 1
            try:
                self._frame(frame_type, channel, payload)
            except (ValueError, IndexError, struct.error) as error:  # what the broker sent is not AMQP
                self._fail(LinkClosed(501, f"FRAME_ERROR - cannot decode what the broker sent: {error}"))
                return
        self._buffer = buffer[position:]

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._ended = True
        for call in (self._heartbeat_call, self._close_call):
            if call is not None and call.active():
                call.cancel()
        self._heartbeat_call = self._close_call = None
        why = self._reason or LinkClosed(320, f"the connection was lost ({reason.getErrorMessage() if reason else ''})")
        calls = [deferred for queue in self._calls.values() for _reply, deferred in queue]
        for queue in self._calls.values():
            queue.clear()
        if not self.opened.called:
            self.opened.errback(why)
        for deferred in calls:
            deferred.errback(why)
        self.closed.callback(why)

    def _fail(self, why: LinkClosed) -> None:
        """End the connection at once, for ``why``."""
        if self._reason is None:
            self._reason = why
        self._ended = True
        self.transport.abortConnection()

    def _beat(self) -> None:
        now = self.clock.seconds()
        if now - self._last_received >= 2 * self.heartbeat:
            self._heartbeat_call = None
            self._fail(LinkClosed(320, "heartbeat timeout"))
            return
        if now - self._last_sent >= self.heartbeat / 2:
            self._write(HEARTBEAT_FRAME)
        self._heartbeat_call = self.clock.callLater(self.heartbeat / 2, self._beat)

    # -- frames ---------------------------------------------------------------------------------

    def _frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if frame_type == FRAME_HEARTBEAT:
            return
        if self._deliver is not None and frame_type != FRAME_METHOD:
            self._content(payload)
            return
        index = _method_index.unpack_from(payload)[0]
        if index == BASIC_DELIVER:
            self._deliver = payload
            return
        if index in (BASIC_ACK, BASIC_NACK):
            tag, bits = _confirm.unpack_from(payload, 4)
            if self.on_confirm is not None:
                self.on_confirm(tag, bool(bits & 1), index == BASIC_ACK)
            return
        method = decode_method(payload, channel)
        if isinstance(method, commands.Connection.Start):
            properties = start_ok(self.user, self.password, "Postroom shovel")
            if self.name:
                properties.client_properties["connection_name"] = self.name
            self._write(encode_method(0, properties))
        elif isinstance(method, commands.Connection.Tune):
            self.frame_max = method.frame_max or self.frame_max
            offered, wanted = method.heartbeat, self._heartbeat
            self.heartbeat = min(offered, wanted) if offered and wanted else 0
            tune_ok = commands.Connection.TuneOk(channel_max=2, frame_max=self.frame_max, heartbeat=self.heartbeat)
            self._write(encode_method(0, tune_ok) + encode_method(0, commands.Connection.Open(virtual_host=self.vhost)))
            if self.heartbeat:
                self._last_received = self.clock.seconds()
                self._heartbeat_call = self.clock.callLater(self.heartbeat / 2, self._beat)
        elif isinstance(method, commands.Connection.OpenOk):
            opened = self.call(commands.Channel.Open(), commands.Channel.OpenOk)
            if self.confirms:
                opened.addCallback(lambda _ok: self.call(commands.Confirm.Select(), commands.Confirm.SelectOk))
            opened.addCallbacks(lambda _ok: self.opened.callback(self), lambda _failure: None)
        elif isinstance(method, commands.Connection.Close):
            self._write(encode_method(0, commands.Connection.CloseOk()))
            self._reason = self._reason or LinkClosed(method.reply_code, method.reply_text)
            self.transport.loseConnection()
        elif isinstance(method, commands.Connection.CloseOk):
            self.transport.loseConnection()
        elif isinstance(method, commands.Channel.Close):
            self._write(encode_method(channel, commands.Channel.CloseOk()))
            why = LinkClosed(method.reply_code, method.reply_text)
            if channel == 1:  # the link's own channel: the link is over
                self._reason = self._reason or why
                self.transport.loseConnection()
            else:
                calls = self._calls[channel]
                while calls:
                    calls.popleft()[1].errback(why)
        elif isinstance(method, commands.Basic.Cancel):
            if self.on_cancel is not None:
                self.on_cancel()
        else:
            calls = self._calls.get(channel)
            if calls and isinstance(method, calls[0][0]):
                calls.popleft()[1].callback(method)

    def _content(self, payload: bytes) -> None:
        if self._header is None:
            self._header = payload
            self._expected = content_body_size(payload)[2]
            self._parts = []
            self._received = 0
        else:
            self._parts.append(payload)
            self._received += len(payload)
        if self._received >= self._expected:
            deliver, header = self._deliver, self._header
            body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._deliver = self._header = None
            assert deliver is not None
            _consumer, tag, redelivered, exchange, routing_key = parse_deliver(deliver)
            if self.on_deliver is not None:
                self.on_deliver(tag, redelivered, exchange, routing_key, header, body)

    # -- what a shovel does ---------------------------------------------------------------------

    def call(self, method: Frame, reply: type, channel: int = 1) -> defer.Deferred[Any]:
        """Send a synchronous method; fires with its reply, or fails with :class:`LinkClosed`."""
        if self._ended:
            return defer.fail(self._reason or LinkClosed(320, "the link is closed"))
        data = encode_method(channel, method)
        deferred: defer.Deferred[Any] = defer.Deferred()
        self._calls[channel].append((reply, deferred))
        self._write(data)
        return deferred

    async def exists(self, queue: str) -> bool:
        """Whether ``queue`` exists (a passive declare on channel 2, opened for it and closed)."""
        await self.call(commands.Channel.Open(), commands.Channel.OpenOk, channel=2)
        try:
            await self.call(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk, channel=2)
        except LinkClosed as why:
            if why.reply_code == 404 and not self._ended:
                return False  # (the broker closed channel 2)
            raise
        close = commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
        await self.call(close, commands.Channel.CloseOk, channel=2)
        return True

    def publish(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> int:
        """Publish one message with ``header`` (a content header payload) as it is; its
        sequence number (what its confirm will name)."""
        names = shortstr(exchange) + shortstr(routing_key)
        parts = [_publish_head.pack(FRAME_METHOD, 1, 7 + len(names), _BASIC_PUBLISH, 0), names, b"\x00\xce"]
        parts += content_frames(1, header, body, self.frame_max)
        self._write(b"".join(parts))
        self.sequence += 1
        return self.sequence

    def ack(self, tag: int, multiple: bool = False) -> None:
        self._write(ack_method(1, tag, multiple))

    def nack(self, tag: int, multiple: bool = False) -> None:
        """Refuse a delivery (or all up to it), to be delivered again (``requeue``)."""
        self._write(nack_method(1, tag, multiple))

    def pause(self) -> None:
        """Stop reading (the broker holds what it would send)."""
        if not self._ended:
            self.transport.pauseProducing()

    def resume(self) -> None:
        if not self._ended:
            self.transport.resumeProducing()

    def close(self, reason: str = "closed by the shovel") -> None:
        """Close politely (the broker puts back what was delivered and not acknowledged); the
        connection is dropped if the broker does not answer within 10 s."""
        if self._ended:
            return
        self._reason = self._reason or LinkClosed(200, reason)
        self._write(
            encode_method(0, commands.Connection.Close(reply_code=200, reply_text=reason, class_id=0, method_id=0))
        )
        self._close_call = self.clock.callLater(10, self.transport.abortConnection)

"""A blocking AMQP 0-9-1 client for applications: publish with confirms, consume with ack/nack.

::

    from postroom.broker.clients.client import connect

    with connect("amqp://guest:guest@127.0.0.1:5672/") as conn:
        conn.publish("orders", "order.eu.created", b"{...}", headers={"tenant": "acme"})
        for msg in conn.consume("orders.created", prefetch=20):
            handle(msg.body)
            msg.ack()

It speaks to Postroom and to RabbitMQ alike, and shares its frame codec with the server
(``broker.wire.codec``). Publishes are confirmed by default: :meth:`Connection.publish`
returns once the broker has confirmed the message, and raises :class:`PublishNacked` or
:class:`PublishReturned` otherwise. Errors from the broker raise :class:`ChannelClosed` or
:class:`ConnectionClosed` carrying the reply code and text.

Everything happens in the calling thread: frames are read only while a call waits, which is
also when heartbeats are answered (as in pika's ``BlockingConnection``).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from pamqp import commands
from pamqp.base import Frame

from postroom.broker.wire.codec import (
    BASIC_CLASS,
    BASIC_DELIVER,
    BASIC_PUBLISH,
    FRAME_END,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    content_body_size,
    content_frames,
    decode_method,
    decode_properties,
    encode_content_header,
    encode_method,
    shortstr,
)

#: The exchange through which a visibility lease is extended (``docs/configuration.md``, lease extension).
EXTEND_EXCHANGE = "amq.postroom.extend"

_frame_head = struct.Struct(">BHI")
_method_index = struct.Struct(">I")
_deliver_tail = struct.Struct(">QB")
_publish_head = struct.Struct(">BHIIH")  # frame header, method index, reserved ticket
_ack_frame = struct.Struct(">BHIIQBB")  # frame header, method index, delivery tag, multiple, frame end
#: An ack's frame header and method index on channel 1 (``basic.ack``: class 60, method 80).
_ACK_HEAD = (FRAME_METHOD, 1, 13, (60 << 16) | 80)


def parse_deliver(payload: bytes) -> tuple[str, int, bool, str, str]:
    """``basic.deliver`` (method payload with its ids): consumer tag, delivery tag, redelivered,
    exchange, routing key. Hand-decoded: it arrives once per message."""
    tag_length = payload[4]
    consumer_tag = payload[5 : 5 + tag_length].decode("utf-8", "surrogateescape")
    offset = 5 + tag_length
    delivery_tag, redelivered = _deliver_tail.unpack_from(payload, offset)
    offset += 9
    exchange_length = payload[offset]
    exchange = payload[offset + 1 : offset + 1 + exchange_length].decode("utf-8", "surrogateescape")
    offset += 1 + exchange_length
    routing_key = payload[offset + 1 : offset + 1 + payload[offset]].decode("utf-8", "surrogateescape")
    return consumer_tag, delivery_tag, bool(redelivered), exchange, routing_key


#: Bytes of publishes :meth:`Connection.publish_batch` gathers before it writes them.
BATCH_BYTES = 64 << 10


def publish_frames(
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
    headers: Mapping[str, Any] | None = None,
    persistent: bool = True,
    mandatory: bool = False,
    basic_properties: commands.Basic.Properties | None = None,
    **properties: Any,
) -> bytes:
    """The frames of one ``basic.publish`` on channel 1, the method frame built by hand.

    :param basic_properties: send exactly these properties (``headers``, ``persistent`` and
        the keyword properties are then ignored), e.g. to republish a message as it was
    """
    names = shortstr(exchange) + shortstr(routing_key)
    if basic_properties is None and not headers and not properties:
        # Only the delivery mode (most publishes): the header without building properties.
        header = _DELIVERY_MODE_ONLY.pack(BASIC_CLASS, 0, len(body), 0x1000, 2 if persistent else 1)
    else:
        props = basic_properties or commands.Basic.Properties(
            headers=dict(headers) if headers else None, delivery_mode=2 if persistent else 1, **properties
        )
        header = encode_content_header(len(body), props)
    parts = [
        _publish_head.pack(FRAME_METHOD, 1, 4 + 2 + len(names) + 1, BASIC_PUBLISH, 0),
        names,
        bytes((1 if mandatory else 0, FRAME_END)),
    ]
    parts += content_frames(1, header, body, frame_max)
    return b"".join(parts)


#: A content header whose only property is the delivery mode: class, weight, body size, flags, mode.
_DELIVERY_MODE_ONLY = struct.Struct(">HHQHB")


def parse_url(url: str) -> tuple[str, int, str, str, str]:
    """``amqp://user:password@host:port/vhost`` as ``(host, port, user, password, vhost)``.

    Missing parts take RabbitMQ's defaults: 127.0.0.1, 5672, guest, guest and vhost ``/``; the
    vhost is URL-quoted (``%2F`` is ``/``).
    """
    parsed = urlparse(url)
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    return (
        parsed.hostname or "127.0.0.1",
        parsed.port or 5672,
        unquote(parsed.username or "guest"),
        unquote(parsed.password or "guest"),
        unquote(path) if path else "/",
    )


def start_ok(user: str, password: str, product: str) -> commands.Connection.StartOk:
    """The ``connection.start-ok`` both clients answer with: PLAIN login, and the capabilities
    they handle (confirms with nacks, consumer cancel notifications, a close on a refused login)."""
    return commands.Connection.StartOk(
        client_properties={
            "product": product,
            "capabilities": {
                "publisher_confirms": True,
                "consumer_cancel_notify": True,
                "basic.nack": True,
                "authentication_failure_close": True,
            },
        },
        mechanism="PLAIN",
        response=f"\0{user}\0{password}",
    )


#: The first pause between reconnection attempts, in seconds; it doubles up to :data:`MAX_BACKOFF`.
FIRST_BACKOFF = 0.1
#: The longest pause between reconnection attempts, in seconds.
MAX_BACKOFF = 5.0


def backoff(retries: int) -> list[float]:
    """The pauses between ``retries`` reconnection attempts: the first attempt is at once, then
    0.1 s, 0.2 s, 0.4 s ... up to :data:`MAX_BACKOFF` (``retries - 1`` pauses)."""
    delays = []
    delay = FIRST_BACKOFF
    for _ in range(max(retries - 1, 0)):
        delays.append(delay)
        delay = min(delay * 2, MAX_BACKOFF)
    return delays


F = TypeVar("F", bound=Frame)


def named(method: type[F], **fields: Any) -> F:
    """``method`` with ``fields``, where a name pamqp refuses is a :class:`ClientError`.

    pamqp allows client-side names of letters, digits, spaces and ``-_.:@#,/+`` only, where
    RabbitMQ (and Postroom) take any UTF-8 string up to 255 bytes: such a name cannot be sent
    from this client, which says so instead of raising ``ValueError``.
    """
    try:
        return method(**fields)
    except ValueError as error:
        names = ", ".join(f"{key}={value!r}" for key, value in fields.items() if isinstance(value, str))
        raise ClientError(0, f"{method.name} cannot be sent by this client ({error}: {names})") from None


def exchange_declare(
    name: str,
    exchange_type: str = "direct",
    durable: bool = True,
    auto_delete: bool = False,
    internal: bool = False,
    arguments: Mapping[str, Any] | None = None,
) -> commands.Exchange.Declare:
    """The ``exchange.declare`` both clients send."""
    return named(
        commands.Exchange.Declare,
        exchange=name,
        exchange_type=exchange_type,
        durable=durable,
        auto_delete=auto_delete,
        internal=internal,
        arguments=dict(arguments or {}),
    )


def queue_declare(
    name: str, durable: bool = True, arguments: Mapping[str, Any] | None = None, auto_delete: bool = False
) -> commands.Queue.Declare:
    """The ``queue.declare`` both clients send."""
    fields = {"queue": name, "durable": durable, "auto_delete": auto_delete}
    return named(commands.Queue.Declare, **fields, arguments=dict(arguments or {}))


def queue_bind(
    queue: str, exchange: str, routing_key: str = "", arguments: Mapping[str, Any] | None = None
) -> commands.Queue.Bind:
    """The ``queue.bind`` both clients send."""
    return named(
        commands.Queue.Bind, queue=queue, exchange=exchange, routing_key=routing_key, arguments=dict(arguments or {})
    )


def exchange_bind(
    destination: str, source: str, routing_key: str = "", arguments: Mapping[str, Any] | None = None
) -> commands.Exchange.Bind:
    """The ``exchange.bind`` (RabbitMQ's extension) both clients send."""
    fields = {"destination": destination, "source": source, "routing_key": routing_key}
    return named(commands.Exchange.Bind, **fields, arguments=dict(arguments or {}))


class ClientError(Exception):
    """A failure reported by the broker, with its AMQP reply code and text."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text


class ChannelClosed(ClientError):
    """The broker closed the channel (404 no such queue, 406 precondition failed ...)."""


class ConnectionClosed(ClientError):
    """The broker closed the connection, or the socket went away (reply code 320 then)."""


class PublishNacked(ClientError):
    """The broker refused a publish (a full queue with ``x-overflow`` reject-publish, a failed disk)."""


class PublishReturned(ClientError):
    """A mandatory publish could not be routed (312 NO_ROUTE)."""


class Timeout(ClientError):
    """Nothing arrived within the time given."""

    def __init__(self, what: str) -> None:
        super().__init__(0, f"timed out waiting for {what}")


class Message:
    """A delivered message, with its acknowledgement methods."""

    def __init__(
        self,
        connection: Connection,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: commands.Basic.Properties | bytes,
        body: bytes,
    ) -> None:
        self._connection: Any = connection  # a Connection or a broker.clients.txclient.TwistedConnection
        #: The connection's generation when delivered: after a reconnect the broker has given
        #: the message back already, so acking it is a no-op rather than an error.
        self._generation = connection._generation
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        #: The properties, or the content header's bytes until they are first read.
        self._properties = properties
        self.body = body
        #: From :meth:`Connection.get`: how many messages the queue held after this one.
        self.remaining: int | None = None

    @property
    def properties(self) -> commands.Basic.Properties:
        """The message's properties (decoded when first read: a consumer that reads only the
        body does not pay for them)."""
        properties = self._properties
        if isinstance(properties, bytes):
            properties = self._properties = decode_properties(properties)
        return properties

    @property
    def headers(self) -> dict[str, Any]:
        """The ``headers`` table (empty when there is none)."""
        return dict(self.properties.headers or {})

    @property
    def delivery_count(self) -> int:
        """Earlier deliveries that were returned (``x-delivery-count``; 0 on a first delivery)."""
        return int(self.headers.get("x-delivery-count", 0))

    @property
    def x_death(self) -> list[dict[str, Any]]:
        """The dead-letter history, most recent first (empty when never dead-lettered)."""
        deaths = self.headers.get("x-death")
        return list(deaths) if isinstance(deaths, list) else []

    def _settle(self, method: Frame) -> None:
        self._connection._settle(self._generation, method)

    def ack(self) -> None:
        """Acknowledge: the broker forgets the message."""
        self._connection._settle(self._generation, _ack_frame.pack(*_ACK_HEAD, self.delivery_tag, 0, FRAME_END))

    def nack(self, requeue: bool = True) -> None:
        """Refuse: back to the queue (``requeue``) or to the dead-letter exchange."""
        self._settle(commands.Basic.Nack(delivery_tag=self.delivery_tag, requeue=requeue))

    def reject(self, requeue: bool = False) -> None:
        """Refuse one message; by default it is dead-lettered (or dropped without a DLX)."""
        self._settle(commands.Basic.Reject(delivery_tag=self.delivery_tag, requeue=requeue))

    def extend(self, seconds: float) -> Any:
        """Extend the visibility lease: the broker keeps the message for ``seconds`` from now.

        :raises PublishNacked: the delivery was already taken back (its tag is stale); with the
            Twisted client, the returned Deferred fails with it instead
        """
        return self._connection.publish(
            EXTEND_EXCHANGE,
            "",
            b"",
            headers={"x-delivery-tag": self.delivery_tag, "x-visibility-timeout": int(seconds * 1000)},
            persistent=False,
        )

    def __repr__(self) -> str:
        return f"<Message tag={self.delivery_tag} {self.exchange!r} {self.routing_key!r} {len(self.body)} bytes>"


def connect(
    url: str = "amqp://guest:guest@127.0.0.1:5672/",
    heartbeat: int = 60,
    timeout: float = 10.0,
    reconnect: bool = True,
    retries: int = 10,
) -> Connection:
    """Open a connection (``amqp://user:password@host:port/vhost``; the vhost is URL-quoted, ``/`` by default).

    :param reconnect: when the connection drops (broker restart, network), reconnect with
        backoff, declare again what was declared, and resume consuming
    :param retries: reconnection attempts before giving up
    :raises ConnectionClosed: the broker refused the login or the vhost, or is not there
    """
    return Connection(url, heartbeat=heartbeat, timeout=timeout, reconnect=reconnect, retries=retries)


class Connection:
    """One connection with one channel in confirm mode.

    :param url: ``amqp://user:password@host:port/vhost``
    :param heartbeat: seconds proposed to the broker (0: none)
    :param timeout: seconds to wait for the broker's answers
    :param reconnect: reconnect after a dropped connection (see :func:`connect`)
    """

    def __init__(
        self, url: str, heartbeat: int = 60, timeout: float = 10.0, reconnect: bool = False, retries: int = 10
    ) -> None:
        self.host, self.port, self.user, self.password, self.vhost = parse_url(url)
        self.timeout = timeout
        self._heartbeat = heartbeat
        self._buffer = b""
        #: Where the next frame starts in :attr:`_buffer`.
        self._at = 0
        self._deliveries: deque[Message] = deque()
        self._publish_seq = 0
        #: Every publish up to this tag is confirmed or refused.
        self._confirmed = 0
        #: Tags above :attr:`_confirmed` settled already (a broker may settle out of order).
        self._settled: set[int] = set()
        self._nacked: set[int] = set()
        self._returned: list[PublishReturned] = []
        self._consumers: dict[str, str] = {}
        #: While :meth:`publish_batch` runs: publishes not sent yet, and their bytes.
        self._batch: list[bytes] | None = None
        self._batched = 0
        self._closed: ClientError | None = None
        self._got: Message | None = None
        self.heartbeat = 0
        self.frame_max = 131072
        self._last_sent = time.monotonic()
        self.reconnect = reconnect
        self.retries = retries
        #: Bumped on every reconnection; deliveries from an older one cannot be acked.
        self._generation = 0
        #: Declarations to repeat after a reconnection, in order.
        self._declared: list[tuple[Frame, type]] = []
        self.reconnections = 0
        self._open()

    def _open(self) -> None:
        self._buffer = b""
        #: Where the next frame starts in :attr:`_buffer`.
        self._at = 0
        self._closed = None
        self._publish_seq = 0
        self._confirmed = 0
        self._settled.clear()
        self._nacked.clear()
        self._returned.clear()
        self._deliveries.clear()
        self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._handshake()

    def _reconnect(self) -> None:
        """Open a new connection with backoff, declare again what was declared.

        :raises ConnectionClosed: every attempt failed
        """
        try:
            self._sock.close()
        except OSError:
            pass
        pauses = backoff(self.retries)
        for attempt in range(self.retries):
            try:
                self._open()
                for method, reply in self._declared:
                    self._call(method, reply, remember=False)
            except (OSError, ConnectionClosed):
                if attempt == self.retries - 1:
                    raise ConnectionClosed(320, f"could not reconnect to {self.host}:{self.port}") from None
                time.sleep(pauses[attempt])
                continue
            self._generation += 1
            self.reconnections += 1
            return

    # -- plumbing -------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        self._sock.sendall(data)
        self._last_sent = time.monotonic()

    def _fill(self, deadline: float) -> None:
        """Read more bytes, answering heartbeats meanwhile. :raises Timeout: past ``deadline``."""
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise Timeout("the broker")
            if self.heartbeat and now - self._last_sent >= self.heartbeat / 2:
                self._send(HEARTBEAT_FRAME)
            wait = deadline - now
            if self.heartbeat:
                wait = min(wait, self.heartbeat / 2)
            self._sock.settimeout(wait)
            try:
                data = self._sock.recv(131072)
            except TimeoutError:
                continue
            if not data:
                self._closed = ConnectionClosed(320, "the broker closed the socket")
                raise self._closed
            self._buffer = self._buffer[self._at :] + data if self._at else self._buffer + data
            self._at = 0
            return

    def _frame(self, deadline: float) -> tuple[int, int, bytes]:
        """The next frame ``(type, channel, payload)``."""
        while True:
            buffer = self._buffer
            at = self._at
            if len(buffer) - at >= FRAME_OVERHEAD:
                frame_type, channel, size = _frame_head.unpack_from(buffer, at)
                end = at + 7 + size
                if len(buffer) > end:
                    if buffer[end] != FRAME_END:
                        self._closed = ConnectionClosed(501, "bad frame end from the broker")
                        raise self._closed
                    self._at = end + 1  # the bytes read are left behind until the next read
                    return frame_type, channel, buffer[at + 7 : end]
            self._fill(deadline)

    def _method(self, deadline: float) -> Frame:
        """Handle frames until a method other than a delivery/return/confirm arrives; return it."""
        while True:
            result = self._next(deadline)
            if result is not None:
                return result

    def _next(self, deadline: float) -> Frame | None:
        """Handle one incoming frame (and its content); return a method the caller waits for."""
        frame_type, channel, payload = self._frame(deadline)
        if frame_type == FRAME_HEARTBEAT:
            return None
        if frame_type != FRAME_METHOD:
            self._closed = ConnectionClosed(505, f"unexpected frame type {frame_type}")
            raise self._closed
        index = _method_index.unpack_from(payload)[0]
        if index == BASIC_DELIVER:
            self._delivery(payload, deadline)
            return None
        method = decode_method(payload)
        if isinstance(method, commands.Basic.Ack | commands.Basic.Nack):
            self._confirm(method.delivery_tag, method.multiple, isinstance(method, commands.Basic.Nack))
        elif isinstance(method, commands.Basic.Return):
            properties, body = self._content(deadline)
            self._returned.append(PublishReturned(method.reply_code, f"{method.reply_text}: {method.routing_key}"))
        elif isinstance(method, commands.Basic.GetOk):
            properties, body = self._content(deadline)
            self._got = Message(
                self, method.delivery_tag, method.redelivered, method.exchange, method.routing_key, properties, body
            )
            return method
        elif isinstance(method, commands.Channel.Close):
            self._sock.sendall(encode_method(channel, commands.Channel.CloseOk()))
            self._closed = ChannelClosed(method.reply_code, method.reply_text)
            raise self._closed
        elif isinstance(method, commands.Connection.Close):
            self._sock.sendall(encode_method(0, commands.Connection.CloseOk()))
            self._closed = ConnectionClosed(method.reply_code, method.reply_text)
            raise self._closed
        elif isinstance(method, commands.Basic.Cancel):
            self._consumers.pop(method.consumer_tag, None)
        else:
            return method
        return None

    def _content(self, deadline: float) -> tuple[bytes, bytes]:
        """The content header's payload (see :attr:`Message.properties`) and the body."""
        _type, _channel, header = self._frame(deadline)
        _class, _weight, size = content_body_size(header)
        parts = []
        received = 0
        while received < size:
            _type, _channel, piece = self._frame(deadline)
            parts.append(piece)
            received += len(piece)
        return header, b"".join(parts)

    def _delivery(self, payload: bytes, deadline: float) -> None:
        _consumer_tag, delivery_tag, redelivered, exchange, routing_key = parse_deliver(payload)
        properties, body = self._content(deadline)
        self._deliveries.append(Message(self, delivery_tag, redelivered, exchange, routing_key, properties, body))

    def _settle(self, generation: int, method: Frame | bytes) -> None:
        """Send an ack, nack or reject (or its frame) of a delivery made in connection ``generation``."""
        if generation != self._generation:
            return  # delivered before a reconnect: the broker already put it back
        try:
            self._send(method if isinstance(method, bytes) else encode_method(1, method))
        except (OSError, ConnectionClosed):
            if not self.reconnect:
                raise
            self._reconnect()  # the message goes back to its queue, redelivered later

    def _confirm(self, tag: int, multiple: bool, refused: bool) -> None:
        """Settle ``tag`` (with ``multiple``, every unsettled tag up to it). Confirms may come
        out of order: RabbitMQ sends the acks of a batch before its nacks, so ``ack 2`` can
        precede ``nack 1`` (``multiple``), and the nack must still count."""
        if tag <= self._confirmed:
            return
        if multiple and not self._settled:  # the common case: everything up to tag, in one step
            if refused:
                self._nacked.update(range(self._confirmed + 1, tag + 1))
            self._confirmed = tag
            return
        if multiple:
            tags = [t for t in range(self._confirmed + 1, tag + 1) if t not in self._settled]
        else:
            tags = [] if tag in self._settled else [tag]
        if refused:
            self._nacked.update(tags)
        self._settled.update(tags)
        while self._confirmed + 1 in self._settled:
            self._confirmed += 1
            self._settled.discard(self._confirmed)

    def _call(self, method: Frame, reply: type, channel: int = 1, remember: bool = False) -> Frame:
        """Send a synchronous method and wait for its reply.

        :param remember: declare it again after a reconnection
        """
        if remember:
            self._declared.append((method, reply))
        self._send(encode_method(channel, method))
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._method(deadline)
            if isinstance(answer, reply):
                return answer

    def _handshake(self) -> None:
        self._sock.sendall(PROTOCOL_HEADER)
        deadline = time.monotonic() + self.timeout
        start = self._method(deadline)
        if not isinstance(start, commands.Connection.Start):
            raise ConnectionClosed(505, f"expected connection.start, got {start.name}")
        self._sock.sendall(encode_method(0, start_ok(self.user, self.password, "Postroom client")))
        tune = self._method(deadline)
        if not isinstance(tune, commands.Connection.Tune):
            raise ConnectionClosed(505, f"expected connection.tune, got {tune.name}")
        self.frame_max = tune.frame_max or 131072
        offered = tune.heartbeat
        self.heartbeat = min(offered, self._heartbeat) if offered and self._heartbeat else 0
        self._sock.sendall(
            encode_method(
                0, commands.Connection.TuneOk(channel_max=1, frame_max=self.frame_max, heartbeat=self.heartbeat)
            )
            + encode_method(0, commands.Connection.Open(virtual_host=self.vhost))
        )
        answer = self._method(deadline)
        if not isinstance(answer, commands.Connection.OpenOk):
            raise ConnectionClosed(505, f"expected connection.open-ok, got {answer.name}")
        self._call(commands.Channel.Open(), commands.Channel.OpenOk)
        self._call(commands.Confirm.Select(), commands.Confirm.SelectOk)

    # -- the API --------------------------------------------------------------------------------

    def declare_queue(
        self, name: str, durable: bool = True, arguments: Mapping[str, Any] | None = None, auto_delete: bool = False
    ) -> str:
        """Declare a queue (``""`` for a server-named one); return its name."""
        method = queue_declare(name, durable, arguments, auto_delete)
        ok = self._call(method, commands.Queue.DeclareOk, remember=True)
        return str(ok.queue)

    def declare_exchange(
        self,
        name: str,
        exchange_type: str = "direct",
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Declare an exchange."""
        self._call(
            exchange_declare(name, exchange_type, durable, auto_delete, internal, arguments),
            commands.Exchange.DeclareOk,
            remember=True,
        )

    def bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: Mapping[str, Any] | None = None
    ) -> None:
        """Bind ``queue`` to ``exchange``."""
        self._call(queue_bind(queue, exchange, routing_key, arguments), commands.Queue.BindOk, remember=True)

    def bind_exchange(
        self, destination: str, source: str, routing_key: str = "", arguments: Mapping[str, Any] | None = None
    ) -> None:
        """Bind exchange ``destination`` to exchange ``source`` (``exchange.bind``, RabbitMQ's extension)."""
        method = exchange_bind(destination, source, routing_key, arguments)
        self._call(method, commands.Exchange.BindOk, remember=True)

    def publish_nowait(self, exchange: str, routing_key: str, body: bytes, **options: Any) -> int:
        """Send a publish without waiting; return its confirm sequence number (see :meth:`wait_confirms`).

        Options are those of :func:`publish_frames`: ``headers``, ``persistent`` (default true),
        ``mandatory``, ``basic_properties`` and any ``Basic.Properties`` field.
        """
        frames = publish_frames(exchange, routing_key, body, self.frame_max, **options)
        if self._batch is None:
            self._send(frames)
        else:
            self._batch.append(frames)
            self._batched += len(frames)
            if self._batched >= BATCH_BYTES:
                self._flush()
        self._publish_seq += 1
        return self._publish_seq

    def _flush(self) -> None:
        """Send the publishes :meth:`publish_batch` has gathered, in one write."""
        if self._batch:
            data = b"".join(self._batch)
            self._batch.clear()
            self._batched = 0
            self._send(data)

    def wait_confirms(self, upto: int | None = None, timeout: float | None = None) -> None:
        """Wait until every publish up to ``upto`` (default: all) is confirmed.

        :raises PublishNacked: the broker refused one of them
        :raises PublishReturned: a mandatory one could not be routed
        """
        upto = self._publish_seq if upto is None else upto
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while self._confirmed < upto:
            self._next(deadline)
        if self._returned:
            returned = self._returned.pop(0)
            self._returned.clear()
            raise returned
        nacked = sorted(tag for tag in self._nacked if tag <= upto)
        if nacked:
            self._nacked.difference_update(nacked)
            raise PublishNacked(0, f"the broker refused publish(es) {nacked}")

    def publish(self, exchange: str, routing_key: str, body: bytes, **options: Any) -> None:
        """Publish and wait for the broker's confirm (persistent by default).

        :raises PublishNacked: the broker refused it
        :raises PublishReturned: ``mandatory=True`` and no queue was bound to receive it
        """
        try:
            self.wait_confirms(self.publish_nowait(exchange, routing_key, body, **options))
        except (OSError, ConnectionClosed):
            if not self.reconnect:
                raise
            # Unconfirmed: publish again on a new connection (at least once).
            self._reconnect()
            self.wait_confirms(self.publish_nowait(exchange, routing_key, body, **options))

    def publish_batch(self, messages: Iterable[tuple[str, str, bytes]], window: int = 1000, **options: Any) -> int:
        """Publish ``(exchange, routing_key, body)`` triples with at most ``window`` unconfirmed; return the count.

        Sending pauses when ``window`` publishes are unconfirmed and goes on once half of them
        are. When the connection drops (and ``reconnect`` is on), the unconfirmed ones are
        published again on the new connection, as :meth:`publish` does (at least once).

        :raises PublishNacked: the broker refused one of them (those before it are confirmed)
        :raises PublishReturned: a mandatory one could not be routed
        """
        source = iter(messages)
        window = max(window, 1)
        self._batch, self._batched = [], 0  # publishes go out together, a write per BATCH_BYTES
        try:
            return self._publish_all(source, window, options)
        finally:
            self._batch, self._batched = None, 0

    def _publish_all(self, source: Iterator[tuple[str, str, bytes]], window: int, options: dict[str, Any]) -> int:
        """:meth:`publish_batch`'s loop; publishes gathered in :attr:`_batch` are sent before
        each wait for confirms."""
        pending: deque[tuple[int, tuple[str, str, bytes]]] = deque()  # sent, unconfirmed, in order
        backlog: deque[tuple[str, str, bytes]] = deque()  # to send (again) before anything new
        count = 0
        exhausted = False
        while True:
            try:
                while pending and pending[0][0] <= self._confirmed:
                    pending.popleft()
                while backlog:
                    pending.append((self.publish_nowait(*backlog[0], **options), backlog[0]))
                    backlog.popleft()
                if len(pending) >= window or (exhausted and pending):
                    self._flush()
                    self.wait_confirms(pending[-1][0] if exhausted else pending[len(pending) - window // 2 - 1][0])
                    continue
                if exhausted:
                    return count
                triple = next(source, None)
                if triple is None:
                    exhausted = True
                    continue
                count += 1
                backlog.append(triple)
            except (OSError, ConnectionClosed):
                if not self.reconnect:
                    raise
                self._batch = []  # unsent: published again from pending
                self._batched = 0
                self._reconnect()
                backlog = deque([triple for _seq, triple in pending] + list(backlog))
                pending.clear()

    def get(self, queue: str) -> Message | None:
        """Take one message from ``queue`` (to be acked), or ``None`` when it is empty."""
        self._send(encode_method(1, named(commands.Basic.Get, queue=queue)))
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._method(deadline)
            if isinstance(answer, commands.Basic.GetOk):
                self._got.remaining = answer.message_count
                return self._got
            if isinstance(answer, commands.Basic.GetEmpty):
                return None

    def consume(
        self,
        queue: str,
        prefetch: int = 100,
        timeout: float | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> Iterator[Message]:
        """Deliveries from ``queue`` as they come; each must be acked, nacked or rejected.

        :param prefetch: at most this many unacknowledged at once
        :param timeout: stop (end the iteration) after this many seconds without a delivery
        :param arguments: the consumer arguments (a stream's ``x-stream-offset`` and
            ``x-stream-consumer-name``: after a reconnect, a named subscription resumes after
            what was acknowledged)
        """
        tag = self._subscribe(queue, prefetch, arguments)
        try:
            while tag in self._consumers:
                if self._deliveries:
                    yield self._deliveries.popleft()
                    continue
                deadline = time.monotonic() + (timeout if timeout is not None else 3600 * 24 * 365)
                try:
                    self._next(deadline)
                except Timeout:
                    return
                except (OSError, ConnectionClosed):
                    if not self.reconnect:
                        raise
                    self._reconnect()
                    self._consumers.pop(tag, None)
                    tag = self._subscribe(queue, prefetch, arguments)
        finally:
            if self._closed is None and tag in self._consumers:
                self._consumers.pop(tag, None)
                # Ending the loop must not raise for a connection that is already gone.
                with contextlib.suppress(OSError, ConnectionClosed):
                    self._call(commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk)

    def _subscribe(self, queue: str, prefetch: int, arguments: Mapping[str, Any] | None = None) -> str:
        self._call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        consume = named(commands.Basic.Consume, queue=queue, arguments=dict(arguments or {}))
        ok = self._call(consume, commands.Basic.ConsumeOk)
        tag = str(ok.consumer_tag)
        self._consumers[tag] = queue
        return tag

    def recover(self) -> None:
        """Give back every message fetched but not yet acked on this connection (they go back to
        their queues in order, marked redelivered)."""
        self._call(commands.Basic.Recover(requeue=True), commands.Basic.RecoverOk)

    def close(self) -> None:
        """Close the connection politely."""
        if self._closed is None:
            try:
                self._call(
                    commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
                    commands.Connection.CloseOk,
                    0,
                )
            except ClientError:
                pass
            self._closed = ConnectionClosed(320, "closed by the client")
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

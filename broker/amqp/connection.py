"""The server side of one AMQP 0-9-1 connection, without I/O.

:meth:`ServerConnection.receive_data` takes bytes from the peer; :meth:`ServerConnection.data_to_send`
returns the bytes to write. In between, frames are split, methods decoded and carried out on
the node's virtual hosts. The shell (``broker.server.protocol``) moves bytes and runs timers; it
calls :meth:`ServerConnection.tick` for heartbeats and :meth:`ServerConnection.connection_lost`
when the socket goes.

Life cycle (AMQP 0-9-1 §2.2.4, RabbitMQ's handshake)::

    header -> start / start-ok -> tune / tune-ok -> open / open-ok -> OPEN -> close / close-ok

Errors: a :class:`ChannelException` with a soft reply code closes its channel
(``channel.close``, then every frame on that channel is dropped until ``channel.close-ok``;
a ``channel.close`` crossing ours is answered with ``close-ok`` and the channel stays closing);
any hard reply code closes the connection (``connection.close``, then every frame but
``connection.close``/``close-ok`` is dropped). Which codes are hard is the spec's choice
(§1.2, "Constants"), the same as RabbitMQ's.

Closing as RabbitMQ closes: after the client's ``connection.close`` the connection is released
and answered with ``close-ok``, and then it *lingers*: the socket stays open, further input is
read and dropped (another ``connection.close`` is answered again), until the client hangs up
or the shell's linger timer ends it. After the client's ``close-ok`` to our ``connection.close``
the socket is closed at once.

Reply texts are built from client data (names); :func:`reply_text` makes them valid UTF-8 and
at most a short string long, whatever those names hold.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pamqp import commands
from pamqp.base import Frame

from postroom.broker.amqp import handshake
from postroom.broker.amqp.channel import CONTENT_METHODS, QUEUE_SHORTCUT_METHODS, ChannelState
from postroom.broker.amqp.confirms import Confirms
from postroom.broker.amqp.consuming import Consuming
from postroom.broker.amqp.seams import State
from postroom.broker.core.access import Access
from postroom.broker.core.entry import Queue
from postroom.broker.core.node import RESOURCE_ALARMS, Node
from postroom.broker.core.sockets import SocketDetails
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.errors import (
    AMQPError,
    ChannelCrash,
    ChannelException,
    ConnectionDropped,
    ConnectionException,
    ReplyCode,
)
from postroom.broker.wire.codec import (
    BASIC_ACK,
    BASIC_CLASS,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    channel_open_ok_method,
    decode_ack,
    decode_method,
    decode_publish,
    encode_method,
    erlang_binary,
    split_names,
)

#: Reply codes that close the connection rather than the channel (AMQP 0-9-1 §1.2).
HARD_ERRORS = frozenset(
    {
        ReplyCode.CONNECTION_FORCED,
        ReplyCode.INVALID_PATH,
        ReplyCode.FRAME_ERROR,
        ReplyCode.SYNTAX_ERROR,
        ReplyCode.COMMAND_INVALID,
        ReplyCode.CHANNEL_ERROR,
        ReplyCode.UNEXPECTED_FRAME,
        ReplyCode.RESOURCE_ERROR,
        ReplyCode.NOT_ALLOWED,
        ReplyCode.NOT_IMPLEMENTED,
        ReplyCode.INTERNAL_ERROR,
    }
)

_frame_head = struct.Struct(">BHI")
_unpack_head = _frame_head.unpack_from
_method_index = struct.Struct(">I")
_body_size = struct.Struct(">Q")
_PUBLISH_ID = _method_index.pack(BASIC_PUBLISH)
_ACK_ID = _method_index.pack(BASIC_ACK)
_ack_args = struct.Struct(">QB")  # basic.ack: delivery tag, multiple
#: A ``basic.ack`` frame's length: frame head, method id, its arguments, frame end.
_ACK_FRAME_BYTES = 7 + 4 + _ack_args.size + 1
_CLOSE_ID = _method_index.pack(0x000A0032)  # connection.close
_CLOSE_OK_ID = _method_index.pack(0x000A0033)  # connection.close-ok
_CLOSE_OK = encode_method(0, commands.Connection.CloseOk())

#: Message bytes of replies (``basic.get-ok``, ``basic.return``) one read of the client's input
#: may produce before the rest of that input waits for them to be written (deliveries have
#: their own bound: they stop while the socket's buffer is full).
REPLY_BOUND = 4 << 20
_CHANNEL_OPEN = 0x0014000A
#: A content header's class (basic) and weight (0), as every valid one starts.
_BASIC_WEIGHT_0 = b"\x00\x3c\x00\x00"
#: Frame types RabbitMQ can tell apart; any other is 501 ``unknown_frame``.
_FRAME_TYPES = frozenset({FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT})
_CHANNEL_CLOSE = 0x00140028
_CHANNEL_CLOSE_OK = 0x00140029

#: RabbitMQ accepts a frame whose *payload* is frame_max bytes (8 more than the spec's total;
#: its ?FRAME_SIZE_FUDGE), and clients rely on it: rabbitpy sends body frames of frame_max
#: bytes. Frames the broker sends stay within frame_max in total, as RabbitMQ's do.

#: Seconds before the socket of a handshake refused without connection.close is closed
#: (RabbitMQ's ?SILENT_CLOSE_DELAY: a client may not retry bad handshakes in a tight loop).
SILENT_CLOSE_DELAY = 3.0

#: Decoded (exchange, routing key) pairs kept per connection. Publishers usually reuse a few
#: pairs; the cache is cleared when full, so a publisher cycling through many keys costs
#: one decode per message, as without it.
NAMES_CACHE_SIZE = 1024

#: RabbitMQ's names for the connection states, as its reply texts show them.
_RABBITMQ_STATES = {
    State.AWAIT_START_OK: "starting",
    State.AUTHENTICATING: "starting",
    State.AWAIT_TUNE_OK: "tuning",
    State.AWAIT_OPEN: "opening",
    State.OPEN: "running",
}


_HANDSHAKE_STATES = frozenset({State.AWAIT_START_OK, State.AUTHENTICATING, State.AWAIT_TUNE_OK, State.AWAIT_OPEN})


class ServerConnection:
    """One client connection's protocol state.

    :param node: the broker node (virtual hosts, users, limits)
    :param loopback: whether the peer connects from a loopback address
    :param peer: a printable peer address, for logs and the management API
    :param certificate_name: on a TLS connection, a function giving the name in the client's
        verified certificate (its common names, joined by commas; ``""`` when it has none;
        ``None`` when the client presented no certificate); ``None`` on a plain connection
    """

    def __init__(
        self,
        node: Node,
        loopback: bool = True,
        peer: str = "",
        certificate_name: Callable[[], str | None] | None = None,
    ) -> None:
        self.node = node
        self.loopback = loopback
        self.peer = peer
        self.certificate_name = certificate_name
        self.state = State.AWAIT_HEADER
        self.out: list[bytes] = []
        self.dirty = False
        self.writable = True
        #: Bytes read and not handled yet: a frame not complete, or what came while the login
        #: was being checked.
        self.pending = b""
        self._names_cache: dict[bytes, tuple[str, str]] = {}
        #: The last publish read by the fast path, when a body frame followed: its method and
        #: content header frames' bytes, the body frame's header, and what was read of them
        #: (names, decoded names, bits, header, body size). A publish whose bytes start the
        #: same is read without parsing them again.
        self._last_publish: tuple[bytes, bytes, bytes, tuple[str, str], int, bytes, int] | None = None
        limits = node.limits
        self.frame_max = limits.frame_max
        self.channel_max = limits.channel_max
        self.heartbeat = 0
        self.channels: dict[int, ChannelState] = {}
        #: Channels we closed, until the client's close-ok: the last queue each had declared
        #: (RabbitMQ still expands an empty queue name on a closing channel, and refuses it
        #: with another close when there is none).
        self._closing_channels: dict[int, str | None] = {}
        self.confirming: list[Confirms] = []
        self.exclusive_queues: list[Queue] = []
        self.capabilities: dict[str, Any] = {}
        self.client_properties: dict[str, Any] = {}
        self.user_name = ""
        #: The user the login found (``broker.core.node.User``); ``None`` until then.
        self.user: Any = None
        self.vhost: VirtualHost = None  # type: ignore[assignment]  # set by connection.open
        #: The user's permissions on the vhost (``None``: everything is allowed), from connection.open.
        self.access: Access | None = None
        #: Set when the connection is over; the shell closes the socket after writing, unless the
        #: state is ``LINGERING`` (the client closed: it hangs up, the shell's timer bounds the wait).
        self.closed = False
        #: Errors raised by a teardown step (releasing a channel, a queue): the other steps
        #: still ran; the shell logs these once, with the connection's name.
        self.teardown_errors: list[BaseException] = []
        #: Seconds the shell waits before closing the socket of a silently refused handshake.
        self.silent_close_delay = 0.0
        #: Why the connection failed, for the shell to log once.
        self.error: AMQPError | None = None
        self._received_since_tick = False
        self._sent_since_tick = False
        self._silent_ticks = 0
        #: The node's resource alarms (one shared set: see :meth:`Node.set_alarm`).
        self._alarms = node.alarms
        #: Blocked by a resource alarm after a publish: the shell reads nothing more until it
        #: clears (bytes already read wait in ``_pending``).
        self.blocked = False
        self._blocked_sent = False
        #: Message bytes queued in replies (``basic.get-ok``, ``basic.return``) since the shell
        #: last took the output. Over :data:`REPLY_BOUND`, frames are read no further
        #: (``replies_held``) until the shell has written them and the client has read enough.
        self.replied_bytes = 0
        self.replies_held = False
        #: How it logged in, when it connected (milliseconds since the epoch), and what the
        #: shell counts of its socket: bytes and socket reads and writes each way, and the
        #: socket's details (:class:`SocketDetails`), for the management API.
        self.auth_mechanism = ""
        self.connected_at = 0
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.socket: SocketDetails | None = None

    # -- resource alarms ----------------------------------------------------------------------

    def _block(self) -> None:
        """A publish arrived while an alarm is in force: stop reading, and say why to a client
        that has the ``connection.blocked`` capability (RabbitMQ's ``maybe_block``)."""
        self.blocked = True
        self._tell_blocked()

    def _tell_blocked(self) -> bool:
        """Tell a blocked client, once, that a resource alarm blocks it (not the log's backlog)."""
        if (
            not self._blocked_sent
            and self._alarms & RESOURCE_ALARMS
            and self.capabilities.get("connection.blocked") is True
        ):
            self.out.append(encode_method(0, commands.Connection.Blocked(reason=self.node.alarm_text())))
            self._blocked_sent = True
            return True
        return False

    def set_access(self, access: Access | None) -> None:
        """The user's permissions on this connection's vhost changed (``broker.core.admin``):
        every channel checks by them from its next operation on."""
        self.access = access
        for channel in self.channels.values():
            channel.access_changed()

    def alarm_changed(self) -> None:
        """The node's alarms changed: once none is left, a blocked connection reads again
        (``connection.unblocked`` to a client that was told it was blocked). While only the
        log's backlog holds it, a client that was told is told it is unblocked, and is not read."""
        if not self.blocked:
            return
        told = self._tell_blocked()
        if self._blocked_sent and not self._alarms & RESOURCE_ALARMS:
            self.out.append(encode_method(0, commands.Connection.Unblocked()))
            self._blocked_sent = False
            told = True
        if not self._alarms:
            self.blocked = False
            told = True
        if told:
            self.node.mark_dirty(self)  # the shell writes (and, unblocked, reads again from what it holds)

    # -- I/O ----------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call (then forgotten)."""
        for confirms in self.confirming:
            confirms.flush()
        self.confirming.clear()
        out = self.out
        self.dirty = False
        if not out:
            return b""
        self._sent_since_tick = True
        self.replied_bytes = 0
        data = b"".join(out)
        out.clear()
        return data

    def receive_data(self, data: bytes) -> None:
        """Take bytes from the peer and act on every complete frame in them.

        The common case, a ``basic.publish`` followed by its content header and a single body
        frame all present in the buffer, is recognised and handled in one step without
        building intermediate objects (:meth:`_content`); everything else goes frame by
        frame through :meth:`_frame`. So is a single ``basic.ack`` (a consumer acking one
        message at a time): its delivery is taken at once (:meth:`_fast_acks`), and the acks of
        one read are settled together, before any other frame is handled and before this
        returns (see :meth:`Consuming.hold_ack`).
        """
        framed = self._framed_input(data)
        if framed is None:
            return
        holding: list[Consuming] = []  # channels holding acks of this read (see Consuming.hold_ack)
        try:
            pos = self._read_frames(framed, holding)
        except _LostSync as error:
            self._lose_sync(error, holding)
            return
        except ConnectionException as error:
            self._fail_read(error, holding)
            return  # (the connection is closing or closed: the rest of the read is not kept)
        self._keep_rest(framed, pos)

    def _framed_input(self, data: bytes) -> bytes | None:
        """What of ``data`` (after what was kept from earlier reads) is frames to read now;
        ``None`` when nothing is to be read now: the connection is over (lingering, it reads
        ``data`` for a ``connection.close``), the shell should have stopped reading (``data``
        is kept for later), the protocol header is incomplete or wrong, or a login is being
        checked (``data`` waits for it)."""
        if self.closed:
            if self.state is State.LINGERING:
                self._linger(data)
            return None
        self._received_since_tick = True
        if self.pending:
            data = self.pending + data
            self.pending = b""
        if self.blocked or self.replies_held:  # read before the shell stopped reading: kept for later
            self.pending = data
            return None
        if self.state is State.AWAIT_HEADER:
            if len(data) < 8:
                if not PROTOCOL_HEADER.startswith(data[:4]):
                    self._refuse_header()
                else:
                    self.pending = data
                return None
            if data[:8] != PROTOCOL_HEADER:
                self._refuse_header()
                return None
            data = data[8:]
            handshake.start(self)
        if self.state is State.AUTHENTICATING:
            self._hold(data)
            return None
        return data

    def _read_frames(self, data: bytes, holding: list[Consuming]) -> int:
        """Act on the complete frames of ``data``, in order, until the read must stop; where
        the frames not acted on start.

        :param holding: the channels holding acks of this read, settled before any other
            frame is acted on and before this returns
        :raises _LostSync: the next frame cannot be found
        :raises ConnectionException: a frame closes the connection
        """
        pos = 0
        total = len(data)
        unpack = _unpack_head
        alarms = self._alarms
        not_open: _NotOpen | None = None  # a method on a channel not open, failing at the end (see _NotOpen)
        while total - pos >= FRAME_OVERHEAD:
            frame_type, channel_id, size = unpack(data, pos)
            end = pos + 7 + size
            if size > self.frame_max:  # the payload, as RabbitMQ counts it (see FRAME_SIZE_FUDGE)
                raise _LostSync(
                    f"{_frame_text(frame_type, b'')}: {{frame_too_large,{size},{self.frame_max - FRAME_OVERHEAD}}}"
                )
            if end >= total:
                break
            if data[end] != FRAME_END:
                raise _LostSync(
                    f"{_frame_text(frame_type, data[pos + 7 : end])}: {{invalid_frame_end_marker,{data[end]}}}"
                )
            # (During an alarm, publishes go frame by frame: RabbitMQ blocks after the header.)
            if frame_type == FRAME_METHOD and not alarms and data.startswith(_PUBLISH_ID, pos + 7):
                channel = self.channels.get(channel_id)
                if channel is not None and channel._publish is None:
                    # -- fast path: publish + header + one body frame, all in the buffer --
                    body: bytes | None = None
                    last = self._last_publish
                    if last is not None and data.startswith(last[0], pos):
                        # The same method and content header as the last publish read here:
                        # only the body frame is new (and the header's bytes are shared).
                        prefix, body_head, names, decoded, bits, header, body_size = last
                        next_pos = pos + len(prefix)
                        b_end = next_pos + 7 + body_size
                        if b_end < total and data.startswith(body_head, next_pos) and data[b_end] == FRAME_END:
                            body = data[next_pos + 7 : b_end]
                            next_pos = b_end + 1
                    if body is None:
                        content = self._content(data, pos, end, total, channel_id)
                        if content is not None:
                            next_pos, names, decoded, bits, header, body = content
                    if body is not None:
                        pos = next_pos
                        if holding:  # the acks before it settle first
                            self._settle_held(holding)
                        try:
                            channel.publish(decoded[0], decoded[1], bits, names, header, body)
                        except ChannelException as error:
                            self._channel_error(channel_id, error)
                        if self.closed:
                            break
                        if self.replied_bytes > REPLY_BOUND:  # mandatory returns
                            self.replies_held = True
                            break
                        continue
            if frame_type == FRAME_METHOD and size == 13 and data.startswith(_ACK_ID, pos + 7):
                channel = self.channels.get(channel_id)
                if channel is not None and channel._publish is None and not channel.transactional:
                    acked = self._fast_acks(channel, channel_id, data, pos, total, holding)
                    if acked:
                        pos = acked
                        if self.closed:
                            break
                        continue
            if holding:  # any other frame comes after the acks settle
                self._settle_held(holding)
            payload = data[pos + 7 : end]
            pos = end + 1
            if not_open is not None and channel_id == not_open.channel_id:
                continue  # (that channel's next frames go where its first did)
            try:
                self._frame(frame_type, channel_id, payload)
            except _NotOpen as error:
                if not_open is None:
                    error.channel_id, not_open = channel_id, error
                continue
            # A login may have begun in the frame just handled (the state changed behind mypy's back).
            if self.closed or self.state is State.AUTHENTICATING:
                break
            if alarms and channel_id and (frame_type == FRAME_HEADER or frame_type == FRAME_BODY):
                self._block()  # as RabbitMQ: after a content frame (its header), once an alarm is in force
                break
            if self.replied_bytes > REPLY_BOUND:
                self.replies_held = True
                break
        if holding:
            self._settle_held(holding)
        if not_open is not None:
            raise not_open
        return pos

    def _content(
        self, data: bytes, pos: int, end: int, total: int, channel_id: int
    ) -> tuple[int, bytes, tuple[str, str], int, bytes, bytes] | None:
        """The message of the ``basic.publish`` frame at ``pos`` in ``data`` (of ``total``
        bytes; its frame end at ``end``) on channel ``channel_id``, when its content header and
        a single body frame follow it: where the frames after them start, its names (the
        exchange and routing key as the method carried them, and decoded), its bits, content
        header and body; ``None`` when they are not all there (the frames then go one by one).
        A publish with a body is remembered as the last one read (see ``_last_publish``).
        """
        h_pos = end + 1
        if total - h_pos < FRAME_OVERHEAD:
            return None
        h_type, h_channel, h_size = _unpack_head(data, h_pos)
        h_end = h_pos + 7 + h_size
        frame_max = self.frame_max
        if not (
            h_type == FRAME_HEADER
            and h_channel == channel_id
            and h_end < total
            and h_size >= 14
            and data.startswith(_BASIC_WEIGHT_0, h_pos + 7)
            and h_size <= frame_max
            and data[h_end] == FRAME_END
        ):
            return None
        header = data[h_pos + 7 : h_end]
        body_size = _body_size.unpack_from(header, 4)[0]
        next_pos = h_end + 1
        body: bytes | None = None
        if body_size == 0:
            body = b""
        elif total - next_pos >= FRAME_OVERHEAD:
            b_type, b_channel, b_size = _unpack_head(data, next_pos)
            b_end = next_pos + 7 + b_size
            if (
                b_type == FRAME_BODY
                and b_channel == channel_id
                and b_size == body_size
                and b_end < total
                and b_size <= frame_max
                and data[b_end] == FRAME_END
            ):
                body = data[next_pos + 7 : b_end]
                next_pos = b_end + 1
        names_end = pos + 14 + data[pos + 13]
        if body is None or names_end >= end or names_end + 2 + data[names_end] != end:
            return None
        names_end += 1 + data[names_end]
        names = data[pos + 13 : names_end]
        bits = data[names_end]
        decoded = self._names_cache.get(names)
        if decoded is None:
            decoded = self._decode_names(names)
        if body_size:
            head = data[pos : h_end + 1]
            self._last_publish = (head, data[h_end + 1 : h_end + 8], names, decoded, bits, header, body_size)
        return next_pos, names, decoded, bits, header, body

    def _fast_acks(
        self, channel: ChannelState, channel_id: int, data: bytes, pos: int, total: int, holding: list[Consuming]
    ) -> int:
        """Take the single ``basic.ack`` at ``pos`` in ``data`` (of ``total`` bytes) on
        ``channel`` (number ``channel_id``; a consumer's acks come one per message), and the
        same channel's single acks right behind it: where the frames after them start; 0 when
        the one at ``pos`` is not a single ack (``multiple`` set). Their channel joins
        ``holding`` until the acks settle.
        """
        tag, bits = _ack_args.unpack_from(data, pos + 11)
        if bits:
            return 0
        head = data[pos : pos + 11]  # its frame's head and method: the next acks' too
        consuming = channel.consuming
        hold = consuming.hold_ack
        pos += _ACK_FRAME_BYTES
        try:
            if hold(tag):
                holding.append(consuming)
            # The same channel's single acks right behind it are taken here.
            while data.startswith(head, pos) and pos + _ACK_FRAME_BYTES <= total:
                tag, bits = _ack_args.unpack_from(data, pos + 11)
                if bits or data[pos + _ACK_FRAME_BYTES - 1] != FRAME_END:
                    break  # (the frame loop reads it as any other frame)
                pos += _ACK_FRAME_BYTES
                if hold(tag):
                    holding.append(consuming)
        except ChannelException as error:
            self._settle_held(holding)
            if not error.class_id:
                error.class_id, error.method_id = BASIC_CLASS, BASIC_ACK & 0xFFFF
            self._channel_error(channel_id, error)
        return pos

    def _lose_sync(self, error: _LostSync, holding: list[Consuming]) -> None:
        """The next frame cannot be found: RabbitMQ sends its close, reads nothing more and
        closes the socket after its silent-close delay."""
        try:
            self._settle_held(holding)
        finally:  # the connection fails whatever settling met
            self.fail(error)
            self.finish()
        self.silent_close_delay = SILENT_CLOSE_DELAY

    def _fail_read(self, error: ConnectionException, holding: list[Consuming]) -> None:
        """A frame of the read closes the connection: the acks taken before it settle first."""
        try:
            self._settle_held(holding)
        finally:
            self.fail(error)

    def _keep_rest(self, data: bytes, pos: int) -> None:
        """After the frames read: the rest of ``data`` from ``pos``, read on later (a frame not
        complete yet, what came while a login is checked or the shell is to stop reading), or
        read for a ``connection.close`` once the connection lingers."""
        if self.state is State.LINGERING:
            if pos < len(data):  # what came after the client's connection.close, in the same read
                self._linger(data[pos:])
            return
        if self.state is State.CLOSING or self.closed:
            return
        if self.state is State.AUTHENTICATING:
            self._hold(data[pos:])
        elif pos < len(data):
            self.pending = data[pos:]

    @staticmethod
    def _settle_held(holding: list[Consuming]) -> None:
        """Settle the acks the channels of ``holding`` took since the last settlement."""
        for consuming in holding:
            consuming.settle_held()
        holding.clear()

    def _hold(self, data: bytes) -> None:
        """Keep what arrives while the login is checked, up to a frame's worth (a client has
        no reason to send more before ``connection.tune``)."""
        if len(data) > self.frame_max + FRAME_OVERHEAD:
            self.fail(ConnectionException(ReplyCode.FRAME_ERROR, "too much data before connection.tune"))
            return
        self.pending = data

    def _linger(self, data: bytes) -> None:
        """After our ``close-ok``: drop input, but answer every further ``connection.close`` (RabbitMQ)."""
        data = self.pending + data
        pos = 0
        total = len(data)
        while total - pos >= FRAME_OVERHEAD:
            frame_type, channel_id, size = _frame_head.unpack_from(data, pos)
            if size > self.frame_max:
                self.state = State.CLOSED  # not framed any more: close the socket
                self.pending = b""
                return
            end = pos + 7 + size
            if end >= total:
                break
            if frame_type == FRAME_METHOD and channel_id == 0:
                if data.startswith(_CLOSE_ID, pos + 7):
                    self.out.append(_CLOSE_OK)
                elif data.startswith(_CLOSE_OK_ID, pos + 7):
                    self.state = State.CLOSED  # the client is done: close the socket now
                    self.pending = b""
                    return
            pos = end + 1
        self.pending = data[pos:]

    def _decode_names(self, names: bytes) -> tuple[str, str]:
        """Decode an exchange/routing-key pair and remember it (publishers reuse a few pairs)."""
        decoded = split_names(names)
        cache = self._names_cache
        if len(cache) >= NAMES_CACHE_SIZE:
            cache.clear()
        cache[names] = decoded
        return decoded

    def _refuse_header(self) -> None:
        """A wrong protocol header: answer with ours and close (AMQP 0-9-1 §4.2.2)."""
        self.out.append(PROTOCOL_HEADER)
        self.error = ConnectionException(ReplyCode.FRAME_ERROR, "bad protocol header")
        self.closed = True
        self.state = State.CLOSED

    def _frame(self, frame_type: int, channel_id: int, payload: bytes) -> None:
        """Act on one frame.

        :raises ConnectionException: for errors that close the connection.
        """
        state = self.state
        if state is State.CLOSING:
            if frame_type == FRAME_METHOD and channel_id == 0:
                method = decode_method(payload, 0)
                if isinstance(method, commands.Connection.CloseOk):
                    self.finish()
                elif isinstance(method, commands.Connection.Close):
                    self.out.append(encode_method(0, commands.Connection.CloseOk()))
                    self.finish()
            return
        if (
            frame_type not in _FRAME_TYPES
            or (frame_type == FRAME_HEARTBEAT and payload)
            or (frame_type == FRAME_METHOD and len(payload) < 4)
            or (frame_type == FRAME_HEADER and len(payload) < 12)
        ):  # RabbitMQ cannot tell what this is: 501, and the framing still holds
            raise ConnectionException(ReplyCode.FRAME_ERROR, f"{_frame_text(frame_type, payload)}: unknown_frame")
        if channel_id:
            if state is not State.OPEN:
                raise ConnectionException(
                    ReplyCode.CHANNEL_ERROR, f"frame on channel {channel_id} before connection.open"
                )
            if frame_type == FRAME_HEARTBEAT:
                raise ConnectionException(ReplyCode.UNEXPECTED_FRAME, _frame_text(frame_type, payload))
            if channel_id in self._closing_channels:
                self._closing_channel_frame(frame_type, channel_id, payload)
                return
            channel = self.channels.get(channel_id)
            try:
                if frame_type == FRAME_METHOD:
                    index = _method_index.unpack_from(payload)[0]
                    if channel is None:
                        self._open_channel(channel_id, decode_method(payload))
                        return
                    if channel.expecting_content:
                        part = "body" if channel.expecting_body else "header for class 60"
                        kind = "body" if channel.expecting_body else "header"
                        raise ConnectionException(
                            ReplyCode.UNEXPECTED_FRAME,
                            f"expected content {part}, got non content {kind} frame instead",
                            BASIC_CLASS,
                            40,
                        )
                    if index == BASIC_PUBLISH:
                        channel.on_publish(*decode_publish(payload))
                    elif index == BASIC_ACK:
                        tag, bits = decode_ack(payload)
                        channel.consuming.on_ack(tag, bool(bits & 1))
                    elif index == BASIC_NACK:
                        tag, bits = decode_ack(payload)
                        channel.consuming.on_nack(tag, bool(bits & 1), bool(bits & 2))
                    elif index == BASIC_REJECT:
                        tag, bits = decode_ack(payload)
                        channel.consuming.on_nack(tag, False, bool(bits & 1))
                    else:
                        self._channel_method(channel, decode_method(payload))
                elif channel is None:
                    raise ConnectionException(
                        ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
                    )
                elif frame_type == FRAME_HEADER:
                    channel.on_header(payload)
                else:
                    channel.on_body(payload)
            except ChannelException as error:
                if not error.class_id and frame_type == FRAME_METHOD:
                    error.class_id, error.method_id = payload[0] << 8 | payload[1], payload[2] << 8 | payload[3]
                self._channel_error(channel_id, error)
            return
        if frame_type == FRAME_HEARTBEAT:
            return
        if frame_type != FRAME_METHOD:
            raise ConnectionException(ReplyCode.UNEXPECTED_FRAME, _frame_text(frame_type, payload))
        self._connection_method(decode_method(payload, 0))

    def _channel_error(self, channel_id: int, error: ChannelException) -> None:
        """A channel-level exception: close the channel, or the connection for a hard reply code."""
        if error.reply_code in HARD_ERRORS:
            raise ConnectionException(error.reply_code, error.reply_text, error.class_id, error.method_id) from error
        self._close_channel(channel_id, error)

    def _channel_method(self, channel: ChannelState, method: Frame) -> None:
        if isinstance(method, commands.Channel.Close):
            del self.channels[channel.id]
            self.node.counters["channels_closed"] += 1
            self._release_channel(channel)
            self.out.append(encode_method(channel.id, commands.Channel.CloseOk()))
            return
        if isinstance(method, commands.Channel.CloseOk):  # nothing was closing: RabbitMQ's 503
            raise ConnectionException(ReplyCode.COMMAND_INVALID, "unexpected 'channel.close-ok'", 20, 41)
        if isinstance(method, commands.Channel.Open):
            raise ConnectionException(ReplyCode.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        try:
            channel.handle_method(method)
        except AMQPError as error:
            if not error.class_id and not isinstance(error, ChannelCrash):
                error.class_id = method.index >> 16
                error.method_id = method.index & 0xFFFF
            raise

    def _open_channel(self, channel_id: int, method: Frame) -> None:
        """A method on a channel not open: ``channel.open`` opens it; anything else is refused as
        RabbitMQ refuses it, by the new channel (which has no queue declared yet, so an empty
        queue name is 404 and closes it) or else with 504 for the connection."""
        if not isinstance(method, commands.Channel.Open):
            ids = method.index >> 16, method.index & 0xFFFF
            if type(method) in CONTENT_METHODS:  # RabbitMQ refuses it once the content is in
                channel = self.channels[channel_id] = ChannelState(self, channel_id)
                self.node.counters["channels_opened"] += 1  # its release counts it closed
                channel.refuse_content(ConnectionException(ReplyCode.CHANNEL_ERROR, "expected 'channel.open'", *ids))
                return
            if type(method) in QUEUE_SHORTCUT_METHODS and not method.queue:  # type: ignore[attr-defined]
                refusal = ChannelException(ReplyCode.NOT_FOUND, "no previously declared queue", *ids)
                self._close_channel(channel_id, refusal)
                return
            raise _NotOpen(*ids)
        # channel_max bounds how many channels are open, not their numbers (RabbitMQ: aiormq opens 65535).
        if len(self.channels) + len(self._closing_channels) >= self.channel_max:
            raise ConnectionException(
                ReplyCode.NOT_ALLOWED,
                f"number of channels opened ({len(self.channels)}) has reached the negotiated channel_max "
                f"({self.channel_max})",
                20,
                10,
            )
        limit = self.user.max_channels
        if limit is not None and 0 <= limit <= self._user_channels():  # (negative: no limit)
            raise ConnectionException(
                ReplyCode.NOT_ALLOWED,
                f"number of channels opened for user '{self.user_name}' has reached the maximum allowed user "
                f"limit of ({limit})",
            )
        self.channels[channel_id] = ChannelState(self, channel_id)
        self.node.counters["channels_opened"] += 1
        self.out.append(channel_open_ok_method(channel_id))

    def _user_channels(self) -> int:
        """Channels open on all of this user's connections (RabbitMQ counts over the node)."""
        return sum(len(connection.channels) for connection in self.node.user_connections.get(self.user_name, ()))

    def _close_channel(self, channel_id: int, error: AMQPError) -> None:
        """Close one channel for ``error``: send channel.close and drop its frames until close-ok."""
        channel = self.channels.pop(channel_id, None)
        if channel is not None:
            self.node.counters["channels_closed"] += 1
            self._release_channel(channel)
        self._closing_channels[channel_id] = channel.last_queue if channel is not None else None
        self.out.append(
            encode_method(
                channel_id,
                commands.Channel.Close(
                    reply_code=int(error.reply_code),
                    reply_text=reply_text(error),
                    class_id=error.class_id,
                    method_id=error.method_id,
                ),
            )
        )

    def _release_channel(self, channel: ChannelState) -> None:
        """Release a channel; an error in it is recorded for the shell, never raised."""
        try:
            channel.release()
        except Exception as error:  # a bug: the rest of the teardown must still run
            self.teardown_errors.append(error)

    def _closing_channel_frame(self, frame_type: int, channel_id: int, payload: bytes) -> None:
        """A frame on a channel we closed: dropped, until the client's ``close-ok`` frees the number.

        A ``channel.close`` crossing ours is answered with ``close-ok``; the channel stays
        closing (RabbitMQ's rule), so the client's own ``close-ok`` that follows is dropped too.
        A method whose empty queue name cannot be expanded is refused with another close.
        """
        if frame_type != FRAME_METHOD or len(payload) < 4:
            return
        index = _method_index.unpack_from(payload)[0]
        if index == _CHANNEL_CLOSE_OK:
            del self._closing_channels[channel_id]
        elif index == _CHANNEL_CLOSE:
            self.out.append(encode_method(channel_id, commands.Channel.CloseOk()))
        elif index == _CHANNEL_OPEN:
            raise ConnectionException(ReplyCode.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        elif self._closing_channels[channel_id] is None and commands.INDEX_MAPPING.get(index) in QUEUE_SHORTCUT_METHODS:
            method = decode_method(payload)
            if not method.queue:  # type: ignore[attr-defined]  # one of QUEUE_SHORTCUT_METHODS
                self._close_channel(
                    channel_id,
                    ChannelException(ReplyCode.NOT_FOUND, "no previously declared queue", index >> 16, index & 0xFFFF),
                )

    # -- connection class -----------------------------------------------------------------------

    def _connection_method(self, method: Frame) -> None:
        state = self.state
        if isinstance(method, commands.Connection.Close):
            self.finish()  # first: releasing channels may still write their last confirms
            self.out.append(_CLOSE_OK)
            self.state = State.LINGERING
            return
        if isinstance(method, commands.Connection.CloseOk) and state is not State.OPEN:
            self.finish()
            return
        if state is State.AWAIT_START_OK and isinstance(method, commands.Connection.StartOk):
            handshake.start_ok(self, method)
        elif state is State.AWAIT_TUNE_OK and isinstance(method, commands.Connection.TuneOk):
            handshake.tune_ok(self, method)
        elif state is State.AWAIT_OPEN and isinstance(method, commands.Connection.Open):
            handshake.open_vhost(self, method)
        elif state is State.OPEN and isinstance(method, commands.Connection.UpdateSecret):
            self.out.append(encode_method(0, commands.Connection.UpdateSecretOk()))
        else:
            # Once open, any other method on channel 0 (a handshake method again, a channel or
            # basic method) is RabbitMQ's 504 CHANNEL_ERROR, with the method's ids.
            raise ConnectionException(
                ReplyCode.CHANNEL_ERROR if state is State.OPEN else ReplyCode.COMMAND_INVALID,
                f"unexpected method in connection state {_RABBITMQ_STATES.get(state, state.value)}",
                method.index >> 16,
                method.index & 0xFFFF,
            )

    # -- closing --------------------------------------------------------------------------------

    def fail(self, error: ConnectionException) -> None:
        """Close the connection for ``error``: send connection.close and wait for close-ok.

        Before ``connection.open`` completes RabbitMQ does not trust the client: it answers only
        a refused login (403, when the client can take it) and a refused vhost (530) with
        ``connection.close``; any other error closes the socket without a word, after
        :attr:`silent_close_delay` seconds, so that a client cannot retry bad handshakes in a loop.
        """
        self.error = error
        if self.state is State.AWAIT_HEADER or self.closed or isinstance(error, ConnectionDropped):
            self.finish()
            return
        if self.state in _HANDSHAKE_STATES and not (
            (self.state is State.AWAIT_START_OK and error.reply_code is ReplyCode.ACCESS_REFUSED)
            or (self.state is State.AWAIT_OPEN and error.reply_code is ReplyCode.NOT_ALLOWED)
        ):
            self.silent_close_delay = SILENT_CLOSE_DELAY
            self.finish()
            return
        self._release()  # first: releasing channels may still write their last confirms
        self.out.append(
            encode_method(
                0,
                commands.Connection.Close(
                    reply_code=int(error.reply_code),
                    reply_text=reply_text(error),
                    class_id=error.class_id,
                    method_id=error.method_id,
                ),
            )
        )
        self.state = State.CLOSING

    def close(self, reply_code: ReplyCode, reply_text: str) -> None:
        """Close the connection from the server side (shutdown, management API)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self.fail(ConnectionException(reply_code, reply_text))
        if not self.dirty:
            self.dirty = True
            self.node.mark_dirty(self)

    def finish(self) -> None:
        self._release()
        self.state = State.CLOSED
        self.closed = True

    def _release(self) -> None:
        """Release channels and exclusive queues (idempotent).

        Every step runs even when an earlier one raised (the error is kept in
        :attr:`teardown_errors` for the shell to log): channels first, so their unacked
        deliveries go back to their queues, then exclusive queues, then the connection's entry.
        """
        channels, self.channels = list(self.channels.values()), {}
        if self in self.node.connections:
            self.node.counters["channels_closed"] += len(channels)
        for channel in channels:  # first: nothing returned below may go to a consumer of this connection
            channel.closing = True
            channel.consuming.active = False
        for channel in channels:
            self._release_channel(channel)
        self.confirming.clear()
        queues, self.exclusive_queues = self.exclusive_queues, []
        for queue in queues:
            if not queue.deleted:
                try:
                    self.vhost.remove_queue(queue)
                except Exception as error:  # a bug: the other queues must still go
                    self.teardown_errors.append(error)
        if self in self.node.connections:
            self.node.connections.discard(self)
            self.vhost.connection_count -= 1
            own = self.node.user_connections.get(self.user_name)
            if own is not None:
                own.discard(self)
                if not own:
                    del self.node.user_connections[self.user_name]
            self.node.counters["connections_closed"] += 1
        self.node.dirty.discard(self)

    def connection_lost(self) -> None:
        """The socket is gone: release everything and requeue unacked deliveries."""
        self._release()
        self.state = State.CLOSED
        self.closed = True

    def set_writable(self, writable: bool) -> None:
        """The socket's buffer is full (``False``) or drained (``True``); deliveries pause meanwhile."""
        self.writable = writable
        for channel in list(self.channels.values()):
            channel.update_active()

    # -- timers ---------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the handshake has completed and the connection is usable."""
        return self.state is State.OPEN

    def tick(self) -> bool:
        """Heartbeat bookkeeping; the shell calls this every ``heartbeat / 2`` seconds.

        Queues a heartbeat frame when nothing was sent since the last tick. Returns ``False``
        when nothing has been received for four ticks (two heartbeat intervals, as in
        RabbitMQ): the peer is dead and the shell drops the socket.
        """
        if self._received_since_tick or self.blocked:  # a blocked client is not read, not dead
            self._silent_ticks = 0
        else:
            self._silent_ticks += 1
        self._received_since_tick = False
        if not self._sent_since_tick:
            self.out.append(HEARTBEAT_FRAME)
        self._sent_since_tick = False
        return self._silent_ticks < 4


class _NotOpen(ConnectionException):
    """A method on a channel that is not open (504 "expected 'channel.open'"). RabbitMQ gives
    it to a new channel process, whose refusal reaches the connection after the frames already
    read behind it: the connection fails once the rest of the read is handled."""

    def __init__(self, class_id: int, method_id: int) -> None:
        super().__init__(ReplyCode.CHANNEL_ERROR, "expected 'channel.open'", class_id, method_id)
        #: The channel it came on.
        self.channel_id = 0


class _LostSync(ConnectionException):
    """A frame whose end cannot be trusted (too large, or not ended by 0xCE): 501, and the
    stream is not read any further."""

    def __init__(self, text: str) -> None:
        super().__init__(ReplyCode.FRAME_ERROR, text)


def _frame_text(frame_type: int, payload: bytes) -> str:
    """RabbitMQ's description of a frame it refuses: ``type 2, all octets = <<0,60>>``."""
    if len(payload) <= 16:
        return f"type {frame_type}, all octets = {erlang_binary(payload)}"
    return f"type {frame_type}, first 16 octets = {erlang_binary(payload[:16])}"


def reply_text(error: AMQPError) -> str:
    """``"CODE_NAME - text"`` as valid UTF-8 of at most 255 bytes, whatever names the text holds.

    Names are decoded with ``surrogateescape``; bytes that are not UTF-8 are written as
    ``\\xNN`` escapes; a text over 255 bytes becomes its first 252 bytes and ``...``, as
    RabbitMQ cuts it (here at a character boundary, so that clients can decode it).
    """
    text = f"{error.reply_code.name} - {error.reply_text}" if error.reply_text else error.reply_code.name
    raw = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace").encode("utf-8")
    if len(raw) > 255:  # RabbitMQ: the first 252 bytes and "..." (here never splitting a character)
        return raw[:252].decode("utf-8", "ignore") + "..."
    return raw.decode("utf-8")

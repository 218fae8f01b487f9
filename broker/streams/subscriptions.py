"""A stream-protocol connection's subscriptions: ``subscribe`` (alone, or in a
single-active-consumer group: :class:`~broker.streams.superstreams.ConsumerGroups`), whole
chunks delivered while a subscription has credit (``deliver``, version 2 for a client that asks
for it in ``exchange_command_versions``), ``credit``, ``unsubscribe``; and offsets stored and
queried by reference (``store_offset``, ``query_offset``)."""

from __future__ import annotations

import struct

from twisted.logger import Logger

from postroom.broker.core.stream import MAX_CHUNK_ENTRIES, StreamQueue
from postroom.broker.streams.deliver import chunk_head, deliver, trailer_bytes
from postroom.broker.streams.session import Outgoing, Session
from postroom.broker.streams.superstreams import ConsumerGroups, leave
from postroom.broker.wal.chunks import RAW
from postroom.broker.wal.records import WALCorruption
from postroom.broker.wal.streamlog import Chunk, Region
from postroom.broker.wire import streamframes as wire

_log = Logger()

#: The longest offset reference stored (the protocol's limit: 256 characters).
MAX_REFERENCE = 256

#: Bytes of chunks queued for the socket at which deliveries pause until the shell has written
#: them and the socket takes more (:meth:`StreamConnection.resume
#: <broker.streams.connection.StreamConnection.resume>`).
DELIVERY_BOUND = 1 << 20

#: Chunks of stream-protocol messages from this size on (their record, in bytes) go out from
#: their segment as they are stored (:class:`~broker.wal.streamlog.Region`: by ``sendfile``
#: where the socket allows), their CRC worked out from the record's; smaller ones are read.
SENT_FROM_FILE = 64 << 10

#: The commands served, with the least and the most version of each, as
#: ``exchange_command_versions`` answers them: RabbitMQ 3.13's list (its
#: ``rabbit_stream_utils:command_versions``), ``publish`` at version 1 only (no filtering).
COMMAND_VERSIONS = [
    (key, 1, 1)
    for key in (
        wire.DECLARE_PUBLISHER, wire.PUBLISH, wire.QUERY_PUBLISHER_SEQUENCE, wire.DELETE_PUBLISHER,
        wire.SUBSCRIBE, wire.CREDIT, wire.STORE_OFFSET, wire.QUERY_OFFSET, wire.UNSUBSCRIBE,
        wire.CREATE_STREAM, wire.DELETE_STREAM, wire.METADATA, wire.CLOSE, wire.HEARTBEAT,
        wire.ROUTE, wire.PARTITIONS, wire.STREAM_STATS, wire.CREATE_SUPER_STREAM, wire.DELETE_SUPER_STREAM,
    )
]  # fmt: skip


class Subscription:
    """Where one subscription is in its stream, and the chunks it may still be sent."""

    __slots__ = (
        "groups", "id", "stream", "chunk", "next_offset", "credit", "active", "group",
        "partition", "waiting", "properties", "consumed", "offset", "spec",
    )  # fmt: skip

    def __init__(
        self, groups: ConsumerGroups[Subscription], subscription: int, stream: StreamQueue, start: int, credit: int
    ) -> None:
        #: Its connection's groups (which ask it, when it is in one).
        self.groups = groups
        self.id = subscription
        self.stream = stream
        #: The last chunk sent (its successor comes next), or ``None``: the chunk holding
        #: :attr:`next_offset` comes next.
        self.chunk: Chunk | None = None
        self.next_offset = start
        self.credit = credit
        self.active = True
        #: Its single-active-consumer group (``None``: none), its stream's place in the super
        #: stream the group is over (-1: none, a lone stream's group), and whether it waits
        #: (not its group's active member).
        self.group: str | None = None
        self.partition = -1
        self.waiting = False
        #: The subscription's properties and offset specification as sent; the messages sent
        #: so far, and the first offset of the last chunk sent (RabbitMQ's ``consumed`` and
        #: ``offset``).
        self.properties: dict[str, str] = {}
        self.spec = wire.Offset("next")
        self.consumed = 0
        self.offset = 0


class Subscriptions:
    """The subscriptions of ``session``, by the ids the client gave them, and what they are
    delivered."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.subscriptions: dict[int, Subscription] = {}
        self.groups: ConsumerGroups[Subscription] = ConsumerGroups(session, self.restart)
        #: The version of ``deliver`` the client reads (2 once it said so).
        self.deliver_version = 1

    def subscribe(self, command: wire.Subscribe) -> None:
        session, subscription, name, offset = self.session, command.subscription_id, command.stream, command.offset

        def answer(code: int) -> None:
            session.answer(wire.SUBSCRIBE, command.correlation, code)

        stream = session.stream(name)
        if stream is None:
            answer(wire.STREAM_DOES_NOT_EXIST)
            return
        if subscription in self.subscriptions:
            answer(wire.SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        if not session.permitted("read", name):
            answer(wire.ACCESS_REFUSED)
            return
        properties = command.properties
        reader = Subscription(self.groups, subscription, stream, _start(stream, offset), command.credit)
        reader.properties, reader.spec = properties, offset
        self.subscriptions[subscription] = reader
        session.watch(stream)
        answer(wire.OK)
        group = properties.get("name") if properties.get("single-active-consumer") == "true" else None
        if group:
            self.groups.join(reader, group, properties.get("super-stream"))
        else:
            self.pump(reader)

    def restart(self, reader: Subscription, spec: wire.Offset) -> None:
        """``reader``, made its group's active member, reads on from ``spec``."""
        reader.chunk, reader.next_offset, reader.waiting = None, _start(reader.stream, spec), False
        self.pump(reader)

    def written(self, stream: StreamQueue) -> None:
        """``stream`` has new chunks written: deliver them."""
        for reader in list(self.subscriptions.values()):
            if reader.stream is stream:
                self.pump(reader)

    def pump(self, reader: Subscription) -> None:
        """Deliver the written chunks ``reader`` has not had while it has credit, a chunk each."""
        session, stream = self.session, reader.stream
        while reader.credit > 0 and not session.finished and reader.active and not reader.waiting:
            if session.paused or session.queued >= DELIVERY_BOUND:
                session.behind = True
                return
            parts: list[Outgoing]
            try:
                chunk = _next_chunk(stream, reader)
                if chunk is None:
                    return
                if chunk.raw == RAW and chunk.length >= SENT_FROM_FILE and chunk.count <= MAX_CHUNK_ENTRIES:
                    # Sent from its file as it is (the shell sends it, or reads it).
                    crc, region = stream.log.entries_region(chunk)
                    committed, trailer = self._committed(stream), trailer_bytes(stream, chunk)
                    head = chunk_head(reader.id, chunk, chunk.count, crc, region.length, committed, trailer)
                    parts = [head, region]
                    session.regions += 1
                else:
                    payload = stream.log.read_entries(chunk)
                    parts = deliver(reader.id, chunk, payload, self._committed(stream), trailer_bytes(stream, chunk))
            except (OSError, WALCorruption) as error:
                reader.active = False
                session.reason = f"reading stream '{stream.name}' at offset {reader.next_offset} failed: {error}"
                _log.error(
                    "stream protocol subscription {id} on {stream!r}: {reason}",
                    id=reader.id,
                    stream=stream.name,
                    reason=session.reason,
                )
                return
            reader.chunk = chunk
            reader.next_offset = chunk.next_offset
            reader.credit -= 1
            reader.consumed += chunk.count
            reader.offset = chunk.first_offset
            for part in parts[1::2]:
                session.queued += part.length if isinstance(part, Region) else len(part)
            session.out += parts

    def resume(self) -> None:
        """Deliveries go on (the socket takes more)."""
        for reader in list(self.subscriptions.values()):
            self.pump(reader)

    def credit(self, command: wire.Credit) -> None:
        subscription = command.subscription_id
        reader = self.subscriptions.get(subscription)
        if reader is None:
            session = self.session
            session.count_error(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            body = wire.u16(wire.SUBSCRIPTION_ID_DOES_NOT_EXIST) + bytes((subscription,))
            session.out.append(wire.frame(wire.CREDIT | wire.RESPONSE, body))
            return
        reader.credit += command.credit
        self.pump(reader)

    def unsubscribe(self, command: wire.Unsubscribe) -> None:
        reader = self.subscriptions.pop(command.subscription_id, None)
        if reader is None:
            self.session.answer(wire.UNSUBSCRIBE, command.correlation, wire.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            return
        self.session.unwatch(reader.stream)
        leave(reader)
        self.session.answer(wire.UNSUBSCRIBE, command.correlation, wire.OK)

    def forget(self, stream: StreamQueue) -> None:
        """``stream`` was deleted: its subscriptions go, and its groups."""
        self.subscriptions = {key: r for key, r in self.subscriptions.items() if r.stream is not stream}
        stream.stream_groups.clear()

    def release(self) -> list[Subscription]:
        """The connection is gone: its subscriptions go (returned; they are still in their
        groups: see :meth:`ConsumerGroups.released`)."""
        readers = list(self.subscriptions.values())
        self.subscriptions.clear()
        return readers

    def exchange_command_versions(self, command: wire.ExchangeCommandVersions) -> None:
        """RabbitMQ 3.11's ``exchange_command_versions``: answered with the commands served here
        and their versions (:data:`COMMAND_VERSIONS`); a client that reads ``deliver`` version 2
        gets it from then on, as from RabbitMQ."""
        body = wire.u32(len(COMMAND_VERSIONS)) + b"".join(struct.pack(">HHH", *each) for each in COMMAND_VERSIONS)
        self.session.answer(wire.EXCHANGE_COMMAND_VERSIONS, command.correlation, wire.OK, body)
        for key, _least, most in command.versions:
            if key == wire.DELIVER and most >= 2:
                self.deliver_version = 2

    def _committed(self, stream: StreamQueue) -> int | None:
        """What a ``deliver`` of ``stream`` carries as its committed chunk id: ``None`` for
        version 1 (nothing), else the first offset of its newest chunk written."""
        if self.deliver_version == 1:
            return None
        last = stream.log.locate(stream.committed - 1) if stream.committed > stream.log.first_offset else None
        return last.first_offset if last is not None else -1

    # -- offsets ----------------------------------------------------------------------------------

    def store_offset(self, command: wire.StoreOffset) -> None:
        """No answer, as RabbitMQ: for a stream missing or that the user may not write to (as
        RabbitMQ checks it), or a reference longer than 256 characters, nothing is stored."""
        session, reference, name = self.session, command.reference, command.stream
        stream = session.stream(name)
        if stream is None or not reference or len(reference) > MAX_REFERENCE or not session.permitted("write", name):
            return
        stream.store_offset(reference, command.offset)

    def query_offset(self, command: wire.QueryOffset) -> None:
        session, correlation = self.session, command.correlation
        stream = session.stream(command.stream)
        if stream is None:
            session.answer(wire.QUERY_OFFSET, correlation, wire.STREAM_DOES_NOT_EXIST, wire.u64(0))
            return
        stored = stream.subscriptions.get(command.reference)
        if stored is None:
            session.answer(wire.QUERY_OFFSET, correlation, wire.NO_OFFSET, wire.u64(0))
            return
        session.answer(wire.QUERY_OFFSET, correlation, wire.OK, wire.u64(stored))


def _start(stream: StreamQueue, offset: wire.Offset) -> int:
    """The offset a subscription starts at (the chunk holding it is sent whole)."""
    log = stream.log
    first, end = log.first_offset, stream.committed
    kind = offset.kind
    if kind == "first":
        return first
    if kind == "last":
        last = log.locate(end - 1) if end > first else None
        return last.first_offset if last is not None else end
    if kind == "offset":
        return min(max(offset.value, first), end)
    if kind == "timestamp" and first < end:
        chunk = log.locate_time(offset.value / 1000.0)
        return chunk.first_offset if chunk is not None and chunk.first_offset < end else end
    return end


def _next_chunk(stream: StreamQueue, reader: Subscription) -> Chunk | None:
    if reader.next_offset >= stream.committed:
        return None
    chunk = stream.log.next_chunk(reader.chunk) if reader.chunk is not None else stream.log.locate(reader.next_offset)
    if chunk is None or chunk.first_offset >= stream.committed:
        return None
    return chunk

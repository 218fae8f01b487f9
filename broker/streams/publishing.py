"""A stream-protocol connection's publishers: ``declare_publisher``, ``publish`` (decoded,
deduplicated by reference, written, confirmed once the log's group commit synced their chunk,
or refused with ``publish_error``), ``query_publisher_sequence`` and ``delete_publisher``."""

from __future__ import annotations

import operator
import struct
from itertools import islice

from postroom.broker.core.stream import StreamQueue
from postroom.broker.streams.session import Session
from postroom.broker.wal.chunks import BATCH_HEAD, batch_records, unpack_batched_messages
from postroom.broker.wal.records import WALCorruption
from postroom.broker.wire import streamframes as wire


class Publisher:
    """One publisher of the connection, as the client declared it."""

    __slots__ = ("id", "reference", "stream", "published", "confirmed", "errored")

    def __init__(self, publisher_id: int, reference: str, stream: StreamQueue) -> None:
        self.id = publisher_id
        self.reference = reference
        self.stream = stream
        #: Messages it sent, confirmed and refused (RabbitMQ's counts of a publisher).
        self.published = self.confirmed = self.errored = 0


class Publishing:
    """The publishers of ``session``, by the ids the client gave them."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.publishers: dict[int, Publisher] = {}

    def declare(self, command: wire.DeclarePublisher) -> None:
        session, publisher, reference, name = self.session, command.publisher_id, command.reference, command.stream

        def answer(code: int) -> None:
            session.answer(wire.DECLARE_PUBLISHER, command.correlation, code)

        if not session.permitted("write", name):
            answer(wire.ACCESS_REFUSED)
        elif publisher in self.publishers:
            answer(wire.PRECONDITION_FAILED)
        elif (stream := session.stream(name)) is None:
            answer(wire.STREAM_DOES_NOT_EXIST)
        elif reference and any(p.reference == reference and p.stream is stream for p in self.publishers.values()):
            answer(wire.PRECONDITION_FAILED)
        else:
            self.publishers[publisher] = Publisher(publisher, reference, stream)
            session.watch(stream)
            answer(wire.OK)

    def publish(self, command: wire.Publish) -> None:
        session, publisher_id, data = self.session, command.publisher_id, command.messages
        publisher = self.publishers.get(publisher_id)
        refused: list[int] = []
        entries: list[bytes | memoryview] | None = None
        try:
            simple = _published(data, command.count)
            if simple is None:  # sub-entry batches among the messages
                ids, entries, refused = _published_entries(data)
                block, size = b"", None
            else:
                ids, block, size = simple
        except wire.Malformed:
            # A frame whose messages do not add up: refused whole.
            self._refuse(publisher_id, [], wire.PRECONDITION_FAILED)
            return
        if publisher is None or publisher.stream.deleted:
            self._refuse(publisher_id, ids + refused, wire.PUBLISHER_DOES_NOT_EXIST)
            return
        publisher.published += len(ids) + len(refused)
        session.node.counters["stream_messages_received"] += len(ids) + len(refused)
        stream = publisher.stream
        if not session.permitted("write", stream.name):
            self._refuse(publisher_id, ids + refused, wire.ACCESS_REFUSED)
            return
        if refused:
            self._refuse(publisher_id, refused, wire.PRECONDITION_FAILED)
        tracked: tuple[str, list[int]] | None = None
        if publisher.reference and ids:
            # Deduplication, as RabbitMQ's stream writer does it: a message is written only if
            # its publishing id is above every id this publisher wrote before it, in earlier
            # frames and earlier in this one; the others are confirmed, not written again.
            known = stream.publisher_sequence(publisher.reference)
            last = -1 if known is None else known
            written = ids
            if ids[0] <= last or not all(map(operator.lt, ids, islice(ids, 1, None))):
                if entries is None:
                    entries = _published_entries(data)[1]
                kept: list[bytes | memoryview] = []
                written = []
                for number, entry in zip(ids, entries, strict=True):
                    if number > last:
                        kept.append(entry)
                        written.append(number)
                        last = number
                entries = kept
            else:
                last = ids[-1]
            stream.set_publisher_sequence(publisher.reference, last)
            tracked = (publisher.reference, written)
        fresh, batched, held = len(ids), False, len(ids)
        if entries is not None:
            fresh = sum(map(batch_records, entries))
            batched = any([entry[0] & 0x80 for entry in entries])
            block, size, held = b"".join(entries), None, len(entries)
        if block:
            stream.append_raw(block, fresh, batched, held, size, tracked)
        journal = getattr(stream.store, "journal", None)
        if journal is None or not block:
            self._confirm(publisher, ids)
            return
        journal.when_durable(lambda durable: self._written(publisher, ids, durable))

    def _written(self, publisher: Publisher, ids: list[int], durable: bool) -> None:
        session = self.session
        if session.finished:
            return
        if durable:
            self._confirm(publisher, ids)
        else:
            self._refuse(publisher.id, ids, wire.INTERNAL_ERROR)
        session.wake()

    def _confirm(self, publisher: Publisher, ids: list[int]) -> None:
        publisher.confirmed += len(ids)
        self.session.node.counters["stream_messages_confirmed"] += len(ids)
        self.session.out.append(_publish_confirm(publisher.id, ids))

    def _refuse(self, publisher_id: int, ids: list[int], code: int) -> None:
        """``publish_error`` with ``code`` for each of ``ids`` (one counted error a frame)."""
        self.session.count_error(code)
        publisher = self.publishers.get(publisher_id)
        if publisher is not None:
            publisher.errored += len(ids)
        self.session.out.append(_publish_error(publisher_id, ids, code))

    def query_sequence(self, command: wire.QueryPublisherSequence) -> None:
        session, correlation = self.session, command.correlation
        stream = session.stream(command.stream)
        if stream is None:
            session.answer(wire.QUERY_PUBLISHER_SEQUENCE, correlation, wire.STREAM_DOES_NOT_EXIST, wire.u64(0))
            return
        sequence = max(stream.publisher_sequence(command.reference) or 0, 0)
        session.answer(wire.QUERY_PUBLISHER_SEQUENCE, correlation, wire.OK, wire.u64(sequence))

    def delete(self, command: wire.DeletePublisher) -> None:
        gone = self.publishers.pop(command.publisher_id, None)
        code = wire.OK if gone is not None else wire.PUBLISHER_DOES_NOT_EXIST
        self.session.answer(wire.DELETE_PUBLISHER, command.correlation, code)
        if gone is not None:
            self.session.unwatch(gone.stream)

    def forget(self, stream: StreamQueue) -> None:
        """``stream`` was deleted: its publishers go."""
        self.publishers = {key: p for key, p in self.publishers.items() if p.stream is not stream}

    def release(self) -> list[Publisher]:
        """The connection is gone: its publishers go (returned)."""
        publishers = list(self.publishers.values())
        self.publishers.clear()
        return publishers


#: The layout of a ``publish`` frame's messages when they are all of one size, by their count
#: and size (a producer's frames mostly are): their ids and sizes read by one call (and the
#: messages too, when they are small).
_UNIFORM: dict[tuple[int, int], struct.Struct] = {}
_UNIFORM_MOST = 1024
#: Messages from this size on are copied out of the frame by slices of it, once.
_SLICED = 256


def _published(data: bytes | memoryview, count: int) -> tuple[list[int], bytes, int | None] | None:
    """The publishing ids and the messages of a ``publish`` frame of ``count`` messages, the
    messages as the simple entries of a chunk (each its size, then its bytes: as the frame
    carries it after its id), joined, and the messages' size when they are all of one;
    ``None`` when sub-entry batches are among them.

    :raises wire.Malformed: the frame's messages do not add up
    """
    end = len(data)
    if 0 < count <= _UNIFORM_MOST and end >= 12:
        size = _ID_SIZE.unpack_from(data, 0)[1]
        if end == count * (12 + size) and size < 0x80000000:
            layout = _UNIFORM.get((count, size))
            if layout is None:
                if len(_UNIFORM) >= 64:
                    _UNIFORM.clear()
                shape = f"QI{size}x" if size >= _SLICED else f"QI{size}s"
                layout = _UNIFORM[count, size] = struct.Struct(">" + shape * count)
            values = layout.unpack(data)
            if size >= _SLICED and values[1::2].count(size) == count:
                view = memoryview(data)
                return (
                    list(values[0::2]),
                    b"".join([view[at : at + 4 + size] for at in range(8, end, 12 + size)]),
                    size,
                )
            if size < _SLICED and values[1::3].count(size) == count:
                return list(values[0::3]), wire.u32(size).join((b"", *values[2::3])), size
    ids: list[int] = []
    entries: list[bytes | memoryview] = []
    at = 0
    unpack = _ID_SIZE.unpack_from
    while at < end:
        if end - at < 12:
            raise wire.Malformed("short")
        publishing_id, size = unpack(data, at)
        if size & 0x80000000:
            return None
        stop = at + 12 + size
        if stop > end:
            raise wire.Malformed("short")
        ids.append(publishing_id)
        entries.append(data[at + 8 : stop])
        at = stop
    return ids, b"".join(entries), None


_ID_SIZE = struct.Struct(">QI")


def _published_entries(data: bytes | memoryview) -> tuple[list[int], list[bytes | memoryview], list[int]]:
    """The messages of a ``publish`` frame one by one, sub-entry batches among them, each
    batch one entry (kept as osiris keeps it: its reserved bits cleared). Returns the ids and
    entries taken, and the ids of batches refused: one of no messages, or an uncompressed one
    whose messages do not add up to its count (RabbitMQ takes those, and its AMQP 0-9-1
    readers then fail on them).

    :raises wire.Malformed: the frame's messages do not add up
    """
    ids: list[int] = []
    entries: list[bytes | memoryview] = []
    refused: list[int] = []
    at, end = 0, len(data)
    while at < end:
        if end - at < 12:
            raise wire.Malformed("short")
        publishing_id, size = _ID_SIZE.unpack_from(data, at)
        entry: bytes | memoryview
        if size & 0x80000000:
            if end - at < 8 + BATCH_HEAD.size:
                raise wire.Malformed("short")
            flags, records, _uncompressed, length = BATCH_HEAD.unpack_from(data, at + 8)
            stop = at + 8 + BATCH_HEAD.size + length
            entry = bytes((flags & 0xF0,)) + data[at + 9 : stop]
            taken = stop <= end and records > 0 and _holds(entry, records)
        else:
            stop = at + 12 + size
            entry, taken = data[at + 8 : stop], True
        if stop > end:
            raise wire.Malformed("short")
        if taken:
            ids.append(publishing_id)
            entries.append(entry)
        else:
            refused.append(publishing_id)
        at = stop
    return ids, entries, refused


def _holds(entry: bytes, records: int) -> bool:
    """Whether a sub-entry batch holds its ``records`` messages (as far as can be told without
    uncompressing it)."""
    try:
        unpack_batched_messages(entry, 0, records)
    except WALCorruption:
        return False
    return True


def _publish_confirm(publisher: int, ids: list[int]) -> bytes:
    count = len(ids)
    return wire.frame(wire.PUBLISH_CONFIRM, bytes((publisher,)) + struct.pack(f">I{count}Q", count, *ids))


def _publish_error(publisher: int, ids: list[int], code: int) -> bytes:
    errors = b"".join(wire.u64(i) + wire.u16(code) for i in ids)
    return wire.frame(wire.PUBLISH_ERROR, bytes((publisher,)) + wire.u32(len(ids)) + errors)

"""A named stream-protocol publisher's last publishing id in the trailer of each chunk holding
its messages, as osiris writes it: what ``deliver`` heads say of it (RabbitMQ's are compared in
tests/conformance/test_stream_protocol_transcripts.py), and deduplication that holds for chunks
written when the log's own record of the id was not (a crash between the two writes)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from twisted.internet.task import Clock

from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.storage.streams import StreamFiles
from postroom.broker.wal import chunks
from postroom.broker.wal.streamlog import Region
from postroom.broker.wire import streamframes as wire
from tests.broker.test_stream_connection import opened, published_frame, request, with_streams, written_chunks

HEAD = struct.Struct(">HHBBBHIqQQIIII")


def delivered(out: list[object]) -> list[tuple[int, int, int, bytes]]:
    """``(first offset, messages, trailer length, entries)`` of each ``deliver`` in ``out``
    (chunks sent from their file read from it), each checked against its head's CRC."""
    data = b"".join(part.read() if isinstance(part, Region) else bytes(part) for part in out)  # type: ignore[arg-type]
    found = []
    for frame in wire.FrameReader().feed(data):
        if struct.unpack_from(">H", frame)[0] == wire.DELIVER:
            fields = HEAD.unpack_from(frame)
            entries = frame[HEAD.size :]
            assert (fields[10], fields[11]) == (zlib.crc32(entries), len(entries))
            found.append((fields[9], fields[6], fields[12], entries))
    return found


def publishing(tmp_path: Path, arguments: dict[str, str] | None = None) -> tuple[Node, object]:
    node = with_streams(tmp_path, Node(users=[User("guest", "guest")]))
    connection = opened(node)
    connection.receive(request(wire.CREATE_STREAM, 5, wire.string("events") + wire.string_map(arguments or {})))
    for publisher, reference in ((1, "my-publisher-ref"), (2, "other"), (3, "")):
        declare = bytes((publisher,)) + wire.string(reference) + wire.string("events")
        connection.receive(request(wire.DECLARE_PUBLISHER, 5 + publisher, declare))
    return node, connection


def test_each_chunk_says_how_long_its_publishers_trailer_is_and_keeps_its_crc(tmp_path: Path) -> None:
    node, connection = publishing(tmp_path)
    connection.receive(published_frame(1, [1, 2, 3]))
    written_chunks(node)
    connection.receive(published_frame(3, [7]))  # (no reference: no trailer)
    written_chunks(node)
    large = b"x" * 40_000  # two of them: sent from the file, its CRC worked out past the trailer
    connection.receive(published_frame(1, [4, 5], lambda n: large) + published_frame(2, [9], lambda n: b"o"))
    written_chunks(node)
    connection.out.clear()
    subscribe = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    connection.receive(request(wire.SUBSCRIBE, 9, subscribe))
    assert connection.regions == 1
    found = delivered(connection.out)
    # 1 + 1 + 16 + 8 bytes for "my-publisher-ref", and 1 + 1 + 5 + 8 for "other"
    assert [(first, count, trailer) for first, count, trailer, _ in found] == [(0, 3, 26), (3, 1, 0), (4, 3, 26 + 15)]
    stream = node.vhosts["/"].queues["events"]
    trailer = stream.log.read_trailer(stream.log.locate(4))
    # (osiris's order: the references last first)
    assert chunks.unpack_tracking(trailer) == [(0, "other", 9), (0, "my-publisher-ref", 5)]
    # Readers over AMQP 0-9-1 read the messages, not the trailer.
    assert [body for _names, _header, body in stream.log.read_messages(stream.log.locate(4))] == [large, large, b"o"]


def test_a_publishers_id_in_a_chunk_outlives_the_logs_record_of_it(tmp_path: Path) -> None:
    """The chunks are written before the log's records of the same write: a crash between the
    two leaves the chunks, and their trailers say what their publishers sent."""
    node, connection = publishing(tmp_path)
    connection.receive(published_frame(1, [1, 2, 3]))
    written_chunks(node)  # (the chunks only: this journal writes no log)
    reopened = StreamFiles(str(tmp_path), Journal(1), Clock()).open("events", "/", {"x-queue-type": "stream"})
    assert reopened.log.tracking == {"my-publisher-ref": 3}
    reopened.recover_offsets({})
    assert reopened.publisher_sequence("my-publisher-ref") == 3
    # The log's record wins where it is later (a chunk of the publisher's in an older segment).
    again = StreamFiles(str(tmp_path), Journal(1), Clock()).open("events", "/", {"x-queue-type": "stream"})
    again.recover_offsets({"\x00publisher:my-publisher-ref": 10})
    assert again.publisher_sequence("my-publisher-ref") == 10


def test_a_segments_first_chunk_carries_every_publishers_id(tmp_path: Path) -> None:
    """Only the last segment is read at a start: its first chunk holds the other publishers'
    last ids too (marked, and left out of the trailer length a ``deliver`` says)."""
    node, connection = publishing(tmp_path, {"stream-max-segment-size-bytes": "2000"})
    connection.receive(published_frame(2, [41]))
    written_chunks(node)
    connection.receive(published_frame(1, [1, 2], lambda n: b"y" * 1500))  # (opens segment 2)
    written_chunks(node)
    stream = node.vhosts["/"].queues["events"]
    assert stream.log.segments == [1, 2]
    second = stream.log.locate(1)
    assert chunks.unpack_tracking(stream.log.read_trailer(second)) == [
        (chunks.TRACKING_SEQUENCE, "my-publisher-ref", 2),
        (chunks.TRACKING_SEQUENCE | chunks.TRACKING_SNAPSHOT, "other", 41),
    ]
    connection.out.clear()
    subscribe = b"\x01" + wire.string("events") + struct.pack(">hH", wire.OFFSET_FIRST, 10)
    connection.receive(request(wire.SUBSCRIBE, 9, subscribe))
    assert [(first, trailer) for first, _count, trailer, _ in delivered(connection.out)] == [(0, 15), (1, 26)]
    reopened = StreamFiles(str(tmp_path), Journal(1), Clock()).open("events", "/", {"x-queue-type": "stream"})
    assert reopened.log.tracking == {"my-publisher-ref": 2, "other": 41}

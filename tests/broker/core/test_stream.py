"""Stream queues in the model: intervals, offset specifications, offset headers, readers and credit."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import pytest
from twisted.internet.task import Clock

from postroom.broker.core.entry import Consumer, Entry
from postroom.broker.core.message import Message
from postroom.broker.core.stream import (
    NoLeadingDigit,
    OffsetSpec,
    StreamQueue,
    interval_seconds,
    offset_spec,
    with_offset,
)
from postroom.broker.errors import ChannelException, ConnectionException
from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.streamlog import StreamLog
from postroom.broker.wire.codec import shortstr
from postroom.broker.wire.content import headers_content
from postroom.broker.wire.table import Int64, decode_table, encode_table

WHERE = "in vhost '/'"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7D", 7 * 86400),
        ("12h", 43200),
        ("30m", 1800),
        ("10s", 10),
        ("1Y", 365 * 86400),
        ("2M", 60 * 86400),
        ("07D", 7 * 86400),
    ],
)
def test_intervals_read_as_rabbitmq_reads_them(text: str, seconds: int) -> None:
    assert interval_seconds(text) == seconds


@pytest.mark.parametrize("text", ["7X", "0D", "7d", "10", "7 D", "7DD"])
def test_an_interval_with_digits_and_no_single_unit_is_invalid(text: str) -> None:
    with pytest.raises(ValueError) as raised:
        interval_seconds(text)
    assert not isinstance(raised.value, NoLeadingDigit)


@pytest.mark.parametrize("text", ["", "D", "-1D", " 7D"])
def test_an_interval_without_a_leading_digit_is_told_apart(text: str) -> None:
    with pytest.raises(NoLeadingDigit):
        interval_seconds(text)


def test_offset_specifications() -> None:
    now = 1_000_000.0
    assert offset_spec(None, now, "s", WHERE) == OffsetSpec("next")
    assert offset_spec("first", now, "s", WHERE) == OffsetSpec("first")
    assert offset_spec(b"last", now, "s", WHERE) == OffsetSpec("last")
    assert offset_spec(Int64(500), now, "s", WHERE) == OffsetSpec("offset", 500)
    assert offset_spec(-5, now, "s", WHERE) == OffsetSpec("offset", -5)
    assert offset_spec("10m", now, "s", WHERE) == OffsetSpec("timestamp", now - 600)
    moment = datetime(2026, 11, 28, 14, 0, tzinfo=timezone.utc)
    assert offset_spec(moment, now, "s", WHERE) == OffsetSpec("timestamp", moment.timestamp())


def test_a_bad_interval_is_refused_in_rabbitmqs_words() -> None:
    with pytest.raises(ChannelException) as refused:
        offset_spec("7X", 0.0, "s", WHERE)
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == (
        "invalid arg 'x-stream-offset' for queue 's' in vhost '/': {invalid_stream_offset_arg,{longstr,<<\"7X\">>}}"
    )


@pytest.mark.parametrize("value", ["foo", "FIRST", "", True, 1.5, {}, []])
def test_what_crashes_rabbitmqs_channel_closes_the_connection_with_541(value: Any) -> None:
    with pytest.raises(ConnectionException) as closed:
        offset_spec(value, 0.0, "s", WHERE)
    assert (closed.value.reply_code, closed.value.class_id, closed.value.method_id) == (541, 0, 0)


def content_header(headers: dict[str, Any] | None = None, body_size: int = 1) -> bytes:
    """A basic content header with a content type and, if given, headers."""
    flags = 0x8000 | (0x2000 if headers is not None else 0)
    properties = shortstr("text/plain")
    if headers is not None:
        properties += encode_table(headers)
    return (60).to_bytes(2, "big") + b"\0\0" + body_size.to_bytes(8, "big") + flags.to_bytes(2, "big") + properties


def header_table(header: bytes) -> list[tuple[str, Any]]:
    content = headers_content(header)
    assert content is not None
    table, _end = decode_table(len(content).to_bytes(4, "big") + content)
    return list(table.items())


def test_the_offset_header_is_set_and_the_table_sorted_by_name() -> None:
    header = content_header({"zz": 1, "aB": "x", "x-stream-offset": "fake", "ab": 2})
    delivered = with_offset(header, 42)
    assert header_table(delivered) == [("aB", "x"), ("ab", 2), ("x-stream-offset", 42), ("zz", 1)]
    content = headers_content(delivered)
    assert content is not None and b"x-stream-offsetl" + (42).to_bytes(8, "big") in content
    assert delivered.startswith(header[:14] + shortstr("text/plain"))  # the other properties as sent


def test_a_message_without_headers_gets_the_offset_alone() -> None:
    assert header_table(with_offset(content_header(), 7)) == [("x-stream-offset", 7)]


class Sink:
    """A channel that records what it was given, counting deliveries as the real one does."""

    active = True
    prefetch_global = 0

    def __init__(self) -> None:
        self.unacked_count = 0
        self.delivered: list[tuple[str, list[int]]] = []
        self.entries: dict[str, list[Entry]] = {}

    def deliver_entries(self, consumer: Consumer, entries: Sequence[Entry]) -> None:
        offsets = []
        for entry in entries:
            assert entry.header is not None
            offsets.append(dict(header_table(entry.header))["x-stream-offset"])
        self.delivered.append((consumer.tag, offsets))
        self.entries.setdefault(consumer.tag, []).extend(entries)
        for entry in entries:
            entry.consumer = consumer
        consumer.unacked += len(entries)

    def take_back(self, entry: Entry) -> bool:
        raise AssertionError("a stream takes nothing back")

    def offsets(self, tag: str) -> list[int]:
        return [offset for each, offsets in self.delivered if each == tag for offset in offsets]


def publish(stream: StreamQueue, count: int, start: int = 0) -> None:
    """``count`` messages, written as one chunk."""
    for n in range(start, start + count):
        body = f"m{n}".encode()
        names = shortstr("ex") + shortstr(f"k{n}")
        stream.enqueue(Message("ex", f"k{n}", names, content_header(None, len(body)), body))
    staged, _dropped = stream.stage()
    stream.log.write(staged)
    stream.written(staged)


def consumer(stream: StreamQueue, sink: Sink, tag: str, prefetch: int) -> Consumer:
    return Consumer(sink, stream, tag, shortstr(tag), False, False, prefetch, {})  # type: ignore[arg-type]


def ack(stream: StreamQueue, each: Consumer, count: int) -> None:
    each.unacked -= count
    stream.settle([])
    stream.dispatch()


@pytest.fixture
def stream() -> StreamQueue:
    log = StreamLog(MemorySegmentStorage(), 1 << 20)
    log.open()
    clock = Clock()
    clock.advance(1000.0)
    return StreamQueue("s", "/", {"x-queue-type": "stream"}, log, clock)


def test_a_consumer_from_first_reads_everything_in_order_and_nothing_is_removed(stream: StreamQueue) -> None:
    publish(stream, 3)
    publish(stream, 4, 3)
    sink = Sink()
    reader = consumer(stream, sink, "a", 100)
    stream.add_consumer(reader, OffsetSpec("first"))
    assert sink.offsets("a") == list(range(7))
    assert stream.message_count == 7
    other = consumer(stream, sink, "b", 100)
    stream.add_consumer(other, OffsetSpec("first"))
    assert sink.offsets("b") == list(range(7))  # read again, independently


def test_credit_goes_by_whole_chunks_and_may_go_below_zero(stream: StreamQueue) -> None:
    publish(stream, 3)
    publish(stream, 4, 3)
    publish(stream, 2, 7)
    sink = Sink()
    reader = consumer(stream, sink, "a", 1)
    stream.add_consumer(reader, OffsetSpec("first"))
    assert sink.offsets("a") == [0, 1, 2]  # the first chunk whole, for a prefetch of 1
    ack(stream, reader, 2)
    assert sink.offsets("a") == [0, 1, 2]  # credit 0: nothing more
    ack(stream, reader, 1)
    assert sink.offsets("a") == list(range(7))


def test_last_is_the_whole_last_chunk_and_next_only_what_comes(stream: StreamQueue) -> None:
    publish(stream, 3)
    publish(stream, 4, 3)
    publish(stream, 2, 7)
    sink = Sink()
    stream.add_consumer(consumer(stream, sink, "last", 100), OffsetSpec("last"))
    stream.add_consumer(consumer(stream, sink, "next", 100), OffsetSpec("next"))
    assert sink.offsets("last") == [7, 8] and sink.offsets("next") == []
    publish(stream, 1, 9)
    assert sink.offsets("last") == [7, 8, 9] and sink.offsets("next") == [9]


def test_a_numeric_offset_starts_there_and_past_the_end_skips_what_is_below_it(stream: StreamQueue) -> None:
    publish(stream, 3)
    publish(stream, 4, 3)
    sink = Sink()
    stream.add_consumer(consumer(stream, sink, "four", 100), OffsetSpec("offset", 4))
    stream.add_consumer(consumer(stream, sink, "minus", 100), OffsetSpec("offset", -5))
    stream.add_consumer(consumer(stream, sink, "nine", 100), OffsetSpec("offset", 9))
    assert sink.offsets("four") == [4, 5, 6] and sink.offsets("minus") == list(range(7))
    publish(stream, 4, 7)
    assert sink.offsets("nine") == [9, 10]


def test_a_timestamp_starts_at_the_first_chunk_appended_then_or_later(stream: StreamQueue) -> None:
    clock = stream.clock
    publish(stream, 3)
    clock.advance(60)
    publish(stream, 2, 3)
    sink = Sink()
    stream.add_consumer(consumer(stream, sink, "t", 100), OffsetSpec("timestamp", clock.seconds() - 30))
    stream.add_consumer(consumer(stream, sink, "future", 100), OffsetSpec("timestamp", clock.seconds() + 30))
    assert sink.offsets("t") == [3, 4] and sink.offsets("future") == []


def test_nothing_is_read_before_its_chunk_is_written(stream: StreamQueue) -> None:
    sink = Sink()
    stream.add_consumer(consumer(stream, sink, "a", 100), OffsetSpec("first"))
    stream.enqueue(Message("", "s", shortstr("") + shortstr("s"), content_header(None, 1), b"x"))
    staged, _dropped = stream.stage()
    stream.dispatch()
    assert sink.offsets("a") == [] and stream.message_count == 0
    stream.log.write(staged)
    stream.written(staged)
    assert sink.offsets("a") == [0] and stream.message_count == 1


def test_a_cancelled_consumer_gets_nothing_more(stream: StreamQueue) -> None:
    sink = Sink()
    each = consumer(stream, sink, "a", 100)
    stream.add_consumer(each, OffsetSpec("next"))
    stream.remove_consumer(each)
    publish(stream, 2)
    assert sink.offsets("a") == [] and stream.consumer_count == 0


def test_a_reader_goes_on_to_chunks_written_after_it_attached(stream: StreamQueue) -> None:
    publish(stream, 1)
    publish(stream, 3, 1)
    stream.enqueue(Message("", "s", shortstr("") + shortstr("s"), content_header(None, 1), b"x"))
    stream.enqueue(Message("", "s", shortstr("") + shortstr("s"), content_header(None, 1), b"y"))
    staged, _dropped = stream.stage()  # in flight: not readable yet
    sink = Sink()
    stream.add_consumer(consumer(stream, sink, "last", 100), OffsetSpec("last"))
    assert sink.offsets("last") == [1, 2, 3]
    stream.log.write(staged)
    stream.written(staged)
    assert sink.offsets("last") == [1, 2, 3, 4, 5]


class Store:
    """A stream store that records the offsets stored (the journal's side)."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, int]] = []

    def pending(self, stream: StreamQueue, size: int) -> None:
        pass

    def offset_stored(self, stream: StreamQueue, name: str, offset: int) -> None:
        self.stored.append((name, offset))


def ack_offsets(stream: StreamQueue, sink: Sink, each: Consumer, offsets: Sequence[int]) -> None:
    """Acknowledge ``each``'s deliveries at ``offsets``, as the channel does."""
    entries = [entry for entry in sink.entries[each.tag] if entry.seq in offsets]
    assert len(entries) == len(offsets)
    each.unacked -= len(entries)
    stream.settle(entries)
    stream.dispatch()


def named(stream: StreamQueue, sink: Sink, tag: str, prefetch: int, name: str, group: bool = False) -> Consumer:
    each = consumer(stream, sink, tag, prefetch)
    stream.add_consumer(each, OffsetSpec("first"), name, group)
    return each


def test_a_named_consumer_resumes_after_what_it_acknowledged(stream: StreamQueue) -> None:
    store = stream.store = Store()
    publish(stream, 5)
    publish(stream, 5, 5)
    sink = Sink()
    first = named(stream, sink, "a", 100, "sub")
    assert sink.offsets("a") == list(range(10))
    ack_offsets(stream, sink, first, [0, 1, 2])
    assert stream.subscriptions == {"sub": 3} and store.stored[-1] == ("sub", 3)
    ack_offsets(stream, sink, first, [5])  # out of order: the stored offset waits for 3 and 4
    assert stream.subscriptions == {"sub": 3}
    ack_offsets(stream, sink, first, [3, 4])
    assert stream.subscriptions == {"sub": 6}
    assert stream.lag("sub") == 4
    stream.remove_consumer(first)  # 6 to 9 were delivered, not acknowledged: they come again
    again = named(stream, sink, "b", 100, "sub")
    assert sink.offsets("b") == [6, 7, 8, 9]
    ack_offsets(stream, sink, again, [6, 7, 8, 9])
    assert stream.subscriptions == {"sub": 10} and stream.lag("sub") == 0


def test_a_stored_offset_wins_over_the_consumers_own_offset_and_unnamed_consumers_store_nothing(
    stream: StreamQueue,
) -> None:
    store = stream.store = Store()
    publish(stream, 4)
    stream.subscriptions["sub"] = 2
    sink = Sink()
    each = consumer(stream, sink, "a", 100)
    stream.add_consumer(each, OffsetSpec("first"), "sub")
    unnamed = consumer(stream, sink, "u", 100)
    stream.add_consumer(unnamed, OffsetSpec("first"))
    assert sink.offsets("a") == [2, 3] and sink.offsets("u") == [0, 1, 2, 3]
    ack_offsets(stream, sink, unnamed, [0, 1, 2, 3])
    assert store.stored == [] and stream.subscriptions == {"sub": 2}


def test_a_group_has_one_reader_and_the_next_takes_over_at_the_stored_offset(stream: StreamQueue) -> None:
    stream.store = Store()
    publish(stream, 3)
    publish(stream, 3, 3)
    sink = Sink()
    one = named(stream, sink, "one", 3, "g", group=True)
    named(stream, sink, "two", 3, "g", group=True)
    assert sink.offsets("one") == [0, 1, 2] and sink.offsets("two") == []
    assert stream.consumer_count == 2
    ack_offsets(stream, sink, one, [0, 1])
    stream.remove_consumer(one)  # 2 was not acknowledged: the next member gets it
    assert sink.offsets("two") == [2, 3, 4, 5]


def test_members_share_a_partitioned_streams_streams_and_move_after_finishing(stream: StreamQueue) -> None:
    stream.store = Store()
    stream.partition = lambda: 1  # type: ignore[method-assign]  # the second partition
    publish(stream, 2)
    sink = Sink()
    one = named(stream, sink, "one", 10, "g", group=True)
    assert sink.offsets("one") == [0, 1]  # alone, it reads every partition
    two = named(stream, sink, "two", 10, "g", group=True)
    publish(stream, 2, 2)
    # Partition 1 of 2 members is the second member's, once the first finished its deliveries.
    assert sink.offsets("two") == [] and sink.offsets("one") == [0, 1]
    ack_offsets(stream, sink, one, [0])
    assert sink.offsets("two") == []
    ack_offsets(stream, sink, one, [1])
    assert sink.offsets("two") == [2, 3] and sink.offsets("one") == [0, 1]
    stream.remove_consumer(two)  # the first takes it back where the second stopped
    assert sink.offsets("one") == [0, 1, 2, 3]


def test_reset_moves_a_subscription_and_its_reader(stream: StreamQueue) -> None:
    store = stream.store = Store()
    publish(stream, 4)
    sink = Sink()
    each = named(stream, sink, "a", 100, "sub")
    ack_offsets(stream, sink, each, [0, 1, 2, 3])
    assert stream.reset("sub", OffsetSpec("offset", 1)) == 1
    assert store.stored[-1] == ("sub", 1) and sink.offsets("a") == [0, 1, 2, 3, 1, 2, 3]
    assert stream.reset("sub", OffsetSpec("next")) == 4


def test_a_policys_stream_keys_win_over_the_arguments_and_go_with_it(stream: StreamQueue) -> None:
    from postroom.broker.core.policy import Policy
    from postroom.broker.core.settings import QueueSettings

    stream.arguments.update({"x-max-age": "7D", "x-stream-max-segment-size-bytes": 4096})
    stream.apply_settings(QueueSettings())
    assert stream.retention() == (None, 7 * 86400.0) and stream.log.segment_bytes == 4096
    definition = {"max-age": "1h", "max-length-bytes": 5000, "stream-max-segment-size-bytes": 999}
    stream.policy = Policy("p", "^s$", definition)
    stream.operator_policy = Policy("o", "^s$", {"max-length-bytes": 3000})
    stream.apply_settings(QueueSettings())
    assert stream.retention() == (3000, 3600.0) and stream.log.segment_bytes == 999  # the lower of the two limits
    stream.policy = stream.operator_policy = None
    stream.apply_settings(QueueSettings())
    assert stream.retention() == (None, 7 * 86400.0) and stream.log.segment_bytes == 4096


@pytest.mark.parametrize(
    "properties",
    [
        (0, b""),
        (0x8000, shortstr("text/plain")),
        (0xC000 | 0x1000, shortstr("text/plain") + shortstr("gzip") + b"\x02"),
        (0x4000 | 0x0080, shortstr("gzip") + shortstr("id-1")),
        (0x1000 | 0x0800 | 0x0040, b"\x02\x05" + (1700000000).to_bytes(8, "big")),
    ],
)
def test_the_offset_goes_where_a_headers_table_belongs_in_a_header_without_one(properties: tuple[int, bytes]) -> None:
    from pamqp import header as pamqp_header

    flags, encoded = properties
    header = (60).to_bytes(2, "big") + b"\0\0" + (5).to_bytes(8, "big") + flags.to_bytes(2, "big") + encoded
    delivered = with_offset(header, 2**40 + 3)
    parsed = pamqp_header.ContentHeader()
    parsed.unmarshal(delivered)
    original = pamqp_header.ContentHeader()
    original.unmarshal(header)
    assert parsed.properties.headers == {"x-stream-offset": 2**40 + 3}
    assert {k: v for k, v in vars(parsed.properties).items() if k != "headers"} == {
        k: v for k, v in vars(original.properties).items() if k != "headers"
    }
    assert parsed.body_size == 5


def test_a_chunk_that_cannot_be_read_stops_its_reader_only(stream: StreamQueue) -> None:
    publish(stream, 2)
    publish(stream, 2, 2)
    sink = Sink()
    failing = consumer(stream, sink, "failing", 1)
    stream.add_consumer(failing, OffsetSpec("first"))
    assert sink.offsets("failing") == [0, 1]
    storage = stream.log.storage
    assert isinstance(storage, MemorySegmentStorage)
    storage.fail_next("read", OSError(5, "Input/output error"))
    ack(stream, failing, 2)  # the next chunk's read fails: no error reaches the acking channel
    assert sink.offsets("failing") == [0, 1]
    stream.add_consumer(consumer(stream, sink, "other", 10), OffsetSpec("first"))
    publish(stream, 1, 4)
    assert sink.offsets("other") == [0, 1, 2, 3, 4] and sink.offsets("failing") == [0, 1]

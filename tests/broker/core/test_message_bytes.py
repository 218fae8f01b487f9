"""A message is the publisher's bytes: requeues and dead-lettering change only what RabbitMQ changes."""

from __future__ import annotations

import struct

from pamqp import commands

from postroom.broker.core.message import Message
from postroom.broker.core.node import Node
from postroom.broker.tools.testing import Client, encode
from postroom.broker.wire.codec import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, frame, shortstr
from postroom.broker.wire.content import EXPIRATION, HEADERS, property_spans
from postroom.broker.wire.table import decode_table, iter_table
from tests.broker.amqp.test_table import ALL_TYPES, table_of


def opened() -> Client:
    c = Client(Node())
    c.handshake()
    c.open_channel(1)
    return c


def header_payload(table: bytes, expiration: bytes | None = None) -> bytes:
    """content-type, headers, delivery-mode 2, [expiration], message-id, timestamp: as a client sends them."""
    flags = 0x8000 | 0x2000 | 0x1000 | 0x0080 | 0x0040 | (0x0100 if expiration is not None else 0)
    props = b"\x10application/json" + table + b"\x02"
    if expiration is not None:
        props += bytes((len(expiration),)) + expiration
    props += b"\x03m-1" + struct.pack(">Q", 1_700_000_000)
    return struct.pack(">HHQH", 60, 0, 4, flags) + props


def raw_publish(c: Client, routing_key: str, header: bytes, exchange: str = "") -> None:
    method = encode(1, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
    c.connection.receive_data(method + frame(FRAME_HEADER, 1, header) + frame(FRAME_BODY, 1, b"body"))
    c.connection.data_to_send()


def raw_frames(data: bytes) -> list[tuple[int, bytes]]:
    frames = []
    pos = 0
    while pos < len(data):
        kind, _channel, size = struct.unpack_from(">BHI", data, pos)
        frames.append((kind, data[pos + 7 : pos + 7 + size]))
        pos += 8 + size
    return frames


def get(c: Client, queue: str, requeue: bool | None) -> bytes:
    """``basic.get`` one message; then reject it (``requeue``) unless ``None``: its content header payload."""
    c.connection.receive_data(encode(1, commands.Basic.Get(queue=queue)))
    frames = raw_frames(c.connection.data_to_send())
    assert frames[0][0] == FRAME_METHOD and frames[0][1][:4] == struct.pack(">I", 0x003C0047), frames
    tag = struct.unpack_from(">Q", frames[0][1], 4)[0]
    if requeue is not None:
        c.connection.receive_data(encode(1, commands.Basic.Reject(delivery_tag=tag, requeue=requeue)))
        c.connection.data_to_send()
    return frames[1][1]


def entries(header: bytes) -> list[tuple[bytes, bytes]]:
    start, end = property_spans(header)[1][HEADERS]
    content = header[start + 4 : end]
    return [(key, content[value - 1 : stop]) for key, _tag, value, stop in iter_table(content, 0, len(content))]


def test_requeues_keep_every_byte_and_splice_in_only_x_delivery_count() -> None:
    c = opened()
    c.call(1, commands.Queue.Declare(queue="work"))
    sent = header_payload(table_of(ALL_TYPES))
    raw_publish(c, "work", sent)
    assert get(c, "work", requeue=True) == sent
    once = get(c, "work", requeue=True)
    twice = get(c, "work", requeue=None)
    for header, count in ((once, 1), (twice, 2)):
        assert entries(header)[:-1] == entries(sent)  # the publisher's entries, as sent, in order
        assert entries(header)[-1] == (b"x-delivery-count", b"l" + struct.pack(">q", count))
        spans = property_spans(header)[1]
        assert header[: spans[HEADERS][0]] == sent[: property_spans(sent)[1][HEADERS][0]]  # flags, content-type
        assert header[spans[HEADERS][1] :] == sent[property_spans(sent)[1][HEADERS][1] :]  # the rest


def test_dead_lettering_moves_the_publishers_entries_whole_and_writes_x_death_as_rabbitmq() -> None:
    c = opened()
    c.call(1, commands.Queue.Declare(queue="dlq"))
    c.call(1, commands.Queue.Bind(queue="dlq", exchange="amq.direct", routing_key="dead"))
    args = {"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "dead"}
    c.call(1, commands.Queue.Declare(queue="work", arguments=args))
    sent = header_payload(table_of(ALL_TYPES), expiration=b"60000")
    raw_publish(c, "work", sent)
    get(c, "work", requeue=True)  # adds x-delivery-count, which dead-lettering removes
    get(c, "work", requeue=False)
    dead = get(c, "dlq", requeue=None)
    got = entries(dead)
    assert [key for key, _ in got] == sorted(key for key, _ in got)  # RabbitMQ sorts the table
    publisher = dict(entries(sent))
    assert {key: value for key, value in got if key in publisher} == publisher  # every byte kept
    assert set(dict(got)) - set(publisher) == {
        b"x-death",
        b"x-first-death-exchange",
        b"x-first-death-queue",
        b"x-first-death-reason",
    }
    assert EXPIRATION not in property_spans(dead)[1]
    headers, _ = decode_table(dead, property_spans(dead)[1][HEADERS][0])
    (death,) = headers["x-death"]
    assert list(death) == ["count", "reason", "queue", "time", "exchange", "routing-keys", "original-expiration"]
    assert (death["count"], death["reason"], death["queue"], death["original-expiration"]) == (
        1,
        "rejected",
        "work",
        "60000",
    )
    assert dict(got)[b"x-death"][1 + 4 + 1 + 4 + 1 + 5] == ord("l")  # count is a long-long


def test_a_stored_message_whose_headers_do_not_parse_is_still_requeued_and_dead_lettered() -> None:
    # Refused at publish (as RabbitMQ refuses it), such a message may still come back from a
    # log written by an earlier version: nothing after the publish may fail on it.
    c = opened()
    c.call(1, commands.Queue.Declare(queue="dlq"))
    c.call(1, commands.Queue.Bind(queue="dlq", exchange="amq.fanout"))
    c.call(1, commands.Queue.Declare(queue="work", arguments={"x-dead-letter-exchange": "amq.fanout"}))
    broken = struct.pack(">I", 5) + b"\x01kZ\x00\x00"  # an unknown field type
    sent = header_payload(broken)
    c.connection.node.vhosts["/"].queues["work"].enqueue(
        Message("", "work", shortstr("") + shortstr("work"), sent, b"body")
    )
    requeued = get(c, "work", requeue=True)
    assert requeued == sent  # first delivery: as sent
    assert b"\x01kZ\x00\x00" in get(c, "work", requeue=True)  # redelivery: x-delivery-count after it
    get(c, "work", requeue=False)
    dead = get(c, "dlq", requeue=None)
    assert b"\x01kZ\x00\x00" in dead and b"x-death" in dead
    assert c.connection.teardown_errors == []


def test_dead_lettering_never_raises_on_what_the_message_or_queue_holds() -> None:
    # After a publish was confirmed nothing may fail on it: an x-death count at the top of its
    # type starts the history again; a copy that cannot be addressed (a dead-letter routing key
    # longer than a short string) is counted as dropped, and the other dead letters go on.
    c = opened()
    c.call(1, commands.Queue.Declare(queue="dlq"))
    c.call(1, commands.Queue.Bind(queue="dlq", exchange="amq.fanout"))
    c.call(1, commands.Queue.Declare(queue="work", arguments={"x-dead-letter-exchange": "amq.fanout"}))
    c.call(
        1,
        commands.Queue.Declare(
            queue="long", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k" * 300}
        ),
    )
    entry = b"\x05count" + b"l" + struct.pack(">q", 2**63 - 1) + b"\x06reasonS" + struct.pack(">I", 8) + b"rejected"
    entry += b"\x05queueS" + struct.pack(">I", 4) + b"work"
    death = b"F" + struct.pack(">I", len(entry)) + entry
    headers = b"\x07x-deathA" + struct.pack(">I", len(death)) + death
    raw_publish(c, "work", header_payload(struct.pack(">I", len(headers)) + headers))
    get(c, "work", requeue=False)
    dead = get(c, "dlq", requeue=None)
    (x_death,) = decode_table(dead, property_spans(dead)[1][HEADERS][0])[0]["x-death"]
    assert (x_death["count"], x_death["queue"]) == (1, "work")
    vhost = c.connection.node.vhosts["/"]
    raw_publish(c, "long", header_payload(table_of(ALL_TYPES)))
    raw_publish(c, "long", header_payload(table_of(ALL_TYPES)))
    get(c, "long", requeue=False)
    get(c, "long", requeue=False)
    assert vhost.dead_letters_dropped == 2 and vhost.queues["long"].message_count == 0
    assert c.connection.teardown_errors == []

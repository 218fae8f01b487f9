"""Teardown and odd inputs, frame for frame: Postroom answers exactly as RabbitMQ 3.10 does.

Each scenario is a function of a broker's port (and a name prefix shared by its two runs)
that returns the normalized transcript of what its clients read (see ``transcript.py``). Each
test runs the scenario against the session's RabbitMQ node, checks the few facts about
RabbitMQ the scenario is about (so a different RabbitMQ shows as such, not as a Postroom
bug), then runs it against an in-process Postroom and compares the two transcripts.

Scenarios use names of their own (RabbitMQ is shared by the session) and delete their queues.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from transcript import (
    AT_EOF,
    Client,
    Entry,
    Transcript,
    array,
    assert_same_transcript,
    channel_close,
    close_connection,
    connection_close,
    delete_queues,
    ending,
    field,
    frames,
    handshake,
    headers_properties,
    method,
    open_connection,
    publish,
    quiet,
    table,
    table_entries,
    unique_prefix,
    until,
    wait_for,
    without_header,
)

pytestmark = pytest.mark.integration

Scenario = Callable[[int, str], list[Entry]]

#: 200 KiB: more than one frame at frame_max 131072, and far more than the client's 4 KiB
#: receive buffer, so the broker still has output queued when ``connection.close`` arrives.
BIG_BODY = bytes(range(256)) * 800

#: How many connections the descriptor-leak check makes.
LEAK_ROUNDS = 20


def compare(scenario: Scenario, rabbitmq_port: int, postroom_port: int) -> tuple[list[Entry], list[Entry]]:
    """Run ``scenario`` against RabbitMQ, then Postroom, with the same names; both transcripts."""
    prefix = unique_prefix()
    return scenario(rabbitmq_port, prefix), scenario(postroom_port, prefix)


def kinds(entries: list[Entry]) -> list[str]:
    """The kinds of ``entries``, notes left out, to state the shape of an oracle's answer."""
    return [entry.kind for entry in entries if entry.kind != "note"]


def first(entries: list[Entry], kind: str) -> Entry:
    """The first entry of ``kind``.

    :raises LookupError: there is none
    """
    for entry in entries:
        if entry.kind == kind:
            return entry
    raise LookupError(f"no {kind} in the transcript")


def close_codes(entries: list[Entry]) -> list[tuple[str, int, str, int, int]]:
    """Every close in ``entries`` as ``(kind, reply_code, reply_text, class_id, method_id)``."""
    return [
        (e.kind, e.get("reply_code"), e.get("reply_text"), e.get("class_id"), e.get("method_id"))
        for e in entries
        if e.kind in ("Channel.Close", "Connection.Close")
    ]


#: What every connection reads first, in both brokers.
HANDSHAKE = ["Connection.Start", "Connection.Tune", "Connection.OpenOk"]


# -- 1. connection.close while a large delivery is still being written --------------------------


def close_with_output_queued(port: int, prefix: str) -> list[Entry]:
    """Everything in one write, from the protocol header to ``connection.close``, with a 200 KiB
    ``basic.get`` answer in between and a 4 KiB client receive buffer; read to ``close-ok``."""
    queue = f"{prefix}-big"
    transcript = Transcript()
    try:
        with transcript.connect(port, rcvbuf=4096) as client:
            client.send(
                handshake(),
                frames(1, commands.Channel.Open(), commands.Queue.Declare(queue=queue)),
                publish(1, "", queue, BIG_BODY),
                frames(1, commands.Basic.Get(queue=queue, no_ack=True)),
                connection_close(),
            )
            client.read(until("Connection.CloseOk"))
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def test_close_with_output_queued_delivers_everything_then_close_ok(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(close_with_output_queued, rabbitmq_port, broker.port)
    assert kinds(expected) == [
        *HANDSHAKE,
        "Channel.OpenOk",
        "Queue.DeclareOk",
        "Basic.GetOk",
        "ContentHeader",
        "ContentBody",
        "ContentBody",
        "Connection.CloseOk",
    ]
    assert [e.get("size") for e in expected if e.kind == "ContentBody"] == [131064, len(BIG_BODY) - 131064]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def _open_descriptors() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def _close_wait_sockets(port: int) -> int:
    """How many TCP sockets on local port ``port`` are in CLOSE-WAIT (state 08 in /proc/net/tcp):
    the peer hung up and nobody here closed its end."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.split(":")[1], 16) == port and state == "08":
            count += 1
    return count


def test_close_with_output_queued_leaks_no_descriptors(broker: Any) -> None:
    """Postroom only: after 20 such connections its descriptors and CLOSE-WAIT sockets are back
    to where they were (the broker runs in this process, so its descriptors are ours)."""
    baseline = _open_descriptors()
    for _ in range(LEAK_ROUNDS):
        transcript = close_with_output_queued(broker.port, unique_prefix())
        assert transcript[-1].kind == "Connection.CloseOk", transcript[-1]
    settled = wait_for(lambda: _open_descriptors() <= baseline and _close_wait_sockets(broker.port) == 0)
    assert settled, (
        f"{_open_descriptors() - baseline} descriptors leaked and "
        f"{_close_wait_sockets(broker.port)} sockets left in CLOSE-WAIT after {LEAK_ROUNDS} connections"
    )


# -- 2. every field type through reject and requeue ---------------------------------------------

#: One headers entry of each of RabbitMQ's 17 field types, plus a second double (beyond float32
#: range) and a second long string (not UTF-8): 19 entries, each value's bytes written by hand,
#: so the exact types reach the broker.
ALL_FIELD_TYPES = table(
    field("bool", "t", b"\x01"),
    field("int8", "b", struct.pack(">b", -128)),
    field("uint8", "B", struct.pack(">B", 255)),
    field("int16", "s", struct.pack(">h", -32768)),
    field("uint16", "u", struct.pack(">H", 65535)),
    field("int32", "I", struct.pack(">i", -(2**31))),
    field("uint32", "i", struct.pack(">I", 2**32 - 1)),
    field("int64", "l", struct.pack(">q", -(2**63))),
    field("float32", "f", struct.pack(">f", 1.5)),
    field("float64-tenth", "d", struct.pack(">d", 0.1)),
    field("float64-huge", "d", struct.pack(">d", 1e300)),
    field("decimal", "D", struct.pack(">Bi", 2, -12345)),
    field("longstr", "S", struct.pack(">I", 6) + "при".encode()),
    field("longstr-not-utf8", "S", struct.pack(">I", 2) + b"\xff\xfe"),
    field("array", "A", array(("I", struct.pack(">i", 7)), ("S", struct.pack(">I", 1) + b"a"), ("t", b"\x00"))),
    field("timestamp", "T", struct.pack(">Q", 1_700_000_000)),
    field("table", "F", table(field("inner", "s", struct.pack(">h", -2)), field("empty", "F", table()))),
    field("void", "V", b""),
    field("bytes", "x", struct.pack(">I", 3) + b"\x00\xff\x10"),
)


def field_types_through_reject(port: int, prefix: str) -> list[Entry]:
    """Publish (confirmed) a message carrying :data:`ALL_FIELD_TYPES`, then get it and reject it
    with requeue twice, and get it a third time."""
    queue = f"{prefix}-types"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            client.send(frames(1, commands.Confirm.Select(), commands.Queue.Declare(queue=queue)))
            client.read(until("Queue.DeclareOk"))
            client.send(publish(1, "", queue, b"typed", headers_properties(ALL_FIELD_TYPES)))
            client.read(until("Basic.Ack", "Basic.Nack"))
            for delivery_tag in (1, 2):
                client.send(frames(1, commands.Basic.Get(queue=queue)))
                client.read(until("ContentBody", "Basic.GetEmpty"))
                client.send(frames(1, commands.Basic.Reject(delivery_tag=delivery_tag, requeue=True)))
            client.send(frames(1, commands.Basic.Get(queue=queue)))
            client.read(until("ContentBody", "Basic.GetEmpty"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def test_every_field_type_survives_reject_and_requeue_byte_for_byte(rabbitmq_port: int, broker: Any) -> None:
    """RabbitMQ sends the headers table back byte-identical on every delivery. Postroom adds
    ``x-delivery-count`` to redeliveries on purpose (its delivery limits); exactly that entry is
    taken out of its transcript, and everything else must match."""
    expected, actual = compare(field_types_through_reject, rabbitmq_port, broker.port)
    headers = [e.get("headers") for e in expected if e.kind == "ContentHeader"]
    sent = table_entries(ALL_FIELD_TYPES[4:])
    assert headers == [sent, sent, sent]
    assert [e.get("redelivered") for e in expected if e.kind == "Basic.GetOk"] == [False, True, True]
    assert_same_transcript(expected, without_header(actual, "x-delivery-count"), ("rabbitmq", "postroom"))


# -- 3. a connection dropped while holding a message, an exclusive queue and a consumer ---------


def _queue_state(port: int, queue: str) -> tuple[int, int] | None:
    """``(message_count, consumer_count)`` from a passive declare, or None if there is no ``queue``."""
    scratch = Transcript()
    with scratch.connect(port) as client:
        open_connection(client, 1)
        client.send(method(1, commands.Queue.Declare, queue=queue, passive=True))
        answer = client.read(until("Queue.DeclareOk"))
        close_connection(client)
    if ending(answer) != "Queue.DeclareOk":
        return None
    return answer[-1].get("message_count"), answer[-1].get("consumer_count")


def dropped_connection(port: int, prefix: str, drop: Callable[[Client], None]) -> list[Entry]:
    """Connection A declares an exclusive queue and a shared one, gets a message from the shared
    queue without acking it (channel 1), consumes from it (channel 2) and is dropped by ``drop``;
    then connection B looks at both queues, publishes a second message and gets twice."""
    shared, exclusive = f"{prefix}-shared", f"{prefix}-exclusive"
    transcript = Transcript()
    try:
        transcript.note("connection A")
        with transcript.connect(port) as a:
            open_connection(a, 1, 2)
            a.send(frames(1, commands.Queue.Declare(queue=exclusive, exclusive=True)))
            a.read(until("Queue.DeclareOk"))
            a.send(frames(1, commands.Queue.Declare(queue=shared)))
            a.read(until("Queue.DeclareOk"))
            a.send(publish(1, "", shared, b"first"), frames(1, commands.Basic.Get(queue=shared)))
            a.read(until("ContentBody", "Basic.GetEmpty"))
            a.send(frames(2, commands.Basic.Consume(queue=shared)))
            a.read(until("Basic.ConsumeOk"))
            transcript.note(f"connection A dropped ({drop.__name__})")
            drop(a)
        # Both brokers clean up after a dropped socket asynchronously: wait for that to be
        # visible (or give up after the safety timeout, and let the transcript show the state).
        wait_for(lambda: _queue_state(port, shared) == (1, 0) and _queue_state(port, exclusive) is None)
        transcript.note("connection B")
        with transcript.connect(port) as b:
            open_connection(b, 1)
            b.send(method(1, commands.Queue.Declare, queue=shared, passive=True))
            b.read(until("Queue.DeclareOk"))
            b.send(method(1, commands.Queue.Declare, queue=exclusive, passive=True))
            if ending(b.read(until("Queue.DeclareOk"))) == "Channel.Close":
                b.send(frames(1, commands.Channel.CloseOk(), commands.Channel.Open()))
                b.read(until("Channel.OpenOk"))
            b.send(publish(1, "", shared, b"second"))
            for _ in range(2):
                b.send(frames(1, commands.Basic.Get(queue=shared)))
                b.read(until("ContentBody", "Basic.GetEmpty"))
            close_connection(b)
    finally:
        delete_queues(port, shared, exclusive)
    return transcript.normalized()


@pytest.mark.parametrize("drop", [Client.hang_up, Client.reset], ids=["fin", "rst"])
def test_dropped_connection_requeues_cancels_and_deletes(
    rabbitmq_port: int, broker: Any, drop: Callable[[Client], None]
) -> None:
    """The unacked message is ready again, the consumer is gone and the exclusive queue too.

    Postroom's ``x-delivery-count`` on the redelivered message (added on purpose, see the
    field-types test) is taken out of its transcript, with the headers table it created for it.
    """
    expected, actual = compare(lambda port, prefix: dropped_connection(port, prefix, drop), rabbitmq_port, broker.port)
    actual = without_header(actual, "x-delivery-count", drop_emptied=True)
    after = expected[expected.index(Entry(0, "note", (("text", "connection B"),))) :]
    declared = first(after, "Queue.DeclareOk")
    assert (declared.get("message_count"), declared.get("consumer_count")) == (1, 0)
    assert close_codes(after)[0][:2] == ("Channel.Close", 404)
    assert [e.get("bytes") for e in after if e.kind == "ContentBody"] == [b"first", b"second"]
    assert [e.get("redelivered") for e in after if e.kind == "Basic.GetOk"] == [True, False]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


# -- 4. unusual inputs --------------------------------------------------------------------------

#: Levels of nesting in the deep-table scenario.
DEPTH = 1000


def _nested_table(depth: int) -> bytes:
    """A field table ``{"a": {"a": … {}}}`` holding ``depth`` tables in all, itself included."""
    raw = table()
    for _ in range(depth - 1):
        raw = table(field("a", "F", raw))
    return raw


def deep_table_arguments(port: int, prefix: str) -> list[Entry]:
    """``queue.declare`` whose arguments table is nested :data:`DEPTH` levels deep."""
    queue = f"{prefix}-deep"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            client.send(method(1, commands.Queue.Declare, queue=queue, arguments=_nested_table(DEPTH)))
            client.read(until("Queue.DeclareOk"))
            close_connection(client)
    finally:
        delete_queues(port, queue)
    return transcript.normalized()


def test_deeply_nested_arguments_are_accepted(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(deep_table_arguments, rabbitmq_port, broker.port)
    assert kinds(expected) == [*HANDSHAKE, "Channel.OpenOk", "Queue.DeclareOk", "Connection.CloseOk"]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def exchange_name_not_utf8(port: int, prefix: str) -> list[Entry]:
    """``basic.publish`` to an exchange named by the bytes ``ff fe``; then channel 2 is used.

    The reply text's explanation may differ (how a broker prints bytes that are not UTF-8).
    """
    transcript = Transcript()
    with transcript.connect(port) as client:
        open_connection(client, 1, 2)
        client.send(publish(1, b"\xff\xfe", "rk", b"lost"))
        if ending(client.read(until("Channel.CloseOk"), loose_reply_texts=True)) == "Channel.Close":
            client.send(frames(1, commands.Channel.CloseOk()))
        client.send(frames(2, commands.Basic.Qos(prefetch_count=1)))
        client.read(until("Basic.QosOk"))
        close_connection(client)
    return transcript.normalized()


def test_publish_to_exchange_name_not_utf8_is_not_found(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(exchange_name_not_utf8, rabbitmq_port, broker.port)
    assert [close[:2] + close[3:] for close in close_codes(expected)] == [("Channel.Close", 404, 60, 40)]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def tune_ok_channel_max_zero(port: int, prefix: str) -> list[Entry]:
    """A handshake whose tune-ok says ``channel_max`` 0 (no limit), with ``open`` pipelined."""
    transcript = Transcript()
    with transcript.connect(port) as client:
        client.send(handshake(channel_max=0))
        answer = ending(client.read(until("Connection.OpenOk")))
        if answer == "Connection.Close":
            client.send(frames(0, commands.Connection.CloseOk()))
            client.read(AT_EOF)
        elif answer == "Connection.OpenOk":
            close_connection(client)
    return transcript.normalized()


def test_tune_ok_channel_max_zero_is_refused_by_dropping_the_connection(rabbitmq_port: int, broker: Any) -> None:
    """RabbitMQ refuses 0 ("no limit") when it has a limit itself (2047), during the handshake:
    it sends no ``connection.close``, waits 3 s (``SILENT_CLOSE_DELAY``, against clients that
    retry in a loop) and closes the socket, with an RST (its listeners linger 0)."""
    expected, actual = compare(tune_ok_channel_max_zero, rabbitmq_port, broker.port)
    assert kinds(expected) == ["Connection.Start", "Connection.Tune", "CLOSED"]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


#: Queue-name suffixes that are not AMQP "shortstr" safe ASCII: wildcards, a percent sign and
#: Cyrillic letters. RabbitMQ accepts any UTF-8 up to 255 bytes.
ODD_NAMES = ("*", "#", "%", "заказы%")


def odd_queue_names(port: int, prefix: str) -> list[Entry]:
    """Declare a queue for each of :data:`ODD_NAMES`, then declare each again passively."""
    queues = [f"{prefix}-{suffix}" for suffix in ODD_NAMES]
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            for passive in (False, True):
                for queue in queues:
                    client.send(method(1, commands.Queue.Declare, queue=queue, passive=passive))
                    if ending(client.read(until("Queue.DeclareOk"))) == "Channel.Close":
                        client.send(frames(1, commands.Channel.CloseOk(), commands.Channel.Open()))
                        client.read(until("Channel.OpenOk"))
            close_connection(client)
    finally:
        delete_queues(port, *queues)
    return transcript.normalized()


def test_queue_names_with_wildcards_percent_and_cyrillic_are_accepted(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(odd_queue_names, rabbitmq_port, broker.port)
    assert kinds(expected) == [*HANDSHAKE, "Channel.OpenOk", *["Queue.DeclareOk"] * 8, "Connection.CloseOk"]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


# -- 5. a client's channel.close crossing the server's -------------------------------------------


def crossing_channel_close(port: int, prefix: str) -> list[Entry]:
    """In one write on channel 1: a publish to a missing exchange (the server closes the channel,
    404), a ``basic.qos`` and the client's own ``channel.close``. After reading the server's close
    (and whatever else channel 1 gets) the client sends ``close-ok``; then it uses channel 2 and
    opens channel 1 again."""
    transcript = Transcript()
    with transcript.connect(port) as client:
        open_connection(client, 1, 2)
        client.send(
            publish(1, f"{prefix}-missing", "rk", b"lost"),
            frames(1, commands.Basic.Qos(prefetch_count=5)),
            channel_close(1),
        )
        if ending(client.read(until("Channel.Close", "Channel.CloseOk", channel=1))) == "Channel.Close":
            client.read(until("Channel.CloseOk", channel=1))
        client.send(frames(1, commands.Channel.CloseOk()))
        client.send(frames(2, commands.Basic.Qos(prefetch_count=1)))
        client.read(until("Basic.QosOk"))
        client.send(frames(1, commands.Channel.Open()))
        client.read(until("Channel.OpenOk"))
        close_connection(client)
    return transcript.normalized()


def test_crossing_channel_closes_are_answered_and_the_connection_stays_up(rabbitmq_port: int, broker: Any) -> None:
    """RabbitMQ answers the client's close with close-ok, drops the ``basic.qos`` on the closing
    channel, and the connection carries on."""
    expected, actual = compare(crossing_channel_close, rabbitmq_port, broker.port)
    assert kinds(expected) == [
        *HANDSHAKE,
        "Channel.OpenOk",
        "Channel.OpenOk",
        "Channel.Close",
        "Channel.CloseOk",
        "Basic.QosOk",
        "Channel.OpenOk",
        "Connection.CloseOk",
    ]
    assert [close[:2] for close in close_codes(expected)] == [("Channel.Close", 404)]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def unknown_delivery_tag(command: type[commands.Basic.Ack | commands.Basic.Reject | commands.Basic.Nack]) -> Scenario:
    """The scenario for ``command``: in one write on channel 1, ``command`` with delivery tag 99
    (never delivered), again with 100, then ``channel.close``; then channel 2 is opened."""

    def scenario(port: int, prefix: str) -> list[Entry]:
        transcript = Transcript()
        with transcript.connect(port) as client:
            open_connection(client, 1)
            client.send(
                frames(1, command(delivery_tag=99), command(delivery_tag=100)),
                channel_close(1),
            )
            if ending(client.read(until("Channel.Close", "Channel.CloseOk", channel=1))) == "Channel.Close":
                client.read(until("Channel.CloseOk", channel=1))
            client.send(frames(1, commands.Channel.CloseOk()))
            client.send(frames(2, commands.Channel.Open()))
            client.read(until("Channel.OpenOk"))
            close_connection(client)
        return transcript.normalized()

    return scenario


@pytest.mark.parametrize(
    ("command", "method_id"),
    [(commands.Basic.Ack, 80), (commands.Basic.Reject, 90), (commands.Basic.Nack, 120)],
    ids=["ack", "reject", "nack"],
)
def test_unknown_delivery_tag_closes_the_channel_naming_the_method(
    rabbitmq_port: int, broker: Any, command: type[commands.Basic.Ack], method_id: int
) -> None:
    """406 with the offending method's own class and method ids; the second settlement is
    dropped, the client's close is answered, the connection stays up."""
    expected, actual = compare(unknown_delivery_tag(command), rabbitmq_port, broker.port)
    assert close_codes(expected) == [
        ("Channel.Close", 406, "PRECONDITION_FAILED - unknown delivery tag 99", 60, method_id)
    ]
    assert kinds(expected)[-3:] == ["Channel.CloseOk", "Channel.OpenOk", "Connection.CloseOk"]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


# -- 6. connection.close three times --------------------------------------------------------------


def repeated_connection_close(port: int, prefix: str) -> list[Entry]:
    """After the handshake, ``connection.close`` three times in one write; read until quiet."""
    transcript = Transcript()
    with transcript.connect(port) as client:
        open_connection(client)
        close = connection_close()
        client.send(close, close, close)
        client.read(quiet())
    return transcript.normalized()


def test_each_repeated_connection_close_is_answered_and_the_socket_left_to_the_client(
    rabbitmq_port: int, broker: Any
) -> None:
    """RabbitMQ answers every ``connection.close`` with ``close-ok`` and leaves the socket open
    for the client to close (for up to 30 s)."""
    expected, actual = compare(repeated_connection_close, rabbitmq_port, broker.port)
    assert kinds(expected) == [*HANDSHAKE, *["Connection.CloseOk"] * 3]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


# -- 7. channel.flow ------------------------------------------------------------------------------


def channel_flow(active: bool) -> Scenario:
    """The scenario: ``channel.flow(active)`` on channel 1, then close what is left."""

    def scenario(port: int, prefix: str) -> list[Entry]:
        transcript = Transcript()
        with transcript.connect(port) as client:
            open_connection(client, 1)
            client.send(frames(1, commands.Channel.Flow(active=active)))
            answer = ending(client.read(until("Channel.FlowOk")))
            if answer == "Connection.Close":
                client.send(frames(0, commands.Connection.CloseOk()))
                client.read(AT_EOF)
            else:
                if answer == "Channel.Close":
                    client.send(frames(1, commands.Channel.CloseOk()))
                close_connection(client)
        return transcript.normalized()

    return scenario


def test_channel_flow_off_is_not_implemented(rabbitmq_port: int, broker: Any) -> None:
    """RabbitMQ closes the connection with 540 NOT_IMPLEMENTED (it never stops a publisher this
    way) and, once the client's ``close-ok`` is in, resets the socket."""
    expected, actual = compare(channel_flow(False), rabbitmq_port, broker.port)
    assert close_codes(expected) == [("Connection.Close", 540, "NOT_IMPLEMENTED - active=false", 20, 20)]
    assert kinds(expected)[-1] == "CLOSED"
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def test_channel_flow_on_is_acknowledged(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(channel_flow(True), rabbitmq_port, broker.port)
    assert kinds(expected) == [*HANDSHAKE, "Channel.OpenOk", "Channel.FlowOk", "Connection.CloseOk"]
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

"""The shovel's client connection (``broker.clients.link``), sans network: a ``StringTransport``
for the socket and a ``Clock`` for heartbeats."""

from __future__ import annotations

from typing import Any

from pamqp import commands
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from postroom.broker.clients.link import Link, LinkClosed
from postroom.broker.wire.codec import (
    FRAME_END,
    PROTOCOL_HEADER,
    ack_method,
    content_frames,
    decode_method,
    encode_method,
    nack_method,
    shortstr,
)


def frames_of(data: bytes) -> list[tuple[int, int, bytes]]:
    """The frames in ``data``: type, channel, payload."""
    found = []
    position = 0
    while position < len(data):
        frame_type = data[position]
        channel = int.from_bytes(data[position + 1 : position + 3], "big")
        size = int.from_bytes(data[position + 3 : position + 7], "big")
        payload = data[position + 7 : position + 7 + size]
        assert data[position + 7 + size] == FRAME_END
        found.append((frame_type, channel, payload))
        position += 8 + size
    return found


def opened(confirms: bool = False, heartbeat: int = 0) -> tuple[Link, StringTransport, Clock]:
    clock = Clock()
    link = Link("user", "pw", "/v", clock, heartbeat=heartbeat, name="Shovel s", confirms=confirms)
    transport = StringTransport()
    link.makeConnection(transport)
    assert transport.value() == PROTOCOL_HEADER
    transport.clear()
    start = commands.Connection.Start(server_properties={}, mechanisms="PLAIN", locales="en_US")
    link.dataReceived(encode_method(0, start))
    link.dataReceived(encode_method(0, commands.Connection.Tune(channel_max=0, frame_max=4096, heartbeat=heartbeat)))
    link.dataReceived(encode_method(0, commands.Connection.OpenOk()))
    link.dataReceived(encode_method(1, commands.Channel.OpenOk()))
    if confirms:
        link.dataReceived(encode_method(1, commands.Confirm.SelectOk()))
    return link, transport, clock


def test_a_link_logs_in_names_itself_opens_its_vhost_and_channel() -> None:
    link, transport, _clock = opened(confirms=True)
    sent = frames_of(transport.value())
    methods = [decode_method(payload, channel) for _type, channel, payload in sent]
    start_ok, tune_ok, open_, channel_open, select = methods
    assert isinstance(start_ok, commands.Connection.StartOk) and start_ok.response == "\0user\0pw"
    assert start_ok.client_properties["connection_name"] == "Shovel s"
    assert isinstance(tune_ok, commands.Connection.TuneOk) and tune_ok.frame_max == 4096
    assert isinstance(open_, commands.Connection.Open) and open_.virtual_host == "/v"
    assert isinstance(channel_open, commands.Channel.Open) and isinstance(select, commands.Confirm.Select)
    assert link.opened.called


def test_deliveries_are_handed_on_with_their_header_as_sent_and_publishes_send_it_back() -> None:
    link, transport, _clock = opened()
    seen: list[Any] = []
    link.on_deliver = lambda *delivery: seen.append(delivery)
    header = bytes.fromhex("003c0000000000000000000b9000") + shortstr("text/plain") + b"\x02"
    body = b"x" * 10_000  # over frame_max: three body frames
    deliver = commands.Basic.Deliver(
        consumer_tag="ctag", delivery_tag=7, redelivered=True, exchange="ex", routing_key="key"
    )
    header = header[:4] + len(body).to_bytes(8, "big") + header[12:]
    data = encode_method(1, deliver) + b"".join(content_frames(1, header, body, 4096))
    for index in range(0, len(data), 1000):  # however the bytes arrive
        link.dataReceived(data[index : index + 1000])
    assert seen == [(7, True, "ex", "key", header, body)]
    transport.clear()
    assert link.publish("", "q", header, body) == 1
    sent = frames_of(transport.value())
    assert [frame_type for frame_type, _channel, _payload in sent] == [1, 2, 3, 3, 3]
    assert sent[1][2] == header and b"".join(payload for _t, _c, payload in sent[2:]) == body


def test_confirms_acks_and_nacks_go_by_sequence_and_tag() -> None:
    link, transport, _clock = opened(confirms=True)
    confirmed: list[tuple[int, bool, bool]] = []
    link.on_confirm = lambda *confirm: confirmed.append(confirm)
    link.dataReceived(ack_method(1, 3, True) + nack_method(1, 4, False))
    assert confirmed == [(3, True, True), (4, False, False)]
    transport.clear()
    link.ack(9, multiple=True)
    link.nack(10)
    assert transport.value() == ack_method(1, 9, True) + nack_method(1, 10, False)


def test_a_channel_error_ends_the_link_with_the_brokers_reason_and_fails_what_waits() -> None:
    link, transport, _clock = opened()
    waiting = link.call(commands.Queue.Bind(queue="q", exchange="missing"), commands.Queue.BindOk)
    failures: list[Any] = []
    waiting.addErrback(failures.append)
    link.dataReceived(
        encode_method(
            1,
            commands.Channel.Close(
                reply_code=404, reply_text="NOT_FOUND - no exchange 'missing'", class_id=50, method_id=20
            ),
        )
    )
    assert transport.disconnecting
    link.connectionLost(None)
    why = link.closed.result
    assert isinstance(why, LinkClosed)
    assert (why.reply_code, why.reply_text) == (404, "NOT_FOUND - no exchange 'missing'")
    assert failures[0].value is why


def test_a_missing_queue_is_asked_about_on_a_channel_of_its_own() -> None:
    link, transport, _clock = opened()
    answers: list[bool] = []
    defer.Deferred.fromCoroutine(link.exists("q")).addCallback(answers.append)
    link.dataReceived(encode_method(2, commands.Channel.OpenOk()))
    link.dataReceived(
        encode_method(
            2, commands.Channel.Close(reply_code=404, reply_text="NOT_FOUND - no queue 'q'", class_id=50, method_id=10)
        )
    )
    assert answers == [False] and not transport.disconnecting  # channel 1 goes on


def test_a_silent_broker_ends_the_link_after_two_heartbeats() -> None:
    link, transport, clock = opened(heartbeat=10)
    clock.advance(5)
    assert transport.value().endswith(b"\x08\x00\x00\x00\x00\x00\x00\xce")  # ours, when idle
    clock.advance(15)
    link.connectionLost(None)
    assert link.closed.result.reply_text == "heartbeat timeout"
    assert clock.getDelayedCalls() == []


def test_a_polite_close_that_gets_no_answer_is_cut_after_ten_seconds() -> None:
    link, transport, clock = opened()
    link.close()
    assert not transport.disconnecting
    clock.advance(10)
    assert transport.disconnecting or transport.disconnected


def test_a_queue_that_exists_is_found_and_its_channel_closed() -> None:
    link, transport, _clock = opened()
    answers: list[bool] = []
    defer.Deferred.fromCoroutine(link.exists("q")).addCallback(answers.append)
    link.dataReceived(encode_method(2, commands.Channel.OpenOk()))
    link.dataReceived(encode_method(2, commands.Queue.DeclareOk(queue="q", message_count=3, consumer_count=0)))
    transport.clear()
    link.dataReceived(encode_method(2, commands.Channel.CloseOk()))
    assert answers == [True]


def test_a_shovel_stopped_between_two_deliveries_of_one_read_takes_neither() -> None:
    """The frames of one read after the shovel stopped reach no one: the deliveries go back to
    the source queue when the link closes (nothing published, nothing acknowledged)."""
    from postroom.broker.server.shovels import Shovel, Shovels
    from postroom.config.shovels import parse

    link, transport, clock = opened()
    shovels = Shovels.__new__(Shovels)
    shovels.clock = clock
    shovel = Shovel(shovels, parse("/", "s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://"}))
    shovel.source, shovel.dest = link, link
    link.on_deliver = shovel._deliver
    header = bytes.fromhex("003c00000000000000000001" "0000")
    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    one = encode_method(1, deliver) + b"".join(content_frames(1, header, b"x", 4096))
    shovel.stop()  # (as when its parameter changes)
    transport.clear()
    link.dataReceived(one + one)
    assert b"\x00\x3c\x00\x28" not in transport.value()  # no basic.publish
    assert shovel.pending == {}

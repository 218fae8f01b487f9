"""Methods and frames in the wrong place, frame for frame: the reply code RabbitMQ 3.10 sends.

Each case opens a connection and channel 1, sends one wrong thing, and reads what follows
(a close, or silence). Reply texts are compared by their code's name only where RabbitMQ's
text quotes Erlang terms.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands
from test_teardown_transcripts import compare
from transcript import (
    Entry,
    Transcript,
    assert_same_transcript,
    frames,
    loose_erlang_text,
    open_connection,
    publish,
    quiet,
    raw_frame,
    until,
)

pytestmark = pytest.mark.integration


def _method(channel: int, index: int, arguments: bytes) -> bytes:
    return raw_frame(1, channel, struct.pack(">I", index) + arguments)


DECLARE = 0x0032000A  # queue.declare: ticket, queue, bits, arguments
CASES: dict[str, bytes] = {
    "server-only-channel-open-ok": frames(1, commands.Channel.OpenOk()),
    "connection-tune-ok-after-open": frames(0, commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0)),
    "connection-open-again": frames(0, commands.Connection.Open(virtual_host="/")),
    "channel-open-on-channel-0": frames(0, commands.Channel.Open()),
    "basic-qos-on-channel-0": frames(0, commands.Basic.Qos(prefetch_count=1)),
    "content-header-without-publish": raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 2, 0)),
    "content-body-without-header": raw_frame(3, 1, b"hi"),
    "heartbeat-on-channel-1": raw_frame(8, 1, b""),
    "declare-truncated": _method(1, DECLARE, b"\x00\x00\x05ab"),
    "declare-trailing-bytes": _method(1, DECLARE, b"\x00\x00\x01q\x00\x00\x00\x00\x00" + b"junk"),
    "declare-name-not-utf8": _method(1, DECLARE, b"\x00\x00\x02\xff\xfe\x00\x00\x00\x00\x00"),
    "unexpected-channel-close-ok": frames(1, commands.Channel.CloseOk()),
    "unknown-method-in-known-class": _method(1, 0x003C00FF, b""),
    "unknown-class": _method(1, 0x00FF000A, b""),
}
#: Cases in steps: each step is sent once the broker has answered the one before with a close.
STEPS: dict[str, list[bytes]] = {
    # The broker closes channel 1 (404); before its close-ok the client opens channel 1 again.
    # (Sent at once, the two race inside RabbitMQ: its channel may not have sent its close yet.)
    "channel-open-while-closing": [
        publish(1, "conformance-no-such-exchange", "k", b"x"),
        frames(1, commands.Channel.Open()),
    ],
}


def wrong(name: str) -> Any:
    def run(port: int, prefix: str) -> list[Entry]:
        transcript = Transcript()
        with transcript.connect(port) as client:
            open_connection(client, 1)
            *first, last = STEPS.get(name) or [CASES[name]]
            for step in first:
                client.send(step)
                client.read(until())
            client.send(last)
            client.read(quiet(1.0))
        return [loose_erlang_text(entry) for entry in transcript.normalized()]

    return run


@pytest.mark.parametrize("name", sorted([*CASES, *STEPS]))
def test_wrong_methods_and_frames_get_rabbitmqs_reply(rabbitmq_port: int, broker: Any, name: str) -> None:
    expected, actual = compare(wrong(name), rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

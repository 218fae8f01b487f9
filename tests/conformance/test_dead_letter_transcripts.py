"""Dead-lettering, frame for frame: the headers Postroom writes are the ones RabbitMQ 3.10 writes.

The same message dies three times (in ``work``, then in ``dead``, then in ``work`` again),
each time through the default exchange with a dead-letter routing key, and each dead copy
is read. What RabbitMQ's ``rabbit_dead_letter`` does, and these transcripts hold Postroom
to: the publisher's entries keep their types and bytes but the whole table is sorted by
key; the first ``x-death`` table is ``count, reason, queue, time, exchange, routing-keys,
original-expiration`` in that order, later ones are sorted by key; a repeat of a
``(queue, reason)`` raises that table's ``count`` (a long-long), keeps its other fields and
moves it first; ``expiration`` is removed; ``CC`` goes when a dead-letter routing key is set.
Only the death times differ between the two runs, and are masked.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands
from test_teardown_transcripts import compare, kinds
from transcript import (
    Entry,
    Transcript,
    array,
    assert_same_transcript,
    close_connection,
    delete_queues,
    field,
    frames,
    method,
    open_connection,
    table,
    until,
)
from transcript import content as content_frames

pytestmark = pytest.mark.integration

#: Headers in no particular order, of several types, with a CC list (removed on dead-lettering).
HEADERS = table(
    field("zeta", "S", struct.pack(">I", 1) + b"z"),
    field("CC", "A", array(("S", struct.pack(">I", 3) + b"cc1"))),
    field("alpha", "d", struct.pack(">d", 0.1)),
    field("Mixed", "b", b"\xff"),
    field("bytes", "S", struct.pack(">I", 2) + b"\xff\xfe"),
)


def properties() -> bytes:
    """``content-type``, the headers above, ``delivery-mode`` 2 and ``expiration`` "60000"."""
    flags = 0x8000 | 0x2000 | 0x1000 | 0x0100
    return struct.pack(">H", flags) + b"\x0bapplication" + HEADERS + b"\x02" + b"\x0560000"


def masked(entries: list[Entry]) -> list[Entry]:
    """``entries`` with every ``x-death`` ``time`` value zeroed (the one thing that must differ)."""
    result = []
    for entry in entries:
        if entry.kind == "ContentHeader":
            entry = Entry(entry.channel, entry.kind, tuple((name, _mask(value)) for name, value in entry.fields))
        result.append(entry)
    return result


def _mask(value: Any) -> Any:
    if not isinstance(value, tuple) or not all(isinstance(item, tuple) and len(item) == 3 for item in value):
        return value
    masked_items = []
    for key, tag, data in value:
        if key == "x-death":
            raw = bytearray(bytes.fromhex(data))
            at = raw.find(b"\x04timeT")
            while at >= 0:
                raw[at + 6 : at + 14] = bytes(8)
                at = raw.find(b"\x04timeT", at + 14)
            data = raw.hex()
        masked_items.append((key, tag, data))
    return tuple(masked_items)


def three_deaths(port: int, prefix: str) -> list[Entry]:
    """Publish to ``work``; reject it there (to ``dead``), there (to ``work``), and there again."""
    work, dead = f"{prefix}-dl-work", f"{prefix}-dl-dead"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            for queue, other in ((work, dead), (dead, work)):
                arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": other}
                client.send(frames(1, commands.Queue.Declare(queue=queue, arguments=arguments)))
                client.read(until("Queue.DeclareOk"))
            client.send(frames(1, commands.Confirm.Select()))
            client.read(until("Confirm.SelectOk"))
            client.send(
                method(1, commands.Basic.Publish, exchange="", routing_key=work)
                + content_frames(1, b"dies", properties())
            )
            client.read(until("Basic.Ack", "Basic.Nack"))
            for tag, queue in enumerate((work, dead, work, dead), start=1):
                client.send(frames(1, commands.Basic.Get(queue=queue)))
                client.read(until("ContentBody", "Basic.GetEmpty"))
                if tag < 4:
                    client.send(frames(1, commands.Basic.Reject(delivery_tag=tag, requeue=False)))
                    # RabbitMQ's source queue sends the dead letter on after it took the reject:
                    # a get on the source (empty now) is answered after both, so the next get
                    # finds the dead letter at its target.
                    client.send(frames(1, commands.Basic.Get(queue=queue, no_ack=True)))
                    client.read(until("Basic.GetEmpty", "ContentBody"))
                    transcript.entries.pop()
            close_connection(client)
    finally:
        delete_queues(port, work, dead)
    return masked(transcript.normalized())


def test_three_deaths_give_rabbitmqs_x_death_and_headers_byte_for_byte(rabbitmq_port: int, broker: Any) -> None:
    expected, actual = compare(three_deaths, rabbitmq_port, broker.port)
    assert kinds(expected).count("Basic.GetOk") == 4
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

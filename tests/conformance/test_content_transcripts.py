"""Malformed content properties, frame for frame: refused at publish as RabbitMQ 3.10 refuses them.

A content header whose property list runs past its end, or whose headers table does not
parse (a length past its end, an unknown field type, nested or not), is never stored or
delivered: RabbitMQ decodes every content header at publish and closes the connection.
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
    delete_queues,
    field,
    frames,
    open_connection,
    raw_frame,
    table,
    until,
)
from transcript import method as method_frame

pytestmark = pytest.mark.integration

HEADERS = 0x2000
CONTENT_TYPE = 0x8000

#: Property lists (flags word and properties) that do not parse, by name.
BAD_PROPERTIES = {
    "content-type-past-the-end": struct.pack(">H", CONTENT_TYPE) + b"\x09text",
    "headers-length-past-the-end": struct.pack(">H", HEADERS) + struct.pack(">I", 50) + b"\x01ab\x01",
    "unknown-field-type": struct.pack(">H", HEADERS) + table(field("k", "Z", b"\x00\x00")),
    "unknown-type-nested": struct.pack(">H", HEADERS)
    + table(field("outer", "F", table(field("inner", "A", struct.pack(">I", 2) + b"Z\x00")))),
    "string-past-its-table": struct.pack(">H", HEADERS) + struct.pack(">I", 8) + b"\x01kS\x00\x00\x00\x09",
}


def bad_content(name: str) -> Any:
    def run(port: int, prefix: str) -> list[Entry]:
        queue = f"{prefix}-content"
        transcript = Transcript()
        try:
            with transcript.connect(port) as client:
                open_connection(client, 1)
                client.send(frames(1, commands.Queue.Declare(queue=queue)))
                client.read(until("Queue.DeclareOk"))
                properties = BAD_PROPERTIES[name]
                header = struct.pack(">HHQ", 60, 0, 2) + properties
                client.send(
                    method_frame(1, commands.Basic.Publish, exchange="", routing_key=queue)
                    + raw_frame(2, 1, header)
                    + raw_frame(3, 1, b"hi")
                    + frames(1, commands.Basic.Get(queue=queue, no_ack=True))
                )
                client.read(until("Basic.GetOk", "Basic.GetEmpty", "Connection.Close", "Channel.Close"))
        finally:
            delete_queues(port, queue)
        with transcript.connect(port) as client:  # nothing was stored
            open_connection(client, 1)
            client.send(frames(1, commands.Queue.Declare(queue=queue)))
            client.read(until("Queue.DeclareOk"))
            client.send(frames(1, commands.Queue.Delete(queue=queue)))
            client.read(until("Queue.DeleteOk"))
        return transcript.normalized()

    return run


@pytest.mark.parametrize("name", sorted(BAD_PROPERTIES))
def test_malformed_content_properties_are_refused_at_publish(rabbitmq_port: int, broker: Any, name: str) -> None:
    expected, actual = compare(bad_content(name), rabbitmq_port, broker.port)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

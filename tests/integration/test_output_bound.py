"""A client that does not read its socket costs the broker at most a bounded amount of output,
whatever kind: here replies to ``basic.get``, which (unlike deliveries) a full socket buffer
does not stop. Once the client reads, everything it asked for arrives."""

from __future__ import annotations

import socket
import time
from typing import Any

import pika
import pytest
from pamqp import commands

from postroom.broker.server.protocol import OUTPUT_BOUND
from postroom.broker.tools.testing import PROTOCOL_HEADER, FramePump, encode

pytestmark = pytest.mark.integration

BODY = 1 << 20
ROUNDS = 60


def test_a_client_that_does_not_read_is_not_read_from_once_its_output_is_over_the_bound(broker: Any) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    connection.channel().queue_declare("big")
    connection.channel().basic_publish("", "big", b"m" * BODY)
    connection.close()
    vhost = broker.node.vhosts["/"]
    before = vhost.gets

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(("127.0.0.1", broker.port))
    sock.settimeout(30)
    handshake = PROTOCOL_HEADER + encode(
        0,
        commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"),
        commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
        commands.Connection.Open(virtual_host="/"),
    )
    asking = encode(1, commands.Channel.Open()) + ROUNDS * encode(
        1, commands.Basic.Get(queue="big"), commands.Basic.Recover(requeue=True)
    )
    sock.sendall(handshake + asking)

    def not_read_from() -> bool:  # stopped reading until the client reads its full buffer
        return any(p._output_full and not p._reading for p in broker.factory.protocols.values())

    deadline = time.monotonic() + 30
    while not broker.call(not_read_from) and time.monotonic() < deadline:
        time.sleep(0.02)
    answered = vhost.gets - before
    assert broker.call(not_read_from), answered
    assert 1 <= answered <= OUTPUT_BOUND // BODY + 8, answered  # the socket buffers hold a few more

    pump, got = FramePump(), 0
    deadline = time.monotonic() + 60
    while got < ROUNDS and time.monotonic() < deadline:
        got += sum(isinstance(value, commands.Basic.GetOk) for _, value in pump.feed(sock.recv(1 << 20)))
    sock.close()
    assert got == ROUNDS and vhost.gets - before == ROUNDS

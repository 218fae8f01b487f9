"""Vhost and user limits, frame for frame: what RabbitMQ 3.10 refuses, Postroom refuses alike.

The same limits exist on both brokers: vhost ``lim-v`` allows 2 connections and 2 queues,
``lim-shut`` no connection, ``lim-noq`` no queue; user ``capped`` may hold 2 connections and
3 channels over all of them. The scenario fills each limit, goes one over, frees one and
takes it again; both transcripts are compared.

RabbitMQ counts connections and channels from events that its tracking handlers process
after the ``-ok`` is sent, so the scenario lets each opening or closing settle
(:data:`SETTLE`) before the next step: without that pause RabbitMQ may let a pipelined one
slip past its limit (Postroom counts them exactly, at once).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from pamqp import commands
from test_teardown_transcripts import close_codes, compare
from transcript import (
    AT_EOF,
    Client,
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    ending,
    frames,
    handshake,
    method,
    until,
)

from postroom.broker.core.node import Node
from postroom.broker.core.users import User

pytestmark = pytest.mark.integration

#: Seconds for RabbitMQ's connection and channel tracking to take in an opening or a closing.
SETTLE = 0.3

VHOST_LIMITS = {
    "lim-v": {"max-connections": 2, "max-queues": 2},
    "lim-shut": {"max-connections": 0},
    "lim-noq": {"max-queues": 0},
}
USER_LIMITS = {"max-connections": 2, "max-channels": 3}


@pytest.fixture(scope="module")
def rabbitmq_limits(rabbitmq_port: int) -> int:
    import json

    from postroom.broker.tools.testing import rabbitmqctl

    for vhost, limits in VHOST_LIMITS.items():
        rabbitmqctl(rabbitmq_port, "add_vhost", vhost)
        rabbitmqctl(rabbitmq_port, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        rabbitmqctl(rabbitmq_port, "set_vhost_limits", "-p", vhost, json.dumps(limits))
    rabbitmqctl(rabbitmq_port, "add_user", "capped", "secret")
    rabbitmqctl(rabbitmq_port, "set_permissions", "-p", "/", "capped", ".*", ".*", ".*")
    rabbitmqctl(rabbitmq_port, "set_user_limits", "capped", json.dumps(USER_LIMITS))
    return rabbitmq_port


@pytest.fixture
def postroom_limits(make_broker: Any) -> Iterator[int]:
    users = [
        User("guest", password="guest", loopback_only=True),
        User(
            "capped",
            password="secret",
            vhosts=frozenset({"/"}),
            max_connections=USER_LIMITS["max-connections"],
            max_channels=USER_LIMITS["max-channels"],
        ),
    ]
    node = Node(users=users, vhost_names=("/", *VHOST_LIMITS))
    for vhost, limits in VHOST_LIMITS.items():
        node.vhosts[vhost].max_connections = limits.get("max-connections")
        node.vhosts[vhost].max_queues = limits.get("max-queues")
    yield make_broker(node).port


def opened(stack: ExitStack, transcript: Transcript, port: int, vhost: str = "/", user: str = "guest") -> Client:
    """A connection to ``vhost`` (its ``open-ok`` or refusal recorded), closed with ``stack``."""
    client = stack.enter_context(transcript.connect(port))
    client.send(handshake(vhost=vhost, user=user, password="guest" if user == "guest" else "secret"))
    client.read(until("Connection.OpenOk"))
    time.sleep(SETTLE)
    return client


def channel(client: Client, number: int) -> None:
    """Open channel ``number``; a refusal closes the connection, which the client completes."""
    client.send(frames(number, commands.Channel.Open()))
    if ending(client.read(until("Channel.OpenOk"))) == "Connection.Close":
        client.send(frames(0, commands.Connection.CloseOk()))
        client.read(AT_EOF)
    time.sleep(SETTLE)


def declare(client: Client, number: int, queue: str, **arguments: Any) -> None:
    client.send(frames(number, commands.Channel.Open(), commands.Queue.Declare(queue=queue, arguments=arguments)))
    client.read(until("Queue.DeclareOk", channel=number))


def closed(client: Client) -> None:
    """``connection.close``, then the socket (RabbitMQ counts a connection until its socket closes)."""
    close_connection(client)
    client.close()
    time.sleep(SETTLE)


def vhost_limits(port: int, prefix: str) -> list[Entry]:
    transcript = Transcript()
    with ExitStack() as stack:
        transcript.note("two connections to lim-v, a third over its limit")
        first = opened(stack, transcript, port, "lim-v")
        second = opened(stack, transcript, port, "lim-v")
        opened(stack, transcript, port, "lim-v")
        transcript.note("one closed, one more fits")
        closed(first)
        opened(stack, transcript, port, "lim-v")
        transcript.note("no connection to lim-shut")
        opened(stack, transcript, port, "lim-shut")
        transcript.note("two queues in lim-v, a third refused, its bad argument too")
        declare(second, 1, f"{prefix}-q1")
        declare(second, 2, f"{prefix}-q2")
        declare(second, 3, f"{prefix}-q3")
        declare(second, 4, f"{prefix}-q3", **{"x-message-ttl": "soon"})
        transcript.note("a redeclare is no new queue; a deleted one makes room")
        declare(second, 5, f"{prefix}-q1")
        second.send(method(5, commands.Queue.Delete, queue=f"{prefix}-q1"))
        second.read(until("Queue.DeleteOk", channel=5))
        declare(second, 6, f"{prefix}-q3")
        declare(second, 7, "")
        for number, queue in enumerate((f"{prefix}-q2", f"{prefix}-q3"), start=8):
            second.send(frames(number, commands.Channel.Open(), commands.Queue.Delete(queue=queue)))
            second.read(until("Queue.DeleteOk", channel=number))
        closed(second)
        transcript.note("no queue in lim-noq, not even a server-named one")
        empty = opened(stack, transcript, port, "lim-noq")
        declare(empty, 1, f"{prefix}-q")
        declare(empty, 2, "", exclusive=True)
        closed(empty)
    return transcript.normalized()


def user_limits(port: int, prefix: str) -> list[Entry]:
    transcript = Transcript()
    with ExitStack() as stack:
        transcript.note("capped: two connections, a third over the user's limit")
        first = opened(stack, transcript, port, user="capped")
        second = opened(stack, transcript, port, user="capped")
        opened(stack, transcript, port, user="capped")
        transcript.note("a vhost over its limit is named before the user")
        opened(stack, transcript, port, "lim-shut", user="capped")
        transcript.note("three channels over both connections, a fourth closes its connection")
        channel(first, 1)
        channel(first, 2)
        channel(second, 1)
        channel(second, 2)
        transcript.note("the closed connection's channel is free again")
        time.sleep(SETTLE)
        channel(first, 3)
        channel(first, 4)
    return transcript.normalized()


def test_vhost_limits_are_refused_as_rabbitmq_refuses_them(rabbitmq_limits: int, postroom_limits: int) -> None:
    expected, actual = compare(vhost_limits, rabbitmq_limits, postroom_limits)

    codes = [(code, text) for _kind, code, text, _c, _m in close_codes(expected)]
    assert [code for code, _text in codes] == [530, 530] + [406] * 5, codes
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


def test_user_limits_are_refused_as_rabbitmq_refuses_them(rabbitmq_limits: int, postroom_limits: int) -> None:
    expected, actual = compare(user_limits, rabbitmq_limits, postroom_limits)

    codes = [(code, text) for _kind, code, text, _c, _m in close_codes(expected)]
    assert [code for code, _text in codes] == [530, 530, 530, 530], codes
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

"""The core stops reading a client's input once the replies it made (returns, get-oks) pass
their bound, and goes on from there when the shell says they were written."""

from __future__ import annotations

from pamqp import commands

from postroom.broker.amqp.connection import REPLY_BOUND
from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.tools.testing import Client, publish_frames

BODY = 1 << 20


def test_mandatory_returns_past_the_bound_hold_the_rest_of_the_input() -> None:
    client = Client(Node(users=[User("guest", "guest")]))
    client.handshake()
    client.open_channel(1)
    connection = client.connection
    flood = b"".join(publish_frames(1, "", "nowhere", bytes(BODY), mandatory=True) for _ in range(10))

    returned = [v for _, v in client.send(flood) if isinstance(v, commands.Basic.Return)]
    assert connection.replies_held
    assert len(returned) == REPLY_BOUND // BODY + 1  # the one that passed the bound is sent too
    assert client.call(1, commands.Queue.Declare(queue="after")) == []  # held: kept after the rest

    replies = []
    while connection.replies_held:
        connection.replies_held = False  # the shell: the client read them
        replies += [type(v).__name__ for _, v in client.send(b"")]
    assert replies.count("Return") == 10 - len(returned) and replies[-1] == "DeclareOk"

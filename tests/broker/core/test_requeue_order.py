"""Returned messages go back to their original position, whatever order they are returned in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from postroom.broker.core.node import Node
from postroom.broker.tools.testing import Client, methods, publish_frames


def bodies_in_queue(c: Client, queue: str) -> list[bytes]:
    found = []
    while True:
        frames = c.call(1, commands.Basic.Get(queue=queue, no_ack=True))
        values = [value for _, value in frames]
        if not any(isinstance(value, commands.Basic.GetOk) for value in values):
            return found
        found.append(values[-1].value)


@settings(max_examples=50)
@given(
    order=st.permutations(range(1, 8)),
    priorities=st.booleans(),
    nack=st.booleans(),
)
def test_returns_in_any_order_restore_the_publish_order(order: list[int], priorities: bool, nack: bool) -> None:
    c = Client(Node())
    c.handshake()
    c.open_channel(1)
    c.open_channel(2)
    c.call(1, commands.Queue.Declare(queue="q", arguments={"x-max-priority": 3} if priorities else {}))
    for number in range(10):
        properties = commands.Basic.Properties(priority=number % 2 if priorities else None)
        c.send(publish_frames(1, "", "q", b"m%d" % number, properties))
    for _ in range(7):
        assert methods(c.call(2, commands.Basic.Get(queue="q")))
    for tag in order:
        if nack:
            c.call(2, commands.Basic.Nack(delivery_tag=tag, requeue=True))
        else:
            c.call(2, commands.Basic.Reject(delivery_tag=tag, requeue=True))
    expected = [b"m%d" % n for n in range(10)]
    if priorities:  # odd numbers (priority 1) first, each level in publish order
        expected = [b"m%d" % n for n in range(1, 10, 2)] + [b"m%d" % n for n in range(0, 10, 2)]
    assert bodies_in_queue(c, "q") == expected

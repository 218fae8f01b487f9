"""Teardown always completes: every step runs even when one raises, in an order that loses nothing."""

from __future__ import annotations

import pytest
from pamqp import commands

from postroom.broker.core.node import Node
from postroom.broker.core.queue import WorkQueue
from postroom.broker.tools.testing import Client, publish_frames


def holding_client(node: Node) -> Client:
    """A client holding a message of ``shared`` on channel 1, owning ``mine`` (exclusive), consuming on channel 2."""
    c = Client(node)
    c.handshake()
    c.open_channel(1)
    c.open_channel(2)
    c.call(1, commands.Queue.Declare(queue="mine", exclusive=True))
    c.call(1, commands.Queue.Declare(queue="shared"))
    c.send(publish_frames(1, "", "shared", b"held"))
    c.call(1, commands.Basic.Get(queue="shared"))
    c.call(2, commands.Basic.Consume(queue="shared", consumer_tag="dead"))
    return c


def test_a_dropped_connection_gives_back_its_message_exclusive_queue_and_consumer() -> None:
    node = Node()
    c = holding_client(node)
    c.connection.connection_lost()
    vhost = node.vhosts["/"]
    shared = vhost.queues["shared"]
    assert "mine" not in vhost.queues
    assert (shared.message_count, shared.consumer_count, shared.unacked_count) == (1, 0, 0)
    assert c.connection not in node.connections
    entry = shared.get()
    assert entry is not None and entry.delivery_count == 1  # returned once, not once per channel


def test_a_step_that_raises_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node()
    c = holding_client(node)
    failure = RuntimeError("a bug in returning entries")

    def broken(self: WorkQueue, entries: object) -> None:
        raise failure

    monkeypatch.setattr(WorkQueue, "return_entries", broken)
    c.connection.connection_lost()
    vhost = node.vhosts["/"]
    assert c.connection.teardown_errors == [failure]
    assert "mine" not in vhost.queues  # the exclusive queue went all the same
    assert vhost.queues["shared"].consumer_count == 0  # and the consumer
    assert c.connection not in node.connections

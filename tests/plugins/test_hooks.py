"""Message hooks: called for each event when registered, never looked at when not."""

from __future__ import annotations

from typing import Any

import pytest
from nodes import client
from pamqp import commands
from zope.interface import Invalid

from postroom.broker.core.hooks import HookChain, MessageHook
from postroom.broker.core.node import Node
from postroom.broker.errors import ChannelException, ReplyCode
from postroom.broker.tools.testing import methods, publish_frames


class Recorder(MessageHook):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def published(self, vhost: Any, exchange: str, message: Any) -> None:
        self.events.append(("published", exchange, message.body))

    def routed(self, vhost: Any, exchange: str, message: Any, queues: Any) -> None:
        self.events.append(("routed", exchange, [queue.name for queue in queues]))

    def delivered(self, queue: Any, entries: Any) -> None:
        self.events.append(("delivered", queue.name, [entry.message.body for entry in entries]))

    def acked(self, entries: Any) -> None:
        self.events.append(("acked", [entry.message.body for entry in entries]))


class Broken(MessageHook):
    def delivered(self, queue: Any, entries: Any) -> None:
        raise RuntimeError("observer bug")


def test_a_node_without_hooks_gives_its_channels_none() -> None:
    c = client(Node())
    assert c.connection.node.hooks is None
    assert c.connection.channels[1]._hooks is None


def test_hooks_see_each_event_of_a_message_in_order() -> None:
    recorder = Recorder()
    c = client(Node(hooks=HookChain([recorder])))
    c.call(1, commands.Exchange.Declare(exchange="orders", exchange_type="direct"), commands.Queue.Declare(queue="q"))
    c.call(1, commands.Queue.Bind(queue="q", exchange="orders", routing_key="k"))
    c.send(publish_frames(1, "orders", "k", b"m1"))
    c.send(publish_frames(1, "orders", "nowhere", b"m2"))
    c.send(publish_frames(1, "", "q", b"m3"))
    c.call(1, commands.Basic.Consume(queue="q", consumer_tag="t"))
    c.call(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert recorder.events == [
        ("published", "orders", b"m1"),
        ("routed", "orders", ["q"]),
        ("published", "orders", b"m2"),
        ("routed", "orders", []),
        ("published", "", b"m3"),
        ("routed", "", ["q"]),
        ("delivered", "q", [b"m1", b"m3"]),
        ("acked", [b"m1", b"m3"]),
    ]


def test_a_published_hook_may_refuse_the_message() -> None:
    class Refuse(MessageHook):
        def published(self, vhost: Any, exchange: str, message: Any) -> None:
            raise ChannelException(ReplyCode.ACCESS_REFUSED, "not today", 60, 40)

    node = Node(hooks=HookChain([Refuse()]))
    c = client(node)
    c.call(1, commands.Queue.Declare(queue="q"))
    reply = methods(c.send(publish_frames(1, "", "q", b"m")))
    assert [(m.name, m.reply_code, m.reply_text) for m in reply] == [
        ("Channel.Close", ReplyCode.ACCESS_REFUSED, "ACCESS_REFUSED - not today")
    ]
    assert node.vhosts["/"].queues["q"].message_count == 0


def test_a_failing_observer_is_reported_and_the_next_hook_still_runs() -> None:
    recorder = Recorder()
    chain = HookChain([Broken(), recorder])
    failures: list[tuple[Any, str]] = []
    chain.on_error = lambda hook, event: failures.append((type(hook).__name__, event))
    c = client(Node(hooks=chain))
    c.call(1, commands.Queue.Declare(queue="q"), commands.Basic.Consume(queue="q", consumer_tag="t", no_ack=True))
    frames = methods(c.send(publish_frames(1, "", "q", b"m")))
    assert [m.name for m in frames] == ["Basic.Deliver", "ContentHeader", "ContentBody"]
    assert failures == [("Broken", "delivered")]
    assert ("delivered", "q", [b"m"]) in recorder.events


def test_a_hook_must_provide_the_interface() -> None:
    with pytest.raises(Invalid):
        HookChain([object()])  # type: ignore[list-item]

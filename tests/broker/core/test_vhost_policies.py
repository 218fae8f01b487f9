"""Policies applied by a virtual host: at declaration, and live to queues and exchanges that exist."""

from __future__ import annotations

import random

from pamqp import commands
from twisted.internet.task import Clock

from postroom.broker.core.node import Node
from postroom.broker.core.policy import Policy
from postroom.broker.tools.testing import Client, publish_frames


def setup() -> tuple[Node, Client, Clock]:
    clock = Clock()
    node = Node(rng=random.Random(2), clock=clock)
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    return node, client, clock


def reject_one(client: Client, queue: str) -> None:
    frames = client.call(1, commands.Basic.Get(queue=queue))
    tag = frames[0][1].delivery_tag
    client.call(1, commands.Basic.Reject(delivery_tag=tag, requeue=False))


def test_a_queue_without_arguments_dead_letters_where_its_policy_says_until_it_is_cleared() -> None:
    node, client, _clock = setup()
    vhost = node.vhosts["/"]
    vhost.set_policy(Policy("DLX", r"^orders\.", {"dead-letter-exchange": "", "dead-letter-routing-key": "dead"}))
    client.call(1, commands.Queue.Declare(queue="dead"), commands.Queue.Declare(queue="orders.eu"))
    queue = vhost.queues["orders.eu"]
    assert queue.policy is vhost.policies["DLX"] and queue.arguments == {}
    for body in (b"one", b"two"):
        client.send(publish_frames(1, "", "orders.eu", body))
    reject_one(client, "orders.eu")
    assert vhost.queues["dead"].message_count == 1
    assert vhost.clear_policy("DLX") and queue.policy is None
    reject_one(client, "orders.eu")
    assert vhost.queues["dead"].message_count == 1  # dropped: no dead-letter exchange any more
    assert not vhost.clear_policy("DLX")


def test_a_lower_length_limit_set_live_drops_the_head_to_the_dead_letter_exchange() -> None:
    node, client, _clock = setup()
    vhost = node.vhosts["/"]
    client.call(1, commands.Queue.Declare(queue="dead"), commands.Queue.Declare(queue="jobs"))
    for number in range(5):
        client.send(publish_frames(1, "", "jobs", b"%d" % number))
    vhost.set_policy(
        Policy("cap", "^jobs$", {"max-length": 2, "dead-letter-exchange": "", "dead-letter-routing-key": "dead"})
    )
    jobs, dead = vhost.queues["jobs"], vhost.queues["dead"]
    assert (jobs.message_count, dead.message_count) == (2, 3)
    assert [entry.message.body for entry in jobs.ready_entries()] == [b"3", b"4"]
    assert [entry.message.body for entry in dead.ready_entries()] == [b"0", b"1", b"2"]


def test_a_ttl_set_live_counts_for_messages_that_arrive_from_then_on() -> None:
    node, client, clock = setup()
    vhost = node.vhosts["/"]
    client.call(1, commands.Queue.Declare(queue="jobs"))
    client.send(publish_frames(1, "", "jobs", b"before"))
    vhost.set_policy(Policy("ttl", "jobs", {"message-ttl": 1_000}))
    client.send(publish_frames(1, "", "jobs", b"after"))
    clock.advance(2)
    assert [entry.message.body for entry in vhost.queues["jobs"].ready_entries()] == [b"before"]


def test_arguments_and_operator_policies_combine_as_rabbitmq_combines_them() -> None:
    node, client, _clock = setup()
    vhost = node.vhosts["/"]
    vhost.set_policy(Policy("user", ".*", {"max-length": 100, "message-ttl": 60_000, "dead-letter-exchange": "p"}))
    vhost.set_policy(Policy("ops", ".*", {"max-length": 10}), operator=True)
    client.call(
        1,
        commands.Queue.Declare(queue="q", arguments={"x-message-ttl": 5_000, "x-dead-letter-exchange": "own"}),
    )
    settings = vhost.queues["q"].settings
    assert (settings.max_length, settings.message_ttl, settings.dead_letter_exchange) == (10, 5.0, "own")
    assert vhost.queues["q"].operator_policy is vhost.operator_policies["ops"]
    # A redeclaration compares the client's own arguments, not what the policies made of them.
    reply = client.call(
        1, commands.Queue.Declare(queue="q", arguments={"x-message-ttl": 5_000, "x-dead-letter-exchange": "own"})
    )
    assert type(reply[0][1]) is commands.Queue.DeclareOk


def test_the_highest_priority_policy_applies_and_a_change_of_policy_moves_the_queue() -> None:
    node, client, _clock = setup()
    vhost = node.vhosts["/"]
    client.call(1, commands.Queue.Declare(queue="q"))
    vhost.set_policy(Policy("wide", ".*", {"max-length": 100}, priority=0))
    vhost.set_policy(Policy("narrow", "^q$", {"max-length": 7}, priority=1))
    assert vhost.queues["q"].settings.max_length == 7
    vhost.clear_policy("narrow")
    assert vhost.queues["q"].settings.max_length == 100


def test_an_exchange_takes_its_alternate_exchange_from_a_policy_unless_it_has_its_own() -> None:
    node, client, _clock = setup()
    vhost = node.vhosts["/"]
    client.call(
        1,
        commands.Exchange.Declare(exchange="orders", exchange_type="direct"),
        commands.Exchange.Declare(exchange="own", exchange_type="direct", arguments={"alternate-exchange": "mine"}),
        commands.Queue.Declare(queue="unrouted"),
        commands.Queue.Bind(queue="unrouted", exchange="amq.fanout"),
    )
    vhost.set_policy(Policy("AE", "^(orders|own)$", {"alternate-exchange": "amq.fanout"}, apply_to="exchanges"))
    assert (vhost.exchanges["orders"].alternate, vhost.exchanges["own"].alternate) == ("amq.fanout", "mine")
    client.send(publish_frames(1, "orders", "nowhere", b"caught"))
    assert vhost.queues["unrouted"].message_count == 1
    vhost.clear_policy("AE")
    client.send(publish_frames(1, "orders", "nowhere", b"lost"))
    assert vhost.queues["unrouted"].message_count == 1

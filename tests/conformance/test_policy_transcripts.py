"""Policies, frame for frame: the same policy set on RabbitMQ (``rabbitmqctl set_policy``) and
on Postroom gives the same dead-lettering, limits and precedence.

On Postroom the policy is set on the running broker's virtual host (as its management API and
CLI will); each scenario sets its policies after or before declaring, as it says, and clears
them at the end.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pamqp import commands
from test_dead_letter_transcripts import masked
from test_scenario_transcripts import declare_queue, get, message_count, routable
from test_teardown_transcripts import unique_prefix
from transcript import (
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    frames,
    method,
    open_connection,
    until,
    wait_for,
)
from transcript import content as content_frames
from twisted.internet import threads

from postroom.broker.core.policy import Policy

pytestmark = pytest.mark.integration

#: ``(name, pattern, definition, priority)``: set; ``(name,)``: clear.
PolicyStep = Callable[..., None]


def on_rabbitmq(port: int) -> tuple[PolicyStep, PolicyStep]:
    from postroom.broker.tools.testing import rabbitmqctl

    def set_policy(
        name: str, pattern: str, definition: dict[str, Any], priority: int = 0, operator: bool = False
    ) -> None:
        command = "set_operator_policy" if operator else "set_policy"
        rabbitmqctl(
            port, command, name, pattern, json.dumps(definition), "--priority", str(priority), "--apply-to", "queues"
        )

    def clear_policy(name: str, operator: bool = False) -> None:
        rabbitmqctl(port, "clear_operator_policy" if operator else "clear_policy", name)

    return set_policy, clear_policy


def on_postroom(broker: Any) -> tuple[PolicyStep, PolicyStep]:
    vhost = broker.node.vhosts["/"]

    def set_policy(
        name: str, pattern: str, definition: dict[str, Any], priority: int = 0, operator: bool = False
    ) -> None:
        policy = Policy(name, pattern, definition, priority, "queues")
        threads.blockingCallFromThread(broker.reactor, vhost.set_policy, policy, operator)

    def clear_policy(name: str, operator: bool = False) -> None:
        threads.blockingCallFromThread(broker.reactor, vhost.clear_policy, name, operator)

    return set_policy, clear_policy


def publish(client: Any, queue: str, body: bytes) -> None:
    client.send(method(1, commands.Basic.Publish, exchange="", routing_key=queue) + content_frames(1, body))
    client.read(until("Basic.Ack", "Basic.Nack"))


def open_confirming(client: Any, *queues: str) -> None:
    """Open channel 1, declare ``queues`` (no arguments) and turn confirms on."""
    open_connection(client, 1)
    for queue in queues:
        declare_queue(client, queue)
    client.send(frames(1, commands.Confirm.Select()))
    client.read(until("Confirm.SelectOk"))


def read_queues(client: Any, transcript: Transcript, queues: tuple[str, ...], count: int) -> None:
    """Into the transcript: each queue's name, then ``count`` basic.get answers from it."""
    for queue in queues:
        transcript.note(f"{queue}:")
        for _ in range(count):
            get(client, queue)


def reject_next(client: Any, queue: str) -> None:
    got = get(client, queue, no_ack=False)
    tag = got[0].get("delivery_tag") if got[0].kind == "Basic.GetOk" else 0
    client.send(frames(1, commands.Basic.Reject(delivery_tag=tag, requeue=False)))


def dlx_by_policy(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """A queue declared without arguments under a dead-letter policy to the default exchange;
    one rejection goes to the dead-letter queue, and once the policy is cleared one is dropped."""
    source, dead = f"{prefix}.orders.eu", f"{prefix}.dead"
    transcript = Transcript()
    set_policy(f"{prefix}-dlx", rf"^{prefix}\.orders\.", {"dead-letter-exchange": "", "dead-letter-routing-key": dead})
    try:
        with transcript.connect(port) as client:
            open_confirming(client, dead, source)
            for body in (b"first", b"second"):
                publish(client, source, body)
            reject_next(client, source)
            wait_for(lambda: message_count(port, dead) == 1, 5)
            clear_policy(f"{prefix}-dlx")
            reject_next(client, source)
            wait_for(lambda: message_count(port, source) == 0, 5)
            transcript.note(f"{dead}:")
            for _ in range(2):
                get(client, dead)
            close_connection(client)
    finally:
        delete_queues(port, source, dead)
    return masked(transcript.normalized())


def limits_live(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """Five messages queued, then a policy with a length limit of 2 and a dead-letter queue, and
    an operator policy capping it at 1: the head goes to the dead-letter queue at once; a queue
    argument lower still wins for the next queue."""
    source, dead, capped = f"{prefix}.jobs", f"{prefix}.jobs.dead", f"{prefix}.jobs.capped"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_confirming(client, dead, source)
            for number in range(5):
                publish(client, source, b"%d" % number)
            definition = {"max-length": 2, "dead-letter-exchange": "", "dead-letter-routing-key": dead}
            set_policy(f"{prefix}-cap", rf"^{prefix}\.jobs", definition, 1)
            wait_for(lambda: message_count(port, source) == 2, 5)
            set_policy(f"{prefix}-ops", rf"^{prefix}\.jobs", {"max-length": 1}, 0, True)
            wait_for(lambda: message_count(port, source) == 1, 5)
            declare_queue(client, capped, arguments={"x-max-length": 3})
            for number in range(4):
                publish(client, capped, b"c%d" % number)
            read_queues(client, transcript, (source, dead, capped), 5)
            close_connection(client)
    finally:
        clear_policy(f"{prefix}-cap")
        clear_policy(f"{prefix}-ops", True)
        delete_queues(port, source, dead, capped)
    return masked(transcript.normalized())


def ttl_by_policy(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """A message queued before a TTL policy keeps living; one published after it expires and is
    dead-lettered (reason ``expired``) where the policy says."""
    source, dead = f"{prefix}.ttl", f"{prefix}.ttl.dead"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_confirming(client, dead, source)
            publish(client, source, b"before")
            definition = {"message-ttl": 200, "dead-letter-exchange": "", "dead-letter-routing-key": dead}
            set_policy(f"{prefix}-ttl", rf"^{prefix}\.ttl$", definition)
            publish(client, source, b"after")
            wait_for(lambda: message_count(port, dead) == 1, 5)
            read_queues(client, transcript, (source, dead), 2)
            close_connection(client)
    finally:
        clear_policy(f"{prefix}-ttl")
        delete_queues(port, source, dead)
    return masked(transcript.normalized())


def precedence(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """A queue's own arguments against its policy: the lower length limit applies (the policy's
    2, not the argument's 3), while the queue's own overflow (drop-head, not reject-publish)
    and dead-letter routing key win."""
    source, by_argument, by_policy = f"{prefix}.pre", f"{prefix}.pre.arg", f"{prefix}.pre.pol"
    transcript = Transcript()
    definition = {
        "max-length": 2,
        "overflow": "reject-publish",
        "dead-letter-exchange": "",
        "dead-letter-routing-key": by_policy,
    }
    set_policy(f"{prefix}-pre", rf"^{prefix}\.pre$", definition)
    try:
        with transcript.connect(port) as client:
            open_confirming(client, by_argument, by_policy)
            arguments = {
                "x-max-length": 3,
                "x-overflow": "drop-head",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": by_argument,
            }
            declare_queue(client, source, arguments=arguments)
            for number in range(4):
                publish(client, source, b"%d" % number)
            wait_for(lambda: message_count(port, by_argument) == 2, 5)
            read_queues(client, transcript, (source, by_argument, by_policy), 3)
            close_connection(client)
    finally:
        clear_policy(f"{prefix}-pre")
        delete_queues(port, source, by_argument, by_policy)
    return masked(transcript.normalized())


def priority_and_overflow(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """Two policies match: the higher priority's byte limit with ``reject-publish-dlx`` applies
    (the publish past it is nacked and dead-lettered ``maxlen``); cleared live, the lower
    one's length limit with ``drop-head`` takes over and drops the head to the same place."""
    source, dead = f"{prefix}.prio", f"{prefix}.prio.dead"
    transcript = Transcript()
    pattern = rf"^{prefix}\.prio$"
    to_dead = {"dead-letter-exchange": "", "dead-letter-routing-key": dead}
    set_policy(f"{prefix}-low", pattern, {"max-length": 1, "overflow": "drop-head", **to_dead}, 0)
    set_policy(f"{prefix}-high", pattern, {"max-length-bytes": 10, "overflow": "reject-publish-dlx", **to_dead}, 5)
    try:
        with transcript.connect(port) as client:
            open_confirming(client, dead, source)
            for body in (b"first.", b"second", b"third."):
                publish(client, source, body)
            wait_for(lambda: message_count(port, dead) == 2, 5)
            clear_policy(f"{prefix}-high")
            publish(client, source, b"fourth")
            wait_for(lambda: message_count(port, dead) == 3, 5)
            read_queues(client, transcript, (source, dead), 4)
            close_connection(client)
    finally:
        clear_policy(f"{prefix}-low")
        delete_queues(port, source, dead)
    return masked(transcript.normalized())


def operator_ttl(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """A user policy's long TTL, the queue's own long TTL and an operator policy's short one:
    the shortest applies, and the message dies ``expired`` to the user policy's dead-letter queue."""
    source, dead = f"{prefix}.optl", f"{prefix}.optl.dead"
    transcript = Transcript()
    pattern = rf"^{prefix}\.optl$"
    set_policy(
        f"{prefix}-user", pattern, {"message-ttl": 60000, "dead-letter-exchange": "", "dead-letter-routing-key": dead}
    )
    set_policy(f"{prefix}-op", pattern, {"message-ttl": 100}, 0, True)
    try:
        with transcript.connect(port) as client:
            open_confirming(client, dead)
            declare_queue(client, source, arguments={"x-message-ttl": 50000})
            publish(client, source, b"short-lived")
            wait_for(lambda: message_count(port, dead) == 1, 5)
            read_queues(client, transcript, (source, dead), 2)
            close_connection(client)
    finally:
        clear_policy(f"{prefix}-user")
        clear_policy(f"{prefix}-op", True)
        delete_queues(port, source, dead)
    return masked(transcript.normalized())


def expires_by_policy(port: int, prefix: str, set_policy: PolicyStep, clear_policy: PolicyStep) -> list[Entry]:
    """An unused queue under an ``expires`` policy set live is deleted: a passive declare then
    finds nothing (404), and a queue the policy does not match is still there."""
    source, kept = f"{prefix}.idle", f"{prefix}.busy"
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            open_connection(client, 1)
            declare_queue(client, source)
            declare_queue(client, kept)
            set_policy(f"{prefix}-exp", rf"^{prefix}\.idle$", {"expires": 200})
            assert wait_for(lambda: not routable(port, source), 5)
            client.send(frames(1, commands.Queue.Declare(queue=kept, passive=True)))
            client.read(until("Queue.DeclareOk"))
            client.send(frames(1, commands.Queue.Declare(queue=source, passive=True)))
            client.read(until("Channel.Close"))
            close_connection(client)
    finally:
        clear_policy(f"{prefix}-exp")
        delete_queues(port, source, kept)
    return masked(transcript.normalized())


SCENARIOS = {
    "dlx-by-policy": dlx_by_policy,
    "length-limits-live": limits_live,
    "ttl-by-policy": ttl_by_policy,
    "arguments-against-policy": precedence,
    "priority-then-cleared-live": priority_and_overflow,
    "operator-ttl-caps-user-and-argument": operator_ttl,
    "expires-set-live": expires_by_policy,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_policies_match_rabbitmq(rabbitmq_port: int, broker: Any, name: str) -> None:
    prefix = unique_prefix()
    scenario = SCENARIOS[name]
    expected = scenario(rabbitmq_port, prefix, *on_rabbitmq(rabbitmq_port))
    actual = scenario(broker.port, prefix, *on_postroom(broker))
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

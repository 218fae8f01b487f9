"""Permissions, operation by operation: what a limited user may do is what RabbitMQ 3.10 lets it do.

The same users exist on both brokers: ``app`` (``^app\\.`` for configure, write and read on
``/``, nothing on vhost ``other``) and ``split`` (configure ``^cfg\\.``, write ``^wr\\.``, read
``^rd\\.``). guest creates a queue and an exchange under every prefix; then each user tries
every operation on each of them, one channel per attempt, and the answers (the ``-ok`` or
the 403) are compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pamqp import commands
from pamqp.base import Frame
from test_teardown_transcripts import close_codes, compare
from transcript import (
    Entry,
    Transcript,
    assert_same_transcript,
    close_connection,
    delete_queues,
    frames,
    handshake,
    method,
    open_connection,
    until,
)
from transcript import content as content_frames

from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.tools.testing import rabbitmqctl
from postroom.config.schema import Permission, TopicPermission

pytestmark = pytest.mark.integration

PREFIXES = ("app", "other", "cfg", "wr", "rd")
USERS = {
    "app": {"/": Permission(r"^app\.", r"^app\.", r"^app\.")},
    "split": {"/": Permission(r"^cfg\.", r"^wr\.", r"^rd\.")},
}
#: Answers that end an attempt besides a channel close.
OKS = (
    "Queue.DeclareOk", "Queue.DeleteOk", "Queue.PurgeOk", "Queue.BindOk", "Queue.UnbindOk",
    "Exchange.DeclareOk", "Exchange.DeleteOk", "Exchange.BindOk", "Exchange.UnbindOk",
    "Basic.GetOk", "Basic.GetEmpty", "Basic.ConsumeOk", "Basic.Ack", "Basic.Nack",
)  # fmt: skip


@pytest.fixture(scope="module")
def rabbitmq_users(rabbitmq_port: int) -> int:
    """The users and the vhost ``other`` on the session's RabbitMQ node."""
    rabbitmqctl(rabbitmq_port, "add_vhost", "other")
    for name, permissions in USERS.items():
        rabbitmqctl(rabbitmq_port, "add_user", name, "secret")
        for vhost, permission in permissions.items():
            rabbitmqctl(
                rabbitmq_port, "set_permissions", "-p", vhost, name,
                permission.configure, permission.write, permission.read,
            )  # fmt: skip
    return rabbitmq_port


@pytest.fixture
def postroom_users(make_broker: Any) -> Iterator[int]:
    users = [User("guest", password="guest", loopback_only=True)]
    users += [User(name, password="secret", permissions=permissions) for name, permissions in USERS.items()]
    yield make_broker(Node(users=users, vhost_names=("/", "other"))).port


def attempts(suffix: str) -> list[tuple[str, list[Frame | bytes]]]:
    """Every operation on every prefix's queue and exchange: ``(what, frames to send)``."""
    result: list[tuple[str, list[Frame | bytes]]] = []
    for prefix in PREFIXES:
        queue, exchange = f"{prefix}.q-{suffix}", f"{prefix}.x-{suffix}"
        fresh_queue, fresh_exchange = f"{prefix}.new-q-{suffix}", f"{prefix}.new-x-{suffix}"
        result += [
            (f"declare queue {prefix}", [commands.Queue.Declare(queue=fresh_queue, auto_delete=True)]),
            (f"redeclare queue {prefix}", [commands.Queue.Declare(queue=queue)]),
            (f"passive queue {prefix}", [commands.Queue.Declare(queue=queue, passive=True)]),
            (f"purge {prefix}", [commands.Queue.Purge(queue=queue)]),
            (f"get {prefix}", [commands.Basic.Get(queue=queue)]),
            (f"consume {prefix}", [commands.Basic.Consume(queue=queue, consumer_tag="c")]),
            (f"declare exchange {prefix}", [commands.Exchange.Declare(exchange=fresh_exchange, auto_delete=True)]),
            (f"passive exchange {prefix}", [commands.Exchange.Declare(exchange=exchange, passive=True)]),
            (f"delete missing queue {prefix}", [commands.Queue.Delete(queue=f"{prefix}.missing-{suffix}")]),
            (f"delete missing exchange {prefix}", [commands.Exchange.Delete(exchange=f"{prefix}.missing-{suffix}")]),
            (
                f"publish {prefix}",
                [commands.Confirm.Select(), method(0, commands.Basic.Publish, exchange=exchange, routing_key="k")],
            ),
            (
                f"dead-letter to {prefix}",
                [
                    commands.Queue.Declare(
                        queue=f"app.dl-{prefix}-{suffix}",
                        auto_delete=True,
                        arguments={"x-dead-letter-exchange": exchange},
                    )
                ],
            ),
        ]
        for source in PREFIXES:
            bound = f"{source}.x-{suffix}"
            result += [
                (
                    f"bind queue {prefix} to {source}",
                    [commands.Queue.Bind(queue=queue, exchange=bound, routing_key="k")],
                ),
                (
                    f"bind exchange {prefix} to {source}",
                    [commands.Exchange.Bind(destination=exchange, source=bound, routing_key="k")],
                ),
            ]
    result += [
        (
            "publish to the default exchange",
            [commands.Confirm.Select(), method(0, commands.Basic.Publish, routing_key="k")],
        ),
        ("server-named queue", [commands.Queue.Declare(queue="", exclusive=True)]),
    ]
    return result


def setup(port: int, suffix: str) -> None:
    """As guest: create every prefix's queue and exchange."""
    scratch = Transcript()
    with scratch.connect(port) as client:
        open_connection(client, 1)
        for prefix in PREFIXES:
            queue, exchange = f"{prefix}.q-{suffix}", f"{prefix}.x-{suffix}"
            client.send(frames(1, commands.Queue.Declare(queue=queue), commands.Exchange.Declare(exchange=exchange)))
            client.read(until("Exchange.DeclareOk"))
        close_connection(client)


def cleanup(port: int, suffix: str) -> None:
    """As guest: delete everything a run made."""
    queues = [f"{p}.{kind}-{suffix}" for p in PREFIXES for kind in ("q", "new-q")]
    queues += [f"app.dl-{p}-{suffix}" for p in PREFIXES]
    delete_queues(port, *queues, exchanges=[f"{p}.{kind}-{suffix}" for p in PREFIXES for kind in ("x", "new-x")])


def as_user(user: str) -> Any:
    def run(port: int, prefix: str) -> list[Entry]:
        suffix = prefix.rsplit("-", 1)[-1]
        setup(port, suffix)
        transcript = Transcript()
        try:
            with transcript.connect(port) as client:
                client.send(handshake(user=user, password="secret"))
                client.read(until("Connection.OpenOk"))
                for channel, (what, sent) in enumerate(attempts(suffix), start=1):
                    transcript.note(what)
                    data = b""
                    for item in sent:
                        if isinstance(item, bytes):  # a publish: its frame, re-addressed, and content
                            data += item[:1] + channel.to_bytes(2, "big") + item[3:] + content_frames(channel, b"m")
                        else:
                            data += frames(channel, item)
                    client.send(frames(channel, commands.Channel.Open()) + data)
                    client.read(until("Channel.OpenOk", channel=channel))
                    if len(sent) == 2:
                        client.read(until("Confirm.SelectOk", channel=channel))
                    client.read(until(*OKS, channel=channel))
                close_connection(client)
            with transcript.connect(port) as client:  # a vhost with no permissions
                client.send(handshake(vhost="other", user=user, password="secret"))
                client.read(until("Connection.OpenOk"))
        finally:
            cleanup(port, suffix)
        return transcript.normalized()

    return run


@pytest.mark.parametrize("user", sorted(USERS))
def test_a_limited_user_may_do_what_rabbitmq_allows(rabbitmq_users: int, postroom_users: int, user: str) -> None:
    expected, actual = compare(as_user(user), rabbitmq_users, postroom_users)
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


#: Topic permissions of user ``topical`` (full permissions otherwise) on vhost ``/``.
TOPIC_PERMISSIONS = {
    "amq.topic": TopicPermission(write=r"^{username}\.", read=r"^{vhost}$|^read\."),
    "amq.direct": TopicPermission(write="^nothing$", read="^nothing$"),  # not a topic exchange
}


@pytest.fixture(scope="module")
def rabbitmq_topical(rabbitmq_port: int) -> int:
    rabbitmqctl(rabbitmq_port, "add_user", "topical", "secret")
    rabbitmqctl(rabbitmq_port, "set_permissions", "-p", "/", "topical", ".*", ".*", ".*")
    for exchange, permission in TOPIC_PERMISSIONS.items():
        rabbitmqctl(
            rabbitmq_port, "set_topic_permissions", "-p", "/", "topical", exchange, permission.write, permission.read
        )
    return rabbitmq_port


@pytest.fixture
def postroom_topical(make_broker: Any) -> Iterator[int]:
    users = [
        User("guest", password="guest", loopback_only=True),
        User("topical", password="secret", topic_permissions={"/": TOPIC_PERMISSIONS}),
    ]
    yield make_broker(Node(users=users)).port


def topic_attempts(suffix: str) -> list[tuple[str, list[Frame | bytes]]]:
    queue, other = f"tq-{suffix}", f"tx-{suffix}"

    def publish(exchange: str, routing_key: str) -> list[Frame | bytes]:
        return [
            commands.Confirm.Select(),
            method(0, commands.Basic.Publish, exchange=exchange, routing_key=routing_key),
        ]

    return [
        ("declare queue", [commands.Queue.Declare(queue=queue, auto_delete=True)]),
        ("declare exchange", [commands.Exchange.Declare(exchange=other, exchange_type="topic", auto_delete=True)]),
        ("publish own key", publish("amq.topic", "topical.orders")),
        ("publish other key", publish("amq.topic", "billing.orders")),
        ("publish own key again", publish("amq.topic", "topical.orders")),
        ("publish to a direct exchange", publish("amq.direct", "billing")),
        ("publish to a topic exchange without topic permissions", publish(other, "anything")),
        ("bind read key", [commands.Queue.Bind(queue=queue, exchange="amq.topic", routing_key="read.all")]),
        ("bind the vhost's name", [commands.Queue.Bind(queue=queue, exchange="amq.topic", routing_key="/")]),
        ("bind other key", [commands.Queue.Bind(queue=queue, exchange="amq.topic", routing_key="billing.#")]),
        ("unbind other key", [commands.Queue.Unbind(queue=queue, exchange="amq.topic", routing_key="billing.#")]),
        ("unbind read key", [commands.Queue.Unbind(queue=queue, exchange="amq.topic", routing_key="read.all")]),
        ("bind a direct exchange", [commands.Queue.Bind(queue=queue, exchange="amq.direct", routing_key="billing")]),
        (
            "bind exchange to amq.topic, other key",
            [commands.Exchange.Bind(destination=other, source="amq.topic", routing_key="billing.#")],
        ),
        (
            "bind exchange to amq.topic, read key",
            [commands.Exchange.Bind(destination=other, source="amq.topic", routing_key="read.x")],
        ),
        ("delete exchange", [commands.Exchange.Delete(exchange=other)]),
        ("delete queue", [commands.Queue.Delete(queue=queue)]),
    ]


def as_topical(port: int, prefix: str) -> list[Entry]:
    suffix = prefix.rsplit("-", 1)[-1]
    transcript = Transcript()
    try:
        with transcript.connect(port) as client:
            client.send(handshake(user="topical", password="secret"))
            client.read(until("Connection.OpenOk"))
            for channel, (what, sent) in enumerate(topic_attempts(suffix), start=1):
                transcript.note(what)
                data = b""
                for item in sent:
                    if isinstance(item, bytes):
                        data += item[:1] + channel.to_bytes(2, "big") + item[3:] + content_frames(channel, b"m")
                    else:
                        data += frames(channel, item)
                client.send(frames(channel, commands.Channel.Open()) + data)
                client.read(until("Channel.OpenOk", channel=channel))
                if len(sent) == 2:
                    client.read(until("Confirm.SelectOk", channel=channel))
                client.read(until(*OKS, channel=channel))
            close_connection(client)
    finally:
        delete_queues(port, f"tq-{suffix}", exchanges=[f"tx-{suffix}"])
    return transcript.normalized()


def test_topic_permissions_are_checked_where_rabbitmq_checks_them(rabbitmq_topical: int, postroom_topical: int) -> None:
    expected, actual = compare(as_topical, rabbitmq_topical, postroom_topical)

    refusals = [text for _kind, code, text, _c, _m in close_codes(expected) if code == 403]
    assert len(refusals) == 4, refusals  # other key: publish, bind, unbind, exchange bind
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))

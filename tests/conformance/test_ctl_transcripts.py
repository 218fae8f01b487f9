"""``postroom ctl`` prints what ``rabbitmqctl`` 3.10 prints, verb by verb: the same session
runs with ``rabbitmqctl`` against a RabbitMQ node and with ``postroom ctl`` against Postroom,
and each command's exit code, output and errors are compared (of lists, the session's own
rows, sorted: the brokers hold other things, and RabbitMQ lists in its tables' hash order)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom.broker.tools.testing import RABBITMQ_HOMES, RABBITMQCTL
from tests.conformance import test_management_transcripts as management
from tests.conformance.test_management_transcripts import send

pytestmark = pytest.mark.integration

#: The RabbitMQ node with its management plugin, and Postroom with its API, of the API's transcripts.
rabbitmq_management = management.rabbitmq_management
postroom_management = management.postroom_management

ROOT = Path(__file__).resolve().parents[2]

#: The session: each command, as both tools take it.
SESSION: list[list[str]] = [
    ["add_user", "ct-u1", "pw"],
    ["add_user", "ct-u1", "pw"],
    ["change_password", "ct-u1", "pw2"],
    ["change_password", "ct-nouser", "pw2"],
    ["set_user_tags", "ct-u1", "monitoring", "management"],
    ["set_user_tags", "ct-nouser", "x"],
    ["list_users"],
    ["list_users", "--formatter", "json"],
    ["list_users", "-q"],
    ["list_users", "-s"],
    ["add_vhost", "ct-v1"],
    ["add_vhost", "ct-v1"],
    ["list_vhosts", "name", "tracing", "description"],
    ["set_permissions", "-p", "ct-v1", "ct-u1", ".*", ".*", "^r"],
    ["set_permissions", "-p", "ct-nohost", "ct-u1", ".*", ".*", "^r"],
    ["set_permissions", "-p", "ct-v1", "ct-nouser", ".*", ".*", "^r"],
    ["set_permissions", "-p", "ct-v1", "guest", ".*", ".*", ".*"],
    ["list_permissions", "-p", "ct-v1"],
    ["list_permissions", "-p", "ct-v1", "--formatter", "json"],
    ["list_user_permissions", "ct-u1"],
    ["set_topic_permissions", "-p", "ct-v1", "ct-u1", "amq.topic", "^a", ".*"],
    ["list_topic_permissions", "-p", "ct-v1"],
    ["clear_topic_permissions", "-p", "ct-v1", "ct-u1"],
    ["list_topic_permissions", "-p", "ct-v1"],
    ["set_vhost_limits", "-p", "ct-v1", '{"max-queues": 5}'],
    ["list_vhost_limits", "-p", "ct-v1"],
    ["set_user_limits", "ct-u1", '{"max-connections": 5}'],
    ["list_user_limits", "--user", "ct-u1"],
    ["clear_user_limits", "ct-u1", "max-connections"],
    ["list_user_limits", "--user", "ct-u1"],
    ["list_queues", "-p", "ct-v1"],
    ["list_queues", "-p", "ct-v1", "name", "messages", "messages_ready", "messages_unacknowledged", "consumers",
     "durable", "auto_delete", "arguments", "policy", "state", "type"],
    ["list_queues", "-p", "ct-v1", "--formatter", "json"],
    ["list_queues", "-p", "ct-v1", "name", "arguments", "--formatter", "json"],
    ["list_queues", "-p", "ct-v1", "-q"],
    ["list_queues", "bogus"],
    ["list_connections", "user", "vhost", "state", "channels", "--formatter", "json"],
    ["list_connections", "user", "vhost", "state", "channels"],
    ["purge_queue", "-p", "ct-v1", "ct.q1"],
    ["purge_queue", "-p", "ct-v1", "ct.nope"],
    ["list_queues", "-p", "ct-v1", "-s"],
    ["delete_queue", "-p", "ct-v1", "ct.q2"],
    ["delete_queue", "-p", "ct-v1", "ct.q1", "--if-empty"],
    ["delete_queue", "-p", "ct-v1", "ct.nope"],
    ["clear_permissions", "-p", "ct-v1", "ct-u1"],
    ["clear_permissions", "-p", "ct-v1", "ct-u1"],
    ["delete_user", "ct-u1"],
    ["delete_user", "ct-u1"],
    ["delete_vhost", "ct-v1"],
    ["delete_vhost", "ct-v1"],
]  # fmt: skip


#: A line the Erlang runtime under rabbitmqctl logs (a time, then a level).
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \[\w+\] ")


def ours(line: str) -> bool:
    """A row of the session's own (its users, vhost, queues), or not a row."""
    return "\t" not in line or any(mark in line for mark in ("ct-", "ct.", "user\t", "name\t", "vhost\t"))


def shown(command: list[str], code: int, out: str, err: str) -> tuple[int, Any, str]:
    """What is compared of a command's run."""
    if "--formatter" in command and out.startswith("["):
        rows = [row for row in json.loads(out) if "ct" in json.dumps(row)]
        return code, sorted(rows, key=json.dumps), err
    lines = out.splitlines()
    head = [line for line in lines if "\t" not in line or line.split("\t")[0] in ("user", "name", "vhost")]
    rows = sorted(line for line in lines if line not in head and ours(line))
    # rabbitmqctl's Erlang side may log a line of its own to stderr (``11:12:09.625 [warning]
    # Failed to delete user ...``) before the error, or not: it is not what the command says.
    said = [line for line in err.splitlines() if not LOG_LINE.match(line)]
    while said and not said[0]:
        said.pop(0)
    if said and said[0].startswith("Error (argument validation)"):
        said = said[:1]  # (rabbitmqctl adds its usage)
    return code, head + rows, "\n".join(said)


def session(run: Callable[[list[str]], tuple[int, str, str]], amqp_port: int, http_port: int) -> list[Any]:
    """The session's commands and what each printed; queues are declared and a message
    published through the API, and ``ct-u1`` holds a connection, at the points they are needed."""
    printed = []
    connection = None
    try:
        for command in SESSION:
            if command[0] == "list_queues" and connection is None:
                send(http_port, "queues/ct-v1/ct.q1", "PUT", {"durable": True, "arguments": {"x-max-length": 9}})
                send(http_port, "queues/ct-v1/ct.q2", "PUT", {"durable": False})
                publish = {"routing_key": "ct.q1", "payload": "m", "payload_encoding": "string", "properties": {}}
                send(http_port, "exchanges/ct-v1/amq.default/publish", "POST", publish)
                credentials = pika.PlainCredentials("ct-u1", "pw2")
                connection = pika.BlockingConnection(
                    pika.ConnectionParameters("127.0.0.1", amqp_port, "ct-v1", credentials, heartbeat=0)
                )
                connection.channel()
            printed.append((" ".join(command), shown(command, *run(command))))
    finally:
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except pika.exceptions.AMQPError:
                pass  # (closed by the broker when its user was deleted)
        run(["delete_user", "ct-u1"])
        run(["delete_vhost", "ct-v1"])
    return printed


def run_rabbitmqctl(amqp_port: int, command: list[str]) -> tuple[int, str, str]:
    """``rabbitmqctl`` against the RabbitMQ node on ``amqp_port``: exit code, output, errors."""
    node = f"postroom{amqp_port}@localhost"
    home = RABBITMQ_HOMES[amqp_port]
    # (the plugins' own verbs are found through the node's list of enabled plugins)
    plugins = str(home / "enabled_plugins")
    env = dict(os.environ, HOME=str(home), RABBITMQ_NODENAME=node, RABBITMQ_ENABLED_PLUGINS_FILE=plugins)
    done = subprocess.run(
        [str(RABBITMQCTL), "-n", node, *command], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


def run_postroom_ctl(http_port: int, command: list[str]) -> tuple[int, str, str]:
    """``postroom ctl`` against the management API on ``http_port``: exit code, output, errors."""
    url = f"http://guest:guest@127.0.0.1:{http_port}/"
    done = subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", "ctl", *command, "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def test_postroom_ctl_prints_what_rabbitmqctl_prints(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    rabbitmqctl = functools.partial(run_rabbitmqctl, rabbitmq_management[0])
    postroom_ctl = functools.partial(run_postroom_ctl, postroom_management[1])
    expected = session(rabbitmqctl, *rabbitmq_management)
    assert expected[0][1][0] == 0 and expected[1][1][0] == 70  # what the oracle is about: added, then refused
    actual = session(postroom_ctl, *postroom_management)
    mismatches = [
        f"{command}:\n  rabbitmqctl {want!r}\n  postroom    {got!r}"
        for (command, want), (_, got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)

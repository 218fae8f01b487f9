"""Dynamic shovels, declared and watched through the management API, against RabbitMQ 3.10.8
with its shovel plugins: the same definitions refused with the same messages, the same
shovels listed with the same status, the same messages moved with the same properties and
headers, and a shovel with ``src-delete-after`` clearing itself.

Each broker shovels between queues of its own (``amqp://``: the node itself), so both run the
same definitions. What differs by nature is put in words before comparing: the node's name
and the time in a status, the cluster's name in ``x-shovelled``.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from transcript import oracle, wait_for

from postroom.broker.tools.testing import free_port
from tests.conformance.test_ctl_transcripts import run_postroom_ctl, run_rabbitmqctl
from tests.integration.test_crash import broker
from tests.integration.test_live_administration import api

pytestmark = pytest.mark.integration

SHOVEL_PLUGINS = ["rabbitmq_management", "rabbitmq_shovel", "rabbitmq_shovel_management"]


@pytest.fixture(scope="module")
def rabbitmq_shovels() -> Iterator[tuple[int, int]]:
    """A RabbitMQ node with its management and shovel plugins: ``(amqp port, management port)``."""
    http_port = free_port()
    config = f"management.tcp.port = {http_port}\nmanagement.tcp.ip = 127.0.0.1\n"
    with oracle(config, SHOVEL_PLUGINS, also=[http_port]) as port:
        yield port, http_port


@pytest.fixture
def postroom_shovels(tmp_path: Path) -> Iterator[tuple[int, int]]:
    http_port = free_port()
    with broker(tmp_path / "data", management=http_port) as (_process, port):
        assert wait_for(lambda: call(http_port, "overview")[0] == 200)
        yield port, http_port
    log = (tmp_path / "broker.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def call(port: int, path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """A management API request as guest: its status and its answer."""
    return api(port, path, method, body, user="guest:guest")


#: Definitions RabbitMQ refuses, each with what is wrong.
REFUSED = {
    "nothing": {},
    "no source": {"src-uri": "amqp://", "dest-uri": "amqp://"},
    "both sources": {"src-uri": "amqp://", "src-queue": "a", "src-exchange": "b", "dest-uri": "amqp://"},
    "both destinations": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "a", "dest-exchange": "b"
    },
    "an unknown key": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "colour": "blue"},
    "a bad scheme": {"src-uri": "http://x", "src-queue": "a", "dest-uri": "amqp://"},
    "a port out of range": {"src-uri": "amqp://h:99999", "src-queue": "a", "dest-uri": "amqp://"},
    "a vhost with a slash": {"src-uri": "amqp://h/a/b", "src-queue": "a", "dest-uri": "amqp://"},
    "a missing local vhost": {"src-uri": "amqp:///nowhere", "src-queue": "a", "dest-uri": "amqp://"},
    "a list with a bad URI": {"src-uri": ["amqp://", "http://x"], "src-queue": "a", "dest-uri": "amqp://"},
    "a bad ack mode": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "sometimes"},
    "no-ack and a count": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "no-ack", "src-delete-after": 5
    },
    "a negative count": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "src-delete-after": -1},
    "a count in words": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "src-delete-after": "some"},
    "a prefetch in words": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "src-prefetch-count": "x"},
    "a queue name too long": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "q" * 300},
    "forward headers in words": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-add-forward-headers": "yes"
    },
    "an unknown queue argument": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue-args": {"x-colour": "blue"}
    },
    "publish properties with headers": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-publish-properties": {"headers": {}}
    },
    "a number as a URI": {"src-uri": 5, "src-queue": "a", "dest-uri": "amqp://"},
    "several things wrong": {"src-uri": "http://x", "dest-uri": 7, "ack-mode": 1, "reconnect-delay": "soon", "x": 1},
}  # fmt: skip


def refusals(http: int) -> list[tuple[str, Any]]:
    answers = [
        (label, call(http, "parameters/shovel/%2F/bad", "PUT", {"value": value})) for label, value in REFUSED.items()
    ]
    answers.append(("no value", call(http, "parameters/shovel/%2F/bad", "PUT", {"colour": "blue"})))
    answers.append(
        ("a missing vhost", call(http, "parameters/shovel/nowhere/bad", "PUT", {"value": REFUSED["no source"]}))
    )
    answers.append(("nothing was kept", call(http, "parameters/shovel")))
    return answers


def test_shovel_definitions_are_refused_as_on_rabbitmq(
    rabbitmq_shovels: tuple[int, int], postroom_shovels: tuple[int, int]
) -> None:
    expected = refusals(rabbitmq_shovels[1])
    assert dict(expected)["both sources"][0] == 400  # what the oracle is about
    actual = refusals(postroom_shovels[1])
    mismatches = [
        f"{label}:\n  rabbitmq {want!r}\n  postroom {got!r}"
        for (label, want), (_, got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)


def normalised(value: Any) -> Any:
    """A status or message with what differs by nature in words."""
    text = json.dumps(value, sort_keys=True)
    text = re.sub(r'"node": "[^"]*"', '"node": "NODE"', text)
    text = re.sub(r'"timestamp": "\d{4}-\d\d-\d\d \d{1,2}:\d\d:\d\d"', '"timestamp": "LOCAL TIME"', text)
    text = re.sub(r'"shovelled-by": "[^"]*"', '"shovelled-by": "CLUSTER"', text)
    text = re.sub(r'"x-shovelled-timestamp": \d+', '"x-shovelled-timestamp": "NOW"', text)
    return json.loads(text)


def got(port: int, queue: str, count: int) -> list[Any]:
    """``count`` messages taken from ``queue``: routing, properties, body."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        channel = connection.channel()
        taken = []
        deadline = time.monotonic() + 20
        while len(taken) < count and time.monotonic() < deadline:
            try:
                method, properties, body = channel.basic_get(queue, auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker:  # (the shovel has not declared it yet)
                channel = connection.channel()
                time.sleep(0.05)
                continue
            if method is None:
                time.sleep(0.05)
                continue
            shown = {key: value for key, value in vars(properties).items() if value is not None}
            taken.append([method.exchange, method.routing_key, method.redelivered, shown, body.decode()])
        return taken
    finally:
        connection.close()


def moving(amqp: int, http: int) -> list[tuple[str, Any]]:
    """Shovels between queues of one broker: status, parameters, the messages moved."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("sh.src", durable=True)
    channel.queue_declare("sh.len", durable=True)
    channel.exchange_declare("sh.x", "topic", durable=True)
    properties = pika.BasicProperties(
        content_type="application/json", delivery_mode=2, priority=3, correlation_id="c-1", expiration="600000",
        message_id="m-1", timestamp=1700000000, type="order", app_id="shop", headers={"region": "eu", "n": 5},
    )  # fmt: skip
    for number in range(3):
        channel.basic_publish("", "sh.src", json.dumps({"n": number}).encode(), properties)
    for number in range(5):
        channel.basic_publish("", "sh.len", str(number).encode())
    answers: list[tuple[str, Any]] = []
    plain = {"src-uri": "amqp://", "src-queue": "sh.src", "dest-uri": "amqp://", "dest-queue": "sh.dst"}
    answers.append(("declare a queue to queue shovel", call(http, "parameters/shovel/%2F/s1", "PUT", {"value": plain})))
    answers.append(("declare it again unchanged", call(http, "parameters/shovel/%2F/s1", "PUT", {"value": plain})))
    answers.append(("the messages it moved", got(amqp, "sh.dst", 3)))
    forward = {
        "src-uri": "amqp://", "src-exchange": "sh.x", "src-exchange-key": "order.*", "dest-uri": "amqp://",
        "dest-exchange": "amq.direct", "dest-exchange-key": "sh.fwd", "dest-add-forward-headers": True,
        "dest-add-timestamp-header": True, "dest-publish-properties": {"app_id": "shovel", "priority": 7},
        "ack-mode": "on-publish", "src-prefetch-count": 10,
    }  # fmt: skip
    channel.queue_declare("sh.fwd", durable=True)
    channel.queue_bind("sh.fwd", "amq.direct", "sh.fwd")
    answers.append(("declare an exchange shovel", call(http, "parameters/shovel/%2F/s2", "PUT", {"value": forward})))
    assert wait_for(
        lambda: {s["name"]: s["state"] for s in call(http, "shovels")[1]} == {"s1": "running", "s2": "running"}
    )
    channel.basic_publish("sh.x", "order.paid", b"paid", properties)
    channel.basic_publish("sh.x", "refund.paid", b"not this one", properties)
    answers.append(("what the exchange shovel moved, with its headers", normalised(got(amqp, "sh.fwd", 1))))
    answers.append(("the shovels' status", normalised(call(http, "shovels"))))
    answers.append(("the shovels of /", normalised(call(http, "shovels/%2F"))))
    answers.append(("one shovel", normalised(call(http, "shovels/vhost/%2F/s1"))))
    answers.append(("a missing shovel", call(http, "shovels/vhost/%2F/nothing")))
    answers.append(("the shovels' parameters", call(http, "parameters/shovel")))
    answers.append(("one parameter", call(http, "parameters/shovel/%2F/s2")))
    exported = call(http, "definitions")[1]
    shovels = [p for p in exported["parameters"] if p["component"] == "shovel"]
    answers.append(("exported (in any order: RabbitMQ's is its table's)", sorted(shovels, key=lambda p: p["name"])))
    once = {
        "src-uri": "amqp://",
        "src-queue": "sh.len",
        "dest-uri": "amqp://",
        "dest-queue": "sh.len.dst",
        "src-delete-after": "queue-length",
    }
    answers.append(("declare a shovel that ends", call(http, "parameters/shovel/%2F/s3", "PUT", {"value": once})))
    assert wait_for(lambda: call(http, "parameters/shovel/%2F/s3")[0] == 404), "the shovel did not end"
    answers.append(("what it moved before it ended", got(amqp, "sh.len.dst", 5)))
    answers.append(("its parameter is gone", call(http, "parameters/shovel/%2F/s3")))
    answers.append(("restart a shovel", call(http, "shovels/vhost/%2F/s1/restart", "DELETE")))
    assert wait_for(lambda: {s["name"]: s["state"] for s in call(http, "shovels")[1]}.get("s1") == "running")
    answers.append(("delete a shovel", call(http, "shovels/vhost/%2F/s1", "DELETE")))
    answers.append(("delete it again", call(http, "shovels/vhost/%2F/s1", "DELETE")))
    answers.append(("its parameter after", call(http, "parameters/shovel/%2F/s1")))
    answers.append(("clear a parameter", call(http, "parameters/shovel/%2F/s2", "DELETE")))
    answers.append(("clear it again", call(http, "parameters/shovel/%2F/s2", "DELETE")))
    assert wait_for(lambda: call(http, "shovels")[1] == [])
    for queue in ("sh.src", "sh.len", "sh.dst", "sh.fwd", "sh.len.dst"):
        channel.queue_delete(queue)
    channel.exchange_delete("sh.x")
    connection.close()
    return answers


def test_shovels_move_messages_and_show_their_status_as_on_rabbitmq(
    rabbitmq_shovels: tuple[int, int], postroom_shovels: tuple[int, int]
) -> None:
    expected = moving(*rabbitmq_shovels)
    assert len(dict(expected)["the messages it moved"]) == 3  # what the oracle is about
    actual = moving(*postroom_shovels)
    mismatches = [
        f"{label}:\n  rabbitmq {want!r}\n  postroom {got!r}"
        for (label, want), (_, got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)


#: ``postroom ctl``'s shovel verbs against ``rabbitmqctl``'s (plugin verbs included).
CTL_SESSION: list[list[str]] = [
    ["set_parameter", "shovel", "sc1", json.dumps(
        {"src-uri": "amqp://", "src-queue": "sc.src", "dest-uri": "amqp://", "dest-queue": "sc.dst"}
    )],
    ["set_parameter", "shovel", "sc-bad", json.dumps({"src-uri": "amqp://", "dest-uri": "amqp://"})],
    ["set_parameter", "shovel", "sc-bad", "{not json"],
    ["list_parameters"],
    ["list_parameters", "--formatter", "json"],
    ["shovel_status"],
    ["restart_shovel", "sc1"],
    ["restart_shovel", "sc-none"],
    ["delete_shovel", "sc1"],
    ["delete_shovel", "sc1"],
    ["clear_parameter", "shovel", "sc-none"],
    ["list_parameters"],
]  # fmt: skip


def ctl_session(run: Any, http: int) -> list[Any]:
    printed = []
    for command in CTL_SESSION:
        if command[0] == "shovel_status":
            assert wait_for(lambda: [s["state"] for s in call(http, "shovels")[1]] == ["running"])
        code, out, err = run(command)
        said = [line for line in err.splitlines() if line and not re.match(r"^\d\d:\d\d:\d\d\.\d+ \[", line)]
        text = re.sub(r"\S+@\S+", "NODE", out + "\n".join(said))
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "LOCAL TIME", text)
        printed.append((" ".join(command[:3]), code, text))
    return printed


def test_postroom_ctl_sets_lists_and_deletes_shovels_as_rabbitmqctl_does(
    rabbitmq_shovels: tuple[int, int], postroom_shovels: tuple[int, int]
) -> None:
    rabbitmqctl = functools.partial(run_rabbitmqctl, rabbitmq_shovels[0])
    postroom_ctl = functools.partial(run_postroom_ctl, postroom_shovels[1])
    expected = ctl_session(rabbitmqctl, rabbitmq_shovels[1])
    assert expected[0][1] == 0 and expected[1][1] != 0  # what the oracle is about: set, then refused
    actual = ctl_session(postroom_ctl, postroom_shovels[1])
    mismatches = [
        f"{command}:\n  rabbitmqctl {want!r}\n  postroom    {got!r}"
        for (command, *want), (_, *got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)

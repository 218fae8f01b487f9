"""``postroom publish``, ``consume`` and ``declare -f`` against a running broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from postroom import config

pytestmark = pytest.mark.integration

EXAMPLE = Path(config.__file__).parent / "postroom.yaml"


def postroom(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_declare_publish_and_consume_from_the_command_line(broker: Any) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    declared = postroom("declare", "--url", url, "-f", str(EXAMPLE))
    assert declared.returncode == 0, declared.stderr
    assert b"declared 3 exchange(s), 3 queue(s), 3 binding(s)" in declared.stdout
    sent = postroom(
        "publish", "--url", url, "--exchange", "orders", "--header", "tenant=acme", "order.eu.created", '{"id": 7}'
    )
    assert sent.returncode == 0, sent.stderr
    piped = postroom("publish", "--url", url, "--exchange", "orders", "order.us.created", stdin=b"\xff\x00binary")
    assert piped.returncode == 0, piped.stderr
    consumed = postroom("consume", "--url", url, "orders.created", "--count", "2", "--timeout", "2")
    assert consumed.returncode == 0, consumed.stderr
    lines = [json.loads(line) for line in consumed.stdout.decode().splitlines()]
    assert [(m["routing_key"], m["body"], m["body_encoding"]) for m in lines] == [
        ("order.eu.created", '{"id": 7}', "utf-8"),
        ("order.us.created", "/wBiaW5hcnk=", "base64"),
    ]
    assert lines[0]["headers"] == {"tenant": "acme"}


def test_declare_applies_what_the_broker_applies_at_start(broker: Any, tmp_path: Path) -> None:
    # The same definitions, over AMQP: auto-delete and every other property of each object.
    definitions = tmp_path / "definitions.yaml"
    definitions.write_text(
        "vhosts:\n"
        "  /:\n"
        "    exchanges: [{name: events, type: topic, durable: false, auto_delete: true}]\n"
        "    queues: [{name: scratch, durable: false, auto_delete: true, max_length: 5}]\n"
        "    bindings: [{exchange: events, queue: scratch, routing_key: '#'}]\n"
    )
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    declared = postroom("declare", "--url", url, "-f", str(definitions))
    assert declared.returncode == 0, declared.stderr

    def state() -> tuple[Any, ...]:
        vhost = broker.node.vhosts["/"]
        queue, exchange = vhost.queues["scratch"], vhost.exchanges["events"]
        return (queue.durable, queue.auto_delete, queue.arguments, exchange.durable, exchange.auto_delete)

    assert broker.call(state) == (False, True, {"x-max-length": 5}, False, True)


def test_an_unroutable_mandatory_publish_fails_with_the_reply_code(broker: Any) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    result = postroom("publish", "--url", url, "--mandatory", "nowhere", "lost")
    assert result.returncode == 1
    assert b"312 NO_ROUTE" in result.stderr


def test_names_from_the_broker_reach_the_terminal_escaped(broker: Any) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    result = postroom("publish", "--url", url, "--exchange", "orders\x1b[2J\u202e", "key", "body")
    assert result.returncode == 1
    assert b"\x1b" not in result.stderr and "\u202e".encode() not in result.stderr
    assert "no exchange 'orders\\x1b[2J\\u202e' in vhost '/'".encode() in result.stderr
    # A name this client cannot send is an error of one line, not a traceback.
    refused = postroom("dlq", "inspect", "orders\x1b[2J", "--url", url)
    assert refused.returncode == 1
    assert refused.stderr.decode().splitlines() == [
        "postroom dlq inspect: 0 Basic.Get cannot be sent by this client"
        " (Invalid value for queue: queue='orders\\x1b[2J')"
    ]

"""Users, vhosts, permissions and limits changed through the management API of a real
``postroom serve`` outlive SIGKILL and retired log segments; the YAML applies over them at
start as RabbitMQ's boot-time definitions do."""

from __future__ import annotations

import base64
import json
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest

from postroom.broker.tools.testing import free_port, wait_for_port
from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration


def api(port: int, path: str, method: str = "GET", body: Any = None, user: str = "root:rootpw") -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(user.encode()).decode(),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw else None


def amqp_login(port: int, user: str, password: str, vhost: str = "/") -> str:
    """``ok``, or how the broker refused the login or the vhost."""
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), socket_timeout=5,
                connection_attempts=1,
            )
        )
    except pika.exceptions.ProbableAuthenticationError:
        return "refused"
    except pika.exceptions.ProbableAccessDeniedError:
        return "no access to the vhost"
    connection.close()
    return "ok"


def churn(port: int, user: str, password: str, vhost: str) -> None:
    """Enough persistent messages through a queue, each acked, that the first log segments are
    retired (the definitions live on in the snapshot at the head of each new segment)."""
    credentials = pika.PlainCredentials(user, password)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, vhost, credentials))
    channel = connection.channel()
    channel.queue_declare("ops.churn", durable=True)
    channel.confirm_delivery()
    for _ in range(100):
        channel.basic_publish("", "ops.churn", b"x" * 1000, pika.BasicProperties(delivery_mode=2))
    for _ in range(100):
        method, _properties, _body = channel.basic_get("ops.churn")
        channel.basic_ack(method.delivery_tag)
    channel.basic_publish("", "ops.churn", b"tick", pika.BasicProperties(delivery_mode=2))
    connection.close()


def test_users_vhosts_and_permissions_made_through_the_api_outlive_sigkill(tmp_path: Path) -> None:
    data, http = tmp_path / "data", free_port()
    with broker(data, segment_bytes="32KiB", management=http) as (process, port):
        wait_for_port(http, 30)
        root = {"password": "rootpw", "tags": "administrator"}
        assert api(http, "users/root", "PUT", root, user="guest:guest") == (201, None)
        assert api(http, "permissions/%2F/root", "PUT", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
        assert api(http, "users/guest", "DELETE") == (204, None)  # the usual hardening step
        assert api(http, "vhosts/team", "PUT", {"description": "the team's", "tags": "prod"}) == (201, None)
        assert api(http, "users/ops", "PUT", {"password": "opspw", "tags": "monitoring"}) == (201, None)
        narrow = {"configure": r"^ops\.", "write": ".*", "read": ".*"}
        assert api(http, "permissions/team/ops", "PUT", narrow)[0] == 201
        topics = {"exchange": "amq.topic", "write": "^a", "read": ".*"}
        assert api(http, "topic-permissions/team/ops", "PUT", topics)[0] == 201
        assert api(http, "user-limits/ops/max-connections", "PUT", {"value": 3}) == (204, None)
        assert api(http, "vhost-limits/team/max-queues", "PUT", {"value": 10}) == (204, None)
        assert api(http, "cluster-name", "PUT", {"name": "ops-cluster"}) == (204, None)
        # Each answer came once the change was durable: a kill right after keeps them all.
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(data, segment_bytes="32KiB", management=http) as (process, port):
        wait_for_port(http, 30)
        churn(port, "ops", "opspw", "team")
        assert not (data / "00000000000000000001.wal").exists()
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with broker(data, segment_bytes="32KiB", management=http) as (_process, port):
        wait_for_port(http, 30)
        assert amqp_login(port, "guest", "guest") == "refused"  # deleted, and not created again
        assert amqp_login(port, "ops", "opspw", "team") == "ok"
        assert amqp_login(port, "ops", "opspw", "/") == "no access to the vhost"
        status, definitions = api(http, "definitions")
        assert status == 200
        assert sorted(user["name"] for user in definitions["users"]) == ["ops", "root"]
        assert {(p["user"], p["vhost"], p["configure"]) for p in definitions["permissions"]} == {
            ("root", "/", ".*"),
            ("root", "team", ".*"),  # (who creates a vhost gets permissions on it, as in RabbitMQ)
            ("ops", "team", r"^ops\."),
        }
        assert definitions["topic_permissions"] == [
            {"user": "ops", "vhost": "team", "exchange": "amq.topic", "write": "^a", "read": ".*"}
        ]
        assert api(http, "users/ops")[1]["limits"] == {"max-connections": 3}
        assert api(http, "vhost-limits/team")[1] == [{"vhost": "team", "value": {"max-queues": 10}}]
        team = api(http, "vhosts/team")[1]
        assert (team["description"], team["tags"]) == ("the team's", ["prod"])
        assert api(http, "cluster-name")[1] == {"name": "ops-cluster"}


def test_the_yaml_applies_over_the_stored_definitions_at_each_start(tmp_path: Path) -> None:
    data, http = tmp_path / "data", free_port()
    listed = (
        "users:\n"
        "  - {name: admin, password: adminpw, tags: [administrator]}\n"
        "  - {name: app, password: first, permissions: {'/': {configure: '.*', write: '.*', read: '.*'}}}\n"
        "vhosts:\n"
        "  /: {}\n"
    )
    with broker(data, management=http, extra=listed) as (_process, port):
        wait_for_port(http, 30)
        assert amqp_login(port, "guest", "guest") == "refused"  # the file's users replace the embedded guest
        admin = "admin:adminpw"
        assert api(http, "users/app", "PUT", {"password": "changed", "tags": ""}, user=admin) == (204, None)
        assert api(http, "users/extra", "PUT", {"password": "extrapw", "tags": ""}, user=admin) == (201, None)
        read_only = {"configure": "", "write": "", "read": ".*"}
        assert api(http, "permissions/%2F/extra", "PUT", read_only, user=admin)[0] == 201
        assert api(http, "vhosts/side", "PUT", {}, user=admin) == (201, None)
        assert amqp_login(port, "app", "changed") == "ok"
    with broker(data, management=http, extra=listed) as (_process, port):
        wait_for_port(http, 30)
        assert amqp_login(port, "app", "first") == "ok"  # the file names app: its password wins
        assert amqp_login(port, "app", "changed") == "refused"
        assert amqp_login(port, "extra", "extrapw") == "ok"  # not in the file: kept as stored
        status, vhosts = api(http, "vhosts", user="admin:adminpw")
        assert status == 200 and sorted(vhost["name"] for vhost in vhosts) == ["/", "side"]

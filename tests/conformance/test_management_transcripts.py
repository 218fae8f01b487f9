"""The management API's rules for user tags and permissions, request by request, as RabbitMQ's
management plugin (3.10) applies them.

The same users exist on both brokers, one per tag (none, ``management``, ``monitoring``,
``policymaker``, ``administrator``), each allowed ``^mg\\.`` on ``/`` and nothing on vhost
``mg-other``; each holds an AMQP connection of its own, as does guest. Each user then makes the
same requests (overview, vhosts, queues, connections, channels, exchanges, bindings, getting
and purging messages, closing guest's connection) and what each answer shows of the rules is
compared: the status, the error, and which vhosts, queues and users' connections it lists.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from transcript import api_fields, field_paths, oracle, wait_for

from postroom.broker.core.journal import Journal
from postroom.broker.core.node import ListenerInfo, Node
from postroom.broker.core.users import User
from postroom.broker.server.management import RateSampler, management_site
from postroom.broker.storage.streams import StreamFiles
from postroom.broker.tools.testing import free_port, rabbitmqctl
from postroom.config.schema import Permission, TopicPermission

pytestmark = pytest.mark.integration

#: One user per management tag (``""``: none), in the order they make their requests:
#: the administrator last, since it closes guest's connection.
TAGGED = {
    "mg-none": "", "mg-mgmt": "management", "mg-mon": "monitoring", "mg-pol": "policymaker", "mg-adm": "administrator"
}  # fmt: skip
LIMITED = Permission(r"^mg\.", r"^mg\.", r"^mg\.")
TOPICS = TopicPermission(r"^mg\.", r"^mg\.")
#: Queues: one the users may read, one they may not, one in a vhost they may not open.
QUEUES = (("/", "mg.q"), ("/", "x.q"), ("mg-other", "o.q"))
#: Answers kept different on purpose (docs/rabbitmq-compatibility.md, "Differences from RabbitMQ"): RabbitMQ 3.10's
#: check reads the user of a connection that is not there and fails with a 500.
KNOWN_DIFFERENCES = {"close a missing connection": ((500, None), (401, "not_authorised"))}


@pytest.fixture(scope="module")
def rabbitmq_management() -> Iterator[tuple[int, int]]:
    """A RabbitMQ node with its management plugin: ``(amqp port, management port)``."""
    http_port = free_port()
    config = f"management.tcp.port = {http_port}\nmanagement.tcp.ip = 127.0.0.1\n"
    with oracle(config, ["rabbitmq_management"], also=[http_port]) as port:
        # Set up through the node's own API: one request each, where rabbitmqctl starts an
        # Erlang VM a command.
        limited = {"configure": LIMITED.configure, "write": LIMITED.write, "read": LIMITED.read}
        setup: list[tuple[str, Any]] = [
            ("vhosts/mg-other", {}),
            ("permissions/mg-other/guest", {"configure": ".*", "write": ".*", "read": ".*"}),
        ]
        for name, tag in TAGGED.items():
            setup += [(f"users/{name}", {"password": "secret", "tags": tag}), (f"permissions/%2F/{name}", limited)]
        setup += [
            ("topic-permissions/%2F/mg-mon", {"exchange": "amq.topic", "write": TOPICS.write, "read": TOPICS.read}),
            ("user-limits/mg-pol/max-channels", {"value": 50}),
            ("vhost-limits/mg-other/max-queues", {"value": 100}),
        ]
        for path, body in setup:
            rabbitmq(http_port, path, "PUT", body)
        yield port, http_port


@pytest.fixture
def postroom_management(make_broker: Any, tmp_path: Path) -> Iterator[tuple[int, int]]:
    from twisted.internet import threads

    users = [User("guest", password="guest", loopback_only=True, tags=frozenset({"administrator"}))]
    users += [
        User(
            name,
            password="secret",
            tags=frozenset({tag} if tag else ()),
            permissions={"/": LIMITED},
            topic_permissions={"/": {"amq.topic": TOPICS}} if name == "mg-mon" else None,
            max_channels=50 if name == "mg-pol" else None,
        )
        for name, tag in TAGGED.items()
    ]
    broker = make_broker(Node(users=users, vhost_names=("/", "mg-other")))
    broker.node.vhosts["mg-other"].max_queues = 100
    # Streams can be declared (their files in the test's directory); nothing here publishes to one.
    broker.node.set_streams(StreamFiles(str(tmp_path), Journal(1), broker.reactor))
    POSTROOM_BROKERS.append(broker)
    reactor = broker.reactor
    sampler = RateSampler(broker.node, reactor)  # (sampling every 5 s, as the broker and RabbitMQ do)
    site = management_site(broker.node, sampler)
    threads.blockingCallFromThread(reactor, sampler.start)
    listening = threads.blockingCallFromThread(reactor, lambda: reactor.listenTCP(0, site, interface="127.0.0.1"))
    # What the broker's listeners tell the node once they are bound (broker.server.listeners.Listener).
    broker.node.listeners += [
        ListenerInfo("amqp", "127.0.0.1", broker.port),
        ListenerInfo("http", "127.0.0.1", listening.getHost().port),
    ]
    try:
        yield broker.port, listening.getHost().port
    finally:
        threads.blockingCallFromThread(reactor, listening.stopListening)
        threads.blockingCallFromThread(reactor, sampler.stop)


#: The Postroom broker of the running test (policies are set on it in-process).
POSTROOM_BROKERS: list[Any] = []


def api(
    port: int, user: str, path: str, method: str = "GET", body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any]:
    password = "guest" if user == "guest" else "secret"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(),
            "Content-Type": content_type,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw) if raw else None
        except ValueError:
            return error.code, None


def assert_alike(expected: list[tuple[str, Any]], actual: list[tuple[str, Any]]) -> None:
    """Each step's answer on Postroom is RabbitMQ's; every one that is not is named."""
    mismatches = [
        f"{step}: rabbitmq {want!r}, postroom {got!r}"
        for (step, want), (_, got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)


def shown(status: int, body: Any, pick: Callable[[list[dict[str, Any]]], Any]) -> Any:
    """What an answer shows: the error of a refusal, else what ``pick`` takes from its list."""
    if status >= 400:
        return (status, body.get("error") if isinstance(body, dict) else body)
    return (status, pick(body))


def scenario(amqp_port: int, http_port: int) -> list[tuple[str, str, Any]]:
    connections = []
    try:
        for user in ("guest", *TAGGED):
            credentials = pika.PlainCredentials(user, "guest" if user == "guest" else "secret")
            connection = pika.BlockingConnection(
                pika.ConnectionParameters(
                    "127.0.0.1", amqp_port, credentials=credentials, client_properties={"connection_name": f"of {user}"}
                )
            )
            connections.append(connection)
        guest = connections[0].channel()
        for vhost, queue in QUEUES:
            if vhost == "/":
                guest.queue_declare(queue)
                guest.basic_publish("", queue, b"m")
        other = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", amqp_port, "mg-other", pika.PlainCredentials("guest", "guest"))
        )
        other.channel().queue_declare("o.q")
        other.close()

        def listed() -> list[dict[str, Any]]:
            return [c for c in api(http_port, "guest", "connections")[1] if c["user"] in ("guest", *TAGGED)]

        assert wait_for(lambda: len(listed()) == 1 + len(TAGGED)), listed()
        guest_connection = next(c["name"] for c in listed() if c["user"] == "guest")

        def names(items: list[dict[str, Any]]) -> list[str]:
            return sorted(item["name"] for item in items if item["name"] in {"/", "mg-other"})

        def queues(items: list[dict[str, Any]]) -> list[str]:
            return sorted(f"{q['vhost']}/{q['name']}" for q in items if q["name"] in {name for _, name in QUEUES})

        def users(items: list[dict[str, Any]]) -> list[str]:
            return sorted({c["user"] for c in items if c["user"] in ("guest", *TAGGED)})

        def nothing(items: Any) -> None:
            return None

        get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
        closing = f"connections/{urllib.parse.quote(guest_connection, safe='')}"
        requests: list[tuple[str, str, str, Any, Callable[[Any], Any]]] = [
            ("GET overview", "overview", "GET", None, nothing),
            ("GET vhosts", "vhosts", "GET", None, names),
            ("GET a vhost with permissions", "vhosts/%2F", "GET", None, nothing),
            ("GET a vhost without permissions", "vhosts/mg-other", "GET", None, nothing),
            ("GET a missing vhost", "vhosts/mg-missing", "GET", None, nothing),
            ("GET queues of a missing vhost", "queues/mg-missing", "GET", None, nothing),
            ("GET queues", "queues", "GET", None, queues),
            ("GET queues of /", "queues/%2F", "GET", None, queues),
            ("GET queues of a vhost without permissions", "queues/mg-other", "GET", None, queues),
            ("GET an unreadable queue", "queues/%2F/x.q", "GET", None, nothing),
            ("GET a queue in a vhost without permissions", "queues/mg-other/o.q", "GET", None, nothing),
            ("GET exchanges", "exchanges/%2F", "GET", None, nothing),
            ("GET bindings", "bindings/%2F", "GET", None, nothing),
            ("GET connections", "connections", "GET", None, users),
            ("GET channels", "channels", "GET", None, users),
            ("get from a readable queue", "queues/%2F/mg.q/get", "POST", get, nothing),
            ("get from an unreadable queue", "queues/%2F/x.q/get", "POST", get, nothing),
            ("get in a vhost without permissions", "queues/mg-other/o.q/get", "POST", get, nothing),
            ("purge a readable queue", "queues/%2F/mg.q/contents", "DELETE", None, nothing),
            ("purge an unreadable queue", "queues/%2F/x.q/contents", "DELETE", None, nothing),
            ("close a missing connection", "connections/nobody", "DELETE", None, nothing),
            ("close guest's connection", closing, "DELETE", None, nothing),
        ]
        answers = []
        for user in TAGGED:
            for label, path, method, body, pick in requests:
                status, answer = api(http_port, user, path, method, body)
                answers.append((user, label, shown(status, answer, pick)))
        return answers
    finally:
        for connection in connections:
            if connection.is_open:
                try:
                    connection.close()
                except pika.exceptions.AMQPError:
                    pass


def test_the_management_api_shows_each_tag_what_rabbitmq_shows_it(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = scenario(*rabbitmq_management)
    actual = scenario(*postroom_management)

    # What the oracle is about: an untagged user is refused, a monitoring user sees every connection.
    by_request = {(user, request): answer for user, request, answer in expected}
    assert by_request["mg-none", "GET overview"] == (401, "not_authorised")
    assert by_request["mg-mon", "GET connections"] == (200, ["guest", *sorted(TAGGED)])
    mismatches = [
        f"{user} {request}: rabbitmq {want}, postroom {got}"
        for (user, request, want), (_, _, got) in zip(expected, actual, strict=True)
        if want != got and KNOWN_DIFFERENCES.get(request) != (want, got)
    ]
    assert not mismatches, "\n".join(mismatches)


#: The policies both brokers get for the policy requests (RabbitMQ's ``set_policy`` arguments).
POLICIES = (
    ("mg-dlx", r"^mg\.", {"dead-letter-exchange": "mg.dlx", "max-length": 100}, 1, "queues", False),
    ("mg-any", ".*", {"message-ttl": 60000}, 0, "all", False),
    # Not tied with mg-any for mg.x: RabbitMQ breaks ties by its table's hash order.
    ("mg-ae", r"^mg\.x$", {"alternate-exchange": "mg.ae"}, 2, "exchanges", False),
    ("mg-caps", ".*", {"max-length": 10}, 0, "queues", True),
)


def policy_scenario(amqp_port: int, http_port: int) -> list[tuple[str, str, Any]]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    try:
        channel = connection.channel()
        # A queue new to both brokers: RabbitMQ's queue objects show their policies once the
        # queue's first statistics are in (and an older queue's only with its next ones).
        channel.queue_declare("mg.policed")
        channel.exchange_declare("mg.x", "direct")
        assert wait_for(lambda: "policy" in api(http_port, "guest", "queues/%2F/mg.policed")[1], 15)

        def policy(items: Any) -> Any:
            fields = ("name", "pattern", "apply-to", "definition", "priority")
            return {field: items.get(field) for field in fields} if isinstance(items, dict) else items

        def listed(items: list[dict[str, Any]]) -> list[tuple[str, int]]:
            return [(item["name"], item["priority"]) for item in items if item["name"].startswith("mg-")]

        def queue_policies(item: dict[str, Any]) -> tuple[Any, Any, Any]:
            return (item.get("policy"), item.get("operator_policy"), item.get("effective_policy_definition"))

        def exchange_policy(item: dict[str, Any]) -> Any:
            return item.get("policy")

        requests: list[tuple[str, str, Callable[[Any], Any]]] = [
            ("GET policies", "policies", listed),
            ("GET policies of /", "policies/%2F", listed),
            ("GET policies of a vhost without permissions", "policies/mg-other", listed),
            ("GET one policy", "policies/%2F/mg-dlx", policy),
            ("GET a missing policy", "policies/%2F/mg-missing", policy),
            ("GET operator policies of /", "operator-policies/%2F", listed),
            ("GET one operator policy", "operator-policies/%2F/mg-caps", policy),
            ("GET a queue's policies", "queues/%2F/mg.policed", queue_policies),
            ("GET an exchange's policy", "exchanges/%2F/mg.x", exchange_policy),
            ("GET an exchange without a policy", "exchanges/%2F/amq.direct", exchange_policy),
        ]
        answers = []
        for user in ("guest", *TAGGED):
            for label, path, pick in requests:
                status, answer = api(http_port, user, path)
                answers.append((user, label, shown(status, answer, pick)))
        channel.queue_delete("mg.policed")
        return answers
    finally:
        connection.close()


def test_policies_are_shown_to_each_tag_as_rabbitmq_shows_them(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    from twisted.internet import threads

    from postroom.broker.core.policy import Policy

    http_port = rabbitmq_management[1]
    broker = POSTROOM_BROKERS[-1]
    vhost = broker.node.vhosts["/"]
    for name, pattern, definition, priority, apply_to, operator in POLICIES:
        body = {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to}
        rabbitmq(http_port, f"{'operator-policies' if operator else 'policies'}/%2F/{name}", "PUT", body)
        policy = Policy(name, pattern, definition, priority, apply_to)
        threads.blockingCallFromThread(broker.reactor, vhost.set_policy, policy, operator)
    try:
        expected = policy_scenario(*rabbitmq_management)
        actual = policy_scenario(*postroom_management)
    finally:
        for name, *_rest, operator in POLICIES:
            rabbitmq(http_port, f"{'operator-policies' if operator else 'policies'}/%2F/{name}", "DELETE")
    by_request = {(user, request): answer for user, request, answer in expected}
    assert by_request["mg-pol", "GET one policy"][0] == 200  # what the oracle is about
    assert by_request["mg-mgmt", "GET one policy"] == (401, "not_authorised")
    mismatches = [
        f"{user} {request}: rabbitmq {want}, postroom {got}"
        for (user, request, want), (_, _, got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)


def policy_changes(amqp_port: int, http_port: int) -> list[tuple[str, str, Any]]:
    """Each tagged user sets, replaces and clears policies through the API, right and wrong."""

    def answer(status: int, body: Any) -> Any:
        if status < 400:
            return (status, body)
        reason = body.get("reason") if isinstance(body, dict) else None
        if isinstance(reason, str) and "should be regular expression but is invalid" in reason:
            reason = reason.split(": ", 1)[0]  # the rest is the regex engine's own words
        return (status, body.get("error") if isinstance(body, dict) else body, reason)

    answers = []
    for user in TAGGED:
        mine = f"policies/%2F/mg-put-{user}"
        good = {"pattern": r"^mg\.put\.", "definition": {"max-length": 5}, "apply-to": "queues"}
        requests: list[tuple[str, str, str, Any]] = [
            ("set a new policy", mine, "PUT", good),
            ("set it again unchanged", mine, "PUT", good),
            ("replace it", mine, "PUT", {**good, "priority": 3, "definition": {"message-ttl": 10}}),
            ("see it", mine, "GET", None),
            ("set a key policies cannot set", f"{mine}-x", "PUT", {**good, "definition": {"max-priority": 10}}),
            ("set a bad value and a bad key", f"{mine}-x", "PUT", {**good, "definition": {"expires": 0, "a": 1}}),
            ("set an empty definition", f"{mine}-x", "PUT", {**good, "definition": {}}),
            ("set a bad apply-to and priority", f"{mine}-x", "PUT", {**good, "apply-to": "streams", "priority": "5"}),
            ("set a pattern that does not compile", f"{mine}-x", "PUT", {**good, "pattern": "(a"}),
            ("set without a pattern", f"{mine}-x", "PUT", {"definition": {"max-length": 1}}),
            ("set an empty body", f"{mine}-x", "PUT", {}),
            ("set in a missing vhost", f"policies/mg-missing/mg-put-{user}", "PUT", good),
            ("set in a vhost without permissions", f"policies/mg-other/mg-put-{user}", "PUT", good),
            ("clear it", mine, "DELETE", None),
            ("clear it again", mine, "DELETE", None),
            ("see it cleared", mine, "GET", None),
            ("set an operator policy", f"operator-policies/%2F/mg-op-{user}", "PUT", good),
            (
                "set an operator policy with a key only user policies have",
                f"operator-policies/%2F/mg-op-{user}-x",
                "PUT",
                {**good, "definition": {"overflow": "drop-head"}},
            ),
            ("clear the operator policy", f"operator-policies/%2F/mg-op-{user}", "DELETE", None),
        ]
        for label, path, method, body in requests:
            answers.append((user, label, answer(*api(http_port, user, path, method, body))))
        # Sent as text/plain: RabbitMQ takes any type for policies, only JSON for operator policies.
        for label, path in (
            ("set a policy as text", f"{mine}-t"),
            ("set an operator policy as text", f"operator-policies/%2F/mg-op-{user}-t"),
        ):
            status, body = api(http_port, user, path, "PUT", good, content_type="text/plain")
            answers.append((user, label, answer(status, body)))
    return answers


def test_policies_are_set_and_cleared_through_the_api_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    try:
        expected = policy_changes(*rabbitmq_management)
    finally:
        for user in TAGGED:
            for path in (
                f"policies/%2F/mg-put-{user}",
                f"policies/%2F/mg-put-{user}-t",
                f"policies/mg-other/mg-put-{user}",
                f"operator-policies/%2F/mg-op-{user}",
            ):  # most were cleared by the scenario itself
                rabbitmq(rabbitmq_management[1], path, "DELETE", missing_ok=True)
    actual = policy_changes(*postroom_management)
    by_request = {(user, request): answer for user, request, answer in expected}
    # What the oracle is about: who may set policies, and RabbitMQ's words when it refuses one.
    assert by_request["mg-pol", "set a new policy"] == (201, None)
    assert by_request["mg-pol", "set it again unchanged"] == (204, None)
    assert by_request["mg-mgmt", "set a new policy"] == (401, "not_authorised", "User not authorised to access object")
    assert by_request["mg-adm", "set a key policies cannot set"][2].startswith("Validation failed\n\n[{&lt;&lt;")
    mismatches = [
        f"{user} {request}: rabbitmq {want}, postroom {got}"
        for (user, request, want), (_, _, got) in zip(expected, actual, strict=True)
        if want != got
    ]
    assert not mismatches, "\n".join(mismatches)


def declare_exported(amqp_port: int) -> pika.BlockingConnection:
    """The same objects on either broker for the definitions export: returns the connection
    that holds an exclusive queue (which no export has), to be closed after the export."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    channel = connection.channel()
    channel.exchange_declare("def.orders", "topic", durable=True)
    channel.exchange_declare("def.scratch", "fanout")
    channel.exchange_declare("def.inner", "direct", durable=True, internal=True)
    channel.exchange_declare("def.headers", "headers", durable=True, arguments={"alternate-exchange": "def.scratch"})
    arguments = {"x-message-ttl": 1000, "x-dead-letter-exchange": "def.orders", "x-max-length": 5}
    channel.queue_declare("def.kept", durable=True, arguments=arguments)
    channel.queue_declare("def.memory")
    channel.queue_declare("def.excl", exclusive=True, durable=True)  # no durable queue for all that
    channel.queue_bind("def.kept", "def.orders", "a.#")
    channel.queue_bind("def.memory", "amq.topic", "b.*")
    channel.queue_bind("def.kept", "def.headers", "", arguments={"x-match": "all", "k": "v"})
    channel.queue_bind("def.excl", "def.orders", "c.#")
    channel.exchange_bind("def.scratch", "def.orders", "d.#")
    return connection


def exported(document: dict[str, Any]) -> dict[str, Any]:
    """What of an export this test compares: the test's own objects, users and vhosts, in
    order, without the hashes (salted afresh) and the versions."""

    def mine(item: dict[str, Any]) -> bool:
        names = (item.get("name"), item.get("source"), item.get("destination"), item.get("user"))
        return any(str(name).startswith(("def.", "def-", "mg-")) or name == "guest" for name in names if name)

    result = {}
    for key, items in document.items():
        if not isinstance(items, list) or key == "global_parameters":
            continue
        kept = [
            {k: v for k, v in item.items() if k != "password_hash"}
            for item in items
            if key == "vhosts" and item["name"] in ("/", "mg-other") or key != "vhosts" and mine(item)
        ]
        result[key] = sorted(kept, key=lambda item: json.dumps(item, sort_keys=True))
    return result


def test_the_definitions_export_holds_what_rabbitmqs_holds_and_rabbitmq_imports_it(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    from twisted.internet import threads

    from postroom.broker.core.policy import Policy

    amqp_port, http_port = rabbitmq_management
    broker = POSTROOM_BROKERS[-1]
    vhost = broker.node.vhosts["/"]
    for path, pattern, definition, priority in (
        ("policies/%2F/def-dlx", r"^def\.", {"dead-letter-exchange": "def.orders"}, 1),
        ("operator-policies/%2F/def-cap", r"^def\.", {"max-length": 100}, 0),
    ):
        rabbitmq(http_port, path, "PUT", {"pattern": pattern, "definition": definition, "priority": priority,
                                          "apply-to": "queues" if priority else "all"})  # fmt: skip
    threads.blockingCallFromThread(
        broker.reactor,
        vhost.set_policy,
        Policy("def-dlx", r"^def\.", {"dead-letter-exchange": "def.orders"}, 1, "queues"),
    )
    threads.blockingCallFromThread(
        broker.reactor, vhost.set_policy, Policy("def-cap", r"^def\.", {"max-length": 100}), True
    )
    answers: dict[str, list[tuple[int, Any]]] = {}
    exclusive: dict[str, tuple[Any, ...]] = {}  # the exclusive queue, declared durable, as the API shows it
    try:
        for name, (amqp, http) in (("rabbitmq", rabbitmq_management), ("postroom", postroom_management)):
            holder = declare_exported(amqp)
            answers[name] = [
                api(http, "guest", "definitions"),
                api(http, "guest", "definitions/%2F"),
                api(http, "guest", "definitions/mg-missing"),
                api(http, "mg-pol", "definitions"),
            ]
            status, shown = api(http, "guest", "queues/%2F/def.excl")
            exclusive[name] = (status, shown.get("durable"), shown.get("exclusive"), shown.get("auto_delete"))
            holder.close()
        # The way out: Postroom's export of a vhost, imported into a fresh vhost of RabbitMQ.
        rabbitmq(http_port, "vhosts/def-import", "PUT", {})
        rabbitmq(http_port, "permissions/def-import/guest", "PUT", {"configure": ".*", "write": ".*", "read": ".*"})
        imported = api(http_port, "guest", "definitions/def-import", "POST", answers["postroom"][1][1])
        reexported = api(http_port, "guest", "definitions/def-import")
    finally:
        for path in ("vhosts/def-import", "policies/%2F/def-dlx", "operator-policies/%2F/def-cap"):
            rabbitmq(http_port, path, "DELETE", missing_ok=True)
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        channel = connection.channel()
        for queue in ("def.kept", "def.memory"):
            channel.queue_delete(queue)
        for exchange in ("def.orders", "def.scratch", "def.inner", "def.headers"):
            channel.exchange_delete(exchange)
        connection.close()
    (status, rabbitmq_all), (_, rabbitmq_one), missing, refused = answers["rabbitmq"]
    assert status == 200
    assert missing == (400, {"error": "bad_request", "reason": "vhost_not_found"})
    assert refused == (401, {"error": "not_authorised", "reason": "Not administrator user"})
    assert [q["name"] for q in exported(rabbitmq_all)["queues"]] == ["def.kept", "def.memory"]  # no exclusive one
    assert exclusive["postroom"] == exclusive["rabbitmq"] == (200, False, True, False)
    (_, postroom_all), (_, postroom_one), *refusals = answers["postroom"]
    assert refusals == [missing, refused]
    assert exported(postroom_all) == exported(rabbitmq_all)
    assert exported(postroom_one) == exported(rabbitmq_one)
    assert set(postroom_all) == set(rabbitmq_all)
    assert set(postroom_one) == set(rabbitmq_one)
    # A password RabbitMQ can check: guest's, hashed as RabbitMQ hashes it.
    guest = next(user for user in postroom_all["users"] if user["name"] == "guest")
    raw = base64.b64decode(guest["password_hash"])
    assert hashlib.sha256(raw[:4] + b"guest").digest() == raw[4:]
    assert imported[0] in (200, 201, 204), imported
    # Policies and parameters name their vhost, which is now the one imported into.
    moved = json.loads(json.dumps(reexported[1]).replace('"vhost": "def-import"', '"vhost": "/"'))
    assert exported(moved) == exported(postroom_one)


def settled(views: tuple[Any, ...], active: str) -> bool:
    """Whether the queue's single active consumer is ``active`` and its consumer details and
    the consumer list both show it active, alone."""
    _count, tag, details, listed = views
    alone = [(active, True)]
    return tag == active and [d[:2] for d in details] == alone and [c[:2] for c in listed] == alone


def consumer_views(amqp_port: int, http_port: int) -> list[Any]:
    """A single-active-consumer queue with two consumers, before and after the active one leaves,
    as the queue object and ``/api/consumers`` show it."""

    def shown() -> tuple[Any, ...]:
        queue = api(http_port, "guest", "queues/%2F/mg.sac")[1]
        details = sorted(
            (c["consumer_tag"], c["active"], c["activity_status"], c["ack_required"], c["prefetch_count"],
             c["exclusive"], c["arguments"], c["queue"])
            for c in queue.get("consumer_details", [])
        )  # fmt: skip
        listed = sorted(
            (c["consumer_tag"], c["active"], c["activity_status"])
            for c in api(http_port, "guest", "consumers/%2F")[1]
            if c["queue"]["name"] == "mg.sac"
        )
        return queue.get("consumers"), queue.get("single_active_consumer_tag"), details, listed

    connections = [pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port)) for _ in range(2)]
    try:
        first, second = (connection.channel() for connection in connections)
        first.queue_declare("mg.sac", arguments={"x-single-active-consumer": True})
        first.basic_qos(prefetch_count=7)
        first.basic_consume("mg.sac", lambda *_: None, consumer_tag="first")
        second.basic_consume("mg.sac", lambda *_: None, consumer_tag="second", auto_ack=True,
                             arguments={"x-priority": 3})  # fmt: skip
        assert wait_for(lambda: len(shown()[2]) == 2 and shown()[1] == "first", 20), shown()
        before = shown()
        connections[0].close()
        # RabbitMQ's views catch up with the queue through statistics emitted every few seconds:
        # wait until both say what the queue's single_active_consumer_tag says.
        assert wait_for(lambda: settled(shown(), "second"), 20), shown()
        after = shown()
        second.queue_delete("mg.sac")
        return [before, after]
    finally:
        for connection in connections:
            if connection.is_open:
                connection.close()


def test_consumer_details_show_the_single_active_consumer_as_rabbitmq_shows_it(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = consumer_views(*rabbitmq_management)
    assert expected[0][1] == "first"  # what the oracle is about
    assert consumer_views(*postroom_management) == expected


def stream_policies(amqp_port: int, http_port: int, applied: Callable[[str], Any]) -> list[tuple[str, Any]]:
    """Policies with stream keys: which apply to a stream and to a classic queue (one with a
    key of the other kind applies to neither; ``applied`` tells the policy of a queue), and the
    refusals of bad values."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    channel = connection.channel()
    channel.queue_declare("mg.s", durable=True, arguments={"x-queue-type": "stream", "x-max-age": "1D"})
    channel.queue_declare("mg.c", durable=True)

    def seen(label: str) -> list[tuple[str, Any]]:
        return [(f"{label}: {queue}", applied(queue)) for queue in ("mg.s", "mg.c")]

    def put(name: str, definition: dict[str, Any], priority: int) -> tuple[str, Any]:
        body = {"pattern": r"^mg\.[sc]$", "definition": definition, "priority": priority, "apply-to": "queues"}
        status, answer = api(http_port, "guest", f"policies/%2F/{name}", "PUT", body)
        return (f"set {name} {definition}", (status, answer.get("reason") if isinstance(answer, dict) else answer))

    answers = []
    try:
        answers.append(put("mg-s-good", {"max-age": "1h", "max-length-bytes": 5000}, 1))
        answers += seen("stream keys")
        answers.append(put("mg-s-mixed", {"max-age": "2h", "max-length": 10}, 5))
        answers += seen("a higher policy with a key streams do not take")
        answers.append(put("mg-s-segment", {"stream-max-segment-size-bytes": 1_000_000}, 3))
        answers += seen("a segment size")
        answers.append(put("mg-s-limit", {"max-length-bytes": 100}, 4))
        answers += seen("a key both take")
        answers.append(put("mg-s-bad-age", {"max-age": "7X"}, 0))
        answers.append(put("mg-s-bad-segment", {"stream-max-segment-size-bytes": 3_000_000_001}, 0))
        answers.append(put("mg-s-zero-segment", {"stream-max-segment-size-bytes": 0}, 0))
    finally:
        for name in ("mg-s-good", "mg-s-mixed", "mg-s-segment", "mg-s-limit", "mg-s-zero-segment"):
            api(http_port, "guest", f"policies/%2F/{name}", "DELETE")
        channel.queue_delete("mg.s")
        channel.queue_delete("mg.c")
        connection.close()
    return answers


def test_stream_keys_of_policies_apply_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    amqp, http = rabbitmq_management

    def on_rabbitmq(queue: str) -> Any:
        # rabbitmqctl, not the management API: the API shows a queue's policy only once its
        # statistics were next emitted (every 5 seconds).
        listed = rabbitmqctl(amqp, "list_queues", "name", "policy", "--formatter", "json")
        return next(item["policy"] or None for item in json.loads(listed) if item["name"] == queue)

    def on_postroom(queue: str) -> Any:
        return api(postroom_management[1], "guest", f"queues/%2F/{queue}")[1]["policy"]

    expected = stream_policies(amqp, http, on_rabbitmq)
    actual = stream_policies(*postroom_management, on_postroom)
    by_step = dict(expected)
    # What the oracle is about: the policy streams take, and the one they do not.
    assert by_step["stream keys: mg.s"] == "mg-s-good" and by_step["stream keys: mg.c"] is None
    assert by_step["a higher policy with a key streams do not take: mg.s"] == "mg-s-good"
    assert_alike(expected, actual)


#: What a stream's queue view says of it, besides what every queue's view says (the node's own
#: name is replaced by ``NODE``).
STREAM_FIELDS = ("type", "state", "node", "members", "online", "readers", "durable", "exclusive", "auto_delete",
                 "arguments", "consumers", "single_active_consumer_tag", "exclusive_consumer_tag")  # fmt: skip


def stream_view(amqp_port: int, http_port: int) -> dict[str, Any]:
    """A stream's fields in ``GET /api/queues/VHOST/NAME`` while one consumer reads it."""
    node = api(http_port, "guest", "nodes")[1][0]["name"]
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    channel = connection.channel()
    channel.queue_declare("mg.sv", durable=True, arguments={"x-queue-type": "stream", "x-max-age": "1D"})
    try:
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume("mg.sv", lambda *_: None, arguments={"x-stream-offset": "first"})

        def shown() -> dict[str, Any]:
            view = api(http_port, "guest", "queues/%2F/mg.sv")[1]
            fields = {key: view.get(key, "(absent)") for key in STREAM_FIELDS}
            return json.loads(json.dumps(fields).replace(json.dumps(node), '"NODE"'))

        # RabbitMQ's view of the consumer comes with the queue's next statistics (every 5 s).
        assert wait_for(lambda: shown()["consumers"] == 1 and shown()["readers"] == {"NODE": 1}, 20), shown()
        return shown()
    finally:
        channel.queue_delete("mg.sv")
        connection.close()


def test_a_stream_shows_its_node_members_readers_and_state_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = stream_view(*rabbitmq_management)
    assert expected["type"] == "stream" and expected["members"] == ["NODE"]  # what the oracle is about
    assert stream_view(*postroom_management) == expected


def exchange(
    port: int, path: str, method: str = "GET", credentials: tuple[str, str] | None = ("guest", "guest")
) -> tuple[int, str | None, Any]:
    """A request's status, its challenge (``WWW-Authenticate``) and its body (JSON, or the text)."""
    headers = {"Content-Type": "application/json"}
    if credentials is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, challenge, raw = response.status, response.headers.get("WWW-Authenticate"), response.read()
    except urllib.error.HTTPError as error:
        status, challenge, raw = error.code, error.headers.get("WWW-Authenticate"), error.read()
    try:
        return status, challenge, json.loads(raw) if raw else None
    except ValueError:
        return status, challenge, raw.decode("utf-8", "replace")


def health_answers(amqp_port: int, http_port: int) -> list[tuple[str, Any]]:
    """Who-am-I, the aliveness test, the health checks and the node's names, and how requests
    without a route, with a method the route does not take, or without a login are refused.
    The node's own name reads ``NODE``; the listeners a failed check lists are left out."""
    node = api(http_port, "guest", "nodes")[1][0]["name"]
    requests: list[tuple[str, str, str, tuple[str, str] | None]] = [
        ("whoami", "whoami", "GET", ("guest", "guest")),
        ("whoami of a monitoring user", "whoami", "GET", ("mg-mon", "secret")),
        ("whoami of a user without a management tag", "whoami", "GET", ("mg-none", "secret")),
        ("no credentials", "whoami", "GET", None),
        ("a wrong password", "overview", "GET", ("guest", "wrong")),
        ("a path no route has", "no-such-thing", "GET", ("guest", "guest")),
        ("a path no route has, without credentials", "no-such-thing", "GET", None),
        ("a method the route does not take", "overview", "PUT", ("guest", "guest")),
        ("a method the route does not take, without credentials", "overview", "DELETE", None),
        ("aliveness of /", "aliveness-test/%2F", "GET", ("guest", "guest")),
        ("aliveness of / again", "aliveness-test/%2F", "GET", ("guest", "guest")),
        ("aliveness of a missing vhost", "aliveness-test/mg-missing", "GET", ("guest", "guest")),
        ("aliveness of a vhost the user may not open", "aliveness-test/mg-other", "GET", ("mg-mgmt", "secret")),
        ("alarms", "health/checks/alarms", "GET", ("guest", "guest")),
        ("local alarms", "health/checks/local-alarms", "GET", ("guest", "guest")),
        ("virtual hosts", "health/checks/virtual-hosts", "GET", ("guest", "guest")),
        ("the AMQP port", f"health/checks/port-listener/{amqp_port}", "GET", ("guest", "guest")),
        ("a port nothing listens on", "health/checks/port-listener/1", "GET", ("guest", "guest")),
        ("a port that is not a number", "health/checks/port-listener/amqp", "GET", ("guest", "guest")),
        ("the AMQP protocol", "health/checks/protocol-listener/amqp", "GET", ("guest", "guest")),
        ("the AMQP protocol by another name", "health/checks/protocol-listener/AMQP0-9-1", "GET", ("guest", "guest")),
        ("the management API's protocol", "health/checks/protocol-listener/management", "GET", ("guest", "guest")),
        ("a protocol nothing serves", "health/checks/protocol-listener/mqtt", "GET", ("guest", "guest")),
        ("AMQP over TLS, not served", "health/checks/protocol-listener/amqps", "GET", ("guest", "guest")),
        ("mirror sync", "health/checks/node-is-mirror-sync-critical", "GET", ("guest", "guest")),
        ("quorum", "health/checks/node-is-quorum-critical", "GET", ("guest", "guest")),
        ("certificates, no TLS listener", "health/checks/certificate-expiration/1/weeks", "GET", ("guest", "guest")),
        ("certificates in months", "health/checks/certificate-expiration/3/Months", "GET", ("guest", "guest")),
        ("certificates, a bad unit", "health/checks/certificate-expiration/1/fortnights", "GET", ("guest", "guest")),
        ("certificates, a bad number", "health/checks/certificate-expiration/one/weeks", "GET", ("guest", "guest")),
        ("the old node health check", "healthchecks/node", "GET", ("guest", "guest")),
        ("the cluster's name", "cluster-name", "GET", ("guest", "guest")),
        ("whoami, a policymaker", "whoami", "GET", ("mg-pol", "secret")),
        ("how to log in, asked without credentials", "auth", "GET", None),
        ("how to log in, with a wrong password", "auth", "GET", ("guest", "wrong")),
    ]
    answers = []
    for label, path, method, credentials in requests:
        status, challenge, body = exchange(http_port, path, method, credentials)
        if isinstance(body, dict):
            body.pop("ports", None)
            body.pop("protocols", None)
            if body.get("port") == amqp_port:
                body["port"] = "the AMQP port"
            if path == "cluster-name":  # RabbitMQ's is its node's name with the host's full name
                body["name"] = bool(body["name"])
        answers.append((label, json.loads(json.dumps([status, challenge, body]).replace(json.dumps(node), '"NODE"'))))
    queue = api(http_port, "guest", "queues/%2F/aliveness-test")[1]
    kept = ("durable", "auto_delete", "exclusive", "arguments")
    answers.append(("the aliveness queue", {key: queue[key] for key in kept}))
    api(http_port, "guest", "queues/%2F/aliveness-test", "DELETE")
    return answers


def test_health_checks_and_refusals_answer_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = health_answers(*rabbitmq_management)
    by_label = dict(expected)
    # What the oracle is about.
    assert by_label["whoami"] == [200, None, {"name": "guest", "tags": ["administrator"]}]
    assert by_label["no credentials"] == [401, 'Basic realm="RabbitMQ Management"', None]
    assert by_label["a port nothing listens on"][0] == 503
    actual = health_answers(*postroom_management)
    assert_alike(expected, actual)


def send(port: int, path: str, method: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any, str | None]:
    """A request as guest: its status, its body (JSON) and its ``Location``."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=data,
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw_answer, location = response.status, response.read(), response.headers.get("Location")
    except urllib.error.HTTPError as error:
        status, raw_answer, location = error.code, error.read(), error.headers.get("Location")
    return status, json.loads(raw_answer) if raw_answer else None, location


def rabbitmq(port: int, path: str, method: str, body: Any = None, missing_ok: bool = False) -> None:
    """A request as guest that sets the oracle up or tidies it (where ``rabbitmqctl`` would start
    an Erlang VM a command): it must succeed, or find nothing there when ``missing_ok``."""
    status, answer, _location = send(port, path, method, body)
    assert status < 300 or (missing_ok and status == 404), (method, path, status, answer)


#: Of an exchange's or a queue's view, what a declare through the API decides.
DECLARED = ("type", "durable", "auto_delete", "internal", "exclusive", "arguments")


def write_answers(http_port: int) -> list[tuple[str, Any]]:
    """Exchanges and queues declared and deleted, bindings made, listed and removed, messages
    published and got (each ackmode) through the management API, as guest."""
    publish = {"routing_key": "a.b", "payload": "hi", "payload_encoding": "string", "properties": {}}
    persistent = {
        "routing_key": "mg.w1",
        "payload": base64.b64encode(b"\xff\x00binary").decode(),
        "payload_encoding": "base64",
        "properties": {"delivery_mode": 2, "headers": {"h": 1, "s": "text"}, "content_type": "application/x"},
    }
    steps: list[tuple[str, str, str, Any]] = [
        ("declare a topic exchange", "exchanges/%2F/mg.we1", "PUT", {"type": "topic", "durable": True}),
        ("declare it again", "exchanges/%2F/mg.we1", "PUT", {"type": "topic", "durable": True}),
        ("declare it as direct", "exchanges/%2F/mg.we1", "PUT", {"type": "direct", "durable": True}),
        ("declare an exchange with nothing said", "exchanges/%2F/mg.we2", "PUT", {}),
        ("the exchange with nothing said", "exchanges/%2F/mg.we2", "GET", None),
        ("declare one with flags as strings", "exchanges/%2F/mg.we3", "PUT",
         {"type": "fanout", "durable": "true", "auto_delete": "false", "arguments": {"alternate-exchange": "x"}}),
        ("the one with flags as strings", "exchanges/%2F/mg.we3", "GET", None),
        ("declare an unknown type", "exchanges/%2F/mg.we4", "PUT", {"type": "bogus"}),
        ("declare in a missing vhost", "exchanges/mg-missing/mg.we4", "PUT", {"type": "direct"}),
        ("declare an amq. exchange", "exchanges/%2F/amq.mg", "PUT", {"type": "direct"}),
        ("redeclare amq.direct", "exchanges/%2F/amq.direct", "PUT", {"type": "direct", "durable": True}),
        ("redeclare amq.direct as topic", "exchanges/%2F/amq.direct", "PUT", {"type": "topic", "durable": True}),
        ("declare with a flag that is not one", "exchanges/%2F/mg.we4", "PUT", {"durable": 5}),
        ("declare a queue", "queues/%2F/mg.w1", "PUT", {"durable": True, "arguments": {"x-max-length": 10}}),
        ("declare it again", "queues/%2F/mg.w1", "PUT", {"durable": True, "arguments": {"x-max-length": 10}}),
        ("declare it not durable", "queues/%2F/mg.w1", "PUT", {"durable": False}),
        ("declare with a bad argument", "queues/%2F/mg.w2", "PUT", {"arguments": {"x-max-length": "ten"}}),
        ("declare with a double", "queues/%2F/mg.w2", "PUT", {"arguments": {"x-max-length": 1.5}}),
        ("declare an unknown queue type", "queues/%2F/mg.w2", "PUT", {"arguments": {"x-queue-type": "bogus"}}),
        ("declare a queue with nothing said", "queues/%2F/mg.w3", "PUT", {}),
        ("the queue with nothing said", "queues/%2F/mg.w3", "GET", None),
        ("declare an exclusive queue", "queues/%2F/mg.w4", "PUT", {"exclusive": True, "auto_delete": "true"}),
        ("the exclusive queue", "queues/%2F/mg.w4", "GET", None),
        ("declare a queue in a missing vhost", "queues/mg-missing/mg.w5", "PUT", {}),
        ("declare an amq. queue", "queues/%2F/amq.mg", "PUT", {}),
        ("bind with a key", "bindings/%2F/e/mg.we1/q/mg.w1", "POST", {"routing_key": "a.b"}),
        ("bind with no key", "bindings/%2F/e/mg.we1/q/mg.w1", "POST", {}),
        ("bind a key with a space and a tilde", "bindings/%2F/e/mg.we1/q/mg.w1", "POST", {"routing_key": "a b~c"}),
        ("the bindings", "bindings/%2F/e/mg.we1/q/mg.w1", "GET", None),
        ("one binding", "bindings/%2F/e/mg.we1/q/mg.w1/~", "GET", None),
        ("bind to a missing queue", "bindings/%2F/e/mg.we1/q/mg.nope", "POST", {}),
        ("bind from a missing exchange", "bindings/%2F/e/mg.nope/q/mg.w1", "POST", {}),
        ("bind an exchange", "bindings/%2F/e/mg.we1/e/mg.we2", "POST", {"routing_key": "k"}),
        ("unbind", "bindings/%2F/e/mg.we1/q/mg.w1/~", "DELETE", None),
        ("unbind again", "bindings/%2F/e/mg.we1/q/mg.w1/~", "DELETE", None),
        ("unbind what was never bound", "bindings/%2F/e/mg.we1/q/mg.w1/x.y", "DELETE", None),
        ("publish through the topic exchange", "exchanges/%2F/mg.we1/publish", "POST", publish),
        ("publish through the default exchange", "exchanges/%2F/amq.default/publish", "POST", persistent),
        ("publish with keys missing", "exchanges/%2F/amq.default/publish", "POST", {"routing_key": "x"}),
        ("publish to a missing exchange", "exchanges/%2F/mg.nope/publish", "POST", publish),
        ("publish what no queue takes", "exchanges/%2F/mg.we1/publish", "POST", {**publish, "routing_key": "z"}),
        ("get, requeued", "queues/%2F/mg.w1/get", "POST",
         {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}),
        ("get in base64, cut, acked", "queues/%2F/mg.w1/get", "POST",
         {"count": "5", "ackmode": "ack_requeue_false", "encoding": "base64", "truncate": 1}),
        ("get from the empty queue", "queues/%2F/mg.w1/get", "POST",
         {"count": 5, "ackmode": "reject_requeue_true", "encoding": "auto"}),
        ("get with keys missing", "queues/%2F/mg.w1/get", "POST", {"count": 5}),
        ("get in an unknown encoding", "queues/%2F/mg.w1/get", "POST",
         {"count": 5, "ackmode": "ack_requeue_true", "encoding": "hex"}),
        ("delete an exchange in use, if unused", "exchanges/%2F/mg.we1?if-unused=true", "DELETE", None),
        ("delete it", "exchanges/%2F/mg.we1", "DELETE", None),
        ("delete it again", "exchanges/%2F/mg.we1", "DELETE", None),
        ("delete amq.direct", "exchanges/%2F/amq.direct", "DELETE", None),
        ("delete an empty queue, if empty", "queues/%2F/mg.w3?if-empty=true", "DELETE", None),
        ("delete a missing queue", "queues/%2F/mg.w3", "DELETE", None),
        ("a method the route does not take", "queues/%2F", "PUT", {}),
    ]  # fmt: skip
    answers = []
    try:
        for label, path, method, body in steps:
            status, answer, location = send(http_port, path, method, body)
            if method == "GET" and isinstance(answer, dict) and "name" in answer:
                answer = {key: answer.get(key) for key in DECLARED}
            answers.append((label, [status, answer, location]))
        answers.append(("a body that is not JSON", list(send(http_port, "queues/%2F/mg.w5", "PUT", raw=b"{bad"))))
    finally:
        for path in ("exchanges/%2F/mg.we1", "exchanges/%2F/mg.we2", "exchanges/%2F/mg.we3"):
            send(http_port, path, "DELETE")
        for name in ("mg.w1", "mg.w2", "mg.w3", "mg.w4", "mg.w5"):
            send(http_port, f"queues/%2F/{name}", "DELETE")
    return answers


def test_declaring_binding_publishing_and_getting_through_the_api_answer_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = write_answers(rabbitmq_management[1])
    by_label = dict(expected)
    assert by_label["declare a topic exchange"][0] == 201 and by_label["bind with no key"][2] == "mg.w1/~"
    actual = write_answers(postroom_management[1])
    assert_alike(expected, actual)


#: RabbitMQ's own ``rabbitmqadmin`` script, from the installed ``rabbitmq-server`` package.
RABBITMQADMIN = Path("/usr/bin/rabbitmqadmin")


def rabbitmqadmin_session(http_port: int) -> list[tuple[str, int, str]]:
    """What ``rabbitmqadmin`` (unchanged) prints for a declare, bind, publish, get, list and
    delete session, as tab-separated values; of lists, only the session's own rows."""
    commands_run = [
        ["declare", "queue", "name=adm.q", "durable=true"],
        ["declare", "queue", "name=adm.q2", "durable=false", 'arguments={"x-max-length": 5}'],
        ["declare", "exchange", "name=adm.e", "type=topic"],
        ["declare", "binding", "source=adm.e", "destination=adm.q", "routing_key=a.*"],
        ["declare", "binding", "source=adm.e", "destination=adm.q2", "routing_key=#"],
        ["publish", "exchange=adm.e", "routing_key=a.b", "payload=hello"],
        ["publish", "exchange=amq.default", "routing_key=adm.q2", "payload=direct", 'properties={"delivery_mode": 2}'],
        ["list", "queues", "name", "durable", "auto_delete", "arguments"],
        ["list", "exchanges", "name", "type", "durable"],
        ["list", "bindings", "source", "destination", "destination_type", "routing_key"],
        ["get", "queue=adm.q", "ackmode=ack_requeue_false"],
        ["get", "queue=adm.q2", "count=5"],
        ["get", "queue=adm.q2", "count=5"],
        ["purge", "queue", "name=adm.q2"],
        ["delete", "binding", "source=adm.e", "destination_type=queue", "destination=adm.q", "properties_key=a.*"],
        ["list", "bindings", "source", "destination", "routing_key"],
        ["declare", "exchange", "name=adm.e", "type=direct"],
        ["delete", "exchange", "name=adm.e"],
        ["delete", "queue", "name=adm.q"],
        ["delete", "queue", "name=adm.q2"],
        ["list", "queues", "name"],
        ["declare", "vhost", "name=adm.v"],
        ["declare", "user", "name=adm.u", "password=pw", "tags=monitoring"],
        ["declare", "permission", "vhost=adm.v", "user=adm.u", "configure=^adm", "write=.*", "read=.*"],
        ["declare", "topic_permission", "vhost=adm.v", "user=adm.u", "exchange=amq.topic", "write=^a", "read=.*"],
        ["list", "users", "name", "tags"],
        ["list", "vhosts", "name"],
        ["list", "permissions", "user", "vhost", "configure", "write", "read"],
        ["list", "topic_permissions", "user", "vhost", "exchange", "write", "read"],
        ["export", "EXPORT"],
        ["delete", "permission", "vhost=adm.v", "user=adm.u"],
        ["delete", "user", "name=adm.u"],
        ["delete", "vhost", "name=adm.v"],
        ["list", "users", "name"],
    ]
    printed = []
    exported = Path(tempfile.mkdtemp(prefix="rabbitmqadmin-")) / "export.json"
    for arguments in commands_run:
        arguments = [str(exported) if argument == "EXPORT" else argument for argument in arguments]
        done = subprocess.run(
            [sys.executable, str(RABBITMQADMIN), "-H", "127.0.0.1", "-P", str(http_port), "-f", "tsv", *arguments],
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = done.stdout + done.stderr
        if arguments[0] == "list":  # the session's rows (the brokers hold other things too)
            output = "\n".join(line for line in output.splitlines() if "adm." in line)
        if arguments[0] == "export":  # what the file holds of the session (each broker holds more)
            document = json.loads(exported.read_text())
            output = output.replace(str(exported), "EXPORT") + json.dumps(
                {
                    "users": [(u["name"], u["tags"]) for u in document["users"] if u["name"].startswith("adm.")],
                    "vhosts": [v["name"] for v in document["vhosts"] if v["name"].startswith("adm.")],
                    "permissions": [p for p in document["permissions"] if p["user"].startswith("adm.")],
                    "topic_permissions": [p for p in document["topic_permissions"] if p["user"].startswith("adm.")],
                },
                sort_keys=True,
            )
            arguments = ["export", "EXPORT"]
        printed.append((" ".join(arguments), done.returncode, output))
    return printed


def test_rabbitmqadmin_works_through_postroom_as_through_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    assert RABBITMQADMIN.exists(), "rabbitmqadmin comes with rabbitmq-server: apt-get install -y rabbitmq-server"
    expected = rabbitmqadmin_session(rabbitmq_management[1])
    by_command = {command: (code, output) for command, code, output in expected}
    assert by_command["publish exchange=adm.e routing_key=a.b payload=hello"][0] == 0  # what the oracle is about
    assert by_command["declare exchange name=adm.e type=direct"][0] != 0, expected
    actual = rabbitmqadmin_session(postroom_management[1])
    assert_alike(*([(command, (code, output)) for command, code, output in run] for run in (expected, actual)))


def list_answers(http_port: int) -> list[tuple[str, Any]]:
    """Lists sorted, cut to columns, and paginated with a name filter (plain and as a regular
    expression); bad pagination parameters. Only counts that the session's own queues decide
    are kept (the brokers hold other queues too)."""
    queues = ["pg.a1", "pg.a2", "pg.A3", "pg.b1", "pg.b2"]
    for index, name in enumerate(queues):
        send(http_port, f"queues/%2F/{name}", "PUT", {"arguments": {"x-max-length": 10 + index}})
    for name in ("pg.e1", "pg.e2", "pg.e3"):
        send(http_port, f"exchanges/%2F/{name}", "PUT", {"type": "fanout"})
    requests = [
        ("queues/%2F?page=1&page_size=2&name=pg.&columns=name", "page 1 of two"),
        ("queues/%2F?page=2&page_size=2&name=pg.&columns=name,arguments.x-max-length", "page 2 with a nested column"),
        ("queues/%2F?page=1&name=PG.A&columns=name", "a name in another case"),
        ("queues/%2F?page=1&name=%5Epg%5C.b&use_regex=true&columns=name", "a regular expression"),
        ("queues?page=1&page_size=10&name=pg.&sort=arguments.x-max-length&sort_reverse=true&columns=name",
         "sorted by a nested field, reversed"),
        ("exchanges/%2F?page=1&page_size=2&name=pg.e&columns=name,type", "exchanges"),
        ("queues/%2F?page=9&page_size=2&name=pg.", "a page past the end"),
        ("queues/%2F?page=0", "page 0"),
        ("queues/%2F?page=1&page_size=501", "a page too large"),
        ("queues/%2F?page=one", "a page that is not a number"),
    ]  # fmt: skip
    answers = []
    try:
        for path, label in requests:
            status, body, _location = send(http_port, path, "GET")
            if isinstance(body, dict):
                body.pop("total_count", None)
            answers.append((label, [status, body]))
        status, body, _location = send(http_port, "queues/%2F?sort=name&sort_reverse=true&columns=name", "GET")
        answers.append(("sorted, unpaginated", [status, [item for item in body if item["name"].startswith("pg.")]]))
    finally:
        for name in queues:
            send(http_port, f"queues/%2F/{name}", "DELETE")
        for name in ("pg.e1", "pg.e2", "pg.e3"):
            send(http_port, f"exchanges/%2F/{name}", "DELETE")
    return answers


def test_lists_sort_cut_and_paginate_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = list_answers(rabbitmq_management[1])
    assert dict(expected)["page 1 of two"][1]["page_count"] == 3  # what the oracle is about
    actual = list_answers(postroom_management[1])
    assert_alike(expected, actual)


def user_answers(http_port: int) -> list[tuple[str, Any]]:
    """Users, permissions, topic permissions and limits as an administrator and a monitoring
    user see them; of lists, the fixture's users only, and a password hash as whether there is one."""
    ours = {"guest", *TAGGED}
    requests = [
        ("guest", "users"), ("guest", "users/mg-mon"), ("guest", "users/mg-missing"), ("mg-mon", "users"),
        ("guest", "permissions"), ("guest", "permissions/%2F/mg-pol"), ("guest", "permissions/mg-other/mg-pol"),
        ("guest", "users/mg-mon/permissions"), ("guest", "vhosts/mg-other/permissions"),
        ("guest", "topic-permissions"), ("guest", "topic-permissions/%2F/mg-mon"),
        ("guest", "users/mg-mon/topic-permissions"), ("guest", "user-limits"), ("guest", "user-limits/mg-pol"),
        ("guest", "vhost-limits"), ("guest", "vhost-limits/mg-other"), ("mg-mgmt", "permissions"),
    ]  # fmt: skip
    answers = []
    for user, path in requests:
        status, body = api(http_port, user, path)
        if isinstance(body, list):  # the fixture's users (and vhost limits, which name no user)
            body = [item for item in body if item.get("user", item.get("name")) in ours or "value" in item]
        for item in body if isinstance(body, list) else [body]:
            if isinstance(item, dict) and "password_hash" in item:
                item["password_hash"] = bool(item["password_hash"])
        answers.append((f"{user} {path}", [status, body]))
    return answers


def test_users_permissions_and_limits_are_listed_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = user_answers(rabbitmq_management[1])
    assert dict(expected)["guest users/mg-mon"][0] == 200  # what the oracle is about
    assert_alike(expected, user_answers(postroom_management[1]))


def admin_answers(http_port: int) -> list[tuple[str, Any]]:
    """Users, vhosts, permissions, topic permissions, limits and the cluster name changed through
    the API as guest (and refused to a management user), each change's answer and then what
    the views show; a password hash as whether there is one."""
    good_hash = base64.b64encode(b"salt" + hashlib.sha256(b"salt" + b"pw").digest()).decode()
    steps: list[tuple[str, str, str, str, Any]] = [
        ("create a user", "guest", "users/ad-u1", "PUT", {"password": "pw", "tags": "monitoring, management"}),
        ("replace its password and tags", "guest", "users/ad-u1", "PUT", {"password": "pw2", "tags": ""}),
        ("the user", "guest", "users/ad-u1", "GET", None),
        ("create one from a hash", "guest", "users/ad-u2", "PUT",
         {"password_hash": good_hash, "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["a", "b"]}),
        ("the one from a hash", "guest", "users/ad-u2", "GET", None),
        ("create one with tags only", "guest", "users/ad-u3", "PUT", {"tags": "management"}),
        ("create one with an empty hash", "guest", "users/ad-u4", "PUT", {"password_hash": "", "tags": ""}),
        ("the one with an empty hash", "guest", "users/ad-u4", "GET", None),
        ("tags left out", "guest", "users/ad-bad", "PUT", {"password": "pw"}),
        ("a hash that is not base64", "guest", "users/ad-bad", "PUT", {"password_hash": "no!", "tags": ""}),
        ("a password and a hash", "guest", "users/ad-bad", "PUT",
         {"password": "x", "password_hash": good_hash, "tags": ""}),
        ("tags with blanks", "guest", "users/ad-u5", "PUT", {"password": "pw", "tags": " a , b,,c"}),
        ("the tags with blanks", "guest", "users/ad-u5", "GET", None),
        ("a new user's permissions", "guest", "users/ad-u1/permissions", "GET", None),
        ("users without permissions", "guest", "users/without-permissions", "GET", None),
        ("grant", "guest", "permissions/%2F/ad-u1", "PUT", {"configure": ".*", "write": ".*", "read": ".*"}),
        ("grant again, narrower", "guest", "permissions/%2F/ad-u1", "PUT",
         {"configure": "^a", "write": ".*", "read": ".*"}),
        ("grant with keys missing", "guest", "permissions/%2F/ad-u1", "PUT", {"configure": "a"}),
        ("grant in a missing vhost", "guest", "permissions/ad-missing/ad-u1", "PUT",
         {"configure": ".*", "write": ".*", "read": ".*"}),
        ("grant to a missing user", "guest", "permissions/%2F/ad-missing", "PUT",
         {"configure": ".*", "write": ".*", "read": ".*"}),
        ("the permission", "guest", "permissions/%2F/ad-u1", "GET", None),
        ("topic permissions", "guest", "topic-permissions/%2F/ad-u1", "PUT",
         {"exchange": "amq.topic", "write": "^a", "read": ".*"}),
        ("topic permissions again", "guest", "topic-permissions/%2F/ad-u1", "PUT",
         {"exchange": "amq.topic", "write": "^b", "read": ".*"}),
        ("topic permissions on a second exchange", "guest", "topic-permissions/%2F/ad-u1", "PUT",
         {"exchange": "ad.x", "write": ".*", "read": ".*"}),
        ("topic permissions with keys missing", "guest", "topic-permissions/%2F/ad-u1", "PUT", {"write": "^a"}),
        ("the topic permissions", "guest", "topic-permissions/%2F/ad-u1", "GET", None),
        ("clear one exchange's", "guest", "topic-permissions/%2F/ad-u1/ad.x", "DELETE", None),
        ("what is left", "guest", "topic-permissions/%2F/ad-u1", "GET", None),
        ("clear them all", "guest", "topic-permissions/%2F/ad-u1", "DELETE", None),
        ("clear them again", "guest", "topic-permissions/%2F/ad-u1", "DELETE", None),
        ("a user limit", "guest", "user-limits/ad-u1/max-connections", "PUT", {"value": 5}),
        ("a negative user limit", "guest", "user-limits/ad-u1/max-channels", "PUT", {"value": -1}),
        ("an unknown user limit", "guest", "user-limits/ad-u1/max-queues", "PUT", {"value": 5}),
        ("a user limit that is text", "guest", "user-limits/ad-u1/max-connections", "PUT", {"value": "x"}),
        ("a user limit that is a fraction", "guest", "user-limits/ad-u1/max-connections", "PUT", {"value": 1.5}),
        ("a user limit without a value", "guest", "user-limits/ad-u1/max-connections", "PUT", {}),
        ("a missing user's limit", "guest", "user-limits/ad-missing/max-connections", "PUT", {"value": 5}),
        ("the user's limits", "guest", "user-limits/ad-u1", "GET", None),
        ("the user with limits", "guest", "users/ad-u1", "GET", None),
        ("clear a user limit", "guest", "user-limits/ad-u1/max-connections", "DELETE", None),
        ("clear it again", "guest", "user-limits/ad-u1/max-connections", "DELETE", None),
        ("create a vhost", "guest", "vhosts/ad-v1", "PUT", {"description": "d", "tags": "a,b"}),
        ("put it again with a description only", "guest", "vhosts/ad-v1", "PUT", {"description": "e"}),
        ("the vhost", "guest", "vhosts/ad-v1", "GET", None),
        ("its permissions (its creator's)", "guest", "vhosts/ad-v1/permissions", "GET", None),
        ("create one with nothing said", "guest", "vhosts/ad-v2", "PUT", None),
        ("create one with tags as a list", "guest", "vhosts/ad-v3", "PUT", {"tags": ["x", "y"]}),
        ("the one with tags as a list", "guest", "vhosts/ad-v3", "GET", None),
        ("a vhost limit", "guest", "vhost-limits/ad-v1/max-queues", "PUT", {"value": 5}),
        ("a negative vhost limit", "guest", "vhost-limits/ad-v1/max-connections", "PUT", {"value": -5}),
        ("an unknown vhost limit", "guest", "vhost-limits/ad-v1/max-channels", "PUT", {"value": 5}),
        ("a vhost limit that is a fraction", "guest", "vhost-limits/ad-v1/max-queues", "PUT", {"value": 1.5}),
        ("a missing vhost's limit", "guest", "vhost-limits/ad-missing/max-queues", "PUT", {"value": 1}),
        ("the vhost's limits", "guest", "vhost-limits/ad-v1", "GET", None),
        ("clear a vhost limit", "guest", "vhost-limits/ad-v1/max-queues", "DELETE", None),
        ("clear it again", "guest", "vhost-limits/ad-v1/max-queues", "DELETE", None),
        ("a management user creates a user", "mg-mgmt", "users/ad-u9", "PUT", {"password": "x", "tags": ""}),
        ("a management user creates a vhost", "mg-mgmt", "vhosts/ad-v9", "PUT", {}),
        ("a management user grants", "mg-mgmt", "permissions/%2F/mg-mgmt", "PUT",
         {"configure": ".*", "write": ".*", "read": ".*"}),
        ("a management user deletes a user", "mg-mgmt", "users/ad-u1", "DELETE", None),
        ("a management user sets a limit", "mg-mgmt", "vhost-limits/ad-v1/max-queues", "PUT", {"value": 1}),
        ("a monitoring user names the cluster", "mg-mon", "cluster-name", "PUT", {"name": "ad"}),
        ("name the cluster", "guest", "cluster-name", "PUT", {"name": "ad-cluster"}),
        ("the cluster's name", "guest", "cluster-name", "GET", None),
        ("name it with no name", "guest", "cluster-name", "PUT", {}),
        ("revoke", "guest", "permissions/%2F/ad-u1", "DELETE", None),
        ("revoke again", "guest", "permissions/%2F/ad-u1", "DELETE", None),
        ("delete a vhost", "guest", "vhosts/ad-v2", "DELETE", None),
        ("delete it again", "guest", "vhosts/ad-v2", "DELETE", None),
        ("delete a user", "guest", "users/ad-u3", "DELETE", None),
        ("delete it again", "guest", "users/ad-u3", "DELETE", None),
        ("bulk-delete up to a missing one", "guest", "users/bulk-delete", "POST",
         {"users": ["ad-u2", "ad-missing", "ad-u4"]}),
        ("bulk-delete without users", "guest", "users/bulk-delete", "POST", {}),
        ("the users left", "guest", "users", "GET", None),
        ("the vhosts left", "guest", "vhosts", "GET", None),
    ]  # fmt: skip
    status, named = api(http_port, "guest", "cluster-name")
    answers = []
    try:
        for label, user, path, method, body in steps:
            status, answer = api(http_port, user, path, method, body)
            if isinstance(answer, list) and answer and isinstance(answer[0], dict):
                answer = [  # the session's own items
                    item
                    for item in answer
                    if str(item.get("name", item.get("user", ""))).startswith("ad-")
                    or str(item.get("vhost", "")).startswith("ad-")
                ]
            for item in answer if isinstance(answer, list) else [answer]:
                if isinstance(item, dict):
                    if "password_hash" in item:
                        item["password_hash"] = bool(item["password_hash"])
                    item.pop("cluster_state", None)  # (names the node)
            answers.append((label, [status, answer]))
    finally:
        api(http_port, "guest", "cluster-name", "PUT", named)
        for name in ("ad-u1", "ad-u2", "ad-u3", "ad-u4", "ad-u5", "ad-u9"):
            api(http_port, "guest", f"users/{name}", "DELETE")
        for name in ("ad-v1", "ad-v2", "ad-v3", "ad-v9"):
            api(http_port, "guest", f"vhosts/{name}", "DELETE")
    return answers


def test_users_vhosts_permissions_and_limits_are_changed_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = admin_answers(rabbitmq_management[1])
    by_label = dict(expected)
    assert by_label["create a user"][0] == 201 and by_label["the user"][1]["tags"] == []  # what the oracle is about
    actual = admin_answers(postroom_management[1])
    assert_alike(expected, actual)


def closed_by(connection: pika.BlockingConnection, seconds: float = 5.0) -> Any:
    """How the broker ended ``connection`` within ``seconds`` (its reply code and text), or
    ``"open"``."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and connection.is_open:
            connection.process_data_events(time_limit=0.1)
    except pika.exceptions.ConnectionClosedByBroker as closed:
        return [closed.reply_code, closed.reply_text]
    except pika.exceptions.AMQPConnectionError as error:
        return type(error).__name__
    return "open" if connection.is_open else "closed"


def publish_answer(channel: Any, exchange: str) -> Any:
    """What publishing to ``exchange`` with confirms gets: ``ack``, or the channel's closing."""
    try:
        channel.basic_publish(exchange, "k", b"m")
        return "ack"
    except pika.exceptions.ChannelClosedByBroker as closed:
        return [closed.reply_code, closed.reply_text]


def admin_effects(amqp_port: int, http_port: int) -> list[tuple[str, Any]]:
    """What changes made through the API do to open connections: permissions narrowed (on an
    exchange a channel used before, and one it did not), permissions cleared, a user deleted,
    a vhost deleted."""

    def connect(user: str, vhost: str = "/") -> pika.BlockingConnection:
        credentials = pika.PlainCredentials(user, "secret")
        return pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", amqp_port, vhost, credentials, heartbeat=0)
        )

    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    answers: list[tuple[str, Any]] = []
    for user in ("fx-u1", "fx-u2", "fx-u3"):
        api(http_port, "guest", f"users/{user}", "PUT", {"password": "secret", "tags": ""})
        api(http_port, "guest", f"permissions/%2F/{user}", "PUT", everything)
    api(http_port, "guest", "vhosts/fx-v", "PUT", {})
    api(http_port, "guest", "permissions/fx-v/fx-u3", "PUT", everything)
    try:
        first = connect("fx-u1")
        channel = first.channel()
        channel.confirm_delivery()
        for name in ("fx.used", "fx.new"):
            channel.exchange_declare(name, "fanout", auto_delete=False)
        answers.append(("publish while allowed", publish_answer(channel, "fx.used")))
        api(http_port, "guest", "permissions/%2F/fx-u1", "PUT", {"configure": ".*", "write": "^nothing$", "read": ".*"})
        answers.append(
            ("publish to the exchange used before, after write is narrowed", publish_answer(channel, "fx.used"))
        )
        second = first.channel()
        second.confirm_delivery()
        answers.append(("publish on a new channel to another exchange", publish_answer(second, "fx.new")))
        answers.append(("the connection, once permissions are narrowed", closed_by(first, 1.0)))
        api(http_port, "guest", "permissions/%2F/fx-u1", "DELETE")
        answers.append(("the connection, once its permissions are cleared", closed_by(first)))
        reasoned = connect("fx-u3")
        names: list[str] = []
        assert wait_for(  # (RabbitMQ lists a connection once its stats are collected, within seconds)
            lambda: bool(
                names.extend(c["name"] for c in api(http_port, "guest", "connections")[1] if c["user"] == "fx-u3")
                or names
            ),
            30,
        )
        name = names[0]
        request = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/api/connections/{urllib.parse.quote(name, safe='')}",
            method="DELETE",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(), "X-Reason": "maintenance"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answers.append(("close a connection with a reason", response.status))
        answers.append(("the connection closed with a reason", closed_by(reasoned)))
        deleted = connect("fx-u2")
        api(http_port, "guest", "users/fx-u2", "DELETE")
        answers.append(("the connection of a deleted user", closed_by(deleted)))
        elsewhere = connect("fx-u3", "fx-v")
        api(http_port, "guest", "vhosts/fx-v", "DELETE")
        answers.append(("a connection to a deleted vhost", closed_by(elsewhere)))
    finally:
        for user in ("fx-u1", "fx-u2", "fx-u3"):
            api(http_port, "guest", f"users/{user}", "DELETE")
        api(http_port, "guest", "vhosts/fx-v", "DELETE")
        for name in ("fx.used", "fx.new"):
            api(http_port, "guest", f"exchanges/%2F/{name}", "DELETE")
    return answers


def test_a_change_reaches_open_connections_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = admin_effects(*rabbitmq_management)
    assert dict(expected)["publish while allowed"] == "ack"  # what the oracle is about
    # RabbitMQ closes a deleted vhost's connections on whichever of its two events comes first:
    # "vhost 'V' is deleted" or "vhost 'V' is down" (timing); Postroom says the first.
    expected = [
        (step, [320, "CONNECTION_FORCED - vhost 'fx-v' is deleted"])
        if answer == [320, "CONNECTION_FORCED - vhost 'fx-v' is down"]
        else (step, answer)
        for step, answer in expected
    ]
    # A difference kept on purpose (docs/rabbitmq-compatibility.md): a RabbitMQ channel keeps its
    # last permitted resources cached, so narrowed permissions miss an exchange it used before.
    step = "publish to the exchange used before, after write is narrowed"
    refused = [403, "ACCESS_REFUSED - access to exchange 'fx.used' in vhost '/' refused for user 'fx-u1'"]
    assert dict(expected)[step] == "ack"
    actual = admin_effects(*postroom_management)
    assert dict(actual)[step] == refused
    assert_alike([item for item in expected if item[0] != step], [item for item in actual if item[0] != step])


def import_answers(http_port: int) -> list[tuple[str, Any]]:
    """Definitions imported through ``POST /api/definitions[/VHOST]`` and what they made; a
    refusal as its status and error (the reason is each broker's own words)."""
    good_hash = base64.b64encode(b"salt" + hashlib.sha256(b"salt" + b"pw").digest()).decode()
    whole = {
        "vhosts": [{"name": "im-v"}],
        "users": [{"name": "im-u", "password_hash": good_hash, "hashing_algorithm": "rabbit_password_hashing_sha256",
                   "tags": ["management"], "limits": {}}],
        "permissions": [{"user": "im-u", "vhost": "im-v", "configure": ".*", "write": ".*", "read": "^im"}],
        "queues": [{"name": "im.q", "vhost": "im-v", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": 7}}],
        "exchanges": [{"name": "im.e", "vhost": "im-v", "type": "topic", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}}],
        "bindings": [{"source": "im.e", "vhost": "im-v", "destination": "im.q", "destination_type": "queue",
                      "routing_key": "a.#", "arguments": {}}],
    }  # fmt: skip
    one = {"queues": [{"name": "im.q2", "durable": True, "auto_delete": False, "arguments": {}}]}
    missing = {"queues": [{"name": "im.q3", "vhost": "im-missing", "durable": True, "auto_delete": False,
                           "arguments": {}}]}  # fmt: skip
    steps: list[tuple[str, str, str, Any]] = [
        ("import a node's definitions", "definitions", "POST", whole),
        ("the queues made", "queues/im-v?columns=name,durable,arguments,vhost", "GET", None),
        ("the bindings made", "bindings/im-v?columns=source,destination,routing_key", "GET", None),
        ("the user made", "users/im-u", "GET", None),
        ("the permission made", "permissions/im-v/im-u", "GET", None),
        ("import it again", "definitions", "POST", whole),
        ("import one vhost's", "definitions/im-v", "POST", one),
        ("the queue it made", "queues/im-v/im.q2?columns=name,durable,vhost", "GET", None),
        ("import into a missing vhost", "definitions/im-missing", "POST", one),
        ("import items of a vhost that is not there", "definitions", "POST", missing),
        ("import what is not JSON", "definitions", "POST", "{bad"),
        ("import a list", "definitions", "POST", []),
    ]
    answers = []
    try:
        for label, path, method, body in steps:
            if body == "{bad":
                status, answer, _location = send(http_port, path, method, raw=b"{bad")
            else:
                status, answer, _location = send(http_port, path, method, body)
            if isinstance(answer, dict) and "password_hash" in answer:
                answer["password_hash"] = bool(answer["password_hash"])
            answers.append((label, [status, answer]))
    finally:
        send(http_port, "vhosts/im-v", "DELETE")
        send(http_port, "users/im-u", "DELETE")
    return answers


def test_definitions_are_imported_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = import_answers(rabbitmq_management[1])
    assert dict(expected)["import a node's definitions"] == [204, None]  # what the oracle is about
    assert_alike(expected, import_answers(postroom_management[1]))


def connection_states(amqp_port: int, http_port: int, alarm: Callable[[bool], None]) -> list[tuple[str, Any]]:
    """Each connection's ``state`` before a memory alarm, under it (one connection publishes,
    one does not), and after it clears."""

    def states() -> dict[str, Any]:
        """Each connection's state (RabbitMQ lists one before its stats come: ``None`` then)."""
        listed = api(http_port, "guest", "connections")[1]
        named = {str(c.get("client_properties", {}).get("connection_name", "")): c for c in listed}
        return {name: c.get("state") for name, c in named.items() if name.startswith("st-")}

    def settled(wanted: dict[str, str]) -> dict[str, Any]:
        wait_for(lambda: states() == wanted, 30)  # (RabbitMQ's stats come every few seconds)
        return states()

    def connect(name: str) -> pika.BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", amqp_port, client_properties={"connection_name": name})
        )

    publisher, idle = connect("st-publisher"), connect("st-idle")
    answers: list[tuple[str, Any]] = []
    try:
        channel = publisher.channel()
        answers.append(("before the alarm", settled({"st-publisher": "running", "st-idle": "running"})))
        alarm(True)
        answers.append(("under the alarm", settled({"st-publisher": "blocking", "st-idle": "blocking"})))
        channel.basic_publish("", "st-nowhere", b"m")
        publisher.process_data_events(time_limit=0.5)
        answers.append(("after a publish under it", settled({"st-publisher": "blocked", "st-idle": "blocking"})))
        alarm(False)
        publisher.process_data_events(time_limit=0.5)
        answers.append(("once it clears", settled({"st-publisher": "running", "st-idle": "running"})))
    finally:
        alarm(False)
        for connection in (publisher, idle):
            if connection.is_open:
                connection.close()
    return answers


def test_connections_show_blocked_and_blocking_under_an_alarm_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    amqp_port = rabbitmq_management[0]

    def rabbitmq_alarm(on: bool) -> None:
        rabbitmqctl(amqp_port, "set_vm_memory_high_watermark", "0.000001" if on else "0.4")

    def postroom_alarm(on: bool) -> None:
        broker = POSTROOM_BROKERS[-1]
        broker.call(lambda: broker.node.set_alarm("memory", on))

    expected = connection_states(*rabbitmq_management, rabbitmq_alarm)
    assert dict(expected)["after a publish under it"]["st-publisher"] == "blocked"  # what the oracle is about
    assert_alike(expected, connection_states(*postroom_management, postroom_alarm))


def parameter_answers(http_port: int) -> list[tuple[str, Any]]:
    """Runtime and global parameters listed, set and cleared (the cluster's internal id, which
    each broker makes its own, as whether there is one)."""
    steps: list[tuple[str, str, str, Any]] = [
        ("no parameters", "parameters/vhost-limits/mg-other", "GET", None),
        ("set a vhost's limits as a parameter", "parameters/vhost-limits/mg-other/limits", "PUT",
         {"value": {"max-queues": 7, "max-connections": 3}}),
        ("the parameter", "parameters/vhost-limits/mg-other/limits", "GET", None),
        ("the vhost's limits", "vhost-limits/mg-other", "GET", None),
        ("an unknown limit", "parameters/vhost-limits/mg-other/limits", "PUT", {"value": {"max-channels": 1}}),
        ("a component no plugin has", "parameters/bogus/%2F/x", "PUT", {"value": {}}),
        ("a missing parameter", "parameters/bogus/%2F/x", "GET", None),
        ("set a global parameter", "global-parameters/pm-x", "PUT", {"value": {"a": [1, 2]}}),
        ("set it again", "global-parameters/pm-x", "PUT", {"value": 5}),
        ("the global parameter", "global-parameters/pm-x", "GET", None),
        ("global parameters without a value", "global-parameters/pm-y", "PUT", {}),
        ("clear it", "global-parameters/pm-x", "DELETE", None),
        ("clear it again", "global-parameters/pm-x", "DELETE", None),
        ("a missing global parameter", "global-parameters/pm-x", "GET", None),
        ("clear the vhost's limits parameter", "parameters/vhost-limits/mg-other/limits", "DELETE", None),
        ("what is left", "parameters/vhost-limits/mg-other", "GET", None),
    ]  # fmt: skip
    answers = []
    limits = api(http_port, "guest", "vhost-limits/mg-other")[1]
    try:
        for label, path, method, body in steps:
            answers.append((label, list(api(http_port, "guest", path, method, body))))
        listed = api(http_port, "guest", "global-parameters")[1]
        answers.append(("the cluster has an internal id", any(p["name"] == "internal_cluster_id" for p in listed)))
    finally:
        for item in limits:  # (the fixture's limits, back as they were)
            for name, value in item["value"].items():
                api(http_port, "guest", f"vhost-limits/mg-other/{name}", "PUT", {"value": value})
    return answers


def test_parameters_are_listed_set_and_cleared_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = parameter_answers(rabbitmq_management[1])
    assert dict(expected)["the parameter"][0] == 200  # what the oracle is about
    assert_alike(expected, parameter_answers(postroom_management[1]))


def narrow_answers(amqp_port: int, http_port: int) -> list[tuple[str, Any]]:
    """An exchange's bindings as source and as destination; one connection, its channels, one
    channel and one vhost's connections and channels, each by its path (names as whether the
    answer names what was asked: ports differ between the brokers)."""
    send(http_port, "exchanges/%2F/nx.a", "PUT", {"type": "topic"})
    send(http_port, "exchanges/%2F/nx.b", "PUT", {"type": "fanout"})
    send(http_port, "queues/%2F/nx.q", "PUT", {})
    send(http_port, "bindings/%2F/e/nx.a/e/nx.b", "POST", {"routing_key": "k.#"})
    send(http_port, "bindings/%2F/e/nx.a/q/nx.q", "POST", {"routing_key": "q"})
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", amqp_port, client_properties={"connection_name": "nx-conn"})
    )
    connection.channel()
    connection.channel()
    answers: list[tuple[str, Any]] = []
    try:
        for label, path in (
            ("bindings from an exchange", "exchanges/%2F/nx.a/bindings/source"),
            ("bindings into an exchange", "exchanges/%2F/nx.b/bindings/destination"),
            ("bindings into the source exchange", "exchanges/%2F/nx.a/bindings/destination"),
            ("bindings of a missing exchange", "exchanges/%2F/nx.missing/bindings/source"),
        ):
            status, body, _location = send(http_port, path, "GET")
            if isinstance(body, list):
                kept = ("source", "destination", "destination_type", "routing_key")
                body = [{key: binding[key] for key in kept} for binding in body]
            answers.append((label, [status, body]))
        names: list[str] = []

        def listed() -> bool:
            names[:] = [
                c["name"]
                for c in send(http_port, "connections", "GET")[1]
                if c["client_properties"].get("connection_name") == "nx-conn"
            ]
            return bool(names)

        assert wait_for(listed, 30)
        name = urllib.parse.quote(names[0], safe="")
        status, one, _location = send(http_port, f"connections/{name}", "GET")
        answers.append(("one connection", [status, one["name"] == names[0]]))
        wait_for(lambda: len(send(http_port, f"connections/{name}/channels", "GET")[1]) == 2, 30)
        status, its, _location = send(http_port, f"connections/{name}/channels", "GET")
        answers.append(("its channels", [status, sorted(c["number"] for c in its)]))
        channel_name = urllib.parse.quote(its[0]["name"], safe="")
        status, channel, _location = send(http_port, f"channels/{channel_name}", "GET")
        answers.append(("one channel", [status, channel["name"] == its[0]["name"]]))
        status, in_vhost, _location = send(http_port, "vhosts/%2F/connections", "GET")
        answers.append(("the vhost's connections", [status, names[0] in [c["name"] for c in in_vhost]]))
        status, none, _location = send(http_port, "vhosts/mg-other/connections", "GET")
        answers.append(("another vhost's connections", [status, none]))
        status, in_vhost, _location = send(http_port, "vhosts/%2F/channels", "GET")
        mine = [c for c in in_vhost if c["connection_details"]["name"] == names[0]]
        answers.append(("the vhost's channels", [status, len(mine)]))
        answers.append(("a missing connection", list(send(http_port, "connections/nx-missing", "GET")[:2])))
        answers.append(("a missing channel", list(send(http_port, "channels/nx-missing%20(1)", "GET")[:2])))
        missing = send(http_port, "vhosts/nx-missing/connections", "GET")
        answers.append(("a missing vhost's connections", list(missing[:2])))
    finally:
        connection.close()
        for path in ("exchanges/%2F/nx.a", "exchanges/%2F/nx.b", "queues/%2F/nx.q"):
            send(http_port, path, "DELETE")
    return answers


def test_one_connection_channel_and_an_exchanges_bindings_are_shown_as_on_rabbitmq(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = narrow_answers(*rabbitmq_management)
    assert dict(expected)["its channels"] == [200, [1, 2]]  # what the oracle is about
    assert_alike(expected, narrow_answers(*postroom_management))


def history_answers(amqp_port: int, http_port: int) -> list[tuple[str, Any]]:
    """The overview's rate history (``msg_rates_age``, ``msg_rates_incr``) after a few publishes."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    try:
        channel = connection.channel()
        channel.queue_declare("mg.history")
        for _ in range(3):
            channel.basic_publish("", "mg.history", b"m")
        status, overview = 0, {}

        def published() -> bool:
            nonlocal status, overview
            status, overview = api(http_port, "guest", "overview?msg_rates_age=60&msg_rates_incr=5")
            samples = overview.get("message_stats", {}).get("publish_details", {}).get("samples", [])
            return bool(samples) and samples[0]["sample"] >= 3  # (the test's own, at least)

        assert wait_for(published, seconds=30), overview
        answers: list[tuple[str, Any]] = [("status", status)]
        for stat in ("publish", "return_unroutable"):
            details = overview["message_stats"][f"{stat}_details"]
            samples = details["samples"]
            counts = [sample["sample"] for sample in samples]
            steps = {a["timestamp"] - b["timestamp"] for a, b in itertools.pairwise(samples)}
            answers += [
                (f"{stat} keys", sorted(details)),
                (f"{stat} samples", len(samples)),
                (f"{stat} sample keys", sorted({key for sample in samples for key in sample})),
                (f"{stat} newest first, 5 s apart, on the 5 s", (steps, samples[0]["timestamp"] % 5000)),
                (f"{stat} never more, further back", counts == sorted(counts, reverse=True)),
                (f"{stat} average rate", details["avg_rate"] == (counts[0] - counts[-1]) / 60),
            ]
        status, bad = api(http_port, "guest", "overview?msg_rates_age=x&msg_rates_incr=5")
        answers.append(("a bad age", (status, "samples" in bad["message_stats"]["publish_details"])))
        return answers
    finally:
        channel.queue_delete("mg.history")
        connection.close()


def test_the_overview_keeps_its_rate_history_as_rabbitmq_does(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = history_answers(*rabbitmq_management)
    assert ("publish sample keys", ["sample", "timestamp"]) in expected  # what the oracle is about
    assert_alike(expected, history_answers(*postroom_management))


#: RabbitMQ's fields of connections, channels and queues that Postroom does not show, and why
#: (docs/rabbitmq-compatibility.md): the Erlang process's own (garbage collection, reductions,
#: its memory, the backing queue's internals), and those not built (a consumer's share of the
#: time a queue could deliver; the persistent messages among those held; the moment an idle
#: channel or queue went idle).
NOT_SHOWN = {
    "garbage_collection", "reductions", "reductions_details", "memory", "backing_queue_status",
    "consumer_capacity", "consumer_utilisation", "messages_persistent", "message_bytes_persistent", "idle_since",
}  # fmt: skip
#: Fields whose values name a broker, a port or a moment, or count what the two brokers need
#: not send alike (bytes and socket reads and writes: the server properties differ).
VOLATILE_FIELDS = {
    "name", "node", "port", "peer_port", "connected_at", "client_properties", "recv_oct", "recv_cnt", "send_oct",
    "send_cnt", "connection_details", "cluster_state", "arguments", "effective_policy_definition", "consumer_details",
    "dead_lettered", "visibility_timeouts",  # (Postroom's own)
}  # fmt: skip

#: RabbitMQ's fields of the node and the overview that Postroom does not show: the Erlang VM's
#: (applications, processes, run queue, garbage collection, context switches, distribution),
#: its databases' (Mnesia, message store, queue index, Raft), its files' (configuration, logs,
#: database directory, plugins) and its I/O statistics.
NODE_NOT_SHOWN = {
    "applications", "contexts", "proc_used", "proc_total", "run_queue", "gc_num", "gc_bytes_reclaimed",
    "context_switches", "net_ticktime", "metrics_gc_queue_length", "mnesia_ram_tx_count", "mnesia_disk_tx_count",
    "msg_store_read_count", "msg_store_write_count", "queue_index_read_count", "queue_index_write_count",
    "ra_open_file_metrics", "config_files", "log_files", "db_dir", "enabled_plugins", "io_read_count",
    "io_read_bytes", "io_read_avg_time", "io_write_count", "io_write_bytes", "io_write_avg_time", "io_sync_count",
    "io_sync_avg_time", "io_seek_count", "io_seek_avg_time", "io_reopen_count", "erlang_version",
    "erlang_full_version", "release_series_support_status", "disk_reads", "disk_writes",
}  # fmt: skip

FIELDS_VHOST = "mg-fields"


def field_session(amqp_port: int, http_port: int) -> dict[str, Any]:
    """One vhost's traffic, then its connection, channels, queue and vhost as the API shows them.

    On queue ``q`` (10-byte bodies): 5 published to the default exchange (the last with a
    timestamp) and one through topic exchange ``x`` (which drops another), one taken by
    ``basic.get`` and acknowledged, one by ``basic.get`` without acks, a consumer with
    prefetch 2 holding two, and a ``basic.get`` on an empty queue. On a channel in confirm mode,
    one mandatory publish returned as unroutable and one dropped. On a transactional channel,
    one publish not committed.
    """
    for path, body in ((f"vhosts/{FIELDS_VHOST}", {}), (f"permissions/{FIELDS_VHOST}/guest", {
        "configure": ".*", "write": ".*", "read": ".*"
    })):  # fmt: skip
        status, _ = api(http_port, "guest", path, "PUT", body)
        assert status in (201, 204), (path, status)
    parameters = pika.ConnectionParameters("127.0.0.1", amqp_port, virtual_host=FIELDS_VHOST)
    connection = pika.BlockingConnection(parameters)
    try:
        work, confirming, transacting = (connection.channel() for _ in range(3))
        work.queue_declare("q", durable=True)
        work.queue_declare("empty")
        work.exchange_declare("x", "topic")
        work.queue_bind("q", "x", "k.#")
        for number in range(5):
            properties = pika.BasicProperties(timestamp=1_700_000_000 if number == 4 else None)
            work.basic_publish("", "q", b"0123456789", properties)
        work.basic_publish("x", "k.1", b"0123456789")
        work.basic_publish("x", "other", b"0123456789")
        work.basic_get("q", auto_ack=False)
        work.basic_ack(1)
        work.basic_get("q", auto_ack=True)
        work.basic_get("empty", auto_ack=True)
        work.basic_qos(prefetch_count=2)
        work.basic_consume("q", lambda *_: None)
        confirming.confirm_delivery()
        try:
            confirming.basic_publish("amq.direct", "nowhere", b"returned", mandatory=True)
        except pika.exceptions.UnroutableError:
            pass
        confirming.basic_publish("amq.direct", "nowhere", b"dropped")
        transacting.tx_select()
        transacting.basic_publish("", "q", b"uncommitted")
        connection.process_data_events(0.5)

        def shown() -> dict[str, Any]:
            channels = api(http_port, "guest", f"vhosts/{FIELDS_VHOST}/channels")[1]
            return {
                "connection": [c for c in api(http_port, "guest", "connections")[1] if c["vhost"] == FIELDS_VHOST],
                "channels": sorted(channels, key=lambda channel: channel["number"]),
                "queue": api(http_port, "guest", f"queues/{FIELDS_VHOST}/q")[1],
                "queues": [q for q in api(http_port, "guest", f"queues/{FIELDS_VHOST}")[1] if q["name"] == "q"],
                "vhost": api(http_port, "guest", f"vhosts/{FIELDS_VHOST}")[1],
                "exchange": api(http_port, "guest", f"exchanges/{FIELDS_VHOST}/x")[1],
                "default exchange": api(http_port, "guest", f"exchanges/{FIELDS_VHOST}/amq.default")[1],
                "exchanges": [
                    e for e in api(http_port, "guest", f"exchanges/{FIELDS_VHOST}")[1] if e["name"] in ("", "x")
                ],
                "node": api(http_port, "guest", "nodes")[1],
                "overview": api(http_port, "guest", "overview")[1],
            }

        # RabbitMQ's objects catch up through statistics emitted every 5 s: wait until the
        # queue shows every delivery, then until two readings a sample apart agree.
        def caught_up() -> bool:
            views = shown()
            stats = views["queue"].get("message_stats", {})
            return (
                views["queue"].get("messages_unacknowledged") == 2
                and stats.get("deliver_get") == 4
                and len(views["channels"]) == 3
                and [connection.get("channels") for connection in views["connection"]] == [3]
                and views["channels"][1].get("message_stats", {}).get("confirm") == 2
                and views["vhost"].get("message_stats", {}).get("drop_unroutable") == 2
                and views["exchange"].get("message_stats", {}).get("publish_in") == 2
            )

        assert wait_for(caught_up, 40), shown()

        def settled(views: dict[str, Any]) -> Any:
            return comparable_fields({key: view for key, view in views.items() if key not in ("node", "overview")})

        before = settled(shown())
        time.sleep(5.5)
        views = shown()
        assert settled(views) == before
        return views
    finally:
        connection.close()
        api(http_port, "guest", f"vhosts/{FIELDS_VHOST}", "DELETE")


def comparable_fields(value: Any) -> Any:
    """``value`` without :data:`VOLATILE_FIELDS`, :data:`NOT_SHOWN` and rates."""
    return api_fields(value, VOLATILE_FIELDS | NOT_SHOWN)


def test_connection_channel_queue_and_vhost_objects_carry_rabbitmqs_fields(
    rabbitmq_management: tuple[int, int], postroom_management: tuple[int, int]
) -> None:
    expected = field_session(*rabbitmq_management)
    actual = field_session(*postroom_management)
    for view in ("exchange", "default exchange", "exchanges"):
        # (who declared an exchange is not kept: docs/rabbitmq-compatibility.md)
        expected[view] = api_fields(expected[view], {"user_who_performed_action"})
        actual[view] = api_fields(actual[view], {"user_who_performed_action"})
    # The node and the overview count what the whole broker did (other tests' traffic too):
    # their fields are compared, not their values.
    # A node's cluster links are the Erlang distribution's (while a rabbitmqctl is connected,
    # RabbitMQ lists its link): Postroom, one node, shows the list, always empty.
    opaque = {"listeners", "contexts", "exchange_types", "cluster_links"}
    for view in ("node", "overview"):
        missing = {
            path
            for path in field_paths(expected.pop(view), opaque=opaque) - field_paths(actual.pop(view), opaque=opaque)
            if NODE_NOT_SHOWN.isdisjoint(part.removesuffix("_details") for part in path.split("."))
        }
        assert not missing, (view, sorted(missing))
    queue = expected["queue"]  # what the oracle is about
    assert (queue["messages"], queue["message_bytes"], queue["head_message_timestamp"]) == (4, 40, 1_700_000_000)
    for view, theirs in expected.items():
        missing = {
            path
            for path in field_paths(theirs, opaque=VOLATILE_FIELDS) - field_paths(actual[view], opaque=VOLATILE_FIELDS)
            if NOT_SHOWN.isdisjoint(path.split("."))
        }
        assert not missing, (view, sorted(missing))
    assert comparable_fields(actual) == comparable_fields(expected)
    # Each side's connection: its own socket, as the client sees it.
    for views, (amqp_port, _http) in ((actual, postroom_management), (expected, rabbitmq_management)):
        (connection,) = views["connection"]
        assert (connection["port"], connection["host"], connection["peer_host"]) == (
            amqp_port,
            "127.0.0.1",
            "127.0.0.1",
        )
        assert connection["recv_oct"] > 0 and connection["send_oct"] > 0

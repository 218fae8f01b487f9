"""A RabbitMQ definitions export becomes the schema's definitions; what has no equivalent is reported."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.users import User
from postroom.broker.errors import ChannelException
from postroom.broker.storage.streams import scratch_streams
from postroom.config.loader import load
from postroom.config.schema import BindingConfig, DeadLetterConfig, Permission, TopicPermission, UserLimits, VhostLimits
from postroom.config.values import ConfigError

EXPORT = Path(__file__).parent / "fixtures" / "rabbitmq-definitions.json"


def postroom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_queues_exchanges_and_bindings_map_to_the_schema() -> None:
    cfg = load(EXPORT)
    assert set(cfg.vhosts) == {"/", "billing"}
    root = cfg.vhosts["/"]
    queues = {queue.name: queue for queue in root.queues}
    created = queues["orders.created"]
    assert (created.dead_letter, created.message_ttl, created.max_length, created.overflow) == (
        DeadLetterConfig("orders.dlx", "orders.created.dead"),
        3600.0,
        100_000,
        "reject-publish-dlx",
    )
    assert created.queue_arguments() == {
        "x-dead-letter-exchange": "orders.dlx",
        "x-dead-letter-routing-key": "orders.created.dead",
        "x-message-ttl": 3_600_000,
        "x-max-length": 100_000,
        "x-overflow": "reject-publish-dlx",
    }
    # Quorum queues are declared as classic ones, without the arguments that mean nothing here;
    # streams as streams.
    assert queues["orders.dlq"].queue_arguments() == {"x-delivery-limit": 5}
    assert queues["orders.priority"].queue_arguments() == {"x-max-priority": 10, "x-expires": 86_400_000}
    assert queues["orders.events"].queue_arguments() == {"x-queue-type": "stream", "x-max-age": "7D"}
    assert queues["orders.audit"].single_active_consumer is True
    exchanges = {exchange.name: exchange for exchange in root.exchanges}
    assert set(exchanges) == {"orders", "orders.unrouted", "orders.dlx", "orders.audit", "orders.priority"}
    assert exchanges["orders"].arguments == {"alternate-exchange": "orders.unrouted"}
    assert (exchanges["orders.audit"].type, exchanges["orders.audit"].internal) == ("fanout", True)
    assert BindingConfig("orders", destination_exchange="orders.audit", routing_key="#") in root.bindings
    assert BindingConfig("orders.priority", "orders.priority", arguments={"x-match": "all", "priority": "high"}) in (
        root.bindings
    )
    assert all(binding.exchange != "orders.sharded" for binding in root.bindings)
    assert [queue.name for queue in cfg.vhosts["billing"].queues] == ["invoices.pending"]


def test_users_keep_their_rabbitmq_hashes_and_permissions() -> None:
    cfg = load(EXPORT)
    users = {user.name: user for user in cfg.users}
    assert set(users) == {"guest", "orders-app", "billing-app"}  # 'federation' has no password
    assert users["guest"].loopback_only and not users["orders-app"].loopback_only
    assert (users["guest"].tags, users["orders-app"].tags) == (("administrator",), ())
    assert users["orders-app"].permissions == {"/": Permission("^orders\\..*", "^orders.*", "^orders\\..*")}
    assert users["billing-app"].permissions == {"billing": Permission("", "^invoices$", ".*")}
    assert users["orders-app"].topic_permissions == {"/": {"amq.topic": TopicPermission("^orders\\.", ".*")}}
    assert users["billing-app"].topic_permissions is None
    with scratch_streams(Clock()) as streams:
        node = node_from_config(cfg, streams=streams)
    topics = node.users_by_name["orders-app"].access("/")
    assert topics is not None
    topics.check_topic("write", "amq.topic", "orders.created")
    with pytest.raises(ChannelException, match="access to topic 'billing.x' in exchange 'amq.topic'"):
        topics.check_topic("write", "amq.topic", "billing.x")
    assert node.authenticate("orders-app", "s3cret", loopback=False) is not None
    assert node.authenticate("orders-app", "secret", loopback=False) is None
    assert node.authenticate("billing-app", "ledger", loopback=False) is not None  # a sha512 hash
    assert node.authenticate("guest", "guest", loopback=False) is None  # loopback only, as in RabbitMQ


@pytest.mark.parametrize("algorithm", ["sha256", "sha512", "md5"])
def test_a_rabbitmq_hash_is_checked_as_rabbitmq_computes_it(algorithm: str) -> None:
    salt = b"\x90\x8a\x7b\x6c"
    stored = base64.b64encode(salt + hashlib.new(algorithm, salt + "pässword".encode()).digest()).decode()
    user = User("u", password_hash=f"rabbitmq-{algorithm}${stored}")
    assert user.check_password("pässword")
    assert not user.check_password("password")
    assert not User("u", password_hash=f"rabbitmq-{algorithm}$not base64!").check_password("pässword")


def test_a_hash_from_a_real_export_matches_its_password() -> None:
    # A value RabbitMQ itself produced for the password "1" (published as an example of the format).
    assert User("u", password_hash="rabbitmq-sha256$y4xPTRVfzXg68sz9ALqeQzARam3CwnGo53xS752cDV5+Utzh").check_password(
        "1"
    )


def test_a_shovel_in_an_export_is_kept_for_the_broker_to_run() -> None:
    (shovel,) = load(EXPORT).vhosts["/"].shovels
    assert shovel.name == "dlq-to-archive"
    assert (shovel.value["src-queue"], shovel.value["dest-uri"]) == ("orders.dlq", "amqp://archive")


def test_the_report_lists_each_item_without_an_equivalent_with_its_key_path() -> None:
    notes = load(EXPORT).notes
    prefix = f"{EXPORT}: "
    assert all(note.startswith(prefix) for note in notes)
    assert sorted(note[len(prefix) :].partition(":")[0] for note in notes) == sorted(
        [
            "vhosts[1].metadata.default_queue_type",
            "exchanges[5].type",
            "queues[1].arguments.x-queue-type",
            "queues[1].arguments.x-quorum-initial-group-size",
            "queues[2].arguments.x-queue-mode",
            "queues[5].arguments.x-queue-type",
            "bindings[5]",
            "users[3].password_hash",
            "permissions[3]",
            "global_parameters[0]",
        ]
    )  # (parameters[0], a shovel, applies: the broker runs it)
    assert (
        f"{prefix}exchanges[5].type: unknown exchange type 'x-modulus-hash': "
        "exchange 'orders.sharded' and the bindings that need it are skipped"
    ) in notes
    assert any(note.startswith(f"{prefix}users[3].password_hash: user 'federation' has no password") for note in notes)


def test_malformed_json_is_refused_with_the_file_and_line(tmp_path: Path) -> None:
    broken = tmp_path / "definitions.json"
    broken.write_text('{\n  "queues": [\n    {"name": "a",}\n  ]\n}\n')
    with pytest.raises(ConfigError) as excinfo:
        load(broken)
    assert f"{broken}:3: (top level): not valid JSON: Expecting property name enclosed in double quotes" in str(
        excinfo.value
    )


def test_values_of_the_wrong_type_are_refused_with_their_key_paths(tmp_path: Path) -> None:
    export = tmp_path / "export"  # no extension: told apart from YAML by its content
    export.write_text(
        '{"queues": [{"name": "q", "vhost": "/", "durable": "yes",'
        ' "arguments": {"x-message-ttl": "60s", "x-overflow": "drop-tail"}}],'
        ' "bindings": [{"source": "x", "destination": "q", "destination_type": "topic"}]}'
    )
    with pytest.raises(ConfigError) as excinfo:
        load(export)
    assert [(problem.key, problem.reason) for problem in excinfo.value.problems] == [
        ("queues[0].arguments.x-message-ttl", "must be an integer, not a string '60s'"),
        (
            "queues[0].arguments.x-overflow",
            "must be drop-head, reject-publish or reject-publish-dlx, not 'drop-tail'",
        ),
        ("queues[0].durable", "must be true or false, not a string 'yes'"),
        ("bindings[0].destination_type", "must be queue or exchange, not 'topic'"),
    ]


def test_config_check_accepts_an_export_and_prints_the_report() -> None:
    result = postroom("config", "check", str(EXPORT))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        f"{EXPORT}: ok (2 vhost(s), 6 exchange(s), 6 queue(s))",
        "10 item(s) not applied, with the reason:",
    ]
    assert "policies[0]" not in result.stdout  # applied
    assert "shovel parameter" not in result.stdout  # (a shovel: applied)


def test_config_check_refuses_malformed_json_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "definitions.json"
    broken.write_text('{"vhosts": [}')
    result = postroom("config", "check", str(broken))
    assert result.returncode == 1
    assert f"{broken}:1: (top level): not valid JSON" in result.stderr


def test_a_binding_to_something_the_file_does_not_declare_is_reported_and_skipped(tmp_path: Path) -> None:
    export = tmp_path / "definitions.json"
    export.write_text(
        '{"queues": [{"name": "q", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}],'
        ' "bindings": ['
        '{"source": "amq.topic", "vhost": "/", "destination": "q", "destination_type": "queue",'
        ' "routing_key": "a.#", "arguments": {}},'
        '{"source": "gone", "vhost": "/", "destination": "q", "destination_type": "queue",'
        ' "routing_key": "", "arguments": {}},'
        '{"source": "amq.direct", "vhost": "/", "destination": "missing", "destination_type": "queue",'
        ' "routing_key": "", "arguments": {}}]}'
    )
    cfg = load(export)
    assert cfg.vhosts["/"].bindings == (BindingConfig("amq.topic", "q", routing_key="a.#"),)
    assert cfg.notes == (
        f"{export}: bindings[1]: binding from 'gone' to queue 'q' skipped:"
        " no exchange 'gone' in vhost '/' in this file",
        f"{export}: bindings[2]: binding from 'amq.direct' to queue 'missing' skipped:"
        " no queue 'missing' in vhost '/' in this file",
    )
    node_from_config(cfg)  # the rest applies


#: A RabbitMQ password hash (of "guest").
HASH = "Gyw9Th7o3dN1IHwkDR5Vunk2W94QTnMXJukdOsZn7haFJXlD"


def test_user_and_vhost_limits_are_imported_as_rabbitmq_imports_them(tmp_path: Path) -> None:
    def user(name: str, limits: dict[str, int]) -> dict[str, Any]:
        return {"name": name, "password_hash": HASH, "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [], "limits": limits}  # fmt: skip

    export = tmp_path / "definitions.json"
    export.write_text(
        json.dumps(
            {
                "users": [
                    user("app", {"max-connections": 3, "max-channels": -1}),
                    user("bulk", {"max-channels": 0, "max-sessions": 1}),
                ],
                # RabbitMQ's import reads a vhost's limits from its parameter; an export has both.
                "vhosts": [{"name": "/", "limits": {"max-queues": 7}}, {"name": "edge", "limits": []}],
                "parameters": [
                    {
                        "vhost": "edge",
                        "component": "vhost-limits",
                        "name": "limits",
                        "value": {"max-connections": 2, "max-queues": 5},
                    }
                ],
            }  # fmt: skip
        )
    )
    cfg = load(export)
    users = {user.name: user for user in cfg.users}
    assert users["app"].limits == UserLimits(max_connections=3, max_channels=-1)  # negative: no limit
    assert users["bulk"].limits == UserLimits(max_channels=0)
    assert cfg.vhosts["/"].limits == VhostLimits(max_queues=7)
    assert cfg.vhosts["edge"].limits == VhostLimits(max_connections=2, max_queues=5)
    assert [note for note in cfg.notes if "limit" in note] == [
        f"{export}: users[1].limits.max-sessions: limit 'max-sessions' has no equivalent: ignored"
    ]
    node = node_from_config(cfg)
    assert (node.users_by_name["app"].max_connections, node.users_by_name["bulk"].max_channels) == (3, 0)


def test_a_limit_that_is_not_a_number_is_refused(tmp_path: Path) -> None:
    export = tmp_path / "definitions.json"
    export.write_text('{"vhosts": [{"name": "/", "limits": {"max-connections": "many", "max-queues": 1}}]}')
    with pytest.raises(ConfigError) as excinfo:
        load(export)
    assert [(problem.key, problem.reason) for problem in excinfo.value.problems] == [
        ("vhosts[0].limits.max-connections", "must be an integer, not 'many'"),
    ]


def test_policies_and_operator_policies_are_imported_with_the_keys_postroom_applies(tmp_path: Path) -> None:
    export = tmp_path / "definitions.json"
    export.write_text(
        '{"policies": [{"vhost": "/", "name": "dlx", "pattern": "^orders\\\\.", "apply-to": "queues",'
        ' "priority": 2, "definition": {"dead-letter-exchange": "dlx", "ha-mode": "all"}},'
        ' {"vhost": "/", "name": "lazy", "pattern": ".*", "definition": {"queue-mode": "lazy"}}],'
        ' "parameters": [{"vhost": "/", "component": "operator_policy", "name": "caps",'
        ' "value": {"pattern": ".*", "apply-to": "queues", "priority": 0,'
        ' "definition": {"max-length": 1000, "max-in-memory-length": 10}}}]}'
    )
    config = load(export)
    (policy,) = config.vhosts["/"].policies
    assert (policy.name, policy.pattern, policy.priority, policy.apply_to) == ("dlx", "^orders\\.", 2, "queues")
    assert dict(policy.definition) == {"dead-letter-exchange": "dlx"}
    (operator,) = config.vhosts["/"].operator_policies
    assert (operator.name, dict(operator.definition)) == ("caps", {"max-length": 1000})
    prefix = f"{export}: "
    assert sorted(note[len(prefix) :] for note in config.notes) == [
        "parameters[0].value.definition: policy 'caps' keys not applied "
        "(max-in-memory-length: bodies beyond storage.memory_budget stay on disk instead)",
        "policies[0].definition: policy 'dlx' keys not applied (ha-mode: Postroom runs on one node)",
        "policies[1].definition: policy 'lazy' keys not applied "
        "(queue-mode: lazy mode is what Postroom does anyway beyond storage.memory_budget)",
        "policies[1]: policy 'lazy' has nothing Postroom applies: not applied",
    ]

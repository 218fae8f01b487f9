"""The strict loader: every kind of mistake is reported with file, line, key path and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from postroom import config
from postroom.broker.core.definitions import node_from_config
from postroom.config import shovels
from postroom.config.loader import load, loads
from postroom.config.schema import MqttConfig, StreamProtocolConfig, TopicPermission, UserLimits, VhostLimits
from postroom.config.values import ConfigError

EXAMPLE = Path(config.__file__).parent / "postroom.yaml"


def problems(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as excinfo:
        loads(text, "test.yaml")
    return [(p.line, p.key, p.reason) for p in excinfo.value.problems]


def test_the_example_file_loads_and_its_definitions_apply() -> None:
    cfg = load(EXAMPLE)
    node = node_from_config(cfg)
    vhost = node.vhosts["/"]
    queue = vhost.queues["orders.created"]
    assert queue.settings.visibility_timeout == 30.0
    assert queue.settings.delivery_limit == 5
    assert queue.settings.dead_letter_exchange == "dlx"
    assert queue.settings.dead_letter_routing_key == "orders.dead"
    assert queue.settings.message_ttl == 3600.0
    assert queue.settings.max_length == 100_000
    assert cfg.storage.segment_bytes == 64 * 1024 * 1024
    assert cfg.storage.archive.retention == 7 * 86400
    assert node.authenticate("app", "secret", loopback=False) is not None
    assert node.authenticate("app", "wrong", loopback=False) is None
    assert node.authenticate("guest", "guest", loopback=False) is None


def test_an_empty_file_is_the_embedded_default() -> None:
    cfg = loads("", "empty.yaml")
    assert cfg.listen.amqp == "tcp:5672:interface=127.0.0.1"
    assert [u.name for u in cfg.users] == ["guest"]


def test_unknown_keys_are_reported_with_their_line_and_path() -> None:
    text = "listen:\n  amqp: tcp:5672\n  amqpp: tcp:5673\n"
    ((line, key, reason),) = problems(text)
    assert (line, key) == (3, "listen.amqpp")
    assert reason.startswith("unknown key")


def test_the_dead_letter_stream_retention_is_read_and_checked() -> None:
    assert loads("", "empty.yaml").storage.deadletters.retention == 30 * 86400
    cfg = loads("storage:\n  deadletters: {retention: 14d, max_bytes: 2GiB}\n", "t.yaml")
    assert (cfg.storage.deadletters.retention, cfg.storage.deadletters.max_bytes) == (14 * 86400, 2 << 30)
    assert problems("storage:\n  deadletters: {retention: 14, keep: 3}\n") == [
        (2, "storage.deadletters.keep", "unknown key (expected one of: max_bytes, retention)"),
        (2, "storage.deadletters.retention", "must be a duration with a unit (e.g. 500ms, 30s, 5m, 1h, 7d), not 14"),
    ]


def test_the_group_commit_window_may_be_zero_and_not_below() -> None:
    assert loads("storage: {fsync_interval_ms: 0}\n", "t.yaml").storage.fsync_interval_ms == 0
    assert [key for _line, key, _reason in problems("storage: {fsync_interval_ms: -1}\n")] == [
        "storage.fsync_interval_ms"
    ]


def test_the_cluster_section_is_read_and_checked() -> None:
    assert loads("", "empty.yaml").cluster is None
    cfg = loads(
        "cluster:\n  name: node-1\n  etcd: [http://10.0.0.5:2379, http://10.0.0.6:2379]\n"
        "  listen: tcp:5679:interface=10.0.0.1\n  lease: 3s\n  min_in_sync: 1\n",
        "t.yaml",
    )
    assert cfg.cluster is not None
    assert (cfg.cluster.name, cfg.cluster.etcd, cfg.cluster.lease, cfg.cluster.min_in_sync) == (
        "node-1",
        ("http://10.0.0.5:2379", "http://10.0.0.6:2379"),
        3.0,
        1,
    )
    assert (cfg.cluster.prefix, cfg.cluster.in_sync_timeout, cfg.cluster.confirm_timeout) == ("postroom", 2.0, 10.0)
    assert sorted(problems("cluster:\n  name: a\n")) == [
        (2, "cluster", "missing required key 'etcd'"),
        (2, "cluster", "missing required key 'listen'"),
        (2, "cluster.etcd", "must be a list of etcd client URLs (http://host:2379)"),
    ]
    found = problems(
        "storage: {fsync: never}\ncluster:\n  name: 'a b'\n  etcd: [https://x:1]\n  listen: unix:/tmp/s\n"
        "  tls: {certificate: c.pem}\n  lease: 500ms\n  min_in_sync: 0\n"
    )
    assert [key for _line, key, _reason in found] == [
        "cluster.tls",
        "cluster.tls",
        "cluster.name",
        "cluster.etcd",
        "cluster.listen",
        "cluster.lease",
        "storage.fsync",
        "cluster.min_in_sync",
    ]
    assert {found[0][2], found[1][2]} == {"missing required key 'key'", "missing required key 'ca'"}


def test_duplicate_keys_are_refused() -> None:
    assert problems("limits:\n  frame_max: 8192\n  frame_max: 16384\n") == [(3, "limits.frame_max", "duplicate key")]


def test_wrong_types_and_bad_units_are_all_reported_together() -> None:
    text = """
limits:
  frame_max: big
vhosts:
  "/":
    queues:
      - {name: q, visibility_timeout: 30, max_length_bytes: 5 parsecs, durable: maybe}
"""
    found = {key: reason for _line, key, reason in problems(text)}
    assert set(found) == {
        "limits.frame_max",
        "vhosts./.queues[0].visibility_timeout",
        "vhosts./.queues[0].max_length_bytes",
        "vhosts./.queues[0].durable",
    }
    assert "duration with a unit" in found["vhosts./.queues[0].visibility_timeout"]


def test_names_must_be_strings_not_yaml_booleans() -> None:
    ((line, key, reason),) = problems('vhosts:\n  "/":\n    queues:\n      - {name: off}\n')
    assert (line, key) == (4, "vhosts./.queues[0].name")
    assert "quote it" in reason


def test_dangling_references_are_refused() -> None:
    text = """
vhosts:
  "/":
    exchanges: [{name: orders, type: topic}]
    queues: [{name: q, dead_letter: {exchange: nowhere}}]
    bindings:
      - {exchange: orders, queue: missing}
      - {exchange: audit, queue: q}
"""
    found = {key: reason for _line, key, reason in problems(text)}
    assert found == {
        "vhosts./.queues[0].dead_letter.exchange": "no exchange 'nowhere' is declared in this vhost",
        "vhosts./.bindings[0].queue": "no queue 'missing' is declared in this vhost",
        "vhosts./.bindings[1].exchange": "no exchange 'audit' is declared in this vhost",
    }


def test_single_active_consumer_is_a_queue_key_and_a_boolean() -> None:
    cfg = loads('vhosts:\n  "/":\n    queues:\n      - {name: q, single_active_consumer: true}\n', "t.yaml")
    assert cfg.vhosts["/"].queues[0].queue_arguments() == {"x-single-active-consumer": True}
    node = node_from_config(cfg)
    assert node.vhosts["/"].queues["q"].settings.single_active_consumer is True
    ((_, key, reason),) = problems('vhosts:\n  "/":\n    queues:\n      - {name: q, single_active_consumer: 2}\n')
    assert key == "vhosts./.queues[0].single_active_consumer"


def test_conflicting_redeclarations_are_refused() -> None:
    text = 'vhosts:\n  "/":\n    queues:\n      - {name: q}\n      - {name: q, durable: false}\n'
    ((line, key, reason),) = problems(text)
    assert (line, key) == (5, "vhosts./.queues[1].name")
    assert "declared twice" in reason


def test_a_definition_the_broker_refuses_is_reported_by_path() -> None:
    cfg = loads('vhosts:\n  "/":\n    queues:\n      - {name: q, arguments: {x-max-priority: 1000}}\n', "t.yaml")
    with pytest.raises(ConfigError) as excinfo:
        node_from_config(cfg)
    ((_, key, reason),) = [(p.line, p.key, p.reason) for p in excinfo.value.problems]
    assert key == "vhosts./.queues[0]"
    assert "x-max-priority" in reason


def test_the_error_message_names_file_line_key_and_reason() -> None:
    with pytest.raises(ConfigError) as excinfo:
        loads("storage:\n  fsync: sometimes\n", "broker.yaml")
    assert "broker.yaml:2: storage.fsync: must be always, batch or never, not 'sometimes'" in str(excinfo.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(tmp_path / "nope.yaml")
    assert "cannot read the file" in str(excinfo.value)


def test_invalid_yaml_is_a_config_error_with_its_line() -> None:
    ((line, _key, reason),) = problems("listen:\n  amqp: [unclosed\n")
    assert line is not None and reason.startswith("not valid YAML")


def test_metrics_settings_are_checked() -> None:
    assert sorted(problems("metrics: {rabbitmq_compatible: yes please}\nlisten: {metrics: 5}\n")) == [
        (1, "metrics.rabbitmq_compatible", "must be true or false, not a string 'yes please'"),
        (2, "listen.metrics", "must be a string, not an integer 5 (quote it)"),
    ]


def test_topic_permissions_are_read_per_vhost_and_exchange() -> None:
    config = loads(
        "users:\n"
        "  - name: app\n"
        "    password: secret\n"
        "    topic_permissions: {'/': {amq.topic: {write: '^{username}\\.'}}}\n",
        "broker.yaml",
    )
    assert config.users[0].topic_permissions == {"/": {"amq.topic": TopicPermission(write="^{username}\\.", read=".*")}}
    assert problems(
        "users:\n  - name: app\n    password: secret\n    topic_permissions: {other: {x: {write: '(', size: 1}}}\n"
    ) == [
        (4, "users[0].topic_permissions.other", "no vhost 'other' is declared"),
        (4, "users[0].topic_permissions.other.x.size", "unknown key (expected one of: read, write)"),
        (
            4,
            "users[0].topic_permissions.other.x.write",
            "not a valid regular expression: missing ), unterminated subpattern at position 0",
        ),
    ]


def test_user_and_vhost_limits_are_read_and_checked() -> None:
    config = loads(
        "users:\n"
        "  - {name: app, password: secret, limits: {max_connections: 2, max_channels: -1}}\n"
        "vhosts:\n"
        "  /: {limits: {max_connections: 0, max_queues: 100}}\n",
        "broker.yaml",
    )
    assert config.users[0].limits == UserLimits(max_connections=2, max_channels=-1)
    assert config.vhosts["/"].limits == VhostLimits(max_connections=0, max_queues=100)
    node = node_from_config(config)
    assert (node.vhosts["/"].max_connections, node.vhosts["/"].max_queues) == (0, 100)
    assert node.users_by_name["app"].max_connections == 2
    assert problems(
        "users:\n"
        "  - {name: app, password: secret, limits: {max_queues: 1, max_channels: many}}\n"
        "vhosts:\n"
        "  /: {limits: {max_channels: 1}}\n"
    ) == [
        (4, "vhosts./.limits.max_channels", "unknown key (expected one of: max_connections, max_queues)"),
        (2, "users[0].limits.max_queues", "unknown key (expected one of: max_channels, max_connections)"),
        (2, "users[0].limits.max_channels", "must be an integer, not a string 'many'"),
    ]


def test_an_alias_bomb_is_refused_quickly_and_in_little_memory() -> None:
    import tracemalloc

    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level, previous in zip("bcdefghi", "abcdefgh", strict=True):
        levels.append(f"{level}: &{level} [{', '.join([f'*{previous}'] * 9)}]")
    text = "\n".join(levels) + "\n"  # 9**9 values once expanded, in under 400 bytes
    tracemalloc.start()
    try:
        found = problems(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(found) == 1 and "more than 200,000 values once its aliases are expanded" in found[0][2]
    assert peak < 200 << 20
    # Aliases used sparingly are fine.
    config = loads(
        "vhosts:\n"
        "  /:\n"
        "    exchanges: [{name: dlx, type: fanout}]\n"
        "    queues:\n"
        "      - {name: a, dead_letter: &dl {exchange: dlx}}\n"
        "      - {name: b, dead_letter: *dl}\n",
        "ok.yaml",
    )
    assert [queue.dead_letter.exchange for queue in config.vhosts["/"].queues if queue.dead_letter] == ["dlx", "dlx"]


def test_consumers_per_channel_are_bounded_unless_the_limit_is_infinity() -> None:
    assert loads("", "b.yaml").limits.consumer_max_per_channel == 10_000
    config = loads("limits: {consumer_max_per_channel: 3}", "b.yaml")
    assert config.limits.consumer_max_per_channel == 3
    assert node_from_config(config).limits.consumer_max_per_channel == 3
    assert loads("limits: {consumer_max_per_channel: infinity}", "b.yaml").limits.consumer_max_per_channel is None
    assert problems("limits: {consumer_max_per_channel: 0}") == [
        (1, "limits.consumer_max_per_channel", "must be a positive integer, or infinity (no limit), not an integer 0")
    ]


def test_the_log_backlog_bound_is_a_size() -> None:
    assert loads("", "b.yaml").storage.max_backlog == 64 << 20
    assert loads("storage: {max_backlog: 8MiB}", "b.yaml").storage.max_backlog == 8 << 20
    assert problems("storage: {max_backlog: lots}") == [
        (1, "storage.max_backlog", "must be a size in bytes or with a unit (e.g. 64KiB, 64MiB, 1GiB), not 'lots'")
    ]


def test_the_checkpoint_interval_is_a_size_of_at_least_64_kib() -> None:
    assert loads("", "b.yaml").storage.checkpoint_bytes == 16 << 20
    assert loads("storage: {checkpoint_bytes: 256KiB}", "b.yaml").storage.checkpoint_bytes == 256 << 10
    assert problems("storage: {checkpoint_bytes: 4KiB}") == [
        (1, "storage.checkpoint_bytes", "must be at least 64KiB, not '4KiB'")
    ]


def test_alarm_limits_are_relative_or_absolute_as_rabbitmq_has_them() -> None:
    default = loads("", "broker.yaml").limits
    assert (default.memory_limit(1000), default.disk_limit(1000)) == (400, 50_000_000)
    limits = loads("limits: {memory_high_watermark: 2GiB, disk_free_limit: {mem_relative: 1.5}}", "b.yaml").limits
    assert (limits.memory_limit(10**12), limits.disk_limit(1000)) == (2 << 30, 1500)
    limits = loads("limits: {memory_high_watermark: 0.25, disk_free_limit: 1GB}", "b.yaml").limits
    assert (limits.memory_limit(1000), limits.disk_limit(1000)) == (250, 10**9)
    assert problems("limits: {memory_high_watermark: 3, disk_free_limit: {relative: 2}}") == [
        (
            1,
            "limits.memory_high_watermark",
            "must be a fraction of the memory between 0 and 1, or a size with a unit (e.g. 2GiB), not an integer 3",
        ),
        (1, "limits.disk_free_limit.relative", "unknown key (expected one of: mem_relative)"),
        (1, "limits.disk_free_limit", "missing required key 'mem_relative'"),
    ]


def test_policies_are_read_checked_as_rabbitmq_checks_them_and_applied() -> None:
    config = loads(
        "vhosts:\n"
        "  /:\n"
        "    queues: [{name: orders.eu}]\n"
        "    policies:\n"
        '      - {name: DLX, pattern: "^orders\\\\.", apply_to: queues, definition: {dead-letter-exchange: dlx}}\n'
        "    operator_policies:\n"
        "      - {name: caps, pattern: '.*', priority: 3, definition: {max-length: 1000}}\n",
        "b.yaml",
    )
    (policy,) = config.vhosts["/"].policies
    assert (policy.name, policy.pattern, policy.apply_to, policy.priority) == ("DLX", "^orders\\.", "queues", 0)
    node = node_from_config(config)
    queue = node.vhosts["/"].queues["orders.eu"]
    assert (queue.settings.dead_letter_exchange, queue.settings.max_length) == ("dlx", 1000)
    assert problems(
        "vhosts:\n"
        "  /:\n"
        "    policies:\n"
        "      - {name: a, pattern: '(', definition: {max-priority: 10}}\n"
        "      - {name: b, pattern: x, apply_to: classic_queues, definition: {}}\n"
        "    operator_policies:\n"
        "      - {name: c, pattern: x, definition: {overflow: drop-head}}\n"
    ) == [
        (4, "vhosts./.policies[0].definition", '[{<<"max-priority">>,10}] are not recognised policy settings'),
        (
            4,
            "vhosts./.policies[0].pattern",
            "pattern should be regular expression but is invalid: missing ), unterminated subpattern at position 0",
        ),
        (5, "vhosts./.policies[1].definition", "no policy provided"),
        (
            5,
            "vhosts./.policies[1].apply_to",
            "apply-to 'classic_queues' unrecognised; should be 'queues', 'exchanges' or 'all'",
        ),
        (
            7,
            "vhosts./.operator_policies[0].definition",
            '[{<<"overflow">>,<<"drop-head">>}] are not recognised policy settings',
        ),
    ]


def test_shovels_are_read_checked_as_rabbitmq_checks_them_and_kept_by_the_node() -> None:
    config = loads(
        "vhosts:\n"
        "  /:\n"
        "    shovels:\n"
        "      - {name: out, src-uri: 'amqp://', src-queue: jobs,\n"
        "         dest-uri: 'amqp://u:p@far:5672/v', ack-mode: on-publish}\n",
        "s.yaml",
    )
    (shovel,) = config.vhosts["/"].shovels
    assert shovel.name == "out" and shovel.value["dest-uri"] == "amqp://u:p@far:5672/v"
    node = node_from_config(config)
    assert node.admin.parameters[("shovel", "/", "out")] == dict(shovel.value)
    assert problems(
        "vhosts:\n"
        "  /:\n"
        "    shovels:\n"
        "      - {name: a, src-uri: 'http://x', dest-uri: 'amqp://'}\n"
        "      - [not, a, mapping]\n"
    ) == [
        (4, "vhosts./.shovels[0]", "Must specify 'src-exchange' or 'src-queue'"),
        (4, "vhosts./.shovels[0]", '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'),
        (
            5,
            "vhosts./.shovels[1]",
            "must be a mapping with a name and the shovel's keys (src-uri, src-queue, dest-uri ...)",
        ),
    ]


def test_a_shovel_may_consume_with_postroom_s_remaining_ttl_argument_and_only_as_a_boolean() -> None:
    base = {"src-uri": "amqp://", "src-queue": "jobs", "dest-uri": "amqp://far"}
    assert shovels.validate("s", {**base, "src-consumer-args": {"x-remaining-ttl": True, "x-priority": 1}}) == []
    assert shovels.validate("s", {**base, "src-consumer-args": {"x-remaining-ttl": "yes"}}) == [
        'x-remaining-ttl should be boolean, actually was <<"yes">>'
    ]
    assert shovels.validate("s", {**base, "src-consumer-args": {"x-unknown": 1}}) == [
        'Unrecognised terms [{<<"x-unknown">>,1}] in src-consumer-args'
    ]


def test_the_stream_protocol_listens_only_where_listen_stream_says() -> None:
    assert loads("listen: {amqp: 'tcp:5672'}\n", "s.yaml").listen.stream is None
    assert loads("listen: {stream: 'tcp:5552:interface=127.0.0.1'}\n", "s.yaml").listen.stream == (
        "tcp:5552:interface=127.0.0.1"
    )
    assert problems("listen: {stream: 'ssl:5551'}\n")[0][1] == "listen.stream"


def test_the_stream_protocol_advertises_what_the_stream_section_says(tmp_path: Path) -> None:
    listening = "listen: {stream: 'tcp:5552', stream_tls: 'tcp:5551'}\n"
    issued = trustme.CA().issue_cert("broker.example")
    issued.cert_chain_pems[0].write_to_path(tmp_path / "c.pem")
    issued.private_key_pem.write_to_path(tmp_path / "k.pem")
    tls = f"tls: {{certificate: {tmp_path / 'c.pem'}, key: {tmp_path / 'k.pem'}}}\n"
    config = loads(listening + tls + "stream: {advertised_host: broker.example, advertised_port: 30552}\n", "s.yaml")
    assert (config.stream.advertised_host, config.stream.advertised_port) == ("broker.example", 30552)
    assert (config.stream.advertised_tls_host, config.stream.advertised_tls_port) == (None, None)
    assert loads("", "s.yaml").stream == StreamProtocolConfig()
    for section, path, reason in [
        ("{advertised_port: 0}", "stream.advertised_port", "must be between 1 and 65535, not 0"),
        ("{advertised_port: '5552'}", "stream.advertised_port", None),
        ("{advertised_host: ''}", "stream.advertised_host", "must name a host, not be empty"),
        ("{advertised_tls_port: 99999}", "stream.advertised_tls_port", "must be between 1 and 65535, not 99999"),
        ("{advertised_hostname: x}", "stream.advertised_hostname", None),
    ]:
        found = problems(listening + tls + f"stream: {section}\n")
        assert [where for _line, where, _reason in found] == [path]
        assert reason is None or found[0][2] == reason
    # A listener that is off advertises nothing: its keys are refused, saying so.
    off = problems("stream: {advertised_host: a, advertised_port: 1, advertised_tls_port: 2}\n")
    assert [(where, reason) for _line, where, reason in off] == [
        ("stream.advertised_host", "no stream listener advertises it: set listen.stream or listen.stream_tls"),
        ("stream.advertised_port", "listen.stream is off: nothing advertises it"),
        ("stream.advertised_tls_port", "listen.stream_tls is off: nothing advertises it"),
    ]


def test_the_mqtt_section() -> None:
    listening = "listen: {mqtt: 'tcp:1883'}\n"
    config = loads(listening + "mqtt: {vhost: devices, prefetch: 50, subscription_ttl: 1h}\n", "m.yaml")
    assert (config.listen.mqtt, config.mqtt.vhost, config.mqtt.prefetch) == ("tcp:1883", "devices", 50)
    assert config.mqtt.subscription_ttl == 3600.0 and config.mqtt.exchange == "amq.topic"
    assert loads(listening + "mqtt: {subscription_ttl: false}\n", "m.yaml").mqtt.subscription_ttl is None
    assert loads("", "m.yaml").mqtt == MqttConfig() and loads("", "m.yaml").listen.mqtt is None
    for section, path, reason in [
        ("{prefetch: 0}", "mqtt.prefetch", "must be between 1 and 65535, not 0"),
        ("{allow_anonymous: 'no'}", "mqtt.allow_anonymous", None),
        ("{subscription_ttl: 0s}", "mqtt.subscription_ttl", "must be more than 0 seconds (or false: for ever)"),
        ("{retained_message_store: dets}", "mqtt.retained_message_store", None),
    ]:
        found = problems(listening + f"mqtt: {section}\n")
        assert [where for _line, where, _reason in found] == [path]
        assert reason is None or found[0][2] == reason
    off = problems("mqtt: {vhost: devices}\n")
    assert [(where, reason) for _line, where, reason in off] == [
        ("mqtt", "no MQTT listener serves it: set listen.mqtt, listen.mqtt_tls or listen.mqtt_ws")
    ]
    assert [where for _line, where, _reason in problems("listen: {mqtt_tls: 'tcp:8883'}\n")] == ["listen.mqtt_tls"]
    assert [(w, r) for _l, w, r in problems(listening + "mqtt: {ssl_cert_login: true}\n")] == [
        ("mqtt.ssl_cert_login", "no TLS listener asks for certificates: set listen.mqtt_tls")
    ]
    clustered = "cluster: {name: c, etcd: 'http://127.0.0.1:2379', listen: 'tcp:5679'}\n"
    found = problems(listening + clustered)
    assert ("listen.mqtt", "MQTT is not served in cluster mode yet") in [(w, r) for _l, w, r in found]

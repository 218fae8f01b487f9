"""The reader of a Postroom configuration file's sections: :class:`Reader` turns the parsed
YAML into the schema's frozen dataclasses, checking every key and value on the way and noting
every problem (``config.loader`` runs it on a file; ``config.rabbitmq`` on the settings of a
RabbitMQ definitions export; ``config.reference`` on probes, to list the keys it accepts).

Its rules are the loader's (``docs/configuration.md``): unknown keys and wrong types are errors
that name the key path and the reason; names are strings; durations carry a unit, sizes are
bytes or carry one; references must resolve, and a name declared twice in one vhost is a
conflict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from postroom.config.policies import MAX_STREAM_SEGMENT_BYTES, check_apply_to, check_pattern, is_interval, validate
from postroom.config.schema import (
    ArchiveConfig,
    BindingConfig,
    BrokerConfig,
    ClusterConfig,
    DeadLetterConfig,
    DeadLetterStreamConfig,
    ExchangeConfig,
    LimitsConfig,
    ListenConfig,
    MetricsConfig,
    MqttConfig,
    Permission,
    PluginConfig,
    PolicyConfig,
    QueueConfig,
    ShovelConfig,
    StorageConfig,
    StreamConfig,
    StreamProtocolConfig,
    TLSConfig,
    TopicPermission,
    UIConfig,
    UserConfig,
    UserLimits,
    VhostConfig,
    VhostLimits,
)
from postroom.config.shovels import validate as validate_shovel
from postroom.config.values import ValueReader, is_list, is_string_list, is_text

__all__ = [
    "Reader",
    "SHOVEL_KEYS",
    "AUTH_MECHANISMS",
    "BUILTIN_EXCHANGE_TYPES",
    "STANDARD_EXCHANGES",
    "MAX_PARTITIONS",
    "MIN_CHECKPOINT_BYTES",
]

#: The keys a ``shovels:`` entry's problem names as examples.
SHOVEL_KEYS = "src-uri, src-queue, dest-uri"
#: The SASL mechanisms Postroom offers, in the order ``connection.start`` lists them.
AUTH_MECHANISMS = ("AMQPLAIN", "PLAIN", "EXTERNAL")
#: Exchange types Postroom has without plugins; plugin types start with ``x-``.
BUILTIN_EXCHANGE_TYPES = frozenset({"direct", "fanout", "topic", "headers"})
#: Exchanges every vhost has (they may be referenced without being declared).
STANDARD_EXCHANGES = frozenset({"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"})

#: The most partitions a partitioned stream may have.
MAX_PARTITIONS = 1024

#: The least ``storage.checkpoint_bytes``: checkpoints closer than that cost more than they save.
MIN_CHECKPOINT_BYTES = 64 << 10


class Reader(ValueReader):
    """Reads the sections of a Postroom configuration file into the schema's dataclasses."""

    def optional_listener(self, value: Any, path: str, default: str | None) -> str | None:
        """An endpoint string, or ``false`` for no listener at all."""
        if value is False:
            return None
        return self.endpoint(value, path, default)

    def checkpoint_bytes(self, value: Any, default: int) -> int:
        size = self.size(value, "storage.checkpoint_bytes", default)
        if size < MIN_CHECKPOINT_BYTES:
            self.problem("storage.checkpoint_bytes", f"must be at least 64KiB, not {value!r}")
            return default
        return int(size)

    def broker(self, document: Any) -> BrokerConfig | None:
        if document is None:
            return None
        top = self.mapping(
            document,
            "",
            {"listen", "tls", "auth_mechanisms", "storage", "limits", "users", "plugins", "vhosts", "metrics", "ui"}
            | {"stream", "cluster", "mqtt"},
        )
        defaults = BrokerConfig()
        listen = self.listen(top.get("listen"))
        tls = self.tls(top.get("tls"), listen)
        mechanisms = self.auth_mechanisms(top.get("auth_mechanisms"), tls)
        storage = self.storage(top.get("storage"))
        limits = self.limits(top.get("limits"))
        vhosts = self.vhosts(top.get("vhosts")) if "vhosts" in top else defaults.vhosts
        users = self.users(top.get("users"), vhosts, "EXTERNAL" in mechanisms) if "users" in top else defaults.users
        plugins = self.plugins(top.get("plugins"))
        metrics_section = self.mapping(top.get("metrics"), "metrics", {"rabbitmq_compatible"})
        ui_section = self.mapping(top.get("ui"), "ui", {"reports"})
        metrics = MetricsConfig(
            rabbitmq_compatible=self.boolean(
                metrics_section.get("rabbitmq_compatible"), "metrics.rabbitmq_compatible", False
            )
        )
        return BrokerConfig(
            listen,
            storage,
            limits,
            users,
            plugins,
            vhosts,
            self.source,
            metrics,
            tls=tls,
            auth_mechanisms=mechanisms,
            defaulted=frozenset({"users", "vhosts"} - set(top)),
            ui=UIConfig(reports=self.string(ui_section.get("reports"), "ui.reports", None)),
            stream=self.stream_protocol(top.get("stream"), listen),
            cluster=self.cluster(top.get("cluster"), storage),
            mqtt=self.mqtt(top.get("mqtt"), listen, top.get("cluster") is not None),
        )

    def mqtt(self, value: Any, listen: ListenConfig, cluster: bool) -> MqttConfig:
        """The ``mqtt:`` section (refused without an MQTT listener), and MQTT listeners outside
        cluster mode only (a follower does not serve them)."""
        if cluster:
            for key in ("mqtt", "mqtt_tls", "mqtt_ws"):
                if getattr(listen, key) is not None:
                    self.problem(f"listen.{key}", "MQTT is not served in cluster mode yet")
        if value is None:
            return MqttConfig()
        keys = {"vhost", "exchange", "prefetch", "subscription_ttl", "allow_anonymous", "default_user"}
        keys |= {"default_pass", "ignore_colons_in_username", "ssl_cert_login"}
        section = self.mapping(value, "mqtt", keys)
        if section and listen.mqtt is None and listen.mqtt_tls is None and listen.mqtt_ws is None:
            self.problem("mqtt", "no MQTT listener serves it: set listen.mqtt, listen.mqtt_tls or listen.mqtt_ws")
        default = MqttConfig()
        if section.get("ssl_cert_login") is True and listen.mqtt_tls is None:
            self.problem("mqtt.ssl_cert_login", "no TLS listener asks for certificates: set listen.mqtt_tls")
        ttl: float | None = default.subscription_ttl
        if "subscription_ttl" in section:
            raw = section["subscription_ttl"]
            ttl = None if raw is None or raw is False else self.duration(raw, "mqtt.subscription_ttl", 86400.0)
            if ttl is not None and ttl <= 0:
                self.problem("mqtt.subscription_ttl", "must be more than 0 seconds (or false: for ever)")

        def text(key: str) -> str:
            found = self.string(section.get(key), f"mqtt.{key}", getattr(default, key))
            return found if found is not None else getattr(default, key)

        return MqttConfig(
            vhost=text("vhost"),
            exchange=text("exchange"),
            prefetch=self.integer(section.get("prefetch"), "mqtt.prefetch", default.prefetch, 1, 65535),
            subscription_ttl=ttl,
            allow_anonymous=self.boolean(section.get("allow_anonymous"), "mqtt.allow_anonymous", True),
            default_user=text("default_user"),
            default_pass=text("default_pass"),
            ignore_colons_in_username=self.boolean(
                section.get("ignore_colons_in_username"), "mqtt.ignore_colons_in_username", False
            ),
            ssl_cert_login=self.boolean(section.get("ssl_cert_login"), "mqtt.ssl_cert_login", False),
        )

    def cluster(self, value: Any, storage: StorageConfig) -> ClusterConfig | None:
        if value is None:
            return None
        keys = {"name", "etcd", "listen", "advertise", "prefix", "lease", "min_in_sync", "in_sync_timeout"}
        keys |= {"confirm_timeout", "tls"}
        section = self.mapping(value, "cluster", keys, {"name", "etcd", "listen"})
        tls = self.cluster_tls(section.get("tls"))
        name = self.string(section.get("name"), "cluster.name", "")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", name or "-"):
            self.problem(
                "cluster.name", "must be letters, digits, '.', '_' or '-' (at most 63), starting with a letter or digit"
            )
        etcd = section.get("etcd")
        if isinstance(etcd, str):
            etcd = [etcd]
        if not is_string_list(etcd) or not etcd:
            self.problem("cluster.etcd", "must be a list of etcd client URLs (http://host:2379)")
            etcd = []
        for url in etcd:
            if not re.fullmatch(r"http://[^/\s]+(:\d+)?/?", url):
                self.problem("cluster.etcd", f"{url!r} is not an http://host:port URL")
        listen = self.endpoint(section.get("listen"), "cluster.listen", None)
        if listen is not None and not listen.startswith("tcp:"):
            self.problem(
                "cluster.listen", f"must be a tcp: endpoint (e.g. tcp:5679:interface=10.0.0.1), not {listen!r}"
            )
        default = ClusterConfig("", (), "")
        lease = self.duration(section.get("lease"), "cluster.lease", default.lease)
        if lease < 1:
            self.problem("cluster.lease", f"must be at least 1 second, not {lease}")
        for key in ("in_sync_timeout", "confirm_timeout"):
            if key in section and self.duration(section[key], f"cluster.{key}", 1.0) <= 0:
                self.problem(f"cluster.{key}", "must be more than 0 seconds")
        if storage.fsync == "never":
            self.problem(
                "storage.fsync", "a cluster node's confirms mean every copy in sync has synced: never is refused"
            )
        return ClusterConfig(
            name=name or "",
            etcd=tuple(etcd),
            listen=listen or "",
            advertise=self.string(section.get("advertise"), "cluster.advertise", None),
            prefix=self.string(section.get("prefix"), "cluster.prefix", default.prefix),
            lease=lease,
            min_in_sync=self.integer(section.get("min_in_sync"), "cluster.min_in_sync", default.min_in_sync, 1, 64),
            in_sync_timeout=self.duration(
                section.get("in_sync_timeout"), "cluster.in_sync_timeout", default.in_sync_timeout
            ),
            confirm_timeout=self.duration(
                section.get("confirm_timeout"), "cluster.confirm_timeout", default.confirm_timeout
            ),
            tls=tls,
        )

    def cluster_tls(self, value: Any) -> TLSConfig | None:
        """``cluster.tls``: this node's certificate and key and the CAs of the cluster's nodes,
        loaded here as they will be (see ``config.tls``)."""
        if value is None:
            return None
        section = self.mapping(value, "cluster.tls", {"certificate", "key", "ca"}, {"certificate", "key", "ca"})
        if not section:
            return None
        ca = section.get("ca")
        if isinstance(ca, str):
            ca = [ca]
        tls = TLSConfig(
            certificate=self.string(section.get("certificate"), "cluster.tls.certificate", ""),
            key=self.string(section.get("key"), "cluster.tls.key", ""),
            ca=tuple(self.typed(ca, "cluster.tls.ca", is_string_list, "a file or a list of files", [])),
            verify="peer",
            fail_if_no_peer_cert=True,
        )
        if not (tls.certificate and tls.key and tls.ca):
            return tls
        from postroom.config.tls import TLSProblem, server_context

        try:
            server_context(tls, section="cluster.tls")
        except TLSProblem as problem:
            self.problem(problem.key, problem.reason)
        return tls

    def stream_protocol(self, value: Any, listen: ListenConfig) -> StreamProtocolConfig:
        """The ``stream:`` section: what each stream-protocol listener advertises (each key
        refused unless its listener is on)."""
        section = self.mapping(
            value, "stream", {"advertised_host", "advertised_port", "advertised_tls_host", "advertised_tls_port"}
        )
        found: dict[str, Any] = {}
        listeners = {"host": "stream", "port": "stream", "tls_host": "stream_tls", "tls_port": "stream_tls"}
        for key, listener in listeners.items():
            name, path = f"advertised_{key}", f"stream.advertised_{key}"
            if name not in section:
                continue
            if key == "host" and listen.stream is None and listen.stream_tls is None:
                self.problem(path, "no stream listener advertises it: set listen.stream or listen.stream_tls")
            elif key != "host" and getattr(listen, listener) is None:
                self.problem(path, f"listen.{listener} is off: nothing advertises it")
            elif key.endswith("port"):
                found[name] = self.integer(section[name], path, None, 1, 65535)
            else:
                host = self.string(section[name], path, None)
                if host is not None and not host.strip():
                    self.problem(path, "must name a host, not be empty")
                found[name] = host or None
        return StreamProtocolConfig(**found)

    def tls(self, value: Any, listen: ListenConfig) -> TLSConfig | None:
        """``tls:``: checked here down to the files (see ``config.tls``), so a configuration
        that passes ``config check`` has a TLS context that loads."""
        if value is None:
            if listen.amqps is not None:
                self.problem("listen.amqps", "needs the tls: section (certificate and key)")
            for key in ("stream_tls", "mqtt_tls"):
                if getattr(listen, key) is not None:
                    self.problem(f"listen.{key}", "needs the tls: section (certificate and key)")
            return None
        section = self.mapping(
            value, "tls", {"certificate", "key", "ca", "verify", "fail_if_no_peer_cert", "http"}, {"certificate", "key"}
        )
        if not section:
            return None
        ca = section.get("ca")
        if isinstance(ca, str):
            ca = [ca]
        ca = self.typed(ca, "tls.ca", is_string_list, "a file or a list of files", [])
        verify = self.string(section.get("verify"), "tls.verify", "none")
        if verify not in ("none", "peer"):
            self.problem("tls.verify", f"must be none or peer, not {verify!r}")
            verify = "none"
        tls = TLSConfig(
            certificate=self.string(section.get("certificate"), "tls.certificate", ""),
            key=self.string(section.get("key"), "tls.key", ""),
            ca=tuple(ca),
            verify=verify,
            fail_if_no_peer_cert=self.boolean(section.get("fail_if_no_peer_cert"), "tls.fail_if_no_peer_cert", False),
            http=self.boolean(section.get("http"), "tls.http", False),
        )
        if verify == "peer" and not tls.ca:
            self.problem("tls.verify", "peer needs the CA certificates to verify clients against (tls.ca)")
        if tls.fail_if_no_peer_cert and verify != "peer":
            self.problem("tls.fail_if_no_peer_cert", "needs verify: peer (certificates are not asked for otherwise)")
        uses = (
            listen.amqps or listen.stream_tls or listen.mqtt_tls or (tls.http and (listen.metrics or listen.management))
        )
        if not uses:
            self.problem(
                "tls",
                "no listener uses it: set listen.amqps, listen.stream_tls or listen.mqtt_tls, or http: true with a"
                " metrics or management"
                " listener",
            )
        if not tls.certificate or not tls.key:
            return tls
        from postroom.config.tls import TLSProblem, server_context

        try:
            server_context(tls)
        except TLSProblem as problem:
            self.problem(problem.key, problem.reason)
        return tls

    def auth_mechanisms(self, value: Any, tls: TLSConfig | None) -> tuple[str, ...]:
        default = BrokerConfig().auth_mechanisms
        names = self.typed(value, "auth_mechanisms", is_string_list, "a list of names", default)
        for name in names:
            if name not in AUTH_MECHANISMS:
                self.problem("auth_mechanisms", f"unknown mechanism {name!r} (expected: {', '.join(AUTH_MECHANISMS)})")
                return default
        if not names:
            self.problem("auth_mechanisms", "no mechanism left to log in with")
            return default
        if "EXTERNAL" in names and (tls is None or tls.verify != "peer"):
            self.problem(
                "auth_mechanisms",
                "EXTERNAL takes the user from a verified client certificate: it needs tls: with verify: peer",
            )
        return tuple(names)

    def plugins(self, value: Any) -> tuple[PluginConfig, ...]:
        """``plugins:``: names, or ``{name, settings}`` mappings; a plugin listed twice is refused.

        Whether a name resolves, and whether its settings are right, is for the plugin loader
        (``broker.server.pluginloader``) to say: this module does not import plugins.
        """
        result = []
        seen: set[str] = set()
        for index, item in enumerate(self.typed(value, "plugins", is_list, "a list", [])):
            path = f"plugins[{index}]"
            if isinstance(item, dict):
                entry = self.mapping(item, path, {"name", "settings"}, {"name"})
                name = self.name(entry.get("name"), f"{path}.name")
                settings = self.table(entry.get("settings"), f"{path}.settings")
            else:
                name = self.name(item, path)
                settings = {}
            if not name:
                continue
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name):
                self.problem(path, f"'{name}' is not a plugin name or a dotted module path")
                continue
            if name in seen:
                self.problem(path, f"plugin '{name}' is listed twice")
                continue
            seen.add(name)
            result.append(PluginConfig(name, settings, self.lines.get(path)))
        return tuple(result)

    def listen(self, value: Any) -> ListenConfig:
        keys = {"amqp", "amqps", "metrics", "management", "stream", "stream_tls", "mqtt", "mqtt_tls", "mqtt_ws"}
        section = self.mapping(value, "listen", keys)
        default = ListenConfig()
        return ListenConfig(
            amqp=self.endpoint(section.get("amqp"), "listen.amqp", default.amqp),
            amqps=self.endpoint(section.get("amqps"), "listen.amqps", default.amqps),
            metrics=self.optional_listener(section.get("metrics"), "listen.metrics", default.metrics),
            management=self.optional_listener(section.get("management"), "listen.management", default.management),
            stream=self.endpoint(section.get("stream"), "listen.stream", default.stream),
            stream_tls=self.endpoint(section.get("stream_tls"), "listen.stream_tls", default.stream_tls),
            mqtt=self.endpoint(section.get("mqtt"), "listen.mqtt", default.mqtt),
            mqtt_tls=self.endpoint(section.get("mqtt_tls"), "listen.mqtt_tls", default.mqtt_tls),
            mqtt_ws=self.endpoint(section.get("mqtt_ws"), "listen.mqtt_ws", default.mqtt_ws),
        )

    def endpoint(self, value: Any, path: str, default: str | None) -> str | None:
        """A Twisted server endpoint string of a kind Postroom listens on: ``tcp``, ``tcp6`` or
        ``unix``. TLS comes from the ``tls:`` section, never from an ``ssl:`` endpoint."""
        result = self.string(value, path, default)
        if result is None:
            return result
        kind = result.partition(":")[0]
        if kind == "ssl":
            self.problem(path, "ssl: endpoints are not taken: listen on tcp: and set the tls: section")
            return default
        if kind not in ("tcp", "tcp6", "unix"):
            self.problem(path, f"must be a tcp:, tcp6: or unix: endpoint (e.g. tcp:5672:interface=::1), not {result!r}")
            return default
        return result

    def storage(self, value: Any) -> StorageConfig:
        section = self.mapping(
            value,
            "storage",
            {
                "dir",
                "fsync",
                "fsync_interval_ms",
                "segment_bytes",
                "memory_budget",
                "max_backlog",
                "checkpoint_bytes",
                "archive",
                "deadletters",
            },
        )
        default = StorageConfig()
        fsync = self.string(section.get("fsync"), "storage.fsync", default.fsync)
        if fsync not in ("always", "batch", "never"):
            self.problem("storage.fsync", f"must be always, batch or never, not {fsync!r}")
            fsync = default.fsync
        archive = self.mapping(section.get("archive"), "storage.archive", {"enabled", "retention", "max_bytes"})
        archive_default = ArchiveConfig()
        stream = self.mapping(section.get("deadletters"), "storage.deadletters", {"retention", "max_bytes"})
        stream_default = DeadLetterStreamConfig()
        return StorageConfig(
            dir=self.string(section.get("dir"), "storage.dir", default.dir),
            fsync=fsync,
            fsync_interval_ms=self.integer(
                section.get("fsync_interval_ms"), "storage.fsync_interval_ms", default.fsync_interval_ms, 0, 1000
            ),
            segment_bytes=self.size(section.get("segment_bytes"), "storage.segment_bytes", default.segment_bytes),
            memory_budget=self.size(section.get("memory_budget"), "storage.memory_budget", default.memory_budget),
            max_backlog=self.size(section.get("max_backlog"), "storage.max_backlog", default.max_backlog),
            checkpoint_bytes=self.checkpoint_bytes(section.get("checkpoint_bytes"), default.checkpoint_bytes),
            archive=ArchiveConfig(
                enabled=self.boolean(archive.get("enabled"), "storage.archive.enabled", archive_default.enabled),
                retention=self.duration(
                    archive.get("retention"), "storage.archive.retention", archive_default.retention
                ),
                max_bytes=self.size(archive.get("max_bytes"), "storage.archive.max_bytes", archive_default.max_bytes),
            ),
            deadletters=DeadLetterStreamConfig(
                retention=self.duration(
                    stream.get("retention"), "storage.deadletters.retention", stream_default.retention
                ),
                max_bytes=self.size(stream.get("max_bytes"), "storage.deadletters.max_bytes", stream_default.max_bytes),
            ),
        )

    def limits(self, value: Any) -> LimitsConfig:
        keys = {
            "frame_max",
            "max_message_bytes",
            "max_connections",
            "channel_max",
            "heartbeat",
            "consumer_max_per_channel",
            "memory_high_watermark",
            "disk_free_limit",
        }
        section = self.mapping(value, "limits", keys)
        default = LimitsConfig()
        watermark: float | int = default.memory_high_watermark
        given = section.get("memory_high_watermark")
        if isinstance(given, str):  # absolute, as RabbitMQ's vm_memory_high_watermark.absolute
            watermark = self.size(given, "limits.memory_high_watermark", watermark)
        elif given is not None:
            watermark = float(
                self.typed(
                    given,
                    "limits.memory_high_watermark",
                    lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                    "a fraction of the memory between 0 and 1, or a size with a unit (e.g. 2GiB)",
                    watermark,
                )
            )
        consumers = default.consumer_max_per_channel
        given = section.get("consumer_max_per_channel")
        if given == "infinity":  # RabbitMQ's word for no limit
            consumers = None
        elif given is not None:
            consumers = self.typed(
                given,
                "limits.consumer_max_per_channel",
                lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                "a positive integer, or infinity (no limit)",
                consumers,
            )
        disk_limit, disk_relative = default.disk_free_limit, default.disk_free_limit_mem_relative
        given = section.get("disk_free_limit")
        if isinstance(given, dict):  # relative to the memory, as RabbitMQ's disk_free_limit.relative
            relative = self.mapping(given, "limits.disk_free_limit", {"mem_relative"}, {"mem_relative"})
            disk_relative = self.typed(
                relative.get("mem_relative"),
                "limits.disk_free_limit.mem_relative",
                lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
                "a number of times the memory (e.g. 1.0)",
                None,
            )
            disk_relative = None if disk_relative is None else float(disk_relative)
        else:
            disk_limit = self.size(given, "limits.disk_free_limit", disk_limit)
        return LimitsConfig(
            frame_max=self.integer(section.get("frame_max"), "limits.frame_max", default.frame_max, 4096, 1 << 24),
            max_message_bytes=self.size(
                section.get("max_message_bytes"), "limits.max_message_bytes", default.max_message_bytes
            ),
            max_connections=self.integer(section.get("max_connections"), "limits.max_connections", None, 1),
            channel_max=self.integer(section.get("channel_max"), "limits.channel_max", default.channel_max, 1, 65535),
            heartbeat=self.integer(section.get("heartbeat"), "limits.heartbeat", default.heartbeat, 0, 3600),
            consumer_max_per_channel=consumers,
            memory_high_watermark=watermark,
            disk_free_limit=disk_limit,
            disk_free_limit_mem_relative=disk_relative,
        )

    def users(self, value: Any, vhosts: Mapping[str, VhostConfig], external: bool) -> tuple[UserConfig, ...]:
        """``users:``; with ``external`` (EXTERNAL among the mechanisms) a user may have no
        password at all, and then logs in only with a client certificate."""
        users = []
        seen: set[str] = set()
        for index, item in enumerate(self.typed(value, "users", is_list, "a list", [])):
            path = f"users[{index}]"
            entry = self.mapping(
                item,
                path,
                {
                    "name",
                    "password",
                    "password_hash",
                    "loopback_only",
                    "permissions",
                    "topic_permissions",
                    "tags",
                    "limits",
                },
            )
            name = self.name(entry.get("name"), f"{path}.name")
            if name in seen:
                self.problem(f"{path}.name", f"user '{name}' is declared twice")
            seen.add(name)
            password = self.string(entry.get("password"), f"{path}.password")
            password_hash = self.string(entry.get("password_hash"), f"{path}.password_hash")
            if password is not None and password_hash is not None:
                self.problem(path, "give one of password and password_hash, not both")
            elif password is None and password_hash is None and not external:
                self.problem(
                    path,
                    "give password or password_hash (a user with neither logs in only with a client certificate,"
                    " which needs EXTERNAL in auth_mechanisms)",
                )
            permissions = None
            if "permissions" in entry:
                permissions = {}
                for vhost, perms in self.table(entry["permissions"], f"{path}.permissions").items():
                    where = f"{path}.permissions.{vhost}"
                    if vhost not in vhosts:
                        self.problem(where, f"no vhost '{vhost}' is declared")
                    section = self.mapping(perms, where, {"configure", "write", "read"})
                    patterns = self.patterns(section, where, ("configure", "write", "read"), ".*")
                    permissions[vhost] = Permission(**patterns)
            users.append(
                UserConfig(
                    name,
                    password,
                    password_hash,
                    self.boolean(entry.get("loopback_only"), f"{path}.loopback_only", False),
                    permissions,
                    self.tags(entry.get("tags"), f"{path}.tags"),
                    self.topic_permissions(entry.get("topic_permissions"), f"{path}.topic_permissions", vhosts),
                    UserLimits(
                        **self.object_limits(entry.get("limits"), f"{path}.limits", ("connections", "channels"))
                    ),
                )
            )
        return tuple(users)

    def topic_permissions(
        self, value: Any, path: str, vhosts: Mapping[str, VhostConfig]
    ) -> dict[str, dict[str, TopicPermission]] | None:
        """``topic_permissions: {vhost: {exchange: {write, read}}}`` (``.*`` when left out)."""
        if value is None:
            return None
        result: dict[str, dict[str, TopicPermission]] = {}
        for vhost, exchanges in self.table(value, path).items():
            where = f"{path}.{vhost}"
            if vhost not in vhosts:
                self.problem(where, f"no vhost '{vhost}' is declared")
            result[vhost] = {}
            for exchange, perms in self.table(exchanges, where).items():
                at = f"{where}.{exchange}"
                section = self.mapping(perms, at, {"write", "read"})
                result[vhost][exchange] = TopicPermission(**self.patterns(section, at, ("write", "read"), ".*"))
        return result

    def vhosts(self, value: Any) -> dict[str, VhostConfig]:
        result = {}
        for vhost, definitions in self.table(value, "vhosts").items():
            result[vhost] = self.vhost(definitions, f"vhosts.{vhost}")
        return result

    def object_limits(self, value: Any, path: str, kinds: tuple[str, ...]) -> dict[str, int | None]:
        """A user's or a vhost's ``limits: {max_<kind>: N}``: RabbitMQ's, where a negative
        number means no limit (kept as -1, said apart from a limit left out) and 0 allows none."""
        section = self.mapping(value, path, {f"max_{kind}" for kind in kinds})
        result: dict[str, int | None] = {}
        for key, limit in section.items():
            limit = self.typed(
                limit, f"{path}.{key}", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", -1
            )
            result[key] = max(limit, -1)
        return result

    def vhost(self, value: Any, path: str) -> VhostConfig:
        section = self.mapping(
            value,
            path,
            {"exchanges", "queues", "streams", "bindings", "limits", "policies", "operator_policies", "shovels"},
        )
        exchanges = [
            self.exchange(item, f"{path}.exchanges[{index}]")
            for index, item in enumerate(
                self.typed(section.get("exchanges"), f"{path}.exchanges", is_list, "a list", [])
            )
        ]
        queues = [
            self.queue(item, f"{path}.queues[{index}]")
            for index, item in enumerate(self.typed(section.get("queues"), f"{path}.queues", is_list, "a list", []))
        ]
        bindings = [
            self.binding(item, f"{path}.bindings[{index}]")
            for index, item in enumerate(self.typed(section.get("bindings"), f"{path}.bindings", is_list, "a list", []))
        ]
        streams = [
            self.stream(item, f"{path}.streams[{index}]")
            for index, item in enumerate(self.typed(section.get("streams"), f"{path}.streams", is_list, "a list", []))
        ]
        partitioned = [stream.name for stream in streams if stream.partitions is not None]
        exchange_names = self._unique([e.name for e in exchanges] + partitioned, f"{path}.exchanges", "exchange")
        queue_names = self._unique(
            [q.name for q in queues] + [name for stream in streams for name in stream.stream_names()],
            f"{path}.queues",
            "queue",
        )
        known_exchanges = exchange_names | STANDARD_EXCHANGES
        for index, queue in enumerate(queues):
            if queue.dead_letter is not None and queue.dead_letter.exchange not in known_exchanges:
                self.problem(
                    f"{path}.queues[{index}].dead_letter.exchange",
                    f"no exchange '{queue.dead_letter.exchange}' is declared in this vhost",
                )
        for index, binding in enumerate(bindings):
            where = f"{path}.bindings[{index}]"
            if binding.exchange not in known_exchanges:
                self.problem(f"{where}.exchange", f"no exchange '{binding.exchange}' is declared in this vhost")
            if binding.queue is not None and binding.queue not in queue_names:
                self.problem(f"{where}.queue", f"no queue '{binding.queue}' is declared in this vhost")
            if binding.destination_exchange is not None and binding.destination_exchange not in known_exchanges:
                self.problem(
                    f"{where}.destination_exchange",
                    f"no exchange '{binding.destination_exchange}' is declared in this vhost",
                )
        limits = VhostLimits(**self.object_limits(section.get("limits"), f"{path}.limits", ("connections", "queues")))
        policies = self.policies(section.get("policies"), f"{path}.policies", operator=False)
        operator_policies = self.policies(section.get("operator_policies"), f"{path}.operator_policies", operator=True)
        shovels = self.shovels(section.get("shovels"), f"{path}.shovels")
        return VhostConfig(
            tuple(exchanges),
            tuple(queues),
            tuple(bindings),
            limits,
            policies,
            operator_policies,
            tuple(streams),
            shovels,
        )

    def shovels(self, value: Any, path: str) -> tuple[ShovelConfig, ...]:
        """``shovels:`` of a vhost: each a ``name`` and RabbitMQ's keys, checked as RabbitMQ
        checks a shovel's definition (its messages, one problem each)."""
        result = []
        for index, item in enumerate(self.typed(value, path, is_list, "a list", [])):
            where = f"{path}[{index}]"
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                self.problem(where, f"must be a mapping with a name and the shovel's keys ({SHOVEL_KEYS} ...)")
                continue
            definition = {key: entry for key, entry in item.items() if key != "name"}
            problems = validate_shovel(item["name"], definition)
            for problem in problems:
                self.problem(where, problem)
            if not problems:
                result.append(ShovelConfig(item["name"], definition))
        self._unique([shovel.name for shovel in result], path, "shovel")
        return tuple(result)

    def stream(self, value: Any, path: str) -> StreamConfig:
        """A ``streams:`` entry: a stream, or with ``partitions`` a partitioned stream."""
        entry = self.mapping(
            value, path, {"name", "partitions", "max_age", "max_length_bytes", "max_segment_size_bytes"}, {"name"}
        )
        name = self.name(entry.get("name"), f"{path}.name")
        if name.startswith("amq.") or entry.get("name") == "":
            self.problem(f"{path}.name", "names starting with 'amq.' (and the empty name) are reserved")
        max_age = self.string(entry.get("max_age"), f"{path}.max_age")
        if max_age is not None and not is_interval(max_age):
            self.problem(
                f"{path}.max_age",
                f"must be a number and one of the units Y, M, D, h, m, s, as RabbitMQ's x-max-age (7D, 12h),"
                f" not {max_age!r}",
            )
            max_age = None
        segment = self.size(entry.get("max_segment_size_bytes"), f"{path}.max_segment_size_bytes")
        if segment is not None and not 0 < segment <= MAX_STREAM_SEGMENT_BYTES:
            self.problem(f"{path}.max_segment_size_bytes", f"must be from 1 to {MAX_STREAM_SEGMENT_BYTES} bytes")
            segment = None
        return StreamConfig(
            name=name,
            partitions=self.integer(entry.get("partitions"), f"{path}.partitions", None, 1, MAX_PARTITIONS),
            max_age=max_age,
            max_length_bytes=self.size(entry.get("max_length_bytes"), f"{path}.max_length_bytes"),
            max_segment_size_bytes=segment,
        )

    def policies(self, value: Any, path: str, operator: bool) -> tuple[PolicyConfig, ...]:
        """``policies:`` or ``operator_policies:`` of a vhost, each checked as RabbitMQ checks it."""
        result = []
        for index, item in enumerate(self.typed(value, path, is_list, "a list", [])):
            where = f"{path}[{index}]"
            entry = self.mapping(
                item,
                where,
                {"name", "pattern", "definition", "priority", "apply_to"},
                {"name", "pattern", "definition"},
            )
            name = self.typed(entry.get("name"), f"{where}.name", is_text, "a string", "")
            pattern = self.typed(entry.get("pattern"), f"{where}.pattern", is_text, "a string", "")
            priority = self.typed(
                entry.get("priority"),
                f"{where}.priority",
                lambda v: isinstance(v, int) and not isinstance(v, bool),
                "an integer",
                0,
            )
            apply_to = self.typed(entry.get("apply_to"), f"{where}.apply_to", is_text, "a string", "all")
            definition = entry.get("definition")
            problems = validate(definition, operator)
            for problem in problems:
                self.problem(f"{where}.definition", problem)
            for key, problem in (("pattern", check_pattern(str(pattern))), ("apply_to", check_apply_to(str(apply_to)))):
                if problem is not None:
                    self.problem(f"{where}.{key}", problem)
                    problems.append(problem)
            if not problems and name:
                result.append(PolicyConfig(name, pattern, dict(definition), priority, apply_to))
        self._unique([policy.name for policy in result], path, "policy")
        return tuple(result)

    def _unique(self, names: list[str], path: str, kind: str) -> set[str]:
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                self.problem(f"{path}[{index}].name", f"{kind} '{name}' is declared twice (conflicting redeclaration)")
            seen.add(name)
        return seen

    def exchange(self, value: Any, path: str) -> ExchangeConfig:
        entry = self.mapping(value, path, {"name", "type", "durable", "auto_delete", "internal", "arguments"}, {"name"})
        name = self.name(entry.get("name"), f"{path}.name")
        if name.startswith("amq.") or entry.get("name") == "":
            self.problem(f"{path}.name", "names starting with 'amq.' (and the empty name) are reserved")
        exchange_type = self.string(entry.get("type"), f"{path}.type", "direct")
        if exchange_type not in BUILTIN_EXCHANGE_TYPES and not exchange_type.startswith("x-"):
            self.problem(
                f"{path}.type",
                f"unknown exchange type '{exchange_type}' (built in: {', '.join(sorted(BUILTIN_EXCHANGE_TYPES))};"
                " plugin types start with 'x-')",
            )
        return ExchangeConfig(
            name,
            exchange_type,
            self.boolean(entry.get("durable"), f"{path}.durable", True),
            self.boolean(entry.get("auto_delete"), f"{path}.auto_delete", False),
            self.boolean(entry.get("internal"), f"{path}.internal", False),
            self.table(entry.get("arguments"), f"{path}.arguments"),
        )

    def queue(self, value: Any, path: str) -> QueueConfig:
        keys = {
            "name",
            "durable",
            "auto_delete",
            "visibility_timeout",
            "max_deliveries",
            "dead_letter",
            "message_ttl",
            "max_length",
            "max_length_bytes",
            "overflow",
            "max_priority",
            "expires",
            "single_active_consumer",
            "arguments",
        }
        entry = self.mapping(value, path, keys, {"name"})
        name = self.name(entry.get("name"), f"{path}.name")
        if name.startswith("amq.") or entry.get("name") == "":
            self.problem(f"{path}.name", "names starting with 'amq.' (and the empty name) are reserved")
        dead_letter = None
        if entry.get("dead_letter") is not None:
            section = self.mapping(
                entry["dead_letter"], f"{path}.dead_letter", {"exchange", "routing_key"}, {"exchange"}
            )
            dead_letter = DeadLetterConfig(
                self.name(section.get("exchange"), f"{path}.dead_letter.exchange"),
                self.string(section.get("routing_key"), f"{path}.dead_letter.routing_key"),
            )
        overflow = self.string(entry.get("overflow"), f"{path}.overflow")
        if overflow is not None and overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
            self.problem(
                f"{path}.overflow", f"must be drop-head, reject-publish or reject-publish-dlx, not {overflow!r}"
            )
            overflow = None
        visibility = self.duration(entry.get("visibility_timeout"), f"{path}.visibility_timeout")
        if visibility is not None and visibility < 0.001:
            self.problem(f"{path}.visibility_timeout", "must be at least 1ms")
            visibility = None
        expires = self.duration(entry.get("expires"), f"{path}.expires")
        if expires is not None and expires < 0.001:
            self.problem(f"{path}.expires", "must be at least 1ms")
            expires = None
        return QueueConfig(
            name=name,
            durable=self.boolean(entry.get("durable"), f"{path}.durable", True),
            auto_delete=self.boolean(entry.get("auto_delete"), f"{path}.auto_delete", False),
            visibility_timeout=visibility,
            max_deliveries=self.integer(entry.get("max_deliveries"), f"{path}.max_deliveries", None),
            dead_letter=dead_letter,
            message_ttl=self.duration(entry.get("message_ttl"), f"{path}.message_ttl"),
            max_length=self.integer(entry.get("max_length"), f"{path}.max_length", None),
            max_length_bytes=self.size(entry.get("max_length_bytes"), f"{path}.max_length_bytes"),
            overflow=overflow,
            max_priority=self.integer(entry.get("max_priority"), f"{path}.max_priority", None, 0, 255),
            expires=expires,
            single_active_consumer=self.boolean(
                entry.get("single_active_consumer"), f"{path}.single_active_consumer", False
            ),
            arguments=self.table(entry.get("arguments"), f"{path}.arguments"),
        )

    def binding(self, value: Any, path: str) -> BindingConfig:
        entry = self.mapping(
            value, path, {"exchange", "queue", "destination_exchange", "routing_key", "arguments"}, {"exchange"}
        )
        queue = entry.get("queue")
        destination = entry.get("destination_exchange")
        if (queue is None) == (destination is None):
            self.problem(path, "give exactly one of queue and destination_exchange")
        return BindingConfig(
            exchange=self.name(entry.get("exchange"), f"{path}.exchange"),
            queue=self.name(queue, f"{path}.queue") if queue is not None else None,
            destination_exchange=self.name(destination, f"{path}.destination_exchange")
            if destination is not None
            else None,
            routing_key=self.string(entry.get("routing_key"), f"{path}.routing_key", ""),
            arguments=self.table(entry.get("arguments"), f"{path}.arguments"),
        )

"""The configuration as the broker receives it: frozen dataclasses, already validated.

``config.loader.load`` builds a :class:`BrokerConfig` from YAML; nothing else reads YAML.
Durations are in seconds, sizes in bytes. The YAML keys are those of ``../shared/CONTRACT.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Twisted endpoint strings for each listener (``None``: not listening; ``false`` in YAML)."""

    amqp: str = "tcp:5672:interface=127.0.0.1"
    amqps: str | None = None
    metrics: str | None = "tcp:15692:interface=127.0.0.1"
    management: str | None = "tcp:15672:interface=127.0.0.1"


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS for the ``listen.amqps`` listener, and for the HTTP listeners with ``http``
    (RabbitMQ's ``ssl_options``). Paths are as written: relative ones are relative to the
    working directory, as ``storage.dir`` is.

    ``verify: peer`` asks every client for a certificate and refuses one that none of the
    ``ca`` files vouches for; ``fail_if_no_peer_cert`` also refuses a client that presents none.
    """

    certificate: str
    key: str
    ca: tuple[str, ...] = ()
    verify: str = "none"
    fail_if_no_peer_cert: bool = False
    http: bool = False


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """Where retired log segments go for the Spark job, and for how long."""

    enabled: bool = False
    retention: float = 7 * 86400.0
    max_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class DeadLetterStreamConfig:
    """How long the broker keeps the dead-letter event stream's sealed segments
    (``<storage.dir>/deadletters``), whether or not ``postroom dlq export`` has read them."""

    retention: float = 30 * 86400.0
    max_bytes: int = 4 << 30


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """The write-ahead log."""

    dir: str = "./data"
    fsync: str = "batch"
    #: With ``fsync: batch``, how long the first record after a quiet spell waits for others
    #: (under load, writes follow one another at once and group what arrived meanwhile).
    fsync_interval_ms: int = 1
    segment_bytes: int = 64 << 20
    #: Bytes of queued messages kept in memory (each counted as its body and about 530 bytes);
    #: beyond it deep queues spool to disk (``broker.paging``). The budget in force is at most
    #: half the memory watermark (``broker.service.memory_budget``).
    memory_budget: int = 256 << 20
    #: Bytes of log records waiting for the writer (persistent publishes not confirmed yet)
    #: past which publishers are paused until a write brings them under half of it.
    max_backlog: int = 64 << 20
    #: Bytes of log between checkpoints (``broker.checkpoint``): a start after a crash reads at
    #: most about this much log.
    checkpoint_bytes: int = 16 << 20
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    deadletters: DeadLetterStreamConfig = field(default_factory=DeadLetterStreamConfig)


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Limits a peer can push on (see ``broker.core.node`` for the reasons behind the defaults)."""

    frame_max: int = 131072
    max_message_bytes: int = 128 << 20  # RabbitMQ 3.x's max_message_size
    max_connections: int = 10000
    channel_max: int = 2047
    heartbeat: int = 60
    #: Consumers on one channel (``None``: no limit, RabbitMQ's default).
    consumer_max_per_channel: int | None = 10_000
    #: The memory alarm's watermark: a fraction of the memory the broker may use (a float), or
    #: bytes (an int), as RabbitMQ's ``vm_memory_high_watermark.relative`` / ``.absolute``.
    memory_high_watermark: float | int = 0.4
    #: The disk alarm's limit on the storage directory's free space, in bytes; or, when
    #: ``disk_free_limit_mem_relative`` is set, that many times the memory (RabbitMQ's
    #: ``disk_free_limit.absolute`` / ``.relative``).
    disk_free_limit: int = 50_000_000
    disk_free_limit_mem_relative: float | None = None

    def memory_limit(self, total: int) -> int:
        """The memory watermark in bytes, for ``total`` bytes of memory."""
        if isinstance(self.memory_high_watermark, float):
            return int(total * self.memory_high_watermark)
        return self.memory_high_watermark

    def disk_limit(self, total: int) -> int:
        """The free-space limit in bytes, for ``total`` bytes of memory."""
        if self.disk_free_limit_mem_relative is not None:
            return int(total * self.disk_free_limit_mem_relative)
        return self.disk_free_limit


@dataclass(frozen=True, slots=True)
class Permission:
    """RabbitMQ-style permissions of one user on one vhost (regular expressions)."""

    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class TopicPermission:
    """RabbitMQ-style topic permissions of one user on one topic exchange: regular
    expressions over routing keys, with ``{username}`` and ``{vhost}`` put in."""

    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class UserLimits:
    """RabbitMQ's user limits (``max-connections``, ``max-channels``); ``None``: no limit."""

    max_connections: int | None = None
    max_channels: int | None = None


@dataclass(frozen=True, slots=True)
class UserConfig:
    """A user. At most one of ``password`` and ``password_hash`` is set; with neither, the
    user logs in only with a client certificate (``EXTERNAL``).

    ``password_hash`` is ``scrypt$N$r$p$salt$hash`` (``broker.core.node.hash_password``) or a
    RabbitMQ hash as exported, prefixed: ``rabbitmq-sha256$...`` (also ``-sha512``, ``-md5``).
    """

    name: str
    password: str | None = None
    password_hash: str | None = None
    loopback_only: bool = False
    permissions: dict[str, Permission] | None = None
    tags: tuple[str, ...] = ()
    #: Per vhost, per topic exchange.
    topic_permissions: dict[str, dict[str, TopicPermission]] | None = None
    limits: UserLimits = field(default_factory=UserLimits)


@dataclass(frozen=True, slots=True)
class ExchangeConfig:
    """An exchange to declare."""

    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeadLetterConfig:
    """Where a queue's dead letters go."""

    exchange: str
    routing_key: str | None = None


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A queue to declare, with the reliability settings spelled as YAML keys."""

    name: str
    durable: bool = True
    auto_delete: bool = False
    visibility_timeout: float | None = None
    max_deliveries: int | None = None
    dead_letter: DeadLetterConfig | None = None
    message_ttl: float | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str | None = None
    max_priority: int | None = None
    expires: float | None = None
    single_active_consumer: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    def queue_arguments(self) -> dict[str, Any]:
        """The ``x-`` arguments a client would declare this queue with."""
        arguments = dict(self.arguments)

        def ms(seconds: float) -> int:
            return int(round(seconds * 1000))

        if self.visibility_timeout is not None:
            arguments["x-visibility-timeout"] = ms(self.visibility_timeout)
        if self.max_deliveries is not None:
            arguments["x-delivery-limit"] = self.max_deliveries
        if self.dead_letter is not None:
            arguments["x-dead-letter-exchange"] = self.dead_letter.exchange
            if self.dead_letter.routing_key is not None:
                arguments["x-dead-letter-routing-key"] = self.dead_letter.routing_key
        if self.message_ttl is not None:
            arguments["x-message-ttl"] = ms(self.message_ttl)
        if self.max_length is not None:
            arguments["x-max-length"] = self.max_length
        if self.max_length_bytes is not None:
            arguments["x-max-length-bytes"] = self.max_length_bytes
        if self.overflow is not None:
            arguments["x-overflow"] = self.overflow
        if self.max_priority is not None:
            arguments["x-max-priority"] = self.max_priority
        if self.expires is not None:
            arguments["x-expires"] = ms(self.expires)
        if self.single_active_consumer:
            arguments["x-single-active-consumer"] = True
        return arguments


@dataclass(frozen=True, slots=True)
class BindingConfig:
    """A binding from an exchange to a queue or to another exchange."""

    exchange: str
    queue: str | None = None
    destination_exchange: str | None = None
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VhostLimits:
    """RabbitMQ's vhost limits (``max-connections``, ``max-queues``); ``None``: no limit."""

    max_connections: int | None = None
    max_queues: int | None = None


@dataclass(frozen=True, slots=True)
class VhostConfig:
    """The definitions of one virtual host."""

    exchanges: tuple[ExchangeConfig, ...] = ()
    queues: tuple[QueueConfig, ...] = ()
    bindings: tuple[BindingConfig, ...] = ()
    limits: VhostLimits = field(default_factory=VhostLimits)
    policies: tuple[PolicyConfig, ...] = ()
    operator_policies: tuple[PolicyConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """A policy (``broker.core.policy``): its definition uses RabbitMQ's keys and units
    (``message-ttl`` in milliseconds), as ``rabbitmqctl set_policy`` and definitions.json do."""

    name: str
    pattern: str
    definition: Mapping[str, Any]
    priority: int | float = 0
    apply_to: str = "all"


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """What ``/metrics`` exports besides Postroom's own series."""

    #: Also export the ``rabbitmq_*`` series RabbitMQ's Grafana dashboards read.
    rabbitmq_compatible: bool = False


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """A plugin to enable: a bundled short name, a dotted module path or an installed
    package's entry point name (group ``postroom.plugins``), with its settings.

    ``plugins: [delayed_message]`` and ``plugins: [{name: delayed_message, settings: {...}}]``
    both give one of these; the plugin itself checks ``settings`` when it is loaded.
    """

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    #: The line of the entry in the configuration file (for error messages), when known.
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything the broker is configured with."""

    listen: ListenConfig = field(default_factory=ListenConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    users: tuple[UserConfig, ...] = (
        UserConfig("guest", password="guest", loopback_only=True, tags=("administrator",)),
    )
    plugins: tuple[PluginConfig, ...] = ()
    vhosts: dict[str, VhostConfig] = field(default_factory=lambda: {"/": VhostConfig()})
    source: str = "<embedded default>"
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    tls: TLSConfig | None = None
    #: The SASL mechanisms clients may log in with (RabbitMQ's ``auth_mechanisms``): ``PLAIN``,
    #: ``AMQPLAIN``, and ``EXTERNAL`` (the verified client certificate's common name, on TLS).
    auth_mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    #: What the source holds that Postroom does not apply, one ``FILE: key.path: reason`` line
    #: each (a RabbitMQ definitions export's policies, quorum queues ...; see ``config.rabbitmq``).
    notes: tuple[str, ...] = ()

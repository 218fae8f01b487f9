"""The configuration as the broker receives it: frozen dataclasses, already validated.

``config.loader.load`` builds a :class:`BrokerConfig` from YAML; nothing else reads YAML.
Durations are in seconds, sizes in bytes. The YAML keys are listed in
``docs/configuration-reference.md``, generated from these classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Twisted endpoint strings for each listener (``None``: not listening; ``false`` in YAML)."""

    #: The AMQP listener; ``postroom serve --listen ENDPOINT`` (repeatable) replaces it.
    amqp: str = "tcp:5672:interface=127.0.0.1"
    #: AMQP over TLS (RabbitMQ's port is 5671), with the ``tls:`` section.
    amqps: str | None = None
    #: ``GET /metrics`` for Prometheus.
    metrics: str | None = "tcp:15692:interface=127.0.0.1"
    #: The JSON management API under ``/api/``.
    management: str | None = "tcp:15672:interface=127.0.0.1"
    #: RabbitMQ's stream protocol (its port is 5552); off unless set.
    stream: str | None = None
    #: The stream protocol over TLS (RabbitMQ's port is 5551), with the ``tls:`` section.
    stream_tls: str | None = None
    #: MQTT 3.1.1 (RabbitMQ's port is 1883); off unless set.
    mqtt: str | None = None
    #: MQTT over TLS (RabbitMQ's port is 8883), with the ``tls:`` section.
    mqtt_tls: str | None = None
    #: MQTT over WebSockets, at path ``/ws`` (RabbitMQ's ``rabbitmq_web_mqtt`` port is 15675).
    mqtt_ws: str | None = None


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """How MQTT clients are served (``mqtt:``), as RabbitMQ 3.10's ``mqtt.*`` settings of the
    same names, with its defaults."""

    #: The vhost of a client whose user name names none (``vhost:user``).
    vhost: str = "/"
    #: The topic exchange MQTT topics are routing keys of.
    exchange: str = "amq.topic"
    #: Deliveries at QoS 1 or 2 in flight to one client at once.
    prefetch: int = 10
    #: How long a persistent session's queues live without their client (``None``: for ever).
    subscription_ttl: float | None = 86400.0
    #: A client that sends no user name logs in as ``default_user`` with ``default_pass``.
    allow_anonymous: bool = True
    default_user: str = "guest"
    default_pass: str = "guest"
    #: A colon in a user name is part of the name, not the end of a vhost's name.
    ignore_colons_in_username: bool = False
    #: Over TLS, a client that sends no user name logs in as its verified certificate's common
    #: name, with no password (RabbitMQ's ``mqtt.ssl_cert_login``; before ``allow_anonymous``).
    ssl_cert_login: bool = False


@dataclass(frozen=True, slots=True)
class StreamProtocolConfig:
    """Where the stream protocol tells its clients to connect (``open`` and ``metadata``
    answers), as RabbitMQ's ``stream.advertised_*`` settings: for a broker behind a port
    mapping, a container or a load balancer, whose listener's own address clients cannot
    reach. Left out, each listener advertises its interface (the machine's name when it
    listens on all of them) and its port."""

    #: The host ``listen.stream`` advertises.
    advertised_host: str | None = None
    #: The port ``listen.stream`` advertises.
    advertised_port: int | None = None
    #: The host ``listen.stream_tls`` advertises (left out: ``advertised_host``).
    advertised_tls_host: str | None = None
    #: The port ``listen.stream_tls`` advertises.
    advertised_tls_port: int | None = None


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS for the ``listen.amqps`` and ``listen.stream_tls`` listeners, and for the HTTP listeners with ``http``
    (RabbitMQ's ``ssl_options``). Paths are as written: relative ones are relative to the
    working directory, as ``storage.dir`` is.

    ``verify: peer`` asks every client for a certificate and refuses one that none of the
    ``ca`` files vouches for; ``fail_if_no_peer_cert`` also refuses a client that presents none.
    """

    #: The server certificate (PEM), then any intermediate certificates.
    certificate: str
    #: The server's private key (PEM, without a passphrase).
    key: str
    #: CA certificates (PEM): a client certificate signed by any of them is trusted.
    ca: tuple[str, ...] = ()
    #: ``none`` or ``peer`` (ask every client for a certificate and check it against ``ca``).
    verify: str = "none"
    #: With ``verify: peer``, also refuse a client that presents no certificate.
    fail_if_no_peer_cert: bool = False
    #: Serve the metrics and management listeners over HTTPS too.
    http: bool = False


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """Where retired log segments go for the Spark job, and for how long."""

    #: Keep retired segments in ``<storage.dir>/archive``.
    enabled: bool = False
    #: Archived segments older than this are deleted.
    retention: float = 7 * 86400.0
    #: Past this many bytes of archive the oldest segments are deleted (never the newest).
    max_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class DeadLetterStreamConfig:
    """How long the broker keeps the dead-letter event stream's sealed segments
    (``<storage.dir>/deadletters``), whether or not ``postroom dlq export`` has read them."""

    #: Sealed segments older than this are deleted.
    retention: float = 30 * 86400.0
    #: Past this many bytes of sealed segments the oldest are deleted.
    max_bytes: int = 4 << 30


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """The write-ahead log."""

    #: The data directory: the write-ahead log and what goes beside it (checkpoints, spool,
    #: paging store, dead-letter events). A relative path is relative to the working directory.
    dir: str = "./data"
    #: ``batch`` (a group commit: confirms go out after the fsync), ``always`` (write and sync
    #: at the end of every reactor turn) or ``never`` (confirm once written).
    fsync: str = "batch"
    #: With ``fsync: batch``, how long the first record after a quiet spell waits for others
    #: (under load, writes follow one another at once and group what arrived meanwhile). 0: it
    #: is written at the reactor's next turn.
    fsync_interval_ms: int = 0
    #: The size of a log segment file.
    segment_bytes: int = 64 << 20
    #: Bytes of queued messages kept in memory (each counted as its body and 412 bytes, plus 176
    #: per queue holding it and 252 more if it is logged); beyond it deep queues spool to disk
    #: (``broker.storage.body_paging``). The budget in force is at most half the memory watermark
    #: (``broker.server.service.memory_budget``), less what the broker holds besides
    #: (``broker.storage.body_paging.Pager.budget_now``).
    memory_budget: int = 256 << 20
    #: Bytes of log records waiting for the writer (persistent publishes not confirmed yet)
    #: past which publishers are paused until a write brings them under half of it. The bound
    #: in force is at most a sixteenth of the memory watermark (``broker.server.service.log_backlog``).
    max_backlog: int = 64 << 20
    #: Bytes of log between checkpoints (``broker.storage.checkpoint``): a start after a crash reads at
    #: most about this much log. At least 64KiB.
    checkpoint_bytes: int = 16 << 20
    #: Retired log segments kept for the Spark job.
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    #: The dead-letter event stream (``<storage.dir>/deadletters``).
    deadletters: DeadLetterStreamConfig = field(default_factory=DeadLetterStreamConfig)


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Limits a peer can push on (see ``broker.core.node`` for the reasons behind the defaults)."""

    #: The largest frame a client may send or receive, offered in ``connection.tune``.
    frame_max: int = 131072
    #: The largest message body, as RabbitMQ 3.x's ``max_message_size``; a body is held in
    #: memory whole.
    max_message_bytes: int = 128 << 20
    #: Open connections at once (AMQP's, MQTT's); one more is refused (at ``connection.open``
    #: with 530, or with CONNACK 3). ``None``: as many as the open file limit allows, less a
    #: reserve for the log, the listeners and the management API (the limit is raised to its
    #: hard limit at start), as RabbitMQ sets none below its file descriptors.
    max_connections: int | None = None
    #: The most channels on one connection, offered in ``connection.tune``.
    channel_max: int = 2047
    #: The heartbeat interval proposed to clients, in seconds; 0 turns heartbeats off.
    heartbeat: int = 60
    #: Consumers on one channel (``None``, ``infinity`` in YAML: no limit, RabbitMQ's
    #: default); one more closes the connection with 530.
    consumer_max_per_channel: int | None = 10_000
    #: The memory alarm's watermark: a fraction of the memory the broker may use (a float), or
    #: bytes (an int), as RabbitMQ's ``vm_memory_high_watermark.relative`` / ``.absolute``.
    memory_high_watermark: float | int = 0.4
    #: The disk alarm's limit on the storage directory's free space, in bytes; or, when
    #: ``disk_free_limit_mem_relative`` is set, that many times the memory (RabbitMQ's
    #: ``disk_free_limit.absolute`` / ``.relative``).
    disk_free_limit: int = 50_000_000
    #: The disk alarm's limit as that many times the memory (``disk_free_limit: {mem_relative: 1.0}``).
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

    #: Names of the queues and exchanges the user may declare (not passively) and delete.
    configure: str = ".*"
    #: Names of the exchanges the user may publish to, and of a binding's destination.
    write: str = ".*"
    #: Names of the queues the user may get from, consume from and purge, and of a binding's source.
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class TopicPermission:
    """RabbitMQ-style topic permissions of one user on one topic exchange: regular
    expressions over routing keys, with ``{username}`` and ``{vhost}`` put in (and for an MQTT
    connection, ``{client_id}``, as RabbitMQ's MQTT plugin puts it in)."""

    #: Routing keys the user may publish with.
    write: str = ".*"
    #: Routing keys of the bindings the user may make, where this exchange is the source.
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class UserLimits:
    """RabbitMQ's user limits (``max-connections``, ``max-channels``); ``None`` (left out)
    or -1 (any negative number in YAML): no limit; 0 allows none."""

    #: Connections of this user, over all its connections.
    max_connections: int | None = None
    #: Channels of this user, over all its connections.
    max_channels: int | None = None


@dataclass(frozen=True, slots=True)
class UserConfig:
    """A user. At most one of ``password`` and ``password_hash`` is set; with neither, the
    user logs in only with a client certificate (``EXTERNAL``).

    ``password_hash`` is ``scrypt$N$r$p$salt$hash`` (``broker.core.node.hash_password``) or a
    RabbitMQ hash as exported, prefixed: ``rabbitmq-sha256$...`` (also ``-sha512``, ``-md5``).
    """

    #: The user name.
    name: str
    #: The password, in clear.
    password: str | None = None
    #: The password's hash (see above).
    password_hash: str | None = None
    #: The user may connect only from a loopback address (RabbitMQ's rule for guest).
    loopback_only: bool = False
    #: Per vhost; a user with them may open only the vhosts listed, a user without them every
    #: vhost with full rights.
    permissions: dict[str, Permission] | None = None
    #: RabbitMQ's user tags, for the management API: ``administrator``, ``monitoring``,
    #: ``policymaker``, ``management``.
    tags: tuple[str, ...] = ()
    #: Per vhost, per topic exchange.
    topic_permissions: dict[str, dict[str, TopicPermission]] | None = None
    #: RabbitMQ's user limits.
    limits: UserLimits = field(default_factory=UserLimits)


@dataclass(frozen=True, slots=True)
class ExchangeConfig:
    """An exchange to declare."""

    #: The exchange's name (not ``amq.`` nor empty: those are reserved).
    name: str
    #: ``direct``, ``fanout``, ``topic``, ``headers``, or a plugin's type (``x-...``).
    type: str = "direct"
    #: Kept across restarts (recorded in the write-ahead log).
    durable: bool = True
    #: Deleted once the last binding from it is removed.
    auto_delete: bool = False
    #: Clients may not publish to it (403); messages reach it through exchange-to-exchange bindings.
    internal: bool = False
    #: Declare arguments (``alternate-exchange``, a plugin type's arguments).
    arguments: dict[str, Any] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        """What ``exchange.declare`` says besides the name and type, as keyword arguments."""
        return {
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "internal": self.internal,
            "arguments": self.arguments,
        }


@dataclass(frozen=True, slots=True)
class DeadLetterConfig:
    """Where a queue's dead letters go."""

    #: The dead-letter exchange (``x-dead-letter-exchange``).
    exchange: str
    #: The routing key dead letters get (``x-dead-letter-routing-key``); their own when not set.
    routing_key: str | None = None


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A queue to declare, with the reliability settings spelled as YAML keys."""

    #: The queue's name (not ``amq.`` nor empty: those are reserved).
    name: str
    #: Kept across restarts, with its persistent messages (recorded in the write-ahead log).
    durable: bool = True
    #: Deleted once its last consumer is cancelled.
    auto_delete: bool = False
    #: Unacknowledged deliveries come back to the queue after this (SQS-style).
    visibility_timeout: float | None = None
    #: A message returned (nacked or rejected with requeue, timed out ...) more times than this
    #: is dead-lettered with reason ``delivery_limit``.
    max_deliveries: int | None = None
    #: Where dead letters go.
    dead_letter: DeadLetterConfig | None = None
    #: How long a message may wait in the queue.
    message_ttl: float | None = None
    #: Ready messages the queue holds at most.
    max_length: int | None = None
    #: Bytes of ready message bodies the queue holds at most.
    max_length_bytes: int | None = None
    #: What a full queue does: ``drop-head``, ``reject-publish`` or ``reject-publish-dlx``.
    overflow: str | None = None
    #: A priority queue, with priorities 0 to this.
    max_priority: int | None = None
    #: The queue is deleted after it has been unused this long.
    expires: float | None = None
    #: Deliver to one consumer at a time; the others wait.
    single_active_consumer: bool = False
    #: Any other queue arguments, as a client would declare them.
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

    def options(self) -> dict[str, Any]:
        """What ``queue.declare`` says besides the name, as keyword arguments."""
        return {"durable": self.durable, "auto_delete": self.auto_delete, "arguments": self.queue_arguments()}


@dataclass(frozen=True, slots=True)
class BindingConfig:
    """A binding from an exchange to a queue or to another exchange (exactly one of ``queue``
    and ``destination_exchange``)."""

    #: The source exchange.
    exchange: str
    #: The queue bound to it.
    queue: str | None = None
    #: The exchange bound to it.
    destination_exchange: str | None = None
    #: The binding key.
    routing_key: str = ""
    #: Binding arguments (``x-match`` and the headers of a headers exchange).
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A stream (``x-queue-type: stream``), or with ``partitions`` a partitioned stream: streams
    ``NAME-0`` ... ``NAME-(N-1)`` behind a direct exchange ``NAME`` declared with
    ``x-super-stream: true`` that routes by a hash of the routing key, laid out as RabbitMQ's
    super streams (``exchanges.partitions``)."""

    #: The stream's name (with ``partitions``, the exchange's, and the streams' prefix).
    name: str
    #: Partitions (streams) of a partitioned stream; ``None``: one stream.
    partitions: int | None = None
    #: Retention by age, as RabbitMQ writes it (``7D``, ``12h``, ``30m``, ``10s``): ``x-max-age``.
    max_age: str | None = None
    #: Retention by size, in bytes (each partition's): ``x-max-length-bytes``.
    max_length_bytes: int | None = None
    #: A segment's size in bytes: ``x-stream-max-segment-size-bytes``.
    max_segment_size_bytes: int | None = None

    def stream_arguments(self) -> dict[str, Any]:
        """The arguments each of its streams is declared with."""
        arguments: dict[str, Any] = {"x-queue-type": "stream"}
        if self.max_age is not None:
            arguments["x-max-age"] = self.max_age
        if self.max_length_bytes is not None:
            arguments["x-max-length-bytes"] = self.max_length_bytes
        if self.max_segment_size_bytes is not None:
            arguments["x-stream-max-segment-size-bytes"] = self.max_segment_size_bytes
        return arguments

    def stream_names(self) -> list[str]:
        """Its streams' names."""
        if self.partitions is None:
            return [self.name]
        return [f"{self.name}-{index}" for index in range(self.partitions)]

    def declarations(self) -> Iterator[ExchangeConfig | QueueConfig | BindingConfig]:
        """The exchange, streams and bindings that make it, in the order they can be declared."""
        if self.partitions is not None:
            yield ExchangeConfig(self.name, "direct", arguments={"x-super-stream": True})
        for name in self.stream_names():
            yield QueueConfig(name, arguments=self.stream_arguments())
        for index, name in enumerate(self.stream_names() if self.partitions is not None else ()):
            yield BindingConfig(self.name, name, routing_key=str(index), arguments={PARTITION_ORDER: index})


#: The binding argument that gives a partition its place (``exchanges.partitions``: RabbitMQ's).
PARTITION_ORDER = "x-stream-partition-order"


@dataclass(frozen=True, slots=True)
class VhostLimits:
    """RabbitMQ's vhost limits (``max-connections``, ``max-queues``): -1 (a negative number in
    YAML) is no limit, 0 allows none; ``None``, left out, keeps what is set at run time."""

    #: Connections open to the vhost.
    max_connections: int | None = None
    #: Queues in the vhost.
    max_queues: int | None = None


@dataclass(frozen=True, slots=True)
class VhostConfig:
    """The definitions of one virtual host."""

    #: Exchanges to declare.
    exchanges: tuple[ExchangeConfig, ...] = ()
    #: Queues to declare.
    queues: tuple[QueueConfig, ...] = ()
    #: Bindings to declare, between the vhost's exchanges and queues.
    bindings: tuple[BindingConfig, ...] = ()
    #: RabbitMQ's vhost limits.
    limits: VhostLimits = field(default_factory=VhostLimits)
    #: Policies by name pattern, as RabbitMQ's.
    policies: tuple[PolicyConfig, ...] = ()
    #: Operator policies: they may set limits only, and where a policy sets one too the lower applies.
    operator_policies: tuple[PolicyConfig, ...] = ()
    #: Streams and partitioned streams to declare (after the exchanges and queues, before the bindings).
    streams: tuple[StreamConfig, ...] = ()
    #: Dynamic shovels (RabbitMQ's ``shovel`` runtime parameters), run by the broker.
    shovels: tuple[ShovelConfig, ...] = ()

    def declarations(self, path: str) -> Iterator[tuple[str, ExchangeConfig | QueueConfig | BindingConfig]]:
        """Each exchange, queue and binding with its key path under ``path``, in the order they
        can be declared: exchanges, then queues, then bindings. The broker applies them at start
        (``broker.core.definitions``) and ``postroom declare`` over AMQP, from this one list."""
        yield from ((f"{path}.exchanges[{index}]", exchange) for index, exchange in enumerate(self.exchanges))
        yield from ((f"{path}.queues[{index}]", queue) for index, queue in enumerate(self.queues))
        for index, stream in enumerate(self.streams):
            yield from ((f"{path}.streams[{index}]", item) for item in stream.declarations())
        yield from ((f"{path}.bindings[{index}]", binding) for index, binding in enumerate(self.bindings))


@dataclass(frozen=True, slots=True)
class ShovelConfig:
    """A dynamic shovel: its name and its definition in RabbitMQ's keys (``src-uri``,
    ``src-queue``, ``dest-uri`` ...), checked as RabbitMQ checks it (``config.shovels``)."""

    name: str
    value: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """A policy (``broker.core.policy``): its definition uses RabbitMQ's keys and units
    (``message-ttl`` in milliseconds), as ``rabbitmqctl set_policy`` and definitions.json do."""

    #: The policy's name, unique in its vhost.
    name: str
    #: A regular expression searched for (not anchored) in a queue's or exchange's name.
    pattern: str
    #: The policy's keys and values (``dead-letter-exchange``, ``message-ttl``, ``max-length`` ...).
    definition: Mapping[str, Any]
    #: Of the policies that match, the highest priority applies.
    priority: int | float = 0
    #: ``queues``, ``exchanges`` or ``all``.
    apply_to: str = "all"


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """What ``/metrics`` exports besides Postroom's own series."""

    #: Also export the ``rabbitmq_*`` series RabbitMQ's Grafana dashboards read.
    rabbitmq_compatible: bool = False


@dataclass(frozen=True, slots=True)
class UIConfig:
    """What the web UI on the management listener shows besides the broker's own state."""

    #: The folder ``postroom dlq analyze --out`` writes its reports under (one folder each,
    #: with ``summary.json`` and ``report.html``): the UI lists and opens them. Left out: none.
    reports: str | None = None


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """A plugin to enable: a bundled short name, a dotted module path or an installed
    package's entry point name (group ``postroom.plugins``), with its settings.

    ``plugins: [delayed_message]`` and ``plugins: [{name: delayed_message, settings: {...}}]``
    both give one of these; the plugin itself checks ``settings`` when it is loaded.
    """

    #: The bundled short name, dotted module path or entry point name.
    name: str
    #: The plugin's own settings.
    settings: dict[str, Any] = field(default_factory=dict)
    #: The line of the entry in the configuration file (for error messages), when known.
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Cluster mode (``docs/cluster.md``): nodes that elect a leader in etcd, which serves
    clients and sends its log to the others; a confirm means every copy in sync has the
    message. Left out, the broker is a single node."""

    #: This node's name, unique in the cluster.
    name: str
    #: etcd's client URLs (``http://host:2379``).
    etcd: tuple[str, ...]
    #: Where this node listens for its followers when it leads (a ``tcp:`` endpoint).
    listen: str
    #: The host other nodes, and the proxies on followers, reach this node's listeners at
    #: (left out: the interface ``listen`` names).
    advertise: str | None = None
    #: The prefix of the cluster's keys in etcd.
    prefix: str = "postroom"
    #: The leader's lease in etcd, in whole seconds (rounded up): a leader that cannot renew it
    #: for this long stops serving, and another node takes over (etcd's least is 2 seconds
    #: with its default settings).
    lease: float = 2.0
    #: Copies of a message, the leader's counted, that a confirm needs. Below that, the
    #: leader holds confirms and refuses them after ``confirm_timeout``.
    min_in_sync: int = 2
    #: A follower that leaves a batch unacknowledged for this long leaves the in-sync set.
    in_sync_timeout: float = 2.0
    #: How long a confirm waits for ``min_in_sync`` copies before it is refused.
    confirm_timeout: float = 10.0
    #: TLS on the links between the nodes (left out: plain TCP): each node presents its
    #: ``certificate`` and refuses a peer whose certificate none of ``ca`` signed
    #: (``verify`` is ``peer`` and ``fail_if_no_peer_cert`` is set).
    tls: TLSConfig | None = None


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything the broker is configured with."""

    #: Where the broker listens.
    listen: ListenConfig = field(default_factory=ListenConfig)
    #: The write-ahead log and the data directory.
    storage: StorageConfig = field(default_factory=StorageConfig)
    #: Limits on what clients may do, and the resource alarms.
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    #: The users; given, they replace the embedded guest.
    users: tuple[UserConfig, ...] = (
        UserConfig("guest", password="guest", loopback_only=True, tags=("administrator",)),
    )
    #: Plugins to load, in load order.
    plugins: tuple[PluginConfig, ...] = ()
    #: The virtual hosts, each with its definitions.
    vhosts: dict[str, VhostConfig] = field(default_factory=lambda: {"/": VhostConfig()})
    source: str = "<embedded default>"
    #: What ``/metrics`` exports.
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: TLS for ``listen.amqps`` and, with ``http``, the HTTP listeners.
    tls: TLSConfig | None = None
    #: The SASL mechanisms clients may log in with (RabbitMQ's ``auth_mechanisms``): ``PLAIN``,
    #: ``AMQPLAIN``, and ``EXTERNAL`` (the verified client certificate's common name, on TLS).
    auth_mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    #: What the source holds that Postroom does not apply, one ``FILE: key.path: reason`` line
    #: each (a RabbitMQ definitions export's policies, quorum queues ...; see ``config.rabbitmq``).
    notes: tuple[str, ...] = ()
    #: The web UI's settings.
    ui: UIConfig = field(default_factory=UIConfig)
    #: What the stream protocol's listeners advertise.
    stream: StreamProtocolConfig = field(default_factory=StreamProtocolConfig)
    #: How MQTT clients are served.
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    #: The sections the source left out, at their embedded defaults (``users``, ``vhosts``):
    #: those apply on the first start only, as RabbitMQ creates its default user and vhost on
    #: a fresh database (see ``broker.core.definitions``).
    defaulted: frozenset[str] = frozenset()
    #: Cluster mode; ``None``: a single node.
    cluster: ClusterConfig | None = None


def embedded_default() -> BrokerConfig:
    """The configuration of a broker started without a file: guest and vhost ``/`` are
    created on its first start only (delete guest once, and it stays deleted)."""
    return BrokerConfig(defaulted=frozenset({"users", "vhosts"}))

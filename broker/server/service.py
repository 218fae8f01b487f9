"""Assembling the broker as a Twisted service: the node, the AMQP listener(s), graceful shutdown."""

from __future__ import annotations

import gc
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet import defer
from twisted.internet.interfaces import IProtocolFactory
from twisted.logger import Logger

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.node import Node
from postroom.broker.mqtt.registry import MqttRegistry
from postroom.broker.server.alarms import ResourceMonitor, memory_total, release_memory
from postroom.broker.server.clusterview import ClusterView
from postroom.broker.server.listeners import Listener, ListenError, stream_addresses, tls_wrapper
from postroom.broker.server.management import RateSampler, management_site
from postroom.broker.server.metrics import BrokerCollector, metrics_site
from postroom.broker.server.mqttprotocol import MqttServerFactory
from postroom.broker.server.pluginloader import LoadedPlugins, load_plugins
from postroom.broker.server.protocol import AMQPServerFactory
from postroom.broker.server.shovels import Shovels
from postroom.broker.server.streamprotocol import StreamServerFactory
from postroom.broker.server.websocket import WebSocketFactory
from postroom.broker.storage.logwriter import Replication, WALService
from postroom.broker.storage.recover import open_storage
from postroom.config.schema import BrokerConfig, embedded_default

#: Allocations between young-generation collections. Messages and queue entries are
#: allocated at 100k+/s and never form cycles; at the default (700) the collector would walk
#: every queued message many times a second.
GC_THRESHOLD = 100_000

#: Share of the memory alarm's watermark that the records waiting for the write-ahead log's
#: writer may take at most (see :func:`log_backlog`).
BACKLOG_SHARE = 1 / 16


def tune_gc() -> None:
    """Collect cycles less often (see :data:`GC_THRESHOLD`) and keep start-up objects out of it."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)


class BrokerService(MultiService):
    """The broker: its listeners (AMQP, metrics, management) as children, and the log writer.

    Stopping is sequential on purpose (``MultiService`` would stop every child at once):
    listeners stop accepting, connections are closed with 320 CONNECTION_FORCED (their unacked
    deliveries go back to their queues), and only then is the log flushed, synced and closed.
    """

    _log = Logger()

    def __init__(
        self,
        factory: AMQPServerFactory,
        wal: WALService | None = None,
        sampler: RateSampler | None = None,
        dead_letters: Service | None = None,
    ) -> None:
        super().__init__()
        self.factory = factory
        self.wal = wal
        self.sampler = sampler
        #: Writes the dead-letter event stream (``broker.storage.dead_letter_writer``), with a log directory.
        self.dead_letters = dead_letters

    def startService(self) -> None:
        """Listen first, then start the writers: a listener that cannot bind raises
        :class:`ListenError` with nothing started (no worker thread to keep the process up).

        The reactor is not running yet, so no connection is served before the writers start.
        """
        try:
            super().startService()
        except ListenError:
            for child in self:
                if child.running:
                    child.stopService()
            self.running = False
            raise
        if self.wal is not None:
            self.wal.startService()
        if self.dead_letters is not None:
            self.dead_letters.startService()
        if self.sampler is not None:
            self.sampler.start()

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        self._log.info(
            "shutting down: no new connections; closing {count} connection(s)", count=len(self.factory.protocols)
        )
        yield super().stopService()
        if self.sampler is not None:
            self.sampler.stop()
        yield self.factory.close_all()
        if self.wal is not None:
            yield self.wal.stopService()
            self._log.info("write-ahead log flushed and synced")
        # After the connections closed: their unacked dead letters went back to their queues.
        if self.dead_letters is not None:
            yield self.dead_letters.stopService()
        if self.wal is not None and self.wal.data_dir is not None:
            started = time.monotonic()
            captured = self.wal.checkpoint()
            if captured is not None:
                self._log.info(
                    "checkpoint written: {messages} message(s) in {queues} durable queue(s) in {seconds:.3f} s",
                    messages=captured.messages,
                    queues=len(captured.queues),
                    seconds=time.monotonic() - started,
                )


def memory_budget(config: BrokerConfig, memory: int | None = None) -> int:
    """The budget in force for queued messages in memory: ``storage.memory_budget``, but never
    above half the memory alarm's watermark (RabbitMQ's paging ratio), so the broker spools
    before it blocks publishers.

    :param memory: the machine's memory in bytes (default: read it)
    """
    limit = config.limits.memory_limit(memory_total() if memory is None else memory)
    return min(config.storage.memory_budget, limit // 2)


def log_backlog(config: BrokerConfig, memory: int | None = None) -> int:
    """The bound in force on the records waiting for the write-ahead log's writer:
    ``storage.max_backlog``, but never above :data:`BACKLOG_SHARE` of the memory alarm's
    watermark (they are held in memory, and the writer joins them into one buffer), so a disk
    slower than publishers pauses them before their records raise the memory alarm.

    :param memory: the machine's memory in bytes (default: read it)
    """
    limit = config.limits.memory_limit(memory_total() if memory is None else memory)
    return min(config.storage.max_backlog, int(limit * BACKLOG_SHARE))


def make_broker_service(
    reactor: Any,
    config: BrokerConfig | None = None,
    amqp_endpoints: list[str] | None = None,
    node: Node | None = None,
    persist: bool = True,
    plugins: LoadedPlugins | None = None,
    replication: Replication | None = None,
    cluster: ClusterView | None = None,
) -> BrokerService:
    """Build the broker service: load the plugins, recover from the log, apply definitions, listen.

    :param reactor: the reactor (listening, timers, the log's worker thread)
    :param config: the configuration; the embedded default when omitted
    :param amqp_endpoints: AMQP listeners (Twisted endpoint strings) instead of the configuration's
    :param node: a ready node instead of one built from the configuration (nothing is persisted)
    :param persist: keep durable state in the configuration's log directory
    :param plugins: plugins already loaded (default: load the configuration's ``plugins:``)
    :param replication: a cluster leader's followers: what the log writes is sent to them, and
        confirms wait for those in sync (``broker.cluster``)
    :param cluster: what the management API and ``/metrics`` show of the cluster this node leads
    :raises ConfigError: the configuration's definitions were refused, or a plugin failed to
        load (``PluginError``, naming the plugin and the reason)
    :raises WALCorruption: the log is damaged in the middle
    """
    config = config or embedded_default()
    if node is None and plugins is None:
        plugins = load_plugins(config.plugins, reactor, source=config.source)
    extensions: dict[str, Any] = {}
    if plugins is not None:
        extensions = {
            "registry": plugins.registry,
            "hooks": plugins.hooks,
            "authenticators": plugins.authenticators,
        }
    storage = None
    if node is None:
        if persist:
            storage = open_storage(
                config,
                reactor,
                extensions,
                memory_budget(config),
                log_backlog(config),
                plugins.node_ready if plugins is not None else None,
                replication,
            )
            node = storage.node
            release_memory()
        else:
            node = node_from_config(config, reactor, **extensions)
            if plugins is not None:
                plugins.node_ready(node)
    elif plugins is not None:
        plugins.node_ready(node)
    wal = storage.wal if storage is not None else None
    node.socket_limit = socket_limit(raise_open_file_limit())
    memory = memory_total()
    monitor = ResourceMonitor(
        node,
        reactor,
        config.limits.memory_limit(memory),
        config.storage.dir if wal is not None else None,
        config.limits.disk_limit(memory),
    )
    shovels = Shovels(node, reactor)
    factory = AMQPServerFactory(node, reactor, monitor)
    sampler = RateSampler(node, reactor, monitor=monitor) if config.listen.management else None
    service = BrokerService(factory, wal, sampler, storage.dead_letters if storage is not None else None)
    if storage is not None:
        storage.pager.setServiceParent(service)
        # Paging keeps the whole broker under half the watermark.
        storage.pager.follow_memory(monitor.memory_limit, lambda: monitor.memory_used)
        storage.pager.on_drained = release_memory
    for plugin_service in plugins.services if plugins is not None else ():
        # Children start in order: plugin services before the listeners, stopped with them.
        plugin_service.setServiceParent(service)
    monitor.setServiceParent(service)
    _listen(service, config, reactor, _Shell(node, factory, wal, sampler, monitor, shovels, cluster), amqp_endpoints)
    # Last: shovels start once the listeners are bound (one to amqp:// connects to them) and
    # stop first, while the node still serves.
    shovels.setServiceParent(service)
    return service


@dataclass(frozen=True, slots=True)
class _Shell:
    """What the listeners serve: the node, its AMQP factory, and what metrics and the
    management API read besides (the log writer, the rates, the resource readings, the shovels)."""

    node: Node
    factory: AMQPServerFactory
    wal: WALService | None
    sampler: RateSampler | None
    monitor: ResourceMonitor
    shovels: Shovels
    cluster: ClusterView | None = None


def _listen(
    service: BrokerService,
    config: BrokerConfig,
    reactor: Any,
    shell: _Shell,
    amqp_endpoints: list[str] | None,
) -> None:
    """Add the configuration's listeners to ``service``: AMQP (``amqp_endpoints`` instead, when
    given), AMQPS, the stream protocol (plain and TLS), metrics and management."""
    node, factory, sampler = shell.node, shell.factory, shell.sampler
    tls = tls_wrapper(config, reactor)
    certificates = (config.tls.certificate, config.tls.ca) if config.tls is not None else None
    for description in amqp_endpoints or [config.listen.amqp]:
        Listener("amqp", description, factory, reactor, node, "amqp").setServiceParent(service)
    if config.listen.amqps and tls is not None:
        Listener("amqps", config.listen.amqps, tls(factory), reactor, node, "amqp/ssl", certificates).setServiceParent(
            service
        )
    plain, secure = stream_addresses(config)
    if config.listen.stream and plain is not None:
        streams = StreamServerFactory(node, reactor, plain, shell.monitor)
        Listener("stream", config.listen.stream, streams, reactor, node, "stream").setServiceParent(service)
    if config.listen.stream_tls and tls is not None and secure is not None:
        streams = StreamServerFactory(node, reactor, secure, shell.monitor)
        Listener(
            "stream_tls", config.listen.stream_tls, tls(streams), reactor, node, "stream/ssl", certificates
        ).setServiceParent(service)
    if config.listen.mqtt or config.listen.mqtt_tls or config.listen.mqtt_ws:
        _listen_mqtt(service, config, reactor, shell, tls, certificates)
    http_tls = tls if tls is not None and config.tls is not None and config.tls.http else None
    http, http_certificates = ("https", certificates) if http_tls else ("http", None)
    if config.listen.metrics:
        collector = BrokerCollector(
            node,
            shell.wal,
            config.metrics.rabbitmq_compatible,
            shovels=shell.shovels,
            monitor=shell.monitor,
            cluster=shell.cluster,
        )
        site: IProtocolFactory = metrics_site(collector, reactor)
        site = http_tls(site) if http_tls else site
        Listener(
            "metrics", config.listen.metrics, site, reactor, node, f"{http}/prometheus", http_certificates
        ).setServiceParent(service)
    if sampler is not None and config.listen.management:
        site = management_site(
            node, sampler, reactor, reports=config.ui.reports, shovels=shell.shovels, cluster=shell.cluster
        )
        site = http_tls(site) if http_tls else site
        Listener("management", config.listen.management, site, reactor, node, http, http_certificates).setServiceParent(
            service
        )


def _listen_mqtt(
    service: BrokerService,
    config: BrokerConfig,
    reactor: Any,
    shell: _Shell,
    tls: Callable[[IProtocolFactory], IProtocolFactory] | None,
    certificates: tuple[str, tuple[str, ...]] | None,
) -> None:
    """The MQTT listeners (plain, TLS and WebSockets), sharing one registry of clients and sessions."""
    factory = MqttServerFactory(MqttRegistry(shell.node, config.mqtt), shell.factory, reactor, shell.monitor)
    if config.listen.mqtt:
        Listener("mqtt", config.listen.mqtt, factory, reactor, shell.node, "mqtt").setServiceParent(service)
    if config.listen.mqtt_tls and tls is not None:
        Listener(
            "mqtt_tls", config.listen.mqtt_tls, tls(factory), reactor, shell.node, "mqtt/ssl", certificates
        ).setServiceParent(service)
    if config.listen.mqtt_ws:
        sockets = WebSocketFactory(factory)
        listener = Listener("mqtt_ws", config.listen.mqtt_ws, sockets, reactor, shell.node, "http/web-mqtt")
        listener.setServiceParent(service)


def raise_open_file_limit() -> int:
    """Raise the process's open file limit to its hard limit (each connection holds a socket);
    the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def socket_limit(open_files: int) -> int:
    """The connections ``open_files`` descriptors leave room for, less a reserve for the log's
    segments, spool and stream files, the listeners and the management API: a quarter of them,
    at most 1,024."""
    return max(open_files - min(1024, open_files // 4), 1)

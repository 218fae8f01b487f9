"""The ``postroom`` subcommands that run or check the broker on this machine: ``serve``,
``config check``, ``plugins``, and ``wal check`` and ``wal dump`` (run with the broker stopped).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from postroom.config.loader import load
from postroom.config.schema import BrokerConfig, embedded_default
from postroom.config.values import ConfigError, Problem

__all__ = ["broker_config", "serve", "list_plugins", "config_check", "wal_dir", "wal_check", "wal_dump"]


def broker_config(path: str | None) -> BrokerConfig:
    """The configuration in the file ``path``, or the embedded default without one."""
    return load(path) if path else embedded_default()


def serve(args: argparse.Namespace) -> int:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from postroom.broker.server.listeners import ListenError
    from postroom.broker.server.service import tune_gc
    from postroom.broker.wal.records import WALCorruption

    try:
        config = broker_config(args.config)
        service = broker_or_cluster_node(reactor, config, args.listen)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except WALCorruption as error:
        print(
            f"the write-ahead log is damaged: {error}\n"
            "run `postroom wal check` to see where, and `postroom wal check --repair` to drop the damaged records",
            file=sys.stderr,
        )
        return 3
    for note in config.notes:
        print(note, file=sys.stderr)
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)])
    tune_gc()
    try:
        service.startService()
    except ListenError as error:
        print(error, file=sys.stderr)
        return 1
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()
    return 0


def broker_or_cluster_node(reactor: Any, config: BrokerConfig, listen: list[str] | None) -> Any:
    """The broker service, or with a ``cluster:`` section a cluster node that starts it when
    it leads.

    :raises ConfigError: the configuration is refused
    """
    from postroom.broker.server.service import make_broker_service

    if config.cluster is None:
        return make_broker_service(reactor, config, amqp_endpoints=listen)
    from postroom.broker.cluster.service import ClusterNode

    if listen:
        raise ConfigError(config.source, [Problem(None, "--listen", "a cluster node listens where listen.amqp says")])
    return ClusterNode(
        reactor,
        config,
        lambda replication, cluster: make_broker_service(reactor, config, replication=replication, cluster=cluster),
    )


def list_plugins(args: argparse.Namespace) -> int:
    from postroom.broker.server.pluginloader import available_plugins, describe, load_plugins

    print("available:")
    for plugin in available_plugins():
        print(f"  {plugin.name:<20} {plugin.description} [{plugin.origin}]")
    try:
        config = broker_config(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"enabled by {config.source}:" if config.plugins else f"enabled by {config.source}: none")
    try:
        loaded = load_plugins(config.plugins, source=config.source)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    for line in describe(loaded.plugins):
        print(f"  {line}")
    return 0


def config_check(args: argparse.Namespace) -> int:
    from twisted.internet import reactor

    from postroom.broker.core.definitions import node_from_config
    from postroom.broker.server.pluginloader import load_plugins
    from postroom.broker.storage.streams import scratch_streams

    try:
        config = load(args.file)
        # The plugins are loaded too: their settings are checked, and their exchange types
        # may appear in the definitions.
        registry = load_plugins(config.plugins, source=config.source).registry
        with scratch_streams(reactor) as streams:
            node_from_config(config, registry=registry, streams=streams)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    queues = sum(
        len(vhost.queues) + sum(len(stream.stream_names()) for stream in vhost.streams)
        for vhost in config.vhosts.values()
    )
    exchanges = sum(
        len(vhost.exchanges) + sum(stream.partitions is not None for stream in vhost.streams)
        for vhost in config.vhosts.values()
    )
    print(f"{args.file}: ok ({len(config.vhosts)} vhost(s), {exchanges} exchange(s), {queues} queue(s))")
    if config.notes:
        print(f"{len(config.notes)} item(s) not applied, with the reason:")
        for note in config.notes:
            print(f"  {note}")
    return 0


def wal_dir(args: argparse.Namespace) -> str:
    if args.data_dir:
        return str(args.data_dir)
    return broker_config(args.config).storage.dir


def wal_check(args: argparse.Namespace) -> int:
    from postroom.broker.wal.files import DirectoryStorage
    from postroom.broker.wal.log import WriteAheadLog, check

    directory = wal_dir(args)
    if args.repair:
        from postroom.broker.storage.checkpoint import discard_checkpoint

        log = WriteAheadLog(DirectoryStorage(directory))
        report = log.open(repair=True)
        # A repair may move records a checkpoint points at: the next start reads the whole log.
        discard_checkpoint(directory)
    else:
        report = check(DirectoryStorage(directory))
    print(
        f"{directory}: {report.segments} segment(s), {report.records} record(s), {report.bytes} bytes; "
        f"torn tail: {report.truncated_bytes} bytes; damaged spans: {report.skipped_spans}"
    )
    for problem in report.problems:
        print(f"  {problem}")
    return 1 if report.problems and not args.repair else 0


def wal_dump(args: argparse.Namespace) -> int:
    from postroom.broker.wal.files import DirectoryStorage
    from postroom.broker.wal.log import dump

    for line in dump(DirectoryStorage(wal_dir(args))):
        print(line)
    return 0

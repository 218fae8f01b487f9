"""The ``postroom`` command line.

* ``postroom serve [--config PATH] [--listen ENDPOINT]``: run the broker in the foreground;
* ``postroom config check FILE``: validate a configuration without starting anything.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from config.loader import ConfigError, load
from config.schema import BrokerConfig


def _config(path: str | None) -> BrokerConfig:
    return load(path) if path else BrokerConfig()


def _serve(args: argparse.Namespace) -> int:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from broker.service import make_broker_service, tune_gc

    try:
        config = _config(args.config)
        service = make_broker_service(reactor, config, amqp_endpoints=args.listen)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)])
    tune_gc()
    service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()
    return 0


def _config_check(args: argparse.Namespace) -> int:
    from broker.core.definitions import node_from_config

    try:
        config = load(args.file)
        node_from_config(config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    queues = sum(len(vhost.queues) for vhost in config.vhosts.values())
    exchanges = sum(len(vhost.exchanges) for vhost in config.vhosts.values())
    print(f"{args.file}: ok ({len(config.vhosts)} vhost(s), {exchanges} exchange(s), {queues} queue(s))")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``postroom`` command."""
    parser = argparse.ArgumentParser(prog="postroom", description="Postroom: an AMQP 0-9-1 routing broker.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the broker in the foreground")
    serve.add_argument("--config", metavar="PATH", help="YAML configuration (default: the embedded default)")
    serve.add_argument(
        "--listen",
        action="append",
        metavar="ENDPOINT",
        help="AMQP listener as a Twisted endpoint string, instead of the configuration's; repeatable",
    )
    serve.set_defaults(run=_serve)
    config = commands.add_parser("config", help="work with configuration files")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a configuration file without starting the broker")
    check.add_argument("file")
    check.set_defaults(run=_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``postroom`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

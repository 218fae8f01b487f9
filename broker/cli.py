"""The ``postroom`` command line.

* ``postroom serve [--config PATH] [--listen ENDPOINT]``: run the broker in the foreground;
* ``postroom config check FILE``: validate a configuration without starting anything;
* ``postroom wal check [--repair]`` and ``postroom wal dump``: inspect the write-ahead log.
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
    from broker.wal.record import WALCorruption

    try:
        config = _config(args.config)
        service = make_broker_service(reactor, config, amqp_endpoints=args.listen)
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


def _wal_dir(args: argparse.Namespace) -> str:
    if args.data_dir:
        return str(args.data_dir)
    return _config(args.config).storage.dir


def _wal_check(args: argparse.Namespace) -> int:
    from broker.wal.files import DirectoryStorage
    from broker.wal.log import WriteAheadLog, check

    directory = _wal_dir(args)
    if args.repair:
        log = WriteAheadLog(DirectoryStorage(directory))
        report = log.open(repair=True)
    else:
        report = check(DirectoryStorage(directory))
    print(
        f"{directory}: {report.segments} segment(s), {report.records} record(s), {report.bytes} bytes; "
        f"torn tail: {report.truncated_bytes} bytes; damaged spans: {report.skipped_spans}"
    )
    for problem in report.problems:
        print(f"  {problem}")
    return 1 if report.problems and not args.repair else 0


def _wal_dump(args: argparse.Namespace) -> int:
    from broker.wal.files import DirectoryStorage
    from broker.wal.log import dump

    for line in dump(DirectoryStorage(_wal_dir(args))):
        print(line)
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
    wal = commands.add_parser("wal", help="inspect the write-ahead log (run with the broker stopped)")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True)
    for name, run, description in (
        ("check", _wal_check, "verify every record; --repair skips damaged spans so the broker can start"),
        ("dump", _wal_dump, "print one line per record"),
    ):
        command = wal_commands.add_parser(name, help=description)
        command.add_argument("--config", metavar="PATH", help="take storage.dir from this configuration")
        command.add_argument("--data-dir", metavar="DIR", help="the log directory (default: storage.dir)")
        if name == "check":
            command.add_argument("--repair", action="store_true", help="drop damaged spans (they are reported)")
        command.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``postroom`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

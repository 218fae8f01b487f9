"""The ``postroom`` command line: ``postroom serve`` runs the broker in the foreground."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from broker.service import DEFAULT_AMQP_ENDPOINT


def _serve(args: argparse.Namespace) -> int:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from broker.service import make_broker_service, tune_gc

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)])
    tune_gc()
    service = make_broker_service(reactor, args.listen or [DEFAULT_AMQP_ENDPOINT])
    service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``postroom`` command."""
    parser = argparse.ArgumentParser(prog="postroom", description="Postroom: an AMQP 0-9-1 routing broker.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the broker in the foreground")
    serve.add_argument(
        "--listen",
        action="append",
        metavar="ENDPOINT",
        help=f"AMQP listener as a Twisted endpoint string (default {DEFAULT_AMQP_ENDPOINT}); repeatable",
    )
    serve.set_defaults(run=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``postroom`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

"""The ``postroom`` command line.

* ``postroom serve [--config PATH] [--listen ENDPOINT]``: run the broker in the foreground;
* ``postroom config check FILE``: validate a configuration without starting anything;
* ``postroom plugins [--config PATH]``: the plugins available, and those the configuration enables;
* ``postroom wal check [--repair]`` and ``postroom wal dump``: inspect the write-ahead log;
* ``postroom publish``, ``postroom consume`` and ``postroom declare -f FILE``: talk to a running broker;
* ``postroom queues``, ``postroom policies [list|set|clear]`` and ``postroom definitions
  export``: a running broker's queues, policies and definitions, through its management API;
* ``postroom dlq inspect|redrive``: look into a dead-letter queue, move messages back;
* ``postroom dlq export`` and ``postroom dlq analyze``: the dead-letter analysis (needs the
  ``spark`` extra: ``pip install postroom[spark]``).

This module is the argument parser and :func:`main`; the subcommands are in
:mod:`broker.tools.commands` (by job), :mod:`broker.tools.ctl` and :mod:`broker.tools.migrate`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from postroom.broker.text import EscapingWriter
from postroom.broker.tools import ctl, migrate
from postroom.broker.tools.commands import administration, clustering, deadletters, messaging, serving
from postroom.broker.tools.management import DEFAULT_MANAGEMENT_URL


def _listers(
    command: argparse.ArgumentParser, subcommands: Any, description: str, run: Any, item: str
) -> list[tuple[argparse.ArgumentParser, dict[str, Any]]]:
    """A listing command (``policies``, ``streams``) and its ``list`` subcommand, both with
    ``--url``, ``--vhost`` and ``--json``; each with what its options are given besides (``list``
    leaves unset what the command before it set: ``policies --json list``)."""
    listers = [(command, {}), (subcommands.add_parser("list", help=description), {"default": argparse.SUPPRESS})]
    for lister, unset in listers:
        lister.add_argument(
            "--url",
            **({"default": DEFAULT_MANAGEMENT_URL} | unset),
            help=f"management API (default: {DEFAULT_MANAGEMENT_URL})",
        )
        lister.add_argument("--vhost", **unset, help="only this vhost")
        lister.add_argument(
            "--json", action="store_true", **unset, help=f"one JSON object per {item} instead of a table"
        )
        lister.set_defaults(run=run)
    return listers


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``postroom`` command."""
    parser = argparse.ArgumentParser(prog="postroom", description="Postroom: an AMQP 0-9-1 routing broker.")
    commands = parser.add_subparsers(dest="command", required=True)
    ctl.add_parser(commands)
    migrate.add_parser(commands, DEFAULT_MANAGEMENT_URL)
    serve = commands.add_parser("serve", help="run the broker in the foreground")
    serve.add_argument("--config", metavar="PATH", help="YAML configuration (default: the embedded default)")
    serve.add_argument(
        "--listen",
        action="append",
        metavar="ENDPOINT",
        help="AMQP listener as a Twisted endpoint string, instead of the configuration's; repeatable",
    )
    serve.set_defaults(run=serving.serve)
    config = commands.add_parser("config", help="work with configuration files")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a configuration file without starting the broker")
    check.add_argument("file")
    check.set_defaults(run=serving.config_check)
    plugins = commands.add_parser("plugins", help="list the plugins available and those a configuration enables")
    plugins.add_argument("--config", metavar="PATH", help="YAML configuration (default: the embedded default)")
    plugins.set_defaults(run=serving.list_plugins)
    publish = commands.add_parser("publish", help="publish one message and wait for its confirm")
    publish.add_argument("--url", default=messaging.DEFAULT_URL)
    publish.add_argument("--exchange", default="", help="exchange (default: the default exchange)")
    publish.add_argument("routing_key")
    publish.add_argument("body", nargs="?", help="the body (default: read from standard input)")
    publish.add_argument("--header", action="append", metavar="KEY=VALUE", help="a header; repeatable")
    publish.add_argument("--transient", action="store_true", help="delivery_mode 1 (default: persistent)")
    publish.add_argument("--mandatory", action="store_true", help="fail when no queue receives it")
    publish.set_defaults(run=messaging.publish)
    consume = commands.add_parser("consume", help="print messages as JSON lines, acking (or refusing) each")
    consume.add_argument("--url", default=messaging.DEFAULT_URL)
    consume.add_argument("queue")
    consume.add_argument("--count", type=int, default=0, help="stop after this many (default: no limit)")
    consume.add_argument("--timeout", type=float, default=5.0, help="stop after this many idle seconds")
    consume.add_argument("--mode", choices=("ack", "nack", "reject"), default="ack")
    consume.set_defaults(run=messaging.consume)
    declare = commands.add_parser(
        "declare", help="apply a YAML file's definitions, or a RabbitMQ definitions.json, to a running broker"
    )
    declare.add_argument("--url", default=messaging.DEFAULT_URL)
    declare.add_argument("-f", "--file", required=True)
    declare.set_defaults(run=messaging.declare)
    queues = commands.add_parser("queues", help="a table of queues: ready, unacked, consumers, rates")
    queues.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
    queues.add_argument("--vhost", help="only this vhost")
    queues.add_argument("--json", action="store_true", help="one JSON object per queue instead of a table")
    queues.set_defaults(run=administration.list_queues)
    policies = commands.add_parser(
        "policies", help="list (the default), set or clear policies (or --operator policies)"
    )
    policy_commands = policies.add_subparsers(dest="policies_command")
    policy_listers = _listers(
        policies, policy_commands, "the policies and what they set", administration.list_policies, "policy"
    )
    for lister, unset in policy_listers:
        lister.add_argument("--operator", action="store_true", **unset, help="operator policies instead")
    setting = policy_commands.add_parser(
        "set", help="set a policy, or replace one of that name (as rabbitmqctl set_policy)"
    )
    setting.add_argument("name")
    setting.add_argument("pattern", help="a regular expression searched for in queue and exchange names")
    setting.add_argument("definition", help='JSON, e.g. \'{"dead-letter-exchange": "dlx"}\'')
    setting.add_argument("--priority", type=int, default=0, help="the highest applies (default: %(default)s)")
    setting.add_argument("--apply-to", default="all", choices=("queues", "exchanges", "all"))
    setting.set_defaults(run=administration.set_policy)
    clearing = policy_commands.add_parser("clear", help="clear a policy (as rabbitmqctl clear_policy)")
    clearing.add_argument("name")
    clearing.set_defaults(run=administration.clear_policy)
    for changer in (setting, clearing):
        changer.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
        changer.add_argument("--vhost", default="/", help="default: %(default)s")
        changer.add_argument("--operator", action="store_true", help="an operator policy (administrators only)")
    streams = commands.add_parser(
        "streams", help="list streams and subscriptions (the default), move a subscription, add a partitioned stream"
    )
    stream_commands = streams.add_subparsers(dest="streams_command")
    _listers(
        streams,
        stream_commands,
        "streams, then subscriptions with offset and lag",
        administration.list_streams,
        "stream",
    )
    reset = stream_commands.add_parser("reset", help="move a subscription: its consumers read on from there")
    reset.add_argument("stream")
    reset.add_argument("name", help="the subscription (the consumers' x-stream-consumer-name)")
    reset.add_argument(
        "--to", required=True, help="first, last, next, an offset, or a time (ISO 8601, e.g. 2026-11-24T14:00)"
    )
    reset.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
    reset.add_argument("--vhost", default="/", help="default: %(default)s")
    reset.set_defaults(run=administration.reset_stream)
    partitioned = stream_commands.add_parser(
        "add-partitioned", help="declare a partitioned stream: exchange NAME routing by key hash onto NAME-0 ..."
    )
    partitioned.add_argument("name")
    partitioned.add_argument("--partitions", type=int, required=True)
    partitioned.add_argument("--max-age", help="retention by age, as x-max-age (7D, 12h, 30m)")
    partitioned.add_argument("--max-length-bytes", type=int, help="retention by size, per partition")
    partitioned.add_argument("--max-segment-size-bytes", type=int, help="a segment's size")
    partitioned.add_argument("--url", default=messaging.DEFAULT_URL, help="AMQP URL (default: %(default)s)")
    partitioned.set_defaults(run=messaging.add_partitioned_stream)
    definitions = commands.add_parser("definitions", help="a running broker's definitions, as RabbitMQ exports them")
    definitions_commands = definitions.add_subparsers(dest="definitions_command", required=True)
    export = definitions_commands.add_parser(
        "export", help="write the definitions for RabbitMQ to import (as rabbitmqctl export_definitions)"
    )
    export.add_argument("file", nargs="?", default="-", help="where to write them (default: standard output)")
    export.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
    export.add_argument("--config", metavar="PATH", help="the broker's configuration: its management listener")
    export.add_argument("--vhost", help="one vhost's objects only (as GET /api/definitions/VHOST)")
    export.set_defaults(run=administration.export_definitions)
    dlq = commands.add_parser("dlq", help="look into a dead-letter queue, move messages back")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    inspect = dlq_commands.add_parser("inspect", help="print messages with their x-death summary; consumes nothing")
    inspect.add_argument("--url", default=messaging.DEFAULT_URL)
    inspect.add_argument("queue")
    inspect.add_argument("--limit", type=int, default=100)
    inspect.set_defaults(run=deadletters.dlq_inspect)
    redrive = dlq_commands.add_parser("redrive", help="move dead letters back to where they died (or --to)")
    redrive.add_argument("--url", default=messaging.DEFAULT_URL)
    redrive.add_argument("queue")
    redrive.add_argument("--to", help="EXCHANGE/ROUTING_KEY, or a queue name (default: where each died)")
    redrive.add_argument("--filter", action="append", metavar="KEY=VALUE", help="e.g. reason=rejected; repeatable")
    redrive.add_argument("--limit", type=int, default=None)
    redrive.add_argument("--rate", type=float, default=None, help="at most this many moves per second")
    redrive.add_argument(
        "--ids", metavar="FILE", help="move only these dead letters (ids one per line, as `dlq analyze` lists them)"
    )
    redrive.set_defaults(run=deadletters.dlq_redrive)
    for name, run, description in (
        ("export", deadletters.dlq_export, "turn sealed dead-letter segments into Parquet (idempotent; for cron)"),
        ("analyze", deadletters.dlq_analyze, "run the Spark dead-letter analysis (local[*] by default)"),
    ):
        command = dlq_commands.add_parser(name, help=description)
        command.add_argument("--config", metavar="PATH", help="take storage.dir from this configuration")
        command.add_argument("--data-dir", metavar="DIR", help="the broker's data directory (default: storage.dir)")
        command.add_argument(
            "--parquet",
            metavar="DIR",
            help="the exported Parquet (default: DATA_DIR/deadletters-parquet, DATA_DIR/streams-parquet/VHOST/NAME)",
        )
        command.add_argument(
            "--stream", metavar="NAME", help="read this stream (a dead-letter exchange feeds it) instead of the events"
        )
        command.add_argument("--vhost", default="/", help="with --stream: its vhost (default: %(default)s)")
        command.add_argument(
            "--from", dest="start", metavar="OFFSET|TIME", help="with --stream: from this offset or ISO 8601 time"
        )
        command.add_argument("--to", dest="stop", metavar="OFFSET|TIME", help="with --stream: up to, not including")
        if name == "export":
            command.add_argument(
                "--include-last", action="store_true", help="export the last segment too (the broker is stopped)"
            )
            command.add_argument(
                "--jobs",
                type=deadletters.positive,
                default=deadletters.EXPORT_JOBS,
                metavar="N",
                help="segments exported at once, one process each (default: %(default)s, half the cores)",
            )
            command.add_argument(
                "--delete-exported",
                action="store_true",
                help="then delete the sealed segment files that are exported (never the newest one)",
            )
            command.add_argument(
                "--retention",
                type=deadletters.duration,
                metavar="DURATION",
                help="then delete exported days older than this (e.g. 90d), and their segment files",
            )
        else:
            command.add_argument("--out", required=True, metavar="DIR", help="where the results go")
            command.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
            command.add_argument("--redrive-where", metavar="EXPR", help="write OUT/redrive.txt: pending ones matching")
            command.add_argument("--redrive-all", action="store_true", help="write OUT/redrive.txt: every pending one")
            command.add_argument(
                "--rows", action="store_true", help="also write OUT/dead_letters: one row per dead letter (Parquet)"
            )
        command.set_defaults(run=run)
    cluster = commands.add_parser("cluster", help="a cluster's state in etcd; take a node out of it")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    cluster_status = cluster_commands.add_parser("status", help="the leader, the nodes and the in-sync set")
    cluster_status.add_argument("--json", action="store_true", help="one JSON object")
    cluster_forget = cluster_commands.add_parser(
        "forget", help="take a node that is gone for good out of the in-sync set (refused while it runs)"
    )
    cluster_forget.add_argument("name", help="the node's cluster.name")
    for command, run in ((cluster_status, clustering.status), (cluster_forget, clustering.forget)):
        command.add_argument("--config", metavar="PATH", required=True, help="a node's configuration (its cluster:)")
        command.set_defaults(run=run)
    wal = commands.add_parser("wal", help="inspect the write-ahead log (run with the broker stopped)")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True)
    for name, run, description in (
        ("check", serving.wal_check, "verify every record; --repair skips damaged spans so the broker can start"),
        ("dump", serving.wal_dump, "print one line per record"),
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
    # Names, reply texts and header values from the broker or a file are printed: none of
    # their control characters reaches the terminal (broker.text).
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingWriter(out), EscapingWriter(err)  # type: ignore[assignment]
    try:
        return int(args.run(args))
    finally:
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    sys.exit(main())

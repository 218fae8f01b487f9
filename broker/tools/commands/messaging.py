"""The ``postroom`` subcommands that talk AMQP 0-9-1 to a running broker: ``publish``,
``consume``, ``declare -f FILE`` and ``streams add-partitioned``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from postroom.config.loader import load
from postroom.config.schema import BindingConfig, BrokerConfig, ExchangeConfig, QueueConfig, StreamConfig
from postroom.config.values import ConfigError

__all__ = ["DEFAULT_URL", "publish", "consume", "declare", "add_partitioned_stream"]

#: The AMQP URL of a broker on its embedded default.
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def publish(args: argparse.Namespace) -> int:
    from postroom.broker.clients.client import ClientError, connect

    body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
    headers = {}
    for item in args.header or []:
        key, _, value = item.partition("=")
        headers[key] = value
    try:
        with connect(args.url) as conn:
            conn.publish(
                args.exchange,
                args.routing_key,
                body,
                headers=headers or None,
                persistent=not args.transient,
                mandatory=args.mandatory,
            )
    except ClientError as error:
        print(f"postroom publish: {error}", file=sys.stderr)
        return 1
    print(f"published {len(body)} bytes to exchange {args.exchange!r} with routing key {args.routing_key!r}")
    return 0


def consume(args: argparse.Namespace) -> int:
    import base64
    import json

    from postroom.broker.clients.client import ClientError, connect

    try:
        with connect(args.url) as conn:
            seen = 0
            for message in conn.consume(args.queue, prefetch=min(args.count, 1000) or 100, timeout=args.timeout):
                try:
                    body: object = message.body.decode("utf-8")
                    encoding = "utf-8"
                except UnicodeDecodeError:
                    body, encoding = base64.b64encode(message.body).decode(), "base64"
                record = {
                    "exchange": message.exchange,
                    "routing_key": message.routing_key,
                    "redelivered": message.redelivered,
                    "delivery_count": message.delivery_count,
                    "headers": message.headers,
                    "body": body,
                    "body_encoding": encoding,
                }
                print(json.dumps(record, default=str), flush=True)
                {"ack": message.ack, "nack": message.nack, "reject": message.reject}[args.mode]()
                seen += 1
                if args.count and seen >= args.count:
                    break
    except ClientError as error:
        print(f"postroom consume: {error}", file=sys.stderr)
        return 1
    return 0


def declare(args: argparse.Namespace) -> int:
    from postroom.broker.clients.client import ClientError, connect

    try:
        config = load(args.file)
        with connect(args.url) as conn:
            definitions = config.vhosts.get(conn.vhost)
            if definitions is None:
                print(f"{args.file}: nothing is defined for vhost {conn.vhost!r}", file=sys.stderr)
                return 1
            counts = _declare_items(conn, (item for _where, item in definitions.declarations("")))
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except ClientError as error:
        print(f"postroom declare: {error}", file=sys.stderr)
        return 1
    print(f"declared {counts[0]} exchange(s), {counts[1]} queue(s), {counts[2]} binding(s) on vhost {conn.vhost!r}")
    for vhost in config.vhosts:
        if vhost != conn.vhost:
            print(f"{args.file}: vhost {vhost!r} not applied: run again with it in --url", file=sys.stderr)
    if config.users != BrokerConfig().users:
        print(
            f"{args.file}: users and permissions are applied when the broker starts with this file"
            " (postroom serve --config) or with postroom ctl (add_user, set_permissions ...), not over AMQP",
            file=sys.stderr,
        )
    if definitions.policies or definitions.operator_policies:
        print(
            f"{args.file}: policies are applied when the broker starts with this file"
            " (postroom serve --config) or with postroom policies set, not over AMQP",
            file=sys.stderr,
        )
    for note in config.notes:
        print(note, file=sys.stderr)
    return 0


def _declare_items(conn: Any, items: Iterable[ExchangeConfig | QueueConfig | BindingConfig]) -> tuple[int, int, int]:
    """Declare ``items`` over the AMQP connection ``conn``, in order; how many exchanges,
    queues and bindings that was."""
    counts = [0, 0, 0]
    for item in items:
        if isinstance(item, ExchangeConfig):
            conn.declare_exchange(item.name, item.type, **item.options())
            counts[0] += 1
        elif isinstance(item, QueueConfig):
            conn.declare_queue(item.name, **item.options())
            counts[1] += 1
        elif item.queue is not None:
            conn.bind(item.queue, item.exchange, item.routing_key, item.arguments)
            counts[2] += 1
        else:
            assert item.destination_exchange is not None
            conn.bind_exchange(item.destination_exchange, item.exchange, item.routing_key, item.arguments)
            counts[2] += 1
    return counts[0], counts[1], counts[2]


def add_partitioned_stream(args: argparse.Namespace) -> int:
    """``postroom streams add-partitioned NAME --partitions N``: declare a partitioned stream
    over AMQP, as the YAML's ``streams:`` entry of the same settings would."""
    from postroom.broker.clients.client import ClientError, connect

    stream = StreamConfig(
        args.name,
        partitions=args.partitions,
        max_age=args.max_age,
        max_length_bytes=args.max_length_bytes,
        max_segment_size_bytes=args.max_segment_size_bytes,
    )
    try:
        with connect(args.url) as conn:
            _declare_items(conn, stream.declarations())
    except ClientError as error:
        print(f"postroom streams add-partitioned: {error}", file=sys.stderr)
        return 1
    print(f"partitioned stream {args.name!r}: exchange {args.name!r}, streams {', '.join(stream.stream_names())}")
    return 0

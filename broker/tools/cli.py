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
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from broker.text import EscapingWriter, printable
from broker.tools import ctl, migrate
from config.loader import load
from config.schema import BindingConfig, BrokerConfig, ExchangeConfig, QueueConfig, StreamConfig, embedded_default
from config.values import ConfigError


def _config(path: str | None) -> BrokerConfig:
    return load(path) if path else embedded_default()


def _serve(args: argparse.Namespace) -> int:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from broker.server.service import ListenError, make_broker_service, tune_gc
    from broker.wal.records import WALCorruption

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


def _plugins(args: argparse.Namespace) -> int:
    from broker.server.pluginloader import available_plugins, describe, load_plugins

    print("available:")
    for plugin in available_plugins():
        print(f"  {plugin.name:<20} {plugin.description} [{plugin.origin}]")
    try:
        config = _config(args.config)
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


def _config_check(args: argparse.Namespace) -> int:
    from twisted.internet import reactor

    from broker.core.definitions import node_from_config
    from broker.server.pluginloader import load_plugins
    from broker.storage.streams import scratch_streams

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


def _wal_dir(args: argparse.Namespace) -> str:
    if args.data_dir:
        return str(args.data_dir)
    return _config(args.config).storage.dir


def _wal_check(args: argparse.Namespace) -> int:
    from broker.wal.files import DirectoryStorage
    from broker.wal.log import WriteAheadLog, check

    directory = _wal_dir(args)
    if args.repair:
        from broker.storage.checkpoint import discard_checkpoint

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


def _wal_dump(args: argparse.Namespace) -> int:
    from broker.wal.files import DirectoryStorage
    from broker.wal.log import dump

    for line in dump(DirectoryStorage(_wal_dir(args))):
        print(line)
    return 0


DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


#: The management API of a broker on its embedded default.
DEFAULT_MANAGEMENT_URL = "http://guest:guest@127.0.0.1:15672/"


def management_get(url: str, path: str, timeout: float = 10.0) -> object:
    """GET ``path`` (e.g. ``/api/queues``) from the management API at ``url`` (credentials in the URL).

    :raises OSError: the broker cannot be reached, or answered with an error status
    """
    return management_request(url, path, timeout=timeout)


def management_request(url: str, path: str, method: str = "GET", body: object = None, timeout: float = 10.0) -> object:
    """Send ``method`` to ``path`` of the management API at ``url`` (credentials in the URL),
    with ``body`` as JSON; the answer's JSON (``None`` for an empty answer).

    :raises OSError: the broker cannot be reached, or answered with an error status (the
        message has the status and RabbitMQ's ``reason``)
    """
    status, answer, where = management_call(url, path, method, body, timeout)
    if status >= 400:
        reason = answer.get("reason", answer) if isinstance(answer, dict) else answer
        raise OSError(f"{method} {where}: HTTP {status}: {reason}")
    return answer


def management_call(
    url: str,
    path: str,
    method: str = "GET",
    body: object = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, object, str]:
    """Send ``method`` to ``path`` of the management API at ``url`` (credentials in the URL):
    the answer's status, its JSON (``None`` when empty; the text when not JSON) and the URL asked.

    :raises OSError: the broker cannot be reached
    """
    import base64
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    base = f"{parts.scheme or 'http'}://{host}:{parts.port or 15672}"
    credentials = f"{urllib.parse.unquote(parts.username or 'guest')}:{urllib.parse.unquote(parts.password or 'guest')}"
    sent = {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode(), **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    request = urllib.request.Request(base + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None, base + path
    except ValueError:
        return status, raw.decode("utf-8", "replace"), base + path


def _listing(args: argparse.Namespace, command: str, kind: str) -> list[dict[str, object]] | int:
    """The objects ``GET /api/KIND[/VHOST]`` lists, for a table; or, when there is nothing more
    to do, the exit status: 0 once they were printed as JSON lines (``--json``), 1 when the
    request failed (said on stderr)."""
    import json
    import urllib.parse

    path = f"/api/{kind}" + (f"/{urllib.parse.quote(args.vhost, safe='')}" if args.vhost else "")
    try:
        items = management_get(args.url, path)
    except OSError as error:
        print(f"postroom {command}: {error}", file=sys.stderr)
        return 1
    assert isinstance(items, list)
    if args.json:
        for item in items:
            print(json.dumps(item, default=str))
        return 0
    return items


def _queues(args: argparse.Namespace) -> int:
    queues = _listing(args, "queues", "queues")
    if isinstance(queues, int):
        return queues
    columns = (
        "vhost",
        "name",
        "ready",
        "unacked",
        "consumers",
        "active",
        "publish/s",
        "deliver/s",
        "dead-lettered",
        "policy",
    )
    rows = [columns]
    for queue in queues:
        stats = queue["message_stats"]
        policies = [name for name in (queue.get("policy"), queue.get("operator_policy")) if name]
        rows.append(
            (
                printable(queue["vhost"]),
                printable(queue["name"]),
                str(queue["messages_ready"]),
                str(queue["messages_unacknowledged"]),
                str(queue["consumers"]),
                printable(queue.get("single_active_consumer_tag") or "-"),
                f"{stats['publish_details']['rate']:.1f}",
                f"{stats['deliver_get_details']['rate']:.1f}",
                str(sum(queue["dead_lettered"].values())),
                printable("+".join(policies)) or "-",
            )
        )
    _print_table(rows, left=(0, 1, 5, 9))
    return 0


def _print_table(rows: list[tuple[str, ...]], left: tuple[int, ...]) -> None:
    """``rows`` in aligned columns: those in ``left`` to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


def _policies(args: argparse.Namespace) -> int:
    import json

    policies = _listing(args, "policies", "operator-policies" if args.operator else "policies")
    if isinstance(policies, int):
        return policies
    rows = [("vhost", "name", "pattern", "apply-to", "priority", "definition")]
    for policy in policies:
        rows.append(
            (
                printable(policy["vhost"]),
                printable(policy["name"]),
                printable(policy["pattern"]),
                policy["apply-to"],
                str(policy["priority"]),
                printable(json.dumps(policy["definition"], sort_keys=True)),
            )
        )
    _print_table(rows, left=(0, 1, 2, 3, 5))
    return 0


def _policy_set(args: argparse.Namespace) -> int:
    """``postroom policies set NAME PATTERN DEFINITION``, as ``rabbitmqctl set_policy``."""
    import json

    try:
        definition = json.loads(args.definition)
    except ValueError as error:
        print(f"postroom policies set: the definition is not JSON: {error}", file=sys.stderr)
        return 2
    body = {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": args.apply_to}
    return _policy_change(args, "set", "PUT", body)


def _policy_clear(args: argparse.Namespace) -> int:
    """``postroom policies clear NAME``, as ``rabbitmqctl clear_policy``."""
    return _policy_change(args, "clear", "DELETE")


def _policy_change(args: argparse.Namespace, verb: str, method: str, body: object = None) -> int:
    import urllib.parse

    kind = "operator-policies" if args.operator else "policies"
    path = f"/api/{kind}/{urllib.parse.quote(args.vhost, safe='')}/{urllib.parse.quote(args.name, safe='')}"
    try:
        management_request(args.url, path, method, body)
    except OSError as error:
        print(f"postroom policies {verb}: {error}", file=sys.stderr)
        return 1
    done = "set" if verb == "set" else "cleared"
    print(f"{'operator policy' if args.operator else 'policy'} {args.name!r} {done} on vhost {args.vhost!r}")
    return 0


def _definitions_export(args: argparse.Namespace) -> int:
    """``postroom definitions export [FILE]``: the broker's definitions as RabbitMQ's export
    has them (``rabbitmqctl export_definitions``), from the management API."""
    import json
    import urllib.parse

    path = "/api/definitions" + (f"/{urllib.parse.quote(args.vhost, safe='')}" if args.vhost else "")
    try:
        document = management_get(migrate.api_url(args), path)
    except migrate.Failed as failed:
        print(f"postroom definitions export: {failed}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"postroom definitions export: {error}", file=sys.stderr)
        return 1
    text = json.dumps(document, indent=2, default=str) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
        return 0
    with open(args.file, "w", encoding="utf-8") as out:
        out.write(text)
    print(f"definitions written to {args.file}", file=sys.stderr)
    return 0


def _publish(args: argparse.Namespace) -> int:
    from broker.clients.client import ClientError, connect

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


def _consume(args: argparse.Namespace) -> int:
    import base64
    import json

    from broker.clients.client import ClientError, connect

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


def _streams(args: argparse.Namespace) -> int:
    """``postroom streams``: each stream, then its subscriptions (offset and lag), then the
    stream protocol's publishers and consumers. With ``--json``, one object per stream, its
    stream-protocol publishers and consumers in it (``stream_publishers``,
    ``stream_consumers``: as ``/api/stream/...`` shows them)."""
    if args.json:
        return _streams_json(args)
    streams = _listing(args, "streams", "streams")
    if isinstance(streams, int):
        return streams
    rows = [("vhost", "name", "messages", "bytes", "segments", "first", "next", "retention", "partition")]
    subscriptions = [("vhost", "stream", "subscription", "offset", "lag", "consumers", "active")]
    for stream in streams:
        retention = []
        if stream["max_length_bytes"] is not None:
            retention.append(f"{stream['max_length_bytes']} bytes")
        if stream["max_age_seconds"] is not None:
            retention.append(f"{stream['max_age_seconds']:g} s")
        partition = stream["partition"]
        rows.append(
            (
                printable(stream["vhost"]),
                printable(stream["name"]),
                str(stream["messages"]),
                str(stream["bytes"]),
                str(stream["segments"]),
                str(stream["first_offset"]),
                str(stream["next_offset"]),
                ", ".join(retention) or "-",
                printable(f"{partition['exchange']}[{partition['order']}]") if partition else "-",
            )
        )
        for each in stream["subscriptions"]:
            subscriptions.append(
                (
                    printable(stream["vhost"]),
                    printable(stream["name"]),
                    printable(each["name"]),
                    str(each["offset"]) if each["offset"] is not None else "-",
                    str(each["lag"]),
                    str(each["consumers"]),
                    printable(each["active"] or "-"),
                )
            )
    _print_table(rows, left=(0, 1, 7, 8))
    if len(subscriptions) > 1:
        print()
        _print_table(subscriptions, left=(0, 1, 2, 6))
    return _stream_protocol_users(args)


def _streams_json(args: argparse.Namespace) -> int:
    import json
    import urllib.parse

    where = f"/{urllib.parse.quote(args.vhost, safe='')}" if args.vhost else ""
    try:
        streams, publishers, consumers = (
            management_get(args.url, f"/api/{kind}{where}")
            for kind in ("streams", "stream/publishers", "stream/consumers")
        )
    except OSError as error:
        print(f"postroom streams: {error}", file=sys.stderr)
        return 1
    assert isinstance(streams, list) and isinstance(publishers, list) and isinstance(consumers, list)
    for stream in streams:
        place = {"name": stream["name"], "vhost": stream["vhost"]}
        stream["stream_publishers"] = [each for each in publishers if each["queue"] == place]
        stream["stream_consumers"] = [each for each in consumers if each["queue"] == place]
        print(json.dumps(stream, default=str))
    return 0


def _stream_protocol_users(args: argparse.Namespace) -> int:
    """The stream protocol's publishers and consumers (``/api/stream/...``), when there are any."""
    publishers = _listing(args, "streams", "stream/publishers")
    consumers = _listing(args, "streams", "stream/consumers")
    if isinstance(publishers, int) or isinstance(consumers, int):
        return 1
    fields = ["publisher_id", "reference", "published", "confirmed", "errored"]
    _print_users(publishers, ["publisher", "reference", "published", "confirmed", "errored"], fields, (4,))
    fields = ["subscription_id", "offset", "offset_lag", "consumed", "credits", "active"]
    _print_users(consumers, ["subscription", "offset", "lag", "consumed", "credits", "active"], fields, (8,))
    return 0


def _print_users(items: list[dict[str, object]], titles: list[str], fields: list[str], left: tuple[int, ...]) -> None:
    """A table of stream-protocol publishers or consumers: their stream and connection, then
    ``fields`` under ``titles`` (text columns in ``left`` besides the first three)."""
    rows = [("vhost", "stream", "connection", *titles)]
    for each in items:
        queue, connection = each["queue"], each["connection_details"]
        assert isinstance(queue, dict) and isinstance(connection, dict)
        values = [each[field] for field in fields]
        shown = ["yes" if v is True else "no" if v is False else printable(str(v)) if v != "" else "-" for v in values]
        rows.append((printable(queue["vhost"]), printable(queue["name"]), printable(connection["name"]), *shown))
    if len(rows) > 1:
        print()
        _print_table(rows, left=(0, 1, 2, *left))


def _stream_reset(args: argparse.Namespace) -> int:
    """``postroom streams reset STREAM NAME --to WHERE``: move a subscription."""
    import urllib.parse

    where: object = args.to
    if args.to.lstrip("-").isdigit():
        where = int(args.to)
    quote = urllib.parse.quote
    path = (
        f"/api/streams/{quote(args.vhost, safe='')}/{quote(args.stream, safe='')}"
        f"/subscriptions/{quote(args.name, safe='')}"
    )
    try:
        answer = management_request(args.url, path, "PUT", {"to": where})
    except OSError as error:
        print(f"postroom streams reset: {error}", file=sys.stderr)
        return 1
    assert isinstance(answer, dict)
    print(f"subscription {args.name!r} of stream {args.stream!r} reads on from offset {answer['offset']}")
    return 0


def _stream_add_partitioned(args: argparse.Namespace) -> int:
    """``postroom streams add-partitioned NAME --partitions N``: declare a partitioned stream
    over AMQP, as the YAML's ``streams:`` entry of the same settings would."""
    from broker.clients.client import ClientError, connect

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


def _declare(args: argparse.Namespace) -> int:
    from broker.clients.client import ClientError, connect

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


def _dlq_inspect(args: argparse.Namespace) -> int:
    import json

    from broker.clients.client import ClientError, connect
    from broker.tools.dlq import inspect, summary

    try:
        with connect(args.url) as conn:
            for message in inspect(conn, args.queue, args.limit):
                print(json.dumps(summary(message), default=str))
    except ClientError as error:
        print(f"postroom dlq inspect: {error}", file=sys.stderr)
        return 1
    return 0


def _dlq_redrive(args: argparse.Namespace) -> int:
    from broker.clients.client import ClientError, connect
    from broker.tools.dlq import read_ids, redrive

    filters = {}
    for item in args.filter or []:
        key, _, value = item.partition("=")
        filters[key] = value
    ids = None
    if args.ids:
        try:
            ids = read_ids(args.ids)
        except (OSError, ValueError) as error:
            print(f"postroom dlq redrive: {error}", file=sys.stderr)
            return 2
    progress = sys.stderr.isatty()

    def report(moved: int) -> None:
        if progress:
            # A carriage return of the program's own, past the escaping.
            print(f"\rmoved {moved}", end="", file=getattr(sys.stderr, "stream", sys.stderr), flush=True)

    try:
        with connect(args.url) as conn:
            done = redrive(
                conn, args.queue, to=args.to, filters=filters, limit=args.limit, rate=args.rate, on_move=report, ids=ids
            )
    except ClientError as error:
        print(f"postroom dlq redrive: {printable(str(error))}", file=sys.stderr)
        return 1
    if progress:
        print(file=sys.stderr)
    by_reason: dict[str, int] = {}
    for item in done.moved:
        by_reason[item.reason] = by_reason.get(item.reason, 0) + 1
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items())) or "none"
    print(f"moved {len(done.moved)} message(s) out of {args.queue!r} ({printable(reasons)})")
    if not done.refused:
        return 0
    refusals: dict[str, int] = {}
    for refused in done.refused:
        refusals[refused.reason] = refusals.get(refused.reason, 0) + 1
    print(f"postroom dlq redrive: left {len(done.refused)} message(s) in {args.queue!r}:", file=sys.stderr)
    for reason, count in sorted(refusals.items()):
        print(f"  {count}: {reason}", file=sys.stderr)
    return 1


def _dead_letter_dir(args: argparse.Namespace) -> str:
    from broker.storage.deadletters import DEAD_LETTER_DIR

    return os.path.join(_wal_dir(args), DEAD_LETTER_DIR)


def _parquet_dir(args: argparse.Namespace) -> str:
    if args.parquet:
        return str(args.parquet)
    if args.stream:
        from urllib.parse import quote

        return os.path.join(_wal_dir(args), "streams-parquet", quote(args.vhost, safe=""), quote(args.stream, safe=""))
    return os.path.join(_wal_dir(args), "deadletters-parquet")


def _stream_selection(args: argparse.Namespace, command: str) -> Any:
    """With ``--stream``: the stream, vhost and ``--from``/``--to`` as a ``spark.streams.Selection``
    (``None`` without); ``False`` after saying what is wrong with a bound."""
    if not args.stream:
        return None
    from spark.streams import Selection

    try:
        return Selection(args.vhost, args.stream).bounded(args.start, args.stop)
    except ValueError as error:
        print(f"postroom dlq {command}: {error}", file=sys.stderr)
        return False


def _dlq_export(args: argparse.Namespace) -> int:
    import time
    from datetime import datetime, timezone

    try:
        from spark.export import expire, export
    except ImportError as error:
        print(f"postroom dlq export needs the spark extra (pip install postroom[spark]): {error}", file=sys.stderr)
        return 2

    def progress(segment: int, rows: int) -> None:
        print(f"segment {segment}: {rows} event(s)", file=sys.stderr, flush=True)

    selection = _stream_selection(args, "export")
    if selection is False:
        return 2
    segments, parquet = _dead_letter_dir(args), _parquet_dir(args)
    if selection is not None:
        from spark.streams import stream_segments

        found = stream_segments(_wal_dir(args), args.vhost, args.stream)
        if not found:
            print(f"postroom dlq export: no stream {args.stream!r} in vhost {args.vhost!r} here", file=sys.stderr)
            return 1
        segments = os.path.dirname(found[0][1])
    try:
        report = export(
            segments,
            parquet,
            include_last=args.include_last,
            on_segment=progress,
            jobs=args.jobs,
            delete_exported=args.delete_exported,
            stream=selection,
        )
    except OSError as error:
        print(f"postroom dlq export: {error}", file=sys.stderr)
        return 1
    print(
        f"exported {len(report.exported)} segment(s) ({report.rows} event(s), {report.corrupt_records} corrupt, "
        f"{report.files} file(s)); {len(report.skipped)} already exported"
    )
    if args.retention is not None:
        cutoff = datetime.fromtimestamp(time.time() - args.retention, timezone.utc).strftime("%Y-%m-%d")
        try:
            expired = expire(segments, parquet, cutoff)
        except OSError as error:
            print(f"postroom dlq export: --retention: {error}", file=sys.stderr)
            return 1
        print(
            f"expired {len(expired.dates)} day(s) before {cutoff} and {len(expired.segments)} segment(s) "
            "exported in them"
        )
    return 0


#: ``dlq export`` worker processes by default: half the cores, so that an export from cron
#: beside a running broker leaves it the rest.
EXPORT_JOBS = max(1, (os.cpu_count() or 2) // 2)


def _duration(text: str) -> float:
    from config.values import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def _dlq_analyze(args: argparse.Namespace) -> int:
    try:
        from spark.job import main as job
    except ImportError as error:
        print(f"postroom dlq analyze needs the spark extra (pip install postroom[spark]): {error}", file=sys.stderr)
        return 2
    selection = _stream_selection(args, "analyze")
    if selection is False:
        return 2
    argv = ["--out", args.out]
    if selection is not None:
        argv += ["--stream", args.stream, "--vhost", args.vhost, "--data-dir", _wal_dir(args)]
        argv += [*(["--from", args.start] if args.start else []), *(["--to", args.stop] if args.stop else [])]
    else:
        argv += ["--segments", _dead_letter_dir(args)]
    argv += ["--master", args.master]
    parquet = _parquet_dir(args)
    if os.path.isdir(parquet) or args.parquet:
        argv += ["--input", parquet]
    if args.redrive_where:
        argv += ["--redrive-where", args.redrive_where]
    if args.redrive_all:
        argv.append("--redrive-all")
    if args.rows:
        argv.append("--rows")
    return job(argv)


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
    serve.set_defaults(run=_serve)
    config = commands.add_parser("config", help="work with configuration files")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a configuration file without starting the broker")
    check.add_argument("file")
    check.set_defaults(run=_config_check)
    plugins = commands.add_parser("plugins", help="list the plugins available and those a configuration enables")
    plugins.add_argument("--config", metavar="PATH", help="YAML configuration (default: the embedded default)")
    plugins.set_defaults(run=_plugins)
    publish = commands.add_parser("publish", help="publish one message and wait for its confirm")
    publish.add_argument("--url", default=DEFAULT_URL)
    publish.add_argument("--exchange", default="", help="exchange (default: the default exchange)")
    publish.add_argument("routing_key")
    publish.add_argument("body", nargs="?", help="the body (default: read from standard input)")
    publish.add_argument("--header", action="append", metavar="KEY=VALUE", help="a header; repeatable")
    publish.add_argument("--transient", action="store_true", help="delivery_mode 1 (default: persistent)")
    publish.add_argument("--mandatory", action="store_true", help="fail when no queue receives it")
    publish.set_defaults(run=_publish)
    consume = commands.add_parser("consume", help="print messages as JSON lines, acking (or refusing) each")
    consume.add_argument("--url", default=DEFAULT_URL)
    consume.add_argument("queue")
    consume.add_argument("--count", type=int, default=0, help="stop after this many (default: no limit)")
    consume.add_argument("--timeout", type=float, default=5.0, help="stop after this many idle seconds")
    consume.add_argument("--mode", choices=("ack", "nack", "reject"), default="ack")
    consume.set_defaults(run=_consume)
    declare = commands.add_parser(
        "declare", help="apply a YAML file's definitions, or a RabbitMQ definitions.json, to a running broker"
    )
    declare.add_argument("--url", default=DEFAULT_URL)
    declare.add_argument("-f", "--file", required=True)
    declare.set_defaults(run=_declare)
    queues = commands.add_parser("queues", help="a table of queues: ready, unacked, consumers, rates")
    queues.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
    queues.add_argument("--vhost", help="only this vhost")
    queues.add_argument("--json", action="store_true", help="one JSON object per queue instead of a table")
    queues.set_defaults(run=_queues)
    policies = commands.add_parser(
        "policies", help="list (the default), set or clear policies (or --operator policies)"
    )
    policy_commands = policies.add_subparsers(dest="policies_command")
    for lister, unset in _listers(policies, policy_commands, "the policies and what they set", _policies, "policy"):
        lister.add_argument("--operator", action="store_true", **unset, help="operator policies instead")
    setting = policy_commands.add_parser(
        "set", help="set a policy, or replace one of that name (as rabbitmqctl set_policy)"
    )
    setting.add_argument("name")
    setting.add_argument("pattern", help="a regular expression searched for in queue and exchange names")
    setting.add_argument("definition", help='JSON, e.g. \'{"dead-letter-exchange": "dlx"}\'')
    setting.add_argument("--priority", type=int, default=0, help="the highest applies (default: %(default)s)")
    setting.add_argument("--apply-to", default="all", choices=("queues", "exchanges", "all"))
    setting.set_defaults(run=_policy_set)
    clearing = policy_commands.add_parser("clear", help="clear a policy (as rabbitmqctl clear_policy)")
    clearing.add_argument("name")
    clearing.set_defaults(run=_policy_clear)
    for changer in (setting, clearing):
        changer.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
        changer.add_argument("--vhost", default="/", help="default: %(default)s")
        changer.add_argument("--operator", action="store_true", help="an operator policy (administrators only)")
    streams = commands.add_parser(
        "streams", help="list streams and subscriptions (the default), move a subscription, add a partitioned stream"
    )
    stream_commands = streams.add_subparsers(dest="streams_command")
    _listers(streams, stream_commands, "streams, then subscriptions with offset and lag", _streams, "stream")
    reset = stream_commands.add_parser("reset", help="move a subscription: its consumers read on from there")
    reset.add_argument("stream")
    reset.add_argument("name", help="the subscription (the consumers' x-stream-consumer-name)")
    reset.add_argument(
        "--to", required=True, help="first, last, next, an offset, or a time (ISO 8601, e.g. 2026-11-24T14:00)"
    )
    reset.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
    reset.add_argument("--vhost", default="/", help="default: %(default)s")
    reset.set_defaults(run=_stream_reset)
    partitioned = stream_commands.add_parser(
        "add-partitioned", help="declare a partitioned stream: exchange NAME routing by key hash onto NAME-0 ..."
    )
    partitioned.add_argument("name")
    partitioned.add_argument("--partitions", type=int, required=True)
    partitioned.add_argument("--max-age", help="retention by age, as x-max-age (7D, 12h, 30m)")
    partitioned.add_argument("--max-length-bytes", type=int, help="retention by size, per partition")
    partitioned.add_argument("--max-segment-size-bytes", type=int, help="a segment's size")
    partitioned.add_argument("--url", default=DEFAULT_URL, help="AMQP URL (default: %(default)s)")
    partitioned.set_defaults(run=_stream_add_partitioned)
    definitions = commands.add_parser("definitions", help="a running broker's definitions, as RabbitMQ exports them")
    definitions_commands = definitions.add_subparsers(dest="definitions_command", required=True)
    export = definitions_commands.add_parser(
        "export", help="write the definitions for RabbitMQ to import (as rabbitmqctl export_definitions)"
    )
    export.add_argument("file", nargs="?", default="-", help="where to write them (default: standard output)")
    export.add_argument("--url", default=DEFAULT_MANAGEMENT_URL, help="management API (default: %(default)s)")
    export.add_argument("--config", metavar="PATH", help="the broker's configuration: its management listener")
    export.add_argument("--vhost", help="one vhost's objects only (as GET /api/definitions/VHOST)")
    export.set_defaults(run=_definitions_export)
    dlq = commands.add_parser("dlq", help="look into a dead-letter queue, move messages back")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    inspect = dlq_commands.add_parser("inspect", help="print messages with their x-death summary; consumes nothing")
    inspect.add_argument("--url", default=DEFAULT_URL)
    inspect.add_argument("queue")
    inspect.add_argument("--limit", type=int, default=100)
    inspect.set_defaults(run=_dlq_inspect)
    redrive = dlq_commands.add_parser("redrive", help="move dead letters back to where they died (or --to)")
    redrive.add_argument("--url", default=DEFAULT_URL)
    redrive.add_argument("queue")
    redrive.add_argument("--to", help="EXCHANGE/ROUTING_KEY, or a queue name (default: where each died)")
    redrive.add_argument("--filter", action="append", metavar="KEY=VALUE", help="e.g. reason=rejected; repeatable")
    redrive.add_argument("--limit", type=int, default=None)
    redrive.add_argument("--rate", type=float, default=None, help="at most this many moves per second")
    redrive.add_argument(
        "--ids", metavar="FILE", help="move only these dead letters (ids one per line, as `dlq analyze` lists them)"
    )
    redrive.set_defaults(run=_dlq_redrive)
    for name, run, description in (
        ("export", _dlq_export, "turn sealed dead-letter segments into Parquet (idempotent; for cron)"),
        ("analyze", _dlq_analyze, "run the Spark dead-letter analysis (local[*] by default)"),
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
                type=_positive,
                default=EXPORT_JOBS,
                metavar="N",
                help=f"segments exported at once, one process each (default: {EXPORT_JOBS}, half the cores)",
            )
            command.add_argument(
                "--delete-exported",
                action="store_true",
                help="then delete the sealed segment files that are exported (never the newest one)",
            )
            command.add_argument(
                "--retention",
                type=_duration,
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

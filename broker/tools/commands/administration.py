"""The ``postroom`` subcommands that look after a running broker through its management API:
``queues``, ``policies [list|set|clear]``, ``streams [list|reset]`` and ``definitions export``.
"""

from __future__ import annotations

import argparse
import sys

from postroom.broker.text import printable
from postroom.broker.tools import migrate
from postroom.broker.tools.management import management_get, management_request

__all__ = [
    "list_queues",
    "list_policies",
    "set_policy",
    "clear_policy",
    "export_definitions",
    "list_streams",
    "reset_stream",
]


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


def list_queues(args: argparse.Namespace) -> int:
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


def list_policies(args: argparse.Namespace) -> int:
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


def set_policy(args: argparse.Namespace) -> int:
    """``postroom policies set NAME PATTERN DEFINITION``, as ``rabbitmqctl set_policy``."""
    import json

    try:
        definition = json.loads(args.definition)
    except ValueError as error:
        print(f"postroom policies set: the definition is not JSON: {error}", file=sys.stderr)
        return 2
    body = {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": args.apply_to}
    return _policy_change(args, "set", "PUT", body)


def clear_policy(args: argparse.Namespace) -> int:
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


def export_definitions(args: argparse.Namespace) -> int:
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


def list_streams(args: argparse.Namespace) -> int:
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


def reset_stream(args: argparse.Namespace) -> int:
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

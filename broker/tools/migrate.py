"""``postroom migrate``: move a Postroom broker's topology and messages to another AMQP 0-9-1
broker (a RabbitMQ node or cluster), through the broker's own shovels.

::

    postroom migrate --to amqp://app:secret@rabbit-1:5672/ [--queues '^orders\\.'] \\
        [--queue-type quorum] [--follow] [--url http://guest:guest@127.0.0.1:15672/]

1. The definitions are exported from the broker's management API (``--url``, or the listener
   ``--config`` names), as ``postroom definitions export`` writes them.
2. What RabbitMQ has no use for is mapped, one line on stderr each: ``x-visibility-timeout``
   is dropped; ``x-delivery-limit`` becomes a quorum queue's with ``--queue-type quorum`` and is
   dropped otherwise; policy keys of Postroom's own are dropped from their policies. With
   ``--queue-type quorum``, a durable queue becomes a quorum queue unless it cannot be one
   (exclusive, auto-delete, a priority queue): it stays classic, and says so.
3. The definitions are imported on the target through its management API (``--to-api``, by
   default the target's host on port 15672 with the same credentials); when that cannot be
   reached, they are written to a file and the ``rabbitmqctl import_definitions`` line printed,
   and the shovels declare each queue themselves (with the same arguments).
4. Each queue gets a shovel (``migrate-QUEUE``) from the broker to the target: ``on-confirm``,
   ``src-delete-after: queue-length``, or no end with ``--follow``, so that producers can move
   first and consumers later. Progress per queue goes to stderr, then a summary.

A rerun after an interruption resumes: an import applies what is already there unchanged, a
shovel still declared goes on as it was, one that finished is declared again for what has
arrived since. Messages keep their properties and headers byte for byte (``x-death`` history
and priority included), but for their time to live: the shovels consume with Postroom's
``x-remaining-ttl``, so a message with a TTL on the broker (its own ``expiration`` or its
queue's ``x-message-ttl``) arrives with the time it had left as its ``expiration``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from postroom.broker.tools.management import management_call
from postroom.config.shovels import QUEUE_ARGUMENTS, REMAINING_TTL

#: Postroom's queue arguments RabbitMQ has no use for, and why they are dropped.
DROPPED_ARGUMENTS = {
    "x-visibility-timeout": "a visibility timeout is Postroom's (RabbitMQ redelivers on a lost connection only)",
}
#: Policy keys of Postroom's own.
DROPPED_POLICY_KEYS = ("visibility-timeout",)
#: Seconds between progress lines.
PROGRESS_EVERY = 2.0

Call = Callable[..., tuple[int, Any, str]]


class Failed(Exception):
    """The migration cannot go on: why, for stderr."""


def shovel_name(queue: str) -> str:
    return f"migrate-{queue}"


def target_api(to: str, given: str | None) -> str:
    """The target's management API: ``given``, or the target's host on 15672 with the target's
    credentials."""
    if given:
        return given
    parts = urllib.parse.urlsplit(to)
    credentials = f"{parts.username or 'guest'}:{parts.password or 'guest'}@"
    return f"http://{credentials}{parts.hostname or '127.0.0.1'}:15672/"


def target_uri(to: str, vhost: str) -> str:
    """``to`` pointed at ``vhost`` (the same vhost on the target as on the source)."""
    parts = urllib.parse.urlsplit(to)
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, "/" + urllib.parse.quote(vhost, safe=""), parts.query, "")
    )


def mapped(
    document: dict[str, Any], pattern: str | None, queue_type: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """The definitions for the target: the queues ``pattern`` selects (with the bindings to them
    and the exchanges those need), Postroom's own settings mapped or dropped, each said."""
    chosen = re.compile(pattern) if pattern else None
    queues = []
    for queue in document.get("queues", []):
        arguments = dict(queue.get("arguments") or {})
        if chosen is not None and not chosen.search(queue["name"]):
            continue
        where = f"queue '{queue['name']}' in vhost '{queue['vhost']}'"
        if arguments.get("x-queue-type") == "stream":
            say(f"{where}: a stream is read, not drained: its definition is moved, its messages are not")
        for key, why in DROPPED_ARGUMENTS.items():
            if key in arguments:
                say(f"{where}: {key} dropped: {why}")
                del arguments[key]
        quorum = queue_type == "quorum" and arguments.get("x-queue-type") != "stream"
        if quorum:
            blockers = [
                reason
                for reason, applies in (
                    ("not durable", not queue.get("durable", True)),
                    ("auto-delete", queue.get("auto_delete")),
                    ("exclusive", queue.get("exclusive")),
                    ("a priority queue (x-max-priority)", "x-max-priority" in arguments),
                )
                if applies
            ]
            if blockers:
                say(f"{where}: stays a classic queue, a quorum queue cannot be {', '.join(blockers)}")
                quorum = False
        if quorum:
            arguments["x-queue-type"] = "quorum"
        elif "x-delivery-limit" in arguments:
            say(f"{where}: x-delivery-limit dropped: a classic queue has no delivery limit (use --queue-type quorum)")
            del arguments["x-delivery-limit"]
        queues.append({**queue, "arguments": arguments})
    moved = {(queue["vhost"], queue["name"]) for queue in queues}
    bindings = [
        binding
        for binding in document.get("bindings", [])
        if binding["destination_type"] == "exchange" or (binding["vhost"], binding["destination"]) in moved
    ]
    policies = []
    for policy in document.get("policies", []):
        definition = {k: v for k, v in policy["definition"].items() if k not in DROPPED_POLICY_KEYS}
        for key in set(policy["definition"]) - set(definition):
            say(f"policy '{policy['name']}' in vhost '{policy['vhost']}': {key} dropped (Postroom's own)")
        if definition:
            policies.append({**policy, "definition": definition})
        else:
            say(f"policy '{policy['name']}' in vhost '{policy['vhost']}': nothing left of it, not moved")
    parameters = [p for p in document.get("parameters", []) if p.get("component") != "shovel"]
    return {**document, "queues": queues, "bindings": bindings, "policies": policies, "parameters": parameters}


def migrate(args: argparse.Namespace, call: Call, say: Callable[[str], None]) -> int:
    """The migration (see the module); ``call(url, path, method, body)`` asks a management API."""
    status, document, _where = call(args.url, "/api/definitions")
    if status != 200 or not isinstance(document, dict):
        raise Failed(f"cannot export the definitions from {_shown(args.url)}: HTTP {status}: {document}")
    wanted_vhost = urllib.parse.unquote(urllib.parse.urlsplit(args.to[0]).path[1:]) or None
    if wanted_vhost is not None:
        document = _one_vhost(document, wanted_vhost)
    target = mapped(document, args.queues, args.queue_type, say)
    api = target_api(args.to[0], args.to_api)
    try:
        status, answer, _where = call(api, "/api/definitions", "POST", target)
    except OSError as error:
        status, answer = 0, str(error)
    if status in (200, 201, 204):
        say(f"definitions imported on {_shown(api)}")
    else:
        with open(args.definitions, "w", encoding="utf-8") as out:
            json.dump(target, out, indent=2)
        say(f"the target's management API ({_shown(api)}) did not take the definitions ({status}: {answer});")
        say(f"they are in {args.definitions}: rabbitmqctl import_definitions {args.definitions}")
        say("meanwhile the shovels declare each queue they move to, with its arguments")
    queues = [q for q in target["queues"] if q.get("arguments", {}).get("x-queue-type") != "stream"]
    queues = [q for q in queues if not q.get("exclusive")]
    started = time.monotonic()
    before = {}
    for queue in queues:
        vhost, name = queue["vhost"], queue["name"]
        status, shown, _where = call(args.url, f"/api/queues/{_q(vhost)}/{_q(name)}")
        before[(vhost, name)] = shown.get("messages", 0) if status == 200 and isinstance(shown, dict) else 0
        value = {
            "src-uri": "amqp:///" + _q(vhost),
            "src-queue": name,
            # (each message's time left to live goes with it, as its expiration)
            "src-consumer-args": {REMAINING_TTL: True},
            # (several nodes of a cluster: the shovel picks one, and another when it fails)
            "dest-uri": [target_uri(to, vhost) for to in args.to]
            if len(args.to) > 1
            else target_uri(args.to[0], vhost),
            "dest-queue": name,
            # (what a shovel may declare a queue with: the definitions carry the rest)
            "dest-queue-args": {k: v for k, v in (queue.get("arguments") or {}).items() if k in QUEUE_ARGUMENTS},
            "ack-mode": "on-confirm",
            "src-prefetch-count": args.prefetch,
            "reconnect-delay": 1,
        }
        if not args.follow:
            value["src-delete-after"] = "queue-length"
        status, answer, _where = call(
            args.url, f"/api/parameters/shovel/{_q(vhost)}/{_q(shovel_name(name))}", "PUT", {"value": value}
        )
        if status not in (201, 204):
            raise Failed(f"cannot declare the shovel of queue '{name}' in vhost '{vhost}': HTTP {status}: {answer}")
    return _watch(args, call, say, queues, before, started)


def _watch(
    args: argparse.Namespace,
    call: Call,
    say: Callable[[str], None],
    queues: list[dict[str, Any]],
    before: dict[tuple[str, str], int],
    started: float,
) -> int:
    """Progress until every queue is done (its shovel ended; with ``--follow``, the queue
    drained once), then the summary."""
    left = {(q["vhost"], q["name"]) for q in queues}
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    next_line = 0.0
    while left:
        status, shovels, _where = call(args.url, "/api/shovels?counters=true")
        running = {(s["vhost"], s["name"]): s for s in shovels} if status == 200 and isinstance(shovels, list) else {}
        lines = []
        for vhost, name in sorted(left):
            shovel = running.get((vhost, shovel_name(name)))
            if shovel is not None:
                seen[(vhost, name)] = shovel
            status, queue, _where = call(args.url, f"/api/queues/{_q(vhost)}/{_q(name)}")
            waiting = queue.get("messages", 0) if status == 200 and isinstance(queue, dict) else 0
            if waiting == 0 and (args.follow or shovel is None):
                left.discard((vhost, name))
                say(f"{name}: done")
            else:
                state = shovel["state"] if shovel is not None else "ended"
                lines.append(f"{name}: {waiting:,} left to move (shovel {state})")
        if left:
            if time.monotonic() >= next_line:
                for line in lines:
                    say(line)
                next_line = time.monotonic() + PROGRESS_EVERY
            time.sleep(0.5)
    say(f"moved {len(queues)} queue(s) in {time.monotonic() - started:.1f} s:")
    api = target_api(args.to[0], args.to_api)
    for queue in queues:
        key = (queue["vhost"], queue["name"])
        try:
            status, there, _where = call(api, f"/api/queues/{_q(key[0])}/{_q(key[1])}")
        except OSError:
            status, there = 0, None
        arrived = f"{there.get('messages', 0):,}" if status == 200 and isinstance(there, dict) else "unknown"
        again = seen.get(key, {}).get("redelivered", 0)
        say(
            f"  {key[1]}: {before.get(key, 0):,} message(s) here at the start, {arrived} at the target now,"
            f" {again:,} possible duplicate(s)"
        )
    if args.follow:
        say("the shovels keep running (--follow): delete them with postroom ctl delete_shovel migrate-QUEUE")
    return 0


def _one_vhost(document: dict[str, Any], vhost: str) -> dict[str, Any]:
    kept = {
        key: [item for item in document.get(key, []) if item.get("vhost") == vhost]
        for key in ("queues", "exchanges", "bindings", "policies", "parameters")
    }
    kept["vhosts"] = [v for v in document.get("vhosts", []) if v.get("name") == vhost]
    kept["permissions"] = [p for p in document.get("permissions", []) if p.get("vhost") == vhost]
    return {**document, **kept}


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _shown(url: str) -> str:
    """A URL without its credentials."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))


def api_url(args: argparse.Namespace) -> str:
    """The source broker's management API: ``--url``, or with ``--config`` the listener it
    names (with ``--url``'s credentials)."""
    if not args.config:
        return str(args.url)
    from postroom.config.loader import load

    listen = load(args.config).listen.management
    if not listen:
        raise Failed(f"{args.config}: listen.management is off: the migration needs the management API")
    port = re.search(r"tcp:(\d+)", listen)
    host = re.search(r"interface=([^:]+)", listen)
    parts = urllib.parse.urlsplit(args.url)
    credentials = f"{parts.username or 'guest'}:{parts.password or 'guest'}@"
    return f"http://{credentials}{host.group(1) if host else '127.0.0.1'}:{port.group(1) if port else 15672}/"


def add_parser(commands: Any, default_url: str) -> None:
    parser = commands.add_parser(
        "migrate", help="move the topology and the messages to another broker, through shovels"
    )
    parser.add_argument("--config", metavar="PATH", help="the broker's configuration (its management listener)")
    parser.add_argument(
        "--url", default=default_url, help="the broker's management API, credentials in it (%(default)s)"
    )
    parser.add_argument(
        "--to",
        required=True,
        action="append",
        metavar="URL",
        help="the target: amqp://user:pass@host:port/[vhost]; again for each node of a cluster",
    )
    parser.add_argument("--to-api", metavar="URL", help="the target's management API (default: its host, port 15672)")
    parser.add_argument("--queues", metavar="PATTERN", help="only the queues whose name this regular expression finds")
    parser.add_argument("--queue-type", choices=("classic", "quorum"), default="classic")
    parser.add_argument("--follow", action="store_true", help="keep the shovels running (producers move first)")
    parser.add_argument("--prefetch", type=int, default=1000, help="messages each shovel holds in flight")
    parser.add_argument(
        "--definitions",
        default="migration-definitions.json",
        help="where the definitions go when the target's API cannot take them",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        args.url = api_url(args)
        return migrate(args, management_call, say)
    except Failed as failed:
        say(f"postroom migrate: {failed}")
        return 1
    except OSError as error:
        say(f"postroom migrate: {error}")
        return 1

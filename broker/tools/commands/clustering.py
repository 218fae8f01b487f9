"""``postroom cluster``: a cluster's state as etcd holds it (``status``), and taking a node
that is gone for good out of it (``forget``). Both read the ``cluster:`` section of a node's
configuration for etcd's address and the cluster's prefix."""

from __future__ import annotations

import argparse
import base64
import functools
import json
import sys
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from postroom.broker.cluster.etcd import prefix_end
from postroom.config.loader import load
from postroom.config.schema import ClusterConfig
from postroom.config.values import ConfigError

__all__ = ["EtcdUnreachable", "etcd_call", "etcd_range", "forget", "status"]


class EtcdUnreachable(Exception):
    """No etcd endpoint answered."""


def _cluster(path: str) -> ClusterConfig:
    config = load(path)
    if config.cluster is None:
        raise ConfigError(config.source, [])
    return config.cluster


def etcd_call(urls: Sequence[str], path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to ``/v3/<path>`` of etcd's JSON gateway, at the first of ``urls`` that answers.

    :raises EtcdUnreachable: none did
    """
    problems = []
    for url in urls:
        request = urllib.request.Request(
            f"{url.rstrip('/')}/v3/{path}", json.dumps(body).encode(), {"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return dict(json.load(answer))
        except OSError as error:
            problems.append(f"{url}: {error}")
    raise EtcdUnreachable("; ".join(problems))


def _encoded(data: bytes) -> str:
    return base64.b64encode(data).decode()


def etcd_range(urls: Sequence[str], prefix: str) -> dict[str, str]:
    """Every key that starts with ``prefix``, with its value.

    :raises EtcdUnreachable: no endpoint answered
    """
    start = prefix.encode()
    answer = etcd_call(urls, "kv/range", {"key": _encoded(start), "range_end": _encoded(prefix_end(start))})
    return {
        base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
        for kv in answer.get("kvs") or []
    }


def _prefix(cluster: ClusterConfig, name: str) -> dict[str, str]:
    """The keys under ``<prefix>/<name>``, by what follows it, with their values."""
    start = f"{cluster.prefix.rstrip('/')}/{name}"
    return {key[len(start) :]: value for key, value in etcd_range(cluster.etcd, start).items()}


def _reporting(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, with a configuration it cannot use (2) and an etcd it cannot reach (1)
    reported on stderr."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ConfigError as error:
            print(error if error.problems else f"{args.config}: no cluster: section", file=sys.stderr)
            return 2
        except EtcdUnreachable as error:
            print(f"etcd cannot be reached: {error}", file=sys.stderr)
            return 1

    return run


@_reporting
def status(args: argparse.Namespace) -> int:
    """Print the leader, each node with its addresses, and the in-sync set (``--json``: as one
    JSON object)."""
    cluster = _cluster(args.config)
    leader = _prefix(cluster, "leader").get("")
    nodes = {name.lstrip("/"): json.loads(value) for name, value in _prefix(cluster, "nodes/").items()}
    in_sync = sorted(name for name in _prefix(cluster, "isr/"))
    leader_name = json.loads(leader)["name"] if leader else None
    if args.json:
        print(json.dumps({"leader": leader_name, "in_sync": in_sync, "nodes": nodes}, sort_keys=True))
        return 0
    print(f"leader: {leader_name or 'none'}")
    print(f"in sync: {', '.join(in_sync) or 'none'}")
    for name in sorted({*nodes, *in_sync}):
        role = "leader" if name == leader_name else "follower"
        where = nodes.get(name)
        running = f"amqp {where.get('amqp')}, replication {where.get('replication')}" if where else "not running"
        print(f"  {name:<16} {role:<9} {'in sync' if name in in_sync else 'behind':<8} {running}")
    return 0


@_reporting
def forget(args: argparse.Namespace) -> int:
    """Take node ``args.name``, gone for good, out of the in-sync set, so that the set names
    only nodes that may lead. Refused while the node is running or leads."""
    cluster = _cluster(args.config)
    nodes = _prefix(cluster, "nodes/")
    leader = _prefix(cluster, "leader").get("")
    if args.name in nodes:
        print(f"{args.name} is running: stop it first", file=sys.stderr)
        return 1
    if leader and json.loads(leader)["name"] == args.name:
        print(f"{args.name} leads the cluster", file=sys.stderr)
        return 1
    key = f"{cluster.prefix.rstrip('/')}/isr/{args.name}"
    answer = etcd_call(cluster.etcd, "kv/deleterange", {"key": _encoded(key.encode())})
    print(f"{args.name}: {'out of the in-sync set' if int(answer.get('deleted', 0)) else 'was not in the in-sync set'}")
    return 0

"""Definitions: ``GET /api/definitions[/VHOST]`` exports the broker's topology, users and
policies in RabbitMQ 3.10's format, for RabbitMQ (or Postroom) to import."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from postroom.broker.core.admin import user_limits, vhost_limits
from postroom.broker.core.definitions import apply_accounts, apply_definitions, apply_parameters, apply_policies
from postroom.broker.server.management.common import RABBITMQ_FORMAT_VERSION, Answer, Call, Problem, not_authorised
from postroom.broker.server.management.policies import policy_view
from postroom.broker.server.management.router import Router
from postroom.broker.server.management.views import exchange_definition, vhost_bindings
from postroom.config.rabbitmq import HASHING_ALGORITHMS, loads_definitions
from postroom.config.schema import Permission
from postroom.config.values import ConfigError

if TYPE_CHECKING:
    from postroom.broker.core.node import Node

_log = Logger()


def install(router: Router) -> None:
    router.add("/definitions", GET=definitions, POST=import_definitions)
    router.add("/definitions/:vhost", GET=definitions, POST=import_definitions)


#: ``password_hash`` prefixes of RabbitMQ's hashes and RabbitMQ's name for each algorithm.
_HASHING_ALGORITHMS = {prefix: algorithm for algorithm, (prefix, _size) in HASHING_ALGORITHMS.items()}


def export_users(
    node: Node, salt: Callable[[], bytes] = lambda: os.urandom(4)
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The node's users, permissions and topic permissions as RabbitMQ's definitions hold them.

    A password hash from RabbitMQ is exported as it came; a password in clear is hashed as
    RabbitMQ hashes it (salted SHA-256, ``salt()`` giving the 4 bytes); a Postroom scrypt hash
    has no RabbitMQ equivalent, so that user is exported with an empty hash (no password login
    until one is set there). A user whose vhosts are not limited by permissions gets ``.*``
    on each vhost it may open: RabbitMQ needs permissions to open one at all.
    """
    users, permissions, topic_permissions = [], [], []
    for user in node.users_by_name.values():
        scheme, _, encoded = (user.password_hash or "").partition("$")
        if scheme in _HASHING_ALGORITHMS:
            password_hash, algorithm = encoded, _HASHING_ALGORITHMS[scheme]
        else:
            password_hash, algorithm = "", "rabbit_password_hashing_sha256"
            if user.password is not None:
                salted = salt()
                password_hash = base64.b64encode(
                    salted + hashlib.sha256(salted + user.password.encode("utf-8")).digest()
                ).decode()
        limits = user_limits(user)
        users.append(
            {
                "name": user.name,
                "password_hash": password_hash,
                "hashing_algorithm": algorithm,
                "tags": list(user.tags),
                "limits": limits,
            }
        )
        granted = dict(user.permissions or {})
        if user.permissions is None:
            granted = {name: Permission() for name in node.vhosts if user.may_open(name)}
        permissions += [
            {"user": user.name, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
            for vhost, p in granted.items()
        ]
        topic_permissions += [
            {"user": user.name, "vhost": vhost, "exchange": exchange, "write": t.write, "read": t.read}
            for vhost, exchanges in (user.topic_permissions or {}).items()
            for exchange, t in exchanges.items()
        ]
    return users, permissions, topic_permissions


def definitions(call: Call) -> Answer:
    """``GET /api/definitions[/VHOST]``: what RabbitMQ 3.10's export holds, for
    administrators, in its shape, so that RabbitMQ imports it (``POST /api/definitions``,
    ``rabbitmqctl import_definitions``). Like RabbitMQ's: every queue but exclusive ones,
    every exchange but the default and ``amq.*`` ones, the bindings between what is exported
    (and from ``amq.*`` exchanges), policies, and operator policies and vhost limits as
    ``parameters``; the whole node's adds users, vhosts, permissions and topic permissions.
    One vhost's leaves ``vhost`` out of queues, exchanges and bindings, as RabbitMQ does.
    """
    if "administrator" not in call.user.tags:
        raise not_authorised("Not administrator user")
    node = call.node
    one = call.params.get("vhost")
    if one is not None:
        vhost = node.vhosts.get(one)
        if vhost is None:
            raise Problem(400, "bad_request", "vhost_not_found")
        vhosts = [vhost]
    else:
        vhosts = list(node.vhosts.values())
    queues, exchanges, bindings, parameters, policies = [], [], [], [], []
    for vhost in vhosts:
        exported = {queue.name for queue in vhost.queues.values() if queue.owner is None}
        for queue in vhost.queues.values():
            if queue.name in exported:
                queues.append(
                    {
                        "name": queue.name,
                        "vhost": vhost.name,
                        "durable": queue.durable,
                        "auto_delete": queue.auto_delete,
                        "arguments": dict(queue.arguments),
                    }
                )
        for exchange in vhost.exchanges.values():
            if exchange.name and not exchange.name.startswith("amq."):
                exchanges.append(exchange_definition(vhost, exchange))
        bindings += [
            {key: value for key, value in binding.items() if key != "properties_key"}  # (not exported)
            for binding in vhost_bindings(vhost)
            if binding["source"]  # (the default exchange's are implicit)
            and (
                binding["destination"] in exported if binding["destination_type"] == "queue" else binding["destination"]
            )
        ]
        policies += [policy_view(vhost, policy) for policy in vhost.policies.values()]
        parameters += [
            {"value": policy.value(), "vhost": vhost.name, "component": "operator_policy", "name": policy.name}
            for policy in vhost.operator_policies.values()
        ]
        limits = vhost_limits(vhost)
        if limits:
            parameters.append({"value": limits, "vhost": vhost.name, "component": "vhost-limits", "name": "limits"})
        parameters += [
            {"value": value, "vhost": vhost.name, "component": component, "name": name}
            for (component, vhost_name, name), value in sorted(node.admin.parameters.items())
            if vhost_name == vhost.name
        ]
    if one is not None:
        for item in (*queues, *exchanges, *bindings):
            del item["vhost"]
        return 200, {
            "rabbit_version": RABBITMQ_FORMAT_VERSION,
            "parameters": parameters,
            "policies": policies,
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }
    users, permissions, topic_permissions = export_users(node)
    return 200, {
        "rabbit_version": RABBITMQ_FORMAT_VERSION,
        "rabbitmq_version": RABBITMQ_FORMAT_VERSION,
        "product_name": node.product,
        "product_version": node.version,
        "users": users,
        "vhosts": [{"name": vhost.name} for vhost in vhosts],
        "permissions": permissions,
        "topic_permissions": topic_permissions,
        "parameters": parameters,
        "global_parameters": [  # (as RabbitMQ's export: without the cluster's internal id)
            {"name": name, "value": value}
            for name, value in node.admin.globals.items()
            if name != "internal_cluster_id"
        ],
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


#: What a definitions document lists per vhost (items without ``vhost`` are ``/``'s).
_PER_VHOST = ("queues", "exchanges", "bindings", "policies", "parameters", "permissions", "topic_permissions")


def import_definitions(call: Call) -> Answer:
    """``POST /api/definitions[/VHOST]``: apply a RabbitMQ definitions document, as RabbitMQ's
    import does: what it lists is created or replaced, nothing it leaves out is deleted. The
    whole node's takes users, vhosts, permissions, limits, policies, exchanges, queues and
    bindings; one vhost's, its queues, exchanges, bindings and policies only (put in that
    vhost). A vhost named by an item must exist or be in the document (RabbitMQ's 400
    ``no_such_vhost``).

    What Postroom cannot apply as it is (a quorum queue, declared classic; a federation upstream) is
    applied as ``postroom serve --config`` applies a definitions file (``config.rabbitmq``),
    and answered 200 with those ``notes``; a document without any is answered 204, as by
    RabbitMQ. A definition the broker refuses is 400 with its key path.
    """
    if "administrator" not in call.user.tags:
        raise not_authorised("Not administrator user")
    node = call.node
    try:
        content = call.request.content
        document = json.loads((content.read() if content is not None else b"") or b"null")
    except ValueError:
        raise Problem(400, "bad_request", "failed_to_parse_json") from None
    if not isinstance(document, dict):
        raise Problem(400, "bad_request", "failed_to_parse_json")
    one = call.params.get("vhost")
    if one is not None:
        if one not in node.vhosts:
            raise Problem(404, "not_found", "vhost_not_found")
        document = {
            key: [{**item, "vhost": one} for item in document.get(key) or () if isinstance(item, dict)]
            for key in ("queues", "exchanges", "bindings", "policies", "parameters")
            if key in document
        }
        document["vhosts"] = [{"name": one}]
    listed = {item.get("name") for item in document.get("vhosts") or () if isinstance(item, dict)}
    for key in _PER_VHOST:
        for item in document.get(key) or ():
            name = item.get("vhost", "/") if isinstance(item, dict) else "/"
            if name not in listed and name not in node.vhosts:
                raise Problem(400, "bad_request", ["no_such_vhost", name])
    try:
        config = loads_definitions(json.dumps(document), "the definitions")
        apply_accounts(node, config, initialised=True, imported=True)
        apply_policies(node, config)
        apply_parameters(node, config)
        apply_definitions(node, config)
    except ConfigError as error:
        raise Problem(400, "bad_request", "; ".join(f"{p.key}: {p.reason}" for p in error.problems)) from None
    notes = [note.removeprefix("the definitions: ") for note in config.notes]
    for note in notes:
        _log.warn("definitions imported through the management API: {note}", note=note)
    return (200, {"notes": notes}) if notes else (204, None)

"""Users, vhosts, permissions, topic permissions and limits, as RabbitMQ's management plugin
lists and changes them (administrators only): ``/api/users``, ``/api/vhosts/NAME`` (``PUT``,
``DELETE``), ``/api/permissions``, ``/api/topic-permissions``, ``/api/user-limits``,
``/api/vhost-limits`` and the views of one user or vhost. Changes go through the node's
:class:`broker.core.admin.Administration`: they apply at once and are answered once the log
holds them."""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import replace
from typing import Any

from postroom.broker.core.admin import HASHING_PREFIXES, USER_LIMITS, VHOST_LIMITS, rabbitmq_hash
from postroom.broker.core.admin import vhost_limits as admin_vhost_limits
from postroom.broker.core.users import User
from postroom.broker.server.management.common import (
    Answer,
    Call,
    Problem,
    erlang_term,
    not_authorised,
    not_found,
    required,
)
from postroom.broker.server.management.definitions import export_users
from postroom.broker.server.management.router import Router
from postroom.config.schema import Permission, TopicPermission


def install(router: Router) -> None:
    router.add("/users", GET=users)
    router.add("/users/without-permissions", GET=without_permissions)
    router.add("/users/bulk-delete", POST=bulk_delete)
    router.add("/users/:user", GET=users, PUT=put_user, DELETE=delete_user)
    router.add("/users/:user/permissions", GET=permissions)
    router.add("/users/:user/topic-permissions", GET=topic_permissions)
    router.add("/vhosts/:vhost", PUT=put_vhost, DELETE=delete_vhost)
    router.add("/vhosts/:vhost/permissions", GET=permissions)
    router.add("/vhosts/:vhost/topic-permissions", GET=topic_permissions)
    router.add("/permissions", GET=permissions)
    router.add("/permissions/:vhost/:user", GET=permissions, PUT=set_permissions, DELETE=clear_permissions)
    router.add("/topic-permissions", GET=topic_permissions)
    router.add(
        "/topic-permissions/:vhost/:user",
        GET=topic_permissions,
        PUT=set_topic_permissions,
        DELETE=clear_topic_permissions,
    )
    router.add("/topic-permissions/:vhost/:user/:exchange", DELETE=clear_topic_permissions)
    router.add("/user-limits", GET=user_limits)
    router.add("/user-limits/:user", GET=user_limits)
    router.add("/user-limits/:user/:limit", PUT=set_user_limit, DELETE=clear_user_limit)
    router.add("/vhost-limits", GET=vhost_limits)
    router.add("/vhost-limits/:vhost", GET=vhost_limits)
    router.add("/vhost-limits/:vhost/:limit", PUT=set_vhost_limit, DELETE=clear_vhost_limit)


def _administrator(call: Call) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    if "administrator" not in call.user.tags:
        raise not_authorised("Not administrator user")
    return export_users(call.node)


def _known(call: Call) -> None:
    """404 for a user or vhost of the path that does not exist."""
    if "user" in call.params and call.params["user"] not in call.node.users_by_name:
        raise not_found()
    if "vhost" in call.params and call.params["vhost"] not in call.node.vhosts:
        raise not_found()


def users(call: Call) -> Answer:
    listed, _permissions, _topics = _administrator(call)
    if "user" not in call.params:
        return 200, listed
    _known(call)
    return 200, next(user for user in listed if user["name"] == call.params["user"])


def _matching(call: Call, items: list[dict[str, Any]], single: bool = False) -> Any:
    """The items of the path's user and vhost; with ``single``, the one item where the path
    names both (404 when there is none)."""
    _known(call)
    asked = {key: call.params[key] for key in ("user", "vhost") if key in call.params}
    kept = sorted(  # in RabbitMQ's table order (by user, then vhost; exchanges as they were set)
        (item for item in items if all(item[key] == value for key, value in asked.items())),
        key=lambda item: (item["user"], item["vhost"]),
    )
    if single and "user" in call.params and "vhost" in call.params:
        if not kept:
            raise not_found()
        return kept[0]
    return kept


def permissions(call: Call) -> Answer:
    _users, granted, _topics = _administrator(call)
    return 200, _matching(call, granted, single=True)


def topic_permissions(call: Call) -> Answer:
    _users, _permissions, topics = _administrator(call)
    return 200, _matching(call, topics)


def without_permissions(call: Call) -> Answer:
    """``GET /api/users/without-permissions``: users with no permissions on any vhost."""
    listed, granted, _topics = _administrator(call)
    holders = {item["user"] for item in granted}
    return 200, [user for user in listed if user["name"] not in holders]


def user_limits(call: Call) -> Answer:
    listed, _permissions, _topics = _administrator(call)
    _known(call)
    return 200, [
        {"user": user["name"], "value": user["limits"]}
        for user in listed
        if user["limits"] and call.params.get("user", user["name"]) == user["name"]
    ]


def vhost_limits(call: Call) -> Answer:
    _administrator(call)
    _known(call)
    limits = []
    for vhost in call.node.vhosts.values():
        value = admin_vhost_limits(vhost)
        if value and call.params.get("vhost", vhost.name) == vhost.name:
            limits.append({"vhost": vhost.name, "value": value})
    return 200, limits


# -- changes -----------------------------------------------------------------------------------


def _tags(value: Any) -> tuple[str, ...]:
    """RabbitMQ's ``tags``: a comma-separated string or a list; blanks trimmed, empties dropped."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        raise Problem(400, "bad_request", "tags must be a comma-separated string or a list of strings")
    return tuple(tag.strip() for tag in value if tag.strip())


def _password_hash(body: dict[str, Any]) -> str | None:
    """The stored hash for ``password_hash`` and ``hashing_algorithm`` (RabbitMQ's answers for a
    hash that is not base64 and an algorithm it does not have)."""
    encoded = body["password_hash"]
    if not isinstance(encoded, str):
        raise Problem(400, "bad_request", "password_hash must be a string")
    try:
        base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise Problem(400, "bad_request", ["not_base64", encoded]) from None
    algorithm = body.get("hashing_algorithm", "rabbit_password_hashing_sha256")
    prefix = HASHING_PREFIXES.get(algorithm)
    if prefix is None:
        known = ", ".join(HASHING_PREFIXES)
        raise Problem(400, "bad_request", f"unknown hashing_algorithm {algorithm!r}: one of {known}")
    return f"{prefix}${encoded}" if encoded else None


def put_user(call: Call) -> Answer:
    """``PUT /api/users/NAME``: create a user or replace its password and tags (its
    permissions and limits stay). As RabbitMQ 3.10: ``tags`` is required; ``password`` or
    ``password_hash`` (with ``hashing_algorithm``), not both; with neither, or an empty
    password, the user cannot log in with a password."""
    _administrator(call)
    body = call.body()
    if "tags" not in body:
        raise Problem(400, "bad_request", "tags_not_present")
    if "password" in body and "password_hash" in body:
        raise Problem(400, "bad_request", "both_password_and_password_hash_are_provided")
    tags = _tags(body["tags"])
    name = call.params["user"]
    old = call.node.users_by_name.get(name)
    password, password_hash = None, None
    if "password_hash" in body:
        password_hash = _password_hash(body)
    elif "password" in body:
        if not isinstance(body["password"], str):
            raise Problem(400, "bad_request", "password must be a string")
        password = body["password"]
    else:
        # As RabbitMQ: neither given, the user gets a random password no one knows.
        password_hash = rabbitmq_hash(base64.b64encode(os.urandom(24)).decode())
    if old is None:
        # RabbitMQ's default loopback_users: guest may connect from loopback addresses only.
        user = User(name, loopback_only=name == "guest", permissions={})
    else:
        user = old
    user = replace(user, password=password, password_hash=password_hash, tags=tags)
    return (201 if call.node.admin.put_user(user) else 204), None


def delete_user(call: Call) -> Answer:
    """``DELETE /api/users/NAME``: the user goes, and its connections are closed."""
    _administrator(call)
    if not call.node.admin.delete_user(call.params["user"]):
        raise not_found()
    return 204, None


def bulk_delete(call: Call) -> Answer:
    """``POST /api/users/bulk-delete`` with ``{"users": [...]}``: deleted in order; the first
    missing one stops it with RabbitMQ's 400 (those before it stay deleted, as there)."""
    _administrator(call)
    (names,) = required(call.body(), ("users",))
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise Problem(400, "bad_request", "users must be a list of names")
    for name in names:
        if not call.node.admin.delete_user(name):
            raise Problem(400, "bad_request", ["no_such_user", name])
    return 204, None


def _pattern(value: Any) -> str:
    """A permission's regular expression, checked (RabbitMQ's ``invalid_regexp`` answer)."""
    if not isinstance(value, str):
        raise Problem(400, "bad_request", "a permission must be a string (a regular expression)")
    try:
        re.compile(value)
    except re.error as error:
        raise Problem(400, "bad_request", ["invalid_regexp", value, [error.msg, error.pos or 0]]) from None
    return value


def _user_and_vhost(call: Call) -> tuple[str, str]:
    user, vhost = call.params["user"], call.params["vhost"]
    if user not in call.node.users_by_name or vhost not in call.node.vhosts:
        raise Problem(400, "bad_request", "vhost_or_user_not_found")
    return user, vhost


def set_permissions(call: Call) -> Answer:
    """``PUT /api/permissions/VHOST/USER`` with ``configure``, ``write`` and ``read``."""
    _administrator(call)
    patterns = [_pattern(value) for value in required(call.body(), ("configure", "write", "read"))]
    user, vhost = _user_and_vhost(call)
    return (201 if call.node.admin.set_permissions(user, vhost, Permission(*patterns)) else 204), None


def clear_permissions(call: Call) -> Answer:
    """``DELETE /api/permissions/VHOST/USER``: the user's connections to the vhost are closed."""
    _administrator(call)
    user, vhost = call.params["user"], call.params["vhost"]
    if user not in call.node.users_by_name or not call.node.admin.clear_permissions(user, vhost):
        raise not_found()
    return 204, None


def set_topic_permissions(call: Call) -> Answer:
    """``PUT /api/topic-permissions/VHOST/USER`` with ``exchange``, ``write`` and ``read``."""
    _administrator(call)
    exchange, write, read = required(call.body(), ("exchange", "write", "read"))
    if not isinstance(exchange, str):
        raise Problem(400, "bad_request", "exchange must be a string")
    permission = TopicPermission(_pattern(write), _pattern(read))
    user, vhost = _user_and_vhost(call)
    new = call.node.admin.set_topic_permissions(user, vhost, exchange, permission)
    return (201 if new else 204), None


def clear_topic_permissions(call: Call) -> Answer:
    """``DELETE /api/topic-permissions/VHOST/USER[/EXCHANGE]``: all of them, or one exchange's."""
    _administrator(call)
    user, vhost = call.params["user"], call.params["vhost"]
    exchange = call.params.get("exchange")
    if user not in call.node.users_by_name:
        raise not_found()
    if not call.node.admin.clear_topic_permissions(user, vhost, exchange) and exchange is None:
        raise not_found()
    return 204, None


def _limit_value(call: Call, names: tuple[str, ...], where: str) -> tuple[str, int]:
    """The limit of the path and its ``value``, refused in RabbitMQ's words (``where``:
    ``user-limits`` or ``limits``, the vhost's being wrapped in its validation message)."""
    (value,) = required(call.body(), ("value",))
    limit = call.params["limit"]
    vhost = where == "limits"
    if limit not in names:
        reason = f'Unrecognised terms [{{<<"{limit}">>,{erlang_term(value)}}}] in {where}'
        raise Problem(400, "bad_request", f"Validation failed\n\n{reason}\n" if vhost else reason)
    if not isinstance(value, int) or isinstance(value, bool):
        reason = f"{limit} should be a number, actually was {erlang_term(value)}"
        raise Problem(400, "bad_request", f"Validation failed\n\n{reason}\n" if vhost else reason)
    return limit, value


def set_user_limit(call: Call) -> Answer:
    """``PUT /api/user-limits/USER/NAME`` with ``value`` (a negative one: no limit)."""
    _administrator(call)
    limit, value = _limit_value(call, USER_LIMITS, "user-limits")
    name = call.params["user"]
    if name not in call.node.users_by_name:
        raise Problem(400, "bad_request", ["no_such_user", name])
    call.node.admin.set_user_limit(name, limit, value)
    return 204, None


def clear_user_limit(call: Call) -> Answer:
    """``DELETE /api/user-limits/USER/NAME``."""
    _administrator(call)
    name, limit = call.params["user"], call.params["limit"]
    if name not in call.node.users_by_name:
        raise not_found()
    if limit in USER_LIMITS:
        call.node.admin.set_user_limit(name, limit, None)
    return 204, None


def set_vhost_limit(call: Call) -> Answer:
    """``PUT /api/vhost-limits/VHOST/NAME`` with ``value`` (a negative one: no limit)."""
    _administrator(call)
    name = call.params["vhost"]
    if name not in call.node.vhosts:
        raise Problem(404, "not_found", "vhost_not_found")
    limit, value = _limit_value(call, VHOST_LIMITS, "limits")
    call.node.admin.set_vhost_limit(name, limit, value)
    return 204, None


def clear_vhost_limit(call: Call) -> Answer:
    """``DELETE /api/vhost-limits/VHOST/NAME``."""
    _administrator(call)
    name, limit = call.params["vhost"], call.params["limit"]
    if name not in call.node.vhosts:
        raise not_found()
    if limit in VHOST_LIMITS:
        call.node.admin.set_vhost_limit(name, limit, None)
    return 204, None


def put_vhost(call: Call) -> Answer:
    """``PUT /api/vhosts/NAME`` with ``description`` and ``tags`` (each replaced: left out,
    empty). The user who creates it gets ``.*`` permissions on it, as in RabbitMQ. Tracing
    (the firehose) is not built: ``tracing: true`` is refused, and so is a default queue type
    (``defaultqueuetype``) other than classic."""
    _administrator(call)
    body = call.body()
    if body.get("tracing") not in (None, False, "false"):
        raise Problem(400, "bad_request", "tracing (the firehose) is not supported by Postroom")
    if body.get("defaultqueuetype") not in (None, "", "classic", "undefined"):
        raise Problem(400, "bad_request", "a vhost's default queue type is classic here: Postroom has no quorum queues")
    description = body.get("description", "")
    if not isinstance(description, str | int | float) or isinstance(description, bool):
        raise Problem(400, "bad_request", "description must be a string")
    tags = _tags(body.get("tags", []))
    name, admin = call.params["vhost"], call.node.admin
    new = admin.put_vhost(name, str(description), tags)
    if new and call.user.name in call.node.users_by_name:
        admin.set_permissions(call.user.name, name, Permission())
    return (201 if new else 204), None


def delete_vhost(call: Call) -> Answer:
    """``DELETE /api/vhosts/NAME``: its connections are closed, its queues (with their
    messages), exchanges, policies and permissions deleted."""
    _administrator(call)
    if not call.node.admin.delete_vhost(call.params["vhost"]):
        raise not_found()
    return 204, None

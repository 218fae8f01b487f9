"""Users, permissions, topic permissions and limits, as RabbitMQ's management plugin lists
them (to administrators): ``/api/users``, ``/api/permissions``, ``/api/topic-permissions``,
``/api/user-limits``, ``/api/vhost-limits`` and the views of one user or vhost."""

from __future__ import annotations

from typing import Any

from broker.server.management.common import Call, not_authorised, not_found
from broker.server.management.definitions import export_users
from broker.server.management.router import Router


def install(router: Router) -> None:
    router.add("/users", GET=users)
    router.add("/users/:user", GET=users)
    router.add("/users/:user/permissions", GET=permissions)
    router.add("/users/:user/topic-permissions", GET=topic_permissions)
    router.add("/vhosts/:vhost/permissions", GET=permissions)
    router.add("/vhosts/:vhost/topic-permissions", GET=topic_permissions)
    router.add("/permissions", GET=permissions)
    router.add("/permissions/:vhost/:user", GET=permissions)
    router.add("/topic-permissions", GET=topic_permissions)
    router.add("/topic-permissions/:vhost/:user", GET=topic_permissions)
    router.add("/user-limits", GET=user_limits)
    router.add("/user-limits/:user", GET=user_limits)
    router.add("/vhost-limits", GET=vhost_limits)
    router.add("/vhost-limits/:vhost", GET=vhost_limits)


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


def users(call: Call) -> tuple[int, Any]:
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
    kept = sorted(  # in RabbitMQ's table order (by user, then vhost); lists then sort by vhost
        (item for item in items if all(item[key] == value for key, value in asked.items())),
        key=lambda item: (item["user"], item["vhost"], item.get("exchange", "")),
    )
    if single and "user" in call.params and "vhost" in call.params:
        if not kept:
            raise not_found()
        return kept[0]
    return kept


def permissions(call: Call) -> tuple[int, Any]:
    _users, granted, _topics = _administrator(call)
    return 200, _matching(call, granted, single=True)


def topic_permissions(call: Call) -> tuple[int, Any]:
    _users, _permissions, topics = _administrator(call)
    return 200, _matching(call, topics)


def user_limits(call: Call) -> tuple[int, Any]:
    listed, _permissions, _topics = _administrator(call)
    _known(call)
    return 200, [
        {"user": user["name"], "value": user["limits"]}
        for user in listed
        if user["limits"] and call.params.get("user", user["name"]) == user["name"]
    ]


def vhost_limits(call: Call) -> tuple[int, Any]:
    _administrator(call)
    _known(call)
    limits = []
    for vhost in call.node.vhosts.values():
        value = {
            key: limit
            for key, limit in (("max-connections", vhost.max_connections), ("max-queues", vhost.max_queues))
            if limit is not None
        }
        if value and call.params.get("vhost", vhost.name) == vhost.name:
            limits.append({"vhost": vhost.name, "value": value})
    return 200, limits

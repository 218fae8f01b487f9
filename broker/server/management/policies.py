"""``/api/policies`` and ``/api/operator-policies``: listed, set and cleared as RabbitMQ's
management plugin does, with its rules for who may."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from postroom.broker.core.policy import Policy, PolicyRefused, from_value
from postroom.broker.server.management.common import Answer, Call, Problem, not_authorised, not_found, required
from postroom.broker.server.management.router import Router

if TYPE_CHECKING:
    from postroom.broker.core.users import User
    from postroom.broker.core.vhost import VirtualHost

_log = Logger()


def install(router: Router) -> None:
    for kind, operator in (("policies", False), ("operator-policies", True)):

        def listing(call: Call, operator: bool = operator) -> Answer:
            return 200, policy_list(call, operator)

        def put(call: Call, operator: bool = operator) -> Answer:
            return set_policy(call, operator)

        def delete(call: Call, operator: bool = operator) -> Answer:
            return clear_policy(call, operator)

        router.add(f"/{kind}", GET=listing)
        router.add(f"/{kind}/:vhost", GET=listing)
        router.add(f"/{kind}/:vhost/:name", GET=listing, PUT=put, DELETE=delete)


def policy_view(vhost: VirtualHost, policy: Policy) -> dict[str, Any]:
    return {"vhost": vhost.name, "name": policy.name, **policy.value()}


def policy_list(call: Call, operator: bool) -> Any:
    """``/api/policies[/VHOST[/NAME]]`` (``operator``: ``/api/operator-policies/...``), as
    RabbitMQ's management plugin answers them: lists to any management user, sorted by
    priority; one policy to an administrator, or a policymaker of that vhost (operator
    policies: administrators only)."""
    user, params = call.user, call.params
    if "name" in params:
        _may_set_policies(call, user, params["vhost"], operator)
        vhost = call.context.vhosts(user, params["vhost"])[0]
        policy = (vhost.operator_policies if operator else vhost.policies).get(params["name"])
        if policy is None:
            raise not_found()
        return policy_view(vhost, policy)
    views = [
        policy_view(vhost, policy)
        for vhost in call.context.vhosts(user, params.get("vhost"))
        for policy in (vhost.operator_policies if operator else vhost.policies).values()
    ]
    return sorted(views, key=lambda view: (view["priority"], view["name"]))


def _may_set_policies(call: Call, user: User, vhost_name: str, operator: bool) -> None:
    """RabbitMQ's rule for one policy (to see, set or clear it): an administrator, or a
    policymaker who may open the vhost (a missing vhost is let through to its 404);
    operator policies: administrators only.

    :raises Problem: 401
    """
    if "administrator" in user.tags:
        return
    if operator:
        raise not_authorised("Not administrator user")
    if "policymaker" not in user.tags or (vhost_name in call.node.vhosts and not user.may_open(vhost_name)):
        raise not_authorised("User not authorised to access object")


def set_policy(call: Call, operator: bool) -> tuple[int, None]:
    """``PUT /api/policies/VHOST/NAME``: 201 for a new policy, 204 for a replaced one; 400
    with RabbitMQ's reason for a refused one (for user policies with ``<``, ``>`` and ``&``
    escaped, as RabbitMQ escapes them)."""
    vhost_name, name = call.params["vhost"], call.params["name"]
    _may_set_policies(call, call.user, vhost_name, operator)
    if operator and not (call.request.getHeader(b"content-type") or b"").lower().startswith(b"application/json"):
        raise Problem(415, "", "")  # answered without a body
    vhost = call.node.vhosts.get(vhost_name)
    if vhost is None:
        raise Problem(404, "not_found", "vhost_not_found")
    body = call.body()
    required(body, ("pattern", "definition"))
    value: dict[str, Any] = {key: body[key] for key in ("pattern", "definition", "priority", "apply-to") if key in body}
    try:
        policy = from_value(name, value, operator)
    except PolicyRefused as refused:
        reason = str(refused)
        if not operator:
            reason = reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        raise Problem(400, "bad_request", reason) from None
    table = vhost.operator_policies if operator else vhost.policies
    created = name not in table
    vhost.set_policy(policy, operator)
    _log_change("set", call, operator)
    return (201 if created else 204), None


def clear_policy(call: Call, operator: bool) -> tuple[int, None]:
    """``DELETE /api/policies/VHOST/NAME``: 204, or 404 when there is no such policy."""
    vhost_name, name = call.params["vhost"], call.params["name"]
    _may_set_policies(call, call.user, vhost_name, operator)
    vhost = call.node.vhosts.get(vhost_name)
    if vhost is None or not vhost.clear_policy(name, operator):
        raise not_found()
    _log_change("cleared", call, operator)
    return 204, None


def _log_change(what: str, call: Call, operator: bool) -> None:
    _log.info(
        "{kind} '{name}' in vhost '{vhost}' {what} through the management API by {user}",
        kind="operator policy" if operator else "policy",
        name=call.params["name"],
        vhost=call.params["vhost"],
        what=what,
        user=call.user.name,
    )

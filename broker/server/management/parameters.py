"""Runtime and global parameters, as RabbitMQ's management plugin shows and sets them:
``/api/parameters[/COMPONENT[/VHOST[/NAME]]]`` and ``/api/global-parameters[/NAME]``.

Postroom's runtime parameters are the components it has something behind: ``vhost-limits``
(one parameter, ``limits``, per vhost: the vhost's limits), ``operator_policy`` (the
operator policies, set through ``/api/operator-policies``) and ``shovel`` (dynamic shovels,
checked as RabbitMQ checks them, run by ``broker.server.shovels``). Another component is
refused as RabbitMQ refuses a component no plugin registered. Global parameters are kept as they are set
(``cluster_name`` names the cluster, as ``PUT /api/cluster-name`` does).
"""

from __future__ import annotations

import html

from postroom.broker.core.admin import VHOST_LIMITS, vhost_limits
from postroom.broker.server.management.common import (
    Answer,
    Call,
    Problem,
    erlang_term,
    not_authorised,
    not_found,
    required,
)
from postroom.broker.server.management.router import Router
from postroom.config.shovels import COMPONENT as SHOVEL
from postroom.config.shovels import validate as validate_shovel


def install(router: Router) -> None:
    router.add("/parameters", GET=parameters)
    router.add("/parameters/:component", GET=parameters)
    router.add("/parameters/:component/:vhost", GET=parameters)
    router.add("/parameters/:component/:vhost/:name", GET=parameters, PUT=set_parameter, DELETE=clear_parameter)
    router.add("/global-parameters", GET=global_parameters)
    router.add("/global-parameters/:name", GET=global_parameters, PUT=set_global, DELETE=clear_global)


def _policymaker(call: Call) -> None:
    """RabbitMQ lists and sets runtime parameters for policymakers and administrators."""
    if not {"administrator", "policymaker"} & set(call.user.tags):
        raise not_authorised("Not policymaker user")


def _administrator(call: Call) -> None:
    if "administrator" not in call.user.tags:
        raise not_authorised("Not administrator user")


def parameters(call: Call) -> Answer:
    """The runtime parameters of the vhosts the user may see, narrowed by the path."""
    _policymaker(call)
    params = call.params
    listed = []
    for vhost in call.context.vhosts(call.user, params.get("vhost")):
        limits = vhost_limits(vhost)
        if limits:
            listed.append({"value": limits, "vhost": vhost.name, "component": "vhost-limits", "name": "limits"})
        listed += [
            {"value": policy.value(), "vhost": vhost.name, "component": "operator_policy", "name": policy.name}
            for policy in vhost.operator_policies.values()
        ]
        listed += [
            {"value": value, "vhost": vhost.name, "component": component, "name": name}
            for (component, vhost_name, name), value in call.node.admin.parameters.items()
            if vhost_name == vhost.name
        ]
    listed = [
        item
        for item in listed
        if params.get("component", item["component"]) == item["component"]
        and params.get("name", item["name"]) == item["name"]
    ]
    if "name" in params:
        if not listed:
            raise not_found()
        return 200, listed[0]
    return 200, listed


def set_parameter(call: Call) -> Answer:
    """``PUT /api/parameters/vhost-limits/VHOST/limits`` with ``value``: the vhost's limits,
    replaced; another component is refused, as RabbitMQ refuses one it has no plugin for."""
    _policymaker(call)
    component, name = call.params["component"], call.params["name"]
    if call.params["vhost"] not in call.node.vhosts:
        raise Problem(404, "not_found", "vhost_not_found")
    if component == SHOVEL:
        return _set_shovel(call)
    if component != "vhost-limits":
        raise Problem(400, "bad_request", f"Validation failed\n\ncomponent {component} not found\n")
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    (value,) = required(call.body(), ("value",))
    if name != "limits" or not isinstance(value, dict):
        raise Problem(400, "bad_request", "Validation failed\n\nvhost-limits takes one parameter, limits: an object\n")
    unknown = [key for key in value if key not in VHOST_LIMITS]
    wrong = [key for key, limit in value.items() if not isinstance(limit, int) or isinstance(limit, bool)]
    if unknown or wrong:
        terms = ",".join(f'{{<<"{key}">>,{erlang_term(value[key])}}}' for key in unknown)
        reason = f"Unrecognised terms [{terms}] in limits" if unknown else f"{wrong[0]} should be a number"
        # (RabbitMQ's answer escapes the term's angle brackets, as for HTML)
        raise Problem(400, "bad_request", f"Validation failed\n\n{html.escape(reason, quote=False)}\n")
    new = not vhost_limits(vhost)
    for limit in VHOST_LIMITS:
        call.node.admin.set_vhost_limit(vhost.name, limit, value.get(limit))
    return (201 if new else 204), None


def _set_shovel(call: Call) -> Answer:
    """``PUT /api/parameters/shovel/VHOST/NAME`` with ``value``: a dynamic shovel, checked as
    RabbitMQ checks it (its messages, HTML-escaped as its answer has them), started (again,
    when it changed)."""
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    (value,) = required(call.body(), ("value",))
    user = call.user
    may_open = lambda vhost: vhost in call.node.vhosts and user.may_open(vhost)  # noqa: E731
    problems = validate_shovel(call.params["name"], value, (user.name, may_open))
    if problems:
        reason = "".join(f"{html.escape(problem, quote=False)}\n" for problem in problems)
        raise Problem(400, "bad_request", f"Validation failed\n\n{reason}")
    new = call.node.admin.set_parameter(SHOVEL, vhost.name, call.params["name"], value)
    return (201 if new else 204), None


def clear_parameter(call: Call) -> Answer:
    _policymaker(call)
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    if call.params["component"] == SHOVEL:
        if not call.node.admin.clear_parameter(SHOVEL, vhost.name, call.params["name"]):
            raise not_found()
        return 204, None
    if call.params["component"] != "vhost-limits" or call.params["name"] != "limits" or not vhost_limits(vhost):
        raise not_found()
    for limit in VHOST_LIMITS:
        call.node.admin.set_vhost_limit(vhost.name, limit, None)
    return 204, None


def global_parameters(call: Call) -> Answer:
    """``GET /api/global-parameters[/NAME]`` (administrators)."""
    _administrator(call)
    listed = [{"name": name, "value": value} for name, value in call.node.admin.globals.items()]
    if "name" not in call.params:
        return 200, listed
    for item in listed:
        if item["name"] == call.params["name"]:
            return 200, {"value": item["value"], "name": item["name"]}
    raise not_found()


def set_global(call: Call) -> Answer:
    """``PUT /api/global-parameters/NAME`` with ``value`` (kept as it is)."""
    _administrator(call)
    (value,) = required(call.body(), ("value",))
    name = call.params["name"]
    if name == "cluster_name" and not isinstance(value, str):
        raise Problem(400, "bad_request", "cluster_name must be a string")
    if value is None:
        raise Problem(400, "bad_request", "a global parameter's value cannot be null")
    return (201 if call.node.admin.set_global(name, value) else 204), None


def clear_global(call: Call) -> Answer:
    _administrator(call)
    name = call.params["name"]
    if name not in call.node.admin.globals:
        raise not_found()
    call.node.admin.set_global(name, None)
    return 204, None

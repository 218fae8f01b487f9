"""Shovels' status, as RabbitMQ's shovel management plugin shows it: ``GET /api/shovels``,
``/api/shovels/VHOST``, ``DELETE /api/shovels/vhost/VHOST/NAME`` (the shovel's parameter is
cleared) and ``DELETE /api/shovels/vhost/VHOST/NAME/restart``. With ``?counters=true`` a status
has Postroom's counters besides: ``messages`` moved, ``redelivered`` (possible duplicates),
``nacked`` and ``restarts``. Shovels are declared as runtime parameters
(``/api/parameters/shovel``, ``broker.server.management.parameters``).
"""

from __future__ import annotations

from typing import Any

from postroom.broker.server.management.common import SEE_ALL_TAGS, Answer, Call, not_authorised, not_found
from postroom.broker.server.management.router import Router
from postroom.config.shovels import COMPONENT


def install(router: Router) -> None:
    router.add("/shovels", GET=status)
    router.add("/shovels/:vhost", GET=status)
    router.add("/shovels/vhost/:vhost/:name", GET=status, DELETE=delete)
    router.add("/shovels/vhost/:vhost/:name/restart", GET=status, DELETE=restart)


def _monitor(call: Call) -> None:
    if SEE_ALL_TAGS.isdisjoint(call.user.tags):
        raise not_authorised("Not monitor user")


def _shovel(call: Call) -> Any:
    """The shovel the path names (404 when it has no status), after the vhost's checks."""
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    shovels = call.context.shovels
    shovel = shovels.active.get((vhost.name, call.params["name"])) if shovels is not None else None
    if shovel is None:
        raise not_found()
    return shovel


def status(call: Call) -> Answer:
    """The shovels of the vhosts the user may see (of one vhost with a path naming it; with a
    shovel's name too, as RabbitMQ answers: that vhost's, when that shovel exists)."""
    _monitor(call)
    if "name" in call.params:
        _shovel(call)
    shown = {vhost.name for vhost in call.context.vhosts(call.user, call.params.get("vhost"))}
    counters = call.query.get("counters", [""])[-1] == "true"
    shovels = call.context.shovels
    return 200, [shovel.status(counters) for shovel in shovels or () if shovel.spec.vhost in shown]


def delete(call: Call) -> Answer:
    """Delete a shovel: its parameter is cleared, so it stops and is not started again."""
    _monitor(call)
    shovel = _shovel(call)
    call.node.admin.clear_parameter(COMPONENT, shovel.spec.vhost, shovel.spec.name)
    return 204, None


def restart(call: Call) -> Answer:
    """Stop a shovel and start it again (its connections are made anew)."""
    _monitor(call)
    shovel = _shovel(call)
    shovel.shovels.restart(shovel)
    return 204, None

"""The management API: JSON over HTTP, in the shape of RabbitMQ's management plugin.

Its parts, each routing its own paths (see :func:`~broker.server.management.api.routes`):

* :mod:`~broker.server.management.api`: the resource, logins and answers;
* :mod:`~broker.server.management.health`: ``whoami``, the aliveness test, the health checks,
  ``cluster-name``, ``extensions``, ``feature-flags``;
* :mod:`~broker.server.management.views`: the overview, nodes, vhosts, queues, exchanges,
  bindings, consumers, connections and channels;
* :mod:`~broker.server.management.objects`: purging and peeking at queues, closing connections;
* :mod:`~broker.server.management.policies`: policies and operator policies;
* :mod:`~broker.server.management.definitions`: the definitions export;
* :mod:`~broker.server.management.users`: users, permissions and limits (listed);
* :mod:`~broker.server.management.streams`: Postroom's ``/api/streams``.

Requests authenticate with HTTP Basic and the AMQP users (a ``loopback_only`` user only from
loopback); a user limited to some vhosts sees only those. Everything runs on the reactor
thread, reading the broker's state directly. Rates come from :class:`RateSampler`, which
reads the counters every few seconds; nothing here runs per message.
"""

from postroom.broker.server.identity import NODE_NAME
from postroom.broker.server.management.api import ManagementAPI, management_site
from postroom.broker.server.management.common import MANAGEMENT_TAGS
from postroom.broker.server.management.definitions import export_users
from postroom.broker.server.management.rates import RateSampler

__all__ = ["MANAGEMENT_TAGS", "NODE_NAME", "ManagementAPI", "RateSampler", "export_users", "management_site"]

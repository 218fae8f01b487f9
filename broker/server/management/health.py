"""Who is asking, and whether the node is well: ``/api/whoami``, ``/api/aliveness-test``,
the health checks RabbitMQ 3.10 serves under ``/api/health/checks`` (those Kubernetes probes
and monitoring call), and the node's ``/api/cluster-name``, ``/api/extensions`` and
``/api/feature-flags``. A failed check is 503 with RabbitMQ's body."""

from __future__ import annotations

import time
from typing import Any

from cryptography import x509

from postroom.broker.core.message import Message
from postroom.broker.core.node import ListenerInfo
from postroom.broker.server.identity import node_name
from postroom.broker.server.management.common import Answer, Call, Problem, not_authorised, not_found, required
from postroom.broker.server.management.router import Router

#: The queue ``/api/aliveness-test/VHOST`` declares and leaves in place, as RabbitMQ does.
ALIVENESS_QUEUE = "aliveness-test"

#: A failed check's status (RabbitMQ's ``HEALTH_CHECK_FAILURE_STATUS``).
FAILED = 503

#: The alarms health checks report, by RabbitMQ's name for each resource (the ``log``
#: alarm, Postroom's own flow control, is not a resource alarm).
_RESOURCES = {"memory": "memory", "disk": "disk space"}

_DAY = 86400
#: RabbitMQ's units for certificate expiration, in seconds (a month is a twelfth of a year).
_UNITS = {"days": _DAY, "weeks": 7 * _DAY, "months": _DAY * 365 / 12, "years": 365 * _DAY}

#: RabbitMQ's other names for the protocols a listener serves (``normalize_protocol``).
_PROTOCOL_NAMES = {
    **dict.fromkeys(("amqp091", "amqp0.9.1", "amqp0-9-1", "amqp0_9_1", "amqp10", "amqp1.0", "amqp1-0"), "amqp"),
    "amqp1_0": "amqp",
    "amqps": "amqp/ssl",
    **dict.fromkeys(("http1", "http1.1", "http_api", "management", "management_ui", "ui"), "http"),
    "cli": "clustering",
    "distribution": "clustering",
}

_AGENT = "rabbitmq_management_agent"
#: RabbitMQ 3.10.8's feature flags, and whether Postroom has what each stands for:
#: ``unavailable`` (RabbitMQ's word for a flag a node does not support) where it does not.
FEATURE_FLAGS = (
    ("classic_mirrored_queue_version", "Support setting version for classic mirrored queues", "", "rabbit", False),
    ("drop_unroutable_metric", "Count unroutable publishes to be dropped in stats", "", _AGENT, True),
    ("empty_basic_get_metric", "Count AMQP `basic.get` on empty queues in stats", "", _AGENT, True),
    (
        "implicit_default_bindings",
        "Default bindings are now implicit, instead of being stored in the database",
        "",
        "rabbit",
        True,
    ),
    ("maintenance_mode_status", "Maintenance mode status", "", "rabbit", False),
    ("quorum_queue", "Support queues of type `quorum`", "https://www.rabbitmq.com/quorum-queues.html", "rabbit", False),
    ("stream_queue", "Support queues of type `stream`", "https://www.rabbitmq.com/stream.html", "rabbit", True),
    ("user_limits", "Configure connection and channel limits for a user", "", "rabbit", True),
    ("virtual_host_metadata", "Virtual host metadata (description, tags, etc)", "", "rabbit", True),
)


def install(router: Router) -> None:
    router.add("/cluster-name", GET=cluster_name, PUT=set_cluster_name)
    router.add("/extensions", GET=extensions)
    router.add("/feature-flags", GET=feature_flags)
    router.add("/whoami", GET=whoami)
    router.add("/aliveness-test/:vhost", GET=aliveness)
    router.add("/healthchecks/node", GET=_ok)
    router.add("/healthchecks/node/:node", GET=node_check)
    router.add("/health/checks/alarms", GET=alarms)
    router.add("/health/checks/local-alarms", GET=local_alarms)
    router.add("/health/checks/certificate-expiration/:within/:unit", GET=certificate_expiration)
    router.add("/health/checks/port-listener/:port", GET=port_listener)
    router.add("/health/checks/protocol-listener/:protocol", GET=protocol_listener)
    router.add("/health/checks/virtual-hosts", GET=_ok)
    router.add("/health/checks/node-is-mirror-sync-critical", GET=_single_node)
    router.add("/health/checks/node-is-quorum-critical", GET=_single_node)


def _ok(call: Call) -> Answer:
    return 200, {"status": "ok"}


def _single_node(call: Call) -> Answer:
    """No other node depends on this one: nothing is critical (RabbitMQ's answer on one node)."""
    return 200, {"status": "ok", "reason": "single node cluster"}


def cluster_name(call: Call) -> Answer:
    """The name set with ``PUT`` (kept in the log), else the node's."""
    return 200, {"name": call.node.admin.cluster_name or node_name()}


def set_cluster_name(call: Call) -> Answer:
    """``PUT /api/cluster-name`` with ``name`` (administrators)."""
    if "administrator" not in call.user.tags:
        raise not_authorised("Not administrator user")
    (name,) = required(call.body(), ("name",))
    if not isinstance(name, str):
        raise Problem(400, "bad_request", "name must be a string")
    call.node.admin.set_cluster_name(name)
    return 204, None


def extensions(call: Call) -> Answer:
    """Scripts that extend the web UI: Postroom's UI has none."""
    return 200, []


def feature_flags(call: Call) -> Answer:
    return 200, [
        {
            "name": name,
            "desc": description,
            "doc_url": url,
            "state": "enabled" if present else "unavailable",
            "stability": "stable",
            "provided_by": provider,
        }
        for name, description, url, provider, present in FEATURE_FLAGS
    ]


def whoami(call: Call) -> Answer:
    return 200, {"name": call.user.name, "tags": sorted(call.user.tags)}


def node_check(call: Call) -> Answer:
    if call.params["node"] != node_name():
        raise not_found()
    return _ok(call)


def aliveness(call: Call) -> Answer:
    """Declare the ``aliveness-test`` queue in the vhost, put a message in it and take it
    out, as RabbitMQ does through a channel of the user's."""
    vhost = call.context.vhosts(call.user, call.params["vhost"])[0]
    queue = vhost.declare_queue(ALIVENESS_QUEUE, None)
    queue.enqueue(Message.build("", ALIVENESS_QUEUE, b"test_message"))
    entry = queue.get()
    if entry is None:
        return FAILED, {"status": "failed", "reason": "aliveness-test queue is empty"}
    queue.settle([entry])
    return 200, {"status": "ok"}


def _alarms(call: Call, where: str) -> Answer:
    raised = [{"resource": _RESOURCES[name], "node": node_name()} for name in _RESOURCES if name in call.node.alarms]
    if not raised:
        return 200, {"status": "ok"}
    return FAILED, {"status": "failed", "reason": f"There are alarms in effect {where}", "alarms": raised}


def alarms(call: Call) -> Answer:
    return _alarms(call, "in the cluster")


def local_alarms(call: Call) -> Answer:
    return _alarms(call, "on the node")


def port_listener(call: Call) -> Answer:
    try:
        port = int(call.params["port"])
    except ValueError:
        raise Problem(400, "bad_request", "Invalid port") from None
    ports = [listener.port for listener in call.node.listeners]
    if port not in ports:
        return FAILED, {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports}
    return 200, {"status": "ok", "port": port}


def protocol_listener(call: Call) -> Answer:
    asked = call.params["protocol"].lower()
    protocol = _PROTOCOL_NAMES.get(asked, asked)
    protocols = [listener.protocol for listener in call.node.listeners]
    if protocol not in protocols:
        return FAILED, {"status": "failed", "reason": "No active listener", "missing": protocol, "protocols": protocols}
    return 200, {"status": "ok", "protocol": protocol}


def certificate_expiration(call: Call) -> Answer:
    """Whether a TLS listener's certificate, or a CA certificate it trusts, expires within the
    given time (RabbitMQ's check: ``/certificate-expiration/4/weeks``)."""
    try:
        within = int(call.params["within"])
    except ValueError:
        raise Problem(400, "bad_request", "Invalid expiration value.") from None
    unit = _UNITS.get(call.params["unit"].lower())
    if unit is None:
        raise Problem(400, "bad_request", "Time unit not recognised. Supported units: days, weeks, months, years.")
    deadline = time.time() + within * unit
    expiring = [entry for entry in (_expiring(listener, deadline) for listener in call.node.listeners) if entry]
    if not expiring:
        return 200, {"status": "ok"}
    return FAILED, {"status": "failed", "reason": "Certificates expiring", "expired": expiring}


def _expiring(listener: ListenerInfo, deadline: float) -> dict[str, Any] | None:
    """The listener as RabbitMQ reports one whose certificates expire before ``deadline``."""
    if listener.certfile is None:
        return None
    certificate = _expires_on(listener.certfile, deadline)
    authorities = [moment for path in listener.cacertfiles for moment in _expires_on(path, deadline)]
    if not certificate and not authorities:
        return None
    return {
        "node": node_name(),
        "protocol": listener.protocol,
        "interface": listener.interface,
        "port": listener.port,
        "certfile": listener.certfile,
        "cacertfile": ",".join(listener.cacertfiles),
        "certfile_expires_on": certificate,
        "cacertfile_expires_on": authorities,
    }


def _expires_on(path: str, deadline: float) -> list[str]:
    """When the certificates in ``path`` that expire before ``deadline`` do (RabbitMQ's
    ``YYYY-MM-DD H:MM:SS``, UTC); one that cannot be read says why instead."""
    try:
        with open(path, "rb") as pem:
            certificates = x509.load_pem_x509_certificates(pem.read())
    except (OSError, ValueError) as problem:
        return [f"cannot read {path}: {problem}"]
    return [
        f"{moment.year}-{moment:%m-%d} {moment.hour}:{moment:%M:%S}"
        for moment in (certificate.not_valid_after_utc for certificate in certificates)
        if moment.timestamp() < deadline
    ]

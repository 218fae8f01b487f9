"""Live administration: users, vhosts, permissions, topic permissions and limits changed while
the broker runs, recorded in the write-ahead log and restored at start.

Each user and each vhost is one definition in the log (``broker.wal.records.Defined``), its
whole state in JSON, written again whenever any of it changes: a user's password hash, tags,
limits, permissions and topic permissions; a vhost's description, tags and limits. A deleted
one is an ``Undefined`` record. A password is never written in clear: one set in clear is
hashed first as RabbitMQ hashes it (salted SHA-256, :func:`rabbitmq_hash`).

A change applies at once, as RabbitMQ 3.10 applies it:

* a deleted user's connections are closed (320 CONNECTION_FORCED);
* permissions changed or cleared on a vhost apply to the user's open channels there from
  their next check on (a channel forgets the exchanges it was allowed to publish to: stricter
  than RabbitMQ, whose channels keep their last few permitted resources); with none left, the
  user's connections there stay open, refused everything they ask, as in RabbitMQ;
* a deleted vhost's connections are closed and its queues and exchanges deleted, with their
  messages.

At start the log's definitions are restored first; then the configuration's users and vhosts
are applied over them (see :func:`broker.core.definitions.node_from_config`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from postroom.broker.core.access import compile_access
from postroom.broker.core.releases import AWAITING_RELEASE, AwaitingRelease
from postroom.broker.core.retained import RETAINED, RetainedMessages
from postroom.broker.core.users import User
from postroom.broker.errors import ReplyCode
from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import Defined
from postroom.config.schema import Permission, TopicPermission

if TYPE_CHECKING:
    from postroom.broker.core.journal import Journal
    from postroom.broker.core.vhost import VirtualHost

#: The definition kinds in the log.
USER = "user"
VHOST = "vhost"
#: The node's first start with a log is marked (RabbitMQ creates its default user and vhost
#: only on a fresh database; so does Postroom, see ``broker.core.definitions``).
NODE = "node"
INITIALISED = "initialised"
#: Global parameters (``cluster_name``, ``internal_cluster_id`` and any an operator sets).
GLOBAL = "global"
#: Runtime parameters of components kept as they are set (shovels), keyed by
#: :func:`parameter_key`.
PARAMETER = "parameter"

#: The user limits and vhost limits RabbitMQ 3.10 knows, by their names in its API.
USER_LIMITS = ("max-connections", "max-channels")
VHOST_LIMITS = ("max-connections", "max-queues")

#: RabbitMQ's password hashing modules and the prefix Postroom keeps their hashes under.
HASHING_PREFIXES = {
    "rabbit_password_hashing_sha256": "rabbitmq-sha256",
    "rabbit_password_hashing_sha512": "rabbitmq-sha512",
    "rabbit_password_hashing_md5": "rabbitmq-md5",
}

#: Why a connection is closed when its user or vhost goes, in RabbitMQ's words.
USER_DELETED = "user '{user}' is deleted"
VHOST_DELETED = "vhost '{vhost}' is deleted"
#: What a user whose permissions on a vhost were cleared may still do on a connection open
#: there: nothing (a pattern no name matches).
NOTHING = Permission("(?!)", "(?!)", "(?!)")


def rabbitmq_hash(password: str, salt: bytes | None = None) -> str:
    """``password`` hashed as RabbitMQ 3.10 hashes a password given in clear (its default,
    ``rabbit_password_hashing_sha256``: ``base64(salt + sha256(salt + password))``, 4 random
    bytes of salt), with Postroom's prefix: ``rabbitmq-sha256$...``."""
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return "rabbitmq-sha256$" + base64.b64encode(salt + digest).decode()


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogateescape")


def _load(record: Defined) -> dict[str, Any]:
    value = json.loads(record.value.decode("utf-8", "surrogateescape"))
    if not isinstance(value, dict):
        raise ValueError(f"{record.kind} '{record.key}' is not an object")
    return value


def user_value(user: User) -> dict[str, Any]:
    """A user's definition as recorded (a password in clear is hashed here)."""
    password_hash = user.password_hash
    if password_hash is None and user.password is not None:
        password_hash = rabbitmq_hash(user.password)
    value: dict[str, Any] = {
        "password_hash": password_hash,
        "tags": list(user.tags),
        "loopback_only": user.loopback_only,
        "limits": user_limits(user),
        "permissions": None
        if user.permissions is None
        else {vhost: [p.configure, p.write, p.read] for vhost, p in user.permissions.items()},
        "topic_permissions": {
            vhost: {exchange: [t.write, t.read] for exchange, t in exchanges.items()}
            for vhost, exchanges in (user.topic_permissions or {}).items()
        },
    }
    if user.vhosts is not None:
        value["vhosts"] = sorted(user.vhosts)
    return value


def user_from_value(name: str, value: Mapping[str, Any]) -> User:
    """The user a recorded definition describes."""
    permissions = value.get("permissions")
    limits = value.get("limits") or {}
    vhosts = value.get("vhosts")
    return User(
        name,
        password_hash=value.get("password_hash"),
        loopback_only=bool(value.get("loopback_only", False)),
        vhosts=None if vhosts is None else frozenset(vhosts),
        permissions=None
        if permissions is None
        else {vhost: Permission(*patterns) for vhost, patterns in permissions.items()},
        topic_permissions={
            vhost: {exchange: TopicPermission(*patterns) for exchange, patterns in exchanges.items()}
            for vhost, exchanges in (value.get("topic_permissions") or {}).items()
        }
        or None,
        tags=tuple(value.get("tags") or ()),
        max_connections=limits.get("max-connections"),
        max_channels=limits.get("max-channels"),
    )


def same_user(stored: User, wanted: User) -> bool:
    """Whether ``stored`` already is ``wanted`` (a password in clear matches the stored hash)."""

    def without_password(user: User) -> dict[str, Any]:
        return user_value(replace(user, password=None, password_hash=None))

    if without_password(stored) != without_password(wanted):
        return False
    if wanted.password is not None:
        return stored.password == wanted.password or (
            stored.password_hash is not None and stored.check_password(wanted.password)
        )
    return stored.password_hash == wanted.password_hash and stored.password is None


def vhost_value(vhost: VirtualHost) -> dict[str, Any]:
    """A vhost's definition as recorded."""
    return {
        "description": vhost.description,
        "tags": list(vhost.tags),
        "limits": vhost_limits(vhost),
    }


def vhost_limits(vhost: VirtualHost) -> dict[str, int]:
    """A vhost's limits by RabbitMQ's names (those set only)."""
    return {
        name: limit
        for name, limit in zip(VHOST_LIMITS, (vhost.max_connections, vhost.max_queues), strict=True)
        if limit is not None
    }


def user_limits(user: User) -> dict[str, int]:
    """A user's limits by RabbitMQ's names (those set only)."""
    return {
        name: limit
        for name, limit in zip(USER_LIMITS, (user.max_connections, user.max_channels), strict=True)
        if limit is not None
    }


def parameter_key(component: str, vhost: str, name: str) -> str:
    """A runtime parameter's key in the log: its component, vhost and name (any characters)."""
    return json.dumps([component, vhost, name])


#: Told of each runtime parameter set (its value) or cleared (``None``).
ParameterWatcher = Callable[[str, str, str, "Mapping[str, Any] | None"], None]


class Administered(Protocol):
    """The node whose users and vhosts an :class:`Administration` changes (``broker.core.node.Node``)."""

    journal: Journal | None
    vhosts: dict[str, VirtualHost]
    users_by_name: dict[str, User]
    #: Open connections (AMQP's, MQTT's), and those of each user (closed when their user or
    #: vhost goes).
    connections: set[Any]
    mqtt_connections: set[Any]
    user_connections: dict[str, set[Any]]
    #: MQTT's retained messages (in the log beside the definitions).
    retained: RetainedMessages
    #: MQTT's QoS 2 publishes awaiting release (in the log beside the definitions).
    awaiting_release: AwaitingRelease

    def add_vhost(self, name: str) -> VirtualHost:
        """Create a virtual host."""
        ...

    def users_changed(self) -> None:
        """Users were added, changed or removed."""


class Administration:
    """Changes to a node's users and vhosts, applied at once and recorded.

    :param node: the node whose users and vhosts change
    """

    def __init__(self, node: Administered) -> None:
        self.node = node
        #: RabbitMQ's global parameters by name (``PUT /api/global-parameters/NAME``), in the
        #: order set: ``cluster_name`` (``PUT /api/cluster-name``), ``internal_cluster_id``
        #: (made on the first start) and any an operator sets (kept and listed, as RabbitMQ's).
        self.globals: dict[str, Any] = {"internal_cluster_id": "rabbitmq-cluster-id-" + secrets.token_urlsafe(16)}
        #: Runtime parameters kept as they are set, by ``(component, vhost, name)`` in the order
        #: set: shovels (``config.shovels``); vhost limits and operator policies live on
        #: their vhosts.
        self.parameters: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: Told of every change to :attr:`parameters` (what runs shovels watches).
        self.parameter_watchers: list[ParameterWatcher] = []

    # -- recording ---------------------------------------------------------------------------------

    def _record(self, kind: str, key: str, value: Mapping[str, Any] | None) -> None:
        if self.node.journal is not None:
            self.node.journal.defined(kind, key, None if value is None else _dump(value))

    def records(self) -> list[bytes]:
        """Every definition as it is now, encoded: the head of each new log segment and of a
        checkpoint holds them, so that no older segment holds the only record of one."""
        node = self.node
        records = [encode(Defined(NODE, INITIALISED, b"{}"))]
        records += [encode(Defined(VHOST, vhost.name, _dump(vhost_value(vhost)))) for vhost in node.vhosts.values()]
        records += [encode(Defined(USER, user.name, _dump(user_value(user)))) for user in node.users_by_name.values()]
        records += [encode(Defined(GLOBAL, name, _dump({"value": value}))) for name, value in self.globals.items()]
        records += [
            encode(Defined(PARAMETER, parameter_key(*key), _dump(value))) for key, value in self.parameters.items()
        ]
        return records + node.retained.records() + node.awaiting_release.records()

    def initialise(self) -> None:
        """Mark the log as holding the node's definitions, recording each as it is now."""
        self._record(NODE, INITIALISED, {})
        for vhost in self.node.vhosts.values():
            self._record(VHOST, vhost.name, vhost_value(vhost))
        for user in self.node.users_by_name.values():
            self._record(USER, user.name, user_value(user))
        for name, value in self.globals.items():
            self._record(GLOBAL, name, {"value": value})
        for key, value in self.parameters.items():
            self._record(PARAMETER, parameter_key(*key), value)

    def restore(self, definitions: Iterable[Defined], warn: Callable[[str], None]) -> bool:
        """Set the users, vhosts, global and runtime parameters the log holds, recording nothing.

        :param warn: told of a definition this version cannot read (it is left out)
        :returns: whether the log was initialised (held the node's definitions)
        """
        node = self.node
        initialised = False
        retained: list[Defined] = []
        releases: list[Defined] = []
        for record in definitions:
            try:
                if record.kind == NODE:
                    initialised = True
                    continue
                if record.kind == RETAINED:
                    retained.append(record)
                    continue
                if record.kind == AWAITING_RELEASE:
                    releases.append(record)
                    continue
                value = _load(record)
                if record.kind == USER:
                    node.users_by_name[record.key] = user_from_value(record.key, value)
                elif record.kind == VHOST:
                    vhost = node.vhosts.get(record.key) or node.add_vhost(record.key)
                    _describe(vhost, value)
                elif record.kind == GLOBAL:
                    self.globals[record.key] = value["value"]
                elif record.kind == PARAMETER:
                    component, vhost_name, name = json.loads(record.key)
                    self.parameters[(component, vhost_name, name)] = value
                else:
                    warn(f"the write-ahead log holds a definition this version does not know: {record.kind}")
            except (ValueError, TypeError, KeyError) as error:
                warn(f"the write-ahead log's definition of {record.kind} '{record.key}' is not read: {error}")
        node.users_changed()
        try:
            node.retained.restore(retained, node.vhosts)
        except (ValueError, TypeError, IndexError) as error:
            warn(f"the write-ahead log's retained messages are not read: {error}")
        try:
            node.awaiting_release.restore(releases, node.vhosts)
        except (ValueError, TypeError, struct.error) as error:
            warn(f"the write-ahead log's MQTT QoS 2 publishes awaiting release are not read: {error}")
        return initialised

    # -- users --------------------------------------------------------------------------------

    def put_user(self, user: User) -> bool:
        """Create ``user`` or replace the one of its name (its connections keep going, under the
        new definition from their next check on); records it unless it is unchanged.

        :returns: whether the user is new
        """
        node = self.node
        old = node.users_by_name.get(user.name)
        if old is not None and same_user(old, user):
            return False
        if user.password is not None:
            # Never kept in clear: hashed as RabbitMQ hashes it (the check stays cheap).
            user = replace(user, password=None, password_hash=rabbitmq_hash(user.password))
        node.users_by_name[user.name] = user
        node.users_changed()
        self._record(USER, user.name, user_value(user))
        self._refresh(user)
        return old is None

    def delete_user(self, name: str) -> bool:
        """Delete a user and close its connections; whether there was one."""
        node = self.node
        if node.users_by_name.pop(name, None) is None:
            return False
        node.users_changed()
        self._record(USER, name, None)
        for connection in list(node.user_connections.get(name, ())):
            connection.close(ReplyCode.CONNECTION_FORCED, USER_DELETED.format(user=name))
        return True

    def _change(self, name: str, **changes: Any) -> User:
        node = self.node
        user = replace(node.users_by_name[name], **changes)
        node.users_by_name[name] = user
        self._record(USER, name, user_value(user))
        self._refresh(user)
        return user

    def granted(self, user: User) -> dict[str, Permission]:
        """The user's permissions as a table: a configured user with none listed has ``.*`` on
        every vhost; changing one of them spells that out first."""
        if user.permissions is None:
            return {name: Permission() for name in self.node.vhosts if user.may_open(name)}
        return {vhost: Permission(p.configure, p.write, p.read) for vhost, p in user.permissions.items()}

    def set_permissions(self, name: str, vhost: str, permission: Permission) -> bool:
        """Set a user's permissions on a vhost; whether it had none there."""
        user = self.node.users_by_name[name]
        granted = self.granted(user)
        new = vhost not in granted
        if granted.get(vhost) == permission and user.permissions is not None:
            return False
        granted[vhost] = permission
        self._change(name, permissions=granted, vhosts=None)
        return new

    def clear_permissions(self, name: str, vhost: str) -> bool:
        """Clear a user's permissions on a vhost (its connections there stay open, refused what
        they ask, as in RabbitMQ); whether there were any."""
        user = self.node.users_by_name[name]
        granted = self.granted(user)
        if granted.pop(vhost, None) is None:
            return False
        self._change(name, permissions=granted, vhosts=None)
        return True

    def set_topic_permissions(self, name: str, vhost: str, exchange: str, permission: TopicPermission) -> bool:
        """Set a user's topic permissions on one exchange of a vhost; whether it had none on
        that vhost."""
        user = self.node.users_by_name[name]
        topics = {v: dict(exchanges) for v, exchanges in (user.topic_permissions or {}).items()}
        new = vhost not in topics  # (RabbitMQ: one object per user and vhost)
        exchanges = topics.setdefault(vhost, {})
        if exchanges.get(exchange) == permission:
            return False
        exchanges[exchange] = permission
        self._change(name, topic_permissions=topics)
        return new

    def clear_topic_permissions(self, name: str, vhost: str, exchange: str | None = None) -> bool:
        """Clear a user's topic permissions on a vhost (on one exchange, or all); whether any were."""
        user = self.node.users_by_name[name]
        topics = {v: dict(exchanges) for v, exchanges in (user.topic_permissions or {}).items()}
        exchanges = topics.get(vhost, {})
        if exchange is None:
            cleared = topics.pop(vhost, None) is not None
        else:
            cleared = exchanges.pop(exchange, None) is not None
            if not exchanges:
                topics.pop(vhost, None)
        if cleared:
            self._change(name, topic_permissions=topics or None)
        return cleared

    def set_user_limit(self, name: str, limit: str, value: int | None) -> None:
        """Set (or with ``None`` clear) one of a user's limits (:data:`USER_LIMITS`)."""
        field = {"max-connections": "max_connections", "max-channels": "max_channels"}[limit]
        if getattr(self.node.users_by_name[name], field) != value:
            self._change(name, **{field: value})

    def _refresh(self, user: User) -> None:
        """Hand the user's open connections its new definition: their permission checks from
        now on follow it, and a connection to a vhost it may no longer open is closed."""
        for connection in list(self.node.user_connections.get(user.name, ())):
            vhost = connection.vhost
            if vhost is None:
                continue
            connection.user = user
            if user.may_open(vhost.name):
                connection.set_access(user.access(vhost.name))
            else:  # (RabbitMQ keeps the connection open, and refuses what it asks from then on)
                connection.set_access(compile_access(user.name, vhost.name, NOTHING))

    # -- vhosts -------------------------------------------------------------------------------

    def put_vhost(self, name: str, description: str | None = None, tags: Iterable[str] | None = None) -> bool:
        """Create a vhost or change its description or tags (``None``: kept as it is); whether
        it is new."""
        node = self.node
        vhost = node.vhosts.get(name)
        new = vhost is None
        if vhost is None:
            vhost = node.add_vhost(name)
        before = vhost_value(vhost)
        if description is not None:
            vhost.description = description
        if tags is not None:
            vhost.tags = tuple(tags)
        if new or vhost_value(vhost) != before:
            self._record(VHOST, name, vhost_value(vhost))
        return new

    def set_vhost_limit(self, name: str, limit: str, value: int | None) -> None:
        """Set (or with ``None`` clear) one of a vhost's limits (:data:`VHOST_LIMITS`)."""
        vhost = self.node.vhosts[name]
        field = {"max-connections": "max_connections", "max-queues": "max_queues"}[limit]
        if getattr(vhost, field) != value:
            setattr(vhost, field, value)
            self._record(VHOST, name, vhost_value(vhost))

    def delete_vhost(self, name: str) -> bool:
        """Delete a vhost: its connections are closed, its queues (with their messages),
        exchanges and policies deleted, and every permission on it cleared; whether there
        was one."""
        node = self.node
        vhost = node.vhosts.get(name)
        if vhost is None:
            return False
        for connection in [*node.connections, *node.mqtt_connections]:
            if connection.vhost is vhost:
                connection.close(ReplyCode.CONNECTION_FORCED, VHOST_DELETED.format(vhost=name))
        node.retained.forget_vhost(name)
        node.awaiting_release.forget_vhost(name)
        for component, vhost_name, parameter in [key for key in self.parameters if key[1] == name]:
            self.clear_parameter(component, vhost_name, parameter)
        vhost.delete_everything()
        del node.vhosts[name]
        self._record(VHOST, name, None)
        for user in list(node.users_by_name.values()):
            changes: dict[str, Any] = {}
            if user.permissions is not None and name in user.permissions:
                changes["permissions"] = {v: p for v, p in user.permissions.items() if v != name}
            if user.topic_permissions and name in user.topic_permissions:
                changes["topic_permissions"] = {v: t for v, t in user.topic_permissions.items() if v != name} or None
            if changes:
                self._change(user.name, **changes)
        return True

    @property
    def cluster_name(self) -> str | None:
        """The cluster's name (``PUT /api/cluster-name``); ``None``: the node's default."""
        name = self.globals.get("cluster_name")
        return name if isinstance(name, str) else None

    def set_global(self, name: str, value: Any) -> bool:
        """Set a global parameter (``None``: clear it); whether it is new."""
        new = name not in self.globals
        if value is None:
            if not new:
                del self.globals[name]
                self._record(GLOBAL, name, None)
            return False
        if new or self.globals[name] != value:
            self.globals[name] = value
            self._record(GLOBAL, name, {"value": value})
        return new

    def set_parameter(self, component: str, vhost: str, name: str, value: Mapping[str, Any]) -> bool:
        """Set a runtime parameter (checked by the caller); whether it is new. An unchanged one
        is left alone (a shovel keeps running, as RabbitMQ's)."""
        key = (component, vhost, name)
        new = key not in self.parameters
        if new or self.parameters[key] != value:
            self.parameters[key] = dict(value)
            self._record(PARAMETER, parameter_key(*key), value)
            for watcher in list(self.parameter_watchers):
                watcher(component, vhost, name, value)
        return new

    def clear_parameter(self, component: str, vhost: str, name: str) -> bool:
        """Clear a runtime parameter; whether there was one."""
        if self.parameters.pop((component, vhost, name), None) is None:
            return False
        self._record(PARAMETER, parameter_key(component, vhost, name), None)
        for watcher in list(self.parameter_watchers):
            watcher(component, vhost, name, None)
        return True

    def set_cluster_name(self, name: str) -> None:
        """Name the cluster (``PUT /api/cluster-name``)."""
        self.set_global("cluster_name", name)


def _describe(vhost: VirtualHost, value: Mapping[str, Any]) -> None:
    vhost.description = str(value.get("description") or "")
    vhost.tags = tuple(value.get("tags") or ())
    limits = value.get("limits") or {}
    vhost.max_connections = limits.get("max-connections")
    vhost.max_queues = limits.get("max-queues")

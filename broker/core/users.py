"""Users: who may log in, with what password, to which virtual hosts, with which permissions.

A :class:`User` is an immutable record; the node (``broker.core.node``) keeps them by name and
the administration (``broker.core.admin``) replaces them as they change. Passwords are kept
as scrypt hashes (:func:`hash_password`), or as RabbitMQ's salted digests from a definitions
export.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from postroom.broker.core.access import Access, Patterns, TopicPatterns, compile_access


@dataclass(frozen=True, slots=True)
class User:
    """A user who may log in.

    :param password: the password in clear (as in the embedded default's guest/guest)
    :param password_hash: ``scrypt$N$r$p$salt$hash`` (salt and hash in base64), see :func:`hash_password`;
        or a hash from a RabbitMQ definitions export: ``rabbitmq-sha256$<base64>`` (also ``-sha512``,
        ``-md5``), as RabbitMQ computes it: ``base64(salt + sha256(salt + password))``, 4-byte salt
    :param loopback_only: the user may connect only from a loopback address (RabbitMQ's rule for guest)
    :param vhosts: the virtual hosts the user may open; ``None`` for all of them
    :param tags: RabbitMQ's user tags (what the user may do in the management API)
    :param permissions: the user's ``configure``, ``write`` and ``read`` patterns per vhost
        (``config.schema.Permission``); when given, the user may open these vhosts only
        (RabbitMQ's rule), and is held to the patterns there (see :mod:`broker.core.access`)
    :param topic_permissions: per vhost and topic exchange, ``write`` and ``read`` patterns on
        routing keys (``config.schema.TopicPermission``)
    """

    name: str
    password: str | None = None
    password_hash: str | None = None
    loopback_only: bool = False
    vhosts: frozenset[str] | None = None
    permissions: Mapping[str, Patterns] | None = field(default=None, compare=False, hash=False)
    topic_permissions: Mapping[str, Mapping[str, TopicPatterns]] | None = field(default=None, compare=False, hash=False)
    #: RabbitMQ's user limits (``None``: none): open connections, open channels, over all
    #: the user's connections.
    max_connections: int | None = None
    max_channels: int | None = None
    #: RabbitMQ's user tags: ``administrator``, ``monitoring``, ``policymaker`` and ``management``
    #: let the user into the management API (see ``broker.server.management``); others are kept.
    tags: tuple[str, ...] = ()
    #: The compiled permissions per vhost (``None``: nothing to check there), built once.
    _access: dict[str, Access | None] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        permissions, topics = self.permissions or {}, self.topic_permissions or {}
        for vhost in {*permissions, *topics}:
            self._access[vhost] = compile_access(self.name, vhost, permissions.get(vhost), topics.get(vhost))

    def may_open(self, vhost: str) -> bool:
        """Whether the user may open ``vhost`` (``connection.open``)."""
        if self.permissions is not None:
            return vhost in self.permissions
        return self.vhosts is None or vhost in self.vhosts

    def access(self, vhost: str) -> Access | None:
        """What to check for this user on ``vhost`` (``None``: everything is allowed)."""
        return self._access.get(vhost)

    def access_with(self, vhost: str, variables: Mapping[str, str]) -> Access | None:
        """:meth:`access`, with ``variables`` in its topic permissions' patterns too (RabbitMQ's
        ``{client_id}`` for an MQTT connection): compiled for the one connection."""
        topics = (self.topic_permissions or {}).get(vhost)
        found = self._access.get(vhost)
        if not topics or found is None:
            return found
        permission = (self.permissions or {}).get(vhost)
        return compile_access(self.name, vhost, permission, topics, variables)

    def check_password(self, password: str) -> bool:
        """Whether ``password`` is this user's (constant time for the comparison). An empty
        password never is, as in RabbitMQ: a user created without one cannot log in with one."""
        if not password:
            return False
        if self.password_hash is not None:
            if self.password_hash.startswith("rabbitmq-"):
                return _rabbitmq_matches(self.password_hash, password)
            return _scrypt_matches(self.password_hash, password)
        return self.password is not None and hmac.compare_digest(self.password.encode(), password.encode())


def hash_password(password: str, salt: bytes, n: int = 2**14, r: int = 8, p: int = 1) -> str:
    """A ``password_hash`` value for the configuration: ``scrypt$N$r$p$salt$hash`` in base64."""
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    encode = base64.b64encode
    return f"scrypt${n}${r}${p}${encode(salt).decode()}${encode(digest).decode()}"


def _scrypt_matches(stored: str, password: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(expected, actual)


#: The digests of RabbitMQ's password hashing modules (``rabbit_password_hashing_sha256`` ...).
_RABBITMQ_DIGESTS = {"rabbitmq-sha256": "sha256", "rabbitmq-sha512": "sha512", "rabbitmq-md5": "md5"}


def _rabbitmq_matches(stored: str, password: str) -> bool:
    scheme, _, encoded = stored.partition("$")
    digest = _RABBITMQ_DIGESTS.get(scheme)
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError:
        return False
    if digest is None or len(raw) <= 4:
        return False
    salt, expected = raw[:4], raw[4:]
    return hmac.compare_digest(expected, hashlib.new(digest, salt + password.encode("utf-8")).digest())

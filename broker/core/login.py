"""Checking a login without handing out time or information.

Three rules, each against a way a client could hurt the broker or learn from it:

* **Off the reactor.** A scrypt check costs tens of milliseconds; it runs through the node's
  ``run_blocking`` (a worker thread under the Twisted shell), so other clients are not held up.
* **Equal cost.** A name that is not a user costs what a wrong password costs: a dummy check
  of the kind the configured users' hashes are (scrypt with their parameters when any has
  one), so timing does not tell which users exist.
* **A refusal is slowed, never a login.** Every login is checked at once. After
  :data:`FREE_FAILURES` failed logins for one user name from one host within
  :data:`FAILURE_WINDOW` seconds, each further refusal for that name from that host is
  answered :data:`PENALTY` seconds after the one before (about 2 a second), until the window
  has passed without failures. A correct login is answered at once, whatever failed before it
  from the same address: many clients share one behind a NAT or a Kubernetes node, and one
  of them retrying a stale password must not hold up the others.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from postroom.broker.wire.codec import decode_table


class HashedUser(Protocol):
    """What :func:`decoy_hash` reads of a user (``broker.core.node.User``)."""

    @property
    def password_hash(self) -> str | None: ...


#: Failed logins for one name from one host within :data:`FAILURE_WINDOW` before their
#: refusals are slowed.
FREE_FAILURES = 10
#: Seconds over which failures are counted.
FAILURE_WINDOW = 60.0
#: Seconds between two slowed refusals for one name from one host (about 2 a second).
PENALTY = 0.5


def is_expensive(password_hash: str | None) -> bool:
    """Whether checking a password against ``password_hash`` is worth a worker thread."""
    return password_hash is not None and password_hash.startswith("scrypt$")


def decoy_hash(users: Iterable[HashedUser]) -> str | None:
    """A hash to check unknown names against, costing what the configured users' do: scrypt
    with the first scrypt user's parameters; ``None`` when no user has an expensive hash."""
    for user in users:
        password_hash = user.password_hash
        if password_hash is not None and is_expensive(password_hash):
            _scheme, n, r, p, _salt, digest = password_hash.split("$")
            salt = base64.b64encode(b"postroom-decoy-salt").decode()
            length = len(base64.b64decode(digest))
            fake = base64.b64encode(hashlib.sha256(b"decoy").digest()[:length].ljust(length, b"\0")).decode()
            return f"scrypt${n}${r}${p}${salt}${fake}"
    return None


class LoginThrottle:
    """Failed logins by host and user name (see the module's third rule).

    :param now: the current time in seconds (the node's clock)
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._failures: dict[tuple[str, str], deque[float]] = {}
        self._next_refusal: dict[tuple[str, str], float] = {}

    def failed(self, host: str, username: str) -> float:
        """A login for ``username`` from ``host`` failed: returns the seconds to wait before
        refusing it (0: at once)."""
        key = (host, username)
        failures = self._recent(key)
        if failures is None:
            if len(self._failures) >= 4096:
                self._forget_quiet()  # (before this one is added: an empty one would go too)
            failures = self._failures[key] = deque()
        now = self._now()
        failures.append(now)
        if len(failures) <= FREE_FAILURES:
            return 0.0
        at = max(now, self._next_refusal.get(key, now))
        self._next_refusal[key] = at + PENALTY
        return at - now

    def _recent(self, key: tuple[str, str]) -> deque[float] | None:
        failures = self._failures.get(key)
        if failures is None:
            return None
        horizon = self._now() - FAILURE_WINDOW
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            del self._failures[key]
            self._next_refusal.pop(key, None)
            return None
        return failures

    def _forget_quiet(self) -> None:
        for key in list(self._failures):
            self._recent(key)


def sasl_credentials(mechanism: str, response: bytes) -> tuple[str | None, str | None] | None:
    """The user name and password in a ``PLAIN`` response (``\0user\0password``) or an
    ``AMQPLAIN`` one (a field table's entries, ``LOGIN`` and ``PASSWORD``: ``None`` for one
    absent); ``None`` for a response that does not parse. AMQP 0-9-1's ``start-ok`` and the
    stream protocol's ``sasl_authenticate`` carry the same responses."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    try:
        table = decode_table(response)
    except (ValueError, struct.error, IndexError):
        return None
    login, password = (table.get(name) for name in ("LOGIN", "PASSWORD"))
    return _text(login), _text(password)


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

"""Checking a login without handing out time or information.

Three rules, each against a way a client could hurt the broker or learn from it:

* **Off the reactor.** A scrypt check costs tens of milliseconds; it runs through the node's
  ``run_blocking`` (a worker thread under the Twisted shell), so other clients are not held up.
* **Equal cost.** A name that is not a user costs what a wrong password costs: a dummy check
  of the kind the configured users' hashes are (scrypt with their parameters when any has
  one), so timing does not tell which users exist.
* **Failures slow their source.** After :data:`FREE_FAILURES` failed logins from one host
  within :data:`FAILURE_WINDOW` seconds, that host's further attempts are checked one at a
  time, :data:`PENALTY` seconds apart, until the window has passed without failures. A
  success does not clear the count: a client holding one valid login could otherwise
  interleave it with its guesses.
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.core.node import User

#: Failed logins a host may have within :data:`FAILURE_WINDOW` before it is slowed down.
FREE_FAILURES = 10
#: Seconds over which failures are counted.
FAILURE_WINDOW = 60.0
#: Seconds between two checks for a host over its free failures (about 2 attempts a second).
PENALTY = 0.5


def is_expensive(password_hash: str | None) -> bool:
    """Whether checking a password against ``password_hash`` is worth a worker thread."""
    return password_hash is not None and password_hash.startswith("scrypt$")


def decoy_hash(users: Iterable[User]) -> str | None:
    """A hash to check unknown names against, costing what the configured users' do: scrypt
    with the first scrypt user's parameters; ``None`` when no user has an expensive hash."""
    for user in users:
        if is_expensive(user.password_hash):
            _scheme, n, r, p, _salt, digest = user.password_hash.split("$")
            salt = base64.b64encode(b"postroom-decoy-salt").decode()
            length = len(base64.b64decode(digest))
            fake = base64.b64encode(hashlib.sha256(b"decoy").digest()[:length].ljust(length, b"\0")).decode()
            return f"scrypt${n}${r}${p}${salt}${fake}"
    return None


class LoginThrottle:
    """Per-host failed-login bookkeeping (see the module's third rule).

    :param now: the current time in seconds (the node's clock)
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._failures: dict[str, deque[float]] = {}
        self._next_check: dict[str, float] = {}

    def delay(self, host: str) -> float:
        """Seconds to wait before checking the next login from ``host`` (0: at once)."""
        failures = self._recent(host)
        if failures is None or len(failures) < FREE_FAILURES:
            return 0.0
        now = self._now()
        at = max(now, self._next_check.get(host, now))
        self._next_check[host] = at + PENALTY
        return at - now

    def failed(self, host: str) -> None:
        """A login from ``host`` failed."""
        failures = self._failures.get(host)
        if failures is None:
            failures = self._failures[host] = deque()
        failures.append(self._now())
        if len(self._failures) > 4096:
            self._forget_quiet_hosts()

    def _recent(self, host: str) -> deque[float] | None:
        failures = self._failures.get(host)
        if failures is None:
            return None
        horizon = self._now() - FAILURE_WINDOW
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            del self._failures[host]
            self._next_check.pop(host, None)
            return None
        return failures

    def _forget_quiet_hosts(self) -> None:
        for host in list(self._failures):
            self._recent(host)

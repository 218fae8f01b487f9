"""RabbitMQ's permission model: per user and vhost, ``configure``, ``write`` and ``read``
regular expressions over resource names.

A user's patterns on a vhost are compiled once (:func:`compile_access`) and every answer is
remembered per ``(permission, kind, name)``, so that checking a publish costs one dictionary
lookup per exchange. What is checked where follows RabbitMQ 3.10's ``rabbit_channel``:

* ``configure``: declaring (not passively) and deleting a queue or an exchange;
* ``write``: publishing to an exchange (the default exchange is ``amq.default``), the queue
  or destination exchange of a binding, the dead-letter exchange of a new queue and the
  alternate exchange of a new exchange;
* ``read``: ``basic.get``, ``basic.consume`` and ``queue.purge`` on a queue, the source
  exchange of a binding, a new queue with a dead-letter exchange and a new exchange with an
  alternate exchange.

Topic permissions narrow ``write`` and ``read`` on a topic exchange down to routing keys:
per exchange, a ``write`` pattern checked against a publish's routing key and a ``read``
pattern against a binding's routing key where the exchange is the source (RabbitMQ's
``check_topic_authorisation``). ``{username}`` and ``{vhost}`` in them stand for the user's
and the vhost's names, put in as they are (not escaped), as RabbitMQ puts them in. An
exchange without topic permissions, or one that is not of type ``topic``, is not checked.

Patterns are searched, not anchored (Erlang's ``re:run``), and an empty pattern matches
nothing but the empty name (RabbitMQ reads it as ``^$``). A refusal is 403 ACCESS_REFUSED
on the channel, worded as RabbitMQ words it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol

from postroom.broker.errors import ChannelException, ReplyCode

#: Answers remembered per user and vhost before the memo starts again.
MEMO_SIZE = 10_000
#: The name RabbitMQ checks permissions on for the default exchange ``""``.
DEFAULT_EXCHANGE = "amq.default"


class Patterns(Protocol):
    """The three patterns of one user on one vhost (``config.schema.Permission``)."""

    @property
    def configure(self) -> str: ...

    @property
    def write(self) -> str: ...

    @property
    def read(self) -> str: ...


class TopicPatterns(Protocol):
    """The topic permissions of one user on one exchange (``config.schema.TopicPermission``)."""

    @property
    def write(self) -> str: ...

    @property
    def read(self) -> str: ...


class Access:
    """One user's compiled permissions on one vhost.

    :param user: the user's name (for refusals)
    :param vhost: the vhost's name (for refusals)
    :param topics: topic permissions per exchange name
    """

    __slots__ = ("user", "vhost", "_patterns", "_memo", "topics", "_topic_patterns")

    def __init__(
        self,
        user: str,
        vhost: str,
        permission: Patterns,
        topics: Mapping[str, TopicPatterns] | None = None,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        self.user = user
        self.vhost = vhost
        #: Exchanges with topic permissions (a publish to one is checked each time).
        self.topics = frozenset(topics or ())
        self._topic_patterns = {
            (exchange, kind): _topic_pattern(_expand(pattern, user, vhost, variables))
            for exchange, patterns in (topics or {}).items()
            for kind, pattern in (("write", patterns.write), ("read", patterns.read))
        }
        self._patterns = {
            kind: re.compile(pattern or "^$")
            for kind, pattern in (
                ("configure", permission.configure),
                ("write", permission.write),
                ("read", permission.read),
            )
        }
        self._memo: dict[tuple[str, str, str], bool] = {}

    def check(self, permission: str, kind: str, name: str) -> None:
        """Refuse unless the user has ``permission`` on the ``kind`` (queue, exchange) ``name``.

        :raises ChannelException: 403 ACCESS_REFUSED
        """
        if kind == "exchange" and not name:
            name = DEFAULT_EXCHANGE
        key = (permission, kind, name)
        allowed = self._memo.get(key)
        if allowed is None:
            allowed = self._patterns[permission].search(name) is not None
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = allowed
        if not allowed:
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED,
                f"access to {kind} '{name}' in vhost '{self.vhost}' refused for user '{self.user}'",
            )


    def check_topic(self, permission: str, exchange: str, routing_key: str) -> None:
        """Refuse unless ``routing_key`` passes the user's topic ``permission`` (write, read)
        on ``exchange``, a topic exchange; exchanges without topic permissions pass.

        :raises ChannelException: 403 ACCESS_REFUSED
        """
        if exchange not in self.topics:
            return
        key = (permission, "topic " + exchange, routing_key)
        allowed = self._memo.get(key)
        if allowed is None:
            allowed = self._topic_patterns[(exchange, permission)].search(routing_key) is not None
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = allowed
        if not allowed:
            raise ChannelException(
                ReplyCode.ACCESS_REFUSED,
                f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{self.vhost}' "
                f"refused for user '{self.user}'",
            )


#: What a topic permission that no longer compiles once expanded allows: nothing.
_NOTHING = re.compile(r"(?!)")


def _topic_pattern(expanded: str) -> re.Pattern[str]:
    """A topic permission's pattern, expanded: a name put in as it is may break it (an MQTT
    client id ``dev(``), and one broken allows nothing (RabbitMQ's ``re:run`` fails on it
    and the check refuses), never an error at login."""
    try:
        return re.compile(expanded or "^$")
    except re.error:
        return _NOTHING


def _expand(pattern: str, user: str, vhost: str, variables: Mapping[str, str] | None = None) -> str:
    expanded = pattern.replace("{username}", user).replace("{vhost}", vhost)
    for name, value in (variables or {}).items():  # (an MQTT connection's {client_id})
        expanded = expanded.replace("{" + name + "}", value)
    return expanded


def compile_access(
    user: str,
    vhost: str,
    permission: Patterns | None,
    topics: Mapping[str, TopicPatterns] | None = None,
    variables: Mapping[str, str] | None = None,
) -> Access | None:
    """The compiled permissions, or ``None`` when they allow everything (nothing to check).

    :param permission: ``None`` for a vhost the user has topic permissions on only
    """
    if permission is None:
        permission = _ALL
    if permission.configure == permission.write == permission.read == ".*" and not topics:
        return None
    return Access(user, vhost, permission, topics, variables)


class _AllPatterns:
    configure = write = read = ".*"


_ALL = _AllPatterns()

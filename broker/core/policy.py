"""Policies as RabbitMQ 3.10 has them: which one applies to a queue or an exchange, and the
settings that result from it, an operator policy and the object's own arguments.

``docs/rabbitmq-policies.md`` gives RabbitMQ's rules with their places in its source. In short:

* a policy's ``pattern`` is searched for (not anchored) in the object's name; ``apply-to`` is
  ``queues``, ``exchanges`` or ``all``; of the policies that match, the one with the highest
  ``priority`` applies. Between equal priorities RabbitMQ's choice follows its table's hash
  order, which nobody can rely on: Postroom takes the first name in code-point order;
* user policies and operator policies are chosen separately, one of each at most. Where both
  set a key, the lower value applies (operator policies may set only limits);
* for a queue, the lower of the policy's value and the queue's argument applies to TTLs,
  expiry and length limits; the argument wins for the dead-letter exchange and routing key
  and for ``overflow``; ``max-priority`` is never set by a policy. For an exchange, its
  ``alternate-exchange`` argument wins over the policy's.

Postroom's own ``visibility-timeout`` and ``delivery-limit`` (which RabbitMQ's classic queues
do not take from policies) combine like the limits: the lower applies.

Nothing here does I/O: the vhost keeps the policies and asks this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: ``apply-to`` values, and the kinds of object each reaches.
APPLY_TO = {"queues": {"queue"}, "exchanges": {"exchange"}, "all": {"queue", "exchange"}}

#: Policy keys for queues, with the queue argument each stands for.
QUEUE_KEYS = {
    "message-ttl": "x-message-ttl",
    "expires": "x-expires",
    "max-length": "x-max-length",
    "max-length-bytes": "x-max-length-bytes",
    "overflow": "x-overflow",
    "dead-letter-exchange": "x-dead-letter-exchange",
    "dead-letter-routing-key": "x-dead-letter-routing-key",
    "delivery-limit": "x-delivery-limit",
    "visibility-timeout": "x-visibility-timeout",
}

#: Keys where the lower of policy, operator policy and argument applies.
LOWER_WINS = frozenset(
    {"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit", "visibility-timeout"}
)

#: Keys an operator policy may set (RabbitMQ's, less the in-memory limits Postroom has no use
#: for, plus Postroom's visibility timeout).
OPERATOR_KEYS = LOWER_WINS

#: Every key a user policy may set.
KEYS = frozenset(QUEUE_KEYS) | {"alternate-exchange"}

_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")


def _binary(what: str) -> Any:
    return lambda value: None if isinstance(value, str) else f"{_show(value)} is not a valid {what}"


def _integer(what: str, minimum: int = 0) -> Any:
    def check(value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return None
        return f"{_show(value)} is not a valid {what}"

    return check


#: RabbitMQ's check of each key's value, and its words when the value is refused.
_CHECKS = {
    "alternate-exchange": _binary("alternate exchange name"),
    "dead-letter-exchange": _binary("dead letter exchange name"),
    "dead-letter-routing-key": _binary("dead letter routing key"),
    "message-ttl": _integer("message TTL"),
    "expires": _integer("queue expiry", 1),
    "max-length": _integer("maximum length"),
    "max-length-bytes": _integer("maximum length in bytes"),
    "delivery-limit": _integer("delivery limit"),
    "visibility-timeout": _integer("visibility timeout", 1),
    "overflow": lambda value: None if value in _OVERFLOW else f"{_show(value)} is not a valid overflow value",
}


def _show(value: Any) -> str:
    """A value as RabbitMQ's ``~p`` prints what JSON gave it (a string as ``<<"...">>``)."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def validate(definition: Any, operator: bool = False) -> list[str]:
    """What is wrong with a policy's definition, in RabbitMQ's words (empty: nothing).

    As RabbitMQ: a value refused for a known key is reported, and only when there is none,
    the keys it does not know (all of them in one line).
    """
    if not isinstance(definition, Mapping):
        return [f"definition must be a dictionary: {_show(definition)}"]
    if not definition:
        return ["no policy provided"]
    allowed = OPERATOR_KEYS if operator else KEYS
    for key, value in definition.items():
        if key in allowed:
            problem = _CHECKS[key](value)
            if problem is not None:
                return [problem]
    unknown = [(key, value) for key, value in definition.items() if key not in allowed]
    if unknown:
        listed = ",".join(f"{{{_show(key)},{_show(value)}}}" for key, value in unknown)
        return [f"[{listed}] are not recognised policy settings"]
    return []


@dataclass(frozen=True)
class Policy:
    """One policy of a virtual host (user or operator policy alike).

    :param pattern: a regular expression searched for in object names
    :param apply_to: ``queues``, ``exchanges`` or ``all``
    :raises ValueError: the pattern does not compile, or ``apply_to`` is not one of those
    """

    name: str
    pattern: str
    definition: Mapping[str, Any]
    priority: int = 0
    apply_to: str = "all"
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.apply_to not in APPLY_TO:
            raise ValueError(f"apply-to '{self.apply_to}' unrecognised; should be 'queues', 'exchanges' or 'all'")
        try:
            regex = re.compile(self.pattern)
        except re.error as error:
            raise ValueError(f"pattern should be regular expression but is invalid: {error}") from None
        object.__setattr__(self, "_regex", regex)

    def matches(self, kind: str, name: str) -> bool:
        """Whether it applies to the ``kind`` (``queue`` or ``exchange``) named ``name``."""
        return kind in APPLY_TO[self.apply_to] and self._regex.search(name) is not None


def choose(policies: Iterable[Policy], kind: str, name: str) -> Policy | None:
    """The policy that applies to an object: the matching one of highest priority, the first
    name among equals (see the module)."""
    best: Policy | None = None
    for policy in policies:
        if not policy.matches(kind, name):
            continue
        if (
            best is None
            or policy.priority > best.priority
            or (policy.priority == best.priority and policy.name < best.name)
        ):
            best = policy
    return best


def effective_definition(policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """The user policy's definition with the operator policy's keys merged in (the lower of
    two values), as the management API shows it."""
    merged = dict(policy.definition) if policy is not None else {}
    for key, value in (operator.definition if operator is not None else {}).items():
        merged[key] = min(merged[key], value) if key in merged else value
    return merged


def queue_arguments(arguments: Mapping[str, Any], policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """A queue's arguments as its settings should be read from them, policies applied."""
    definition = effective_definition(policy, operator)
    result = dict(arguments)
    for key, argument in QUEUE_KEYS.items():
        value = definition.get(key)
        if value is None:
            continue
        own = arguments.get(argument)
        if own is None:
            result[argument] = value
        elif key in LOWER_WINS:
            result[argument] = min(own, value)
    return result


def alternate_exchange(arguments: Mapping[str, Any], policy: Policy | None) -> str | None:
    """An exchange's alternate exchange: its own argument, else its policy's."""
    own = arguments.get("alternate-exchange")
    if own is not None:
        return own.decode("utf-8", "surrogateescape") if isinstance(own, bytes) else str(own)
    value = policy.definition.get("alternate-exchange") if policy is not None else None
    return value if isinstance(value, str) else None

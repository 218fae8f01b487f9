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

from postroom.config.policies import (
    APPLY_TO,
    LOWER_WINS,
    QUEUE_KEYS,
    check_apply_to,
    check_pattern,
    check_priority,
    validate,
)

__all__ = [
    "Policy",
    "PolicyRefused",
    "alternate_exchange",
    "choose",
    "effective_definition",
    "from_value",
    "queue_arguments",
    "validate",
]


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
    priority: int | float = 0
    apply_to: str = "all"
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problem = check_apply_to(self.apply_to) or check_pattern(self.pattern)
        if problem is not None:
            raise ValueError(problem)
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def matches(self, kind: str, name: str) -> bool:
        """Whether it applies to the ``kind`` (``queue`` or ``exchange``) named ``name``."""
        return kind in APPLY_TO[self.apply_to] and self._regex.search(name) is not None

    def value(self) -> dict[str, Any]:
        """Its pattern, ``apply-to``, definition and priority, with RabbitMQ's keys (what a
        management API ``PUT`` sends and the write-ahead log keeps)."""
        return {
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


class PolicyRefused(ValueError):
    """A policy RabbitMQ would refuse; its text is RabbitMQ's (``Validation failed`` and
    each problem on a line of its own)."""


def from_value(name: str, value: Mapping[str, Any], operator: bool = False) -> Policy:
    """The policy ``name`` from its :meth:`Policy.value` (``priority`` 0 and ``apply-to``
    ``all`` when absent), checked as RabbitMQ checks a policy being set.

    :raises PolicyRefused: with every problem, in RabbitMQ's order and words
    """
    problems: list[str | None] = []
    if "definition" not in value:
        problems.append(f'Key "definition" not found in {name}')
    else:
        problems += validate(value["definition"], operator)
    apply_to = value.get("apply-to", "all")
    problems.append(check_apply_to(apply_to))
    if "pattern" not in value:
        problems.append(f'Key "pattern" not found in {name}')
    else:
        problems.append(check_pattern(value["pattern"]))
    priority = value.get("priority", 0)
    problems.append(check_priority(priority))
    problems = [problem for problem in problems if problem is not None]
    if problems:
        raise PolicyRefused("Validation failed\n\n" + "".join(f"{problem}\n" for problem in problems))
    return Policy(name, value["pattern"], dict(value["definition"]), priority, apply_to)


def choose(
    policies: Iterable[Policy], kind: str, name: str, unsupported: frozenset[str] = frozenset()
) -> Policy | None:
    """The policy that applies to an object: the matching one of highest priority, the first
    name among equals (see the module). A policy with any key in ``unsupported`` (the keys a
    kind of queue does not take) does not apply at all, as RabbitMQ's ``is_policy_applicable``."""
    best: Policy | None = None
    for policy in policies:
        if not policy.matches(kind, name) or not unsupported.isdisjoint(policy.definition):
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

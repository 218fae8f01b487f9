"""The rules a policy's fields must follow, as RabbitMQ 3.10 checks them and in its words:
shared by the configuration loader and the broker (``broker.core.policy``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
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

#: Policy keys for streams, with the argument each stands for (a stream's policy wins over
#: its argument, as RabbitMQ's ``rabbit_stream_queue:policy_precedence``).
STREAM_KEYS = {
    "max-length-bytes": "x-max-length-bytes",
    "max-age": "x-max-age",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
}

#: Every key a user policy may set.
KEYS = frozenset(QUEUE_KEYS) | frozenset(STREAM_KEYS) | {"alternate-exchange"}

#: The largest ``stream-max-segment-size-bytes`` (RabbitMQ's ``?MAX_STREAM_MAX_SEGMENT_SIZE``).
MAX_STREAM_SEGMENT_BYTES = 3_000_000_000
_INTERVAL = re.compile(r"[0-9]*[1-9][0-9]*[YMDhms]")


def is_interval(value: Any) -> bool:
    """Whether ``value`` is an interval as RabbitMQ's ``x-max-age`` and ``max-age`` take it:
    digits (not all zeros), then exactly one of ``Y M D h m s`` (``7D``, ``12h``)."""
    return isinstance(value, str) and _INTERVAL.fullmatch(value) is not None


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
    "max-age": lambda value: None if is_interval(value) else f"{_show(value)} is not a valid max age",
    "stream-max-segment-size-bytes": lambda value: (
        None
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STREAM_SEGMENT_BYTES
        else f"{_show(value)} is not a valid segment size"
    ),
}


def _show(value: Any) -> str:
    """A value as RabbitMQ's ``~p`` prints what JSON gave it (a string as ``<<"...">>``)."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
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


def check_pattern(pattern: Any) -> str | None:
    """What is wrong with a policy's pattern (``None``: it compiles)."""
    if not isinstance(pattern, str):
        return f"pattern should be a binary but was {_show(pattern)}"
    try:
        re.compile(pattern)
    except re.error as error:
        return f"pattern should be regular expression but is invalid: {error}"
    return None


def check_apply_to(apply_to: Any) -> str | None:
    """What is wrong with a policy's ``apply-to`` (``None``: nothing)."""
    if isinstance(apply_to, str) and apply_to in APPLY_TO:
        return None
    return f"apply-to '{apply_to}' unrecognised; should be 'queues', 'exchanges' or 'all'"


def check_priority(priority: Any) -> str | None:
    """What is wrong with a policy's priority (``None``: it is a number, as RabbitMQ asks)."""
    if isinstance(priority, int) and not isinstance(priority, bool):
        return None
    if isinstance(priority, float) and math.isfinite(priority):
        return None
    return f"priority should be a number, actually was {_show(priority)}"

"""A queue's settings: what its ``x-`` arguments (and its policies) ask of it, read once.

Both kinds of queue carry a :class:`QueueSettings` (a stream's are all defaults: none of a
work queue's rules apply to it), so the settings sit below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Overflow(Enum):
    """``x-overflow``: what a full queue does with one more message."""

    DROP_HEAD = "drop-head"
    REJECT_PUBLISH = "reject-publish"
    REJECT_PUBLISH_DLX = "reject-publish-dlx"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's reliability settings, from its (already validated) declare arguments.

    Durations are in seconds.
    """

    message_ttl: float | None = None
    expires: float | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = Overflow.DROP_HEAD
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    delivery_limit: int | None = None
    visibility_timeout: float | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> QueueSettings:
        """Read the ``x-`` arguments RabbitMQ (and Postroom) define for queues."""

        def ms(key: str) -> float | None:
            value = arguments.get(key)
            return None if value is None else value / 1000.0

        def text(key: str) -> str | None:
            value = arguments.get(key)
            return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value

        return cls(
            message_ttl=ms("x-message-ttl"),
            expires=ms("x-expires"),
            max_length=arguments.get("x-max-length"),
            max_length_bytes=arguments.get("x-max-length-bytes"),
            overflow=Overflow(arguments.get("x-overflow", "drop-head")),
            dead_letter_exchange=text("x-dead-letter-exchange"),
            dead_letter_routing_key=text("x-dead-letter-routing-key"),
            delivery_limit=arguments.get("x-delivery-limit"),
            visibility_timeout=ms("x-visibility-timeout"),
            max_priority=arguments.get("x-max-priority"),
            single_active_consumer=arguments.get("x-single-active-consumer") is True,
        )

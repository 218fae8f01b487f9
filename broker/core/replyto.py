"""Direct reply-to (``amq.rabbitmq.reply-to``), as RabbitMQ 3.10 has it: RPC replies go straight
to the requester's channel, with no queue declared, no queue deleted and nothing kept per request.

A channel that consumes from the pseudo-queue ``amq.rabbitmq.reply-to`` (no-ack only) gets a
*reply consumer* with a name of its own, ``amq.rabbitmq.reply-to.<suffix>``; a request it
publishes with ``reply-to: amq.rabbitmq.reply-to`` goes out with that name instead, and a
publish to the default exchange with the name as routing key is delivered to that consumer.
``docs/rabbitmq-consumers.md`` (section 3) gives RabbitMQ's rules with their places in its
source.

The suffix is two tokens of 16 random bytes each from :mod:`secrets` (``<token>.<token>``,
the shape of RabbitMQ's), in URL-safe base64 so that clients that check queue names (pamqp)
take it: a reply can reach a consumer only by its name, which cannot be guessed. The registry
is the node's, so a reply finds its consumer whatever vhost it is published in, as in
RabbitMQ. Nothing here does I/O.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from postroom.broker.wire.codec import shortstr

__all__ = ["PSEUDO_QUEUE", "PREFIX", "ReplyConsumer", "DirectReplyTo"]

#: The pseudo-queue a requester consumes from, and the ``reply-to`` value it publishes with.
PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
#: What every reply consumer's name starts with.
PREFIX = PSEUDO_QUEUE + "."


@dataclass(eq=False)
class ReplyConsumer:
    """A channel's consumer of its replies."""

    #: The channel (its consuming side, ``broker.amqp.consuming.Consuming``) that consumes its replies.
    channel: Any
    tag: str
    suffix: str
    tag_bytes: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.tag_bytes = shortstr(self.tag)

    @property
    def name(self) -> str:
        """What requests carry as ``reply-to``, and replies as routing key."""
        return PREFIX + self.suffix


def _token() -> str:
    return secrets.token_urlsafe(16)


class DirectReplyTo:
    """The reply consumers of one node, by channel and by suffix."""

    def __init__(self) -> None:
        self._by_channel: dict[object, ReplyConsumer] = {}
        self._by_suffix: dict[str, ReplyConsumer] = {}

    def __len__(self) -> int:
        return len(self._by_channel)

    def of(self, channel: object) -> ReplyConsumer | None:
        """The reply consumer of ``channel``, if it has one."""
        return self._by_channel.get(channel)

    def consume(self, channel: object, tag: str) -> ReplyConsumer:
        """Give ``channel`` a reply consumer (the caller checked it has none) with a new name."""
        consumer = ReplyConsumer(channel, tag, f"{_token()}.{_token()}")
        self._by_channel[channel] = consumer
        self._by_suffix[consumer.suffix] = consumer
        return consumer

    def cancel(self, channel: object) -> ReplyConsumer | None:
        """Remove ``channel``'s reply consumer (replies to its name are dropped from now on)."""
        consumer = self._by_channel.pop(channel, None)
        if consumer is not None:
            del self._by_suffix[consumer.suffix]
        return consumer

    def find(self, name: str) -> ReplyConsumer | None:
        """The reply consumer called ``name`` (``amq.rabbitmq.reply-to.<suffix>``), if it exists."""
        return self._by_suffix.get(name[len(PREFIX) :]) if name.startswith(PREFIX) else None

"""Dead-lettering as RabbitMQ does it: the ``x-death`` history, first-death headers, cycles.

A dead-lettered message is republished to its queue's dead-letter exchange with:

* ``x-death``: a list of tables, one per ``(queue, reason)``, most recent first. A repeat of
  the same pair increments that entry's ``count`` and moves it to the front. Each entry holds
  ``count``, ``reason``, ``queue``, ``time``, ``exchange``, ``routing-keys`` and, when the
  message had a per-message TTL, ``original-expiration``. Postroom adds ``delivery-count``:
  how many times the message had been returned to that queue (nack/reject with requeue,
  visibility timeout, channel closed) before it died there.
* ``x-first-death-reason``, ``-queue``, ``-exchange``: set once, never changed;
* no ``expiration`` property (it would expire again in the dead-letter queue), and no
  ``x-delivery-count`` header (the next queue counts its own returns).

Reference: RabbitMQ's "Dead Letter Exchanges" guide, section "Dead-Lettered Effects on Messages".
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pamqp import commands

from broker.amqp.codec import encode_content_header, shortstr
from broker.core.message import Message

#: The header in which a dead-lettered copy carries its id in the dead-letter event stream
#: (``broker/core/deadlog.py``); ``postroom dlq redrive --ids`` selects messages by it.
DEAD_LETTER_ID_HEADER = "x-postroom-dead-letter-id"


class DeadLetterReason(Enum):
    """Why a message was dead-lettered (the ``reason`` field of ``x-death``)."""

    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"


def _deaths(headers: dict[str, Any] | None) -> list[dict[str, Any]]:
    deaths = (headers or {}).get("x-death")
    return [death for death in deaths if isinstance(death, dict)] if isinstance(deaths, list) else []


def is_cycle(message: Message, queue_name: str, reason: DeadLetterReason) -> bool:
    """Whether dead-lettering ``message`` into ``queue_name`` would close a loop with no rejection.

    Walks ``x-death`` from the most recent death: a ``rejected`` death first means a consumer
    acted in between (no cycle); reaching ``queue_name`` first means the message is going
    round on its own (expiry, length, delivery limits) and RabbitMQ drops it.
    A rejection now is never a cycle.
    """
    if reason is DeadLetterReason.REJECTED:
        return False
    for death in _deaths(message.headers):
        if death.get("reason") == DeadLetterReason.REJECTED.value:
            return False
        if death.get("queue") == queue_name:
            return True
    return False


def dead_lettered(
    message: Message,
    queue_name: str,
    reason: DeadLetterReason,
    now: float,
    exchange: str,
    routing_key: str | None,
    delivery_count: int,
    dead_letter_id: int = 0,
) -> Message:
    """The message to publish to the dead-letter exchange.

    :param message: the message as it sat in the queue
    :param queue_name: the queue it dies in
    :param now: the time of death (seconds since the epoch)
    :param exchange: the dead-letter exchange it is published to
    :param routing_key: ``x-dead-letter-routing-key``, or ``None`` to keep the original key
    :param delivery_count: returns counted in that queue before it died
    :param dead_letter_id: the dead-letter event log's id for this copy, set as header
        ``x-postroom-dead-letter-id`` (0: no event log, no header)
    """
    properties = copy.copy(message.properties)
    headers = dict(properties.headers or {})
    headers.pop("x-delivery-count", None)
    deaths = _deaths(headers)
    routing_keys: Sequence[Any] = [message.routing_key]
    cc = headers.get("CC")
    if isinstance(cc, list):
        routing_keys = [message.routing_key, *cc]
    entry: dict[str, Any] | None = None
    for index, death in enumerate(deaths):
        if death.get("queue") == queue_name and death.get("reason") == reason.value:
            entry = dict(death)
            del deaths[index]
            break
    if entry is None:
        entry = {"count": 0, "reason": reason.value, "queue": queue_name}
    entry["count"] = int(entry.get("count", 0)) + 1
    entry["time"] = datetime.fromtimestamp(int(now), tz=timezone.utc)
    entry["exchange"] = message.exchange
    entry["routing-keys"] = list(routing_keys)
    entry["delivery-count"] = delivery_count
    if properties.expiration:
        entry["original-expiration"] = properties.expiration
        properties.expiration = None
    headers["x-death"] = [entry, *deaths]
    headers.setdefault("x-first-death-reason", reason.value)
    headers.setdefault("x-first-death-queue", queue_name)
    headers.setdefault("x-first-death-exchange", message.exchange)
    if routing_key is not None:
        headers.pop("CC", None)
    headers.pop("BCC", None)
    if dead_letter_id:
        headers[DEAD_LETTER_ID_HEADER] = dead_letter_id
    else:
        headers.pop(DEAD_LETTER_ID_HEADER, None)  # an earlier death's id names another copy
    properties.headers = headers
    key = message.routing_key if routing_key is None else routing_key
    header = encode_content_header(len(message.body), properties)
    result = Message(exchange, key, shortstr(exchange) + shortstr(key), header, message.body)
    result._properties = properties
    return result


def with_delivery_count(message: Message, delivery_count: int) -> bytes:
    """The message's content header with ``x-delivery-count`` set, for a redelivery."""
    properties: commands.Basic.Properties = copy.copy(message.properties)
    properties.headers = {**(properties.headers or {}), "x-delivery-count": delivery_count}
    return encode_content_header(message.size, properties)

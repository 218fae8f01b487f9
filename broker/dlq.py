"""``postroom dlq inspect`` and ``postroom dlq redrive``: look into a dead-letter queue, move messages back.

Inspecting takes messages without acking them and gives them back at the end (they return
to the queue in order), so nothing is consumed. Redriving moves each chosen message to where
it died (the queue of its latest ``x-death`` entry, through the default exchange) or to
``--to``: the copy is published and confirmed before the original is acked, so an
interrupted redrive loses nothing (at worst a message is in both places). The copy keeps its
``x-death`` history and loses ``x-delivery-count``, so it starts with fresh attempts.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from broker.client import Connection, Message
from broker.core.deadletter import DEAD_LETTER_ID_HEADER


@dataclass(frozen=True, slots=True)
class Redriven:
    """One message moved: where it went and why it had died."""

    exchange: str
    routing_key: str
    reason: str


def summary(message: Message) -> dict[str, object]:
    """What a person wants to know about a dead letter, for ``dlq inspect``."""
    deaths = message.x_death
    latest = deaths[0] if deaths else {}
    return {
        "reason": latest.get("reason"),
        "queue": latest.get("queue"),
        "count": latest.get("count"),
        "time": str(latest.get("time")) if latest.get("time") is not None else None,
        "exchange": latest.get("exchange"),
        "routing_keys": latest.get("routing-keys"),
        "deaths": len(deaths),
        "body_bytes": len(message.body),
        "headers": {k: v for k, v in message.headers.items() if k != "x-death"},
    }


def inspect(conn: Connection, queue: str, limit: int) -> Iterator[Message]:
    """Up to ``limit`` messages of ``queue``, then all given back unconsumed."""
    try:
        for _ in range(limit):
            message = conn.get(queue)
            if message is None:
                return
            yield message
    finally:
        conn.recover()


def matches(message: Message, filters: dict[str, str]) -> bool:
    """Whether the latest death matches every ``key=value`` filter (``reason``, ``queue``, ``exchange``)."""
    latest = message.x_death[0] if message.x_death else {}
    return all(str(latest.get(key)) == value for key, value in filters.items())


def read_ids(path: str) -> set[int]:
    """The dead-letter ids in a redrive list: one per line; blank lines and ``#`` comments skipped.

    :raises OSError: the file cannot be read
    :raises ValueError: a line is not an id (names the line)
    """
    ids = set()
    with open(path) as file:
        for number, line in enumerate(file, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                ids.add(int(text))
            except ValueError:
                raise ValueError(f"{path}:{number}: not a dead-letter id: {text!r}") from None
    return ids


def redrive(
    conn: Connection,
    queue: str,
    to: str | None = None,
    filters: dict[str, str] | None = None,
    limit: int | None = None,
    rate: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_move: Callable[[int], None] | None = None,
    ids: set[int] | None = None,
) -> list[Redriven]:
    """Move dead letters of ``queue`` back; return what was moved.

    :param to: ``EXCHANGE/ROUTING_KEY`` or a queue name (through the default exchange); by
        default, the queue the message died in
    :param filters: move only messages whose latest death matches (see :func:`matches`)
    :param limit: move at most this many
    :param rate: at most this many moves per second
    :param on_move: called with the count after each move (progress on a terminal)
    :param ids: move only messages whose ``x-postroom-dead-letter-id`` is one of these (the
        redrive list of ``postroom dlq analyze``); stops once all were moved
    """
    moved: list[Redriven] = []
    remaining = set(ids) if ids is not None else None
    try:
        while limit is None or len(moved) < limit:
            message = conn.get(queue)
            if message is None:
                break
            if filters and not matches(message, filters):
                continue  # held unacked: given back, in order, when we are done
            if remaining is not None and message.headers.get(DEAD_LETTER_ID_HEADER) not in remaining:
                continue
            exchange, routing_key = _destination(message, to)
            properties = copy.copy(message.properties)
            headers = dict(properties.headers or {})
            headers.pop("x-delivery-count", None)
            # The copy is a new message: if it dies again it gets an id of its own.
            dead_letter_id = headers.pop(DEAD_LETTER_ID_HEADER, None)
            properties.headers = headers
            conn.publish(exchange, routing_key, message.body, basic_properties=properties, mandatory=True)
            message.ack()
            latest = message.x_death[0] if message.x_death else {}
            moved.append(Redriven(exchange, routing_key, str(latest.get("reason"))))
            if on_move is not None:
                on_move(len(moved))
            if remaining is not None:
                remaining.discard(dead_letter_id)
                if not remaining:
                    break
            if rate:
                sleep(1.0 / rate)
    finally:
        # Give back what we hold: skipped messages, and one whose move failed (never acked).
        conn.recover()
    return moved


def _destination(message: Message, to: str | None) -> tuple[str, str]:
    if to is not None:
        exchange, slash, routing_key = to.partition("/")
        return (exchange, routing_key) if slash else ("", to)
    latest = message.x_death[0] if message.x_death else {}
    return "", str(latest.get("queue", ""))

"""``postroom dlq inspect`` and ``postroom dlq redrive``: look into a dead-letter queue, move messages back.

Inspecting takes messages without acking them and gives them back at the end (they return
to the queue in order), so nothing is consumed. Redriving moves each chosen message to where
it died or to ``--to``: the copy is published and confirmed before the original is acked, so
an interrupted redrive loses nothing (at worst a message is in both places).

Where a message died is not taken from its ``x-death`` header, which anyone who may publish
to the dead-letter queue can write: the message goes, unchanged, to ``amq.postroom.redrive``,
and the broker sends it to the queue named in its seal (see ``broker/core/seal.py``), if the
seal is its own and the operator may write to that queue. A message whose seal does not hold
(forged, altered, or dead-lettered by another broker) is refused and stays where it is, and
so does one whose ``x-death`` is not a list of tables; both are reported. The copy keeps its
``x-death`` history and loses ``x-delivery-count``, so it starts with fresh attempts.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from postroom.broker.clients.client import Connection, Message, PublishNacked
from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER, SEAL_HEADER
from postroom.broker.core.vhost import REDRIVE_EXCHANGE


@dataclass(frozen=True, slots=True)
class Redriven:
    """One message moved: where it went and why it had died."""

    exchange: str
    routing_key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """One message left in the dead-letter queue, and why."""

    queue: str
    reason: str


def deaths(message: Message) -> list[dict[str, Any]] | None:
    """The message's ``x-death`` history, most recent first; ``None`` when the header is
    there but is not a list of tables (it was not written by a broker)."""
    value = message.headers.get("x-death")
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(death, dict) for death in value):
        return None
    return value


def _latest(message: Message) -> dict[str, Any]:
    history = deaths(message)
    return history[0] if history else {}


def summary(message: Message) -> dict[str, object]:
    """What a person wants to know about a dead letter, for ``dlq inspect``."""
    history = deaths(message)
    latest = history[0] if history else {}
    return {
        "malformed_x_death": history is None,
        "reason": latest.get("reason"),
        "queue": latest.get("queue"),
        "count": latest.get("count"),
        "time": str(latest.get("time")) if latest.get("time") is not None else None,
        "exchange": latest.get("exchange"),
        "routing_keys": latest.get("routing-keys"),
        "deaths": len(history or ()),
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
    latest = _latest(message)
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


@dataclass(slots=True)
class Redrive:
    """What a redrive did: the messages it moved, and those it left in the queue."""

    moved: list[Redriven]
    refused: list[Refused]


#: Why a message without a destination of its own is left where it is.
NO_DEATH = "never dead-lettered (no x-death): give --to"
MALFORMED = "x-death is not a list of tables: not written by a broker"
UNSEALED = f"no {SEAL_HEADER} header: dead-lettered by another broker or before seals; give --to"
BROKEN_SEAL = "its seal does not hold: x-death, headers or body changed since the broker dead-lettered it"


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
) -> Redrive:
    """Move dead letters of ``queue`` back; return what was moved and what was refused.

    :param to: ``EXCHANGE/ROUTING_KEY`` or a queue name (through the default exchange); by
        default, the queue the message died in, as its seal says (see the module's text)
    :param filters: move only messages whose latest death matches (see :func:`matches`)
    :param limit: move at most this many
    :param rate: at most this many moves per second
    :param on_move: called with the count after each move (progress on a terminal)
    :param ids: move only messages whose ``x-postroom-dead-letter-id`` is one of these (the
        redrive list of ``postroom dlq analyze``); stops once all were moved

    Only the messages in the queue at the start are looked at: one that dies again while the
    redrive runs (a TTL of 0 in its queue) waits for the next redrive, not loops in this one.

    :raises PublishReturned: the destination does not exist (the message stays)
    :raises ClientError: the broker refused the operator (403 without write permission on
        the destination)
    """
    result = Redrive([], [])
    remaining = set(ids) if ids is not None else None
    left: int | None = None  # of the messages in the queue at the start (not those that die again meanwhile)
    try:
        while (limit is None or len(result.moved) < limit) and left != 0:
            message = conn.get(queue)
            if message is None:
                break
            if left is None:  # the first: the others are those behind it (-1: not known, no bound)
                left = message.remaining if message.remaining is not None else -1
            else:
                left -= 1
            if filters and not matches(message, filters):
                continue  # held unacked: given back, in order, when we are done
            dead_letter_id = message.headers.get(DEAD_LETTER_ID_HEADER)
            if remaining is not None and dead_letter_id not in remaining:
                continue
            history = deaths(message)
            latest = history[0] if history else {}
            if to is not None:
                exchange, slash, routing_key = to.partition("/")
                exchange, routing_key = (exchange, routing_key) if slash else ("", to)
                properties = copy.copy(message.properties)
                # The copy is a new message: if it dies again it gets an id and a seal of its own.
                properties.headers = {
                    key: value for key, value in message.headers.items() if key not in _NOT_COPIED
                }
                conn.publish(exchange, routing_key, message.body, basic_properties=properties, mandatory=True)
            else:
                exchange, routing_key = "", str(latest.get("queue", ""))
                reason = _unredrivable(message, history)
                if reason is None:
                    try:
                        # Unchanged: the broker checks the seal and removes it, the id and x-delivery-count.
                        conn.publish(
                            REDRIVE_EXCHANGE, routing_key, message.body,
                            basic_properties=message.properties, mandatory=True,
                        )  # fmt: skip
                    except PublishNacked:
                        reason = BROKEN_SEAL
                if reason is not None:
                    result.refused.append(Refused(routing_key, reason))
                    continue  # held unacked: given back when we are done
            message.ack()
            result.moved.append(Redriven(exchange, routing_key, str(latest.get("reason"))))
            if on_move is not None:
                on_move(len(result.moved))
            if remaining is not None:
                remaining.discard(dead_letter_id)
                if not remaining:
                    break
            if rate:
                sleep(1.0 / rate)
    finally:
        # Give back what we hold: skipped and refused messages, and one whose move failed (never acked).
        conn.recover()
    return result


#: Headers a copy sent to ``--to`` leaves behind.
_NOT_COPIED = frozenset(("x-delivery-count", DEAD_LETTER_ID_HEADER, SEAL_HEADER))


def _unredrivable(message: Message, history: list[dict[str, Any]] | None) -> str | None:
    """Why ``message`` cannot go back to where it died without ``--to`` (``None``: it may)."""
    if history is None:
        return MALFORMED
    if not history:
        return NO_DEATH
    if SEAL_HEADER not in message.headers:
        return UNSEALED
    return None

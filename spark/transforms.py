"""Pure DataFrame functions of the dead-letter analysis, over the event schema (``spark/schema.py``).

* :func:`dead_letters`: events -> one row per dead-lettered message and dead-letter queue;
* :func:`summarise`: those rows -> :class:`Summary` (counts, and the small tables the report plots);
* :func:`analyze`: both at once, for tests and small inputs;
* :func:`redrive_list`: the ids of pending dead letters chosen by a SQL filter.

Nothing here reads or writes files; the job (``spark/job.py``) does, so tests feed small frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["ROW_COLUMNS", "Summary", "analyze", "corrupt_records", "dead_letters", "redrive_list", "summarise"]

#: How many values the "top" tables keep (queues, header values).
TOP = 20

#: The columns of :func:`dead_letters`, in order.
ROW_COLUMNS = (
    "dead_letter_id",
    "message_id",
    "vhost",
    "source_queue",
    "dead_letter_queue",
    "reason",
    "delivery_count",
    "exchange",
    "routing_keys",
    "dead_letter_exchange",
    "headers",
    "body_size",
    "body_preview",
    "first_death_time",
    "last_death_time",
    "pending",
    "settled_time",
    "deaths",
)


def dead_letters(events: DataFrame) -> DataFrame:
    """One row per dead-lettered message and dead-letter queue it reached (``ROW_COLUMNS``).

    ``pending`` is true while no ``settled`` event names that id in that queue;
    ``first_death_time`` is the earliest time in its ``x-death`` history (or this death's),
    ``last_death_time`` this death's. A fanout dead-letter exchange reaching two queues gives
    two rows with the same ``dead_letter_id``.
    """
    died = events.where(F.col("kind") == "dead_lettered").select(
        "dead_letter_id",
        "message_id",
        "vhost",
        F.col("queue").alias("source_queue"),
        F.explode("dead_letter_queues").alias("dead_letter_queue"),
        "reason",
        "delivery_count",
        "exchange",
        "routing_keys",
        "dead_letter_exchange",
        "headers",
        "body_size",
        "body_preview",
        F.least(F.array_min(F.col("deaths.time")), F.col("time")).alias("first_death_time"),
        F.col("time").alias("last_death_time"),
        "deaths",
    )
    settled = (
        events.where(F.col("kind") == "settled")
        .groupBy("dead_letter_id", "vhost", F.col("queue").alias("dead_letter_queue"))
        .agg(F.min("time").alias("settled_time"))
    )
    # Broadcast the settled side: it is narrow (an id, two names and a time per dead letter:
    # tens of MB for a million), while shuffling the wide side would move every body preview
    # across the cluster once more.
    rows = died.join(F.broadcast(settled), ["dead_letter_id", "vhost", "dead_letter_queue"], "left")
    return rows.withColumn("pending", F.col("settled_time").isNull()).select(*ROW_COLUMNS)


def corrupt_records(events: DataFrame) -> int:
    """How many damaged spans, torn tails and bad headers the readers found."""
    return int(events.where(F.col("kind") == "corrupt").count())


@dataclass
class Summary:
    """The analysis' figures; :meth:`as_json` is ``summary.json``."""

    total: int
    pending: int
    by_reason: dict[str, int]
    by_queue: dict[str, int]
    by_dlq: dict[str, int]
    corrupt_records: int
    first_death: str | None = None
    last_death: str | None = None
    #: ``(minute, reason, count)``, ascending by minute.
    per_minute: list[tuple[str, str, int]] = field(default_factory=list)
    #: ``(delivery_count, count)``, ascending.
    delivery_counts: list[tuple[int, int]] = field(default_factory=list)
    #: ``(header, value, count)``, most common first.
    top_headers: list[tuple[str, str, int]] = field(default_factory=list)
    #: ``(source_queue, reason, count)``, most common first.
    by_queue_reason: list[tuple[str, str, int]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The JSON-ready summary (the contract's keys first)."""
        return {
            "total": self.total,
            "pending": self.pending,
            "by_reason": self.by_reason,
            "by_queue": self.by_queue,
            "by_dlq": self.by_dlq,
            "corrupt_records": self.corrupt_records,
            "consumed": self.total - self.pending,
            "first_death": self.first_death,
            "last_death": self.last_death,
            "delivery_counts": {str(count): n for count, n in self.delivery_counts},
            "by_queue_reason": [{"queue": q, "reason": r, "count": n} for q, r, n in self.by_queue_reason],
            "top_headers": [{"header": h, "value": v, "count": n} for h, v, n in self.top_headers],
        }


_EPOCH = datetime(1970, 1, 1)


def _utc(micros: int) -> str:
    """Microseconds since the epoch as ISO 8601 in UTC, without the zone (as in the report).

    Times leave Spark as integers: PySpark would make a timestamp a datetime in the host's
    local zone, whatever the session's.
    """
    return (_EPOCH + timedelta(microseconds=micros)).isoformat()


def summarise(rows: DataFrame, corrupt: int = 0) -> Summary:
    """Count ``rows`` (of :func:`dead_letters`) every way the report shows.

    Two passes over the input, each reading only the columns it needs: one aggregation over
    three grouping sets (queue and reason and pending; minute and reason; delivery count), a
    few thousand groups at most, and the header values. Both are collected to the driver.
    """
    grouped = (
        rows.select(
            "reason",
            "source_queue",
            "dead_letter_queue",
            "pending",
            "delivery_count",
            F.unix_micros(F.date_trunc("minute", "last_death_time")).alias("minute"),
            "first_death_time",
            "last_death_time",
        )
        .groupingSets(
            [["reason", "source_queue", "dead_letter_queue", "pending"], ["minute", "reason"], ["delivery_count"]],
            "reason",
            "source_queue",
            "dead_letter_queue",
            "pending",
            "minute",
            "delivery_count",
        )
        .agg(
            F.grouping_id().alias("set"),
            F.count(F.lit(1)).alias("n"),
            F.unix_micros(F.min("first_death_time")).alias("a"),
            F.unix_micros(F.max("last_death_time")).alias("b"),
        )
        .collect()
    )
    # grouping_id() has a bit set for each column a set leaves out, first column highest:
    # (reason, source_queue, dead_letter_queue, pending, minute, delivery_count).
    by_queue_set, per_minute_set, delivery_set = 0b000011, 0b011101, 0b111110
    by_reason: dict[str, int] = {}
    by_queue: dict[str, int] = {}
    by_dlq: dict[str, int] = {}
    queue_reason: dict[tuple[str, str], int] = {}
    per_minute: list[tuple[str, str, int]] = []
    delivery_counts: list[tuple[int, int]] = []
    total = pending = 0
    first = last = None
    for row in grouped:
        n = int(row["n"])
        if row["set"] == per_minute_set:
            if row["minute"] is not None:
                per_minute.append((_utc(row["minute"])[:16], row["reason"], n))
            continue
        if row["set"] == delivery_set:
            delivery_counts.append((int(row["delivery_count"]), n))
            continue
        assert row["set"] == by_queue_set, row["set"]
        total += n
        pending += n if row["pending"] else 0
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + n
        by_queue[row["source_queue"]] = by_queue.get(row["source_queue"], 0) + n
        by_dlq[row["dead_letter_queue"]] = by_dlq.get(row["dead_letter_queue"], 0) + n
        key = (row["source_queue"], row["reason"])
        queue_reason[key] = queue_reason.get(key, 0) + n
        if row["a"] is not None and (first is None or row["a"] < first):
            first = row["a"]
        if row["b"] is not None and (last is None or row["b"] > last):
            last = row["b"]
    top_headers = [
        (row["key"], row["value"], int(row["n"]))
        for row in rows.select(F.explode("headers"))
        .where(~F.col("key").startswith("x-first-death-"))
        .groupBy("key", "value")
        .agg(F.count(F.lit(1)).alias("n"))
        .orderBy(F.desc("n"), "key", "value")
        .limit(TOP)
        .collect()
    ]
    return Summary(
        total=total,
        pending=pending,
        by_reason=dict(sorted(by_reason.items())),
        by_queue=dict(sorted(by_queue.items())),
        by_dlq=dict(sorted(by_dlq.items())),
        corrupt_records=corrupt,
        first_death=_utc(first) if first is not None else None,
        last_death=_utc(last) if last is not None else None,
        per_minute=sorted(per_minute),
        delivery_counts=sorted(delivery_counts),
        top_headers=top_headers,
        by_queue_reason=sorted(((q, r, n) for (q, r), n in queue_reason.items()), key=lambda t: (-t[2], t[0], t[1])),
    )


def analyze(events: DataFrame) -> Summary:
    """The whole analysis of an event DataFrame: :func:`summarise` of :func:`dead_letters`."""
    return summarise(dead_letters(events), corrupt_records(events))


def redrive_list(rows: DataFrame, where: str | None = None) -> DataFrame:
    """The ``dead_letter_id`` and ``dead_letter_queue`` of pending dead letters matching ``where``.

    :param where: a Spark SQL condition over the row columns, e.g.
        ``"reason = 'rejected' AND headers['tenant'] = 'acme'"``; None takes every pending one
    :raises pyspark.errors.AnalysisException: the condition does not parse or names no column
    """
    chosen = rows.where(F.col("pending"))
    if where:
        chosen = chosen.where(F.expr(where))
    return chosen.select("dead_letter_id", "dead_letter_queue").distinct().orderBy("dead_letter_id")

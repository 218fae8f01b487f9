"""The one schema of dead-letter events, in Arrow (exporter, Python Data Source) and Spark terms.

Every reader produces rows of this schema: ``postroom dlq export`` writes it to Parquet, the
Python Data Source yields it as Arrow batches from raw segments, and the job reads both into
one DataFrame. One row per event of the dead-letter stream (``docs/wal-format.md``):

* ``kind = "dead_lettered"``: a ``DEAD_LETTERED`` record; every column but ``problem`` is set;
* ``kind = "settled"``: a ``DEAD_LETTER_SETTLED`` record; ``dead_letter_id``, ``vhost``,
  ``queue`` (the dead-letter queue) and ``time`` are set;
* ``kind = "corrupt"``: a damaged span or torn tail, ``problem`` says what was found there;
  counted by the analysis, never fatal.

``segment`` and ``offset`` say where each event is (the file ``<segment:020d>.wal`` of the
stream), ``date`` (``YYYY-MM-DD``, UTC) is the Parquet partition.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["ARROW_SCHEMA", "DEATH_ARROW", "KINDS", "SPARK_SCHEMA_DDL", "spark_schema"]

#: The values of the ``kind`` column.
KINDS = ("dead_lettered", "settled", "corrupt")

_TIMESTAMP = pa.timestamp("us", tz="UTC")

#: One ``x-death`` entry, most recent first in ``deaths``.
DEATH_ARROW = pa.struct(
    [
        pa.field("queue", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("exchange", pa.string()),
        pa.field("count", pa.int64()),
        pa.field("time", _TIMESTAMP),
    ]
)

#: The event schema in Arrow terms.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("dead_letter_id", pa.int64()),
        pa.field("vhost", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("time", _TIMESTAMP),
        pa.field("reason", pa.string()),
        pa.field("delivery_count", pa.int64()),
        pa.field("exchange", pa.string()),
        pa.field("routing_keys", pa.list_(pa.string())),
        pa.field("dead_letter_exchange", pa.string()),
        pa.field("dead_letter_queues", pa.list_(pa.string())),
        pa.field("message_id", pa.string()),
        pa.field("headers", pa.map_(pa.string(), pa.string())),
        pa.field("deaths", pa.list_(DEATH_ARROW)),
        pa.field("body_size", pa.int64()),
        pa.field("body_preview", pa.binary()),
        pa.field("segment", pa.int64()),
        pa.field("offset", pa.int64()),
        pa.field("problem", pa.string()),
        pa.field("date", pa.string()),
    ]
)

#: The same schema as a Spark DDL string (a test checks that the two agree).
SPARK_SCHEMA_DDL = (
    "kind STRING, dead_letter_id BIGINT, vhost STRING, queue STRING, time TIMESTAMP, reason STRING, "
    "delivery_count BIGINT, exchange STRING, routing_keys ARRAY<STRING>, dead_letter_exchange STRING, "
    "dead_letter_queues ARRAY<STRING>, message_id STRING, headers MAP<STRING, STRING>, "
    "deaths ARRAY<STRUCT<queue: STRING, reason: STRING, exchange: STRING, count: BIGINT, time: TIMESTAMP>>, "
    "body_size BIGINT, body_preview BINARY, segment BIGINT, offset BIGINT, problem STRING, date STRING"
)


def spark_schema() -> object:
    """The event schema as a Spark ``StructType`` (imports pyspark: call it on the driver)."""
    from pyspark.sql.types import StructType

    return StructType.fromDDL(SPARK_SCHEMA_DDL)

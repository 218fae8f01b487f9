"""A Python Data Source over raw dead-letter segments: ``spark.read.format("postroom_deadletters")``.

One input partition per segment file, so segments are decoded in parallel, one Python worker
each, by :func:`spark.events.segment_batches` (the broker's own record decoder), and arrive as
Arrow batches of the event schema (``spark/schema.py``). Damage becomes ``corrupt`` rows.

Options:

* ``path``: the stream directory (``<storage.dir>/deadletters``), a path every executor can
  open (the broker host, or a shared file system);
* ``exclude``: comma-separated segment numbers to skip (those already exported to Parquet).

:func:`register` makes it available in a session, for reading segments by hand. The job
itself decodes segments with ``mapInArrow`` (``spark/job.py``): a Data Source plans on the
driver with the executors' Python, which a cluster run with ``--archives`` has only on the
executors. Python Data Sources need PySpark 4.0 or later.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from postroom.spark.schema import SPARK_SCHEMA_DDL

__all__ = ["FORMAT", "DeadLetterSegments", "SegmentPartition", "register"]

#: The format name to pass to ``spark.read.format``.
FORMAT = "postroom_deadletters"


class SegmentPartition(InputPartition):
    """One segment file: its number and its path."""

    def __init__(self, number: int, path: str) -> None:
        super().__init__((number, path))
        self.number = number
        self.path = path


class DeadLetterSegmentReader(DataSourceReader):
    """Lists the segment files (driver) and decodes one per partition (executors)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.path = options.get("path", "")
        excluded = options.get("exclude", "")
        self.exclude = {int(item) for item in excluded.split(",") if item.strip()}

    def partitions(self) -> list[InputPartition]:
        """One partition per segment file not excluded, in segment order."""
        from postroom.spark.events import list_segments

        found = [SegmentPartition(n, p) for n, p in list_segments(self.path) if n not in self.exclude]
        # Spark wants at least one partition; an empty one reads nothing.
        return found or [SegmentPartition(0, "")]  # type: ignore[list-item]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The events of one segment, as Arrow record batches."""
        from postroom.spark.events import segment_file_batches

        assert isinstance(partition, SegmentPartition)
        if partition.path:
            yield from segment_file_batches(partition.path, partition.number)


class DeadLetterSegments(DataSource):
    """The dead-letter event stream's raw segments as a DataFrame of the event schema."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return DeadLetterSegmentReader(dict(self.options))


def register(spark: Any) -> None:
    """Make ``spark.read.format("postroom_deadletters")`` available in ``spark``'s session."""
    spark.dataSource.register(DeadLetterSegments)

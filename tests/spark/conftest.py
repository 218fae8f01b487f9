"""One local SparkSession for the whole test run.

``local[1]`` with one shuffle partition and no UI (STYLE.md, Testing): a session start costs
seconds on this machine, so every Spark test shares it. Without pyspark or pyarrow the tests
that need them are skipped, saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared local SparkSession (loopback only, workers on this interpreter)."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from postroom.spark.job import build_session

    session = build_session("local[1]", app="postroom-tests")
    session.conf.set("spark.sql.shuffle.partitions", "1")
    yield session
    session.stop()


"""The job on a real Spark standalone cluster, launched as docs/dead-letter-analysis.md says.

A master and two workers (one core each) are started from the installed pyspark's own
``spark-class``, loopback only, once for this module and stopped by pid. The command of
docs/dead-letter-analysis.md, ``spark-submit --master spark://… spark/dlq_job.py``, runs over raw segments and over
their Parquet export; Spark's own event log (its ``EventLoggingListener``) then says which
executor ran every task, and the report must equal a ``local[1]`` run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from postroom.spark.export import export  # noqa: E402
from postroom.spark.standalone import standalone_cluster, submit_command, submit_environment  # noqa: E402
from tests.spark.records import dead_lettered, segment, settled, write_segment  # noqa: E402

#: Two spark-submit runs on the cluster, a JVM and executors each: minutes, not seconds.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.hang_timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
#: Reasons and queues of the synthetic dead letters: 70 of them over three segments, 5 settled.
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
QUEUES = ("orders", "billing")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master with two one-core workers; yields the master URL."""
    with standalone_cluster(tmp_path_factory.mktemp("standalone")) as url:
        yield url


def dead_letter_segments(directory: Path) -> None:
    """70 dead letters over three segments (so the raw decoding has partitions to spread), 5 settled."""
    identifier = 0
    for number in (1, 2, 3):
        records: list[Any] = []
        for _ in range(24 if number < 3 else 22):
            identifier += 1
            records.append(
                dead_lettered(identifier, QUEUES[identifier % 2], REASONS[identifier % 4], ("dlq",), identifier % 3)
            )
        if number == 3:
            records += [settled(identifier) for identifier in (1, 2, 3, 4, 5)]
        write_segment(directory, number, segment(number, records))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' environment, packed by the project's documented command."""
    archive = tmp_path_factory.mktemp("packed") / "env.tar.gz"
    subprocess.run([str(ROOT / "scripts" / "pack-spark-env"), str(archive)], check=True, timeout=600,
                   capture_output=True, env=dict(os.environ, PYTHON=sys.executable))  # fmt: skip
    return archive


def submit(
    master: str, arguments: list[str], events: Path, archive: Path, python: str = "./environment/bin/python"
) -> subprocess.CompletedProcess[str]:
    """The cluster command of docs/dead-letter-analysis.md, as a user runs it: spark-submit's own ``--master``, the
    executors' environment shipped with ``--archives``, run from outside the checkout."""
    events.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": f"file://{events}",
    }
    return subprocess.run(submit_command(master, archive, arguments, conf), capture_output=True, text=True,
                          timeout=600, env=submit_environment(python), cwd=events)  # fmt: skip


def executors_of_tasks(events: Path) -> list[str]:
    """The executor of every finished task, from Spark's event log."""
    found = []
    for log in events.rglob("events_*"):  # Spark 4: a directory per app, the events in events_N_*
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd":
                found.append(event["Task Info"]["Executor ID"])
    return found


def summary(out: Path) -> dict[str, Any]:
    report = json.loads((out / "summary.json").read_text())
    return {key: report[key] for key in ("total", "pending", "by_reason", "by_queue", "by_dlq", "corrupt_records")}


def test_the_readme_cluster_command_runs_its_tasks_on_the_workers(
    standalone: str, packed: Path, spark: Any, tmp_path: Path
) -> None:
    from postroom.spark.job import build_parser, run

    segments = tmp_path / "deadletters"
    dead_letter_segments(segments)
    parquet = tmp_path / "deadletters-parquet"
    export(str(segments), str(parquet), include_last=True)

    local = tmp_path / "local"
    run(spark, build_parser().parse_args(["--segments", str(segments), "--out", str(local)]), say=lambda _: None)
    expected = summary(local)
    assert (expected["total"], expected["pending"]) == (70, 65)

    for name, arguments in (("raw", ["--segments", str(segments)]), ("exported", ["--input", str(parquet)])):
        out, events = tmp_path / name, tmp_path / f"events-{name}"
        result = submit(standalone, [*arguments, "--out", str(out)], events, packed)
        assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
        assert summary(out) == expected, name
        executors = executors_of_tasks(events)
        assert executors and "driver" not in executors, (name, executors)
        if name == "raw":
            assert len(set(executors)) == 2, executors  # the segments' decoding spread over both workers


def test_executors_without_pyarrow_get_one_line_saying_so(standalone: str, packed: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    segments = tmp_path / "deadletters"
    dead_letter_segments(segments)
    result = submit(standalone, ["--segments", str(segments), "--out", str(tmp_path / "out")], tmp_path / "events",
                    packed, python=str(bare / "bin" / "python"))  # fmt: skip
    assert result.returncode == 1
    # spark-submit passes the driver's stderr on to its stdout; Spark's console progress bar may
    # share the line (it ends with a carriage return).
    output = result.stdout + result.stderr
    said = [line[line.index("dlq_job:") :] for line in output.splitlines() if "dlq_job:" in line]
    assert len(said) == 1 and "cannot import" in said[0] and str(bare / "bin" / "python") in said[0], said
    assert "No module named" in said[0] and "scripts/pack-spark-env" in said[0]
    assert "Traceback" not in output
    assert not (tmp_path / "out" / "summary.json").exists()

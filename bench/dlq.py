"""Dead-letter analysis throughput: the Spark job over Parquet and over raw segments, the export,
and a single-process pure-Python parse as the baseline.

Writes N ``DEAD_LETTERED`` records (bodies of ``--size`` bytes, so previews of up to 1 KiB),
one in ten followed by its ``DEAD_LETTER_SETTLED``, as the broker writes them (its encoder,
its segment stream, batched appends), then times each stage and prints rows/s (dead-letter
records per second). The export runs with one worker process, then one per CPU. Spark runs on
``--master`` (``local[2]`` by default; ``local-cluster[N,1,1024]`` to show that the raw path
scales with executors); the job over Parquet is timed first in a new session (with the JVM's
warm-up), again, and with ``--rows``.

With ``--submit MASTERS`` the Spark stages run instead as the ``spark-submit``
command of docs/dead-letter-analysis.md, once per master and input, timed from launch to exit; ``standalone`` starts a
standalone cluster of ``--workers`` one-core workers here (``spark.standalone``) and ships the
executors' environment packed by ``scripts/pack-spark-env``.

    python bench/dlq.py [--records 1000000] [--size 1024] [--master local[2]] [--dir DIR]
        [--stages parse,export,parquet,raw] [--submit standalone,local[2] [--workers 2]]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from postroom.broker.core.dead_letter_events import DeadLetterLog
from postroom.broker.storage.dead_letter_writer import DEAD_LETTER_SEGMENT_BYTES
from postroom.broker.wal.codec import encode
from postroom.broker.wal.files import DirectoryStorage
from postroom.broker.wal.records import DEAD_LETTER_PREVIEW_BYTES, DeadLettered, DeadLetterSettled
from postroom.broker.wal.segments import SEGMENT_HEADER_BYTES, iter_records
from postroom.broker.wal.stream import SegmentStream

ROOT = Path(__file__).resolve().parents[1]
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
#: Events per append: about what a broker dead-lettering 5,000 messages a second gathers in
#: one write interval (``broker.storage.dead_letter_writer.WRITE_INTERVAL``).
BATCH = 1000


def write_segments(directory: Path, records: int, size: int) -> int:
    """Write the synthetic stream as the broker does: events encoded by the dead-letter log's
    encoder, appended in batches (one per write interval of a busy broker) to the broker's own
    segment stream, which seals segments at the broker's size. Returns the events' bytes."""
    stream = SegmentStream(DirectoryStorage(str(directory)), DEAD_LETTER_SEGMENT_BYTES, time.time)
    run = stream.open()
    ids = DeadLetterLog(run, time.time)
    body = (b'{"order": 12345, "items": [1, 2, 3], "note": "' + b"x" * size)[:size]
    total = 0
    start = 1_795_000_000.0
    batch: list[bytes] = []
    for n in range(records):
        reason = REASONS[n % 4]
        queue = f"orders.{n % 7}"
        when = start + n * 0.001
        dead_letter_id = ids.next_id()
        batch.append(
            encode(
                DeadLettered(
                    dead_letter_id,
                    "/",
                    queue,
                    reason,
                    n % 5 if reason == "delivery_limit" else 0,
                    when,
                    "orders",
                    (f"order.{n % 3}.created",),
                    "dlx",
                    (f"{queue}.dlq",),
                    f"m-{n}",
                    ("tenant", "type", "x-first-death-reason"),
                    (f"tenant-{n % 11}", "OrderCreated", reason),
                    (queue,),
                    (reason,),
                    ("orders",),
                    (1,),
                    (int(when),),
                    size,
                    body[:DEAD_LETTER_PREVIEW_BYTES],
                )
            )
        )
        if n % 10 == 0:
            batch.append(encode(DeadLetterSettled(dead_letter_id, "/", f"{queue}.dlq", when + 1)))
        if len(batch) >= BATCH or n == records - 1:
            data = b"".join(batch)
            stream.append(data)
            total += len(data)
            batch.clear()
    stream.storage.close()
    return total


def parse(directory: Path) -> int:
    """The baseline: decode every record of every segment in this one process."""
    rows = 0
    for path in sorted(directory.glob("*.wal")):
        data = path.read_bytes()
        for _start, _end, record in iter_records(data, SEGMENT_HEADER_BYTES):
            rows += type(record) is DeadLettered
    return rows


def timed(label: str, records: int, fn: Any) -> float:
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    print(f"{label:<64} {seconds:8.1f} s {records / seconds:12,.0f} rows/s", flush=True)
    return seconds


def submit_once(command: list[str], environment: dict[str, str], cwd: Path, out: Path, records: int) -> None:
    result = subprocess.run(command, env=environment, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"spark-submit failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    total = json.loads((out / "summary.json").read_text())["total"]
    if total != records:
        raise SystemExit(f"the report counts {total:,} dead letters, not {records:,}")


def submitted(
    master: str, args: argparse.Namespace, directory: Path, segments: Path, parquet: Path, stages: set[str]
) -> None:
    """The parquet and raw stages as users run them: one spark-submit each, timed to its exit
    (the JVM's start and the session's included), its report checked."""
    from postroom.spark.standalone import standalone_cluster, submit_command, submit_environment

    with contextlib.ExitStack() as stack:
        archive = None
        if master == "standalone":
            archive = args.archive
            if archive is None:
                archive = directory / "environment.tar.gz"
                if not archive.exists():
                    subprocess.run([str(ROOT / "scripts" / "pack-spark-env"), str(archive)], check=True,
                                   env=dict(os.environ, PYTHON=sys.executable))  # fmt: skip
            master = stack.enter_context(standalone_cluster(directory / "standalone", workers=args.workers))
            label = f"standalone, {args.workers} workers x 1 core"
        else:
            label = master
        for stage, arguments in (("parquet", ["--input", str(parquet)]), ("raw", ["--segments", str(segments)])):
            if stage not in stages:
                continue
            out = directory / "out"
            shutil.rmtree(out, ignore_errors=True)
            command = submit_command(master, archive, [*arguments, "--out", str(out)])
            environment = submit_environment() if archive is not None else submit_environment(sys.executable)

            what = "Parquet" if stage == "parquet" else "raw segments"
            timed(
                f"spark-submit over {what} ({label})",
                args.records,
                functools.partial(submit_once, command, environment, directory, out, args.records),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, default=None, help="reuse (or keep) the data here")
    parser.add_argument("--stages", default="parse,export,parquet,raw")
    parser.add_argument(
        "--submit",
        default=None,
        help="comma-separated masters (standalone: a cluster of --workers one-core workers started "
        "here): the parquet and raw stages run as the spark-submit command of docs/dead-letter-analysis.md, timed from "
        "launch to exit, instead of in one session",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--archive", type=Path, default=None, help="the executors' environment (default: packed now)")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="postroom-dlq-bench-"))
    segments = directory / "deadletters"
    stages = set(args.stages.split(","))
    if not any(segments.glob("*.wal")):
        started = time.perf_counter()
        size = write_segments(segments, args.records, args.size)
        print(f"wrote {args.records:,} dead letters, {size / 2**20:,.0f} MiB, in {time.perf_counter() - started:.1f} s")
    print(f"{len(list(segments.glob('*.wal')))} segments in {segments}; master {args.master}; {os.cpu_count()} CPUs")
    if "parse" in stages:
        timed("single-process parse (baseline)", args.records, lambda: parse(segments))
    parquet = directory / "parquet"
    if "export" in stages:
        from postroom.spark.export import export

        for jobs in (1, os.cpu_count() or 1):
            shutil.rmtree(parquet, ignore_errors=True)
            timed(
                f"dlq export --jobs {jobs} (to Parquet)",
                args.records,
                lambda jobs=jobs: export(str(segments), str(parquet), include_last=True, jobs=jobs),
            )
    if args.submit and stages & {"parquet", "raw"}:
        for master in args.submit.split(","):
            submitted(master, args, directory, segments, parquet, stages)
    elif stages & {"parquet", "raw"}:
        from postroom.spark.job import build_session, run

        spark = build_session(args.master, app="postroom-dlq-bench")
        spark.sparkContext.setLogLevel("ERROR")

        def job(**options: Any) -> None:
            namespace = argparse.Namespace(
                input=options.get("input", []),
                segments=options.get("segments"),
                out=str(directory / "out"),
                master=args.master,
                redrive_where=None,
                redrive_all=False,
                rows=options.get("rows", False),
            )
            summary = run(spark, namespace, say=lambda _message: None)
            assert summary["total"] == args.records, summary["total"]

        if "parquet" in stages:
            # The first job of a session also pays the JVM's warm-up (class loading, JIT, code
            # generation: 10-13 s here); spark-submit and dlq analyze pay it once per run.
            for label in ("job over Parquet, first in session", "job over Parquet"):
                timed(f"{label} ({args.master})", args.records, lambda: job(input=[str(parquet)]))
            timed(
                f"job over Parquet, --rows ({args.master})",
                args.records,
                lambda: job(input=[str(parquet)], rows=True),
            )
        if "raw" in stages:
            timed(f"job over raw segments ({args.master})", args.records, lambda: job(segments=str(segments)))
        spark.stop()
    if args.dir is None:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()

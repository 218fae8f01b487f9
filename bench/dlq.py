"""Dead-letter analysis throughput: the Spark job over Parquet and over raw segments, the export,
and a single-process pure-Python parse as the baseline.

Writes N ``DEAD_LETTERED`` records (bodies of ``--size`` bytes, so previews of up to 1 KiB),
one in ten followed by its ``DEAD_LETTER_SETTLED``, with the broker's own encoder into
segments of the broker's size, then times each stage and prints rows/s (dead-letter records
per second). The export runs with one worker process, then one per CPU. Spark runs on
``--master`` (``local[2]`` by default; ``local-cluster[N,1,1024]`` to show that the raw path
scales with executors); the job over Parquet is timed first in a new session (with the JVM's
warm-up), again, and with ``--rows``.

    python bench/dlq.py [--records 1000000] [--size 1024] [--master local[2]] [--dir DIR]
        [--stages parse,export,parquet,raw]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.deadletters import DEAD_LETTER_SEGMENT_BYTES
from broker.wal.record import (
    SEGMENT_HEADER_BYTES,
    DeadLettered,
    DeadLetterSettled,
    encode,
    iter_records,
    segment_header,
)

REASONS = ("rejected", "expired", "maxlen", "delivery_limit")


def write_segments(directory: Path, records: int, size: int) -> int:
    """Write the synthetic stream; returns its bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    body = (b'{"order": 12345, "items": [1, 2, 3], "note": "' + b"x" * size)[:size]
    number = 1
    parts = [segment_header(number)]
    filled = SEGMENT_HEADER_BYTES
    total = 0
    start = 1_795_000_000.0
    for n in range(records):
        reason = REASONS[n % 4]
        queue = f"orders.{n % 7}"
        when = start + n * 0.001
        events = [
            encode(
                DeadLettered(
                    n + 1,
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
                    body[:1024],
                )
            )
        ]
        if n % 10 == 0:
            events.append(encode(DeadLetterSettled(n + 1, "/", f"{queue}.dlq", when + 1)))
        data = b"".join(events)
        if filled + len(data) > DEAD_LETTER_SEGMENT_BYTES:
            (directory / f"{number:020d}.wal").write_bytes(b"".join(parts))
            number += 1
            parts = [segment_header(number)]
            filled = SEGMENT_HEADER_BYTES
        parts.append(data)
        filled += len(data)
        total += len(data)
    (directory / f"{number:020d}.wal").write_bytes(b"".join(parts))
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
    print(f"{label:<40} {seconds:8.1f} s {records / seconds:12,.0f} rows/s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, default=None, help="reuse (or keep) the data here")
    parser.add_argument("--stages", default="parse,export,parquet,raw")
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
        from spark.export import export

        for jobs in (1, os.cpu_count() or 1):
            shutil.rmtree(parquet, ignore_errors=True)
            timed(
                f"dlq export --jobs {jobs} (to Parquet)",
                args.records,
                lambda jobs=jobs: export(str(segments), str(parquet), include_last=True, jobs=jobs),
            )
    if stages & {"parquet", "raw"}:
        from spark.job import build_session, run

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

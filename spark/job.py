"""The dead-letter analysis job: events in, Parquet rows, ``summary.json``, an HTML report out.

``main(argv)`` is what ``spark-submit spark/dlq_job.py`` and ``postroom dlq analyze`` run:

1. events from the exported Parquet (``--input``, any Hadoop-compatible path: a local
   directory, ``hdfs://``, ``s3a://``), read natively by Spark;
2. plus events of the segments that are not exported yet (``--segments``, a directory the
   executors can read, listed by one of them), decoded on the executors with ``mapInArrow``
   (one partition per segment, the broker's own decoder), first staged to Parquet under
   ``OUT/_staged`` in one parallel pass, so the passes after it read Parquet too;
3. :func:`spark.transforms.summarise` of :func:`spark.transforms.dead_letters` to
   ``OUT/summary.json``, the plots and ``OUT/report.html``: two passes, each reading only the
   columns it needs;
4. with ``--redrive-where EXPR`` (or ``--redrive-all``), ``OUT/redrive.txt``: the ids of the
   pending dead letters chosen, one per line, for ``postroom dlq redrive QUEUE --ids FILE``;
5. with ``--rows``, those rows to ``OUT/dead_letters`` (Parquet, zstd): every column of every
   dead letter, previews and headers included, copied once more; the export already holds
   all of it but the pending flag, so the analysis does not pay for this unless asked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import postroom

__all__ = ["build_parser", "build_session", "configured_master", "main", "run"]

#: Where the code's folders are (``spark/``, ``broker/``): the repository, or the installed
#: ``postroom`` package.
ROOT = str(Path(__file__).resolve().parent.parent)
#: Where ``postroom`` is imported from: Python workers started by a local Spark need it on their path.
PATH_ENTRY = str(Path(postroom.__file__ or ROOT).resolve().parent.parent)


def build_parser() -> argparse.ArgumentParser:
    """The job's arguments (shared by ``spark-submit spark/dlq_job.py`` and ``postroom dlq analyze``)."""
    parser = argparse.ArgumentParser(prog="dlq_job", description="Postroom dead-letter analysis on Spark.")
    parser.add_argument("--input", action="append", default=[], metavar="PATH", help="exported Parquet; repeatable")
    parser.add_argument("--segments", metavar="DIR", help="dead-letter segments not exported yet (read raw)")
    parser.add_argument(
        "--stream", metavar="NAME", help="read the segments of this stream (fed by a dead-letter exchange) instead"
    )
    parser.add_argument("--data-dir", metavar="DIR", help="with --stream: the broker's storage.dir")
    parser.add_argument("--vhost", default="/", help="with --stream: its vhost (default: %(default)s)")
    parser.add_argument("--from", dest="start", metavar="OFFSET|TIME", help="with --stream: from this offset or time")
    parser.add_argument("--to", dest="stop", metavar="OFFSET|TIME", help="with --stream: up to (not including) this")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the results go")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--redrive-where", metavar="EXPR", help="SQL filter of pending dead letters to list")
    parser.add_argument("--redrive-all", action="store_true", help="list every pending dead letter")
    parser.add_argument(
        "--rows",
        action="store_true",
        help="also write OUT/dead_letters: one row per dead letter and dead-letter queue (Parquet)",
    )
    return parser


#: What executors import: this package, the record decoder and what it reads streams and headers
#: with (``broker.wal`` and ``broker.wire`` modules that are pure,
#: standard library only), shipped with every session so no node needs Postroom installed.
SHIPPED = (
    "spark/*.py",
    "broker/__init__.py",
    "broker/wal/__init__.py",
    "broker/wal/records.py",
    "broker/wal/crc.py",
    "broker/wal/codec.py",
    "broker/wal/segments.py",
    "broker/wal/chunks.py",
    "broker/wal/paths.py",
    "broker/wal/dead_letter_fields.py",
    "broker/wire/__init__.py",
    "broker/wire/table.py",
    "broker/wire/content.py",
)

_shipped: dict[int, str] = {}


def ship_code(spark: Any) -> str:
    """Add a zip of :data:`SHIPPED` to ``spark``'s Python path on every executor (once per
    context); returns its path. Workers of a ``spark-submit`` run started before this process
    could change their environment, so this, not ``PYTHONPATH``, is what makes them find us.
    """
    import atexit
    import shutil
    import tempfile
    import zipfile

    context = spark.sparkContext
    key = id(context)
    if key not in _shipped:
        directory = tempfile.mkdtemp(prefix="postroom-spark-")
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "postroom_dlq.zip")
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("postroom/__init__.py", "")
            for pattern in SHIPPED:
                for source in sorted(Path(ROOT).glob(pattern)):
                    archive.write(source, "postroom/" + source.relative_to(ROOT).as_posix())
        context.addPyFile(path)
        _shipped[key] = path
    return _shipped[key]


def configured_master() -> str | None:
    """The master Spark itself was configured with, without the job's ``--master``: the one
    ``spark-submit`` passed (its ``--master``, ``spark-defaults.conf``, ``MASTER``), else the
    ``spark.master`` of ``spark-defaults.conf`` in ``SPARK_CONF_DIR`` (or ``SPARK_HOME/conf``)
    that a plain ``python`` run would load; ``None`` when nothing set one.
    """
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: its JVM holds the conf
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        return SparkConf().get("spark.master", None)
    directory = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, "spark-defaults.conf"), encoding="utf-8") as defaults:
            for line in defaults:
                key, _, value = line.strip().partition(" ")
                if key == "spark.master" and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


def build_session(master: str | None, app: str = "postroom-dlq-analysis") -> Any:
    """A SparkSession on ``master`` (the job's ``--master``), else on the master Spark was
    configured with (:func:`configured_master`), else on ``local[*]``.

    A local master is bound to loopback, runs workers on this Python and shuffles into twice as
    many partitions as cores, without adaptive execution or the UI; a cluster's settings are
    left as its configuration has them. Timestamps are UTC throughout
    (``spark.sql.session.timeZone``), so minutes and dates in the report do not depend on the
    host's zone.
    """
    from pyspark.sql import SparkSession

    master = master or configured_master() or "local[*]"
    builder = SparkSession.builder.appName(app).master(master).config("spark.sql.session.timeZone", "UTC")
    builder = builder.config("spark.sql.parquet.compression.codec", "zstd")
    if master.startswith("local"):
        # Workers run this interpreter (with pyarrow) and import this project; nothing listens
        # beyond loopback.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        path = os.environ.get("PYTHONPATH", "")
        if PATH_ENTRY not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (PATH_ENTRY, path) if p)
        # The analysis shuffles only small aggregates: on one machine, adaptive re-planning and
        # 200 shuffle partitions cost more than they save (2-3 s of a first job here).
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.sql.shuffle.partitions", str(2 * (os.cpu_count() or 1)))
        )
    spark = builder.getOrCreate()
    ship_code(spark)
    return spark


def _say(message: str) -> None:
    print(f"dlq analyze: {message}", file=sys.stderr, flush=True)


def _exists(spark: Any, path: str) -> bool:
    """Whether a Hadoop-compatible path exists (local, hdfs://, s3a://)."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return bool(hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(hadoop_path))


def _exported_segments(parquet: Any) -> set[int]:
    """The segments an exported dataset holds: from its file names when the export named them
    all (a listing, no job), else from its ``segment`` column (one pruned column: one scan)."""
    from pyspark.sql import functions as F

    from postroom.spark.export import FILE_PATTERN

    numbers = set()
    for name in parquet.inputFiles():
        match = FILE_PATTERN.search(name)
        if match is None:
            rows = parquet.select("segment").where(F.col("segment").isNotNull()).distinct().collect()
            return {int(row[0]) for row in rows}
        numbers.add(int(match.group(1)))
    return numbers


def _decode_segments(batches: Any) -> Any:
    """On an executor: the events of each ``(number, path)`` segment given, as Arrow batches."""
    from postroom.spark.events import segment_file_batches

    for batch in batches:
        for number, path in zip(batch.column("number").to_pylist(), batch.column("path").to_pylist(), strict=True):
            yield from segment_file_batches(path, number)


def _decode_stream_segments(selection: Any) -> Callable[[Any], Any]:
    """On an executor: the selected messages of each ``(number, path)`` stream segment given."""

    def decode(batches: Any) -> Any:
        from postroom.spark.streams import stream_file_batches

        for batch in batches:
            numbers, paths = batch.column("number").to_pylist(), batch.column("path").to_pylist()
            for number, path in zip(numbers, paths, strict=True):
                yield from stream_file_batches(path, number, selection)

    return decode


def _list_stream(selection: Any, data_dir: str) -> Callable[[Any], Any]:
    """On an executor: the stream's segment files."""

    def listing(_item: Any) -> Any:
        from postroom.spark.streams import stream_segments

        return stream_segments(data_dir, selection.vhost, selection.stream)

    return listing


def _raw_events(
    spark: Any, segments: str, exported: set[int], schema: Any, selection: Any = None, data_dir: str = ""
) -> Any:
    """The events of the segments in ``segments`` that are not ``exported``, one partition per
    segment (with ``selection``: of that stream of the broker's ``data_dir``, one partition per
    segment, that is per range of offsets). The directory is listed by an executor, and only
    executors run Python on it (``mapInArrow``): the driver need not see it, nor run the
    executors' Python (which, shipped with ``--archives``, exists only on them)."""
    from postroom.spark.events import list_segments

    context = spark.sparkContext
    lister = list_segments if selection is None else _list_stream(selection, data_dir)
    listed = context.parallelize([segments], 1).flatMap(lister).collect()
    wanted = [(number, path) for number, path in listed if number not in exported]
    if not wanted:
        return spark.createDataFrame([], schema)
    paths = spark.createDataFrame(context.parallelize(wanted, len(wanted)), "number long, path string")
    return paths.mapInArrow(_decode_segments if selection is None else _decode_stream_segments(selection), schema)


def read_events(
    spark: Any,
    inputs: Sequence[str],
    segments: str | None,
    staging: str,
    say: Callable[[str], None],
    selection: Any = None,
    data_dir: str = "",
) -> Any:
    """The event DataFrame: exported Parquet plus the segments not exported yet (staged); with
    ``selection`` (``spark.streams.Selection``), the segments are that stream's in ``data_dir``."""
    from postroom.spark.events import list_segments
    from postroom.spark.schema import spark_schema

    schema = spark_schema()
    frames = []
    exported: set[int] = set()
    present = [path for path in inputs if _exists(spark, path)]
    for path in inputs:
        if path not in present:
            say(f"no exported Parquet at {path} (nothing exported yet?): skipped")
    if present:
        parquet = spark.read.schema(schema).parquet(*present)
        if segments or selection is not None:  # which segments not to read raw
            exported = _exported_segments(parquet)
            say(f"{len(exported)} exported segment(s) in {', '.join(present)}")
        frames.append(parquet)
    if selection is not None:
        raw = _raw_events(spark, "", exported, schema, selection, data_dir)
        say(f"decoding the segments of stream {selection.stream!r} not exported yet")
        raw.write.mode("overwrite").parquet(staging)
        frames.append(spark.read.schema(schema).parquet(staging))
    elif segments and os.path.isdir(segments) and all(n in exported for n, _path in list_segments(segments)):
        say(f"no segment of {segments} left to decode (none, or all exported)")
    elif segments:  # (a directory only the executors see is listed by them)
        raw = _raw_events(spark, segments, exported, schema)
        say(f"decoding the segments of {segments} not exported yet")
        raw.write.mode("overwrite").parquet(staging)
        frames.append(spark.read.schema(schema).parquet(staging))
    if not frames:
        return spark.createDataFrame([], schema)
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    return events


def run(spark: Any, args: argparse.Namespace, say: Callable[[str], None] = _say) -> dict[str, Any]:
    """The analysis in ``spark``; returns the summary written to ``OUT/summary.json``.

    :raises pyspark.errors.AnalysisException: ``--redrive-where`` is not a valid condition
    """
    from postroom.spark.report import render_html, render_plots
    from postroom.spark.transforms import corrupt_records, dead_letters, redrive_list, summarise

    out = args.out
    selection = None
    if getattr(args, "stream", None):
        from postroom.spark.streams import Selection

        selection = Selection(args.vhost, args.stream).bounded(args.start, args.stop)
    staging = os.path.join(out, "_staged")
    events = read_events(spark, args.input, args.segments, staging, say, selection, getattr(args, "data_dir", ""))
    rows = dead_letters(events)
    say("summarising")
    summary = summarise(rows, corrupt_records(events))
    local = not out.startswith(("hdfs:", "s3a:", "s3:", "gs:", "abfs:"))
    if local:
        os.makedirs(out, exist_ok=True)
    plots = render_plots(summary)
    documents = {
        "summary.json": json.dumps(summary.as_json(), indent=2).encode(),
        "report.html": render_html(summary, plots).encode(),
        **plots,
    }
    if args.redrive_where or args.redrive_all:
        chosen = redrive_list(rows, args.redrive_where)
        lines = [f"# pending dead letters where {args.redrive_where or 'true'}"]
        ids = chosen.select("dead_letter_id").distinct().orderBy("dead_letter_id")
        lines += [str(row["dead_letter_id"]) for row in ids.toLocalIterator()]
        documents["redrive.txt"] = ("\n".join(lines) + "\n").encode()
        say(f"redrive list: {len(lines) - 1} id(s)")
    for name, data in documents.items():
        _write(spark, os.path.join(out, name), data, local)
    if getattr(args, "rows", False):
        say("writing one row per dead letter to dead_letters/")
        # Dictionary encoding does not pay for these columns (ids, times and previews are
        # mostly unique) and costs a third of the write time.
        writer = rows.write.mode("overwrite").option("parquet.enable.dictionary", "false")
        writer.parquet(os.path.join(out, "dead_letters"))
    say(f"{summary.total} dead letter(s), {summary.pending} pending, {summary.corrupt_records} corrupt record(s)")
    return summary.as_json()


def _write(spark: Any, path: str, data: bytes, local: bool) -> None:
    if local:
        partial = path + ".partial"
        with open(partial, "wb") as file:
            file.write(data)
        os.replace(partial, path)
        return
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    stream = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).create(hadoop_path, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


#: What to do when the executors' Python cannot run the job (docs/dead-letter-analysis.md, "On a cluster").
SHIP_AN_ENVIRONMENT = (
    "ship one that has it: scripts/pack-spark-env env.tar.gz, then PYSPARK_DRIVER_PYTHON=python "
    "PYSPARK_PYTHON=./environment/bin/python spark-submit --archives env.tar.gz#environment ..."
)


def _probe(_partition: Any) -> Any:
    """On an executor: its Python, host, and what it cannot import (``""``: nothing)."""
    import socket

    try:
        import pandas  # noqa: F401  (PySpark's Arrow functions require it)
        import pyarrow  # noqa: F401

        import postroom.spark.schema  # noqa: F401  (the code the session ships)

        problem = ""
    except ImportError as error:
        problem = str(error)
    yield sys.executable, socket.gethostname(), problem


def preflight(spark: Any) -> str | None:
    """Before the real work on a cluster: one small task per executor core imports pyarrow and
    the shipped code there. Returns one line saying what is wrong and how to fix it (``None``:
    nothing is). Local masters run this interpreter and are not probed."""
    context = spark.sparkContext
    if context.master.startswith("local"):
        return None
    slots = max(context.defaultParallelism, 1)
    try:
        answers = context.parallelize(range(slots), slots).mapPartitions(_probe).collect()
    except Exception as error:  # the executors could not even start a Python worker
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"the executors cannot run Python ({first}); {SHIP_AN_ENVIRONMENT}"
    for executable, host, problem in answers:
        if problem:
            return f"the executors' Python ({executable} on {host}) cannot import what the job needs ({problem}); " + (
                SHIP_AN_ENVIRONMENT
            )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job from the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    if not args.input and not args.segments:
        print("dlq_job: give --input (exported Parquet) and/or --segments (raw segments)", file=sys.stderr)
        return 2
    spark = build_session(args.master)
    try:
        problem = preflight(spark)
        if problem is not None:
            print(f"dlq_job: {problem}", file=sys.stderr)
            return 1
        run(spark, args)
    except Exception as error:
        from pyspark.errors import AnalysisException, ParseException

        if isinstance(error, (AnalysisException, ParseException)):
            print(f"dlq_job: {error}", file=sys.stderr)
            return 2
        raise
    finally:
        spark.stop()
    return 0

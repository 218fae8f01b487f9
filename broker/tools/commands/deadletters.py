"""The ``postroom dlq`` subcommands: ``inspect`` and ``redrive`` a dead-letter queue of a
running broker (over AMQP), ``export`` the dead-letter events (or a stream) to Parquet and
``analyze`` them with Spark (these two need the ``spark`` extra).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from postroom.broker.text import printable
from postroom.broker.tools.commands.serving import wal_dir

__all__ = ["dlq_inspect", "dlq_redrive", "dlq_export", "dlq_analyze", "EXPORT_JOBS", "duration", "positive"]


def dlq_inspect(args: argparse.Namespace) -> int:
    import json

    from postroom.broker.clients.client import ClientError, connect
    from postroom.broker.tools.redrive import inspect, summary

    try:
        with connect(args.url) as conn:
            for message in inspect(conn, args.queue, args.limit):
                print(json.dumps(summary(message), default=str))
    except ClientError as error:
        print(f"postroom dlq inspect: {error}", file=sys.stderr)
        return 1
    return 0


def dlq_redrive(args: argparse.Namespace) -> int:
    from postroom.broker.clients.client import ClientError, connect
    from postroom.broker.tools.redrive import read_ids, redrive

    filters = {}
    for item in args.filter or []:
        key, _, value = item.partition("=")
        filters[key] = value
    ids = None
    if args.ids:
        try:
            ids = read_ids(args.ids)
        except (OSError, ValueError) as error:
            print(f"postroom dlq redrive: {error}", file=sys.stderr)
            return 2
    progress = sys.stderr.isatty()

    def report(moved: int) -> None:
        if progress:
            # A carriage return of the program's own, past the escaping.
            print(f"\rmoved {moved}", end="", file=getattr(sys.stderr, "stream", sys.stderr), flush=True)

    try:
        with connect(args.url) as conn:
            done = redrive(
                conn, args.queue, to=args.to, filters=filters, limit=args.limit, rate=args.rate, on_move=report, ids=ids
            )
    except ClientError as error:
        print(f"postroom dlq redrive: {printable(str(error))}", file=sys.stderr)
        return 1
    if progress:
        print(file=sys.stderr)
    by_reason: dict[str, int] = {}
    for item in done.moved:
        by_reason[item.reason] = by_reason.get(item.reason, 0) + 1
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(by_reason.items())) or "none"
    print(f"moved {len(done.moved)} message(s) out of {args.queue!r} ({printable(reasons)})")
    if not done.refused:
        return 0
    refusals: dict[str, int] = {}
    for refused in done.refused:
        refusals[refused.reason] = refusals.get(refused.reason, 0) + 1
    print(f"postroom dlq redrive: left {len(done.refused)} message(s) in {args.queue!r}:", file=sys.stderr)
    for reason, count in sorted(refusals.items()):
        print(f"  {count}: {reason}", file=sys.stderr)
    return 1


def _dead_letter_dir(args: argparse.Namespace) -> str:
    from postroom.broker.storage.dead_letter_writer import DEAD_LETTER_DIR

    return os.path.join(wal_dir(args), DEAD_LETTER_DIR)


def _parquet_dir(args: argparse.Namespace) -> str:
    if args.parquet:
        return str(args.parquet)
    if args.stream:
        from urllib.parse import quote

        return os.path.join(wal_dir(args), "streams-parquet", quote(args.vhost, safe=""), quote(args.stream, safe=""))
    return os.path.join(wal_dir(args), "deadletters-parquet")


def _stream_selection(args: argparse.Namespace, command: str) -> Any:
    """With ``--stream``: the stream, vhost and ``--from``/``--to`` as a ``spark.streams.Selection``
    (``None`` without); ``False`` after saying what is wrong with a bound."""
    if not args.stream:
        return None
    from postroom.spark.streams import Selection

    try:
        return Selection(args.vhost, args.stream).bounded(args.start, args.stop)
    except ValueError as error:
        print(f"postroom dlq {command}: {error}", file=sys.stderr)
        return False


def dlq_export(args: argparse.Namespace) -> int:
    import time
    from datetime import datetime, timezone

    try:
        from postroom.spark.export import expire, export
    except ImportError as error:
        print(f"postroom dlq export needs the spark extra (pip install postroom[spark]): {error}", file=sys.stderr)
        return 2

    def progress(segment: int, rows: int) -> None:
        print(f"segment {segment}: {rows} event(s)", file=sys.stderr, flush=True)

    selection = _stream_selection(args, "export")
    if selection is False:
        return 2
    segments, parquet = _dead_letter_dir(args), _parquet_dir(args)
    if selection is not None:
        from postroom.spark.streams import stream_segments

        found = stream_segments(wal_dir(args), args.vhost, args.stream)
        if not found:
            print(f"postroom dlq export: no stream {args.stream!r} in vhost {args.vhost!r} here", file=sys.stderr)
            return 1
        segments = os.path.dirname(found[0][1])
    try:
        report = export(
            segments,
            parquet,
            include_last=args.include_last,
            on_segment=progress,
            jobs=args.jobs,
            delete_exported=args.delete_exported,
            stream=selection,
        )
    except OSError as error:
        print(f"postroom dlq export: {error}", file=sys.stderr)
        return 1
    print(
        f"exported {len(report.exported)} segment(s) ({report.rows} event(s), {report.corrupt_records} corrupt, "
        f"{report.files} file(s)); {len(report.skipped)} already exported"
    )
    if args.retention is not None:
        cutoff = datetime.fromtimestamp(time.time() - args.retention, timezone.utc).strftime("%Y-%m-%d")
        try:
            expired = expire(segments, parquet, cutoff)
        except OSError as error:
            print(f"postroom dlq export: --retention: {error}", file=sys.stderr)
            return 1
        print(
            f"expired {len(expired.dates)} day(s) before {cutoff} and {len(expired.segments)} segment(s) "
            "exported in them"
        )
    return 0


#: ``dlq export`` worker processes by default: half the cores, so that an export from cron
#: beside a running broker leaves it the rest.
EXPORT_JOBS = max(1, (os.cpu_count() or 2) // 2)


def duration(text: str) -> float:
    from postroom.config.values import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def dlq_analyze(args: argparse.Namespace) -> int:
    try:
        from postroom.spark.job import main as job
    except ImportError as error:
        print(f"postroom dlq analyze needs the spark extra (pip install postroom[spark]): {error}", file=sys.stderr)
        return 2
    selection = _stream_selection(args, "analyze")
    if selection is False:
        return 2
    argv = ["--out", args.out]
    if selection is not None:
        argv += ["--stream", args.stream, "--vhost", args.vhost, "--data-dir", wal_dir(args)]
        argv += [*(["--from", args.start] if args.start else []), *(["--to", args.stop] if args.stop else [])]
    else:
        argv += ["--segments", _dead_letter_dir(args)]
    argv += ["--master", args.master]
    parquet = _parquet_dir(args)
    if os.path.isdir(parquet) or args.parquet:
        argv += ["--input", parquet]
    if args.redrive_where:
        argv += ["--redrive-where", args.redrive_where]
    if args.redrive_all:
        argv.append("--redrive-all")
    if args.rows:
        argv.append("--rows")
    return job(argv)

"""Benchmark Postroom and RabbitMQ back to back with the project's load generator (``bench/amqp_load.py``).

Starts Postroom (``python -m postroom.broker.tools.cli serve``) and, unless ``--no-rabbitmq``, a private
RabbitMQ node (the Debian ``rabbitmq-server`` package) on free loopback ports, keeps both
running, then runs each scenario against one broker and straight after against the other,
alternating which goes first, so both see the same machine noise. Writes the raw JSON
lines and prints a markdown table of medians with the Postroom/RabbitMQ ratio.

    python bench/run.py                                  # the table in docs/benchmarks.md (about 25 minutes)
    python bench/run.py --scenarios transient --sizes 16 --seconds 5 --runs 1   # a quick look
    python bench/run.py --scenarios latency --rates 80000,120000                # the sweep's top
    python bench/run.py --no-rabbitmq                    # Postroom alone
    python bench/run.py --mqtt                           # the matrix, then MQTT's (bench/mqtt.py)

The load generator is ``bench/amqp_load.py`` (raw sockets and pamqp).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from postroom.broker.tools.testing import free_port, wait_for_port  # noqa: E402
from postroom.broker.tools.testing import rabbitmq_node as rabbitmq  # noqa: E402

#: (scenario, sizes, extra generator arguments) of the table in docs/benchmarks.md.
MATRIX = [
    ("transient", "16,1024", []),
    ("persistent", "16,1024", []),
    ("fanout", "16,1024", []),
    ("topic", "16,1024", []),
    ("latency", "16", []),
    # Streams: the persistent scenario into a stream queue (publish with confirms and read at
    # once, acks by 100).
    ("stream", "16,1024", []),
    # The fixed-rate sweep: below, at and past each broker's capacity (a broker past it must
    # not deliver less than at it).
    *[("latency", "16", ["--rate", str(rate)]) for rate in (10_000, 30_000, 50_000, 80_000, 120_000)],
]


#: Where the brokers' own output goes (beside the results), so a failure can be looked into.
LOG = ROOT / "bench" / "results" / "broker.log"


@contextmanager
def postroom(extra_yaml: str = "", storage: str = "", listen: str = "") -> Iterator[tuple[int, int]]:
    """Run Postroom on a free port (log in a temporary directory, ``fsync: batch``, and the
    ``storage:`` keys in ``storage``, such as ``memory_budget: 128MiB``, and the ``listen:``
    keys in ``listen``); yield ``(port, pid)``.

    Its output is appended to :data:`LOG`.
    """
    port = free_port()
    LOG.parent.mkdir(parents=True, exist_ok=True)
    log = open(LOG, "ab")
    data = Path(tempfile.mkdtemp(prefix="postroom-bench-"))
    config = data / "postroom.yaml"
    storage = f'dir: "{data / "wal"}", fsync: batch' + (f", {storage}" if storage else "")
    listen = f'amqp: "tcp:{port}:interface=127.0.0.1"' + (f", {listen}" if listen else "")
    config.write_text(f"listen: {{{listen}}}\nstorage: {{{storage}}}\n" + extra_yaml)
    process = subprocess.Popen(
        [sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    try:
        wait_for_port(port, 15)
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(10)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def generate(port: int, pid: int, scenario: str, sizes: str, extra: list[str], args: argparse.Namespace) -> list[dict]:
    """Run the load generator once; return its per-run records (``stream``: the ``persistent``
    scenario with ``--queue-type stream``)."""
    named = scenario
    if scenario == "stream":
        scenario, extra = "persistent", [*extra, "--queue-type", "stream"]
    command = [
        sys.executable,
        str(ROOT / "bench" / "amqp_load.py"),
        "--port",
        str(port),
        "--broker-pid",
        str(pid),
        "--scenario",
        scenario,
        "--size",
        sizes,
        "--seconds",
        str(args.seconds),
        "--runs",
        "1",
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    records = []
    for line in result.stdout.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "summary" not in record:
            record["scenario"] = named
            records.append(record)
    if not records:
        print(result.stderr[-2000:], file=sys.stderr)
    return records


def figure(record: dict) -> float:
    """The figure compared: deliveries per second (0 for a run that failed)."""
    return float(record.get("consumed_msgs_per_s") or 0.0)


def table(records: list[dict]) -> str:
    """Markdown: median figure per broker, scenario and size, and the ratio."""
    cells: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for record in records:
        scenario = record["scenario"]
        rate = (record.get("params") or {}).get("rate")
        if rate:
            scenario += f" @ {rate:,}/s"
        cells.setdefault((scenario, record["size"]), {}).setdefault(record["broker"], []).append(record)
    lines = [
        "| scenario | size | Postroom deliveries/s | RabbitMQ deliveries/s | ratio "
        "| Postroom p50 / p99 ms | RabbitMQ p50 / p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for (scenario, size), brokers in cells.items():
        medians = {name: statistics.median(figure(r) for r in runs) for name, runs in brokers.items()}
        latency = {}
        for name, runs in brokers.items():
            p50 = [r["latency_ms"]["p50"] for r in runs if r.get("latency_ms")]
            p99 = [r["latency_ms"]["p99"] for r in runs if r.get("latency_ms")]
            latency[name] = f"{statistics.median(p50):.2f} / {statistics.median(p99):.2f}" if p50 else "-"
        ours, theirs = medians.get("postroom"), medians.get("rabbitmq")
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        lines.append(
            f"| {scenario} | {size} B | {ours or 0:,.0f} | {theirs or 0:,.0f} | {ratio} | "
            f"{latency.get('postroom', '-')} | {latency.get('rabbitmq', '-')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", help="comma list (default: the matrix in docs/benchmarks.md)")
    parser.add_argument("--sizes", default=None, help="comma list of body sizes for --scenarios")
    parser.add_argument("--rates", default=None, help="comma list of publish rates for --scenarios latency")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M%S.jsonl"))
    parser.add_argument(
        "--mqtt", action="store_true", help="then bench/mqtt.py's scenarios (MQTT clients), on brokers of their own"
    )
    args = parser.parse_args()
    matrix = MATRIX
    if args.scenarios:
        matrix = [(name, args.sizes or "16", []) for name in args.scenarios.split(",")]
        if args.rates:
            matrix = [(name, sizes, ["--rate", rate]) for name, sizes, _ in matrix for rate in args.rates.split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    starters = [("postroom", postroom)] + ([] if args.no_rabbitmq else [("rabbitmq", rabbitmq)])
    with ExitStack() as stack, open(args.out, "a") as out:
        # Both brokers run for the whole matrix (warm, as in production), and each scenario runs
        # against one and straight after against the other, alternating which goes first.
        brokers = [(name, *stack.enter_context(start())) for name, start in starters]
        for run in range(args.runs):
            for scenario, sizes, extra in matrix:
                order = brokers if run % 2 == 0 else list(reversed(brokers))
                for name, port, pid in order:
                    for record in generate(port, pid, scenario, sizes, extra, args):
                        record["broker"] = name
                        records.append(record)
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                        print(
                            f"{name:9} {scenario:10} {record['size']:>6} B  {figure(record):>10,.0f} deliveries/s"
                            f"  {' '.join(record.get('errors') or [])}",
                            file=sys.stderr,
                        )
    print(table(records))
    if args.mqtt:
        command = [sys.executable, str(ROOT / "bench" / "mqtt.py"), "--seconds", str(args.seconds)]
        subprocess.run(command + (["--no-rabbitmq"] if args.no_rabbitmq else []), check=False)


if __name__ == "__main__":
    main()

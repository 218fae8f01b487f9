"""Replicated persistent publishing and consuming: a three-node Postroom cluster on etcd against
a three-node RabbitMQ cluster's quorum queue, on this machine.

Starts one etcd member and three Postroom nodes in cluster mode (``min_in_sync: 2``, the
default: a confirm means the leader and every follower in sync have synced the message), and
three nodes of the installed ``rabbitmq-server`` joined in one cluster; then runs
``bench/amqp_load.py``'s ``persistent`` scenario (a durable queue, ``delivery_mode`` 2,
confirms with 1000 in flight, one publisher and one consumer) against Postroom's leader and
against the RabbitMQ node that holds the quorum queue's leader (``--queue-type quorum``), one
after the other, alternating which goes first. Prints the table ``docs/benchmarks.md`` shows::

    python bench/cluster.py --sizes 16,1024 --runs 3 --seconds 10
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from postroom.broker.tools.cluster_lab import Lab, etcd_members  # noqa: E402
from postroom.broker.tools.testing import rabbitmq_cluster  # noqa: E402


def _runner() -> Any:
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,1024")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / time.strftime("cluster-%Y%m%d-%H%M%S.jsonl")
    )
    args = parser.parse_args()
    run = _runner()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    with ExitStack() as stack, open(args.out, "a") as out:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="postroom-cluster-bench-")))
        urls = stack.enter_context(etcd_members(1, directory))
        lab = Lab(directory, urls)
        lab.start_all()
        stack.callback(lab.stop_all)
        leader = lab.wait_for_leader(60)
        lab.wait_in_sync(set(lab.nodes), 60)
        node = lab.nodes[leader]
        assert node.process is not None
        brokers = [("postroom", node.amqp, node.process.pid)]
        if not args.no_rabbitmq:
            nodes = stack.enter_context(rabbitmq_cluster(3))
            brokers.append(("rabbitmq", nodes[0][0], 0))
        for number in range(args.runs):
            for name, port, pid in brokers if number % 2 == 0 else list(reversed(brokers)):
                extra = ["--queue-type", "quorum"]
                for record in run.generate(port, pid, "persistent", args.sizes, extra, args):
                    record["broker"] = name
                    record["scenario"] = "replicated persistent"
                    records.append(record)
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                    print(f"{name:9} {record['size']:>6} B {run.figure(record):>10,.0f} deliveries/s", file=sys.stderr)
    print(run.table(records))


if __name__ == "__main__":
    main()

"""What permissions cost: the transient scenario as guest (no patterns) and as a limited user.

One ``postroom serve`` holds both users; the load generator (``bench/amqp_load.py``) runs alternately as each,
each going first every other round, so that both see the same machine. The limited user may
configure, write and read only the generator's own names (``^amqp_bench\\.``, and the default
exchange for writing), so every declare, publish and consume is checked.

    python bench/permissions.py                  # 16 B, 10 s windows, 5 runs each
    python bench/permissions.py --runs 3 --seconds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import figure, generate, postroom  # noqa: E402

USERS = """users:
  - {name: guest, password: guest, loopback_only: true, tags: [administrator]}
  - name: bench
    password: bench
    permissions:
      "/": {configure: "^amqp_bench\\\\.", write: "^(amqp_bench\\\\.|amq\\\\.default$)", read: "^amqp_bench\\\\."}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="16")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"guest": [], "bench": []}
    with postroom(USERS) as (port, pid):
        for run in range(args.runs):
            for user in ("guest", "bench") if run % 2 == 0 else ("bench", "guest"):  # neither always first
                credentials = ["--user", user, "--password", user]
                records = generate(port, pid, "transient", args.size, credentials, args)
                rate = figure(records[0]) if records else 0.0
                figures[user].append(rate)
                print(f"{user:6} transient {args.size} B {rate:12,.0f} deliveries/s", flush=True)
    guest, limited = (statistics.median(figures[user]) for user in ("guest", "bench"))
    print(f"median: guest {guest:,.0f}, limited user {limited:,.0f}, limited/guest {limited / guest:.3f}")


if __name__ == "__main__":
    main()

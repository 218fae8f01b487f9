"""Coverage-guided fuzzing of the sans-IO core with atheris (``pip install atheris``).

Each input goes through :func:`broker.tools.fuzzing.run_once`: a fresh connection, optionally after a
valid session start, fed in pieces; anything that escapes the core, a 541 INTERNAL_ERROR or a
connection not released is a crash, saved by atheris as ``crash-*`` for replay.

    python bench/fuzz_core.py -atheris_runs=1000000          # the run in docs/rabbitmq-compatibility.md
    python bench/fuzz_core.py crash-1234                     # replay one input
    python bench/fuzz_core.py -max_total_time=600 CORPUS/    # ten minutes, keeping a corpus

The corpus starts from structured inputs (a publish with content, every kind of frame after
the session start); atheris's mutations then follow the coverage they reach. Arguments go to
libFuzzer as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402

from bench.atheris_loop import fuzz  # noqa: E402

with atheris.instrument_imports(include=["postroom"]):
    from postroom.broker.tools.fuzzing import run_once

from postroom.broker.tools.testing import publish_frames  # noqa: E402

#: Seeds, written to a corpus directory when one is given and it is empty.
SEEDS = [
    b"\x01" + publish_frames(1, "", "q", b"hello"),
    b"\x03" + publish_frames(2, "", "nowhere", b"x" * 5000, mandatory=True),
    b"\x05" + publish_frames(1, "amq.direct", "q", b"", frame_max=4096),
    b"\x00AMQP\x00\x00\x09\x01",
]


def main() -> None:
    fuzz("fuzz_core", SEEDS, run_once)


if __name__ == "__main__":
    main()

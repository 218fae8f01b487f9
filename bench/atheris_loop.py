"""The loop the coverage-guided fuzzers in ``bench/`` share (``fuzz_core.py``, ``fuzz_streams.py``):
seed an empty corpus directory, run atheris over one function, and say how many inputs it
ran in how long. Arguments go to libFuzzer as they are."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import atheris


def fuzz(name: str, seeds: list[bytes], run_once: Callable[[bytes], None]) -> None:
    """Fuzz ``run_once`` with the command line's libFuzzer arguments; ``seeds`` go into each
    corpus directory given that is empty."""
    started = time.monotonic()
    runs = 0

    def test_one_input(data: bytes) -> None:
        nonlocal runs
        runs += 1
        run_once(data)

    corpus = [Path(arg) for arg in sys.argv[1:] if not arg.startswith("-") and Path(arg).is_dir()]
    for directory in corpus:
        if not any(directory.iterdir()):
            for number, seed in enumerate(seeds):
                (directory / f"seed-{number}").write_bytes(seed)
    atheris.Setup(sys.argv, test_one_input)
    try:
        atheris.Fuzz()
    finally:
        print(f"{name}: {runs:,} inputs in {time.monotonic() - started:,.0f} s", file=sys.stderr)

"""The short run of ``bench/faults.py``, the long fault runs' script: the leader of a three-node
cluster killed twice, paused past its lease once and cut off from etcd and the other nodes once,
under two confirming publishers and two consumers, then the checker: every confirmed message
delivered, none that was never published, each publisher's order kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_short_fault_run_loses_nothing_confirmed() -> None:
    if shutil.which("etcd") is None:
        message = "the cluster tests need etcd (apt-get install etcd-server; scripts/test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "faults.py"),
            *("--kills", "2", "--pauses", "1", "--cuts", "1", "--spacing", "1.5"),
            *("--pause-seconds", "4", "--cut-seconds", "4", "--no-rabbitmq"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(fault["fault"] for fault in result["faults"]) == ["cut", "kill", "kill", "pause"]
    assert result["confirmed"] > 0
    assert (result["lost"], result["phantoms"], result["reordered"]) == (0, 0, 0), result
    assert all(fault["first_confirm_s"] is not None for fault in result["faults"]), result["faults"]
    assert result["tracebacks"] == []

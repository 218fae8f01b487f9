"""The ``postroom`` command: config check, and serve refusing a bad configuration before starting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import config

EXAMPLE = Path(config.__file__).parent / "postroom.yaml"


def postroom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_config_check_accepts_the_example() -> None:
    result = postroom("config", "check", str(EXAMPLE))
    assert (result.returncode, result.stdout.strip()) == (
        0,
        f"{EXAMPLE}: ok (1 vhost(s), 3 exchange(s), 3 queue(s))",
    )


def test_config_check_names_file_line_key_and_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("limits:\n  channel_max: lots\n")
    result = postroom("config", "check", str(bad))
    assert result.returncode == 1
    assert f"{bad}:2: limits.channel_max: must be an integer, not a string 'lots'" in result.stderr


def test_serve_refuses_a_bad_configuration_without_starting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text('vhosts:\n  "/":\n    bindings: [{exchange: nowhere, queue: q}]\n')
    result = postroom("serve", "--config", str(bad))
    assert result.returncode == 2
    assert "vhosts./.bindings[0].exchange: no exchange 'nowhere' is declared in this vhost" in result.stderr
    assert "vhosts./.bindings[0].queue: no queue 'q' is declared in this vhost" in result.stderr

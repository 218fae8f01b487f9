"""The ``postroom`` command: config check, and serve refusing a bad configuration before starting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from postroom import config

EXAMPLE = Path(config.__file__).parent / "postroom.yaml"


def postroom(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
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


def test_wal_check_and_dump_read_a_log(tmp_path: Path) -> None:
    from postroom.broker.wal.codec import encode
    from postroom.broker.wal.files import DirectoryStorage
    from postroom.broker.wal.log import WriteAheadLog
    from postroom.broker.wal.records import Published, QueueDeclared

    log = WriteAheadLog(DirectoryStorage(str(tmp_path / "wal")))
    log.open()
    log.append(encode(QueueDeclared("/", "jobs", True, False, b"")))
    log.append(encode(Published(1, "/", ("jobs",), "", "jobs", 0.0, b"h" * 14, b"body")))
    log.sync()
    check = postroom("wal", "check", "--data-dir", str(tmp_path / "wal"))
    assert check.returncode == 0
    assert "1 segment(s), 2 record(s)" in check.stdout
    dump = postroom("wal", "dump", "--data-dir", str(tmp_path / "wal"))
    assert [line.split()[4] for line in dump.stdout.splitlines()] == ["QUEUE_DECLARED", "PUBLISHED"]


def test_wal_check_reports_damage_in_the_middle(tmp_path: Path) -> None:
    from postroom.broker.wal.codec import encode
    from postroom.broker.wal.files import DirectoryStorage
    from postroom.broker.wal.log import WriteAheadLog
    from postroom.broker.wal.records import QueueDeclared

    directory = tmp_path / "wal"
    log = WriteAheadLog(DirectoryStorage(str(directory)))
    log.open()
    for name in ("a", "b", "c"):
        log.append(encode(QueueDeclared("/", name, True, False, b"")))
    log.sync()
    segment = next(directory.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[16 + 12] ^= 0xFF  # inside the first record's payload
    segment.write_bytes(bytes(data))
    check = postroom("wal", "check", "--data-dir", str(directory))
    assert check.returncode == 1
    assert "bad crc" in check.stdout

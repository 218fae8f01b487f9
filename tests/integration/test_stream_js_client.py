"""RabbitMQ's JavaScript stream client (``rabbitmq-stream-js-client`` from the npm registry),
unchanged, against Postroom over loopback. Its releases from 1.0 send
``exchange_command_versions`` (RabbitMQ 3.11) once open and stop when the broker closes on it,
as RabbitMQ 3.10.8 does; Postroom answers it (the answer's format is RabbitMQ's, from
``rabbit_stream_core:response_body``; tests/broker/test_stream_connection.py checks it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from postroom.broker.tools.testing import NpmUnavailable, free_port, npm
from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration

#: The client, at a version that sends ``exchange_command_versions``.
CLIENT = "rabbitmq-stream-js-client@1.0.0"
SCRIPT = Path(__file__).parent / "js" / "stream_client.js"


@pytest.fixture(scope="module")
def client_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``node_modules`` with the client installed."""
    where = tmp_path_factory.mktemp("stream-js-client")
    try:
        npm(["install", "--ignore-scripts", "--prefix", str(where), CLIENT], where)
    except NpmUnavailable as missing:
        pytest.skip(f"could not fetch {CLIENT}: {missing}")
    return where / "node_modules"


def test_rabbitmqs_javascript_stream_client_publishes_deduplicates_and_reads(
    client_modules: Path, tmp_path: Path
) -> None:
    stream = free_port()
    with broker(tmp_path / "data", stream=stream):
        done = subprocess.run(
            ["node", str(SCRIPT), str(stream), "js-events"],
            env={**os.environ, "NODE_PATH": str(client_modules)},
            capture_output=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    seen = json.loads(done.stdout.decode().strip().splitlines()[-1])
    # Three stored; the resend of id 2 confirmed and not stored.
    stats = seen.pop("stats")
    assert seen == {"received": ["m1", "m2", "m3"], "confirmed": [1, 2, 2, 3], "sequence": 3}
    assert stats["firstChunkId"] == 0 and stats["committedChunkId"] == stats["lastChunkId"] in (0, 1, 2)
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

"""A client suite not written for Postroom: Node amqplib's own tests, unchanged, against ``postroom serve``.

amqplib's tests talk to ``amqp://localhost`` (port 5672) and ``amqp://[::1]``, so the broker
runs here as a subprocess on 127.0.0.1:5672 and [::1]:5672, and the test is skipped, saying
why, when that port is taken or Node.js is missing. The suite comes from the npm registry as
the published package (2.1.0, the last release that ships its ``test/`` directory) with the
one package its tests need (``claire``); nothing of it is kept in this repository.

Node 20 applies ``--test-timeout`` to each whole file as well as to each test, so the
package's own 1 s timeout fails two files on RabbitMQ 3.10.8 too; the suite runs with
30 s, which every test meets on both brokers (RabbitMQ 3.10.8: 325 of 325 pass).

The one test expected to fail asserts that the server's product name is ``RabbitMQ``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.tools.testing import NpmUnavailable, npm, wait_for_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
AMQPLIB = "amqplib@2.1.0"
CLAIRE = "claire@0.4.1"
#: amqplib's tests that may fail on Postroom, with the reason.
EXPECTED_FAILURES = {"serverProperties": "asserts serverProperties.product == 'RabbitMQ'"}
NPM_TIMEOUT = 300


def _port_taken(family: int, host: str) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, 5672)) == 0


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def amqplib_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """amqplib's published package, unpacked, with ``claire`` installed beside it."""
    where = tmp_path_factory.mktemp("amqplib")
    try:
        npm(["pack", AMQPLIB, "--pack-destination", str(where)], where, NPM_TIMEOUT)
        # Beside the package, not in it: resolving require('claire') walks up to where/node_modules,
        # and amqplib's own development tools (linters, TypeScript) are not installed.
        npm(["install", "--ignore-scripts", "--prefix", str(where), CLAIRE], where, NPM_TIMEOUT)
    except NpmUnavailable as missing:
        pytest.skip(f"could not fetch {AMQPLIB}: {missing}")
    (tarball,) = where.glob("amqplib-*.tgz")
    with tarfile.open(tarball) as archive:
        archive.extractall(where, filter="data")
    package = where / "package"
    assert (package / "test" / "channel_api.test.js").exists(), "the package no longer ships its tests"
    return package


@pytest.fixture(scope="module")
def postroom_on_5672(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``postroom serve`` on amqplib's fixed addresses; yields the file its output goes to."""
    if _port_taken(socket.AF_INET, "127.0.0.1"):
        pytest.skip("127.0.0.1:5672 is taken by another broker; amqplib's tests use that port")
    where = tmp_path_factory.mktemp("serve")
    config = where / "postroom.yaml"
    config.write_text(f'listen: {{metrics: false, management: false}}\nstorage: {{dir: "{where / "data"}"}}\n')
    listeners = ["--listen", "tcp:5672:interface=127.0.0.1"]
    if _ipv6_loopback():
        listeners += ["--listen", r"tcp6:5672:interface=\:\:1"]
    log = where / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "broker.tools.cli", "serve", "--config", str(config), *listeners],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(5672, 20)
        yield log
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_suite(package: Path, report: Path) -> dict[str, str | None]:
    """Run amqplib's tests; every test case's name with its failure message (``None`` if it passed)."""
    subprocess.run(
        ["node", "--test", "--test-timeout=30000", "--test-reporter=junit", f"--test-reporter-destination={report}"],
        cwd=package,
        capture_output=True,
        timeout=600,
        env=dict(os.environ, NODE_ENV="test"),
    )
    results: dict[str, str | None] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        failure = case.find("failure")
        skipped = case.find("skipped")
        outcome = None
        if failure is not None:
            outcome = failure.get("message") or "failed"
        elif skipped is not None:
            outcome = "skipped"
        name = case.get("name", "")
        if name in results:
            name = f"{name} #{sum(1 for key in results if key.startswith(name))}"
        results[name] = outcome
    return results


def test_node_amqplib_suite_passes_but_for_the_product_name(
    amqplib_package: Path, postroom_on_5672: Path, tmp_path: Path
) -> None:
    results = run_suite(amqplib_package, tmp_path / "report.xml")
    failed = {name: outcome for name, outcome in results.items() if outcome is not None}
    assert len(results) >= 300, f"only {len(results)} tests ran: {sorted(results)[:20]}"
    expected = set(EXPECTED_FAILURES) | (set() if _ipv6_loopback() else {"ipv6"})  # amqp://[::1] needs it
    assert set(failed) == expected, failed
    assert "Postroom" in failed["serverProperties"]
    log = postroom_on_5672.read_text(errors="replace")
    assert "Traceback" not in log and "bug while" not in log, log[-3000:]

"""A client suite not written for Postroom: Node amqplib's own tests, unchanged, against ``postroom serve``.

amqplib's tests talk to ``amqp://localhost`` (port 5672) and ``amqp://[::1]``, so the broker
runs here as a subprocess on 127.0.0.1:5672 and [::1]:5672. Where a network namespace can be
made (as root), the broker and the suite run in one of their own, so a broker already on 5672
(a RabbitMQ service) is no obstacle; elsewhere the test is skipped, saying why, when that port
is taken. It is skipped too when Node.js is missing. The suite comes from the npm registry as
the published package (2.1.0, the last release that ships its ``test/`` directory) with the
one package its tests need (``claire``); nothing of it is kept in this repository.

Node 20 applies ``--test-timeout`` to each whole file as well as to each test, so the
package's own 1 s timeout fails two files on RabbitMQ 3.10.8 too; the suite runs with
30 s, which every test meets on both brokers (RabbitMQ 3.10.8: 325 of 325 pass).

The one test expected to fail asserts that the server's product name is ``RabbitMQ``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from postroom.broker.tools.testing import NpmUnavailable, npm

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


_IPV6_LOOPBACK = "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))"


def _own_network() -> bool:
    """Whether a network namespace of its own can be made here (root, with ``unshare``,
    ``nsenter`` and ``ip``): the broker and the suite then have a loopback to themselves, and
    5672 is free there whatever listens on it outside (a RabbitMQ service, say)."""
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip")):
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


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


@dataclass
class Served:
    """``postroom serve`` on amqplib's fixed addresses: the file its output goes to, what runs
    a command beside it (in its network namespace, when it has one of its own) and whether
    ``[::1]`` is there."""

    log: Path
    beside: list[str]
    ipv6: bool


@pytest.fixture(scope="module")
def postroom_on_5672(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    own = _own_network()
    if not own and _port_taken(socket.AF_INET, "127.0.0.1"):
        pytest.skip("127.0.0.1:5672 is taken by another broker; amqplib's tests use that port")
    where = tmp_path_factory.mktemp("serve")
    config = where / "postroom.yaml"
    config.write_text(f'listen: {{metrics: false, management: false}}\nstorage: {{dir: "{where / "data"}"}}\n')
    # (in a namespace of its own, its loopback is brought up first: ::1 with it, where IPv6 is on)
    inside = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if own else []
    ipv6 = subprocess.run([*inside, sys.executable, "-c", _IPV6_LOOPBACK], capture_output=True).returncode == 0
    listeners = ["--listen", "tcp:5672:interface=127.0.0.1"]
    if ipv6:
        listeners += ["--listen", r"tcp6:5672:interface=\:\:1"]
    log = where / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*inside, sys.executable, "-m", "postroom.broker.tools.cli", "serve", "--config", str(config), *listeners],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    beside = ["nsenter", "--target", str(process.pid), "--net", "--"] if own else []
    # Outside the namespace, 5672 is held meanwhile (if nothing else holds it), as a RabbitMQ
    # service would: the suite passes only if it reaches the broker in its own namespace.
    holder = socket.socket()
    if own and not _port_taken(socket.AF_INET, "127.0.0.1"):
        holder.bind(("127.0.0.1", 5672))
        holder.listen()
    try:
        deadline = time.monotonic() + 20
        while "AMQPServerFactory starting on 5672" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.1)
        yield Served(log, beside, ipv6)
    finally:
        holder.close()
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_suite(package: Path, report: Path, beside: list[str]) -> dict[str, str | None]:
    """Run amqplib's tests (the command prefixed with ``beside``); every test case's name with
    its failure message (``None`` if it passed)."""
    subprocess.run(
        [*beside, "node", "--test", "--test-timeout=30000", "--test-reporter=junit"]
        + [f"--test-reporter-destination={report}"],
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
    amqplib_package: Path, postroom_on_5672: Served, tmp_path: Path
) -> None:
    results = run_suite(amqplib_package, tmp_path / "report.xml", postroom_on_5672.beside)
    failed = {name: outcome for name, outcome in results.items() if outcome is not None}
    assert len(results) >= 300, f"only {len(results)} tests ran: {sorted(results)[:20]}"
    expected = set(EXPECTED_FAILURES) | (set() if postroom_on_5672.ipv6 else {"ipv6"})  # amqp://[::1] needs it
    assert set(failed) == expected, failed
    assert "Postroom" in failed["serverProperties"]
    log = postroom_on_5672.log.read_text(errors="replace")
    assert "Traceback" not in log and "bug while" not in log, log[-3000:]

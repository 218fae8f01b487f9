"""The project's shape: generic top-level names resolve here, pure packages stay pure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["broker", "exchanges", "plugins", "config", "spark"])
def test_top_level_package_resolves_inside_this_project(package: str) -> None:
    module = __import__(package)
    assert Path(module.__file__).resolve().is_relative_to(ROOT)
    assert Path(module.__file__).resolve().parent.name == package


@pytest.mark.parametrize(
    "module",
    ["broker.amqp.connection", "broker.core.vhost", "broker.core.node", "exchanges.registry", "broker.tools.testing"],
)
def test_pure_modules_import_no_reactor_metrics_or_spark(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "bad = [m for m in ('twisted.internet', 'prometheus_client', 'pyspark') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == ""


def test_the_clients_import_nothing_of_the_project_but_broker() -> None:
    # An application with its own top-level ``config`` or ``plugins`` package can use the clients.
    code = (
        "import sys, broker.clients.client, broker.clients.txclient\n"
        "tops = {name.split('.')[0] for name in sys.modules}\n"
        "print(','.join(sorted(tops & {'config', 'exchanges', 'plugins', 'spark'})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == ""

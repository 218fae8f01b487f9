"""The project's shape: one installed name, ``postroom``; pure packages stay pure."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


PACKAGES = ["broker", "exchanges", "plugins", "config", "spark"]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_is_imported_under_the_one_name_from_its_folder(package: str) -> None:
    module = importlib.import_module(f"postroom.{package}")
    assert module.__file__ is not None
    assert Path(module.__file__).resolve() == ROOT / package / "__init__.py"


def test_the_distribution_installs_one_top_level_package_and_the_twistd_plugin(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("postroom-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"postroom", "twisted"}
    assert {name for name in names if name.startswith("twisted/")} == {"twisted/plugins/postroom_plugin.py"}
    for inside in (
        "postroom/broker/core/vhost.py",
        "postroom/config/postroom.yaml",
        "postroom/broker/server/management/ui/index.html",
        "postroom/spark/job.py",
        "postroom/plugins/delayed_message.py",
    ):
        assert inside in names
    (metadata,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert "postroom = postroom.broker.tools.cli:main" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_an_applications_own_config_and_plugins_packages_shadow_nothing(tmp_path: Path) -> None:
    # The common Django layout: the application's own ``config`` package first on the path.
    for name in ("config", "plugins", "spark", "exchanges", "broker"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the application's own package')\n")
    code = (
        "import importlib, pkgutil, sys, postroom\n"
        "for module in pkgutil.walk_packages(postroom.__path__, 'postroom.'):\n"
        "    importlib.import_module(module.name)\n"
        "from postroom.config.loader import loads\n"
        "loads('', 'postroom.yaml')\n"
        "print(','.join(sorted({name.split('.')[0] for name in sys.modules} & %r)))\n" % set(PACKAGES)
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=environment, check=True
    )
    assert result.stdout.strip() == ""


@pytest.mark.parametrize(
    "module",
    [
        "postroom.broker.amqp.connection",
        "postroom.broker.core.vhost",
        "postroom.broker.core.node",
        "postroom.exchanges.registry",
        "postroom.broker.tools.testing",
    ],
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
    code = (
        "import sys, postroom.broker.clients.client, postroom.broker.clients.txclient\n"
        "print(','.join(sorted({name for name in sys.modules if name.startswith('postroom.') and "
        "not name.startswith('postroom.broker')})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == ""


BENCH_SCRIPTS = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "bench").rglob("*.py"))


def _defined_in(path: Path) -> set[str]:
    """The names a module's own top level binds (read, not imported: some load generators
    import a fuzzing engine the test environment does not have)."""
    import ast

    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
    return names


@pytest.mark.parametrize("script", BENCH_SCRIPTS)
def test_each_benchmark_imports_only_names_the_project_has(script: str) -> None:
    """The load generators are not run by the test command, so a name moved or renamed in the
    project or in ``bench/`` would break them unseen: each ``from bench... import`` and ``from
    postroom... import`` must name something its module has."""
    import ast

    missing = []
    for node in ast.walk(ast.parse((ROOT / script).read_text(), script)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        wanted = [alias.name for alias in node.names]
        if node.module.split(".")[0] == "bench":
            has = _defined_in(ROOT.joinpath(*node.module.split(".")).with_suffix(".py"))
        elif node.module.split(".")[0] == "postroom":
            has = {name for name in wanted if hasattr(importlib.import_module(node.module), name)}
        else:
            continue
        missing += [f"{node.module}.{name}" for name in wanted if name not in has]
    assert missing == []

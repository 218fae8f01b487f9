"""Which master the job runs on: its own ``--master``, else what Spark was configured with
(``spark-submit``'s ``--master``, ``spark-defaults.conf``), ``local[*]`` only when nothing set one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from postroom.spark.job import configured_master  # noqa: E402

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


def test_spark_defaults_conf_names_the_master_when_the_job_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert configured_master() is None  # no file
    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\nspark.executor.memory 1g\nspark.master   spark://h:7077\n"
    )
    assert configured_master() == "spark://h:7077"
    monkeypatch.delenv("SPARK_CONF_DIR")
    assert configured_master() is None


def test_spark_submits_master_is_the_jobs_master(tmp_path: Path) -> None:
    import pyspark

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from postroom.spark.job import build_session, configured_master\n"
        "print('configured', configured_master())\n"
        "session = build_session(None)\n"
        "print('running on', session.sparkContext.master)\n"
        "session.stop()\n"
    )
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    environment = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    environment.pop("SPARK_CONF_DIR", None)
    result = subprocess.run(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false", str(probe)],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "configured local[2]" in result.stdout
    assert "running on local[2]" in result.stdout  # not the job's old default, local[*]

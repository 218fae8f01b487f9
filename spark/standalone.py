"""A Spark standalone cluster on this machine, from the installed pyspark: for trying the job's
cluster path, its tests and its benchmark.

A master and ``workers`` workers are started with pyspark's own ``bin/spark-class``, bound to
loopback, and stopped by pid when the context ends; nothing is downloaded. The
cluster command of docs/dead-letter-analysis.md then runs against the URL it yields::

    with standalone_cluster(Path("cluster")) as master:
        subprocess.run(submit_command(master, archive, ["--segments", ..., "--out", ...]), env=submit_environment())
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark

__all__ = ["JOB", "SPARK_HOME", "standalone_cluster", "submit_command", "submit_environment"]

SPARK_HOME = Path(pyspark.__file__).parent
#: The job's entry point, as the spark-submit command of docs/dead-letter-analysis.md names it.
JOB = Path(__file__).resolve().parent / "dlq_job.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment() -> dict[str, str]:
    """Spark's processes' environment: without this process's ``PYTHONPATH``, which a cluster's
    machines do not have either (the job ships its code itself)."""
    environment = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    environment.pop("PYTHONPATH", None)
    return environment


@contextlib.contextmanager
def standalone_cluster(
    home: Path, workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 120
) -> Iterator[str]:
    """Run a master and ``workers`` workers (``cores`` and ``memory`` each) with their logs and
    work directories under ``home``; yields the master's URL once every worker has registered.

    :raises RuntimeError: a process exited, or the workers were not all alive within ``timeout``
    """
    home.mkdir(parents=True, exist_ok=True)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []
    with open(home / "cluster.log", "ab") as log:
        try:
            processes.append(
                subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(port), "--webui-port", str(ui)],
                    env=_environment(), stdout=log, stderr=log,
                )
            )  # fmt: skip
            for number in range(1, workers + 1):
                processes.append(
                    subprocess.Popen(
                        [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                         "--work-dir", str(home / f"worker-{number}"), url],
                        env=_environment(), stdout=log, stderr=log,
                    )
                )  # fmt: skip
            _wait_for_workers(ui, workers, processes, home / "cluster.log", timeout)
            yield url
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)


def _wait_for_workers(
    ui: int, workers: int, processes: list[subprocess.Popen[bytes]], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as answer:
                if json.loads(answer.read()).get("aliveworkers") == workers:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline or any(process.poll() is not None for process in processes):
            raise RuntimeError(f"the standalone cluster did not start; its log ends:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def submit_command(
    master: str, archive: Path | None, arguments: list[str], conf: dict[str, str] | None = None
) -> list[str]:
    """The cluster command of docs/dead-letter-analysis.md: spark-submit's own ``--master``, the executors' environment
    (``scripts/pack-spark-env``'s archive) shipped with ``--archives`` (``None``: a local master,
    whose Python workers run on the driver's Python), then the job's arguments."""
    settings = {"spark.driver.host": "127.0.0.1", **(conf or {})}
    return [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master", master,
        *(["--archives", f"{archive}#environment"] if archive is not None else []),
        *[part for key, value in settings.items() for part in ("--conf", f"{key}={value}")],
        str(JOB),
        *arguments,
    ]  # fmt: skip


def submit_environment(python: str = "./environment/bin/python") -> dict[str, str]:
    """The environment the command of docs/dead-letter-analysis.md runs in: the driver on this Python, the executors on
    the shipped one, and no ``PYTHONPATH`` (the job ships the project's code itself)."""
    return dict(_environment(), PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON=python)

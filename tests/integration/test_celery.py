"""A real Celery app and embedded worker against an in-process broker."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.interop]


@pytest.fixture
def app(broker: Any) -> Celery:
    app = Celery("postroom_tests", broker=broker.url, backend="rpc://", set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=1,
        broker_connection_timeout=5,
        worker_hijack_root_logger=False,
        task_default_queue="postroom.celery",
        result_expires=60,
        broker_heartbeat=0,
    )

    @app.task(name="tests.add")
    def add(x: int, y: int) -> int:
        return x + y

    return app


def test_worker_runs_task_and_result_comes_back_over_rpc(app: Celery) -> None:
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        result = app.tasks["tests.add"].delay(2, 3)

        assert result.get(timeout=10) == 5
        assert result.state == "SUCCESS"

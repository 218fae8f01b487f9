"""``dlq inspect`` consumes nothing; ``dlq redrive`` moves exactly the chosen dead letters back."""

from __future__ import annotations

from typing import Any

import pytest

from broker.client import Connection, PublishReturned, connect
from broker.dlq import inspect, redrive, summary

pytestmark = pytest.mark.integration


def dead_letters(conn: Connection) -> None:
    """Two queues dead-letter into ``dlq``: 3 rejected from ``work``, 2 expired from ``short``."""
    conn.declare_exchange("dlx", "fanout")
    conn.declare_queue("dlq")
    conn.bind("dlq", "dlx")
    conn.declare_queue("work", arguments={"x-dead-letter-exchange": "dlx", "x-delivery-limit": 5})
    conn.declare_queue("short", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 0})
    for i in range(3):
        conn.publish("", "work", b"job-%d" % i, headers={"n": i})
        message = conn.get("work")
        assert message is not None
        message.nack(requeue=True)  # one failed attempt: x-delivery-count 1
        again = conn.get("work")
        assert again is not None and again.delivery_count == 1
        again.reject()
    for i in range(2):
        conn.publish("", "short", b"late-%d" % i)


def test_inspect_shows_the_deaths_and_consumes_nothing(broker: Any) -> None:
    with connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/") as conn:
        dead_letters(conn)
        seen = [summary(m) for m in inspect(conn, "dlq", limit=10)]
        assert [(s["reason"], s["queue"]) for s in seen] == [("rejected", "work")] * 3 + [("expired", "short")] * 2
        assert conn.declare_queue("dlq") == "dlq"
        again = [m.body for m in inspect(conn, "dlq", limit=10)]
        assert again == [b"job-0", b"job-1", b"job-2", b"late-0", b"late-1"]


def test_redrive_moves_exactly_the_filtered_messages_with_a_fresh_delivery_count(broker: Any) -> None:
    with connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/") as conn:
        dead_letters(conn)
        moved = redrive(conn, "dlq", filters={"reason": "rejected"}, limit=2)
        assert [(m.routing_key, m.reason) for m in moved] == [("work", "rejected")] * 2
        back = [conn.get("work") for _ in range(2)]
        assert [m.body for m in back if m] == [b"job-0", b"job-1"]
        assert [(m.delivery_count, m.x_death[0]["reason"], m.headers["n"]) for m in back if m] == [
            (0, "rejected", 0),
            (0, "rejected", 1),
        ]
        for message in back:
            assert message is not None
            message.ack()
        remaining = [m.body for m in inspect(conn, "dlq", limit=10)]
        assert remaining == [b"job-2", b"late-0", b"late-1"]
        with pytest.raises(PublishReturned):
            redrive(conn, "dlq", to="parking")  # no such queue: the copy comes back, the original stays
        assert [m.body for m in inspect(conn, "dlq", limit=10)] == [b"job-2", b"late-0", b"late-1"]


def test_the_dlq_commands(broker: Any) -> None:
    import json
    import subprocess
    import sys

    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    with connect(url) as conn:
        dead_letters(conn)

    def postroom(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "broker.cli", "dlq", *args, "--url", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    inspected = postroom("inspect", "dlq")
    assert inspected.returncode == 0, inspected.stderr
    assert [json.loads(line)["reason"] for line in inspected.stdout.splitlines()] == ["rejected"] * 3 + ["expired"] * 2
    redriven = postroom("redrive", "dlq", "--filter", "reason=expired", "--to", "retry")
    assert redriven.returncode == 1  # no queue 'retry' yet: refused, nothing lost
    assert "312" in redriven.stderr
    with connect(url) as conn:
        conn.declare_queue("retry")
    redriven = postroom("redrive", "dlq", "--filter", "reason=expired", "--to", "retry")
    assert redriven.returncode == 0, redriven.stderr
    assert redriven.stdout.strip() == "moved 2 message(s) out of 'dlq' (expired: 2)"
    with connect(url) as conn:
        assert [m.body for m in inspect(conn, "retry", limit=10)] == [b"late-0", b"late-1"]
        assert len(list(inspect(conn, "dlq", limit=10))) == 3

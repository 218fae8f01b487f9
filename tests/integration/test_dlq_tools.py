"""``dlq inspect`` consumes nothing; ``dlq redrive`` moves exactly the chosen dead letters back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from postroom.broker.clients.client import ChannelClosed, Connection, PublishReturned, connect
from postroom.broker.core.dead_letter_events import DeadLetterLog
from postroom.broker.core.node import Node
from postroom.broker.core.seal import SEAL_HEADER, Sealer
from postroom.broker.core.users import User
from postroom.broker.tools.redrive import BROKEN_SEAL, MALFORMED, NO_DEATH, UNSEALED, Refused, inspect, redrive, summary
from postroom.broker.tools.testing import free_port
from postroom.config.schema import Permission
from tests.integration.test_crash import broker as serve
from tests.integration.test_live_administration import api

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(make_broker: Any) -> Any:
    """A broker that records and seals its dead letters, as ``postroom serve`` does; guest may
    do anything, ``op`` may write only to ``dlq``, ``retry`` and ``amq.postroom.redrive``."""
    operator = Permission(write=r"^(dlq|retry|amq\.postroom\.redrive)$")
    node = Node(
        users=[
            User("guest", password="guest", loopback_only=True),
            User("op", password="secret", permissions={"/": operator}),
        ]
    )
    node.vhosts["/"].dead_letters = DeadLetterLog(1, lambda: 0.0, Sealer(bytes(range(32))))
    return make_broker(node)


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
        done = redrive(conn, "dlq", filters={"reason": "rejected"}, limit=2)
        assert [(m.routing_key, m.reason) for m in done.moved] == [("work", "rejected")] * 2
        assert done.refused == []
        back = [conn.get("work") for _ in range(2)]
        assert [m.body for m in back if m] == [b"job-0", b"job-1"]
        assert [(m.delivery_count, m.x_death[0]["reason"], m.headers["n"]) for m in back if m] == [
            (0, "rejected", 0),
            (0, "rejected", 1),
        ]
        # The broker took off what the dead-letter queue knew: the copy dies anew if it dies again.
        assert not {"x-delivery-count", "x-postroom-dead-letter-id", SEAL_HEADER} & {*back[0].headers}
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
            [sys.executable, "-m", "postroom.broker.tools.cli", "dlq", *args, "--url", url],
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
        forged = [{"count": 1, "reason": "rejected", "queue": "retry\x1b[2J", "exchange": "", "routing-keys": []}]
        conn.publish("", "dlq", b"forged", headers={"x-death": forged})
    redriven = postroom("redrive", "dlq", "--filter", "reason=rejected")
    assert redriven.returncode == 1
    assert redriven.stdout.strip() == "moved 3 message(s) out of 'dlq' (rejected: 3)"
    assert redriven.stderr.splitlines() == [
        "postroom dlq redrive: left 1 message(s) in 'dlq':",
        "  1: no x-postroom-dead-letter-seal header: dead-lettered by another broker or before seals; give --to",
    ]


def test_redrive_trusts_the_seal_not_x_death(broker: Any) -> None:
    """A client that may publish to the dead-letter queue cannot steer a redrive: a forged
    ``x-death``, a genuine seal on another body, a malformed ``x-death`` and a message that was
    never dead-lettered all stay in the queue, reported; the genuine dead letters move."""
    with connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/") as conn:
        dead_letters(conn)
        conn.declare_queue("payroll")
        genuine = conn.get("dlq")
        assert genuine is not None and SEAL_HEADER in genuine.headers
        conn.recover()
        forged_death = [{"count": 1, "reason": "rejected", "queue": "payroll", "exchange": "", "routing-keys": ["x"]}]
        conn.publish("", "dlq", b"forged", headers={"x-death": forged_death})
        conn.publish("", "dlq", b"forged", headers={"x-death": forged_death, SEAL_HEADER: "00" * 16})
        conn.publish("", "dlq", b"another body", headers=genuine.headers)
        conn.publish("", "dlq", b"malformed", headers={"x-death": ["payroll"]})
        conn.publish("", "dlq", b"plain")

        done = redrive(conn, "dlq")

        moved = [(m.routing_key, m.reason) for m in done.moved]
        assert moved == [("work", "rejected")] * 3 + [("short", "expired")] * 2
        assert done.refused == [
            Refused("payroll", UNSEALED),
            Refused("payroll", BROKEN_SEAL),
            Refused("work", BROKEN_SEAL),
            Refused("", MALFORMED),
            Refused("", NO_DEATH),
        ]
        assert conn.get("payroll") is None
        # The expired ones died again at once (a TTL of 0): the redrive did not go round again.
        assert [m.body for m in inspect(conn, "dlq", limit=10)] == [
            b"forged", b"forged", b"another body", b"malformed", b"plain", b"late-0", b"late-1",
        ]  # fmt: skip
        assert [summary(m)["malformed_x_death"] for m in inspect(conn, "dlq", limit=10)] == [
            False, False, False, True, False, False, False,
        ]  # fmt: skip
        assert broker.node.counters["redrives_refused"] == 2


def test_a_redrive_needs_write_permission_on_the_queue_the_message_died_in(broker: Any) -> None:
    with connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/") as conn:
        dead_letters(conn)
    with connect(f"amqp://op:secret@127.0.0.1:{broker.port}/") as conn:
        with pytest.raises(ChannelClosed, match="403 ACCESS_REFUSED - access to queue 'work' in vhost '/' refused"):
            redrive(conn, "dlq")
    with connect(f"amqp://op:secret@127.0.0.1:{broker.port}/") as conn:
        assert len(list(inspect(conn, "dlq", limit=10))) == 5  # nothing moved, nothing lost
        conn.declare_exchange("retry", "direct")
        conn.declare_queue("retry")
        conn.bind("retry", "retry", "r")
        done = redrive(conn, "dlq", to="retry/r")  # a destination of the operator's own choice
        assert len(done.moved) == 5
        copy = conn.get("retry")
        assert copy is not None and not {"x-postroom-dead-letter-id", SEAL_HEADER} & {*copy.headers}


@pytest.mark.parametrize("seal", ["00", "z\u00e9", b"\xff\xfe"], ids=["hex", "not ASCII", "not UTF-8"])
def test_a_seal_published_without_confirms_closes_the_channel(broker: Any, seal: str | bytes) -> None:
    import pika

    with connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/") as conn:
        conn.declare_queue("dlq")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    try:
        channel = connection.channel()
        headers = {SEAL_HEADER: seal, "x-postroom-dead-letter-id": 1, "x-death": [{"queue": "dlq"}]}
        channel.basic_publish("amq.postroom.redrive", "dlq", b"x", pika.BasicProperties(headers=headers))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("dlq", passive=True)
        assert closed.value.reply_code == 406
        assert "not a dead letter sealed by this broker" in closed.value.reply_text
    finally:
        connection.close()


def test_the_api_lists_the_dead_letter_queues_beside_a_stream(tmp_path: Path) -> None:
    """``GET /api/dead-letters`` lists each queue dead letters reached, with the latest death's
    reasons and sources, in a vhost that also holds a stream (a queue of another kind)."""
    http = free_port()
    with serve(tmp_path / "data", management=http) as (_process, port):
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/") as conn:
            conn.declare_queue("events", durable=True, arguments={"x-queue-type": "stream"})
            conn.publish("", "events", b"kept")
            dead_letters(conn)
        deadline = time.monotonic() + 10
        while True:
            status, listed = api(http, "dead-letters", user="guest:guest")
            if status != 200 or listed and listed[0]["messages"] == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert status == 200, listed
    assert [(queue["vhost"], queue["name"], queue["messages"], queue["dead_lettered_total"]) for queue in listed] == [
        ("/", "dlq", 5, 5)
    ]
    assert (listed[0]["reasons"], listed[0]["sources"]) == ({"rejected": 3, "expired": 2}, {"work": 3, "short": 2})
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

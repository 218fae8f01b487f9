"""Metrics and the management API, over real HTTP on loopback, with pika driving the broker.

A real Prometheus server (the test command installs Debian's ``prometheus``) scrapes the
broker and a PromQL query over its HTTP API must return the queue depth.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
from twisted.internet import threads

from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.server.alarms import ResourceMonitor
from postroom.broker.server.management import RateSampler, management_site
from postroom.broker.server.metrics import BrokerCollector, make_registry, metrics_site
from postroom.broker.tools.cli import main
from postroom.broker.tools.testing import free_port
from postroom.config.schema import Permission
from tests.conftest import Broker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Operated:
    """A broker with its metrics and management listeners."""

    broker: Broker
    metrics_port: int
    management_port: int
    sampler: RateSampler

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def api(self, path: str, method: str = "GET", body: Any = None, user: str = "guest:guest") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.management_port}{path}",
            data=data,
            method=method,
            headers={"Authorization": "Basic " + base64.b64encode(user.encode()).decode()},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


@pytest.fixture
def operated(make_broker: Callable[..., Broker]) -> Iterator[Operated]:
    node = Node(
        users=(
            User("guest", password="guest", loopback_only=True, tags=frozenset({"administrator"})),
            User("ops", password="ops", tags=frozenset({"monitoring"})),
            User("app", password="app", tags=frozenset({"management"}), permissions={"/": APP}),
            User("plain", password="plain"),
        )
    )
    broker = make_broker(node)
    reactor = broker.reactor

    def listen() -> tuple[Any, Any, RateSampler]:
        monitor = ResourceMonitor(node, reactor, 2**62)
        monitor.check()  # one reading, as postroom serve takes every 0.1 s
        sampler = RateSampler(node, reactor, monitor=monitor)
        collector = BrokerCollector(node, monitor=monitor)
        metrics = reactor.listenTCP(0, metrics_site(collector, reactor), interface="127.0.0.1")
        management = reactor.listenTCP(0, management_site(node, sampler, reactor), interface="127.0.0.1")
        return metrics, management, sampler

    metrics, management, sampler = threads.blockingCallFromThread(reactor, listen)
    try:
        yield Operated(broker, metrics.getHost().port, management.getHost().port, sampler)
    finally:
        threads.blockingCallFromThread(reactor, lambda: (metrics.stopListening(), management.stopListening()))


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus's text format (fails when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {name} {labels} in:\n{text}")


#: The management user's permissions: its own 'app.' resources only.
APP = Permission(r"^app\.", r"^app\.", r"^app\.")


def traffic(operated: Operated, pika_connect: Callable[..., Any]) -> Any:
    """Publish 5 to 'work' (1 acked, 1 rejected to 'work.dlq', 3 left), 1 unroutable; keep the connection."""
    connection = pika_connect(port=operated.broker.port)
    channel = connection.channel()
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("work.dlq")
    channel.queue_bind("work.dlq", "dlx")
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx"})
    channel.confirm_delivery()
    for number in range(5):
        channel.basic_publish("", "work", b"job %d" % number, pika.BasicProperties(headers={"n": number}))
    channel.basic_publish("", "nowhere", b"lost")
    first, _, _ = channel.basic_get("work")
    channel.basic_ack(first.delivery_tag)
    second, _, _ = channel.basic_get("work")
    channel.basic_reject(second.delivery_tag, requeue=False)
    return connection


def test_metrics_count_what_clients_did(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    traffic(operated, pika_connect)
    text = operated.metrics()
    assert sample(text, "postroom_queue_messages_ready", vhost="/", queue="work") == 3
    assert sample(text, "postroom_queue_messages_ready", vhost="/", queue="work.dlq") == 1
    assert sample(text, "postroom_queue_messages_unacked", vhost="/", queue="work") == 0
    assert sample(text, "postroom_messages_published_total", vhost="/") == 6
    assert sample(text, "postroom_messages_unroutable_total", vhost="/") == 1
    assert sample(text, "postroom_messages_delivered_total", vhost="/", queue="work") == 2
    assert sample(text, "postroom_messages_acked_total", vhost="/", queue="work") == 1
    assert sample(text, "postroom_messages_dead_lettered_total", vhost="/", queue="work", reason="rejected") == 1
    assert sample(text, "postroom_messages_dead_lettered_total", vhost="/", queue="work", reason="expired") == 0
    assert sample(text, "postroom_connections") == 1
    assert sample(text, "postroom_channels") == 1


def test_every_metric_the_dashboard_uses_is_exported(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    dashboard = json.loads((ROOT / "config" / "grafana" / "postroom-overview.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for e in expressions for name in re.findall(r"postroom_\w+", e)}
    traffic(operated, pika_connect)
    exported = set(re.findall(r"^# TYPE (postroom_\w+) ", operated.metrics(), re.M))
    # The log's series exist only with a log: test_twistd checks them on a broker with a data directory.
    wal_series = {"postroom_wal_bytes", "postroom_wal_segments", "postroom_wal_alarm", "postroom_wal_fsync_seconds"}
    assert used - exported - wal_series == set()
    assert wal_series <= used


#: Every metric name RabbitMQ's Overview dashboard (Grafana ID 10991) reads.
RABBITMQ_OVERVIEW_METRICS = """
rabbitmq_identity_info rabbitmq_build_info rabbitmq_queue_messages_ready rabbitmq_queue_messages_unacked
rabbitmq_channels rabbitmq_channel_consumers rabbitmq_connections rabbitmq_queues
rabbitmq_resident_memory_limit_bytes rabbitmq_process_resident_memory_bytes rabbitmq_disk_space_available_bytes
rabbitmq_process_max_fds rabbitmq_process_open_fds rabbitmq_process_max_tcp_sockets rabbitmq_process_open_tcp_sockets
rabbitmq_channel_messages_unconfirmed rabbitmq_channel_messages_published_total
rabbitmq_channel_messages_confirmed_total
rabbitmq_queue_messages_published_total rabbitmq_channel_messages_unroutable_dropped_total
rabbitmq_channel_messages_unroutable_returned_total rabbitmq_channel_messages_delivered_total
rabbitmq_channel_messages_delivered_ack_total rabbitmq_channel_messages_redelivered_total
rabbitmq_channel_messages_acked_total rabbitmq_channel_get_total rabbitmq_channel_get_ack_total
rabbitmq_channel_get_empty_total rabbitmq_queues_declared_total rabbitmq_queues_created_total
rabbitmq_queues_deleted_total rabbitmq_channels_opened_total rabbitmq_channels_closed_total
rabbitmq_connections_opened_total rabbitmq_connections_closed_total
""".split()


def test_rabbitmq_compatible_names_cover_the_rabbitmq_dashboard(
    operated: Operated, pika_connect: Callable[..., Any]
) -> None:
    from prometheus_client.exposition import generate_latest

    traffic(operated, pika_connect)
    node = operated.broker.node
    plain = operated.broker.call(lambda: generate_latest(make_registry(BrokerCollector(node))).decode())
    assert "rabbitmq_" not in plain
    registry = make_registry(BrokerCollector(node, rabbitmq_compatible=True, monitor=operated.sampler.monitor))
    text = operated.broker.call(lambda: generate_latest(registry).decode())
    assert len(RABBITMQ_OVERVIEW_METRICS) == 35
    assert {name for name in RABBITMQ_OVERVIEW_METRICS if f"\n{name}" not in text} == set()
    assert sample(text, "rabbitmq_queue_messages_ready") == 4
    assert sample(text, "rabbitmq_channel_messages_published_total") == 6
    assert sample(text, "rabbitmq_channel_messages_confirmed_total") == 6
    assert sample(text, "rabbitmq_channel_messages_unroutable_dropped_total") == 1
    assert sample(text, "rabbitmq_channel_get_ack_total") == 2
    assert sample(text, "rabbitmq_connections_opened_total") == 1
    assert sample(text, "rabbitmq_channels_opened_total") == 1
    assert sample(text, "rabbitmq_identity_info", rabbitmq_node="postroom@localhost") == 1


def test_management_paths_are_decoded_once_and_bad_ones_refused(
    operated: Operated, pika_connect: Callable[..., Any]
) -> None:
    channel = pika_connect(port=operated.broker.port).channel()
    channel.queue_declare("%41")
    channel.queue_declare("A")
    status, queue = operated.api("/api/queues/%2F/%2541")  # the queue named "%41", not "A"
    assert (status, queue["name"]) == (200, "%41")
    for path in ("/api/queues/%2F/%ff", "/api/queues/%2F/A/..", "/api/queues/%2F/A/../.."):
        status, body = operated.api(path)
        assert status == 400, (path, status, body)
        assert "Traceback" not in json.dumps(body)


def test_postroom_queues_escapes_control_characters_in_names(
    operated: Operated, pika_connect: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # A client may name a queue with terminal escape sequences; the operator's table shows them escaped.
    pika_connect(port=operated.broker.port).channel().queue_declare("jobs\x1b]0;pwned\x07\x1b[2J")
    url = f"http://guest:guest@127.0.0.1:{operated.management_port}"
    assert main(["queues", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "jobs\\x1b]0;pwned\\x07\\x1b[2J" in out
    assert "\x1b" not in out and "\x07" not in out


def test_the_log_escapes_what_a_client_sent(operated: Operated) -> None:
    # A user name with a line break and an escape sequence cannot forge a log line or clear a terminal.
    from twisted.logger import formatEvent, globalLogPublisher

    logged: list[str] = []
    observer = lambda event: logged.append(formatEvent(event))  # noqa: E731
    globalLogPublisher.addObserver(observer)
    try:
        credentials = pika.PlainCredentials("mallory\n2026-11-25 broker started\x1b[2J", "x")
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", operated.broker.port, credentials=credentials)
            )
    finally:
        globalLogPublisher.removeObserver(observer)
    refusals = [line for line in logged if "mallory" in line]
    assert refusals and all("mallory\\n2026-11-25 broker started\\x1b[2J" in line for line in refusals), refusals
    assert not [line for line in refusals if "\n" in line or "\x1b" in line]


def test_the_node_shows_its_alarms_to_monitoring_users(operated: Operated) -> None:
    node = operated.broker.node
    operated.broker.call(lambda: node.set_alarm("disk", True))
    status, nodes = operated.api("/api/nodes", user="ops:ops")
    assert status == 200 and [(n["name"], n["mem_alarm"], n["disk_free_alarm"]) for n in nodes] == [
        ("postroom@localhost", False, True)
    ]
    assert operated.api("/api/nodes/postroom@localhost")[1]["disk_free_alarm"] is True
    refused = (401, {"error": "not_authorised", "reason": "Not monitor user"})
    assert operated.api("/api/nodes", user="app:app") == refused
    operated.broker.call(lambda: node.set_alarm("disk", False))
    assert operated.api("/api/nodes")[1][0]["disk_free_alarm"] is False


def test_management_api_lists_queues_with_counts(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    traffic(operated, pika_connect)
    status, queues = operated.api("/api/queues")
    assert status == 200
    work = next(queue for queue in queues if queue["name"] == "work")
    assert (work["messages_ready"], work["messages_unacknowledged"], work["consumers"]) == (3, 0, 0)
    assert work["message_stats"]["publish"] == 5
    assert work["dead_lettered"]["rejected"] == 1
    status, one = operated.api("/api/queues/%2F/work.dlq")
    assert (status, one["messages_ready"]) == (200, 1)
    status, overview = operated.api("/api/overview")
    assert overview["queue_totals"]["messages_ready"] == 4
    assert overview["object_totals"]["connections"] == 1
    status, bindings = operated.api("/api/bindings/%2F")
    assert {"source": "dlx", "destination": "work.dlq"} in [
        {"source": b["source"], "destination": b["destination"]} for b in bindings
    ]


def test_rates_come_from_counter_samples(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    sampler = operated.sampler
    operated.broker.call(sampler.sample)
    traffic(operated, pika_connect)
    # The sampler reads the reactor's clock; make the interval exactly what it measured.
    before = sampler._last_at
    operated.broker.call(sampler.sample)
    elapsed = sampler._last_at - before
    _, work = operated.api("/api/queues/%2F/work")
    assert work["message_stats"]["publish_details"]["rate"] == pytest.approx(5 / elapsed)


PEEK = {"ackmode": "peek", "encoding": "auto"}


def test_peek_shows_messages_without_consuming_them(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    traffic(operated, pika_connect)
    status, messages = operated.api("/api/queues/%2F/work/get", "POST", {"count": 2, **PEEK})
    assert status == 200
    assert [(m["payload"], m["redelivered"], m["message_count"]) for m in messages] == [
        ("job 2", False, 2),
        ("job 3", False, 1),
    ]
    assert messages[0]["properties"]["headers"] == {"n": 2}
    _, work = operated.api("/api/queues/%2F/work")
    assert work["messages_ready"] == 3
    status, error = operated.api("/api/queues/%2F/work/get", "POST", {"count": "two", **PEEK})
    assert status == 400 and "count" in error["reason"]


def test_get_takes_messages_and_puts_back_acks_or_rejects_them_by_ackmode(
    operated: Operated, pika_connect: Callable[..., Any]
) -> None:
    traffic(operated, pika_connect)  # 'work' holds "job 2", "job 3", "job 4"

    def get(count: int, ackmode: str) -> list[tuple[str, bool]]:
        body = {"count": count, "ackmode": ackmode, "encoding": "auto"}
        status, messages = operated.api("/api/queues/%2F/work/get", "POST", body)
        assert status == 200
        return [(m["payload"], m["redelivered"]) for m in messages]

    def ready() -> int:
        return operated.api("/api/queues/%2F/work")[1]["messages_ready"]

    assert get(2, "ack_requeue_true") == [("job 2", False), ("job 3", False)]
    assert ready() == 3
    assert get(1, "reject_requeue_true") == [("job 2", True)]
    assert get(1, "ack_requeue_false") == [("job 2", True)]
    assert ready() == 2
    assert get(5, "reject_requeue_false") == [("job 3", True), ("job 4", False)]
    assert ready() == 0


def test_a_peek_answer_is_bounded(
    operated: Operated, pika_connect: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import postroom.broker.server.management.objects

    traffic(operated, pika_connect)  # 'work' holds "job 2", "job 3", "job 4"
    _, cut = operated.api("/api/queues/%2F/work/get", "POST", {"count": 3, "truncate": 3, **PEEK})
    assert [(m["payload"], m["payload_bytes"]) for m in cut] == [("job", 5), ("job", 5), ("job", 5)]
    monkeypatch.setattr(
        postroom.broker.server.management.objects, "MAX_PEEK_BYTES", 7
    )  # one answer's room, whatever is asked
    _, bounded = operated.api("/api/queues/%2F/work/get", "POST", {"count": 3, **PEEK})
    assert [(m["payload"], m["payload_bytes"]) for m in bounded] == [("job 2", 5), ("jo", 5), ("", 5)]


def test_purge_and_close_connection(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    connection = traffic(operated, pika_connect)
    status, _ = operated.api("/api/queues/%2F/work/contents", "DELETE")
    assert status == 204
    _, work = operated.api("/api/queues/%2F/work")
    assert work["messages_ready"] == 0
    _, connections = operated.api("/api/connections")
    assert len(connections) == 1
    status, _ = operated.api("/api/connections/" + urllib.parse.quote(connections[0]["name"], safe=""), "DELETE")
    assert status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        connection.process_data_events(time_limit=2)
    assert excinfo.value.reply_code == 320


def test_management_api_refuses_bad_credentials_and_unknown_objects(operated: Operated) -> None:
    assert operated.api("/api/queues", user="guest:wrong")[0] == 401
    assert operated.api("/api/queues", user="")[0] == 401
    assert operated.api("/api/queues/%2F/missing")[0] == 404
    assert operated.api("/api/queues/nohost")[0] == 404
    assert operated.api("/api/nothing")[0] == 404
    assert operated.api("/api/queues", method="PUT", body={})[0] == 405
    assert operated.api("/api/overview", user="ops:ops")[0] == 200


def test_management_api_bodies_that_are_not_json_objects_get_400_not_json(operated: Operated) -> None:
    def put(raw: bytes, path: str = "/api/policies/%2F/p") -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{operated.management_port}{path}",
            data=raw,
            method="PUT" if path.startswith("/api/policies") else "POST",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    refused = (400, {"error": "bad_request", "reason": "not_json"})
    assert put(b"[" * 200_000) == refused  # deeper than Python's parser goes
    assert put(b'{"pattern": ".", "definition": {"max-length": 1}, "priority": NaN}') == refused
    assert put(b"\xff\xfe{") == refused
    assert put(b"[1, 2]") == refused
    vhost = operated.broker.node.vhosts["/"]
    operated.broker.call(lambda: vhost.declare_queue("peeked", None))
    assert put(b"[" * 200_000, "/api/queues/%2F/peeked/get") == refused
    assert put(b'{"pattern": ".", "definition": {"max-length": 1}, "priority": 1e400}')[0] == 400  # infinite
    assert vhost.policies == {}


def test_management_api_follows_user_tags_and_permissions(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    traffic(operated, pika_connect)  # guest's connection, queues 'work' and 'work.dlq'
    connection = pika_connect(port=operated.broker.port)
    connection.channel().queue_declare("mine", exclusive=True)
    # No management tag: no API at all (RabbitMQ's rule).
    assert operated.api("/api/overview", user="plain:plain") == (
        401,
        {"error": "not_authorised", "reason": "Not management user"},
    )
    # management: its own connections only, and only queues it may read.
    status, connections = operated.api("/api/connections", user="app:app")
    assert (status, connections) == (200, [])
    status, body = operated.api("/api/queues/%2F/work/contents", "DELETE", user="app:app")
    assert (status, body["reason"]) == (
        401,
        "ACCESS_REFUSED - access to queue 'work' in vhost '/' refused for user 'app'",
    )
    assert operated.api("/api/queues/%2F/work/get", "POST", {"count": 1}, user="app:app")[0] == 401
    # monitoring: sees every connection, closes none but its own.
    status, connections = operated.api("/api/connections", user="ops:ops")
    assert status == 200 and len(connections) == 2
    name = connections[0]["name"]
    assert operated.api(f"/api/connections/{name}", "DELETE", user="ops:ops")[0] == 401
    # Nobody reads another connection's exclusive queue through the API.
    status, body = operated.api("/api/queues/%2F/mine/get", "POST", {"count": 1})
    assert status == 400 and "RESOURCE_LOCKED" in body["reason"]
    assert operated.api("/api/queues/%2F/work/contents", "DELETE")[0] == 204


def test_postroom_queues_prints_a_table(operated: Operated, pika_connect: Callable[..., Any]) -> None:
    traffic(operated, pika_connect)
    url = f"http://guest:guest@127.0.0.1:{operated.management_port}/"
    result = subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", "queues", "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "vhost",
        "name",
        "ready",
        "unacked",
        "consumers",
        "active",
        "publish/s",
        "deliver/s",
        "dead-lettered",
        "policy",
    ]
    work = next(line.split() for line in lines if line.split()[1] == "work")
    assert work[2:6] == ["3", "0", "0", "-"] and work[8:] == ["1", "-"]
    refused = subprocess.run(
        [sys.executable, "-m", "postroom.broker.tools.cli", "queues", "--url", url.replace("guest:guest", "guest:no")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 1 and "401" in refused.stderr


def test_prometheus_scrapes_the_queue_depth(
    operated: Operated, pika_connect: Callable[..., Any], tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("no prometheus binary (the test command installs Debian's prometheus where it can)")
    traffic(operated, pika_connect)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: postroom\n    static_configs: [{{targets: ['127.0.0.1:{operated.metrics_port}']}}]\n"
    )
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    query = urllib.parse.urlencode({"query": 'postroom_queue_messages_ready{queue="work"}'})
    try:
        deadline = time.monotonic() + 60
        result: list[Any] = []
        while not result:
            assert time.monotonic() < deadline, "Prometheus returned no sample within 60 s"
            assert process.poll() is None, process.stderr.read().decode()[-2000:] if process.stderr else ""
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=5) as response:
                    result = json.loads(response.read())["data"]["result"]
            except (OSError, KeyError):
                continue
        assert float(result[0]["value"][1]) == 3
        assert result[0]["metric"]["vhost"] == "/"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def test_postroom_policies_lists_them_and_postroom_queues_shows_which_applies(
    operated: Operated, pika_connect: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from postroom.broker.core.policy import Policy

    vhost = operated.broker.node.vhosts["/"]
    operated.broker.call(lambda: vhost.set_policy(Policy("DLX", "^work", {"dead-letter-exchange": "dlx"}, 1, "queues")))
    operated.broker.call(lambda: vhost.set_policy(Policy("caps", ".*", {"max-length": 9}), True))
    pika_connect(port=operated.broker.port).channel().queue_declare("work.policed")
    url = f"http://guest:guest@127.0.0.1:{operated.management_port}"
    assert main(["policies", "--url", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["vhost", "name", "pattern", "apply-to", "priority", "definition"]
    assert lines[1].split() == ["/", "DLX", "^work", "queues", "1", '{"dead-letter-exchange":', '"dlx"}']
    assert main(["policies", "--url", url, "--operator", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["definition"] == {"max-length": 9}
    assert main(["queues", "--url", url]) == 0
    policed = next(line.split() for line in capsys.readouterr().out.splitlines() if "work.policed" in line)
    assert policed[-1] == "DLX+caps"


def test_postroom_definitions_export_writes_what_postroom_and_rabbitmq_import_whole(
    operated: Operated, pika_connect: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from postroom.broker.core.policy import Policy
    from postroom.config.loader import load

    vhost = operated.broker.node.vhosts["/"]
    dlx = Policy("DLX", r"^work\.", {"dead-letter-exchange": "dlx", "message-ttl": 60000}, 1, "queues")
    operated.broker.call(lambda: vhost.set_policy(dlx))
    operated.broker.call(lambda: vhost.set_policy(Policy("caps", ".*", {"max-length": 9}), True))
    channel = pika_connect(port=operated.broker.port).channel()
    channel.exchange_declare("dlx", "fanout", durable=True)
    channel.queue_declare("work.orders", durable=True, arguments={"x-max-priority": 5})
    channel.queue_bind("work.orders", "dlx")
    url = f"http://guest:guest@127.0.0.1:{operated.management_port}"
    path = tmp_path / "definitions.json"
    assert main(["definitions", "export", str(path), "--url", url]) == 0
    config = load(path)
    assert config.notes == ()  # nothing in it that Postroom does not apply
    definitions = config.vhosts["/"]
    assert [(p.name, p.pattern, dict(p.definition), p.priority, p.apply_to) for p in definitions.policies] == [
        ("DLX", r"^work\.", {"dead-letter-exchange": "dlx", "message-ttl": 60000}, 1, "queues")
    ]
    assert [(p.name, dict(p.definition)) for p in definitions.operator_policies] == [("caps", {"max-length": 9})]
    assert [(q.name, q.max_priority) for q in definitions.queues] == [("work.orders", 5)]
    assert [(b.exchange, b.queue) for b in definitions.bindings] == [("dlx", "work.orders")]
    assert main(["definitions", "export", "--vhost", "/", "--url", url]) == 0
    assert [q["name"] for q in json.loads(capsys.readouterr().out)["queues"]] == ["work.orders"]
    assert main(["definitions", "export", "--vhost", "nowhere", "--url", url]) == 1
    assert "HTTP 400: vhost_not_found" in capsys.readouterr().err


def test_management_and_postroom_queues_show_the_single_active_consumer(
    operated: Operated, pika_connect: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    first = pika_connect(port=operated.broker.port).channel()
    first.queue_declare("ordered", arguments={"x-single-active-consumer": True})
    first.basic_consume("ordered", lambda *_: None, consumer_tag="first")
    second = pika_connect(port=operated.broker.port).channel()
    second.basic_consume("ordered", lambda *_: None, consumer_tag="second", arguments={"x-priority": 5})
    status, queue = operated.api("/api/queues/%2F/ordered")
    assert status == 200
    assert (queue["consumers"], queue["single_active_consumer_tag"]) == (2, "first")
    details = {c["consumer_tag"]: (c["active"], c["activity_status"]) for c in queue["consumer_details"]}
    assert details == {"first": (True, "single_active"), "second": (False, "waiting")}
    listed = operated.api("/api/consumers/%2F")[1]
    assert {(c["consumer_tag"], c["arguments"].get("x-priority")) for c in listed} == {("first", None), ("second", 5)}
    url = f"http://guest:guest@127.0.0.1:{operated.management_port}"
    assert main(["queues", "--url", url]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if " ordered " in f" {line} ")
    assert row[4:6] == ["2", "first"]
    first.close()
    deadline = time.monotonic() + 5
    while operated.api("/api/queues/%2F/ordered")[1]["single_active_consumer_tag"] != "second":
        assert time.monotonic() < deadline, "the waiting consumer did not become active"
        time.sleep(0.02)

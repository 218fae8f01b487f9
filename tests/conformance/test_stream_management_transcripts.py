"""The stream protocol as operators see it, against RabbitMQ 3.10.8 with ``rabbitmq_stream``,
``rabbitmq_stream_management`` and ``rabbitmq_prometheus``: the same clients on each broker,
then the same questions.

- ``/api/stream/connections``, ``/api/stream/publishers`` and ``/api/stream/consumers`` (all,
  by vhost, by stream, by connection), and the stream connections in ``/api/connections``: the
  same fields, and the same values where they do not name the broker or the client's port.
- ``DELETE /api/stream/connections/VHOST/NAME`` closes the client's socket on both.
- The errors a session of refused commands causes are counted alike in
  ``rabbitmq_global_stream_error_*_total``, and the messages in
  ``rabbitmq_global_messages_*_total{protocol="stream"}``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType, Producer
from transcript import api_fields, field_paths, oracle

from postroom.broker.tools.testing import free_port, wait_for_port
from postroom.broker.wire import streamframes as wire
from tests.conformance.test_stream_protocol_transcripts import Peer, handshake, s
from tests.integration.test_crash import broker

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

STREAM = "mg-events"

#: What names a broker or a client's port, not compared: the node, the connection's name (a
#: difference: Postroom names a connection by its peer), the ports, the time it connected.
#: ``active`` is RabbitMQ 3.11's field of a consumer (with its groups), which 3.10 has not.
VOLATILE = {
    "node", "name", "peer_port", "port", "connected_at", "host", "active",
    # (bytes, and socket reads and writes: the brokers' frames differ in size and number)
    "recv_cnt", "recv_oct", "send_cnt", "send_oct", "send_pend",
}  # fmt: skip
#: RabbitMQ's fields Postroom does not show: the Erlang process's statistics and rates.
NOT_SHOWN = {"garbage_collection", "reductions", "channels"}


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, int, int]]]:
    """``{"rabbitmq": ..., "postroom": ...}``: each broker's (stream port, management port,
    metrics port)."""
    rabbit = (free_port(), free_port(), free_port())
    config = (
        f"stream.listeners.tcp.1 = 127.0.0.1:{rabbit[0]}\nstream.advertised_host = 127.0.0.1\n"
        f"management.tcp.port = {rabbit[1]}\nmanagement.tcp.ip = 127.0.0.1\n"
        f"prometheus.tcp.port = {rabbit[2]}\nprometheus.tcp.ip = 127.0.0.1\n"
        "collect_statistics_interval = 500\n"
    )
    ours = (free_port(), free_port(), free_port())
    directory = tmp_path_factory.mktemp("stream-management")
    plugins = ["rabbitmq_stream", "rabbitmq_stream_management", "rabbitmq_prometheus"]
    with (
        oracle(config, plugins, also=list(rabbit)),
        broker(
            directory / "data",
            stream=ours[0],
            management=ours[1],
            metrics=ours[2],
            extra="metrics: {rabbitmq_compatible: true}\n",
        ),
    ):
        wait_for_port(ours[0], 30)
        yield {"rabbitmq": rabbit, "postroom": ours}
    assert "Traceback" not in (directory / "broker.log").read_text()


def api(port: int, path: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api{path}",
        method=method,
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as error:
        return error.code, None


async def users(port: int, http: int, stream: str = STREAM) -> tuple[Producer, Consumer, dict[str, Any]]:
    """A producer that sent 5 messages with confirms and a consumer that read them, both kept
    open; and what the API shows of them."""
    producer = Producer("127.0.0.1", port=port, username="guest", password="guest", connection_name="mg-producer")
    await producer.start()
    await producer.create_stream(stream, exists_ok=True)
    for number in range(5):
        await producer.send_wait(stream, AMQPMessage(body=b"e%d" % number))
    consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest", connection_name="mg-consumer")
    await consumer.start()
    got: list[int] = []

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append(context.offset)

    await consumer.subscribe(
        stream, on, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None), properties={"k": "v"}
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # (RabbitMQ's statistics take a few seconds to come in)
        await asyncio.sleep(0.3)
        status, consumers = api(http, "/stream/consumers")
        connections = api(http, "/stream/connections")[1] or []
        names = {connection["user_provided_name"] for connection in connections}
        if len(got) == 5 and consumers and consumers[0]["consumed"] == 5 and {"mg-producer", "mg-consumer"} <= names:
            break
    await asyncio.sleep(1)
    views: dict[str, Any] = {}
    for path in (
        "/stream/connections",
        "/stream/connections/%2F",
        "/stream/publishers",
        "/stream/publishers/%2F",
        f"/stream/publishers/%2F/{stream}",
        "/stream/publishers/%2F/elsewhere",
        "/stream/consumers",
        "/stream/consumers/%2F",
        "/stream/connections/%2F/nobody",
        "/stream/connections/nowhere",
    ):
        views[path] = api(http, path)
    status, everything = api(http, "/connections")
    views["/connections"] = status, [view for view in everything or [] if view.get("protocol") == "stream"]
    for connection in views["/stream/connections"][1]:
        named = urllib.parse.quote(connection["name"], safe="")
        role = connection["user_provided_name"]
        views[f"{role}: itself"] = api(http, f"/stream/connections/%2F/{named}")
        views[f"{role}: publishers"] = api(http, f"/stream/connections/%2F/{named}/publishers")
        views[f"{role}: consumers"] = api(http, f"/stream/connections/%2F/{named}/consumers")
    return producer, consumer, views


async def management_session(port: int, http: int) -> dict[str, Any]:
    producer, consumer, views = await users(port, http)
    try:
        named = next(c["name"] for c in views["/stream/connections"][1] if c["user_provided_name"] == "mg-consumer")
        views["close the consumer's"] = api(
            http, f"/stream/connections/%2F/{urllib.parse.quote(named, safe='')}", "DELETE"
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            remaining = api(http, "/stream/connections")[1]
            if "mg-consumer" not in [c["user_provided_name"] for c in remaining]:
                break
        views["after the close"] = [c["user_provided_name"] for c in api(http, "/stream/connections")[1]]
    finally:
        await producer.close()
        try:
            await consumer.close()
        except Exception:  # noqa: BLE001 (the broker closed its socket: that is the point)
            pass
    return views


def test_stream_connections_publishers_and_consumers_are_shown_as_by_rabbitmq(
    brokers: dict[str, tuple[int, int, int]],
) -> None:
    answers = {name: asyncio.run(management_session(port, http)) for name, (port, http, _) in brokers.items()}
    for view, theirs in answers["rabbitmq"].items():
        missing = {
            key
            for key in field_paths(theirs) - field_paths(answers["postroom"][view])
            if key.split(".")[0] not in NOT_SHOWN and not key.split(".")[0].endswith("_details")
        }
        assert {key.rpartition(".")[2] for key in missing} <= VOLATILE, (view, missing)
    seen = {name: api_fields(views, VOLATILE | NOT_SHOWN, sort_lists=True) for name, views in answers.items()}
    assert seen["postroom"] == seen["rabbitmq"]
    publishers = seen["postroom"]["/stream/publishers"][1]
    assert [(p["published"], p["confirmed"], p["errored"]) for p in publishers] == [(5, 5, 0)]
    consumers = seen["postroom"]["/stream/consumers"][1]
    assert [(c["consumed"], c["offset"], c["offset_lag"], c["properties"]) for c in consumers] == [
        (5, 4, 0, {"k": "v"})
    ]
    assert seen["postroom"]["after the close"] == ["locator-mg-consumer", "mg-producer"]  # (rstream's two)


def scrape(port: int) -> dict[str, float]:
    """The stream protocol's samples of ``rabbitmq_global_*``: ``name{labels}`` and value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r'(rabbitmq_global_[a-z_]+)\{[^}]*protocol="stream"[^}]*\} (\S+)$', line)
        if match:
            found[match[1]] = float(match[2])
    return found


def refusals(peer: Peer) -> None:
    """One command refused with each code a client can cause once open, and a bad login."""
    handshake(peer)
    for key, body in [
        (wire.CREATE_STREAM, s(STREAM + "-x") + wire.string_map({})),
        (wire.CREATE_STREAM, s(STREAM + "-x") + wire.string_map({})),  # 5
        (wire.CREATE_STREAM, s("amq.x") + wire.string_map({})),  # 17
        (wire.DELETE_STREAM, s("missing")),  # 2
        (wire.DECLARE_PUBLISHER, b"\x01" + s("") + s("missing")),  # 2
        (wire.DELETE_PUBLISHER, b"\x07"),  # 18
        (wire.SUBSCRIBE, b"\x01" + s("missing") + struct.pack(">hH", wire.OFFSET_FIRST, 1)),  # 2
        (wire.UNSUBSCRIBE, b"\x09"),  # 4
        (wire.QUERY_OFFSET, s("ref") + s(STREAM + "-x")),  # 19: not an error
        (wire.QUERY_PUBLISHER_SEQUENCE, s("ref") + s("missing")),  # 2
    ]:
        peer.send(key, body)
        peer.read()
    peer.write(wire.frame(wire.PUBLISH, b"\x05" + struct.pack(">IQI", 1, 1, 1) + b"x"))  # 18
    peer.read()
    peer.send(wire.SUBSCRIBE, b"\x02" + s(STREAM + "-x") + struct.pack(">hH", wire.OFFSET_FIRST, 1))
    peer.read()
    peer.send(wire.SUBSCRIBE, b"\x02" + s(STREAM + "-x") + struct.pack(">hH", wire.OFFSET_FIRST, 1))  # 3
    peer.read()
    peer.send(wire.DELETE_STREAM, s(STREAM + "-x"))
    peer.read()
    peer.send(wire.CLOSE, struct.pack(">H", 1) + s("done"))
    peer.read()


def test_refusals_and_messages_are_counted_as_by_rabbitmq(brokers: dict[str, tuple[int, int, int]]) -> None:
    counted = {}
    for name, (port, _http, metrics) in brokers.items():
        before = scrape(metrics)
        peer = Peer(port)
        try:
            refusals(peer)
        finally:
            peer.close()
        wrong = Peer(port)
        try:
            handshake(wrong, password="wrong")  # 8
        finally:
            wrong.close()
        time.sleep(1.5)
        after = scrape(metrics)
        counted[name] = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
        counted[name + " families"] = sorted(after)
    assert counted["postroom"] == counted["rabbitmq"]
    assert counted["postroom families"] == counted["rabbitmq families"]
    assert counted["postroom"]["rabbitmq_global_stream_error_stream_does_not_exist_total"] == 4


def test_the_counters_move_with_published_messages(brokers: dict[str, tuple[int, int, int]], tmp_path: Path) -> None:
    """(The messages counted in ``/api/stream/publishers`` above also move the global counters.)"""
    counted = {}
    for name, (port, _http, metrics) in brokers.items():
        before = scrape(metrics)

        async def publish(port: int = port) -> None:
            async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
                await producer.create_stream(STREAM + "-c", exists_ok=True)
                for number in range(7):
                    await producer.send_wait(STREAM + "-c", AMQPMessage(body=b"c%d" % number))
                await producer.delete_stream(STREAM + "-c")

        asyncio.run(publish())
        time.sleep(1.5)
        after = scrape(metrics)
        counted[name] = {key: after[key] - before.get(key, 0) for key in after if "messages" in key}
    assert counted["postroom"] == counted["rabbitmq"]
    assert counted["postroom"]["rabbitmq_global_messages_confirmed_total"] == 7


def test_postroom_streams_lists_the_stream_protocols_publishers_and_consumers(
    brokers: dict[str, tuple[int, int, int]],
) -> None:
    port, http, _metrics = brokers["postroom"]

    async def listed() -> tuple[str, str]:
        producer, consumer, _views = await users(port, http, "mg-cli")
        try:
            command = [
                sys.executable,
                "-m",
                "postroom.broker.tools.cli",
                "streams",
                "--url",
                f"http://guest:guest@127.0.0.1:{http}/",
            ]
            outputs = []
            for extra in ([], ["--json"]):
                done = await asyncio.to_thread(
                    subprocess.run, command + extra, capture_output=True, text=True, timeout=60
                )
                assert done.returncode == 0, done.stderr
                outputs.append(done.stdout)
            return outputs[0], outputs[1]
        finally:
            await producer.close()
            await consumer.close()

    text, lines = asyncio.run(listed())
    (stream,) = [each for each in map(json.loads, lines.splitlines()) if each["name"] == "mg-cli"]
    assert [(p["published"], p["confirmed"]) for p in stream["stream_publishers"]] == [(5, 5)]
    assert [(c["offset_lag"], c["credits"], c["active"]) for c in stream["stream_consumers"]] == [(0, 10, True)]
    table = text.splitlines()
    rows = [line.split() for line in table if "127.0.0.1:" in line]  # (the stream protocol's users)
    publisher = next(row for row in rows if len(row) == 8)
    assert publisher[3:] == ["0", "-", "5", "5", "0"]
    consumer = next(row for row in rows if len(row) == 9)
    assert consumer[1] == "mg-cli" and consumer[3:] == ["0", "4", "0", "5", "10", "yes"]

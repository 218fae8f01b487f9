"""MQTT over WebSockets from a real browser: MQTT.js (``mqtt`` 5.16.0 from the npm registry, its
browser bundle served by the test) in headless Chromium, against ``postroom serve`` with
``listen.mqtt_ws``. The page subscribes at QoS 1, publishes at QoS 2 with RETAIN, and sets a
will; a paho client over TCP is on the other side of each."""

from __future__ import annotations

import http.server
import queue
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from postroom.broker.tools.testing import NpmUnavailable, free_port, npm
from tests.integration.test_crash import broker
from tests.integration.test_web_ui import browser, until

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]

__all__ = ["browser"]  # (the fixture, from the web UI's tests)

CLIENT = "mqtt@5.16.0"

PAGE = """<!doctype html><html><body><pre id="log"></pre>
<script src="mqtt.min.js"></script>
<script>
window.received = [];
window.state = "connecting";
const client = mqtt.connect("ws://127.0.0.1:%(port)d/ws", {
  protocolVersion: 4, clientId: "browser-1", clean: true, keepalive: 30, reconnectPeriod: 0,
  will: {topic: "status/browser-1", payload: "gone", qos: 1, retain: false},
});
client.on("connect", () => {
  client.subscribe("ticker/#", {qos: 1}, (error, granted) => {
    window.granted = granted.map((g) => g.qos);
    client.publish("browser/hello", "from chromium", {qos: 2, retain: true}, () => { window.state = "published"; });
  });
});
client.on("message", (topic, payload, packet) => {
  window.received.push([topic, new TextDecoder().decode(payload), packet.qos]);
});
client.on("error", (error) => { window.state = "error: " + error.message; });
</script></body></html>"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MQTT.js's browser bundle (``dist/mqtt.min.js``)."""
    where = tmp_path_factory.mktemp("mqttjs")
    try:
        npm(["install", "--ignore-scripts", "--prefix", str(where), CLIENT], where)
    except NpmUnavailable as missing:
        pytest.skip(f"could not fetch {CLIENT}: {missing}")
    return where / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"


@pytest.fixture
def page(bundle: Path, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """``(the page's URL, the MQTT-over-WebSockets port it connects to)``, served on loopback."""
    port = free_port()
    site = tmp_path / "site"
    site.mkdir()
    (site / "mqtt.min.js").write_bytes(bundle.read_bytes())
    (site / "index.html").write_text(PAGE % {"port": port})
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *_a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html", port
    finally:
        server.shutdown()


def test_mqttjs_in_chromium_publishes_subscribes_retains_and_leaves_a_will(
    browser: Any, page: tuple[str, int], tmp_path: Path
) -> None:
    url, ws_port = page
    tcp = free_port()
    with broker(tmp_path / "data", mqtt=tcp, mqtt_ws=ws_port):
        device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="device", protocol=mqtt.MQTTv311)
        heard: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        device.on_message = lambda _c, _u, message: heard.put(message)
        device.connect("127.0.0.1", tcp)
        device.subscribe([("browser/#", 2), ("status/#", 1)])
        device.loop_start()
        try:
            browser.get(url)
            until(lambda: browser.execute_script("return window.state") == "published")
            assert browser.execute_script("return window.granted") == [1]
            said = heard.get(timeout=10)
            assert (said.topic, said.payload, said.qos) == ("browser/hello", b"from chromium", 2)
            device.publish("ticker/eur", b"1.0841", 1).wait_for_publish(5)
            assert until(lambda: browser.execute_script("return window.received")) == [["ticker/eur", "1.0841", 1]]
            browser.execute_script("client.stream.destroy()")  # the socket goes without DISCONNECT: the will

            will = heard.get(timeout=10)
            assert (will.topic, will.payload) == ("status/browser-1", b"gone")
            late = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="late", protocol=mqtt.MQTTv311)
            kept: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
            late.on_message = lambda _c, _u, message: kept.put(message)
            late.connect("127.0.0.1", tcp)
            late.subscribe("browser/+", 2)
            late.loop_start()
            retained = kept.get(timeout=10)
            late.loop_stop()
            late.disconnect()
            assert (retained.topic, retained.payload, retained.retain) == ("browser/hello", b"from chromium", True)
        finally:
            device.loop_stop()
            device.disconnect()
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

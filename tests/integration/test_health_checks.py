"""The health checks of a real ``postroom serve``: the listeners it bound (plain and TLS) are
the ones the port, protocol and certificate checks see."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from postroom.broker.tools.testing import free_port, wait_for_port, write_test_pki
from tests.integration.test_crash import broker


def check(port: int, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/health/checks/{path}",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_listeners_bound_are_what_the_port_and_protocol_checks_see(tmp_path: Path) -> None:
    http = free_port()
    with broker(tmp_path / "data", management=http) as (_process, port):
        wait_for_port(http, 30)  # (the broker is started once its AMQP port listens)
        assert check(http, f"port-listener/{port}") == (200, {"status": "ok", "port": port})
        assert check(http, f"port-listener/{http}") == (200, {"status": "ok", "port": http})
        status, failed = check(http, "port-listener/1")
        assert status == 503 and failed["missing"] == 1 and sorted(failed["ports"]) == sorted([port, http])
        assert check(http, "protocol-listener/amqp091") == (200, {"status": "ok", "protocol": "amqp"})
        assert check(http, "protocol-listener/management") == (200, {"status": "ok", "protocol": "http"})
        status, failed = check(http, "protocol-listener/amqps")
        assert status == 503 and failed["missing"] == "amqp/ssl" and sorted(failed["protocols"]) == ["amqp", "http"]
        assert check(http, "certificate-expiration/1/years") == (200, {"status": "ok"})  # no TLS listener


def test_a_tls_listener_is_listed_and_its_certificates_checked_for_expiry(tmp_path: Path) -> None:
    files = write_test_pki(tmp_path)
    http, amqps = free_port(), free_port()
    tls = f'tls: {{certificate: "{files["server.crt"]}", key: "{files["server.key"]}", ca: ["{files["client-ca"]}"]}}\n'
    with broker(tmp_path / "data", management=http, amqps=amqps, extra=tls):
        wait_for_port(http, 30)  # (the broker is started once its AMQP port listens)
        assert check(http, f"port-listener/{amqps}") == (200, {"status": "ok", "port": amqps})
        assert check(http, "protocol-listener/amqps") == (200, {"status": "ok", "protocol": "amqp/ssl"})
        assert check(http, "certificate-expiration/1/days") == (200, {"status": "ok"})
        # trustme's certificates are valid until the year 3000.
        status, failed = check(http, "certificate-expiration/2000/years")
    assert status == 503 and failed["reason"] == "Certificates expiring"
    [listener] = failed["expired"]
    assert (listener["protocol"], listener["port"]) == ("amqp/ssl", amqps)
    assert listener["certfile"] == str(files["server.crt"])
    assert listener["cacertfile"] == str(files["client-ca"])
    for moment in listener["certfile_expires_on"] + listener["cacertfile_expires_on"]:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d{1,2}:\d\d:\d\d", moment), moment
    assert listener["certfile_expires_on"] and listener["cacertfile_expires_on"]

"""The certificate-expiration health check with a TLS listener, as RabbitMQ 3.10 answers it:
a RabbitMQ node and ``postroom serve`` each listen for AMQP over TLS with the same certificate
files, and each is asked whether they expire within a day (no) and within 2,000 years (yes:
trustme's run to the year 3000). The answers are compared whole, but for what names each
broker's own ports, files and node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transcript import oracle

from postroom.broker.tools.testing import free_port, wait_for_port, write_test_pki
from tests.integration.test_crash import broker
from tests.integration.test_health_checks import check

pytestmark = pytest.mark.integration


def answers(http: int, amqps: int, node_name: str) -> list[tuple[str, Any]]:
    shown = []
    for label, path in (("within a day", "certificate-expiration/1/days"),
                        ("within 2,000 years", "certificate-expiration/2000/years"),
                        ("within a bad unit", "certificate-expiration/1/fortnights")):  # fmt: skip
        status, body = check(http, path)
        shown.append((label, [status, named(body, {amqps: "AMQPS", node_name: "NODE"})]))
    return shown


def named(value: Any, names: dict[Any, str]) -> Any:
    """``value`` with each of ``names``'s keys (a port, a node's name) put as its name."""
    if isinstance(value, dict):
        return {key: named(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [named(item, names) for item in value]
    return names.get(value, value) if isinstance(value, int | str) else value


def test_certificates_expiring_are_reported_as_on_rabbitmq(tmp_path: Path) -> None:
    files = write_test_pki(tmp_path)
    rabbit_http, rabbit_amqps = free_port(), free_port()
    config = (
        f"management.tcp.port = {rabbit_http}\nmanagement.tcp.ip = 127.0.0.1\n"
        f"listeners.ssl.default = 127.0.0.1:{rabbit_amqps}\n"
        f"ssl_options.cacertfile = {files['client-ca']}\n"
        f"ssl_options.certfile = {files['server.crt']}\n"
        f"ssl_options.keyfile = {files['server.key']}\n"
    )
    with oracle(config, ["rabbitmq_management"], also=[rabbit_http, rabbit_amqps]) as port:
        expected = answers(rabbit_http, rabbit_amqps, f"postroom{port}@localhost")
    assert expected[1][1][0] == 503  # what the oracle is about: trustme's certificates expire
    http, amqps = free_port(), free_port()
    tls = f'tls: {{certificate: "{files["server.crt"]}", key: "{files["server.key"]}", ca: ["{files["client-ca"]}"]}}\n'
    with broker(tmp_path / "data", management=http, amqps=amqps, extra=tls):
        wait_for_port(http, 30)
        actual = answers(http, amqps, "postroom@localhost")
    assert actual == expected

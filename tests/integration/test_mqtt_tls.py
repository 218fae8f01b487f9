"""MQTT over TLS (``listen.mqtt_tls``): paho-mqtt with a client certificate logs in as the
certificate's common name with ``mqtt.ssl_cert_login`` (RabbitMQ's setting of that name), a
user name and password still come first, and without the setting a certificate alone is no
login."""

from __future__ import annotations

import ssl
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from postroom.broker.tools.testing import free_port, write_test_pki
from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration


def login(port: int, pki: dict[str, Path], client: str | None, user: str | None = None) -> int:
    """The CONNACK return code a paho client gets (with ``client``'s certificate, or none)."""
    raw = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"c-{client}-{user}", protocol=mqtt.MQTTv311)
    context = ssl.create_default_context(cafile=str(pki["server-ca"]))
    if client is not None:
        context.load_cert_chain(pki[f"{client}.crt"], pki[f"{client}.key"])
    raw.tls_set_context(context)
    if user is not None:
        raw.username_pw_set(user, f"{user}-password")
    answered = threading.Event()
    codes: list[int] = []
    raw.on_connect = lambda _c, _u, _f, code, _p: (codes.append(code.value), answered.set())
    raw.connect("localhost", port)
    raw.loop_start()
    try:
        assert answered.wait(10)
    finally:
        raw.loop_stop()
        raw.disconnect()
    return {0: 0, 134: 4, 135: 5}[codes[0]]


@pytest.mark.parametrize("cert_login", [True, False])
def test_a_client_certificate_logs_in_with_ssl_cert_login(tmp_path: Path, cert_login: bool) -> None:
    pki = write_test_pki(tmp_path)
    port = free_port()
    extra = (
        f"tls: {{certificate: '{pki['server.crt']}', key: '{pki['server.key']}', "
        f"ca: ['{pki['client-ca']}'], verify: peer}}\n"
        f"mqtt: {{ssl_cert_login: {str(cert_login).lower()}, allow_anonymous: false}}\n"
        "users:\n"
        "  - {name: guest, password: guest, loopback_only: true, tags: [administrator]}\n"
        "  - {name: app, password: app-password}\n"
    )
    with broker(tmp_path / "data", mqtt_tls=port, extra=extra):
        assert login(port, pki, "app") == (0 if cert_login else 4)
        assert login(port, pki, "stranger") == 4  # a certificate of no user
        assert login(port, pki, "stranger", user="app") == 0  # a user name and password come first
        assert login(port, pki, None) == 4
    assert "Traceback" not in (tmp_path / "broker.log").read_text()

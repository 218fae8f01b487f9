"""The stream protocol over TLS (RabbitMQ's port 5551) and the ``EXTERNAL`` mechanism, side by
side with RabbitMQ 3.10.8 (``rabbitmq_stream`` and ``rabbitmq_auth_mechanism_ssl``).

Both brokers have the same settings: a plain and a TLS stream listener, ``verify_peer`` against
the server and client CAs without ``fail_if_no_peer_cert``, ``EXTERNAL`` among the mechanisms
with the login taken from the certificate's common name, and the users ``guest`` and ``app``.
Each probe connects (over TLS or not, with a client certificate or not), asks for the
mechanisms, logs in with one and opens ``/``, and records every answer and how the socket
ended. Both brokers must give the same record for every probe.
"""

from __future__ import annotations

import base64
import json
import ssl
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transcript import oracle, wait_for

from postroom.broker.tools.testing import free_port, rabbitmqctl, wait_for_port, write_test_pki
from postroom.broker.wire import streamframes as wire
from tests.conformance.test_stream_protocol_transcripts import ADVERTISED, Peer, s
from tests.conformance.test_tls_transcripts import rabbitmq_tls_options
from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration

_REFUSED = "refused by TLS"

#: (over TLS, client certificate, mechanism or None to stop after the mechanisms)
PROBES = [
    (True, None, None),
    (False, None, None),
    (True, "app", "EXTERNAL"),
    (True, "guest", "EXTERNAL"),
    (True, None, "EXTERNAL"),
    (True, "stranger", "EXTERNAL"),
    (False, None, "EXTERNAL"),
    (True, "app", "PLAIN"),
    (True, None, "AMQPLAIN"),
    (True, "rogue", None),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_test_pki(tmp_path_factory.mktemp("stream-tls"))


#: What both brokers' TLS listeners advertise: ``stream.advertised_host`` and
#: ``stream.advertised_tls_port`` (the plain ones advertise :data:`ADVERTISED`).
ADVERTISED_TLS = (ADVERTISED[0], 15551)


@pytest.fixture(scope="module")
def ports(pki: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, int, int]]]:
    """Each broker's ``(stream port, stream TLS port, management port)``."""
    rabbit = (free_port(), free_port(), free_port())
    config = (
        f"stream.listeners.tcp.1 = 127.0.0.1:{rabbit[0]}\n"
        f"stream.listeners.ssl.1 = 127.0.0.1:{rabbit[1]}\n"
        f"stream.advertised_host = {ADVERTISED[0]}\nstream.advertised_port = {ADVERTISED[1]}\n"
        f"stream.advertised_tls_port = {ADVERTISED_TLS[1]}\n"
        f"management.tcp.port = {rabbit[2]}\nmanagement.tcp.ip = 127.0.0.1\n"
    ) + rabbitmq_tls_options(pki)
    ours = (free_port(), free_port(), free_port())
    directory = tmp_path_factory.mktemp("stream-tls-postroom")
    extra = (
        f"tls: {{certificate: '{pki['server.crt']}', key: '{pki['server.key']}', "
        f"ca: ['{pki['server-ca']}', '{pki['client-ca']}'], verify: peer}}\n"
        "auth_mechanisms: [PLAIN, AMQPLAIN, EXTERNAL]\n"
        "users:\n"
        "  - {name: guest, password: guest, loopback_only: true, tags: [administrator]}\n"
        "  - {name: app, password: app-password}\n"
        f"stream: {{advertised_host: {ADVERTISED[0]}, advertised_port: {ADVERTISED[1]}, "
        f"advertised_tls_port: {ADVERTISED_TLS[1]}}}\n"
    )
    with (
        oracle(
            config,
            ["rabbitmq_stream", "rabbitmq_auth_mechanism_ssl", "rabbitmq_management", "rabbitmq_stream_management"],
            also=list(rabbit),
        ) as amqp,
        broker(directory / "data", stream=ours[0], extra=extra, stream_tls=ours[1], management=ours[2]),
    ):
        rabbitmqctl(amqp, "add_user", "app", "app-password")
        rabbitmqctl(amqp, "set_permissions", "app", ".*", ".*", ".*")
        wait_for_port(ours[1], 30)
        yield {"rabbitmq": rabbit, "postroom": ours}
    assert "Traceback" not in (directory / "broker.log").read_text()


def probe(port: int, tls: bool, certificate: str | None, mechanism: str | None, pki: dict[str, Path]) -> list[Any]:
    peer = Peer(port)
    if tls:
        context = ssl.create_default_context(cafile=str(pki["server-ca"]))
        if certificate:
            context.load_cert_chain(pki[f"{certificate}.crt"], pki[f"{certificate}.key"])
        try:
            peer.socket = context.wrap_socket(peer.socket, server_hostname="localhost")
        except (ssl.SSLError, OSError):
            return [_REFUSED]
    try:
        peer.send(wire.PEER_PROPERTIES, wire.string_map({"product": "transcript"}))
        peer.read()
        if peer.log[-1] in ("closed", "nothing"):
            # Under TLS 1.3 a refused client certificate shows once the client reads.
            return [_REFUSED]
        peer.send(wire.SASL_HANDSHAKE, b"")
        peer.read()
        if mechanism is None:
            return peer.log
        response = {"PLAIN": b"\0app\0app-password", "AMQPLAIN": b"\x05LOGINS\x00\x00\x00\x03app"}.get(mechanism, b"")
        peer.send(wire.SASL_AUTHENTICATE, s(mechanism) + struct.pack(">I", len(response)) + response)
        peer.read()
        if peer.log[-1] in ("closed", "nothing"):
            return peer.log
        if peer.log[-1][0] != wire.TUNE:
            peer.read()  # the server's tune (RabbitMQ writes it on its own)
        if peer.log[-1] in ("closed", "nothing"):
            return peer.log
        peer.write(wire.frame(wire.TUNE | wire.RESPONSE, struct.pack(">II", 1048576, 60)))
        peer.send(wire.OPEN, s("/"))
        peer.read()
        return peer.log
    except (ssl.SSLError, OSError) as error:
        return [*peer.log, f"TLS error: {getattr(error, 'reason', None) or type(error).__name__}"]
    finally:
        peer.close()


@pytest.mark.parametrize(
    ("tls", "certificate", "mechanism"), PROBES, ids=[f"{'tls' if t else 'tcp'}-{c}-{m}" for t, c, m in PROBES]
)
def test_the_stream_protocol_over_tls_and_external_answer_as_rabbitmq(
    ports: dict[str, tuple[int, int, int]],
    pki: dict[str, Path],
    tls: bool,
    certificate: str | None,
    mechanism: str | None,
) -> None:
    records = {name: probe(pair[1 if tls else 0], tls, certificate, mechanism, pki) for name, pair in ports.items()}
    if not (tls and mechanism == "EXTERNAL"):
        assert records["postroom"] == records["rabbitmq"]
        return
    # RabbitMQ 3.10.8's stream reader hands EXTERNAL the connection's state where the
    # mechanism's belongs, and crashes (function_clause in rabbit_auth_mechanism_ssl): the
    # socket closes without an answer (docs: "Differences from RabbitMQ"). Postroom answers
    # as the protocol says, and as AMQP's EXTERNAL does.
    assert records["rabbitmq"][2:] == ["closed"] and records["postroom"][:2] == records["rabbitmq"][:2]
    answer = records["postroom"][2]
    if certificate in ("app", "guest"):
        assert answer[3] == "000000030001"  # (correlation 3, OK)
        host, port = ADVERTISED_TLS
        assert ("open", 4, wire.OK, [("advertised_host", host), ("advertised_port", str(port))]) in records["postroom"]
    else:  # no certificate, or one that names no user
        assert answer[3] == "000000030008"  # (correlation 3, authentication failure)
        assert records["postroom"][3:] == ["closed"]


def tls_view(ports: tuple[int, int, int], pki: dict[str, Path]) -> dict[str, Any]:
    """The TLS fields of a stream connection made with ``app``'s certificate (logged in with
    PLAIN), as ``/api/stream/connections`` shows them once the broker's statistics have it."""
    peer = Peer(ports[1])
    context = ssl.create_default_context(cafile=str(pki["server-ca"]))
    context.load_cert_chain(pki["app.crt"], pki["app.key"])
    peer.socket = context.wrap_socket(peer.socket, server_hostname="localhost")
    try:
        peer.send(wire.PEER_PROPERTIES, wire.string_map({"product": "transcript", "connection_name": "tls-fields"}))
        peer.read()
        peer.send(wire.SASL_HANDSHAKE, b"")
        peer.read()
        response = b"\0app\0app-password"
        peer.send(wire.SASL_AUTHENTICATE, s("PLAIN") + struct.pack(">I", len(response)) + response)
        peer.read()
        if peer.log[-1][0] != wire.TUNE:
            peer.read()
        peer.write(wire.frame(wire.TUNE | wire.RESPONSE, struct.pack(">II", 1048576, 60)))
        peer.send(wire.OPEN, s("/"))
        peer.read()

        def shown() -> dict[str, Any] | None:
            request = urllib.request.Request(
                f"http://127.0.0.1:{ports[2]}/api/stream/connections",
                headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                views = json.load(answer)
            return next((view for view in views if view.get("user_provided_name") == "tls-fields"), None)

        assert wait_for(lambda: shown() is not None, 30)
        view = shown()
        assert view is not None
        return {key: value for key, value in view.items() if key.startswith(("ssl", "peer_cert"))}
    finally:
        peer.close()


def test_a_tls_connection_shows_its_session_as_rabbitmq_shows_it(
    ports: dict[str, tuple[int, int, int]], pki: dict[str, Path]
) -> None:
    """Protocol, key exchange, cipher and hash in Erlang's names; the client's certificate's
    subject, issuer and validity as RabbitMQ writes them."""
    expected = tls_view(ports["rabbitmq"], pki)
    assert expected["ssl"] is True and expected["peer_cert_subject"]  # what the oracle is about
    assert tls_view(ports["postroom"], pki) == expected

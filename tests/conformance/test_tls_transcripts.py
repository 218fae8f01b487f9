"""TLS and the ``EXTERNAL`` mechanism, side by side with RabbitMQ.

A RabbitMQ node of its own (the session's oracle has no TLS listener) runs with
``rabbitmq_auth_mechanism_ssl``, ``EXTERNAL`` among its ``auth_mechanisms``,
``ssl_cert_login_from = common_name`` and ``verify_peer`` against the server and client CAs
without ``fail_if_no_peer_cert``: the same settings as the Postroom listener here. Each probe
connects (over TLS or not, with a client certificate or not), reads ``connection.start``,
answers with a mechanism, and records what comes back: the offered mechanisms, the ``tune``
or the ``connection.close`` and its text, or how the socket ended. Both brokers must give the
same record for every probe.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands, frame
from transcript import oracle
from twisted.internet import threads

from postroom.broker.core.definitions import node_from_config
from postroom.broker.server.listeners import tls_wrapper
from postroom.broker.server.protocol import AMQPServerFactory
from postroom.broker.tools.testing import free_port, rabbitmqctl, write_test_pki
from postroom.config.schema import BrokerConfig, ListenConfig, TLSConfig, UserConfig
from tests.conftest import BROKER_PORTS

pytestmark = pytest.mark.integration

_REFUSED = "refused before connection.start"

#: (over TLS, client certificate, mechanism or None to stop after connection.start)
PROBES = [
    (True, None, None),
    (False, None, None),
    (True, "app", "EXTERNAL"),
    (True, None, "EXTERNAL"),
    (True, "stranger", "EXTERNAL"),
    (False, None, "EXTERNAL"),
    (True, "app", "PLAIN"),
    (True, "rogue", None),
    (True, None, "RABBIT-CR-DEMO"),
    (False, None, "X-UNKNOWN"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_test_pki(tmp_path_factory.mktemp("tls-oracle"))


def rabbitmq_tls_options(pki: dict[str, Path]) -> str:
    """The lines of ``rabbitmq.conf`` for TLS as the tests here set it: ``verify_peer`` against
    both CAs without ``fail_if_no_peer_cert``, and EXTERNAL by the common name."""
    return (
        f"ssl_options.cacertfile = {pki['cas']}\n"
        f"ssl_options.certfile = {pki['server.crt']}\n"
        f"ssl_options.keyfile = {pki['server.key']}\n"
        "ssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = false\n"
        "auth_mechanisms.1 = PLAIN\n"
        "auth_mechanisms.2 = AMQPLAIN\n"
        "auth_mechanisms.3 = EXTERNAL\n"
        "ssl_cert_login_from = common_name\n"
    )


@pytest.fixture(scope="module")
def rabbitmq_tls(pki: dict[str, Path]) -> Iterator[tuple[int, int]]:
    """A RabbitMQ node with a TLS listener: ``(amqp port, amqps port)``."""
    tls_port = free_port()
    config = f"listeners.ssl.default = {tls_port}\n" + rabbitmq_tls_options(pki)
    with oracle(config, ["rabbitmq_auth_mechanism_ssl"], also=[tls_port]) as port:
        rabbitmqctl(port, "add_user", "app", "app-password")
        rabbitmqctl(port, "set_permissions", "app", ".*", ".*", ".*")
        yield port, tls_port


@pytest.fixture
def postroom_tls(broker_reactor: Any, pki: dict[str, Path]) -> Iterator[tuple[int, int]]:
    """Postroom with the same settings: ``(amqp port, amqps port)``."""
    config = BrokerConfig(
        listen=ListenConfig(amqps="tcp:0"),
        tls=TLSConfig(
            str(pki["server.crt"]), str(pki["server.key"]), (str(pki["server-ca"]), str(pki["client-ca"])), "peer"
        ),
        users=(
            UserConfig("guest", password="guest", loopback_only=True),
            UserConfig("app", password="app-password"),
        ),
        auth_mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL"),
    )

    def listen() -> tuple[AMQPServerFactory, list[Any]]:
        wrap = tls_wrapper(config, broker_reactor)
        assert wrap is not None
        factory = AMQPServerFactory(node_from_config(config, broker_reactor), broker_reactor)
        ports = [
            broker_reactor.listenTCP(0, factory, interface="127.0.0.1"),
            broker_reactor.listenTCP(0, wrap(factory), interface="127.0.0.1"),
        ]
        return factory, ports

    factory, ports = threads.blockingCallFromThread(broker_reactor, listen)
    numbers = tuple(port.getHost().port for port in ports)
    BROKER_PORTS.update(numbers)
    yield numbers  # type: ignore[misc]

    def stop() -> None:
        factory.close_all()
        for port in ports:
            port.stopListening()

    threads.blockingCallFromThread(broker_reactor, stop)


def _frames(sock: socket.socket, stop: tuple[type, ...]) -> list[Any]:
    """Methods read until one of ``stop`` arrives; how the socket ended, if it did first."""
    sock.settimeout(8)
    data, found = b"", []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return [*found, "socket closed"]
            data += chunk
            while len(data) >= 8 and len(data) >= 8 + int.from_bytes(data[3:7], "big"):
                consumed, _channel, method = frame.unmarshal(data)
                data = data[consumed:]
                found.append(method)
                if isinstance(method, stop):
                    return found
    except ConnectionResetError:
        return [*found, "socket closed"]  # RabbitMQ closes with a reset (docs/rabbitmq-compatibility.md)
    except (ssl.SSLError, OSError) as error:
        return [*found, f"TLS error: {getattr(error, 'reason', None) or type(error).__name__}"]


def probe(port: int, tls: bool, certificate: str | None, mechanism: str | None, pki: dict[str, Path]) -> list[Any]:
    record: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), timeout=8) as raw:
        sock: socket.socket = raw
        if tls:
            context = ssl.create_default_context(cafile=str(pki["server-ca"]))
            if certificate:
                context.load_cert_chain(pki[f"{certificate}.crt"], pki[f"{certificate}.key"])
            try:
                sock = context.wrap_socket(raw, server_hostname="localhost")
            except ssl.SSLError:
                return [_REFUSED]
        try:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
        except OSError:
            return [_REFUSED]
        for method in _frames(sock, (commands.Connection.Start,)):
            record.append(("start", method.mechanisms) if isinstance(method, commands.Connection.Start) else method)
        if not isinstance(record[-1], tuple):
            # Under TLS 1.3 a refused client certificate shows as an alert or as the end of
            # the stream, depending on timing; either is a refusal.
            return [_REFUSED]
        if mechanism is None:
            return record
        response = "\x00app\x00app-password" if mechanism == "PLAIN" else ""
        start_ok = commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism=mechanism,
            response=response,
        )
        try:
            sock.sendall(frame.marshal(start_ok, 0))
        except (ssl.SSLError, OSError) as error:
            return [*record, f"TLS error: {getattr(error, 'reason', None) or type(error).__name__}"]
        for method in _frames(sock, (commands.Connection.Tune, commands.Connection.Close)):
            if isinstance(method, commands.Connection.Close):
                record.append(("close", method.reply_code, method.reply_text))
            else:
                record.append(type(method).__name__ if not isinstance(method, str) else method)
    return record


@pytest.mark.parametrize(
    ("tls", "certificate", "mechanism"), PROBES, ids=[f"{'tls' if t else 'tcp'}-{c}-{m}" for t, c, m in PROBES]
)
def test_tls_and_external_answers_are_rabbitmqs(
    rabbitmq_tls: tuple[int, int],
    postroom_tls: tuple[int, int],
    pki: dict[str, Path],
    tls: bool,
    certificate: str | None,
    mechanism: str | None,
) -> None:
    expected = probe(rabbitmq_tls[tls], tls, certificate, mechanism, pki)
    actual = probe(postroom_tls[tls], tls, certificate, mechanism, pki)

    assert actual == expected

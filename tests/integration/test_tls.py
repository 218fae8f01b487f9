"""AMQPS and HTTPS with stock clients: pika, py-amqp (kombu) and aio-pika over real TLS.

The certificates are made here (trustme): a server CA that signed the broker's certificate
for ``localhost``, a client CA that signed the clients' certificates, and a rogue CA the
broker does not know. The listener trusts both of the first two, verifies a client
certificate when one is presented and, unless told otherwise, lets clients without one in:
the set-up the client libraries' own TLS tests expect of a broker.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aio_pika
import kombu
import pika
import pytest
from pamqp import commands, frame
from twisted.internet import threads
from twisted.logger import formatEvent, globalLogPublisher

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.node import Node
from postroom.broker.server.listeners import tls_wrapper
from postroom.broker.server.management import RateSampler, management_site
from postroom.broker.server.metrics import BrokerCollector, metrics_site
from postroom.broker.server.protocol import AMQPServerFactory
from postroom.broker.tools.testing import write_test_pki
from postroom.broker.wire.codec import PROTOCOL_HEADER
from postroom.config.schema import BrokerConfig, ListenConfig, TLSConfig, UserConfig
from tests.conftest import BROKER_PORTS

pytestmark = [pytest.mark.integration, pytest.mark.interop]


@dataclass
class PKI:
    """Files of the certificates this module's tests use."""

    directory: Path
    server_ca: Path
    client_ca: Path
    server_cert: Path
    server_key: Path

    def client(self, name: str) -> tuple[str, str]:
        """The certificate and key files of a client named ``name``."""
        return str(self.directory / f"{name}.crt"), str(self.directory / f"{name}.key")

    def context(self, client: str | None = None, **options: Any) -> ssl.SSLContext:
        """A client context that verifies the broker against the server CA, presenting
        ``client``'s certificate when given."""
        context = ssl.create_default_context(cafile=str(self.server_ca))
        for name, value in options.items():
            setattr(context, name, value)
        if client is not None:
            context.load_cert_chain(*self.client(client))
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    files = write_test_pki(directory)
    return PKI(directory, files["server-ca"], files["client-ca"], files["server.crt"], files["server.key"])


def tls_config(pki: PKI, **options: Any) -> TLSConfig:
    """The listener the client libraries' tests expect: both CAs, verify when presented."""
    settings = {
        "certificate": str(pki.server_cert),
        "key": str(pki.server_key),
        "ca": (str(pki.server_ca), str(pki.client_ca)),
        "verify": "peer",
        "fail_if_no_peer_cert": False,
    }
    settings.update(options)
    return TLSConfig(**settings)


USERS = (
    UserConfig("guest", password="guest", loopback_only=True, tags=("administrator",)),
    UserConfig("app"),  # no password: a client certificate only
)


@dataclass
class TLSBroker:
    """A broker with an AMQPS listener (and HTTPS metrics and management listeners)."""

    port: int
    metrics_port: int
    management_port: int
    factory: AMQPServerFactory


@pytest.fixture
def tls_broker(broker_reactor: Any) -> Iterator[Callable[..., TLSBroker]]:
    """Start brokers on loopback port 0 from a configuration's ``tls:`` (as ``make_broker_service``
    wraps its listeners); all are stopped after the test."""
    started: list[tuple[AMQPServerFactory, list[Any]]] = []

    def start(tls: TLSConfig, mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN", "EXTERNAL")) -> TLSBroker:
        config = BrokerConfig(
            listen=ListenConfig(amqps="tcp:0"), tls=replace(tls, http=True), users=USERS, auth_mechanisms=mechanisms
        )

        def listen() -> TLSBroker:
            wrap = tls_wrapper(config, broker_reactor)
            assert wrap is not None
            node = node_from_config(config, broker_reactor)
            factory = AMQPServerFactory(node, broker_reactor)
            sites = [
                metrics_site(BrokerCollector(node, None), broker_reactor),
                management_site(node, RateSampler(node, broker_reactor), broker_reactor),
            ]
            ports = [broker_reactor.listenTCP(0, wrap(f), interface="127.0.0.1") for f in (factory, *sites)]
            started.append((factory, ports))
            return TLSBroker(*(port.getHost().port for port in ports), factory)

        broker = threads.blockingCallFromThread(broker_reactor, listen)
        BROKER_PORTS.add(broker.port)
        return broker

    yield start

    def stop() -> None:
        for factory, ports in started:
            factory.close_all()
            for port in ports:
                port.stopListening()

    threads.blockingCallFromThread(broker_reactor, stop)


def pika_parameters(port: int, context: ssl.SSLContext, credentials: Any = None) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "localhost",
        port,
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(context, "localhost"),
        connection_attempts=1,
    )


def round_trip_pika(parameters: pika.ConnectionParameters) -> tuple[bytes, str]:
    """Publish one message and get it back; the body and the user the broker saw."""
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        channel.queue_declare("tls", auto_delete=True)
        channel.basic_publish("", "tls", b"over TLS", pika.BasicProperties(user_id=parameters.credentials.username))
        _method, properties, body = channel.basic_get("tls", auto_ack=True)
        return body, properties.user_id
    finally:
        connection.close()


@pytest.mark.parametrize("client", [None, "app"], ids=["no client certificate", "client certificate"])
def test_pika_over_tls_with_and_without_a_client_certificate(pki: PKI, tls_broker: Any, client: str | None) -> None:
    broker = tls_broker(tls_config(pki))

    assert round_trip_pika(pika_parameters(broker.port, pki.context(client))) == (b"over TLS", "guest")


@pytest.mark.parametrize("client", [None, "app"], ids=["no client certificate", "client certificate"])
def test_kombu_over_tls_with_and_without_a_client_certificate(pki: PKI, tls_broker: Any, client: str | None) -> None:
    broker = tls_broker(tls_config(pki))
    options: dict[str, Any] = {
        "ca_certs": str(pki.server_ca),
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": "localhost",
    }
    if client:
        options["certfile"], options["keyfile"] = pki.client(client)

    with kombu.Connection(
        f"amqp://guest:guest@localhost:{broker.port}//", ssl=options, connect_timeout=5
    ) as connection:
        queue = connection.SimpleQueue("tls-kombu")
        queue.put({"over": "TLS"})
        message = queue.get(timeout=5)
        message.ack()
        payload = message.payload
        queue.close()

    assert payload == {"over": "TLS"}


@pytest.mark.parametrize("client", [None, "app"], ids=["no client certificate", "client certificate"])
def test_aio_pika_over_tls_with_and_without_a_client_certificate(pki: PKI, tls_broker: Any, client: str | None) -> None:
    broker = tls_broker(tls_config(pki))
    query = f"cafile={pki.server_ca}"
    if client:
        certificate, key = pki.client(client)
        query += f"&certfile={certificate}&keyfile={key}"

    async def round_trip() -> bytes:
        connection = await aio_pika.connect(f"amqps://guest:guest@localhost:{broker.port}/?{query}", timeout=5)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("tls-aio", auto_delete=True)
            await channel.default_exchange.publish(aio_pika.Message(b"over TLS"), routing_key="tls-aio")
            message = await queue.get(timeout=5)
            await message.ack()
            return message.body

    assert asyncio.run(asyncio.wait_for(round_trip(), timeout=15)) == b"over TLS"


def test_a_client_certificate_no_configured_ca_signed_is_refused_in_the_handshake(pki: PKI, tls_broker: Any) -> None:
    broker = tls_broker(tls_config(pki))

    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika_parameters(broker.port, pki.context("rogue")))
    # and the listener still serves everyone else
    assert round_trip_pika(pika_parameters(broker.port, pki.context("app")))[0] == b"over TLS"


def test_fail_if_no_peer_cert_refuses_a_client_without_a_certificate(pki: PKI, tls_broker: Any) -> None:
    broker = tls_broker(tls_config(pki, fail_if_no_peer_cert=True))

    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika_parameters(broker.port, pki.context(None)))
    assert round_trip_pika(pika_parameters(broker.port, pki.context("app")))[0] == b"over TLS"


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_versions_before_1_2_are_refused(pki: PKI, tls_broker: Any) -> None:
    broker = tls_broker(tls_config(pki))
    old = pki.context(None)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("ALL:@SECLEVEL=0")

    with socket.create_connection(("localhost", broker.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"):
            old.wrap_socket(raw, server_hostname="localhost")
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = pki.context(None, minimum_version=version, maximum_version=version)
        assert round_trip_pika(pika_parameters(broker.port, context))[0] == b"over TLS"


def test_external_logs_in_as_the_certificates_common_name(pki: PKI, tls_broker: Any) -> None:
    broker = tls_broker(tls_config(pki))
    connection = pika.BlockingConnection(
        pika_parameters(broker.port, pki.context("app"), pika.credentials.ExternalCredentials())
    )
    try:
        channel = connection.channel()
        channel.queue_declare("external", auto_delete=True)
        channel.basic_publish("", "external", b"x", pika.BasicProperties(user_id="app"))
        _method, properties, _body = channel.basic_get("external", auto_ack=True)
    finally:
        connection.close()

    # user_id is checked against the logged-in user: a publish as "app" went through.
    assert properties.user_id == "app"


@pytest.mark.parametrize(
    ("client", "reason"),
    [
        (None, "EXTERNAL login refused: connection peer presented no TLS (x.509) certificate"),
        ("stranger", "EXTERNAL login refused: user 'stranger' - invalid credentials"),
    ],
    ids=["no certificate", "no such user"],
)
def test_external_is_refused_without_a_certificate_or_a_user_of_its_name(
    pki: PKI, tls_broker: Any, client: str | None, reason: str
) -> None:
    broker = tls_broker(tls_config(pki))
    logged: list[str] = []
    observer = lambda event: logged.append(formatEvent(event))  # noqa: E731
    globalLogPublisher.addObserver(observer)
    try:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
            pika.BlockingConnection(
                pika_parameters(broker.port, pki.context(client), pika.credentials.ExternalCredentials())
            )
    finally:
        globalLogPublisher.removeObserver(observer)

    # The client gets RabbitMQ's text; the log says why, with the peer's address.
    assert "Login was refused using authentication mechanism EXTERNAL" in str(refused.value)
    assert [line for line in logged if reason in line and "127.0.0.1:" in line], logged


def start_method(port: int, context: ssl.SSLContext | None) -> commands.Connection.Start:
    """The ``connection.start`` a broker sends after the protocol header."""
    with socket.create_connection(("localhost", port), timeout=5) as raw:
        sock = context.wrap_socket(raw, server_hostname="localhost") if context else raw
        sock.sendall(PROTOCOL_HEADER)
        data = b""
        while len(data) < 7 or len(data) < 8 + int.from_bytes(data[3:7], "big"):
            chunk = sock.recv(65536)
            assert chunk, "the broker closed the connection"
            data += chunk
        _consumed, _channel, method = frame.unmarshal(data)
        return method


def test_external_is_offered_on_tls_connections_only(pki: PKI, tls_broker: Any, make_broker: Any) -> None:
    """RabbitMQ offers EXTERNAL on TLS connections, with or without a certificate, only."""
    broker = tls_broker(tls_config(pki))
    plain = make_broker(Node(auth_mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL")))

    assert start_method(broker.port, pki.context(None)).mechanisms == "AMQPLAIN PLAIN EXTERNAL"
    assert start_method(broker.port, pki.context("app")).mechanisms == "AMQPLAIN PLAIN EXTERNAL"
    assert start_method(plain.port, None).mechanisms == "AMQPLAIN PLAIN"


def fetch(url: str, context: ssl.SSLContext, user: str = "guest", password: str = "guest") -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_metrics_and_management_over_https(pki: PKI, tls_broker: Any) -> None:
    broker = tls_broker(tls_config(pki))

    status, metrics = fetch(f"https://localhost:{broker.metrics_port}/metrics", pki.context(None))
    assert status == 200
    assert b"postroom_auth_attempts_total" in metrics
    status, overview = fetch(f"https://localhost:{broker.management_port}/api/overview", pki.context("app"))
    assert status == 200
    assert b"Postroom" in overview or b"postroom" in overview
    with pytest.raises((urllib.error.URLError, http.client.HTTPException)):  # plain HTTP on the TLS port: no answer
        urllib.request.urlopen(f"http://localhost:{broker.metrics_port}/metrics", timeout=5)

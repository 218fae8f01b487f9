"""The twistd plugin is found and builds a service that listens where it is told."""

from __future__ import annotations

from twisted.application.service import IServiceMaker
from twisted.internet.testing import MemoryReactorClock
from twisted.plugin import getPlugins

from postroom.broker.server.service import make_broker_service
from postroom.broker.tools.tap import Options
from postroom.config.schema import BrokerConfig, ListenConfig


def test_twistd_finds_the_postroom_plugin() -> None:
    names = [maker.tapname for maker in getPlugins(IServiceMaker)]
    assert "postroom" in names


def test_listen_options_accumulate() -> None:
    options = Options()
    options.parseOptions(["--listen", "tcp:5673", "-l", "tcp:5674"])
    assert options["listen"] == ["tcp:5673", "tcp:5674"]


def test_service_listens_on_each_endpoint() -> None:
    reactor = MemoryReactorClock()
    service = make_broker_service(
        reactor, amqp_endpoints=["tcp:5673:interface=127.0.0.1", "tcp:5674:interface=127.0.0.1"], persist=False
    )
    service.startService()
    assert [(port, interface) for port, _f, _b, interface in reactor.tcpServers] == [
        (5673, "127.0.0.1"),
        (5674, "127.0.0.1"),
        (15692, "127.0.0.1"),  # metrics, the embedded default
        (15672, "127.0.0.1"),  # management API
    ]


def test_metrics_and_management_listeners_can_be_turned_off() -> None:
    reactor = MemoryReactorClock()
    config = BrokerConfig(listen=ListenConfig(amqp="tcp:5673:interface=127.0.0.1", metrics=None, management=None))
    make_broker_service(reactor, config, persist=False).startService()
    assert [port for port, *_ in reactor.tcpServers] == [5673]

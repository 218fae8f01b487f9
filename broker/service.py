"""Assembling the broker as a Twisted service: the node, the AMQP listener(s), graceful shutdown."""

from __future__ import annotations

from typing import Any

from twisted.application import strports
from twisted.application.service import IService, MultiService
from twisted.internet import defer
from twisted.logger import Logger

from broker.core.node import Node
from broker.protocol import AMQPServerFactory

#: The embedded default listener: loopback only, the AMQP port.
DEFAULT_AMQP_ENDPOINT = "tcp:5672:interface=127.0.0.1"


class BrokerService(MultiService):
    """The broker: its listeners as children; stopping it closes every connection first.

    Listeners stop accepting before connections are closed with 320 CONNECTION_FORCED, so
    clients see a clean close rather than a reset.
    """

    _log = Logger()

    def __init__(self, factory: AMQPServerFactory) -> None:
        super().__init__()
        self.factory = factory

    def stopService(self) -> defer.Deferred[Any]:
        stopped = super().stopService()

        def close_connections(result: Any) -> Any:
            self.factory.close_all()
            return result

        return defer.maybeDeferred(lambda: stopped).addBoth(close_connections)


def make_broker_service(
    reactor: Any, amqp_endpoints: list[str] | None = None, node: Node | None = None
) -> BrokerService:
    """Build the broker service.

    :param reactor: the reactor (listening and timers)
    :param amqp_endpoints: Twisted endpoint strings for AMQP listeners
    :param node: the broker node; a default one (guest/guest from loopback, vhost ``/``) if omitted
    """
    node = node or Node()
    factory = AMQPServerFactory(node, reactor)
    service = BrokerService(factory)
    for description in amqp_endpoints or [DEFAULT_AMQP_ENDPOINT]:
        strports.service(description, factory, reactor=reactor).setServiceParent(service)
    return service


def as_service(service: BrokerService) -> IService:
    """The broker as a plain ``IService`` (for twistd)."""
    return service

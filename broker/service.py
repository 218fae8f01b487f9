"""Assembling the broker as a Twisted service: the node, the AMQP listener(s), graceful shutdown."""

from __future__ import annotations

import gc
from typing import Any

from twisted.application import strports
from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.logger import Logger

from broker.core.node import Node
from broker.protocol import AMQPServerFactory

#: Allocations between young-generation collections. Messages and queue entries are
#: allocated at 100k+/s and never form cycles; at the default (700) the collector would walk
#: every queued message many times a second.
GC_THRESHOLD = 100_000


def tune_gc() -> None:
    """Collect cycles less often (see :data:`GC_THRESHOLD`) and keep start-up objects out of it."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)


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

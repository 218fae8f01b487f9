"""Assembling the broker as a Twisted service: the node, the AMQP listener(s), graceful shutdown."""

from __future__ import annotations

import gc
from typing import Any

from twisted.application import strports
from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.logger import Logger

from broker.core.definitions import node_from_config
from broker.core.node import Node
from broker.protocol import AMQPServerFactory
from config.schema import BrokerConfig

#: Allocations between young-generation collections. Messages and queue entries are
#: allocated at 100k+/s and never form cycles; at the default (700) the collector would walk
#: every queued message many times a second.
GC_THRESHOLD = 100_000


def tune_gc() -> None:
    """Collect cycles less often (see :data:`GC_THRESHOLD`) and keep start-up objects out of it."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)


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
    reactor: Any,
    config: BrokerConfig | None = None,
    amqp_endpoints: list[str] | None = None,
    node: Node | None = None,
) -> BrokerService:
    """Build the broker service.

    :param reactor: the reactor (listening and timers)
    :param config: the configuration; the embedded default when omitted
    :param amqp_endpoints: AMQP listeners (Twisted endpoint strings) instead of the configuration's
    :param node: a ready node instead of one built from the configuration
    :raises ConfigError: the configuration's definitions were refused
    """
    config = config or BrokerConfig()
    node = node or node_from_config(config, reactor)
    factory = AMQPServerFactory(node, reactor)
    service = BrokerService(factory)
    endpoints = amqp_endpoints or [config.listen.amqp] + ([config.listen.amqps] if config.listen.amqps else [])
    for description in endpoints:
        strports.service(description, factory, reactor=reactor).setServiceParent(service)
    return service

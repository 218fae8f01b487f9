"""``twistd postroom``: command-line options and the service maker."""

from __future__ import annotations

from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from broker.service import DEFAULT_AMQP_ENDPOINT


class Options(usage.Options):
    """Options of ``twistd postroom``."""

    def __init__(self) -> None:
        super().__init__()
        self["listen"] = []

    def opt_listen(self, description: str) -> None:
        """AMQP listener as a Twisted endpoint string (repeatable; default tcp:5672:interface=127.0.0.1)."""
        self["listen"].append(description)

    opt_l = opt_listen


def makeService(options: dict[str, Any]) -> IService:
    """Build the broker service for twistd."""
    from twisted.internet import reactor

    from broker.service import make_broker_service, tune_gc

    tune_gc()
    return make_broker_service(reactor, options["listen"] or [DEFAULT_AMQP_ENDPOINT])

"""``twistd postroom``: command-line options and the service maker."""

from __future__ import annotations

from typing import Any

from twisted.application.service import IService
from twisted.python import usage


class Options(usage.Options):
    """Options of ``twistd postroom``."""

    optParameters = [["config", "c", None, "YAML configuration file (default: the embedded default)."]]  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        self["listen"] = []

    def opt_listen(self, description: str) -> None:
        """AMQP listener as a Twisted endpoint string, instead of the configuration's (repeatable)."""
        self["listen"].append(description)

    opt_l = opt_listen


def makeService(options: dict[str, Any]) -> IService:
    """Build the broker service for twistd.

    :raises SystemExit: the configuration is refused (the message names file, key and reason).
    """
    from twisted.internet import reactor

    from postroom.broker.server.service import tune_gc
    from postroom.broker.tools.commands.serving import broker_or_cluster_node
    from postroom.config.loader import load
    from postroom.config.schema import embedded_default
    from postroom.config.values import ConfigError

    try:
        config = load(options["config"]) if options["config"] else embedded_default()
        service = broker_or_cluster_node(reactor, config, options["listen"] or None)
    except ConfigError as error:
        raise SystemExit(str(error)) from error
    tune_gc()
    return service

"""An exchange: a name, a type's router, and what RabbitMQ keeps beside them.

Exchanges route to queues (any :class:`~broker.core.entry.Queue`) and to other exchanges; the
virtual host (``broker.core.vhost``) holds them and routes through them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from postroom.broker.core.message import Message
from postroom.broker.core.policy import Policy
from postroom.exchanges.interfaces import IInterceptingRouter, IRouter


class Exchange:
    """A named exchange and its router."""

    __slots__ = (
        "name",
        "type_name",
        "router",
        "durable",
        "auto_delete",
        "internal",
        "arguments",
        "alternate",
        "policy",
        "sources",
        "intercept",
        "published_in",
        "published_out",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        type_name: str,
        router: IRouter,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
    ) -> None:
        self.name = name
        self.type_name = type_name
        self.router = router
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments)
        alternate = arguments.get("alternate-exchange")
        self.alternate = alternate if isinstance(alternate, str) and alternate else None
        #: The policy that applies to it (``None``: none).
        self.policy: Policy | None = None
        #: Exchanges with a binding to this one (exchange-to-exchange bindings).
        self.sources: set[Exchange] = set()
        #: The router's ``intercept`` when it may take messages instead of routing them now
        #: (``IInterceptingRouter``, e.g. delayed messages), called with the virtual host, the
        #: exchange and the message; ``None`` for every other router.
        self.intercept: Callable[[Any, Exchange, Message], bool] | None = (
            router.intercept if IInterceptingRouter.providedBy(router) else None
        )
        #: Messages published to it, and the queues they reached (for the management API's
        #: ``publish_in`` and ``publish_out``).
        self.published_in = self.published_out = 0

    def __repr__(self) -> str:
        return f"<Exchange {self.name!r} {self.type_name}>"

"""The ``fanout`` exchange type: a message goes to every bound destination, whatever its key.

AMQP 0-9-1 §3.1.3.2. Binding keys and arguments take part in a binding's identity only, as in
RabbitMQ's ``rabbit_exchange_type_fanout``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from zope.interface import implementer

from postroom.exchanges.binding import TableRouter, arguments_key
from postroom.exchanges.interfaces import IExchangeType, IRouter

__all__ = ["FanoutExchangeType", "FanoutRouter"]


@implementer(IRouter)
class FanoutRouter(TableRouter):
    """Bindings of one fanout exchange; routing returns a view of the bound destinations, O(1)."""

    needs_headers = False

    def __init__(self) -> None:
        super().__init__()

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Add a binding; return ``True`` if it is new.

        :param destination: the queue or exchange to route to.
        :param routing_key: part of the binding's identity; ignored for routing.
        :param arguments: part of the binding's identity; ignored for routing.
        """
        return self._table.add(destination, routing_key, arguments_key(arguments), arguments)

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Remove a binding; return ``True`` if it existed.

        :param destination: the queue or exchange bound.
        :param routing_key: the binding key.
        :param arguments: the arguments it was bound with.
        """
        return self._table.remove(destination, routing_key, arguments_key(arguments))

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to ``destination``; return how many were removed.

        :param destination: the queue or exchange being deleted.
        """
        return len(self._table.pop_destination(destination))

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """Return every bound destination, each once. O(1).

        The result is a live view: valid until the next bind or unbind.

        :param routing_key: ignored.
        :param headers: ignored.
        """
        return self._table.destinations()


@implementer(IExchangeType)
class FanoutExchangeType:
    """The ``fanout`` exchange type."""

    name = "fanout"

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Accept any declare arguments: a fanout exchange reads none of them.

        :param arguments: the ``exchange.declare`` arguments.
        """

    def new_router(self, arguments: Mapping[str, Any]) -> IRouter:
        """Make an empty :class:`FanoutRouter`.

        :param arguments: the ``exchange.declare`` arguments (unused).
        """
        return FanoutRouter()

"""The ``direct`` exchange type: a message goes to the bindings whose key equals its routing key.

AMQP 0-9-1 §3.1.3.1. Arguments take part in a binding's identity but not in routing, as in
RabbitMQ's ``rabbit_exchange_type_direct``. A direct exchange declared with ``x-super-stream:
true`` is a partitioned stream's: its :class:`PartitionRouter` routes by a hash of the key
(``exchanges.partitions``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from zope.interface import implementer

from postroom.exchanges.binding import TableRouter, arguments_key
from postroom.exchanges.interfaces import IExchangeType, IRouter
from postroom.exchanges.partitions import partition_of, partition_order

__all__ = ["DirectExchangeType", "DirectRouter", "PartitionRouter"]

#: Routing keys whose partition is remembered, per exchange (cleared past this many).
_CACHE_KEYS = 4096


@implementer(IRouter)
class DirectRouter(TableRouter):
    """Bindings of one direct exchange, indexed by binding key: routing is one dict lookup, O(1)."""

    needs_headers = False

    def __init__(self) -> None:
        super().__init__()
        # routing key -> destination -> number of bindings (with different arguments) behind it.
        # The inner dict is what route() returns, so each destination appears once.
        self._routes: dict[str, dict[Hashable, int]] = {}

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Add a binding; return ``True`` if it is new.

        :param destination: the queue or exchange to route to.
        :param routing_key: the key a message must carry, exactly.
        :param arguments: part of the binding's identity; ignored for routing.
        """
        if not self._table.add(destination, routing_key, arguments_key(arguments), arguments):
            return False
        destinations = self._routes.setdefault(routing_key, {})
        destinations[destination] = destinations.get(destination, 0) + 1
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Remove a binding; return ``True`` if it existed.

        :param destination: the queue or exchange bound.
        :param routing_key: the binding key.
        :param arguments: the arguments it was bound with.
        """
        if not self._table.remove(destination, routing_key, arguments_key(arguments)):
            return False
        self._forget(destination, routing_key)
        return True

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to ``destination``; return how many were removed.

        :param destination: the queue or exchange being deleted.
        """
        removed = self._table.pop_destination(destination)
        for routing_key, _key, _arguments in removed:
            self._forget(destination, routing_key)
        return len(removed)

    def _forget(self, destination: Hashable, routing_key: str) -> None:
        """Drop one binding's count from the routing index, and emptied entries with it."""
        destinations = self._routes[routing_key]
        remaining = destinations[destination] - 1
        if remaining:
            destinations[destination] = remaining
            return
        del destinations[destination]
        if not destinations:
            del self._routes[routing_key]

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """Return the destinations bound with exactly ``routing_key``, each once. O(1).

        The result is an internal collection: valid until the next bind or unbind, not to be
        modified.

        :param routing_key: the message's routing key.
        :param headers: ignored.
        """
        return self._routes.get(routing_key, ())


@implementer(IRouter)
class PartitionRouter(DirectRouter):
    """The bindings of a partitioned stream's exchange (see ``exchanges.partitions``)."""

    def __init__(self) -> None:
        super().__init__()
        #: The destinations bound with a partition order, in that order (``None``: to be sorted).
        self._partitions: list[Hashable] | None = None
        self._cache: dict[str, tuple[Hashable, ...]] = {}

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        added = super().bind(destination, routing_key, arguments)
        if added:
            self._changed()
        return added

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        removed = super().unbind(destination, routing_key, arguments)
        if removed:
            self._changed()
        return removed

    def unbind_all(self, destination: Hashable) -> int:
        removed = super().unbind_all(destination)
        if removed:
            self._changed()
        return removed

    def _changed(self) -> None:
        self._partitions = None
        self._cache.clear()

    def partitions(self) -> list[Hashable]:
        """The partitions, in their order (a destination bound twice counts once, at its first place)."""
        if self._partitions is None:
            ordered = sorted(
                (order, index, destination)
                for index, (destination, _key, arguments) in enumerate(self.bindings())
                if (order := partition_order(arguments)) is not None
            )
            seen: dict[Hashable, None] = {}
            for _order, _index, destination in ordered:
                seen.setdefault(destination, None)
            self._partitions = list(seen)
        return self._partitions

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """The partition ``routing_key`` hashes to; without partitions, as a direct exchange."""
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        partitions = self.partitions()
        if not partitions:
            return super().route(routing_key, headers)
        if len(self._cache) >= _CACHE_KEYS:
            self._cache.clear()
        routed = self._cache[routing_key] = (partitions[partition_of(routing_key, len(partitions))],)
        return routed


@implementer(IExchangeType)
class DirectExchangeType:
    """The ``direct`` exchange type."""

    name = "direct"

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Accept any declare arguments: a direct exchange reads none of them.

        :param arguments: the ``exchange.declare`` arguments.
        """

    def new_router(self, arguments: Mapping[str, Any]) -> IRouter:
        """Make an empty :class:`DirectRouter`, or with ``x-super-stream: true`` a partitioned
        stream's (:class:`PartitionRouter`).

        :param arguments: the ``exchange.declare`` arguments.
        """
        if arguments.get("x-super-stream") is True:
            return PartitionRouter()
        return DirectRouter()

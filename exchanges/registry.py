"""The exchange types a broker knows, by the name clients give in ``exchange.declare``.

Built-in types are registered explicitly by :func:`default_registry`; plugin types are
registered by the plugin loader. An unknown name is :class:`InvalidExchangeType`; RabbitMQ
answers that case with 503 COMMAND_INVALID "invalid exchange type 'x'".
"""

from __future__ import annotations

from zope.interface.verify import verifyObject

from postroom.exchanges.direct import DirectExchangeType
from postroom.exchanges.fanout import FanoutExchangeType
from postroom.exchanges.headers import HeadersExchangeType
from postroom.exchanges.interfaces import IExchangeType
from postroom.exchanges.topic import TopicExchangeType

__all__ = ["ExchangeTypeRegistry", "InvalidExchangeType", "default_registry"]


class InvalidExchangeType(LookupError):
    """No exchange type is registered under this name."""

    def __init__(self, name: str) -> None:
        """
        :param name: the name that was looked up.
        """
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        """RabbitMQ's wording, ready for a reply text."""
        return f"invalid exchange type '{self.name}'"


class ExchangeTypeRegistry:
    """Exchange types by name. Lookups are one dict access."""

    def __init__(self) -> None:
        self._types: dict[str, IExchangeType] = {}

    def register(self, exchange_type: IExchangeType) -> None:
        """Add an exchange type under its ``name``.

        :param exchange_type: the type; checked with ``verifyObject(IExchangeType, ...)``.
        :raises zope.interface.Invalid: it does not provide :class:`IExchangeType`.
        :raises ValueError: its name is empty, not a string, or already registered (a plugin
            cannot replace a built-in type, or another plugin's, by accident).
        """
        verifyObject(IExchangeType, exchange_type)
        name = exchange_type.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"exchange type name must be a non-empty string, not {name!r}")
        if name in self._types:
            raise ValueError(f"exchange type {name!r} is already registered")
        self._types[name] = exchange_type

    def get(self, name: str) -> IExchangeType:
        """Return the exchange type registered as ``name``.

        :param name: the type name from ``exchange.declare``.
        :raises InvalidExchangeType: nothing is registered under that name.
        """
        try:
            return self._types[name]
        except KeyError:
            raise InvalidExchangeType(name) from None

    def names(self) -> list[str]:
        """The registered type names, sorted."""
        return sorted(self._types)


def default_registry() -> ExchangeTypeRegistry:
    """Return a new registry holding the four built-in types: direct, fanout, topic, headers."""
    registry = ExchangeTypeRegistry()
    for exchange_type in (
        DirectExchangeType(),
        FanoutExchangeType(),
        TopicExchangeType(),
        HeadersExchangeType(),
    ):
        registry.register(exchange_type)
    return registry

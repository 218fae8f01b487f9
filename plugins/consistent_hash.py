"""``consistent_hash``: the ``x-consistent-hash`` exchange type, as RabbitMQ's plugin of that name.

Each binding's routing key is its *weight*, a positive integer in decimal: a binding of
weight ``w`` owns ``w`` buckets. Buckets are numbered in binding order (RabbitMQ 3.8+:
a new binding's buckets go at the end; removing one renumbers those after it). A message
goes to exactly one destination, the owner of bucket ``jump(hash(value), buckets)`` where
``jump`` is Lamping and Veach's jump consistent hash (arXiv:1406.2294) and ``value`` is:

* the routing key, by default;
* the header named by the exchange argument ``hash-header``; or
* the property named by the exchange argument ``hash-property``: ``message_id``,
  ``correlation_id`` or ``timestamp`` (as decimal seconds).

A message without that header or property is hashed as "absent" (so all such messages go to
one destination), as RabbitMQ does. Adding a binding of weight ``w`` to ``n`` buckets moves
about ``w/(n+w)`` of the keys, all of them to the new destination.

Errors, with RabbitMQ's wording: a binding key that is not an integer, or below 1, refuses the
bind (406 PRECONDITION_FAILED); ``hash-header`` and ``hash-property`` together, or an
unsupported property, refuse the declare (406).

Postroom's hash of the value is the first 8 bytes of BLAKE2b, where RabbitMQ uses
``erlang:phash2``: the spread is as even, but a given key may land in another bucket than on
RabbitMQ.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Hashable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from postroom.broker.interfaces import IBrokerPlugin, IPluginContext, PluginSettingsInvalid
from postroom.exchanges.binding import arguments_key
from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IInterceptingRouter, IRouter

#: The exchange type name clients declare.
TYPE_NAME = "x-consistent-hash"
#: Properties ``hash-property`` may name (RabbitMQ's list).
PROPERTIES = ("correlation_id", "message_id", "timestamp")

#: The seed of the absent value: every message without the hashed header/property lands here.
_ABSENT = b"\x00postroom:absent"
_LCG = 2862933555777941757  # the 64-bit linear congruential step of the jump hash paper
_MASK = (1 << 64) - 1
_INTEGER = re.compile(r"[+-]?[0-9]+")


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: ``key`` (64-bit) to a bucket in ``0 .. buckets-1``.

    O(log buckets). Growing ``buckets`` by one moves a key only to the new bucket.
    """
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * _LCG + 1) & _MASK
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def hash_value(value: Any) -> int:
    """A stable 64-bit hash of a routing key, header or property value."""
    if value is None:
        data = _ABSENT
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
    elif isinstance(value, bool):
        data = b"true" if value else b"false"
    elif isinstance(value, int):
        data = str(value).encode()
    else:
        data = repr(value).encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _weight(routing_key: str) -> int:
    # Erlang's list_to_integer: an optional sign and decimal digits, nothing else.
    if not _INTEGER.fullmatch(routing_key):
        raise BindingInvalid(f"The binding key must be an integer: {routing_key!r}")
    weight = int(routing_key)
    if weight < 1:
        raise BindingInvalid("The binding key must be greater than 0")
    return weight


@implementer(IInterceptingRouter)
class ConsistentHashRouter:
    """Weighted buckets in binding order, and jump consistent hashing over them.

    :param header: hash this header's value instead of the routing key
    :param prop: hash this property's value instead of the routing key (one of :data:`PROPERTIES`)
    """

    def __init__(self, header: str | None = None, prop: str | None = None) -> None:
        self._header = header
        self._property = prop
        self.needs_headers = header is not None
        #: Bindings in order: (destination, routing_key, arguments_key) -> (weight, arguments as bound).
        self._bindings: dict[tuple[Hashable, str, Hashable], tuple[int, dict[str, Any]]] = {}
        #: Bucket number -> destination.
        self._buckets: list[Hashable] = []
        #: The property value of the message being routed (see :meth:`intercept`).
        self._value: Any = None

    @staticmethod
    def _key(destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> Any:
        return destination, routing_key, arguments_key(arguments)

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Add ``weight`` buckets for ``destination`` at the end.

        :raises BindingInvalid: the routing key is not an integer of at least 1.
        """
        weight = _weight(routing_key)
        key = self._key(destination, routing_key, arguments)
        if key in self._bindings:
            return False
        self._bindings[key] = (weight, dict(arguments))
        self._buckets.extend([destination] * weight)
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Remove a binding's buckets; later buckets move down (RabbitMQ's renumbering)."""
        key = self._key(destination, routing_key, arguments)
        if key not in self._bindings:
            return False
        self._remove({key})
        return True

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to ``destination``."""
        keys = {key for key in self._bindings if key[0] == destination}
        self._remove(keys)
        return len(keys)

    def _remove(self, keys: set[Any]) -> None:
        for key in keys:
            del self._bindings[key]
        self._buckets = [key[0] for key, (weight, _arguments) in self._bindings.items() for _ in range(weight)]

    def intercept(self, vhost: Any, exchange: Any, message: Any) -> bool:
        """Note the ``hash-property`` value of the message about to be routed; never takes it.

        Routers see only the routing key and headers; properties reach this one through here,
        just before :meth:`route` is called for the same message.
        """
        self._value = _property(message, self._property) if self._property is not None else None
        return False

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """The one destination owning the bucket the message's value hashes to (none without bindings)."""
        buckets = self._buckets
        if not buckets:
            return ()
        if self._property is not None:
            value, self._value = self._value, None
        elif self._header is not None:
            value = headers.get(self._header) if headers else None
        else:
            value = routing_key
        return (buckets[jump_hash(hash_value(value), len(buckets))],)

    def bindings(self) -> Iterable[tuple[Hashable, str, Mapping[str, Any]]]:
        """Every binding, in binding order."""
        return [
            (destination, routing_key, dict(arguments))
            for (destination, routing_key, _compared), (_weight, arguments) in self._bindings.items()
        ]

    def __len__(self) -> int:
        return len(self._bindings)


def _property(message: Any, name: str) -> Any:
    value = getattr(message.properties, name, None)
    if name == "timestamp" and value is not None:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=timezone.utc)
            value = int(value.timestamp())
        value = str(int(value))
    return value


@implementer(IExchangeType)
class ConsistentHashExchangeType:
    """``x-consistent-hash``: one destination per message, chosen by a weighted consistent hash."""

    name = TYPE_NAME

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """``hash-header`` (a string) or ``hash-property`` (one of :data:`PROPERTIES`), not both.

        :raises BindingInvalid: (406) both are given, or the property is not supported.
        """
        header, prop = _text(arguments.get("hash-header")), _text(arguments.get("hash-property"))
        if header is not None and prop is not None:
            raise BindingInvalid("hash-header and hash-property are mutually exclusive")
        if "hash-header" in arguments and header is None:
            raise BindingInvalid(f"hash-header must be a string, not {arguments['hash-header']!r}")
        if "hash-property" in arguments and prop not in PROPERTIES:
            raise BindingInvalid(f"Unsupported property: {arguments['hash-property']}")

    def new_router(self, arguments: Mapping[str, Any]) -> IRouter:
        """An empty ring hashing what the arguments say."""
        return ConsistentHashRouter(_text(arguments.get("hash-header")), _text(arguments.get("hash-property")))


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


@implementer(IPlugin, IBrokerPlugin)
class ConsistentHashPlugin:
    """The bundled ``consistent_hash`` plugin (no settings)."""

    name = "consistent_hash"
    description = "x-consistent-hash exchange type: spreads messages over weighted bindings by a hash"
    requires: tuple[str, ...] = ()

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """No settings are accepted.

        :raises PluginSettingsInvalid: any setting is given.
        """
        if settings:
            raise PluginSettingsInvalid(f"takes no settings, got {', '.join(sorted(settings))}")

    def install(self, context: IPluginContext, settings: None) -> None:
        """Register the exchange type."""
        context.add_exchange_type(ConsistentHashExchangeType())


plugin = ConsistentHashPlugin()

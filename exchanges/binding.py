"""Binding identity and the per-router record of bindings, shared by every built-in router.

A binding is identified by ``(destination, routing_key, arguments)`` (AMQP 0-9-1 §3.1.3.1 and
RabbitMQ's ``#binding{}``: two binds differing only in their arguments table are two bindings).
The arguments are an AMQP field table, so they may hold unhashable values (arrays, nested
tables, byte arrays); :func:`arguments_key` turns such a table into a hashable key that is
equal exactly when RabbitMQ would consider the two tables the same.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, KeysView, Mapping
from decimal import Decimal
from typing import Any

__all__ = ["ArgumentsKey", "BindingTable", "TableRouter", "arguments_key"]

#: The hashable stand-in for an arguments table; only ever compared and hashed.
ArgumentsKey = Hashable

# The frozen form of a void (None) value. A tuple, so it never equals a frozen string.
_VOID = ("void",)


def arguments_key(arguments: Mapping[str, Any]) -> ArgumentsKey:
    """Return a hashable key equal for two tables exactly when they are the same binding arguments.

    Values keep their AMQP type, as in RabbitMQ where a table entry is ``{Name, Type, Value}``:
    ``True`` and ``1``, ``1`` and ``1.0``, ``"a"`` and ``b"a"``, ``Decimal("1.0")`` and
    ``Decimal("1.00")`` give different keys. Entry order does not matter. ``NaN`` equals itself
    here (it is compared by its bits), so binding twice with a ``NaN`` argument is idempotent.

    Cost is O(size of the table), paid on bind and unbind only, never when routing.

    :param arguments: the binding's arguments; keys are field names (strings).
    """
    if not arguments:
        return ()
    return tuple(sorted((name, _freeze(value)) for name, value in arguments.items()))


def _freeze(value: Any) -> Hashable:
    """Return a hashable, type-tagged form of one field value (recursive for tables and arrays).

    :param value: any value a decoded AMQP field table can hold.
    """
    if value is None:
        return _VOID
    cls = type(value)
    # Exact-type checks first: strings and integers are nearly all real arguments.
    if cls is str:
        return value
    if cls is bool:
        return ("bool", value)
    if cls is int:
        return ("int", value)
    if cls is float:
        # float.hex is exact, keeps -0.0 apart from 0.0 and makes NaN equal to itself.
        return ("float", value.hex())
    if isinstance(value, Mapping):
        return ("table", tuple(sorted((name, _freeze(item)) for name, item in value.items())))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_freeze(item) for item in value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value))
    if isinstance(value, Decimal):
        # str keeps the AMQP scale ("1.0" vs "1.00") and does not hash a signalling NaN.
        return ("decimal", str(value))
    if isinstance(value, bool):
        return ("bool", bool(value))
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, str):
        return str(value)
    tag = f"{cls.__module__}.{cls.__qualname__}"
    try:
        hash(value)
    except TypeError:
        return (tag, repr(value))
    return (tag, value)


class BindingTable:
    """The bindings of one router, indexed by destination.

    It answers ``len()``, ``bindings()`` and ``unbind_all()`` for a router, which keeps its own
    routing index beside it. Each binding stores a shallow copy of its arguments, so a caller
    mutating its dict after ``bind`` does not change what :meth:`__iter__` reports.
    """

    __slots__ = ("_by_destination", "_count")

    def __init__(self) -> None:
        self._by_destination: dict[Hashable, dict[tuple[str, ArgumentsKey], Mapping[str, Any]]] = {}
        self._count = 0

    def add(self, destination: Hashable, routing_key: str, key: ArgumentsKey, arguments: Mapping[str, Any]) -> bool:
        """Record a binding; return ``True`` if it was not there already. O(1).

        :param destination: where the binding leads.
        :param routing_key: the binding key.
        :param key: ``arguments_key(arguments)``, computed once by the caller.
        :param arguments: the arguments as bound, reported back by :meth:`__iter__`.
        """
        per_destination = self._by_destination.setdefault(destination, {})
        identity = (routing_key, key)
        if identity in per_destination:
            return False
        per_destination[identity] = dict(arguments)
        self._count += 1
        return True

    def remove(self, destination: Hashable, routing_key: str, key: ArgumentsKey) -> bool:
        """Forget a binding; return ``True`` if it was there. O(1).

        :param destination: where the binding leads.
        :param routing_key: the binding key.
        :param key: ``arguments_key`` of the binding's arguments.
        """
        per_destination = self._by_destination.get(destination)
        if per_destination is None or per_destination.pop((routing_key, key), None) is None:
            return False
        if not per_destination:
            del self._by_destination[destination]
        self._count -= 1
        return True

    def pop_destination(self, destination: Hashable) -> list[tuple[str, ArgumentsKey, Mapping[str, Any]]]:
        """Forget every binding to ``destination`` and return them as ``(routing_key, key, arguments)``.

        O(bindings of that destination).

        :param destination: the destination being removed.
        """
        per_destination = self._by_destination.pop(destination, None)
        if not per_destination:
            return []
        self._count -= len(per_destination)
        return [(routing_key, key, arguments) for (routing_key, key), arguments in per_destination.items()]

    def destinations(self) -> KeysView[Hashable]:
        """Every destination with at least one binding, each once.

        A live view: valid until the next change to this table.
        """
        return self._by_destination.keys()

    def __iter__(self) -> Iterator[tuple[Hashable, str, Mapping[str, Any]]]:
        """Yield every binding as ``(destination, routing_key, arguments)``."""
        for destination, per_destination in self._by_destination.items():
            for (routing_key, _key), arguments in per_destination.items():
                yield destination, routing_key, arguments

    def __len__(self) -> int:
        """The number of bindings."""
        return self._count


class TableRouter:
    """What every router shares: its bindings kept in a :class:`BindingTable` (``self._table``).

    Subclasses fill ``_table`` in ``bind``/``unbind`` and keep their own index for ``route``.
    """

    def __init__(self) -> None:
        self._table = BindingTable()

    def bindings(self) -> Iterable[tuple[Hashable, str, Mapping[str, Any]]]:
        """Every binding as ``(destination, routing_key, arguments)``."""
        return iter(self._table)

    def __len__(self) -> int:
        """The number of bindings."""
        return len(self._table)

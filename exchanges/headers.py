"""The ``headers`` exchange type: bindings match on the message's headers table, not its key.

AMQP 0-9-1 §3.1.3.4, with RabbitMQ's extensions and edge cases
(``rabbit_exchange_type_headers.erl``):

* the binding argument ``x-match`` is ``all`` (the default when absent), ``any``,
  ``all-with-x`` or ``any-with-x``; any other string, or a value that is not a string, is
  refused (RabbitMQ: 406 "Invalid x-match field value");
* ``x-match`` itself never takes part in matching; other arguments whose names start with
  ``x-`` take part only in the ``-with-x`` modes;
* an argument whose value is void (``None``) matches when the header is present, whatever
  its value;
* ``all`` with no arguments left to match matches every message; ``any`` with none matches
  no message;
* a message without headers is matched as an empty table;
* the binding's routing key takes part in its identity only.

Values are compared as RabbitMQ compares them (Erlang ``==`` on the values, ignoring the AMQP
type tag): numbers by value (``1`` matches ``1.0``), strings and byte arrays by their bytes,
but a boolean never equals a number (Erlang's ``true`` is an atom, so ``True`` does not match
``1`` although Python says ``True == 1``) and a decimal never equals a float or an integer.
Nested tables and arrays are compared member by member under the same rules.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from enum import Enum
from types import MappingProxyType
from typing import Any

from zope.interface import implementer

from postroom.exchanges.binding import ArgumentsKey, TableRouter, arguments_key
from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IRouter

__all__ = ["HeadersExchangeType", "HeadersRouter", "XMatch"]


class XMatch(Enum):
    """The values of the ``x-match`` binding argument."""

    ALL = "all"
    ANY = "any"
    ALL_WITH_X = "all-with-x"
    ANY_WITH_X = "any-with-x"


_X_MATCH = "x-match"
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_MISSING = object()


class _Kind(Enum):
    """What a field value is, for comparison: values of different kinds never match."""

    VOID = "void"
    BOOLEAN = "boolean"
    NUMBER = "number"
    DECIMAL = "decimal"
    BINARY = "binary"
    TIMESTAMP = "timestamp"
    TABLE = "table"
    ARRAY = "array"
    OTHER = "other"


# Types whose values compare with plain == when both sides have the same exact type: the
# fast path taken for nearly every header.
_PLAIN_TYPES = frozenset({str, int, float, bool, bytes, datetime})


def _kind(value: Any) -> _Kind:
    """Classify a field value. Booleans are checked before numbers: ``bool`` subclasses ``int``.

    :param value: a decoded field value.
    """
    if value is None:
        return _Kind.VOID
    if isinstance(value, bool):
        return _Kind.BOOLEAN
    if isinstance(value, (int, float)):
        return _Kind.NUMBER
    if isinstance(value, Decimal):
        return _Kind.DECIMAL
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return _Kind.BINARY
    if isinstance(value, datetime):
        return _Kind.TIMESTAMP
    if isinstance(value, Mapping):
        return _Kind.TABLE
    if isinstance(value, (list, tuple)):
        return _Kind.ARRAY
    return _Kind.OTHER


def _as_bytes(value: str | bytes | bytearray | memoryview) -> bytes:
    """The wire bytes of a string or byte array: RabbitMQ holds both as Erlang binaries."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _same_value(expected: Any, kind: _Kind, actual: Any) -> bool:
    """Whether a header value equals a binding value, by RabbitMQ's rules (module docstring).

    Never raises: a comparison Python refuses (a signalling NaN, an unencodable string) is
    a mismatch.

    :param expected: the binding argument's value (not void).
    :param kind: ``_kind(expected)``.
    :param actual: the message header's value.
    """
    if _kind(actual) is not kind:
        return False
    try:
        if kind is _Kind.BINARY:
            return _as_bytes(expected) == _as_bytes(actual)
        if kind is _Kind.TABLE:
            return expected.keys() == actual.keys() and all(
                _same_void_or_value(value, actual[name]) for name, value in expected.items()
            )
        if kind is _Kind.ARRAY:
            return len(expected) == len(actual) and all(
                _same_void_or_value(value, other) for value, other in zip(expected, actual, strict=True)
            )
        return bool(expected == actual)
    except (TypeError, ValueError, ArithmeticError):
        return False


def _same_void_or_value(expected: Any, actual: Any) -> bool:
    """:func:`_same_value` for members of tables and arrays, where void equals only void."""
    if expected is None:
        return actual is None
    return _same_value(expected, _kind(expected), actual)


class _Pattern:
    """One distinct arguments table, compiled, and the destinations bound with it."""

    __slots__ = ("destinations", "fields", "match_all")

    def __init__(self, match_all: bool, fields: tuple[tuple[str, Any, type | None, _Kind], ...]) -> None:
        self.match_all = match_all
        # (header name, expected value, its type if on the fast path, its kind)
        self.fields = fields
        # destination -> number of bindings (different routing keys) with these arguments.
        self.destinations: dict[Hashable, int] = {}

    def matches(self, headers: Mapping[str, Any]) -> bool:
        """Whether a message with these headers matches. O(fields), one lookup per field."""
        match_all = self.match_all
        for name, expected, plain_type, kind in self.fields:
            actual = headers.get(name, _MISSING)
            if actual is _MISSING:
                equal = False
            elif kind is _Kind.VOID:
                equal = True
            elif type(actual) is plain_type:
                equal = actual == expected
            else:
                equal = _same_value(expected, kind, actual)
            if equal is not match_all:
                # A miss decides "all"; a hit decides "any".
                return equal
        return match_all


def _parse_x_match(arguments: Mapping[str, Any]) -> XMatch:
    """Read and check ``x-match``, as RabbitMQ's ``validate_binding`` does.

    :param arguments: the binding's arguments.
    :raises BindingInvalid: ``x-match`` is present and not one of the four strings.
    """
    value = arguments.get(_X_MATCH, _MISSING)
    if value is _MISSING:
        return XMatch.ALL
    if not isinstance(value, str):
        raise BindingInvalid(f"Invalid x-match field type {type(value).__name__} (value {value!r}); expected longstr")
    try:
        return XMatch(value)
    except ValueError:
        raise BindingInvalid(
            f"Invalid x-match field value {value!r}; expected all, any, all-with-x, or any-with-x"
        ) from None


def _compile(arguments: Mapping[str, Any]) -> _Pattern:
    """Turn a binding's arguments into a :class:`_Pattern`.

    :param arguments: the binding's arguments.
    :raises BindingInvalid: ``x-match`` is invalid.
    """
    x_match = _parse_x_match(arguments)
    with_x = x_match in (XMatch.ALL_WITH_X, XMatch.ANY_WITH_X)
    fields = tuple(
        (name, value, type(value) if type(value) in _PLAIN_TYPES else None, _kind(value))
        for name, value in arguments.items()
        if name != _X_MATCH and (with_x or not name.startswith("x-"))
    )
    return _Pattern(x_match in (XMatch.ALL, XMatch.ALL_WITH_X), fields)


@implementer(IRouter)
class HeadersRouter(TableRouter):
    """Bindings of one headers exchange, grouped by arguments table.

    Routing tests each distinct arguments table once, however many destinations share it:
    O(distinct tables * fields), as in RabbitMQ, which also scans every binding.
    """

    needs_headers = True

    def __init__(self) -> None:
        super().__init__()
        self._patterns: dict[ArgumentsKey, _Pattern] = {}

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Add a binding; return ``True`` if it is new.

        :param destination: the queue or exchange to route to.
        :param routing_key: part of the binding's identity; ignored for routing.
        :param arguments: ``x-match`` and the headers to match.
        :raises BindingInvalid: ``x-match`` is not ``all``, ``any``, ``all-with-x`` or
            ``any-with-x``.
        """
        key = arguments_key(arguments)
        pattern = self._patterns.get(key)
        if pattern is None:
            pattern = _compile(arguments)
        if not self._table.add(destination, routing_key, key, arguments):
            return False
        self._patterns[key] = pattern
        pattern.destinations[destination] = pattern.destinations.get(destination, 0) + 1
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Remove a binding; return ``True`` if it existed.

        :param destination: the queue or exchange bound.
        :param routing_key: the binding key.
        :param arguments: the arguments it was bound with.
        """
        key = arguments_key(arguments)
        if not self._table.remove(destination, routing_key, key):
            return False
        self._forget(destination, key)
        return True

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to ``destination``; return how many were removed.

        :param destination: the queue or exchange being deleted.
        """
        removed = self._table.pop_destination(destination)
        for _routing_key, key, _arguments in removed:
            self._forget(destination, key)
        return len(removed)

    def _forget(self, destination: Hashable, key: ArgumentsKey) -> None:
        """Drop one binding's count from its pattern, and the pattern once it has none."""
        pattern = self._patterns[key]
        remaining = pattern.destinations[destination] - 1
        if remaining:
            pattern.destinations[destination] = remaining
            return
        del pattern.destinations[destination]
        if not pattern.destinations:
            del self._patterns[key]

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """Return the destinations whose binding arguments match ``headers``.

        Each destination appears once. When one arguments table matches, the result is an
        internal collection: valid until the next bind or unbind, not to be modified.

        :param routing_key: ignored.
        :param headers: the message's headers table; ``None`` is an empty table.
        """
        if headers is None:
            headers = _EMPTY
        first: dict[Hashable, int] | None = None
        merged: set[Hashable] | None = None
        for pattern in self._patterns.values():
            if pattern.matches(headers):
                if first is None:
                    first = pattern.destinations
                elif merged is None:
                    merged = set(first)
                    merged.update(pattern.destinations)
                else:
                    merged.update(pattern.destinations)
        if merged is not None:
            return merged
        return first if first is not None else ()


@implementer(IExchangeType)
class HeadersExchangeType:
    """The ``headers`` exchange type."""

    name = "headers"

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Accept any declare arguments: a headers exchange reads none of them.

        :param arguments: the ``exchange.declare`` arguments.
        """

    def new_router(self, arguments: Mapping[str, Any]) -> IRouter:
        """Make an empty :class:`HeadersRouter`.

        :param arguments: the ``exchange.declare`` arguments (unused).
        """
        return HeadersRouter()

"""The contract every router must meet, as tests any exchange type (ours or a plugin's) can reuse.

Subclass :class:`RouterContract` in a pytest test module, name the subclass ``Test...``,
and supply:

* a ``router`` fixture returning a new, empty router of the type under test;
* a ``matching_key`` class attribute: a :class:`RoutingExample` whose binding routes a
  message with its routing key and headers.

The contract adds an argument named ``x-contract`` to some bindings, to make bindings that
differ only in their arguments. It must not change whether the example matches (true of
every built-in type unless the example uses a headers ``-with-x`` match).

This module imports nothing but the standard library, ``zope.interface`` and ``exchanges``,
so it is safe to import from a plugin's own tests.
"""

from __future__ import annotations

import datetime
from collections.abc import Hashable, Iterable, Mapping
from decimal import Decimal
from typing import Any, ClassVar, NamedTuple

from zope.interface.verify import verifyObject

from postroom.exchanges.interfaces import IRouter

__all__ = ["RouterContract", "RoutingExample"]


class RoutingExample(NamedTuple):
    """A binding and a message it routes."""

    #: the binding's key.
    binding_key: str
    #: the binding's arguments.
    arguments: Mapping[str, Any]
    #: the message's routing key.
    routing_key: str
    #: the message's headers (``None`` for none).
    headers: Mapping[str, Any] | None


# Routing keys a client can send that a router must survive (a real one is at most 255
# bytes; routers must not rely on that).
_UNUSUAL_ROUTING_KEYS = (
    "",
    ".",
    "..",
    "*",
    "#",
    "#.#",
    "a.*.#",
    " ",
    "\x00",
    "ünïcødé.兔子.🐇",
    "a" * 10_000,
    "a." * 5_000,
    "." * 255,
)

# Header values of every AMQP field type, and some Python makes awkward to compare.
_UNUSUAL_HEADER_VALUES: tuple[Any, ...] = (
    None,
    True,
    0,
    -(2**63),
    float("nan"),
    float("inf"),
    Decimal("1.00"),
    Decimal("sNaN"),
    "",
    "ünïcødé",
    b"\xff\xfe",
    bytearray(b"x"),
    datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
    datetime.datetime(2024, 1, 1),
    [1, "a", [None]],
    {"nested": {"deeper": [b"x"]}},
)


def _with(arguments: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A copy of ``arguments`` with the ``extra`` entries (``x_contract`` is spelt ``x-contract``)."""
    merged = dict(arguments)
    for name, value in extra.items():
        merged[name.replace("_", "-")] = value
    return merged


def _routed(router: IRouter, example: RoutingExample) -> set[Hashable]:
    """The destinations ``router`` sends the example's message to, duplicates removed."""
    return set(router.route(example.routing_key, example.headers))


def _same_bindings(
    actual: Iterable[tuple[Hashable, str, Mapping[str, Any]]],
    expected: Iterable[tuple[Hashable, str, Mapping[str, Any]]],
) -> bool:
    """Whether two collections of bindings are equal as multisets (arguments are unhashable)."""
    remaining = list(expected)
    for binding in actual:
        if binding not in remaining:
            return False
        remaining.remove(binding)
    return not remaining


class RouterContract:
    """Tests every :class:`~exchanges.interfaces.IRouter` must pass.

    Subclasses provide a ``router`` fixture and the ``matching_key`` example.
    """

    matching_key: ClassVar[RoutingExample]

    def test_router_provides_irouter(self, router: IRouter) -> None:
        """The router provides every attribute and method of IRouter."""
        assert verifyObject(IRouter, router)
        assert isinstance(router.needs_headers, bool)

    def test_new_router_has_no_bindings(self, router: IRouter) -> None:
        """A new router has no bindings and routes nothing."""
        assert len(router) == 0
        assert list(router.bindings()) == []
        assert _routed(router, self.matching_key) == set()

    def test_bind_of_a_new_binding_returns_true(self, router: IRouter) -> None:
        """``bind`` answers ``True`` for a binding it did not have."""
        example = self.matching_key
        assert router.bind("q1", example.binding_key, example.arguments) is True
        assert len(router) == 1

    def test_bind_is_idempotent(self, router: IRouter) -> None:
        """Binding again answers ``False`` and changes nothing."""
        example = self.matching_key
        router.bind("q1", example.binding_key, example.arguments)
        assert router.bind("q1", example.binding_key, dict(example.arguments)) is False
        assert len(router) == 1
        assert len(list(router.bindings())) == 1
        assert _routed(router, example) == {"q1"}

    def test_bound_destination_is_routed_and_unbound_is_not(self, router: IRouter) -> None:
        """A matching message goes to bound destinations only."""
        example = self.matching_key
        router.bind("q1", example.binding_key, example.arguments)
        assert _routed(router, example) == {"q1"}
        router.bind("q2", example.binding_key, example.arguments)
        assert _routed(router, example) == {"q1", "q2"}

    def test_unbind_removes_the_binding(self, router: IRouter) -> None:
        """After ``unbind`` the destination is no longer routed to."""
        example = self.matching_key
        router.bind("q1", example.binding_key, example.arguments)
        router.bind("q2", example.binding_key, example.arguments)
        assert router.unbind("q1", example.binding_key, dict(example.arguments)) is True
        assert len(router) == 1
        assert _routed(router, example) == {"q2"}
        assert router.unbind("q2", example.binding_key, example.arguments) is True
        assert len(router) == 0
        assert _routed(router, example) == set()

    def test_unbind_of_a_missing_binding_returns_false(self, router: IRouter) -> None:
        """``unbind`` of a binding not there answers ``False`` and changes nothing."""
        example = self.matching_key
        assert router.unbind("q1", example.binding_key, example.arguments) is False
        router.bind("q1", example.binding_key, example.arguments)
        assert router.unbind("q2", example.binding_key, example.arguments) is False
        assert router.unbind("q1", example.binding_key + ".other", example.arguments) is False
        assert router.unbind("q1", example.binding_key, _with(example.arguments, x_contract=1)) is False
        assert len(router) == 1
        assert _routed(router, example) == {"q1"}
        router.unbind("q1", example.binding_key, example.arguments)
        assert router.unbind("q1", example.binding_key, example.arguments) is False
        assert len(router) == 0

    def test_bindings_differing_only_in_arguments_are_distinct(self, router: IRouter) -> None:
        """Arguments are part of a binding's identity."""
        example = self.matching_key
        first = _with(example.arguments, x_contract=1)
        second = _with(example.arguments, x_contract=2)
        assert router.bind("q1", example.binding_key, first) is True
        assert router.bind("q1", example.binding_key, second) is True
        assert len(router) == 2
        router.unbind("q1", example.binding_key, first)
        assert len(router) == 1
        assert _routed(router, example) == {"q1"}

    def test_boolean_and_integer_arguments_are_distinct(self, router: IRouter) -> None:
        """``True`` and ``1`` are different argument values, as in AMQP."""
        example = self.matching_key
        assert router.bind("q1", example.binding_key, _with(example.arguments, x_contract=1)) is True
        assert router.bind("q1", example.binding_key, _with(example.arguments, x_contract=True)) is True
        assert len(router) == 2

    def test_unhashable_arguments_are_accepted(self, router: IRouter) -> None:
        """Arguments may hold arrays, tables, byte arrays and NaN."""
        example = self.matching_key
        arguments = _with(
            example.arguments,
            x_contract=[1, "two", {"three": [b"4", bytearray(b"5")]}, Decimal("6.0"), float("nan")],
        )
        assert router.bind("q1", example.binding_key, arguments) is True
        assert router.bind("q1", example.binding_key, _with(arguments)) is False
        assert _routed(router, example) == {"q1"}
        assert router.unbind("q1", example.binding_key, _with(arguments)) is True
        assert len(router) == 0

    def test_unbind_all_removes_every_binding_of_the_destination(self, router: IRouter) -> None:
        """``unbind_all`` removes and counts every binding to one destination."""
        example = self.matching_key
        router.bind("q1", example.binding_key, example.arguments)
        router.bind("q1", example.binding_key, _with(example.arguments, x_contract=1))
        router.bind("q1", example.binding_key + ".other", example.arguments)
        router.bind("q2", example.binding_key, example.arguments)
        assert router.unbind_all("q1") == 3
        assert len(router) == 1
        assert _routed(router, example) == {"q2"}
        assert [destination for destination, _key, _arguments in router.bindings()] == ["q2"]
        assert router.unbind_all("q1") == 0

    def test_unbind_all_of_an_unknown_destination_returns_zero(self, router: IRouter) -> None:
        """``unbind_all`` of a destination with no bindings is a no-op."""
        example = self.matching_key
        assert router.unbind_all("q1") == 0
        router.bind("q1", example.binding_key, example.arguments)
        assert router.unbind_all("q2") == 0
        assert len(router) == 1

    def test_bindings_round_trip(self, router: IRouter) -> None:
        """``bindings()`` reports what was bound, in a form ``bind`` and ``unbind`` accept."""
        example = self.matching_key
        bound: list[tuple[Hashable, str, Mapping[str, Any]]] = [
            ("q1", example.binding_key, dict(example.arguments)),
            ("q2", example.binding_key, dict(example.arguments)),
            (("exchange", "e1"), example.binding_key, _with(example.arguments, x_contract={"a": [1]})),
            ("q1", example.binding_key + ".other", dict(example.arguments)),
        ]
        for destination, key, arguments in bound:
            router.bind(destination, key, arguments)
        reported = list(router.bindings())
        assert _same_bindings(reported, bound)
        for destination, routing_key, table in reported:
            assert router.bind(destination, routing_key, table) is False
        for destination, routing_key, table in reported:
            assert router.unbind(destination, routing_key, table) is True
        assert len(router) == 0
        assert list(router.bindings()) == []

    def test_route_never_raises(self, router: IRouter) -> None:
        """Routing survives any routing key and any header values."""
        example = self.matching_key
        router.bind("q1", example.binding_key, example.arguments)
        names = [*example.arguments, *(example.headers or {}), "x-match", ""]
        header_tables: list[Mapping[str, Any] | None] = [None, {}, example.headers]
        header_tables += [{name: value for name in names} for value in _UNUSUAL_HEADER_VALUES]
        for routing_key in (*_UNUSUAL_ROUTING_KEYS, example.routing_key):
            for headers in header_tables:
                list(router.route(routing_key, headers))
        assert _routed(router, example) == {"q1"}

"""Tests for exchanges.direct: the contract, and exact-key routing."""

from __future__ import annotations

import pytest
from zope.interface.verify import verifyObject

from postroom.exchanges.direct import DirectExchangeType, DirectRouter
from postroom.exchanges.interfaces import IExchangeType, IRouter
from postroom.exchanges.testing import RouterContract, RoutingExample


class TestDirectRouter(RouterContract):
    matching_key = RoutingExample("orders.created", {}, "orders.created", None)

    @pytest.fixture
    def router(self) -> IRouter:
        return DirectExchangeType().new_router({})


def test_exchange_type_provides_iexchangetype() -> None:
    exchange_type = DirectExchangeType()
    assert verifyObject(IExchangeType, exchange_type)
    assert exchange_type.name == "direct"
    exchange_type.validate_arguments({"alternate-exchange": "ae", "anything": [1]})
    assert isinstance(exchange_type.new_router({}), DirectRouter)


@pytest.mark.parametrize(
    ("binding_key", "routing_key", "routed"),
    [
        ("a", "a", True),
        ("a", "b", False),
        ("a", "A", False),
        ("a", "a.b", False),
        ("a.b", "a", False),
        ("", "", True),
        ("", "a", False),
        ("*", "a", False),
        ("#", "a", False),
        ("*", "*", True),
        ("ünï", "ünï", True),
        ("a ", "a", False),
    ],
)
def test_routes_only_on_the_exact_binding_key(binding_key: str, routing_key: str, routed: bool) -> None:
    router = DirectRouter()
    router.bind("q", binding_key, {})
    assert set(router.route(routing_key, None)) == ({"q"} if routed else set())


def test_arguments_do_not_affect_routing() -> None:
    router = DirectRouter()
    router.bind("q", "k", {"x-match": "any", "a": 1})
    assert set(router.route("k", {})) == {"q"}
    assert set(router.route("k", {"a": 2})) == {"q"}


def test_headers_are_ignored() -> None:
    router = DirectRouter()
    router.bind("q", "k", {})
    assert set(router.route("k", {"k": "v"})) == {"q"}
    assert set(router.route("other", {"k": "v"})) == set()
    assert router.needs_headers is False


def test_destination_bound_twice_under_one_key_is_routed_once() -> None:
    router = DirectRouter()
    router.bind("q", "k", {"x-a": 1})
    router.bind("q", "k", {"x-a": 2})
    assert list(router.route("k", None)) == ["q"]


def test_destination_bound_under_two_keys_is_routed_by_each() -> None:
    router = DirectRouter()
    router.bind("q", "k1", {})
    router.bind("q", "k2", {})
    router.unbind("q", "k1", {})
    assert set(router.route("k1", None)) == set()
    assert set(router.route("k2", None)) == {"q"}


def test_unbind_all_leaves_other_keys_and_destinations() -> None:
    router = DirectRouter()
    router.bind("q1", "k", {})
    router.bind("q2", "k", {})
    router.bind("q1", "j", {})
    assert router.unbind_all("q1") == 2
    assert set(router.route("k", None)) == {"q2"}
    assert set(router.route("j", None)) == set()
    assert len(router) == 1

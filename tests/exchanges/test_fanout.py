"""Tests for exchanges.fanout: the contract, and routing to everything bound."""

from __future__ import annotations

import pytest
from zope.interface.verify import verifyObject

from postroom.exchanges.fanout import FanoutExchangeType, FanoutRouter
from postroom.exchanges.interfaces import IExchangeType, IRouter
from postroom.exchanges.testing import RouterContract, RoutingExample


class TestFanoutRouter(RouterContract):
    matching_key = RoutingExample("ignored", {}, "anything.at.all", None)

    @pytest.fixture
    def router(self) -> IRouter:
        return FanoutExchangeType().new_router({})


def test_exchange_type_provides_iexchangetype() -> None:
    exchange_type = FanoutExchangeType()
    assert verifyObject(IExchangeType, exchange_type)
    assert exchange_type.name == "fanout"
    exchange_type.validate_arguments({"anything": {"nested": [1]}})
    assert isinstance(exchange_type.new_router({}), FanoutRouter)


@pytest.mark.parametrize("routing_key", ["", "k", "other", "#", "a.b.c", "x" * 255])
def test_routes_to_every_destination_whatever_the_key(routing_key: str) -> None:
    router = FanoutRouter()
    router.bind("q1", "k", {})
    router.bind("q2", "", {})
    router.bind("q3", "#", {"x-match": "any"})
    assert set(router.route(routing_key, None)) == {"q1", "q2", "q3"}
    assert router.needs_headers is False


def test_destination_bound_under_several_keys_is_routed_once() -> None:
    router = FanoutRouter()
    router.bind("q", "a", {})
    router.bind("q", "b", {})
    router.bind("q", "a", {"x-a": 1})
    assert list(router.route("z", None)) == ["q"]


def test_destination_stays_routed_until_its_last_binding_is_removed() -> None:
    router = FanoutRouter()
    router.bind("q", "a", {})
    router.bind("q", "b", {})
    router.unbind("q", "a", {})
    assert list(router.route("z", None)) == ["q"]
    router.unbind("q", "b", {})
    assert list(router.route("z", None)) == []

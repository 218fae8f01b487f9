"""Tests for exchanges.registry: built-in types, lookups and plugin registration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from zope.interface import Invalid, implementer
from zope.interface.verify import verifyObject

from postroom.exchanges.fanout import FanoutRouter
from postroom.exchanges.interfaces import IExchangeType, IRouter
from postroom.exchanges.registry import ExchangeTypeRegistry, InvalidExchangeType, default_registry


@implementer(IExchangeType)
class EverythingExchangeType:
    """A plugin-style type: routes like fanout under another name."""

    name = "x-everything"

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        pass

    def new_router(self, arguments: Mapping[str, Any]) -> IRouter:
        return FanoutRouter()


def test_default_registry_holds_the_four_built_in_types() -> None:
    assert default_registry().names() == ["direct", "fanout", "headers", "topic"]


@pytest.mark.parametrize("name", ["direct", "fanout", "topic", "headers"])
def test_built_in_types_provide_iexchangetype_and_make_irouters(name: str) -> None:
    exchange_type = default_registry().get(name)
    assert verifyObject(IExchangeType, exchange_type)
    assert exchange_type.name == name
    router = exchange_type.new_router({})
    assert verifyObject(IRouter, router)
    assert len(router) == 0
    assert router.needs_headers is (name == "headers")


def test_each_new_router_is_independent() -> None:
    exchange_type = default_registry().get("direct")
    first = exchange_type.new_router({})
    second = exchange_type.new_router({})
    first.bind("q", "k", {})
    assert len(second) == 0


@pytest.mark.parametrize("name", ["x-unknown", "", "Direct", "direct "])
def test_unknown_name_raises_invalid_exchange_type(name: str) -> None:
    registry = default_registry()
    with pytest.raises(InvalidExchangeType) as excinfo:
        registry.get(name)
    assert isinstance(excinfo.value, LookupError)
    assert excinfo.value.name == name
    assert str(excinfo.value) == f"invalid exchange type '{name}'"


def test_registered_plugin_type_can_be_looked_up() -> None:
    registry = default_registry()
    plugin = EverythingExchangeType()
    registry.register(plugin)
    assert registry.get("x-everything") is plugin
    assert "x-everything" in registry.names()


def test_default_registries_are_independent() -> None:
    default_registry().register(EverythingExchangeType())
    assert "x-everything" not in default_registry().names()


def test_registering_a_taken_name_is_refused() -> None:
    registry = default_registry()

    @implementer(IExchangeType)
    class FakeDirect(EverythingExchangeType):
        name = "direct"

    with pytest.raises(ValueError) as excinfo:
        registry.register(FakeDirect())
    assert "direct" in str(excinfo.value)
    assert registry.get("direct").new_router({}).__class__.__name__ == "DirectRouter"


def test_registering_an_object_not_providing_iexchangetype_is_refused() -> None:
    registry = ExchangeTypeRegistry()

    class NotAType:
        name = "broken"

    with pytest.raises(Invalid):
        registry.register(NotAType())  # type: ignore[arg-type]
    assert registry.names() == []


def test_registering_an_empty_name_is_refused() -> None:
    registry = ExchangeTypeRegistry()

    @implementer(IExchangeType)
    class Nameless(EverythingExchangeType):
        name = ""

    with pytest.raises(ValueError):
        registry.register(Nameless())
    assert registry.names() == []


def test_new_registry_is_empty() -> None:
    registry = ExchangeTypeRegistry()
    assert registry.names() == []
    with pytest.raises(InvalidExchangeType):
        registry.get("direct")

"""Tests for exchanges.binding: binding identity over AMQP tables, and the binding record."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from postroom.exchanges.binding import BindingTable, arguments_key
from postroom.exchanges.direct import DirectRouter
from postroom.exchanges.fanout import FanoutRouter
from postroom.exchanges.headers import HeadersRouter
from postroom.exchanges.interfaces import IRouter
from postroom.exchanges.topic import TopicRouter

NOW = datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({}, {}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({"a": [1, {"b": b"x"}]}, {"a": [1, {"b": b"x"}]}),
        ({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}}),
        ({"a": b"x"}, {"a": bytearray(b"x")}),
        ({"a": float("nan")}, {"a": float("nan")}),
        ({"a": Decimal("1.5")}, {"a": Decimal("1.5")}),
        ({"a": NOW}, {"a": NOW}),
        ({"a": None}, {"a": None}),
        ({"a": [1, 2]}, {"a": (1, 2)}),
    ],
)
def test_equal_tables_give_equal_keys(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert arguments_key(left) == arguments_key(right)
    assert hash(arguments_key(left)) == hash(arguments_key(right))


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": 1}, {"a": 2}),
        ({"a": 1}, {"b": 1}),
        ({"a": 1}, {}),
        ({"a": True}, {"a": 1}),
        ({"a": False}, {"a": 0}),
        ({"a": 1}, {"a": 1.0}),
        ({"a": "x"}, {"a": b"x"}),
        ({"a": "1"}, {"a": 1}),
        ({"a": None}, {"a": "void"}),
        ({"a": None}, {}),
        ({"a": Decimal("1.0")}, {"a": Decimal("1.00")}),
        ({"a": Decimal("1")}, {"a": 1}),
        ({"a": 0.0}, {"a": -0.0}),
        ({"a": [1, 2]}, {"a": [2, 1]}),
        ({"a": [True]}, {"a": [1]}),
        ({"a": {"b": True}}, {"a": {"b": 1}}),
        ({"a": [1]}, {"a": {"0": 1}}),
        ({"a": "table"}, {"a": {}}),
    ],
)
def test_different_tables_give_different_keys(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert arguments_key(left) != arguments_key(right)


def test_key_of_awkward_values_is_hashable() -> None:
    key = arguments_key({"a": Decimal("sNaN"), "b": {1, 2}, "c": [bytearray(b"x"), {"d": []}], "e": object()})
    hash(key)


def test_binding_table_counts_and_reports_bindings() -> None:
    table = BindingTable()
    assert table.add("q1", "k", arguments_key({}), {}) is True
    assert table.add("q1", "k", arguments_key({}), {}) is False
    assert table.add("q1", "j", arguments_key({"a": 1}), {"a": 1}) is True
    assert table.add("q2", "k", arguments_key({}), {}) is True
    assert len(table) == 3
    assert set(table.destinations()) == {"q1", "q2"}
    assert table.remove("q2", "k", arguments_key({})) is True
    assert table.remove("q2", "k", arguments_key({})) is False
    assert list(table.destinations()) == ["q1"]
    removed = table.pop_destination("q1")
    assert sorted((key, arguments) for key, _arguments_key, arguments in removed) == [
        ("j", {"a": 1}),
        ("k", {}),
    ]
    assert len(table) == 0
    assert list(table) == []
    assert table.pop_destination("q1") == []


@pytest.mark.parametrize("router_class", [DirectRouter, FanoutRouter, TopicRouter, HeadersRouter])
def test_bindings_report_arguments_as_bound_even_if_the_caller_mutates_them(router_class: type) -> None:
    router: IRouter = router_class()
    arguments: dict[str, Any] = {"a": 1}
    router.bind("q", "k", arguments)
    arguments["a"] = 2
    assert list(router.bindings()) == [("q", "k", {"a": 1})]
    assert router.unbind("q", "k", {"a": 1}) is True

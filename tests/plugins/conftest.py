"""Fixtures for plugin tests: nodes with plugins loaded, on a Clock or on the test broker's reactor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nodes import plugin_node
from twisted.internet import threads
from twisted.internet.task import Clock

from postroom.broker.core.node import Node
from postroom.config.schema import PluginConfig


@pytest.fixture
def clocked() -> Callable[..., tuple[Node, Clock]]:
    """``clocked(*plugin names)``: a ready node with those plugins on a fresh ``Clock``."""

    def make(*names: str | PluginConfig) -> tuple[Node, Clock]:
        clock = Clock()
        node, loaded = plugin_node(names, clock)
        loaded.node_ready(node)
        return node, clock

    return make


@pytest.fixture
def plugin_broker(make_broker: Callable[..., Any], broker_reactor: Any) -> Callable[..., Any]:
    """``plugin_broker(*plugin names)``: a broker on loopback with those plugins loaded."""

    def make(*names: str | PluginConfig) -> Any:
        def build() -> Node:
            node, loaded = plugin_node(names, broker_reactor)
            loaded.node_ready(node)
            return node

        return make_broker(threads.blockingCallFromThread(broker_reactor, build))

    return make

"""Nodes with plugins loaded, as ``make_broker_service`` builds them, for the plugin tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.server.pluginloader import LoadedPlugins, load_plugins
from postroom.broker.tools.testing import Client
from postroom.config.schema import PluginConfig


def plugin_node(
    names: Sequence[str | PluginConfig], clock: Any = None, journal: Journal | None = None
) -> tuple[Node, LoadedPlugins]:
    """A node with the named plugins installed (as ``make_broker_service`` does), not yet ready."""
    configs = [name if isinstance(name, PluginConfig) else PluginConfig(name) for name in names]
    loaded = load_plugins(configs, clock)
    node = Node(
        rng=random.Random(7),
        clock=clock,
        registry=loaded.registry,
        hooks=loaded.hooks,
        authenticators=loaded.authenticators,
    )
    if journal is not None:
        node.set_journal(journal)
    return node, loaded


def client(node: Node) -> Client:
    """A handshaken sans-IO client with channel 1 open."""
    c = Client(node)
    c.handshake()
    c.open_channel(1)
    return c

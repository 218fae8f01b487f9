"""Finding, checking and installing the plugins a configuration enables.

A name under ``plugins:`` is resolved, in this order, as

1. a bundled plugin: an :class:`~broker.interfaces.IBrokerPlugin` (and ``twisted.plugin.IPlugin``)
   in a module of the ``plugins`` package, found by ``twisted.plugin.getPlugins``, by its
   ``name`` (``delayed_message``);
2. an installed package's entry point in the group ``postroom.plugins`` of that name;
3. a dotted module path (``mycompany.postroom_audit``): the module's ``plugin`` attribute, or
   the one object in it that provides ``IBrokerPlugin``.

Plugins are installed in the order listed. A plugin's ``requires`` must name plugins listed
before it: the order is the configuration's, never guessed. Anything wrong (a module that
does not import, an object that does not provide the interface, settings the plugin refuses,
a missing dependency, an exchange type name already taken) is a :class:`PluginError`: a
:class:`~config.loader.ConfigError` naming the file, the line, the plugin and the reason, and
the broker does not start.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.application.service import IService
from twisted.logger import Logger
from twisted.plugin import getPlugins
from zope.interface import Invalid, implementer
from zope.interface.verify import verifyObject

from postroom.broker.core.hooks import HookChain
from postroom.broker.interfaces import (
    IAuthenticator,
    IBrokerPlugin,
    IMessageHook,
    IPluginContext,
    PluginSettingsInvalid,
)
from postroom.config.schema import PluginConfig
from postroom.config.values import ConfigError, Problem
from postroom.exchanges.interfaces import IExchangeType
from postroom.exchanges.registry import ExchangeTypeRegistry, default_registry

if TYPE_CHECKING:
    from postroom.broker.core.node import Node
    from postroom.broker.wal.recovery import Snapshot

__all__ = [
    "ENTRY_POINT_GROUP",
    "AvailablePlugin",
    "LoadedPlugins",
    "PluginContext",
    "PluginError",
    "available_plugins",
    "describe",
    "find_plugin",
    "load_plugins",
]

#: The entry point group installed packages declare their plugins in.
ENTRY_POINT_GROUP = "postroom.plugins"

_log = Logger()


class PluginError(ConfigError):
    """A plugin could not be loaded; the broker does not start.

    :param name: the plugin's name as listed
    :param reason: what went wrong
    """

    def __init__(
        self, name: str, reason: str, source: str = "<configuration>", line: int | None = None, index: int = 0
    ) -> None:
        self.name = name
        self.reason = reason
        super().__init__(source, [Problem(line, f"plugins[{index}]", f"plugin '{name}': {reason}")])


@dataclass(frozen=True, slots=True)
class AvailablePlugin:
    """A plugin that could be enabled, and where it comes from (``bundled``, ``entry point ...``)."""

    name: str
    description: str
    origin: str


def _bundled() -> list[IBrokerPlugin]:
    from postroom import plugins
    return list(getPlugins(IBrokerPlugin, plugins))


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def available_plugins() -> list[AvailablePlugin]:
    """Every bundled plugin and every installed entry point, by name.

    An entry point that fails to load is listed with the reason as its description.
    """
    found = {plugin.name: AvailablePlugin(plugin.name, plugin.description, "bundled") for plugin in _bundled()}
    for entry_point in _entry_points():
        if entry_point.name in found:
            continue
        try:
            plugin = _provider(entry_point.load(), entry_point.name)
            description = plugin.description
        except PluginError as error:
            description = f"(broken: {error.reason})"
        except Exception as error:  # a third-party import can raise anything
            description = f"(broken: {type(error).__name__}: {error})"
        found[entry_point.name] = AvailablePlugin(entry_point.name, description, f"entry point {entry_point.value}")
    return sorted(found.values(), key=lambda plugin: plugin.name)


def _provider(thing: Any, name: str) -> IBrokerPlugin:
    """The plugin object in ``thing`` (a plugin itself, or a module holding one)."""
    if isinstance(thing, types.ModuleType):
        candidate = getattr(thing, "plugin", None)
        if candidate is None:
            providers = [value for value in vars(thing).values() if IBrokerPlugin.providedBy(value)]
            if len(providers) != 1:
                raise PluginError(
                    name,
                    f"module '{thing.__name__}' has {len(providers)} objects providing IBrokerPlugin "
                    "and no 'plugin' attribute (expected exactly one)",
                )
            candidate = providers[0]
        thing = candidate
    try:
        verifyObject(IBrokerPlugin, thing)
    except Invalid as error:
        raise PluginError(name, f"{thing!r} does not provide IBrokerPlugin: {error}") from error
    plugin: IBrokerPlugin = thing
    return plugin


def find_plugin(name: str) -> tuple[IBrokerPlugin, str]:
    """Resolve ``name`` to a plugin object and say where it came from.

    :raises PluginError: nothing of that name, or it fails to import, or it is no plugin.
    """
    for plugin in _bundled():
        if plugin.name == name:
            return _provider(plugin, name), f"bundled module {type(plugin).__module__}"
    for entry_point in _entry_points():
        if entry_point.name == name:
            try:
                loaded = entry_point.load()
            except Exception as error:
                raise PluginError(
                    name, f"entry point {entry_point.value} fails to import: {type(error).__name__}: {error}"
                ) from error
            return _provider(loaded, name), f"entry point {entry_point.value}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            bundled = ", ".join(sorted(plugin.name for plugin in _bundled())) or "none"
            raise PluginError(
                name,
                f"no bundled plugin, '{ENTRY_POINT_GROUP}' entry point or module of that name (bundled: {bundled})",
            ) from error
        raise PluginError(name, f"module '{name}' fails to import: {type(error).__name__}: {error}") from error
    except Exception as error:
        raise PluginError(name, f"module '{name}' fails to import: {type(error).__name__}: {error}") from error
    return _provider(module, name), f"module {name}"


@implementer(IPluginContext)
class PluginContext:
    """What plugins add while they are installed; see :class:`broker.interfaces.IPluginContext`."""

    def __init__(self, reactor: Any, registry: ExchangeTypeRegistry) -> None:
        self.reactor = reactor
        self.registry = registry
        self.node: Node | None = None
        self.hooks: list[IMessageHook] = []
        self.authenticators: list[IAuthenticator] = []
        self.services: list[IService] = []
        self.ready: list[Callable[[Node, Snapshot | None], None]] = []

    def add_exchange_type(self, exchange_type: IExchangeType) -> None:
        """Register an exchange type (see ``ExchangeTypeRegistry.register``)."""
        self.registry.register(exchange_type)

    def add_hook(self, hook: IMessageHook) -> None:
        """Add a message hook (checked against :class:`IMessageHook`)."""
        verifyObject(IMessageHook, hook)
        self.hooks.append(hook)

    def add_authenticator(self, authenticator: IAuthenticator) -> None:
        """Add an authentication backend (checked against :class:`IAuthenticator`)."""
        verifyObject(IAuthenticator, authenticator)
        self.authenticators.append(authenticator)

    def add_service(self, service: IService) -> None:
        """Run ``service`` with the broker."""
        verifyObject(IService, service)
        self.services.append(service)

    def when_ready(self, callback: Callable[[Node, Snapshot | None], None]) -> None:
        """Call ``callback(node, snapshot)`` once the node is built."""
        self.ready.append(callback)


@dataclass
class LoadedPlugins:
    """The installed plugins and what they added, ready to be given to the node."""

    context: PluginContext
    #: ``(plugin, origin)`` in load order.
    plugins: list[tuple[IBrokerPlugin, str]] = field(default_factory=list)

    @property
    def registry(self) -> ExchangeTypeRegistry:
        """Built-in exchange types and the plugins'."""
        return self.context.registry

    @functools.cached_property
    def hooks(self) -> HookChain | None:
        """The plugins' message hooks, or ``None`` when there are none (so the hot path skips them).

        Read once all plugins are installed: hooks added later are not in it.
        """
        if not self.context.hooks:
            return None
        chain = HookChain(self.context.hooks)

        def failed(hook: IMessageHook, event: str) -> None:
            _log.failure("message hook {hook!r} failed in {event}", hook=hook, event=event)

        chain.on_error = failed
        return chain

    @property
    def authenticators(self) -> tuple[IAuthenticator, ...]:
        """The plugins' authentication backends, in load order."""
        return tuple(self.context.authenticators)

    @property
    def services(self) -> list[IService]:
        """Services to start with the broker."""
        return self.context.services

    @property
    def names(self) -> list[str]:
        """The loaded plugins' names, in load order."""
        return [plugin.name for plugin, _origin in self.plugins]

    def node_ready(self, node: Node, snapshot: Snapshot | None = None) -> None:
        """The node is built: tell the plugins that asked (``when_ready``)."""
        self.context.node = node
        for callback in self.context.ready:
            callback(node, snapshot)


def load_plugins(
    configs: Sequence[PluginConfig],
    reactor: Any = None,
    registry: ExchangeTypeRegistry | None = None,
    source: str = "<configuration>",
) -> LoadedPlugins:
    """Find, check and install ``configs`` in order; log one line per plugin.

    :param registry: the exchange types to add to (a new default registry when omitted)
    :raises PluginError: a plugin cannot be loaded (the first one found wrong; nothing started)
    """
    context = PluginContext(reactor, registry if registry is not None else default_registry())
    loaded = LoadedPlugins(context)
    for index, config in enumerate(configs):

        def fail(reason: str, config: PluginConfig = config, index: int = index) -> PluginError:
            return PluginError(config.name, reason, source, config.line, index)

        try:
            plugin, origin = find_plugin(config.name)
        except PluginError as error:
            raise fail(error.reason) from error
        names = loaded.names
        if plugin.name in names:
            raise fail(f"plugin '{plugin.name}' is already loaded")
        missing = [name for name in plugin.requires if name not in names]
        if missing:
            raise fail(
                f"requires {', '.join(repr(name) for name in missing)}: list "
                f"{'it' if len(missing) == 1 else 'them'} before '{config.name}' under plugins:"
            )
        try:
            settings = plugin.check_settings(dict(config.settings))
        except PluginSettingsInvalid as error:
            raise fail(f"invalid settings: {error}") from error
        except Exception as error:
            raise fail(f"invalid settings: {type(error).__name__}: {error}") from error
        try:
            plugin.install(context, settings)
        except Exception as error:
            raise fail(f"failed to install: {type(error).__name__}: {error}") from error
        loaded.plugins.append((plugin, origin))
        _log.info(
            "plugin {plugin} loaded from {origin}: {description}",
            plugin=plugin.name,
            origin=origin,
            description=plugin.description,
        )
    return loaded


def describe(plugins: Iterable[tuple[IBrokerPlugin, str]]) -> list[str]:
    """One line per loaded plugin: name, origin, description."""
    return [f"{plugin.name} ({origin}): {plugin.description}" for plugin, origin in plugins]

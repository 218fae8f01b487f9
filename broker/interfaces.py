"""The seams a plugin plugs into: the plugin itself, message hooks and authentication backends.

A plugin (:class:`IBrokerPlugin`) is found by the loader (``broker.server.pluginloader``), its
settings are checked, then :meth:`IBrokerPlugin.install` is called with a
:class:`IPluginContext` through which it adds what it brings: exchange types
(``exchanges.interfaces.IExchangeType``), message hooks (:class:`IMessageHook`),
authentication backends (:class:`IAuthenticator`) and start-up/shutdown services
(``twisted.application.service.IService``).

This module is pure (``zope.interface`` only): the broker core and plugins both import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zope.interface import Attribute, Interface


class PluginSettingsInvalid(ValueError):
    """A plugin refused its settings; the message says which setting and why.

    The loader reports it as ``plugin 'name': invalid settings: <message>`` and the broker
    does not start.
    """


class IBrokerPlugin(Interface):
    """A Postroom plugin, as listed under ``plugins:`` in the configuration.

    A plugin module makes one object providing this interface (and, for discovery through
    ``twisted.plugin``, ``twisted.plugin.IPlugin``) at module level.
    """

    name = Attribute("The short name used under 'plugins:' in the YAML, e.g. 'delayed_message'.")
    description = Attribute("One line saying what the plugin adds (shown by 'postroom plugins').")
    requires = Attribute("Names of plugins that must be enabled and listed before this one (a tuple, often empty).")

    def check_settings(settings: Mapping[str, Any]) -> Any:
        """Validate the plugin's ``settings`` mapping from the YAML and return the value
        :meth:`install` receives (the mapping itself, or a parsed form of it).

        :raises PluginSettingsInvalid: a setting is unknown, missing or has a bad value.
        """

    def install(context: IPluginContext, settings: Any) -> None:
        """Add the plugin's parts to the broker being built, through ``context``.

        Called once at start-up, in load order, before the write-ahead log is replayed (so
        durable exchanges of a plugin's type can be restored).
        """


class IPluginContext(Interface):
    """What :meth:`IBrokerPlugin.install` may add to the broker being built."""

    reactor = Attribute("The reactor (timers, listening); a Clock or MemoryReactorClock in tests.")
    node = Attribute("The broker node once built (None while plugins are being installed).")
    registry = Attribute("The exchange types registered so far (built-ins and earlier plugins').")

    def add_exchange_type(exchange_type: Any) -> None:
        """Register an ``exchanges.interfaces.IExchangeType``.

        :raises ValueError: its name is already taken (a built-in or another plugin's type).
        """

    def add_hook(hook: IMessageHook) -> None:
        """Call ``hook`` for messages being published, routed, delivered, acked and dead-lettered."""

    def add_authenticator(authenticator: IAuthenticator) -> None:
        """Ask ``authenticator`` about logins the configured users do not accept."""

    def add_service(service: Any) -> None:
        """Start ``service`` (an ``IService``) with the broker, before the listeners; stop it with it."""

    def when_ready(callback: Any) -> None:
        """Call ``callback(node, snapshot)`` once the node is built and the log's state restored.

        ``snapshot`` is the ``broker.wal.recovery.Snapshot`` the log held at start (``None``
        without a log); it is only valid during the call.
        """


class IMessageHook(Interface):
    """Sees messages on their way through the broker.

    Hooks are called synchronously on the reactor thread, in the order the plugins were
    loaded; they must be quick. A hook that does not care about an event still has the method
    (subclass :class:`broker.hooks.MessageHook` for no-op defaults). When no plugin adds a
    hook, the broker does not call anything: its hot path checks one attribute.

    Only :meth:`published` may refuse a message, by raising
    ``broker.errors.ChannelException`` (the channel is closed with that code, as for any
    refused publish); an exception from the other methods is logged and otherwise ignored.
    """

    def published(vhost: Any, exchange: str, message: Any) -> None:
        """A message arrived at ``exchange`` (``""`` for the default exchange) of ``vhost``."""

    def routed(vhost: Any, exchange: str, message: Any, queues: Sequence[Any]) -> None:
        """A message published to ``exchange`` was routed to ``queues`` (maybe none)."""

    def delivered(queue: Any, entries: Sequence[Any]) -> None:
        """Entries (``broker.core.queue.Entry``: ``message``, ``redelivered`` ...) of ``queue``
        were delivered to a consumer or by ``basic.get``."""

    def acked(entries: Sequence[Any]) -> None:
        """A client acknowledged these entries (each knows its ``queue``)."""

    def dead_lettered(queue: Any, message: Any, reason: str) -> None:
        """``message`` left ``queue`` for its dead-letter exchange; ``reason`` is ``rejected``,
        ``expired``, ``maxlen`` or ``delivery_limit``. ``message`` is the copy with ``x-death``."""


class IAuthenticator(Interface):
    """An authentication backend, asked after the configured users (as RabbitMQ's
    ``auth_backends`` list, with the internal backend first)."""

    def authenticate(username: str, password: str, loopback: bool) -> Any:
        """Return a ``broker.core.node.User`` to let the client in, or ``None`` to refuse
        (the next backend is then asked). Called on the reactor thread: it must not block."""

"""Message hooks: plugins that see messages published, routed, delivered, acked and dead-lettered.

The node holds one :class:`HookChain` when at least one hook is registered, and ``None``
otherwise; the hot path tests that one attribute (``if hooks is not None``) and does nothing
more for a broker without hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zope.interface import implementer
from zope.interface.verify import verifyObject

from postroom.broker.interfaces import IMessageHook

__all__ = ["HookChain", "MessageHook"]


@implementer(IMessageHook)
class MessageHook:
    """A hook that does nothing: subclass it and override the events you care about."""

    def published(self, vhost: Any, exchange: str, message: Any) -> None:
        """See :meth:`broker.interfaces.IMessageHook.published`."""

    def routed(self, vhost: Any, exchange: str, message: Any, queues: Sequence[Any]) -> None:
        """See :meth:`broker.interfaces.IMessageHook.routed`."""

    def delivered(self, queue: Any, entries: Sequence[Any]) -> None:
        """See :meth:`broker.interfaces.IMessageHook.delivered`."""

    def acked(self, entries: Sequence[Any]) -> None:
        """See :meth:`broker.interfaces.IMessageHook.acked`."""

    def dead_lettered(self, queue: Any, message: Any, reason: str) -> None:
        """See :meth:`broker.interfaces.IMessageHook.dead_lettered`."""


class HookChain:
    """Every registered hook, called in registration order.

    :meth:`published` lets a hook's ``ChannelException`` through (it refuses the publish);
    any exception from the other events is handed to :attr:`on_error` (the shell logs it)
    and the next hook is still called: a broken observer must not lose messages.
    """

    def __init__(self, hooks: Sequence[IMessageHook] = ()) -> None:
        self.hooks: list[IMessageHook] = []
        #: Called with ``(hook, event name)`` inside the ``except`` block of a failed hook.
        self.on_error: Callable[[IMessageHook, str], None] | None = None
        for hook in hooks:
            self.add(hook)

    def add(self, hook: IMessageHook) -> None:
        """Append ``hook``.

        :raises zope.interface.Invalid: it does not provide :class:`IMessageHook`.
        """
        verifyObject(IMessageHook, hook)
        self.hooks.append(hook)

    def __len__(self) -> int:
        return len(self.hooks)

    def _each(self, event: str, *args: Any) -> None:
        for hook in self.hooks:
            try:
                getattr(hook, event)(*args)
            except Exception:
                if self.on_error is None:
                    raise
                self.on_error(hook, event)

    def published(self, vhost: Any, exchange: str, message: Any) -> None:
        """A message arrived at ``exchange``; a hook may refuse it by raising ``ChannelException``."""
        for hook in self.hooks:
            hook.published(vhost, exchange, message)

    def routed(self, vhost: Any, exchange: str, message: Any, queues: Sequence[Any]) -> None:
        """A message was routed to ``queues``."""
        self._each("routed", vhost, exchange, message, queues)

    def delivered(self, queue: Any, entries: Sequence[Any]) -> None:
        """Entries of ``queue`` were delivered."""
        self._each("delivered", queue, entries)

    def acked(self, entries: Sequence[Any]) -> None:
        """Entries were acknowledged."""
        self._each("acked", entries)

    def dead_lettered(self, queue: Any, message: Any, reason: str) -> None:
        """A message left ``queue`` for its dead-letter exchange."""
        self._each("dead_lettered", queue, message, reason)

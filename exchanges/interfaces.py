"""The seam every exchange type goes through, built-in or added by a plugin.

An exchange type makes routers. A router holds the bindings of one exchange and answers
"which destinations does this message go to". Destinations are opaque, hashable objects
(the broker passes queues and exchanges); a router never looks inside them.

Contract (checked for every type by :class:`exchanges.testing.RouterContract`):

* ``bind`` of an existing binding (same destination, routing key and arguments) changes nothing;
* ``unbind`` of a missing binding returns ``False`` and changes nothing;
* ``route`` may return a destination more than once; the caller removes duplicates;
* ``route`` never raises for any routing key or headers table a client can send.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Hashable

from zope.interface import Attribute, Interface


class BindingInvalid(ValueError):
    """A binding's key or arguments are not acceptable to its exchange type.

    The virtual host turns it into ``channel.close`` 406 PRECONDITION_FAILED.
    """


class IRouter(Interface):
    """The bindings of one exchange and the routing decision over them."""

    needs_headers = Attribute(
        "True when route() reads the message headers; the broker decodes the content "
        "properties only for exchanges whose router needs them."
    )

    def bind(destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Add a binding; return ``True`` if it is new.

        :raises BindingInvalid: the key or arguments are not valid for this type.
        """

    def unbind(destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Remove a binding; return ``True`` if it existed."""

    def unbind_all(destination: Hashable) -> int:
        """Remove every binding to ``destination``; return how many were removed."""

    def route(routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """Return the destinations a message with this key and headers goes to.

        Duplicates are allowed; the caller removes them.
        """

    def bindings() -> Iterable[tuple[Hashable, str, Mapping[str, Any]]]:
        """Every binding as ``(destination, routing_key, arguments)``."""

    def __len__() -> int:
        """The number of bindings."""


class IExchangeType(Interface):
    """A kind of exchange (``direct``, ``topic`` ...), as named in ``exchange.declare``."""

    name = Attribute("The type name clients use in exchange.declare, e.g. 'topic'.")

    def validate_arguments(arguments: Mapping[str, Any]) -> None:
        """Check the exchange's declare arguments.

        :raises BindingInvalid: they are not acceptable to this type.
        """

    def new_router(arguments: Mapping[str, Any]) -> IRouter:
        """Make an empty router for one exchange declared with ``arguments``."""


class IInterceptingRouter(IRouter):
    """A router that may take a message instead of routing it now (delayed messages).

    The virtual host asks :meth:`intercept` before routing each message that reaches an
    exchange with such a router (published or dead-lettered to it, or through an
    exchange-to-exchange binding); other routers cost the hot path one attribute test.
    """

    def intercept(vhost: Any, exchange: Any, message: Any) -> bool:
        """Take ``message`` (return ``True``: it is routed nowhere now) or leave it to
        :meth:`IRouter.route` (``False``).

        :param vhost: the ``broker.core.vhost.VirtualHost`` routing it
        :param exchange: the ``broker.core.vhost.Exchange`` it was published to
        """

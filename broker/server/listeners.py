"""The broker's listeners: endpoints that fail loudly, TLS around a factory, and the addresses
the stream protocol advertises."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.application.internet import StreamServerEndpointService
from twisted.internet import endpoints
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
    IProtocolFactory,
)
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer

from postroom.broker.core.node import ListenerInfo, Node
from postroom.config.schema import BrokerConfig
from postroom.config.tls import TLSProblem, server_context
from postroom.config.values import ConfigError, Problem

if TYPE_CHECKING:
    from OpenSSL import SSL

_Loaded = TypeVar("_Loaded")


def stream_addresses(config: BrokerConfig) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """The host and port the stream protocol's listener and its TLS listener advertise
    (``None`` for one that is off): the ``stream:`` section's, as RabbitMQ's
    ``stream.advertised_*`` (the TLS listener's host defaults to ``advertised_host``), else
    each listener's own (:func:`advertised`)."""
    announced, listen = config.stream, config.listen
    plain = advertised(listen.stream, announced.advertised_host, announced.advertised_port) if listen.stream else None
    secure = None
    if listen.stream_tls:
        host = announced.advertised_tls_host or announced.advertised_host
        secure = advertised(listen.stream_tls, host, announced.advertised_tls_port)
    return plain, secure


def advertised(endpoint: str, host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """The host and port a listener on ``endpoint`` tells stream clients to connect to:
    ``host`` and ``port`` when configured (``stream.advertised_*``), else its interface (the
    machine's name when it listens on all of them) and its port."""
    fields = dict(part.split("=", 1) for part in endpoint.split(":")[2:] if "=" in part)
    parts = endpoint.split(":")
    listening = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 5552
    interface = fields.get("interface", "")
    own = interface if interface not in ("", "0.0.0.0", "::") else socket.gethostname()
    return host or own, port or listening


def tls_wrapper(config: BrokerConfig, reactor: Any) -> Callable[[IProtocolFactory], IProtocolFactory] | None:
    """A function wrapping a listener's factory in TLS with the configuration's ``tls:``
    settings (``None`` without them). ``reactor`` runs the TLS layer's write batching.

    :raises ConfigError: a TLS file is missing or wrong (``config.tls.TLSProblem``, with the key)
    """
    tls = config.tls
    if tls is None:
        return None
    creator = ServerTLS(loaded(config, lambda: server_context(tls)))
    return lambda factory: TLSMemoryBIOFactory(creator, False, factory, clock=reactor)


def loaded(config: BrokerConfig, load: Callable[[], _Loaded]) -> _Loaded:
    """``load()``, which builds a TLS context from the configuration's files (the loader
    checked them; one changed since is reported as the loader reports it).

    :raises ConfigError: a file is missing or wrong, with the key that names it
    """
    try:
        return load()
    except TLSProblem as problem:
        raise ConfigError(config.source, [Problem(None, problem.key, problem.reason)]) from None


@implementer(IOpenSSLServerConnectionCreator)
class ServerTLS:
    """One TLS server connection per accepted socket, all from one context."""

    def __init__(self, context: SSL.Context) -> None:
        self.context = context

    def serverConnectionForTLS(self, protocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        from OpenSSL import SSL

        return SSL.Connection(self.context, None)


@implementer(IOpenSSLClientConnectionCreator)
class ClientTLS:
    """One TLS client connection per connection made, all from one context."""

    def __init__(self, context: SSL.Context) -> None:
        self.context = context

    def clientConnectionForTLS(self, protocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        from OpenSSL import SSL

        connection = SSL.Connection(self.context, None)
        connection.set_connect_state()
        return connection


#: The accept queue of every listener, unless its endpoint says ``backlog=``: a storm of
#: clients connecting at once (every device back after a restart) waits in it, where Twisted's
#: default of 50 overflows and leaves clients to retransmit their SYNs for a second or more.
#: RabbitMQ's default is 128; deployments with many clients raise it to 4096, as this does. The
#: kernel caps it at ``net.core.somaxconn`` (4096 on Linux since 5.4).
ACCEPT_BACKLOG = 4096


def with_backlog(description: str) -> str:
    """A listener's endpoint with :data:`ACCEPT_BACKLOG` as its accept queue, unless it names one."""
    kind = description.partition(":")[0]
    if kind in ("tcp", "tcp6", "unix") and not re.search(r"(^|:)backlog=", description):
        return f"{description}:backlog={ACCEPT_BACKLOG}"
    return description


class ListenError(SystemExit):
    """A listener could not bind: its name, its endpoint and the reason, in one line.

    A ``SystemExit``, so that under ``twistd`` too the process ends with this line and status
    1, not with a traceback.
    """


class Listener(StreamServerEndpointService):
    """A listener that fails loudly: a port in use, no permission or a bad address raises
    :class:`ListenError` from ``startService`` instead of logging a traceback and carrying on
    without the listener.

    :param kind: what it serves (``amqp``, ``metrics``, ``management``), for the message
    :param description: its Twisted endpoint string
    :param node: the node that lists it once it is bound (:attr:`Node.listeners`), as ``protocol``
    :param certificates: a TLS listener's certificate file and CA files
    """

    def __init__(
        self,
        kind: str,
        description: str,
        factory: IProtocolFactory,
        reactor: Any,
        node: Node | None = None,
        protocol: str = "",
        certificates: tuple[str, tuple[str, ...]] | None = None,
    ) -> None:
        super().__init__(endpoints.serverFromString(reactor, with_backlog(description)), factory)
        self.kind = kind
        self.description = description
        self._raiseSynchronously = True
        self._node = node
        self._protocol = protocol
        self._certificates = certificates
        self._listed: ListenerInfo | None = None

    def privilegedStartService(self) -> None:
        # twistd binds here, before dropping privileges; postroom serve through startService.
        self._refusing(super().privilegedStartService)

    def startService(self) -> None:
        self._refusing(super().startService)

    def _refusing(self, start: Callable[[], object]) -> None:
        try:
            start()
        except Exception as error:
            self.running = False
            reason = getattr(error, "socketError", None) or error
            raise ListenError(f"cannot listen for {self.kind} on {self.description}: {reason}") from None
        if self._node is not None and self._listed is None and self._waitingForPort is not None:
            self._waitingForPort.addCallback(self._list)

    def _list(self, port: IListeningPort) -> IListeningPort:
        """Add the bound socket to the node's listeners (until the listener stops)."""
        address = port.getHost()
        certfile, cacertfiles = self._certificates or (None, ())
        assert isinstance(address, IPv4Address | IPv6Address)  # (a listener on a TCP endpoint)
        self._listed = ListenerInfo(self._protocol, address.host, address.port, certfile, cacertfiles)
        if self._node is not None:
            self._node.listeners.append(self._listed)
        return port

    def stopService(self) -> Any:
        if self._listed is not None and self._node is not None and self._listed in self._node.listeners:
            self._node.listeners.remove(self._listed)
        self._listed = None
        return super().stopService()

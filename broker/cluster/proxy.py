"""A follower's listeners: each client connection is forwarded, byte for byte, to the leader's
listener of the same kind (``twisted.protocols.portforward``, with Nagle's algorithm off on
both sides, as on the broker's own sockets)."""

from __future__ import annotations

from typing import Any

from twisted.protocols import portforward

__all__ = ["LeaderProxy"]


class _ToLeader(portforward.ProxyClient):
    transport: Any

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        super().connectionMade()


class _ToLeaderFactory(portforward.ProxyClientFactory):
    protocol = _ToLeader
    noisy = False


class _FromClient(portforward.ProxyServer):
    clientProtocolFactory = _ToLeaderFactory
    transport: Any
    factory: LeaderProxy

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.factory.forwarding.add(self)
        super().connectionMade()

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.forwarding.discard(self)
        super().connectionLost(reason)


class LeaderProxy(portforward.ProxyFactory):
    """Forwards the connections it accepts to ``host:port``."""

    protocol = _FromClient
    noisy = False

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        #: The client connections being forwarded.
        self.forwarding: set[_FromClient] = set()

    def close_all(self) -> None:
        """End every forwarded connection (the leader they reach no longer leads): their
        clients reconnect, and reach the new one."""
        for protocol in list(self.forwarding):
            protocol.transport.abortConnection()

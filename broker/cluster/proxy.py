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

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        super().connectionMade()


class LeaderProxy(portforward.ProxyFactory):
    """Forwards the connections it accepts to ``host:port``."""

    protocol = _FromClient
    noisy = False

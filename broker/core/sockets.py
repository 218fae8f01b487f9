"""What the shell knows of a connection's socket, for the management API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class SocketDetails:
    """A client connection's socket, as the management API shows it (RabbitMQ's fields).

    :param host: the address it was accepted on
    :param port: the listener's port
    :param peer_host: the client's address
    :param peer_port: the client's port
    :param pending: bytes written and not yet sent (RabbitMQ's ``send_pend``), asked when shown
    :param tls: the TLS session's ``ssl_*`` and ``peer_cert_*`` fields (``None``: plain TCP)
    """

    host: str
    port: int
    peer_host: str
    peer_port: int
    pending: Callable[[], int]
    tls: Callable[[], dict[str, Any]] | None = None


#: The TLS fields of a plain TCP connection: all empty, as RabbitMQ shows them.
PLAIN_TCP: dict[str, Any] = dict.fromkeys(
    ("ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_issuer", "peer_cert_subject",
     "peer_cert_validity"),
)  # fmt: skip

"""Postroom's AMQP 0-9-1 clients: ``client`` (blocking) and ``txclient`` (Twisted).

They use the wire format (``broker.wire``) and nothing of the broker.
"""

__all__: list[str] = []

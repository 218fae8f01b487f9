"""The sans-IO AMQP 0-9-1 state machines: bytes in, method calls on the broker model, bytes out.

``connection`` and ``channel`` sit above the model (``broker.core``) and the wire format
(``broker.wire``). Nothing in this package imports Twisted or touches a socket.
"""

__all__: list[str] = []

"""The sans-IO AMQP 0-9-1 core: bytes in, method calls on the broker model, bytes out.

Nothing in this package imports Twisted or touches a socket.
"""

__all__: list[str] = []

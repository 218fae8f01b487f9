"""Postroom: an AMQP 0-9-1 routing broker on Twisted."""

__all__: list[str] = []

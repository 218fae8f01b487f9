"""The broker model: virtual hosts, exchanges, queues and consumers; no Twisted, clock injected."""

__all__: list[str] = []

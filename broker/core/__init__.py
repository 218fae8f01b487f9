"""The broker model: virtual hosts, exchanges, queues and consumers.

No reactor: time comes from an injected clock, and what must touch a socket or the log is
handed to the shell through callbacks and small interfaces. Two exceptions: ``definitions``
logs through ``twisted.logger`` (the one Twisted import here), and ``seal`` reads and writes
its key file itself.
"""

__all__: list[str] = []

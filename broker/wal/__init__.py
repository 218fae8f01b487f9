"""The write-ahead log: record format, segment files, append and replay (no Twisted here), and
a stream queue's own log of chunks (``streamlog``).

``spark/`` imports ``broker.wal.record`` to read segments, so that module uses the standard
library only; ``files`` declares its storage seam with ``zope.interface``.
"""

__all__: list[str] = []

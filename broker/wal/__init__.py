"""The write-ahead log: record format, segment files, append and replay (no Twisted here).

``spark/`` imports ``broker.wal.record`` to read segments, so that module uses the standard
library only; ``files`` declares its storage seam with ``zope.interface``.
"""

__all__: list[str] = []

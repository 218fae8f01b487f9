"""The write-ahead log: record format, segment files, append and replay (no Twisted here).

``spark/`` imports ``broker.wal.record`` to read segments, so this package uses the standard
library only.
"""

__all__: list[str] = []

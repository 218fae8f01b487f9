"""The write-ahead log: record format, segment files, append and replay (no Twisted here), and
a stream queue's own log of chunks (``streamlog``).

The record format is five modules: ``records`` (the record types), ``crc``, ``codec`` (a record's
frame and payload), ``segments`` (a segment's header, scanning) and ``chunks`` (a stream's chunk
records). ``spark/`` imports them to read segments, so they use the standard library only;
``files`` declares its storage seam with ``zope.interface``.
"""

__all__: list[str] = []

"""Where messages wait on disk: spool files of deep queues, paging of bodies back to the log,
checkpoints, the log writer and the dead-letter stream.

Above the model (``broker.core``, whose queues reach storage through the small interfaces
they declare) and the log format (``broker.wal``); below the server shell.
"""

__all__: list[str] = []

"""What the log writers share: one worker thread, one scheduled write at a time, a flush at stop.

``WALService`` (the write-ahead log) and ``DeadLetterService`` (the dead-letter event stream)
both batch records on the reactor thread and write them on a worker thread of their own.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.python.threadpool import ThreadPool


class WorkerWriter(Service):
    """A service that writes batches on its own worker thread.

    Subclasses set ``reactor``, implement :meth:`_write` (which sets ``_writing`` to the
    Deferred of the thread's work, or leaves it ``None`` when there is nothing to write) and
    :attr:`has_pending`.

    :param thread_name: the worker thread's name (shown by ``py-spy`` and in stack dumps)
    """

    reactor: Any

    def __init__(self, thread_name: str) -> None:
        #: The scheduled write, if any.
        self._call: Any = None
        #: The write in flight on the worker thread, if any.
        self._writing: defer.Deferred[Any] | None = None
        self._pool = ThreadPool(1, 1, name=thread_name)

    @property
    def has_pending(self) -> bool:
        """Whether records wait to be written."""
        raise NotImplementedError

    def _write(self) -> None:
        raise NotImplementedError

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._pool.start()

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        """Write what is pending (and sync it, as every write does), then stop the worker thread."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        while self._writing is not None:
            yield self._writing
        if self.has_pending:
            self._write()
            if self._writing is not None:
                yield self._writing
        self._pool.stop()

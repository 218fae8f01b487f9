"""Resource alarms, as RabbitMQ raises them: memory above its watermark, free disk below its limit.

:class:`ResourceMonitor` reads the broker's resident memory (``/proc/self/statm``) every
:data:`MEMORY_INTERVAL` seconds and the free space of the storage directory's filesystem every
:data:`DISK_INTERVAL` seconds, and raises or clears the node's alarms
(:meth:`broker.core.node.Node.set_alarm`): while one is in force, every connection that
publishes is blocked, and consumers go on being served so that the memory alarm clears itself.
Each edge is logged once.

A flood of publishes can add hundreds of megabytes a second, more than a reading every
:data:`MEMORY_INTERVAL` catches in time: the shell also counts the bytes it reads from clients
(:meth:`ResourceMonitor.note_read`), and memory is read again as soon as half of what was left
under the watermark at the last reading has been read since (:data:`READ_CHECK_MIN` at least),
so the alarm is raised before memory passes the watermark by more than a few reads.

Freed memory does not always leave a process: before it raises the memory alarm, and at most
once a second while it is in force, the monitor asks the C library to give free heap pages back
(``malloc_trim``), so that what it measures falls once queues drain; the pager does too once
its deep queues are drained (``broker.storage.body_paging.Pager.on_drained``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from postroom.broker.core.node import Node

__all__ = ["ResourceMonitor", "disk_free", "memory_total", "release_memory", "resident_memory"]

#: Seconds between memory readings (a flood of publishes can add hundreds of MB a second).
MEMORY_INTERVAL = 0.1
#: Seconds between free-space readings.
DISK_INTERVAL = 1.0
#: Fewest bytes read from clients between two readings of memory taken for what was read
#: (see :meth:`ResourceMonitor.note_read`).
READ_CHECK_MIN = 1 << 20
#: Seconds between two attempts to give free memory back while the memory alarm is in force.
TRIM_INTERVAL = 1.0

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_memory() -> int:
    """The broker's resident memory in bytes (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def memory_total() -> int:
    """The memory the broker may use: the machine's, or its control group's limit when lower."""
    total = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        total = os.sysconf("SC_PHYS_PAGES") * _PAGE if hasattr(os, "sysconf") else 0
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as limit_file:
                text = limit_file.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def disk_free(path: str) -> int:
    """Bytes an unprivileged process may still write on the filesystem of ``path``."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _find_malloc_trim() -> Callable[[int], Any] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim: Callable[[int], Any] = ctypes.CDLL(name).malloc_trim
        return trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _find_malloc_trim()


#: Clients gone, at least, before their memory is handed back to the system (see
#: :meth:`ResourceMonitor._return_clients_memory`).
GONE_CLIENTS = 256


def release_memory() -> None:
    """Hand freed heap back to the operating system (glibc's ``malloc_trim``), where available:
    freed memory otherwise stays with the process (after recovery, after a queue drains)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _size(value: int) -> str:
    return f"{value / 2**20:,.0f} MiB"


class ResourceMonitor(Service):
    """Watches memory and free disk for ``node`` on ``clock``.

    :param memory_limit: the memory watermark in bytes
    :param disk_path: the directory whose filesystem is watched (``None``: no disk alarm)
    :param disk_limit: the free space, in bytes, below which the disk alarm is raised
    :param read_memory: the broker's memory now (tests give their own)
    :param read_disk: free bytes for a path (tests give their own)
    :param trim: gives free memory back to the system (``None``: not available)
    """

    _log = Logger()

    def __init__(
        self,
        node: Node,
        clock: IReactorTime,
        memory_limit: int,
        disk_path: str | None = None,
        disk_limit: int = 0,
        read_memory: Callable[[], int] = resident_memory,
        read_disk: Callable[[str], int] = disk_free,
        trim: Callable[[], object] | None = release_memory if _MALLOC_TRIM is not None else None,
    ) -> None:
        self.node = node
        self.clock = clock
        self.memory_limit = memory_limit
        self.disk_path = disk_path
        self.disk_limit = disk_limit
        self._read_memory = read_memory
        self._read_disk = read_disk
        self._trim = trim
        #: The latest readings (for metrics and the management API).
        self.memory_used = 0
        self.disk_free: int | None = None
        self._next_disk = 0.0
        self._last_trim = float("-inf")
        #: The most connections open since memory was last handed back for clients gone.
        self._most_connections = 0
        #: Connections open at the last check that handed memory back while a crowd left.
        self._leaving: int | None = None
        #: Bytes that may still be read from clients before memory is read again.
        self._read_allowance = READ_CHECK_MIN
        self._call: IDelayedCall | None = None

    def startService(self) -> None:
        super().startService()
        self.check()

    def stopService(self) -> Any:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        return super().stopService()

    def note_read(self, size: int) -> None:
        """The shell read ``size`` bytes from a client: once more than was allowed since the last
        reading, read memory now (a flood is caught between two timed readings)."""
        self._read_allowance -= size
        if self._read_allowance < 0:
            self.check_memory()

    def _return_clients_memory(self) -> None:
        """Once many clients have gone (half of the most connected since the last look, and
        :data:`GONE_CLIENTS` at least), hand what they held back to the system: their buffers
        and objects are freed into the allocator's arenas, which keep them otherwise (after
        10,000 AMQP subscribers left, the broker held 204 MB against 60 MB before they came).
        A crowd leaves over several checks: memory is handed back again at each check while
        they are still leaving, and once more at the first check after the last has gone."""
        open_now = self.node.connections_open
        self._most_connections = max(self._most_connections, open_now)
        gone = self._most_connections - open_now
        if gone >= GONE_CLIENTS and gone * 2 >= self._most_connections:
            self._leaving = open_now
        elif self._leaving is None:
            return
        elif open_now < self._leaving:
            self._leaving = open_now
        else:
            self._leaving = None
        self._most_connections = open_now
        gc.collect()
        if self._trim is not None:
            self._trim()

    def check_memory(self) -> None:
        """Read memory, raise or clear the memory alarm, and allow half of what is left under
        the watermark to be read before the next reading (:meth:`note_read`)."""
        used = self._read_memory()
        if used >= self.memory_limit and self._trim is not None:
            now = self.clock.seconds()
            if now - self._last_trim >= TRIM_INTERVAL:
                self._last_trim = now
                self._trim()
                used = self._read_memory()
        self.memory_used = used
        self._read_allowance = max(READ_CHECK_MIN, (self.memory_limit - used) // 2)
        self._set("memory", used >= self.memory_limit, f"{_size(used)} used, watermark {_size(self.memory_limit)}")

    def check(self) -> None:
        """Read memory (and, when due, free disk), raise or clear the alarms, and schedule the next check."""
        now = self.clock.seconds()
        self._return_clients_memory()
        self.check_memory()
        if self.disk_path is not None and now >= self._next_disk:
            self._next_disk = now + DISK_INTERVAL
            try:
                free = self._read_disk(self.disk_path)
            except OSError as error:
                self._log.error("cannot read the free space of {path}: {error}", path=self.disk_path, error=error)
            else:
                self.disk_free = free
                self._set("disk", free < self.disk_limit, f"{_size(free)} free, limit {_size(self.disk_limit)}")
        if self.running:
            self._call = self.clock.callLater(MEMORY_INTERVAL, self.check)

    def _set(self, resource: str, active: bool, figures: str) -> None:
        if not self.node.set_alarm(resource, active):
            return
        if active:
            self._log.warn(
                "{resource} alarm set ({figures}): publishing connections are blocked",
                resource=resource,
                figures=figures,
            )
        else:
            self._log.info("{resource} alarm cleared ({figures})", resource=resource, figures=figures)

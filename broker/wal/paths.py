"""Where a stream's segment files are: one directory per stream (and per incarnation).

Standard library only, so that readers outside the broker (the Spark job's executors) find
a stream's files as the broker does (``broker.storage.streams``).
"""

from __future__ import annotations

import os

__all__ = ["incarnations", "stream_directory"]


def stream_directory(streams_dir: str, vhost: str, name: str) -> str:
    """The directory of stream ``name`` of ``vhost`` under ``streams_dir`` (its first
    incarnation's): ``<vhost>/<name>``, each written as hexadecimal UTF-8 so that any name
    makes a valid path (``-`` for the empty vhost name)."""
    return os.path.join(streams_dir, vhost.encode().hex() or "-", name.encode().hex())


def incarnations(base: str) -> list[tuple[int, str]]:
    """``(number, path)`` of the directories of a stream's incarnations, oldest first: ``base``
    (0), then ``base~1``, ``base~2`` ... (a stream deleted and declared again before its files
    were gone gets a directory of its own)."""
    parent, stem = os.path.split(base)
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    return sorted(
        (int(entry[len(stem) + 1 :]) if entry != stem else 0, os.path.join(parent, entry))
        for entry in names
        if entry == stem or (entry.startswith(stem + "~") and entry[len(stem) + 1 :].isdigit())
    )

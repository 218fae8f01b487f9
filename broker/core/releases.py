"""MQTT's QoS 2 publishes that a persistent session received and that wait for their client's
PUBREL, by vhost and client id, kept in the log as definitions (as retained messages are:
``broker.core.retained``): a publish sent again after a restart, or a SIGKILL, with a packet id
that was answered with PUBREC before it is still routed once [MQTT-4.3.3-2].

A record's key is ``[vhost, client id]`` as JSON; its value the packet ids, two bytes each
(``Undefined`` once none wait). A clean session's are not recorded: it ends with its connection.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

from postroom.broker.core.retained import definition_key
from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import Defined

if TYPE_CHECKING:
    from postroom.broker.core.journal import Journal

#: The kind of the log's definition records that hold them.
AWAITING_RELEASE = "mqtt-awaiting-release"


def _value(packet_ids: Iterable[int]) -> bytes:
    ids = sorted(packet_ids)
    return struct.pack(f">{len(ids)}H", *ids)


class AwaitingRelease:
    """The node's QoS 2 publishes awaiting release (see the module's docstring)."""

    def __init__(self) -> None:
        #: (vhost, client id) -> the packet ids.
        self.by_client: dict[tuple[str, str], frozenset[int]] = {}
        #: Where changes are recorded (``None``: in memory only).
        self.journal: Journal | None = None

    def get(self, vhost: str, client_id: str) -> set[int]:
        """The packet ids of ``client_id``'s session in ``vhost`` that wait for PUBREL."""
        return set(self.by_client.get((vhost, client_id), ()))

    def set(self, vhost: str, client_id: str, packet_ids: Iterable[int]) -> None:
        """Those of ``client_id``'s session in ``vhost`` are ``packet_ids`` now; recorded in
        the log when they changed."""
        key, ids = (vhost, client_id), frozenset(packet_ids)
        if self.by_client.get(key, frozenset()) == ids:
            return
        if ids:
            self.by_client[key] = ids
        else:
            del self.by_client[key]
        if self.journal is not None:
            self.journal.defined(AWAITING_RELEASE, definition_key(vhost, client_id), _value(ids) if ids else None)

    def forget_vhost(self, vhost: str) -> None:
        """``vhost`` is deleted: its sessions' go, in the log too."""
        for key in [key for key in self.by_client if key[0] == vhost]:
            self.set(key[0], key[1], ())

    def records(self) -> list[bytes]:
        """Every session's, encoded, for the head of a log segment or a checkpoint."""
        return [
            encode(Defined(AWAITING_RELEASE, definition_key(vhost, client_id), _value(ids)))
            for (vhost, client_id), ids in self.by_client.items()
        ]

    def restore(self, records: Iterable[Defined], vhosts: Iterable[str]) -> None:
        """Take those the log holds (of the vhosts that still exist), recording nothing."""
        known = set(vhosts)
        for record in records:
            vhost, client_id = json.loads(record.key)
            if vhost in known and record.value:
                count = len(record.value) // 2
                self.by_client[(vhost, client_id)] = frozenset(struct.unpack(f">{count}H", record.value[: count * 2]))

"""MQTT's retained messages, by vhost and topic, kept in the log as definitions: each change
is one ``Defined`` record (``Undefined`` when a topic's retained message is cleared), and the
head of every log segment and checkpoint holds them all (as it holds users and vhosts), so that
they survive a restart and a SIGKILL once recorded, and a cluster's followers have them.

A record's key is ``[vhost, topic]`` as JSON; its value is the QoS (one byte), then the payload
(an MQTT 5.0 message's: see :meth:`Retained.value`).
Every retained message is in memory and in each segment's head: they are for the last value of
a topic (a device's state), not for bulk data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from postroom.broker.wal.codec import encode
from postroom.broker.wal.records import Defined
from postroom.broker.wire.mqtt import matches

if TYPE_CHECKING:
    from postroom.broker.core.journal import Journal

#: The kind of the log's definition records that hold retained messages.
RETAINED = "mqtt-retained"


@dataclass(slots=True)
class Retained:
    """A retained message: its payload and the QoS it was published with; an MQTT 5.0 one also
    its properties (as its AMQP content header) and when it was retained (the node clock's
    seconds), for what is left of its Message Expiry Interval."""

    payload: bytes
    qos: int
    header: bytes | None = None
    at: float = 0.0

    def value(self) -> bytes:
        """Its record's value: the QoS, then the payload; with a header, the QoS's byte has its
        high bit set, and the time it was retained and the header come before the payload."""
        if self.header is None:
            return bytes([self.qos]) + self.payload
        return bytes([0x80 | self.qos]) + _AT_AND_LENGTH.pack(self.at, len(self.header)) + self.header + self.payload

    @classmethod
    def from_value(cls, value: bytes) -> Retained:
        first = value[0]
        if not first & 0x80:
            return cls(value[1:], first)
        at, length = _AT_AND_LENGTH.unpack_from(value, 1)
        start = 1 + _AT_AND_LENGTH.size
        return cls(value[start + length :], first & 0x03, value[start : start + length], at)


_AT_AND_LENGTH = struct.Struct(">dI")


class RetainedMessages:
    """The node's retained messages (see the module's docstring)."""

    def __init__(self) -> None:
        #: Vhost -> topic -> its retained message.
        self.by_vhost: dict[str, dict[str, Retained]] = {}
        #: Where changes are recorded (``None``: in memory only).
        self.journal: Journal | None = None

    def retain(
        self, vhost: str, topic: str, payload: bytes, qos: int, header: bytes | None = None, at: float = 0.0
    ) -> None:
        """Keep ``payload`` as ``topic``'s retained message (with an MQTT 5.0 publish's
        properties as ``header``, retained at ``at``); an empty one clears it [MQTT-3.3.1-10].
        Recorded in the log."""
        store = self.by_vhost.setdefault(vhost, {})
        kept = None
        if payload:
            kept = store[topic] = Retained(payload, qos, header, at)
        elif store.pop(topic, None) is None:
            return
        if self.journal is not None:
            self.journal.defined(RETAINED, definition_key(vhost, topic), kept.value() if kept is not None else None)

    def matching(self, vhost: str, topic_filter: str) -> list[tuple[str, Retained]]:
        """The retained messages of ``vhost`` whose topics ``topic_filter`` matches, wildcards
        included (as section 4.7 matches them: not a ``$`` topic to a wildcard first level)."""
        store = self.by_vhost.get(vhost)
        if not store:
            return []
        if "+" not in topic_filter and "#" not in topic_filter:
            found = store.get(topic_filter)
            return [(topic_filter, found)] if found is not None else []
        return [(topic, message) for topic, message in store.items() if matches(topic_filter, topic)]

    def forget_vhost(self, vhost: str) -> None:
        """``vhost`` is deleted: its retained messages go, in the log too (a vhost of the same
        name made later starts without them)."""
        store = self.by_vhost.pop(vhost, {})
        if self.journal is not None:
            for topic in store:
                self.journal.defined(RETAINED, definition_key(vhost, topic), None)

    def records(self) -> list[bytes]:
        """Every retained message, encoded, for the head of a log segment or a checkpoint."""
        return [
            encode(Defined(RETAINED, definition_key(vhost, topic), message.value()))
            for vhost, store in self.by_vhost.items()
            for topic, message in store.items()
        ]

    def restore(self, records: Iterable[Defined], vhosts: Iterable[str]) -> None:
        """Take the retained messages the log holds (of the vhosts that still exist), recording nothing."""
        known = set(vhosts)
        for record in records:
            vhost, topic = json.loads(record.key)
            if vhost in known and record.value:
                self.by_vhost.setdefault(vhost, {})[topic] = Retained.from_value(record.value)


#: The longest key a log record holds, in bytes (its length is two bytes).
MAX_KEY = 0xFFFF


def definition_key(vhost: str, name: str) -> str:
    """The key of an MQTT record of ``name`` (a topic, a client id) in ``vhost``: ``[vhost, name]`` as JSON."""
    return json.dumps([vhost, name], ensure_ascii=False)


def recordable(vhost: str, name: str) -> bool:
    """Whether a record of ``name`` in ``vhost`` fits the log (an MQTT string of 65,535 bytes,
    some escaped by JSON, may not): a client id or a retained topic that does not is refused
    before anything is routed or acknowledged."""
    return len(definition_key(vhost, name).encode()) <= MAX_KEY

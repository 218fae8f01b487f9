"""Partitioned streams: the exchange in front of a partitioned stream routes by a hash of the key.

A partitioned stream ``NAME`` of ``N`` partitions is laid out as RabbitMQ lays out a super
stream: streams ``NAME-0`` ... ``NAME-(N-1)``, and a direct exchange ``NAME`` declared with the
argument ``x-super-stream: true``, bound to stream ``NAME-i`` with the binding key ``"i"`` and
the binding argument ``x-stream-partition-order: i`` (RabbitMQ's; ``x-super-stream-partition-order``,
which Postroom wrote before, is read too).

RabbitMQ's exchange routes as any direct exchange (its stream clients hash the key themselves
and publish to the partition). Postroom's routes every message by its routing key, with the
hash RabbitMQ's stream clients use for super streams (Java, Go, .NET, Rust): MurmurHash3
x86 32-bit of the key's UTF-8 bytes, seed 104729, as an unsigned number modulo ``N``, onto the
partitions in their order. So any AMQP 0-9-1 publisher gets key partitioning, and one key's
messages stay in one partition, in order. Bindings without a partition order route as a
direct exchange's do, and an exchange with no partitions at all is a direct exchange.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from zope.interface import implementer

from exchanges.direct import DirectRouter
from exchanges.interfaces import IRouter

__all__ = ["PARTITION_ORDER", "SUPER_STREAM", "SEED", "PartitionRouter", "murmur3_32", "partition_of"]

#: The exchange argument that makes a direct exchange a partitioned stream's.
SUPER_STREAM = "x-super-stream"
#: The binding argument that gives a stream its place among the partitions (RabbitMQ's).
PARTITION_ORDER = "x-stream-partition-order"
#: The one Postroom wrote before it had RabbitMQ's: read where RabbitMQ's is not there.
OLD_PARTITION_ORDER = "x-super-stream-partition-order"
#: The hash's seed, as RabbitMQ's stream clients have it.
SEED = 104729

_MASK = 0xFFFFFFFF
#: Routing keys whose partition is remembered, per exchange (cleared past this many).
_CACHE_KEYS = 4096


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3's x86 32-bit hash of ``data`` (unsigned)."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & _MASK
    length = len(data)
    end = length & ~3
    for at in range(0, end, 4):
        k = int.from_bytes(data[at : at + 4], "little")
        k = (k * c1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * c2) & _MASK
        h ^= k
        h = ((h << 13) | (h >> 19)) & _MASK
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = data[end:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * c1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * c2) & _MASK
        h ^= k
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def partition_of(routing_key: str, partitions: int) -> int:
    """The partition (0 ... ``partitions`` - 1) of a message with ``routing_key``."""
    return murmur3_32(routing_key.encode("utf-8", "surrogateescape"), SEED) % partitions


def partition_order(arguments: Mapping[str, Any]) -> int | None:
    """A binding's place among the partitions (an integer, or digits as RabbitMQ takes them),
    ``None`` when it has none."""
    for key in (PARTITION_ORDER, OLD_PARTITION_ORDER):
        order = arguments.get(key)
        if isinstance(order, (bytes, str)) and order.isdigit():
            return int(order)
        if isinstance(order, int) and not isinstance(order, bool):
            return order
    return None


@implementer(IRouter)
class PartitionRouter(DirectRouter):
    """The bindings of a partitioned stream's exchange (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: The destinations bound with a partition order, in that order (``None``: to be sorted).
        self._partitions: list[Hashable] | None = None
        self._cache: dict[str, tuple[Hashable, ...]] = {}

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        added = super().bind(destination, routing_key, arguments)
        if added:
            self._changed()
        return added

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        removed = super().unbind(destination, routing_key, arguments)
        if removed:
            self._changed()
        return removed

    def unbind_all(self, destination: Hashable) -> int:
        removed = super().unbind_all(destination)
        if removed:
            self._changed()
        return removed

    def _changed(self) -> None:
        self._partitions = None
        self._cache.clear()

    def partitions(self) -> list[Hashable]:
        """The partitions, in their order (a destination bound twice counts once, at its first place)."""
        if self._partitions is None:
            ordered = sorted(
                (order, index, destination)
                for index, (destination, _key, arguments) in enumerate(self.bindings())
                if (order := partition_order(arguments)) is not None
            )
            seen: dict[Hashable, None] = {}
            for _order, _index, destination in ordered:
                seen.setdefault(destination, None)
            self._partitions = list(seen)
        return self._partitions

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """The partition ``routing_key`` hashes to; without partitions, as a direct exchange."""
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        partitions = self.partitions()
        if not partitions:
            return super().route(routing_key, headers)
        if len(self._cache) >= _CACHE_KEYS:
            self._cache.clear()
        routed = self._cache[routing_key] = (partitions[partition_of(routing_key, len(partitions))],)
        return routed

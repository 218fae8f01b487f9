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

The hash and the partitions' order are here; the router that routes by them is the direct
exchange type's (``exchanges.direct.PartitionRouter``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["PARTITION_ORDER", "SUPER_STREAM", "SEED", "murmur3_32", "partition_of", "partition_order"]

#: The exchange argument that makes a direct exchange a partitioned stream's.
SUPER_STREAM = "x-super-stream"
#: The binding argument that gives a stream its place among the partitions (RabbitMQ's).
PARTITION_ORDER = "x-stream-partition-order"
#: The one Postroom wrote before it had RabbitMQ's: read where RabbitMQ's is not there.
OLD_PARTITION_ORDER = "x-super-stream-partition-order"
#: The hash's seed, as RabbitMQ's stream clients have it.
SEED = 104729

_MASK = 0xFFFFFFFF


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

"""The partitioned stream's exchange: MurmurHash3 as RabbitMQ's stream clients use it, and routing by it."""

from __future__ import annotations

import pytest

from postroom.exchanges.direct import DirectExchangeType, DirectRouter, PartitionRouter
from postroom.exchanges.partitions import PARTITION_ORDER, SEED, murmur3_32, partition_of, partition_order

# Reference values from the ``mmh3`` package (MurmurHash3 x86 32-bit, unsigned), which RabbitMQ's
# stream clients agree with for super-stream routing.
REFERENCE = [
    ("", 3329588566, 0),
    ("a", 1086686554, 1009084850),
    ("ab", 398604456, 2613040991),
    ("abc", 3409700625, 3017643002),
    ("abcd", 3421720556, 1139631978),
    ("hello", 1321743225, 613153351),
    ("customer-42", 80594573, 220234549),
    ("événement", 1847516082, 3410041624),
    ("key-0123456789", 2800233170, 2062469008),
]


@pytest.mark.parametrize(("key", "seeded", "unseeded"), REFERENCE)
def test_murmur3_matches_the_reference(key: str, seeded: int, unseeded: int) -> None:
    assert murmur3_32(key.encode(), SEED) == seeded
    assert murmur3_32(key.encode()) == unseeded
    assert partition_of(key, 4) == seeded % 4


def partitioned(count: int) -> tuple[PartitionRouter, list[str]]:
    router = DirectExchangeType().new_router({"x-super-stream": True})
    assert isinstance(router, PartitionRouter)
    streams = [f"events-{n}" for n in range(count)]
    for n in reversed(range(count)):  # bound in any order: the partition order counts
        router.bind(streams[n], str(n), {PARTITION_ORDER: n})
    return router, streams


def test_each_key_goes_to_its_hash_partition_and_keys_spread() -> None:
    router, streams = partitioned(4)
    assert router.partitions() == streams
    counts = dict.fromkeys(streams, 0)
    for n in range(4000):
        key = f"customer-{n}"
        [destination] = list(router.route(key, None))
        assert destination == streams[murmur3_32(key.encode(), SEED) % 4]
        assert list(router.route(key, None)) == [destination]  # again (remembered), the same
        counts[destination] += 1  # type: ignore[index]
    assert all(800 < count < 1200 for count in counts.values()), counts


def test_the_partitions_follow_bindings_and_without_them_it_is_a_direct_exchange() -> None:
    router, streams = partitioned(3)
    before = list(router.route("k", None))
    router.unbind(streams[2], "2", {PARTITION_ORDER: 2})
    assert router.partitions() == streams[:2]
    assert list(router.route("k", None)) == [streams[partition_of("k", 2)]]
    assert before == [streams[partition_of("k", 3)]]
    plain, _streams = partitioned(0)
    plain.bind("q", "k", {})
    assert list(plain.route("k", None)) == ["q"] and list(plain.route("other", None)) == []
    assert type(DirectExchangeType().new_router({"x-super-stream": "yes"})) is DirectRouter


def test_the_partition_order_is_rabbitmqs_binding_argument_and_postrooms_older_one_is_read() -> None:
    assert PARTITION_ORDER == "x-stream-partition-order"  # (rabbit_stream_manager's)
    assert partition_order({"x-stream-partition-order": 2}) == 2
    assert partition_order({"x-stream-partition-order": "7"}) == 7  # (RabbitMQ coerces digits)
    assert partition_order({"x-super-stream-partition-order": 3}) == 3
    assert partition_order({"x-stream-partition-order": 1, "x-super-stream-partition-order": 3}) == 1
    assert partition_order({"x-stream-partition-order": True}) is None
    assert partition_order({"x-stream-partition-order": "one"}) is None
    assert partition_order({}) is None

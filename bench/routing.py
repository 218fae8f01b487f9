"""Topic routing cost against the number of bindings: 10 versus 10,000.

Patterns follow the load generator's topic mix (40% exact, 30% ``a.b.c.*``, 20% ``a.*.c.d``,
9% ``a.b.#``, 1% ``#.c.d`` over keys ``rN.sN.lN.iN``). Both exchanges hold the same 10
bindings that the routing keys can match; the large one adds 9,990 more in the same shapes
over other words, so every key routes to the same queues in both and only the size of the
trie differs. Prints routing decisions per second with the route cache off (the trie
alone) and on.

    python bench/routing.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import random
import time

from postroom.exchanges.topic import ROUTE_CACHE_SIZE, TopicRouter


def patterns(count: int, queues: int, rng: random.Random, prefix: str = "") -> list[tuple[str, str]]:
    """``count`` distinct (queue, pattern) bindings in the generator's mix, words prefixed by ``prefix``."""
    words = (
        [f"{prefix}r{i}" for i in range(10)],
        [f"{prefix}s{i}" for i in range(10)],
        [f"{prefix}l{i}" for i in range(5)],
    )
    ids = [f"{prefix}i{i}" for i in range(20)]
    bindings: set[tuple[str, str]] = set()
    while len(bindings) < count:
        r, s, level, ident = rng.choice(words[0]), rng.choice(words[1]), rng.choice(words[2]), rng.choice(ids)
        x = rng.random()
        if x < 0.40:
            pattern = f"{r}.{s}.{level}.{ident}"
        elif x < 0.70:
            pattern = f"{r}.{s}.{level}.*"
        elif x < 0.90:
            pattern = f"{r}.*.{level}.{ident}"
        elif x < 0.99:
            pattern = f"{r}.{s}.#"
        else:
            pattern = f"#.{level}.{ident}"
        bindings.add((f"q{len(bindings) % queues}", pattern))
    return sorted(bindings)


def rate(bindings: int, cache: int, seconds: float) -> float:
    """Routing decisions per second over 1000 cycling keys."""
    rng = random.Random(42)
    router = TopicRouter(route_cache_size=cache)
    for queue, pattern in patterns(10, 100, rng):
        router.bind(queue, pattern, {})
    for queue, pattern in patterns(bindings - 10, 100, random.Random(7), prefix="x"):
        router.bind(queue, pattern, {})
    keys = [f"r{rng.randrange(10)}.s{rng.randrange(10)}.l{rng.randrange(5)}.i{rng.randrange(20)}" for _ in range(1000)]
    done = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        for key in keys:
            set(router.route(key, None))
        done += len(keys)
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    for cache in (0, ROUTE_CACHE_SIZE):
        small, middle, large = (rate(count, cache, args.seconds) for count in (10, 1_000, 10_000))
        label = "cache off" if cache == 0 else f"cache {cache}"
        print(
            f"{label}: 10 bindings {small:,.0f}/s, 1,000 {middle:,.0f}/s, 10,000 {large:,.0f}/s; "
            f"10,000/10 = {large / small:.2f}, 10,000/1,000 = {large / middle:.2f}"
        )


if __name__ == "__main__":
    main()

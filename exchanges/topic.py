"""The ``topic`` exchange type: binding keys are dot-separated word patterns with wildcards.

Semantics follow RabbitMQ (``rabbit_exchange_type_topic`` and ``rabbit_db_topic_exchange``),
which are more precise than AMQP 0-9-1 §3.1.3.3:

* a key is split on every ``.``, so ``"a..b"`` is three words, ``"a."`` is ``["a", ""]``
  and ``"."`` is two empty words; the empty key ``""`` is *zero* words (RabbitMQ's
  ``split_topic_key(<<>>) -> []``), so ``*`` does not match it and ``#`` does;
* in a binding key, the word ``*`` matches exactly one word and ``#`` matches zero or more
  words; ``*`` or ``#`` inside a longer word (``"a*"``) is a literal;
* in a routing key every word is literal, ``*`` and ``#`` included.

The bindings form a trie over the binding-key words, as RabbitMQ's does, so routing costs
O(depth * 3) trie steps plus the ``#`` branches, however many bindings there are.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from zope.interface import implementer

from postroom.exchanges.binding import TableRouter, arguments_key
from postroom.exchanges.interfaces import BindingInvalid, IExchangeType, IRouter

__all__ = [
    "MAX_HASH_WILDCARDS",
    "ROUTE_CACHE_SIZE",
    "TopicExchangeType",
    "TopicRouter",
    "split_key",
]

# How many '#' words one binding key may hold. RabbitMQ sets no limit, and its matcher
# backtracks exponentially in them; ours is memoised, so each '#' node on a matching path adds
# at most (words + 1) trie steps per routed message. A 255-byte routing key has up to 256
# (empty) words, so 16 '#' bound what one binding can add to a publish at ~4,000 steps
# (about a millisecond), while real binding keys use one or two.
MAX_HASH_WILDCARDS = 16

# Size of each topic router's route cache (routing key -> destinations), in slots: an entry
# costs one slot plus one per destination, so a key that fans out widely cannot pin much
# memory. 4096 slots is a few hundred KiB per exchange at worst, and holds the hundreds of
# distinct keys a typical application publishes with. A peer publishing unique keys just
# makes the cache clear itself every 4096 publishes: O(1) amortised, memory still bounded.
ROUTE_CACHE_SIZE = 4096

_STAR = "*"
_HASH = "#"


def split_key(key: str) -> list[str]:
    """Split a routing or binding key into its words, as RabbitMQ does.

    ``""`` is no words; otherwise every ``.`` separates two (possibly empty) words.

    :param key: the routing key or binding key.
    """
    return key.split(".") if key else []


class _Node:
    """One trie node: the edges to its children and the bindings whose key ends here."""

    __slots__ = ("children", "destinations", "hash", "star")

    def __init__(self) -> None:
        # Literal words only; the '*' and '#' edges have their own slots so that a routing
        # word spelt "*" or "#" does not reach them twice.
        self.children: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.hash: _Node | None = None
        # destination -> number of bindings (different arguments) ending at this node.
        self.destinations: dict[Hashable, int] = {}

    def is_empty(self) -> bool:
        """``True`` when nothing ends here or below, so the node can be dropped."""
        return not (self.children or self.destinations) and self.star is None and self.hash is None


@implementer(IRouter)
class TopicRouter(TableRouter):
    """Bindings of one topic exchange, in a trie of binding-key words, plus a route cache."""

    needs_headers = False

    def __init__(self, max_hash_wildcards: int = MAX_HASH_WILDCARDS, route_cache_size: int = ROUTE_CACHE_SIZE) -> None:
        """
        :param max_hash_wildcards: binding keys with more ``#`` words are refused.
        :param route_cache_size: slots in the route cache (see :data:`ROUTE_CACHE_SIZE`);
            0 disables it.
        """
        self._max_hash_wildcards = max_hash_wildcards
        self._route_cache_size = route_cache_size
        super().__init__()
        self._root = _Node()
        self._cache: dict[str, tuple[Hashable, ...]] = {}
        self._cache_used = 0

    def bind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Add a binding; return ``True`` if it is new.

        :param destination: the queue or exchange to route to.
        :param routing_key: the binding key pattern.
        :param arguments: part of the binding's identity; ignored for routing.
        :raises BindingInvalid: the key has more than ``max_hash_wildcards`` ``#`` words.
        """
        words = split_key(routing_key)
        hashes = words.count(_HASH)
        if hashes > self._max_hash_wildcards:
            raise BindingInvalid(
                f"topic binding key has {hashes} '#' wildcards; at most {self._max_hash_wildcards} allowed"
            )
        if not self._table.add(destination, routing_key, arguments_key(arguments), arguments):
            return False
        node = self._root
        for word in words:
            if word == _STAR:
                if node.star is None:
                    node.star = _Node()
                node = node.star
            elif word == _HASH:
                if node.hash is None:
                    node.hash = _Node()
                node = node.hash
            else:
                child = node.children.get(word)
                if child is None:
                    child = node.children[word] = _Node()
                node = child
        node.destinations[destination] = node.destinations.get(destination, 0) + 1
        self._clear_cache()
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: Mapping[str, Any]) -> bool:
        """Remove a binding; return ``True`` if it existed. Trie nodes left empty are dropped.

        :param destination: the queue or exchange bound.
        :param routing_key: the binding key.
        :param arguments: the arguments it was bound with.
        """
        if not self._table.remove(destination, routing_key, arguments_key(arguments)):
            return False
        self._forget(destination, routing_key)
        self._clear_cache()
        return True

    def unbind_all(self, destination: Hashable) -> int:
        """Remove every binding to ``destination``; return how many were removed.

        :param destination: the queue or exchange being deleted.
        """
        removed = self._table.pop_destination(destination)
        for routing_key, _key, _arguments in removed:
            self._forget(destination, routing_key)
        if removed:
            self._clear_cache()
        return len(removed)

    def _forget(self, destination: Hashable, routing_key: str) -> None:
        """Drop one binding from the trie, then every node it leaves empty. O(depth)."""
        # The binding table said the binding exists, so the whole path is there.
        path: list[tuple[_Node, str]] = []
        node = self._root
        for word in split_key(routing_key):
            path.append((node, word))
            if word == _STAR:
                node = node.star  # type: ignore[assignment]
            elif word == _HASH:
                node = node.hash  # type: ignore[assignment]
            else:
                node = node.children[word]
        remaining = node.destinations[destination] - 1
        if remaining:
            node.destinations[destination] = remaining
            return
        del node.destinations[destination]
        while path and node.is_empty():
            parent, word = path.pop()
            if word == _STAR:
                parent.star = None
            elif word == _HASH:
                parent.hash = None
            else:
                del parent.children[word]
            node = parent

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Hashable]:
        """Return the destinations whose binding key matches ``routing_key``, each once.

        Cost: one dict lookup when the key is in the route cache; otherwise a trie walk (see
        :meth:`_match`) independent of the number of bindings. The tuple returned is shared
        with the cache and immutable.

        :param routing_key: the message's routing key.
        :param headers: ignored.
        """
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        destinations = tuple(self._match(split_key(routing_key)))
        cost = 1 + len(destinations)
        if cost <= self._route_cache_size:
            if self._cache_used + cost > self._route_cache_size:
                self._clear_cache()
            self._cache[routing_key] = destinations
            self._cache_used += cost
        return destinations

    def _match(self, words: list[str]) -> set[Hashable]:
        """Return the destinations of every binding whose pattern matches ``words``.

        An explicit stack of ``(node, position)`` states. Without ``#`` each state is reached
        at most once (a node's position is its depth), so the walk is O(depth * 3) trie steps.
        A ``#`` node may start at every position from where it is first reached to the end; we
        remember the lowest start queued for each ``#`` node and queue only lower ones, so each
        ``#`` node is entered at most ``len(words) + 1`` times and nothing is explored twice:
        O((depth + number of '#' nodes reached * len(words)) * 3), never exponential.

        :param words: the routing key's words.
        """
        end = len(words)
        found: set[Hashable] = set()
        hash_lowest: dict[_Node, int] = {}
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        push = stack.append
        pop = stack.pop
        while stack:
            node, position = pop()
            if position == end:
                if node.destinations:
                    found.update(node.destinations)
            else:
                child = node.children.get(words[position])
                if child is not None:
                    push((child, position + 1))
                if node.star is not None:
                    push((node.star, position + 1))
            hash_node = node.hash
            if hash_node is not None:
                # '#' swallows words[position:start] for every start in position..end.
                lowest = hash_lowest.get(hash_node, end + 1)
                if position < lowest:
                    hash_lowest[hash_node] = position
                    if hash_node.hash is not None:
                        # '#.#...': queue every start as a state and let the walk sort it out.
                        for start in range(position, lowest):
                            push((hash_node, start))
                        continue
                    # Most starts lead nowhere, so they are tried here rather than queued.
                    children = hash_node.children
                    star = hash_node.star
                    for start in range(position, min(lowest, end)):
                        if children:
                            child = children.get(words[start])
                            if child is not None:
                                push((child, start + 1))
                        if star is not None:
                            push((star, start + 1))
                    if lowest > end and hash_node.destinations:
                        found.update(hash_node.destinations)
        return found

    def _clear_cache(self) -> None:
        """Empty the route cache: any change to the bindings may change any route."""
        if self._cache:
            self._cache.clear()
        self._cache_used = 0

    def node_count(self) -> int:
        """The number of trie nodes, the root included (1 when there are no bindings). O(nodes).

        For tests and diagnostics: it shows that unbinding frees the trie.
        """
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
            if node.star is not None:
                stack.append(node.star)
            if node.hash is not None:
                stack.append(node.hash)
        return count


@implementer(IExchangeType)
class TopicExchangeType:
    """The ``topic`` exchange type."""

    name = "topic"

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Accept any declare arguments: a topic exchange reads none of them.

        :param arguments: the ``exchange.declare`` arguments.
        """

    def new_router(self, arguments: Mapping[str, Any]) -> IRouter:
        """Make an empty :class:`TopicRouter` with the default limits.

        :param arguments: the ``exchange.declare`` arguments (unused).
        """
        return TopicRouter(max_hash_wildcards=MAX_HASH_WILDCARDS, route_cache_size=ROUTE_CACHE_SIZE)

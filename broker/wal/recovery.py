"""Recovery as a pure fold: log records in, the durable state they describe out.

:func:`replay` applies records in log order to a :class:`Snapshot`: the node's definitions
(users, vhosts), policies, durable exchanges, queues and bindings, for each durable queue its
persistent messages in publish order with their delivery counts, and for each stream its
subscriptions' offsets. The broker then declares the topology and enqueues the messages
without logging them again. Nothing here touches a file or a reactor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from postroom.broker.wal.records import (
    Bound,
    Defined,
    DeliveryCounted,
    ExchangeDeclared,
    ExchangeDeleted,
    PolicyCleared,
    PolicySet,
    Published,
    QueueDeclared,
    QueueDeleted,
    Removed,
    StreamOffset,
    Unbound,
    Undefined,
)

QueueKey = tuple[str, str]  # (vhost, queue)


@dataclass
class StoredMessage:
    """A persistent message still in a queue, and how often it was returned there."""

    record: Published
    delivery_count: int = 0
    #: The segment holding its ``Published`` record (0 when replayed without segment numbers).
    segment: int = 0
    #: Where that record ends in the segment (its body ends there too); 0 when unknown.
    end: int = 0
    #: Where it starts; 0 when unknown.
    start: int = 0


@dataclass
class Snapshot:
    """The durable state a log describes."""

    exchanges: dict[tuple[str, str], ExchangeDeclared] = field(default_factory=dict)
    queues: dict[QueueKey, QueueDeclared] = field(default_factory=dict)
    bindings: dict[tuple[str, str, str, bool, str, bytes], Bound] = field(default_factory=dict)
    messages: dict[QueueKey, dict[int, StoredMessage]] = field(default_factory=dict)
    #: Policies by (vhost, whether an operator policy, name), in the order they were first set.
    policies: dict[tuple[str, bool, str], PolicySet] = field(default_factory=dict)
    #: The node's definitions (users, vhosts, ...) by (kind, key), in the order first set.
    definitions: dict[tuple[str, str], Defined] = field(default_factory=dict)
    #: Each stream's subscriptions: the offset each named subscription reads on from.
    stream_offsets: dict[QueueKey, dict[str, int]] = field(default_factory=dict)
    max_message_id: int = 0
    #: Records that named something unknown (a removal of a message never published, say):
    #: expected after segments were retired, counted for the recovery report.
    orphans: int = 0
    #: Queues whose messages at a checkpoint are in its files, not in :attr:`messages` (the log
    #: is then read from the checkpoint on): removals and delivery counts of messages
    #: unknown here are theirs, kept in :attr:`removed_after` and :attr:`counts_after`. A
    #: queue deleted after the checkpoint leaves this set (its files are not used).
    checkpointed: set[QueueKey] = field(default_factory=set)
    removed_after: dict[QueueKey, set[int]] = field(default_factory=dict)
    counts_after: dict[QueueKey, dict[int, int]] = field(default_factory=dict)

    @property
    def message_count(self) -> int:
        """Messages across all queues (a message in two queues counts twice)."""
        return sum(len(stored) for stored in self.messages.values())


def _binding_key(record: Bound | Unbound) -> tuple[str, str, str, bool, str, bytes]:
    return (
        record.vhost,
        record.source,
        record.destination,
        record.destination_is_queue,
        record.routing_key,
        record.arguments,
    )


def replay(records: Iterable[object], snapshot: Snapshot | None = None) -> Snapshot:
    """Fold ``records`` (in log order) into ``snapshot`` (a new one by default) and return it.

    Cost: O(1) per record, O(ids) for a removal.
    """
    return replay_segments(((0, record) for record in records), snapshot)


def replay_segments(records: Iterable[tuple[int, object]], snapshot: Snapshot | None = None) -> Snapshot:
    """:func:`replay` over ``(segment, record)`` pairs, remembering each message's segment."""
    return replay_located(((segment, 0, 0, record) for segment, record in records), snapshot)


def replay_located(records: Iterable[tuple[int, int, int, object]], snapshot: Snapshot | None = None) -> Snapshot:
    """:func:`replay` over ``(segment, start offset, end offset, record)``, remembering where each
    message's record is."""
    state = snapshot or Snapshot()
    messages = state.messages
    for segment, start, end, record in records:
        kind = type(record)
        if kind is Published:
            assert isinstance(record, Published)
            state.max_message_id = max(state.max_message_id, record.message_id)
            for queue in record.queues:
                key = (record.vhost, queue)
                if key in state.queues:
                    messages.setdefault(key, {})[record.message_id] = StoredMessage(record, 0, segment, end, start)
                else:
                    state.orphans += 1
        elif kind is Removed:
            assert isinstance(record, Removed)
            key = (record.vhost, record.queue)
            stored = messages.get(key)
            for message_id in record.message_ids:
                if stored is None or stored.pop(message_id, None) is None:
                    if key in state.checkpointed:
                        state.removed_after.setdefault(key, set()).add(message_id)
                    else:
                        state.orphans += 1
        elif kind is DeliveryCounted:
            assert isinstance(record, DeliveryCounted)
            key = (record.vhost, record.queue)
            message = messages.get(key, {}).get(record.message_id)
            if message is not None:
                message.delivery_count = record.delivery_count
            elif key in state.checkpointed:
                state.counts_after.setdefault(key, {})[record.message_id] = record.delivery_count
            else:
                state.orphans += 1
        elif kind is QueueDeclared:
            assert isinstance(record, QueueDeclared)
            state.queues[(record.vhost, record.name)] = record
        elif kind is QueueDeleted:
            assert isinstance(record, QueueDeleted)
            key = (record.vhost, record.name)
            state.queues.pop(key, None)
            messages.pop(key, None)
            state.stream_offsets.pop(key, None)
            state.checkpointed.discard(key)
            state.removed_after.pop(key, None)
            state.counts_after.pop(key, None)
            for binding_key in [k for k in state.bindings if k[0] == record.vhost and k[3] and k[2] == record.name]:
                del state.bindings[binding_key]
        elif kind is ExchangeDeclared:
            assert isinstance(record, ExchangeDeclared)
            state.exchanges[(record.vhost, record.name)] = record
        elif kind is ExchangeDeleted:
            assert isinstance(record, ExchangeDeleted)
            state.exchanges.pop((record.vhost, record.name), None)
            for binding_key in [
                k
                for k in state.bindings
                if k[0] == record.vhost and (k[1] == record.name or (not k[3] and k[2] == record.name))
            ]:
                del state.bindings[binding_key]
        elif kind is Bound:
            assert isinstance(record, Bound)
            state.bindings[_binding_key(record)] = record
        elif kind is Unbound:
            assert isinstance(record, Unbound)
            state.bindings.pop(_binding_key(record), None)
        elif kind is PolicySet:
            assert isinstance(record, PolicySet)
            state.policies[(record.vhost, record.operator, record.name)] = record
        elif kind is PolicyCleared:
            assert isinstance(record, PolicyCleared)
            state.policies.pop((record.vhost, record.operator, record.name), None)
        elif kind is Defined:
            assert isinstance(record, Defined)
            state.definitions[(record.kind, record.key)] = record
        elif kind is Undefined:
            assert isinstance(record, Undefined)
            state.definitions.pop((record.kind, record.key), None)
        elif kind is StreamOffset:
            assert isinstance(record, StreamOffset)
            key = (record.vhost, record.stream)
            if key in state.queues:
                state.stream_offsets.setdefault(key, {})[record.name] = record.offset
            else:
                state.orphans += 1
    return state

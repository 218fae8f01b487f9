"""The dead-letter event log: what the broker records for the dead-letter analysis.

Two kinds of event, encoded in the write-ahead log's record format into a pending buffer that
the shell writes to their own segment stream (``<storage.dir>/deadletters``) beside the log:

* :class:`~broker.wal.records.DeadLettered` when a message is dead-lettered and reaches at
  least one queue (its dead-letter queues), with everything the analysis reads as plain
  fields: where and why it died, its delivery count, headers, ``x-death`` history, body size
  and a bounded preview;
* :class:`~broker.wal.records.DeadLetterSettled` when a copy leaves a dead-letter queue for
  good (acked, rejected, expired, dropped or purged there). A copy with no such event is
  still pending.

The dead-lettered copy carries its id in the ``x-postroom-dead-letter-id`` header, so the
redrive list the analysis writes names messages that ``postroom dlq redrive --ids`` finds,
and a copy recovered from the write-ahead log after a restart is still recognised when it
is consumed (its header is read once, at start: :func:`watch_dead_letter_queues`).

Nothing here runs on the publish/deliver/ack hot path: recording happens when a message is
dead-lettered, and the settle hook is attached only to queues that dead letters reach (see
:meth:`DeadLetterLog.watch`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER, Sealer
from postroom.broker.wal.codec import encode
from postroom.broker.wal.dead_letter_fields import dead_lettered
from postroom.broker.wal.records import DeadLetterSettled
from postroom.broker.wire.codec import FLAG_HEADERS

if TYPE_CHECKING:
    from postroom.broker.core.dead_lettering import DeadLetterReason
    from postroom.broker.core.entry import Entry, Queue

__all__ = [
    "DEAD_LETTER_ID_HEADER",
    "RUN_ID_BITS",
    "DeadLetterLog",
    "dead_letter_id",
    "header_dead_letter_id",
    "watch_dead_letter_queues",
]

#: The header's name as a field table encodes it (a short string): a message whose raw
#: content header lacks these bytes carries no dead-letter id, and is not decoded at start.
_ID_HEADER_NAME = bytes([len(DEAD_LETTER_ID_HEADER)]) + DEAD_LETTER_ID_HEADER.encode()

#: Dead-letter ids are ``run << RUN_ID_BITS | n``: ``run`` is the stream segment the broker
#: opened at start (larger than every earlier one), ``n`` counts from 1. Ids are then unique
#: across restarts without reading old segments at start; 2**40 (a trillion) dead letters per
#: run, and runs up to 2**23, keep ids within a signed 64-bit long (Spark's and Parquet's).
RUN_ID_BITS = 40



class DeadLetterLog:
    """Dead-letter events waiting to be written, and the dead letters still in their queues.

    :param run: this run's number (the stream segment opened at start); ids start at
        ``run << RUN_ID_BITS | 1``
    :param clock: seconds since the epoch (the reactor's ``seconds``)
    :param sealer: seals the dead-lettered copies (``None``: they carry no seal)
    """

    def __init__(self, run: int, clock: Callable[[], float], sealer: Sealer | None = None) -> None:
        self._next_id = (run << RUN_ID_BITS) + 1
        #: Seals each copy that gets an id (see :mod:`broker.core.seal`).
        self.sealer = sealer
        self._clock = clock
        self._pending: list[bytes] = []
        #: Bytes waiting in :meth:`take`.
        self.pending_bytes = 0
        #: Called when events become pending and none were before (the shell schedules a write).
        self.on_pending: Callable[[], None] | None = None
        #: Dead-lettered copies in memory in a dead-letter queue: id, and the queues.
        self._held: dict[Message, tuple[int, set[str]]] = {}
        #: Dead-letter queues whose dead letters are not all listed here: those spooled out
        #: of memory (``broker.core.entry_spool``; one read back is a new object) and those restored
        #: from a checkpoint, which names the queues only. A message that leaves one carrying
        #: a dead-letter id and is not in ``_held`` is recorded by that id (its header is
        #: decoded then), so a deep dead-letter queue costs no memory per dead letter here.
        #: Each counts the unlisted dead letters it is known to hold (for :meth:`held`; 0 for
        #: those restored from a checkpoint, whose count is not known).
        self.unlisted: Counter[str] = Counter()
        #: Events recorded so far, by kind (for logs and tests).
        self.dead_lettered_count = 0
        self.settled_count = 0

    def next_id(self) -> int:
        """A new dead-letter id, for the copy about to be published to the dead-letter exchange."""
        dead_letter_id = self._next_id
        self._next_id += 1
        return dead_letter_id

    def _add(self, data: bytes) -> None:
        first = not self._pending
        self._pending.append(data)
        self.pending_bytes += len(data)
        if first and self.on_pending is not None:
            self.on_pending()

    def watch(self, queue: WorkQueue) -> None:
        """Record when dead letters leave ``queue`` (a dead-letter queue): be told of its settling and spooling."""
        queue.dead_letter_watch = self

    def spooled(self, queue: WorkQueue, entries: Iterable[Entry]) -> None:
        """Entries of ``queue`` went to its spool: their messages will come back as new
        objects, known by their headers."""
        name = queue.name
        held = self._held
        moved = 0
        for entry in entries:
            message = entry.message
            known = held.get(message)
            if known is None or name not in known[1]:
                continue
            known[1].discard(name)
            if not known[1]:
                del held[message]
            moved += 1
        if moved:
            self.unlisted[name] += moved

    def dead_lettered(
        self,
        dead_letter_id: int,
        vhost: str,
        queue: str,
        reason: DeadLetterReason,
        delivery_count: int,
        copy: Message,
        targets: Sequence[Queue],
    ) -> None:
        """Record that a message died in ``queue`` and its ``copy`` reached ``targets``.

        :param copy: the dead-lettered message (its ``x-death`` already updated)
        :param targets: the dead-letter queues it was routed to (at least one)
        """
        record = dead_lettered(
            dead_letter_id,
            vhost,
            queue,
            reason.value,
            delivery_count,
            self._clock(),
            copy.exchange,
            [target.name for target in targets],
            copy.lenient_headers(),
            copy.header,
            copy.body,
        )
        self._add(encode(record))
        self.dead_lettered_count += 1
        listed: set[str] = set()
        for target in targets:
            if not isinstance(target, WorkQueue):
                continue  # a stream keeps it for good: it never leaves, so it is not followed
            if target.dead_letter_watch is None:
                self.watch(target)
            if target.ready.spool is None:
                listed.add(target.name)
            else:  # behind a spool, maybe recorded already: known by its header when it leaves
                self.unlisted[target.name] += 1
        if listed:
            self._held[copy] = (dead_letter_id, listed)

    def recovered(self, queue: WorkQueue) -> int:
        """Note the dead letters of earlier runs in ``queue`` (recovered from the log, known by
        their ``x-postroom-dead-letter-id`` header) and hook the queue if it holds any; returns
        how many.

        Headers are decoded here, once, at start, and only of messages whose raw content
        header holds the header's name, so that :meth:`settled` never decodes any: a queue
        that is both a work queue and a dead-letter target (a retry loop) settles messages at
        full rate.
        """
        found = 0
        for entry in queue.ready_entries():
            message = entry.message
            value = dead_letter_id(message)
            if value is None:
                continue
            known = self._held.get(message)
            if known is None:
                self._held[message] = (value, {queue.name})
            else:
                known[1].add(queue.name)
            found += 1
        if found and queue.dead_letter_watch is None:
            self.watch(queue)
        return found

    def settled(self, queue: WorkQueue, entries: Iterable[Entry]) -> None:
        """Entries left ``queue`` for good: record it for those that are dead letters.

        A dead letter in memory is known by its message (a dict lookup per entry: nothing is
        decoded); in an unlisted queue, one that is not is known by its header.
        """
        name = queue.name
        held = self._held
        unlisted = name in self.unlisted
        now = None
        for entry in entries:
            message = entry.message
            known = held.get(message)
            if known is not None and name in known[1]:
                dead_letter, queues = known
                queues.discard(name)
                if not queues:
                    del held[message]
            elif unlisted:
                found = dead_letter_id(message)
                if found is None:
                    continue
                dead_letter = found
                if self.unlisted[name] > 0:
                    self.unlisted[name] -= 1
            else:
                continue
            if now is None:
                now = self._clock()
            self._add(encode(DeadLetterSettled(dead_letter, queue.vhost_name, name, now)))
            self.settled_count += 1

    @property
    def has_pending(self) -> bool:
        """Whether events wait to be written."""
        return bool(self._pending)

    def take(self) -> bytes:
        """Everything pending, encoded, in order; the buffer is empty afterwards."""
        data = b"".join(self._pending)
        self._pending.clear()
        self.pending_bytes = 0
        return data

    def held(self) -> int:
        """Dead-lettered copies still in a dead-letter queue, as far as they are known: those
        in queues restored from a checkpoint are not counted."""
        return sum(len(queues) for _id, queues in self._held.values()) + sum(self.unlisted.values())


def dead_letter_id(message: Message) -> int | None:
    """The ``x-postroom-dead-letter-id`` a message carries (``None``: it carries none); its
    headers are decoded only if its raw content header holds that name."""
    if not message.flags & FLAG_HEADERS or _ID_HEADER_NAME not in message.header:
        return None
    value = message.lenient_headers().get(DEAD_LETTER_ID_HEADER)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    return value


def header_dead_letter_id(header: bytes) -> int | None:
    """:func:`dead_letter_id` of a message with this raw content header."""
    if _ID_HEADER_NAME not in header:
        return None
    return dead_letter_id(Message("", "", b"", header, b""))


def watch_dead_letter_queues(
    log: DeadLetterLog,
    vhosts: Iterable[Any],
    spooled: Mapping[str, int] | None = None,
    recovered_queues: Iterable[str] = (),
) -> int:
    """Hook every queue that holds dead letters recovered from the write-ahead log, so that
    they are recorded when they leave; returns how many queues.

    Every queue is looked at, not only those a dead-letter exchange routes to now: the
    queue that dead-lettered into one may have been deleted since, or reach it through an
    exchange-to-exchange binding. Queues that dead letters reach later are hooked then.

    :param spooled: how many recovered dead letters each queue holds in its spool
        (``Node.recovered_dead_letters``): known by their headers when they come back
    :param recovered_queues: dead-letter queues restored from a checkpoint (see
        :attr:`DeadLetterLog.unlisted`)
    """
    for name in recovered_queues:
        log.unlisted[name] += 0  # unlisted, how many not known
    if spooled:
        log.unlisted.update(spooled)
    names = set(log.unlisted)
    watched = 0
    for vhost in vhosts:
        for queue in list(vhost.queues.values()):
            if queue.kind == "stream":
                continue
            if log.recovered(queue) or queue.name in names:
                if queue.dead_letter_watch is None:
                    log.watch(queue)
                watched += 1
    return watched

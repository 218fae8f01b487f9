"""Deep queues on disk: ready messages beyond ``storage.memory_budget`` leave memory.

Memory is the first tier: a queue holds its ready messages in memory while the broker's
messages in memory fit the budget. A queue asks the :class:`Pager` to watch it once its window
of ready messages is full (``spooling.SPOOL_WINDOW``) or its ready bodies pass a mark
(:attr:`Pager.watch_at`). While the watched queues' messages in memory (:data:`ENTRY_BYTES` per
queue entry, :data:`MESSAGE_BYTES` and the body per message, shared by the queues a message was
routed to; :data:`LOGGED_BYTES` more for a logged message) exceed the budget, those that hold the
most spool what arrives from then on (``broker.core.entry_spool``): those messages leave memory,
as records on disk, while what the queue held stays. Once memory is no longer short (under
:data:`RESUME_AT` of the budget), spooling queues keep what arrives in memory again, and are
back to memory alone once their records are read back.

The budget in force (:attr:`Pager.in_force`) is ``storage.memory_budget``, less what the broker
holds besides while the memory alarm's watermark is followed (:meth:`Pager.follow_memory`):
frames being read, buffers, unacknowledged deliveries, queues not watched, memory the allocator
keeps. As RabbitMQ pages once its whole memory passes half the watermark
(``vm_memory_high_watermark_paging_ratio``), the budget shrinks so that the broker's resident
memory stays under :data:`PAGING_RATIO` of the watermark, to :data:`BUDGET_FLOOR` of the
budget at least. Once no queue is watched any more, the memory freed is given back to the
system (:attr:`Pager.on_drained`), so that it is not counted as held besides.

Priority queues do not spool; they, and spooling queues whose bodies in memory are still over
the budget, keep the first ``budget / watched`` bytes of their bodies (the next to be delivered)
in memory and the bodies behind go to disk, last to be delivered first:

* a body already in the write-ahead log (a persistent message in a durable queue) is only
  dropped from memory: the log has it;
* any other body is appended to the :class:`PageStore`, which is not fsynced and not recovered
  (what it holds was never promised to survive a restart);
* a persistent message whose log record is not written yet keeps its body until it is.

Bodies come back one by one as they are delivered (:attr:`broker.core.message.Message.body`),
in order, with their properties (those never leave memory). A store segment is deleted once
no message refers to it any more: its messages hold it, so Python's reference counting tells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.application.service import Service
from twisted.logger import Logger

from postroom.broker.core.ready import NEVER

if TYPE_CHECKING:
    from postroom.broker.core.journal import Journal
    from postroom.broker.core.message import Message
    from postroom.broker.core.queue import WorkQueue
    from postroom.broker.storage.page_store import PageStore
    from postroom.broker.storage.spool_files import Spooler

#: Seconds between looks at the watched queues while any is watched.
INTERVAL = 0.05

#: Memory a ready message takes in each queue it waits in (its entry), and once besides its body
#: (its message object, properties and names): the entry measured with tracemalloc, the whole
#: as the broker's resident memory grew per queued message, 200,000 transient 16-byte messages
#: in one queue (605 bytes; ``bench/backlog.py --messages 200000 --transient``).
ENTRY_BYTES = 176
MESSAGE_BYTES = 412

#: What a logged message (persistent, in a durable queue) takes besides: its place in the log
#: and the journal's accounting (857 bytes in all for a 16-byte message, the same way).
LOGGED_BYTES = 252

#: Newest entries of each watched queue looked at to tell how many queues share a message
#: (fanout): the budget counts a shared message once. (Fewer with more than 16 watched queues.)
SAMPLE = 256

#: Fraction of the budget under which spooling queues keep what arrives in memory again.
RESUME_AT = 0.5

#: Ready messages past which a queue with consumers is behind: publishers are slowed
#: (:attr:`Pager.flow`) while any watched queue is.
FLOW_DEPTH = 65536

#: Share of the memory alarm's watermark under which paging keeps the broker's resident memory
#: (RabbitMQ's ``vm_memory_high_watermark_paging_ratio``).
PAGING_RATIO = 0.5

#: The least share of the budget kept in force, however much the broker holds besides.
BUDGET_FLOOR = 1 / 16

#: Seconds without paging after the store could not be written (a full disk).
BACKOFF = 1.0

def _in_memory(queue: WorkQueue, sharing: float) -> int:
    """Estimated bytes of ``queue``'s ready messages in memory, each message shared by
    ``sharing`` queues on average."""
    count, size = queue.memory_use
    return int(count * ENTRY_BYTES + (count * MESSAGE_BYTES + size) / sharing)


class Pager(Service):
    """Keeps the ready bodies of deep queues within ``budget`` bytes of memory (see the module).

    The one owner of ``storage.memory_budget``: it spools and pages deep queues here, and tells
    the journal when to drop the bodies of logged messages (:meth:`page_logged`).

    :param journal: the log's journal, whose count of bodies in memory drops with those paged here
    """

    log = Logger()

    def __init__(
        self, store: PageStore, budget: int, reactor: Any, journal: Journal | None = None, interval: float = INTERVAL
    ) -> None:
        self.store = store
        self.budget = budget
        #: The budget in force: :attr:`budget`, less what the broker holds besides while it
        #: follows the memory watermark (see :meth:`follow_memory`).
        self.in_force = budget
        #: The memory alarm's watermark followed (0: none), and the latest reading of the
        #: broker's resident memory.
        self.memory_limit = 0
        self._resident: Callable[[], int] | None = None
        #: Called once no queue is watched any more (deep queues drained): gives freed memory
        #: back to the system, so that the next reading counts only what the broker holds.
        self.on_drained: Callable[[], object] | None = None
        self.reactor = reactor
        self.journal = journal
        self.interval = interval
        #: Ready bytes past which a queue is watched.
        self.watch_at = max(budget // 64, 4096)
        self.watched: set[WorkQueue] = set()
        #: Spools deep queues (``broker.storage.spool_files.Spooler``); ``None``: only bodies are paged.
        self.spooler: Spooler | None = None
        self._call: Any = None
        self._paused_until = 0.0
        self._logged = False
        self._spooling_logged = False
        #: Whether a watched queue with consumers holds more than :attr:`flow_depth` ready
        #: messages; :attr:`on_flow` is called with each change.
        self.flow = False
        self.flow_depth = FLOW_DEPTH
        self.on_flow: Callable[[bool], None] | None = None
        self._flow_logged = False

    def follow_memory(self, limit: int, resident: Callable[[], int]) -> None:
        """Keep the broker's resident memory under :data:`PAGING_RATIO` of the watermark
        ``limit``: from each look on, the budget in force is what that leaves besides what the
        broker holds outside the watched queues.

        :param resident: the latest reading of the broker's resident memory (0: none yet)
        """
        self.memory_limit = limit
        self._resident = resident

    def budget_now(self) -> int:
        """The budget in force now: :attr:`budget`, less what the broker's latest resident memory
        reading holds outside the watched queues' messages past :data:`PAGING_RATIO` of the
        watermark (:data:`BUDGET_FLOOR` of it at least)."""
        resident = self._resident() if self._resident is not None else 0
        if not resident:
            return self.budget
        besides = max(resident - self.memory_used(), 0)
        room = int(self.memory_limit * PAGING_RATIO) - besides
        return max(int(self.budget * BUDGET_FLOOR), min(self.budget, room))

    def watch(self, queue: WorkQueue) -> None:
        """``queue`` passed :attr:`watch_at` (or its window): watch it until it falls back under
        half of both and spools nothing."""
        queue.ready.page_at = NEVER
        self.watched.add(queue)
        if self._call is None and self.running:
            self._call = self.reactor.callLater(0, self.look)

    def spool_now(self, queue: WorkQueue) -> int:
        """``queue``'s window is full: 0 if memory is short (it is to spool now), else the ready
        count at which it is to ask again (once it could have taken its share of what is left)."""
        self.watch(queue)
        used = self.memory_used()
        if used > self.in_force:
            self._spooling()
            return 0
        count, size = queue.memory_use
        per_message = ENTRY_BYTES + MESSAGE_BYTES + size // max(count, 1)
        window = self.spooler.window if self.spooler is not None else 1
        # Its share of what is left, as if every watched queue grew as fast.
        return count + max(window, (self.in_force - used) // (per_message * len(self.watched)))

    def sharing(self) -> float:
        """How many of the watched queues hold each message, on average, among their newest entries."""
        each = min(SAMPLE, max(8, SAMPLE * 16 // max(len(self.watched), 1)))
        sampled = [id(entry.message) for queue in self.watched for entry in queue.ready.newest(each)]
        return len(sampled) / len(set(sampled)) if sampled else 1.0

    def memory_used(self) -> int:
        """Estimated bytes of the watched queues' ready messages in memory (with every logged
        message in memory)."""
        sharing = self.sharing()
        return sum(_in_memory(queue, sharing) for queue in self.watched) + self._logged_bytes()

    def _logged_bytes(self) -> int:
        return self.journal.ledger.messages_in_memory * LOGGED_BYTES if self.journal is not None else 0

    def attach(self, queue: WorkQueue) -> None:
        """A new queue: let it ask to be watched, and spool what is behind its window."""
        queue.ready.pager = self
        queue.ready.page_at = self.watch_at
        if self.spooler is not None:
            queue.ready.attach_spooler(self.spooler)

    def spool_failed(self, queue: WorkQueue, error: OSError, doing: str, then: str) -> None:
        self.log.error(
            "cannot {doing} for queue {queue!r} ({error}); {then}",
            doing=doing,
            queue=queue.name,
            error=error.strerror or str(error),
            then=then,
        )

    def page_logged(self) -> int:
        """Drop from memory the bodies of logged messages past the budget in force, newest first
        (they are read back from the log when delivered); how many were dropped."""
        return self.journal.bodies.page_out(self.in_force) if self.journal is not None else 0

    def look(self) -> None:
        """Spool and page what is over the budget, and look again soon while any queue is watched."""
        self._call = None
        watched = self.watched
        window = self.spooler.window if self.spooler is not None else NEVER
        for queue in list(watched):
            line = queue.ready
            if queue.deleted:
                watched.discard(queue)
            elif line.spool is None and line.ready_bytes < self.watch_at // 2 and line.count < window // 2:
                watched.discard(queue)
                line.page_at = self.watch_at
                if line.spooler is not None:
                    line.spool_at = window
        self._follow_flow()
        if not watched:
            self.store.close()  # its last segment goes too, with the last message using it
            if self.on_drained is not None:
                self.on_drained()
            self.in_force = self.budget_now()  # (until a queue is watched again: see page_logged)
            return
        budget = self.in_force = self.budget_now()
        if self.spooler is not None:  # a spooling queue refills its window to its share at most
            self.spooler.window_bytes = budget // len(watched)
        self._spool()
        if self.reactor.seconds() >= self._paused_until:
            in_memory = {queue: queue.ready.ready_bytes - queue.ready.paged_bytes for queue in watched}
            if sum(in_memory.values()) > budget:
                window = budget // len(watched)
                for queue in sorted(watched, key=in_memory.__getitem__, reverse=True):
                    if in_memory[queue] <= window:
                        break
                    if not self._page(queue, window):
                        break
        if self.running:
            self._call = self.reactor.callLater(self.interval, self.look)

    def _spool(self) -> None:
        """Over the budget: the queues that hold the most spool what arrives from now on, until
        those that do not spool hold at most :data:`RESUME_AT` of the budget (what a queue
        holds stays in memory: spooling stops its growth). Well under it: spooling queues keep
        what arrives in memory."""
        if self.spooler is None:
            return
        sharing = self.sharing()
        costs = {queue: _in_memory(queue, sharing) for queue in self.watched}
        used = sum(costs.values()) + self._logged_bytes()
        window = self.spooler.window
        if used > self.in_force:
            spooling = {queue for queue in costs if queue.ready.spool is not None and queue.ready.spool.recording}
            for queue in spooling:
                queue.ready.spool.record_batch()  # type: ignore[union-attr]  # what waits, were no more to arrive
            growing = sum(cost for queue, cost in costs.items() if queue not in spooling)
            for queue in sorted(costs, key=costs.__getitem__, reverse=True):
                if growing <= self.in_force * RESUME_AT:
                    break
                if queue in spooling or queue.ready.spooler is None:
                    continue
                if queue.ready.spool is None and queue.memory_use[0] <= window:
                    continue
                queue.ready.spool_behind(window)
                growing -= costs[queue]
                self._spooling()
        elif used < self.in_force * RESUME_AT:
            for queue in costs:
                if queue.ready.spool is not None and queue.ready.spool.recording:
                    queue.ready.hold_spool()

    def _follow_flow(self) -> None:
        """Publishers are slowed while a queue with consumers falls far behind what arrives:
        past the broker's capacity, deliveries keep their pace instead of ceding the reactor to
        reading more publishes (RabbitMQ's credit flow)."""
        behind = [
            queue for queue in self.watched if queue.message_count > self.flow_depth and queue.consumer_count
        ]
        flow = bool(behind)
        if flow == self.flow:
            return
        self.flow = flow
        if flow and not self._flow_logged:
            self._flow_logged = True
            self.log.info(
                "publishers are slowed while queue {queue!r} with consumers has more than {depth} ready messages",
                queue=behind[0].name,
                depth=self.flow_depth,
            )
        if self.on_flow is not None:
            self.on_flow(flow)

    def _spooling(self) -> None:
        """A queue starts to spool: say so the first time."""
        if not self._spooling_logged and self.spooler is not None:
            self._spooling_logged = True
            self.log.info(
                "queues over the memory budget ({budget} bytes) spool what arrives to disk,"
                " and refill from there a window of {window} ready messages",
                budget=self.budget,
                window=self.spooler.window,
            )

    def _page(self, queue: WorkQueue, window: int) -> bool:
        """Page ``queue``'s bodies behind its ``window``; ``False`` when the store failed."""
        entries = queue.ready.to_page(window)
        to_store: list[Message] = []
        done = []
        for entry in entries:
            message = entry.message
            if not message.resident:
                done.append(entry)
            elif message.wal_location is not None:
                if self.journal is not None:
                    self.journal.bodies.uncount(message)
                message.page_out()
                done.append(entry)
            elif not message.wal_queues:
                to_store.append(message)
                done.append(entry)
            # else: its log record is not written yet; it keeps its body until it is.
        stored = {id(message) for message in to_store}
        try:
            self.store.write(to_store)
        except OSError as error:
            self._paused_until = self.reactor.seconds() + BACKOFF
            self.log.warn(
                "cannot page message bodies to disk ({error}); they stay in memory for now",
                error=error.strerror or str(error),
            )
            queue.ready.mark_paged(entry for entry in done if id(entry.message) not in stored)
            return False
        queue.ready.mark_paged(done)
        if done and not self._logged:
            self._logged = True
            self.log.info(
                "message bodies of deep queues over the memory budget ({budget} bytes) are paged to disk",
                budget=self.budget,
            )
        return True

    def attach_all(self, queues: Iterable[WorkQueue]) -> None:
        """Queues that existed before the pager (recovered, or from the definitions)."""
        for queue in queues:
            self.attach(queue)
            if queue.ready.ready_bytes > self.watch_at:
                self.watch(queue)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        if self.watched and self._call is None:
            self._call = self.reactor.callLater(0, self.look)

    def stopService(self) -> Any:
        if self._call is not None:
            self._call.cancel()
            self._call = None
        self.store.close()
        return super().stopService()  # type: ignore[no-untyped-call]

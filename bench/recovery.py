"""Recovery time and disk bytes per message: a log of N persistent messages, replayed into a broker.

Writes a log with one durable queue holding N persistent messages (as the broker records
them), then times what the broker does at start: open the log (every CRC checked), fold
the records, and rebuild the queue (its window in memory, the rest spooled as records).
Prints disk bytes per live message too.

    python bench/recovery.py [--messages 1000000] [--size 1024] [--dir /tmp/postroom-recovery]
"""

from __future__ import annotations

import argparse
import gc
import resource
import shutil
import tempfile
import time
from pathlib import Path

from pamqp import commands

from postroom.broker.core.definitions import node_from_config
from postroom.broker.core.journal import Journal
from postroom.broker.core.message import Message
from postroom.broker.server.alarms import release_memory
from postroom.broker.storage.body_paging import Pager
from postroom.broker.storage.page_store import PageStore
from postroom.broker.storage.spool_files import SPOOL_DIR, SPOOL_WINDOW, Spooler
from postroom.broker.wal.codec import encode
from postroom.broker.wal.files import DirectoryStorage
from postroom.broker.wal.log import WriteAheadLog
from postroom.broker.wal.records import QueueDeclared
from postroom.broker.wal.recovery import replay_located
from postroom.config.schema import BrokerConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--memory-budget", type=int, default=256 << 20, help="bytes of bodies kept in memory")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="postroom-recovery-"))
    shutil.rmtree(directory, ignore_errors=True)
    gc.freeze()
    gc.set_threshold(100_000, 20, 100)

    started = time.perf_counter()
    log = WriteAheadLog(DirectoryStorage(str(directory)))
    log.open()
    journal = Journal()
    log.append(encode(QueueDeclared("/", "work", True, False, b"")))
    properties = commands.Basic.Properties(delivery_mode=2)
    body = b"x" * args.size
    for _ in range(args.messages // 1000):
        for _ in range(1000):
            journal.published(Message.build("", "work", body, properties), "/", ("work",))
        data, _position = journal.take()
        if log.should_rotate(len(data)):
            log.rotate()
        log.append(data)
    log.sync()
    written = time.perf_counter() - started
    disk = sum(path.stat().st_size for path in directory.glob("*.wal"))
    print(
        f"wrote {args.messages:,} messages of {args.size} B in {written:.1f} s; "
        f"{disk / args.messages:.0f} disk bytes each"
    )

    started = time.perf_counter()
    log = WriteAheadLog(DirectoryStorage(str(directory)))
    report = log.open()
    opened = time.perf_counter() - started
    snapshot = replay_located(log.located_records())
    log.forget()
    folded = time.perf_counter() - started
    journal = Journal(snapshot.max_message_id + 1)
    pager = Pager(PageStore(str(directory / "paging")), args.memory_budget, None, journal)
    pager.spooler = Spooler(str(directory / SPOOL_DIR), pager.store, journal, log.storage.read_at, SPOOL_WINDOW)
    node = node_from_config(BrokerConfig(), None, journal, snapshot, log.storage.read_at, pager=pager)
    paged = pager.page_logged()
    total = time.perf_counter() - started
    del snapshot  # as the broker does once started: the records held every body
    gc.collect()
    release_memory()
    queue = node.vhosts["/"].queues["work"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open("/proc/self/statm") as statm:
        now_mib = int(statm.read().split()[1]) * resource.getpagesize() / (1 << 20)
    print(
        f"recovered {queue.message_count:,} messages from {report.segments} segments in {total:.1f} s "
        f"(read and checked {opened:.1f} s, folded {folded - opened:.1f} s, rebuilt {total - folded:.1f} s); "
        f"{paged:,} bodies left in the log; RSS after recovery {now_mib:.0f} MiB, peak {rss:.0f} MiB"
    )
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()

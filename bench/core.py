"""Per-message cost of the sans-IO core, without sockets: publish -> route -> enqueue -> deliver -> ack.

Feeds one connection a stream of ``basic.publish`` frames (as the load generator sends them)
while a consumer on a second connection receives and acks every 100 deliveries. Prints
microseconds per message, to compare with the hot-path budget (9 µs).

With ``--depth N`` the queue is kept N messages deep throughout (N published before the
consumer starts): in memory, as under the memory budget, or with ``--spool`` through the spool
(a budget of 0, so the queue spools behind its window of 4,096; files in a temporary
directory). With ``--persistent`` the messages are persistent in a durable queue and logged
(the log in memory), so spooled ones point into the log; with ``--single-acks`` the consumer
acks each delivery on its own, as most consumers do, 100 acks to a read. Instructions per
message, counted exactly with callgrind, are the difference between two runs divided by the
difference in messages:

    python bench/core.py [--messages 200000] [--size 16] [--profile] [--limited] [--depth 20000 [--spool]]
                         [--persistent] [--single-acks]
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/core.py --messages 10000 --depth 20000 --spool
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

from pamqp import commands, frame, header
from pamqp.body import ContentBody
from twisted.internet.task import Clock

from postroom.broker.amqp.connection import ServerConnection
from postroom.broker.core.journal import Journal
from postroom.broker.core.node import Node
from postroom.broker.core.users import User
from postroom.broker.server.service import tune_gc
from postroom.broker.storage.body_paging import Pager
from postroom.broker.storage.page_store import PageStore
from postroom.broker.storage.spool_files import SPOOL_DIR, SPOOL_WINDOW, Spooler
from postroom.broker.tools.testing import MemorySegmentStorage
from postroom.broker.wal.log import WriteAheadLog
from postroom.config.schema import Permission


def _handshake(connection: ServerConnection) -> None:
    connection.receive_data(b"AMQP\x00\x00\x09\x01")
    for method in (
        commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"),
        commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
        commands.Connection.Open(virtual_host="/"),
    ):
        connection.receive_data(frame.marshal(method, 0))
    connection.receive_data(frame.marshal(commands.Channel.Open(), 1))
    connection.data_to_send()


#: ``--limited``: guest may touch only the queue ``bench`` (and publish to the default exchange).
LIMITED = Permission(configure="^bench$", write="^(bench|amq\\.default)$", read="^bench$")


def run(
    messages: int,
    size: int,
    profile: bool,
    limited: bool = False,
    depth: int = 0,
    spool: str | None = None,
    persistent: bool = False,
    single_acks: bool = False,
) -> float:
    """Return microseconds per message through the whole path.

    :param depth: messages kept queued ahead of the consumer
    :param spool: a directory: queues spool behind their window (memory is always short)
    :param persistent: persistent messages in a durable queue, logged (the log in memory,
        written after every 100 publishes); spooled, they point into it
    :param single_acks: the consumer acks each delivery on its own (100 acks in one read)
    """
    node = Node(users=[User("guest", password="guest", permissions={"/": LIMITED})]) if limited else Node()
    journal = log = None
    if persistent:
        journal = Journal(1, Clock().seconds)
        log = WriteAheadLog(MemorySegmentStorage())
        log.open()
        node.set_journal(journal)
    if spool is not None:
        pager = Pager(PageStore(os.path.join(spool, "paging")), 0, Clock(), journal)
        read_log = log.storage.read_at if log is not None else None
        pager.spooler = Spooler(os.path.join(spool, SPOOL_DIR), pager.store, journal, read_log, SPOOL_WINDOW)
        node.set_pager(pager)

    def write() -> None:
        """What the log's writer does: append what is pending, report it durable."""
        if journal is not None and log is not None:
            data, position = journal.take(log.active, log.size, log.storage.read_at)
            log.append(data)
            journal.synced_to(position)

    publisher = ServerConnection(node)
    consumer = ServerConnection(node)
    _handshake(publisher)
    _handshake(consumer)
    consumer.receive_data(
        frame.marshal(commands.Queue.Declare(queue="bench", durable=persistent), 1)
        + frame.marshal(commands.Basic.Qos(prefetch_count=1000), 1)
    )
    consumer.data_to_send()
    body = b"x" * size
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    one = (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key="bench"), 1)
        + frame.marshal(header.ContentHeader(0, size, properties), 1)
        + frame.marshal(ContentBody(body), 1)
    )
    batch = one * 100
    for _ in range(depth // 100):
        publisher.receive_data(batch)
        write()
    publisher.data_to_send()
    consumer.receive_data(frame.marshal(commands.Basic.Consume(queue="bench", consumer_tag="c"), 1))
    consumer.data_to_send()
    if single_acks:
        acks = [
            b"".join(frame.marshal(commands.Basic.Ack(delivery_tag=tag), 1) for tag in range(first, first + 100))
            for first in range(1, messages + 1, 100)
        ]
    else:
        acks = [
            frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=True), 1)
            for tag in range(100, messages + 1, 100)
        ]
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for i in range(messages // 100):
        publisher.receive_data(batch)
        write()
        publisher.data_to_send()
        consumer.data_to_send()
        consumer.receive_data(acks[i])
    if profiler:
        profiler.disable()
    elapsed = time.perf_counter() - start
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    queue = node.vhosts["/"].queues["bench"]
    assert queue.unacked_count == min(depth, 1000) and queue.message_count == max(depth - 1000, 0)
    assert (queue.ready.spool is not None) == (spool is not None and depth > SPOOL_WINDOW + 1000)
    return elapsed / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--limited", action="store_true", help="as a user with permission patterns to check")
    parser.add_argument("--depth", type=int, default=0, help="messages kept queued ahead of the consumer")
    parser.add_argument("--spool", action="store_true", help="the queue spools behind its window")
    parser.add_argument("--persistent", action="store_true", help="persistent messages, logged (the log in memory)")
    parser.add_argument("--single-acks", action="store_true", help="each delivery acked on its own")
    args = parser.parse_args()
    tune_gc()  # as the broker runs (else collections of the deep queue's objects blur the counts)
    with tempfile.TemporaryDirectory(prefix="postroom-core-") as directory:
        cost = run(
            args.messages,
            args.size,
            args.profile,
            args.limited,
            args.depth,
            directory if args.spool else None,
            args.persistent,
            args.single_acks,
        )
    where = f", {args.depth:,} deep{' through the spool' if args.spool else ' in memory'}" if args.depth else ""
    kinds = [f"{args.size} B"]
    kinds += ["persistent"] if args.persistent else []
    kinds += ["single acks"] if args.single_acks else []
    kinds += ["limited user"] if args.limited else []
    print(f"{cost:.2f} us/message ({', '.join(kinds)}{where})")


if __name__ == "__main__":
    main()

"""A stream-protocol connection's commands on streams themselves: ``create``, ``delete``,
``metadata`` and ``stream_stats``, as RabbitMQ's ``rabbit_stream_manager`` answers them."""

from __future__ import annotations

import struct

from postroom.broker.core.stream import StreamQueue
from postroom.broker.errors import ChannelCrash, ChannelException
from postroom.broker.streams.session import Session
from postroom.broker.wire import streamframes as wire

#: ``create`` arguments and the stream arguments they become (``rabbit_stream_manager``);
#: others are ignored, as RabbitMQ ignores them.
CREATE_ARGUMENTS: dict[str, tuple[str, type[int] | type[str]]] = {
    "max-length-bytes": ("x-max-length-bytes", int),
    "max-age": ("x-max-age", str),
    "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
    "initial-cluster-size": ("x-initial-cluster-size", int),
    "queue-leader-locator": ("x-queue-leader-locator", str),
}


def stream_arguments(session: Session, name: str, arguments: dict[str, str]) -> dict[str, object] | None:
    """A stream's declaration arguments from ``create``'s (or ``create_super_stream``'s);
    ``None`` (the connection ends, as RabbitMQ's reader fails on the conversion) for a number
    that is not one."""
    declared: dict[str, object] = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        if key in CREATE_ARGUMENTS:
            argument, kind = CREATE_ARGUMENTS[key]
            try:
                declared[argument] = int(value) if kind is int else value
            except ValueError:
                session.end(f"create of stream '{name}': '{key}' is not an integer: {value!r}")
                return None
    return declared


def clean_name(name: str) -> str:
    """A stream's (or super stream's) name as it is created: without line breaks."""
    return name.replace("\n", "").replace("\r", "")


class Topology:
    """The commands of ``session`` that create, delete and describe streams."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def create(self, command: wire.CreateStream) -> None:
        session, correlation = self.session, command.correlation
        name = clean_name(command.stream)
        if not name or name.startswith("amq."):
            session.answer(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED)
            return
        if not session.permitted("configure", name):
            session.answer(wire.CREATE_STREAM, correlation, wire.ACCESS_REFUSED)
            return
        declared = stream_arguments(session, name, command.arguments)
        if declared is None:
            return
        vhost = session.opened_vhost
        existed = name in vhost.queues
        try:
            # (an existing queue is checked as a declaration checks it: the same stream is
            # "already exists", another queue or other arguments "precondition failed")
            vhost.declare_queue(name, session, durable=True, arguments=declared)
        except ChannelCrash:
            # (a max-age that is not one: RabbitMQ's stream coordinator fails, and so does
            # the reader waiting on it)
            session.end(f"create of stream '{name}': its arguments do not hold: {command.arguments!r}")
            return
        except ChannelException:
            session.answer(wire.CREATE_STREAM, correlation, wire.PRECONDITION_FAILED)
            return
        code = wire.STREAM_ALREADY_EXISTS if existed else wire.OK
        session.answer(wire.CREATE_STREAM, correlation, code)

    def delete(self, command: wire.DeleteStream) -> None:
        session, correlation, name = self.session, command.correlation, command.stream
        if not session.permitted("configure", name):
            session.answer(wire.DELETE_STREAM, correlation, wire.ACCESS_REFUSED)
            return
        vhost = session.opened_vhost
        stream = vhost.queues.get(name)
        if not isinstance(stream, StreamQueue):
            session.answer(wire.DELETE_STREAM, correlation, wire.STREAM_DOES_NOT_EXIST)
            return
        session.answer(wire.DELETE_STREAM, correlation, wire.OK)
        vhost.remove_queue(stream)  # (this connection's metadata_update follows the answer)

    def metadata(self, command: wire.Metadata) -> None:
        session = self.session
        host, port = session.advertised
        streams: list[tuple[str, int, int, list[int]]] = []
        found = False
        # (RabbitMQ folds a map of the names: each once, the last in byte order first)
        for name in sorted(set(command.streams), key=lambda n: n.encode("utf-8", "surrogateescape"), reverse=True):
            if session.stream(name) is None:
                streams.append((name, wire.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
            else:
                found = True
                streams.append((name, wire.OK, 0, []))
        brokers = [(0, host, port)] if found else []
        session.out.append(wire.metadata_response(command.correlation, brokers, streams))

    def stats(self, command: wire.StreamStats) -> None:
        """RabbitMQ 3.11's ``stream_stats``: osiris's (1.4 on) ``committed_chunk_id``,
        ``first_chunk_id`` and ``last_chunk_id`` (the first offsets of the newest chunk every
        copy has, of the oldest chunk and of the newest one written; -1 when there is none),
        in that order (RabbitMQ folds a map of them, whose keys go in byte order), for a user
        who may read the stream. One node's newest chunk written is the newest committed."""
        session, correlation, name = self.session, command.correlation, command.stream
        if not session.permitted("read", name):
            session.answer(wire.STREAM_STATS, correlation, wire.ACCESS_REFUSED, wire.u32(0))
            return
        stream = session.stream(name)
        if stream is None:
            session.answer(wire.STREAM_STATS, correlation, wire.STREAM_DOES_NOT_EXIST, wire.u32(0))
            return
        log = stream.log
        first = log.locate(log.first_offset) if stream.committed else None
        last = log.locate(stream.committed - 1) if stream.committed else None
        newest = last.first_offset if last is not None else -1
        stats = {
            "committed_chunk_id": newest,
            "first_chunk_id": first.first_offset if first is not None else -1,
            "last_chunk_id": newest,
        }
        body = wire.u32(len(stats)) + b"".join(
            wire.string(key) + struct.pack(">q", value) for key, value in stats.items()
        )
        session.answer(wire.STREAM_STATS, correlation, wire.OK, body)

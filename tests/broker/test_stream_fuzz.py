"""The stream protocol's connection under structured random input: any run of requests of every
command (fields of any value, some cut short or with a wrong version), responses, publish
batches whose counts lie, publishing ids repeated within a frame, bursts that fill chunks and
stray bytes, cut and mutated, leaves it answering or closing,
never raising, never with 15 INTERNAL_ERROR, and releasing everything once gone.

A short run of this is part of the test command; ``bench/fuzz_streams.py`` runs the
coverage-guided fuzzer for as long as it is asked (docs/stream-protocol.md has its figures).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.broker.streams.connection import StreamConnection
from postroom.broker.streams.handshake import Step
from postroom.broker.streams.superstreams import SuperStreams
from postroom.broker.tools.fuzzing import (
    STREAM_SESSION_START,
    stream_publish,
    stream_request,
    stream_run_once,
    sub_entry_batch,
)
from postroom.broker.wire import streamframes as wire
from tests.broker.amqp.test_fuzz_core import cut_and_mutated

NAMES = st.one_of(st.sampled_from(["s", "p", "c", "g", "", "amq.x", "s" * 256]), st.text(max_size=12))
MAPS = st.dictionaries(
    st.one_of(st.sampled_from(["single-active-consumer", "name", "super-stream", "max-age"]), st.text(max_size=6)),
    st.one_of(st.sampled_from(["true", "false", "g", "1h", "1000"]), st.text(max_size=6)),
    max_size=4,
)
U8, U16, U32, U64 = (st.integers(0, 2**bits - 1) for bits in (8, 16, 32, 64))
I16 = st.integers(-(2**15), 2**15 - 1)


def _string(value: str) -> bytes:
    return wire.string(value)


def _strings(values: list[str]) -> bytes:
    return wire.strings(values)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One request of any command, its fields drawn by their types."""
    key = draw(st.integers(1, 31))
    correlation = draw(U32)
    offset_kind = draw(st.one_of(st.integers(1, 5), I16))
    offset = struct.pack(">Q", draw(U64)) if offset_kind in (4, 5) else b""
    bodies = {
        wire.DECLARE_PUBLISHER: lambda: bytes([draw(U8)]) + _string(draw(NAMES)) + _string(draw(NAMES)),
        wire.QUERY_PUBLISHER_SEQUENCE: lambda: _string(draw(NAMES)) + _string(draw(NAMES)),
        wire.DELETE_PUBLISHER: lambda: bytes([draw(U8)]),
        wire.SUBSCRIBE: lambda: (
            bytes([draw(U8)])
            + _string(draw(NAMES))
            + struct.pack(">h", offset_kind)
            + offset
            + struct.pack(">H", draw(U16))
            + (wire.string_map(draw(MAPS)) if draw(st.booleans()) else b"")
        ),  # fmt: skip
        wire.QUERY_OFFSET: lambda: _string(draw(NAMES)) + _string(draw(NAMES)),
        wire.UNSUBSCRIBE: lambda: bytes([draw(U8)]),
        wire.CREATE_STREAM: lambda: _string(draw(NAMES)) + wire.string_map(draw(MAPS)),
        wire.DELETE_STREAM: lambda: _string(draw(NAMES)),
        wire.METADATA: lambda: wire.strings(draw(st.lists(NAMES, max_size=3))),
        wire.PEER_PROPERTIES: lambda: wire.string_map(draw(MAPS)),
        wire.SASL_AUTHENTICATE: lambda: (
            _string(draw(st.sampled_from(["PLAIN", "AMQPLAIN", "EXTERNAL", ""])))
            + struct.pack(">i", len(response := draw(st.binary(max_size=20))))
            + response
        ),  # fmt: skip
        wire.OPEN: lambda: _string(draw(st.sampled_from(["/", "other", ""]))),
        wire.CLOSE: lambda: struct.pack(">H", draw(U16)) + _string(draw(NAMES)),
        wire.ROUTE: lambda: _string(draw(NAMES)) + _string(draw(NAMES)),
        wire.PARTITIONS: lambda: _string(draw(NAMES)),
        wire.CREATE_SUPER_STREAM: lambda: (
            _string(draw(NAMES))
            + _strings(draw(st.lists(NAMES, max_size=3)))
            + _strings(draw(st.lists(NAMES, max_size=3)))
            + wire.string_map(draw(MAPS))
        ),  # fmt: skip
        wire.DELETE_SUPER_STREAM: lambda: _string(draw(NAMES)),
        wire.STREAM_STATS: lambda: _string(draw(NAMES)),
        wire.EXCHANGE_COMMAND_VERSIONS: lambda: (
            struct.pack(">I", len(versions := draw(st.lists(st.tuples(U16, U16, U16), max_size=3))))
            + b"".join(struct.pack(">HHH", *each) for each in versions)
        ),  # fmt: skip
    }
    if key == wire.PUBLISH:
        # Ids of any value, or small ones that repeat within the frame and across frames.
        messages = draw(st.lists(st.tuples(st.one_of(U64, st.integers(0, 3)), st.binary(max_size=30)), max_size=4))
        # Now and then a burst that fills a chunk or two (the first holds 32 entries).
        burst, first = draw(st.sampled_from([0, 0, 0, 40, 100])), draw(st.integers(0, 50))
        messages += [(first + n, b"\x00Sw\xa1\x01x") for n in range(burst)]
        inner = st.lists(st.binary(max_size=12), max_size=3)
        batches = draw(st.lists(st.tuples(U64, st.builds(sub_entry_batch, inner, st.integers(0, 7))), max_size=2))
        batches = [
            (number, draw(st.sampled_from([batch, batch[:1] + batch[2:3] + batch[1:2] + batch[3:]])))
            for number, batch in batches
        ]  # (some with their count's bytes swapped)
        return stream_publish(draw(U8), messages, batches)
    if key == wire.CREDIT:
        return wire.frame(wire.CREDIT, bytes([draw(U8)]) + struct.pack(">h", draw(I16)))
    if key == wire.STORE_OFFSET:
        return wire.frame(wire.STORE_OFFSET, _string(draw(NAMES)) + _string(draw(NAMES)) + struct.pack(">Q", draw(U64)))
    if key == wire.HEARTBEAT:
        return wire.HEARTBEAT_FRAME
    if key == wire.TUNE:
        return wire.frame(wire.TUNE | wire.RESPONSE, struct.pack(">II", draw(U32), draw(U32)))
    if key == wire.CONSUMER_UPDATE:
        body = struct.pack(">IHHQ", draw(st.integers(0, 3)), draw(st.integers(0, 2)), offset_kind & 0xFFFF, draw(U64))
        return wire.frame(wire.CONSUMER_UPDATE | wire.RESPONSE, body)
    make = bodies.get(key)
    if make is None:  # a response to anything, or a key no one reads
        return wire.frame(key | draw(st.sampled_from([0, wire.RESPONSE])), draw(st.binary(max_size=12)))
    return stream_request(key, correlation, make())


def sessions() -> st.SearchStrategy[bytes]:
    """A run of requests and stray bytes, then perhaps cut short and a few bytes changed."""
    return cut_and_mutated(st.one_of(requests(), st.binary(min_size=1, max_size=12)))


@settings(max_examples=400, deadline=None)
@given(mode=st.integers(0, 255), session=sessions())
def test_any_request_stream_gets_an_answer_or_a_close(mode: int, session: bytes) -> None:
    stream_run_once(bytes([mode]) + session)


def test_the_session_start_opens_and_reaches_every_kind_of_user() -> None:
    """(What the fuzzer builds on: a run of it ends open, with a publisher and subscriptions.)"""
    seen: list[StreamConnection] = []
    lost = StreamConnection.connection_lost

    def record(self: StreamConnection) -> None:
        seen.append(self)
        assert self.step is Step.OPENED and set(self.publishers) == {1} and set(self.subscriptions) == {1, 2}
        lost(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StreamConnection, "connection_lost", record)
        stream_run_once(b"\x03")
    assert len(seen) == 2
    assert STREAM_SESSION_START.count(b"single-active-consumer") == 1


def test_the_harness_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: SuperStreams, command: wire.Partitions) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(SuperStreams, "partitions", broken)
    with pytest.raises(RuntimeError):
        stream_run_once(b"\x01" + stream_request(wire.PARTITIONS, 9, wire.string("s")))

    def leaky(self: StreamConnection) -> None:
        self.finished = True

    monkeypatch.setattr(StreamConnection, "connection_lost", leaky)
    with pytest.raises(AssertionError, match="still listed"):
        stream_run_once(b"\x01")

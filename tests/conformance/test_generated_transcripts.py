"""The generated protocol cases (:mod:`generated_cases`), each run against RabbitMQ and Postroom.

RabbitMQ's transcripts are recorded once per run, all cases at once over
:data:`PARALLEL` connections, and Postroom's likewise against one broker of this module;
each case is then one test comparing the two. A read ends on a close, the end of the
stream, or :data:`QUIET` seconds without a byte (the answer to most of these inputs is a
close, to some it is silence); the connection is then ended as a client would (``close-ok``
to the broker's close, or its own ``connection.close``), and that is recorded too. A case
whose transcripts differ fails; it is run once more on each broker, alone, and the failure
says whether the difference repeated (one that does not is a race in a broker or a read the
harness cut short: a finding either way, not noise).

Reply texts are compared by their code's name where RabbitMQ's text quotes Erlang terms
(``FRAME_ERROR - type 2, all octets = <<>>: {frame_too_short,…}``); everywhere else, whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest
from generated_cases import MISSING_EXCHANGE, Case, all_cases
from pamqp import commands
from transcript import (
    CLOSES,
    Entry,
    Stop,
    Transcript,
    assert_same_transcript,
    close_connection,
    connection_close,
    delete_queues,
    frames,
    loose_erlang_text,
    method,
    open_connection,
    until,
)
from transcript import content as content_frames
from twisted.internet import threads
from twisted.logger import formatEventAsClassicLogText, globalLogPublisher

from postroom.broker.core.node import Node
from postroom.broker.server.protocol import AMQPServerFactory
from tests.conftest import BROKER_PORTS, CRASH_TEXTS

pytestmark = pytest.mark.integration

CASES = all_cases()
#: Connections running cases at once, per broker.
PARALLEL = 24
#: Seconds of silence that end a read (an answer comes in milliseconds; silence is an answer).
QUIET = 1.0


def run_case(port: int, case: Case) -> list[Entry]:
    """One case on a fresh connection: setup, the case's bytes, what follows, and the ending
    (with the other connection its setup needs, open meanwhile; its queues deleted after)."""
    with ExitStack() as stack:
        if case.other:
            other = stack.enter_context(Transcript().connect(port))
            open_connection(other, 1)
            other.send(case.other)
            other.read(until("Queue.DeclareOk", channel=1))
        entries = _run_case(port, case)
        if case.other:
            close_connection(other)
    if case.cleanup:
        delete_queues(port, *case.cleanup)
    return entries


def _run_case(port: int, case: Case) -> list[Entry]:
    transcript = Transcript()
    with transcript.connect(port) as client:
        open_connection(client, 1)
        if case.setup == "closing":
            client.send(method(1, commands.Basic.Publish, exchange=MISSING_EXCHANGE, routing_key="k"))
            client.send(content_frames(1, b"x"))
            client.read(until("Channel.Close"))
            transcript.note("channel 1 closing")
        elif case.setup == "content":
            client.send(method(1, commands.Basic.Publish, exchange="", routing_key="conformance-generated"))
            client.send(content_frames(1, b"xy")[: -(7 + 2 + 1)])  # the header, not the body
        client.send(case.data)
        got = client.read(Stop(CLOSES, quiet=QUIET))
        last = got[-1].kind if got else ""
        if last == "Connection.Close":
            client.send(frames(0, commands.Connection.CloseOk()))
            client.read(Stop(quiet=QUIET))
        elif last != "CLOSED":
            if last == "Channel.Close":
                client.send(frames(got[-1].channel, commands.Channel.CloseOk()))
            client.send(connection_close())
            client.read(Stop(frozenset({"Connection.CloseOk"}), quiet=QUIET))
    return [loose_erlang_text(entry) for entry in transcript.normalized()]


def run_all(port: int, cases: list[Case]) -> dict[str, list[Entry]]:
    """Every case's transcript, :data:`PARALLEL` at a time."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        transcripts = list(pool.map(lambda case: run_case(port, case), cases))
    return {case.name: transcript for case, transcript in zip(cases, transcripts, strict=True)}


@pytest.fixture(scope="module")
def rabbitmq_transcripts(rabbitmq_port: int) -> dict[str, list[Entry]]:
    return run_all(rabbitmq_port, CASES)


@pytest.fixture(scope="module")
def postroom(broker_reactor: Any) -> Iterator[tuple[int, list[str]]]:
    """One broker for the module's cases: its port and what it logged as a failure meanwhile."""
    node = Node()

    def listen() -> tuple[AMQPServerFactory, Any]:
        factory = AMQPServerFactory(node, broker_reactor)
        return factory, broker_reactor.listenTCP(0, factory, interface="127.0.0.1")

    factory, listening = threads.blockingCallFromThread(broker_reactor, listen)
    port = listening.getHost().port
    BROKER_PORTS.add(port)
    failures: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        text = str(event.get("log_format") or "")
        if event.get("log_failure") is not None or any(crash in text for crash in CRASH_TEXTS):
            failures.append(formatEventAsClassicLogText(event) or text)

    globalLogPublisher.addObserver(observe)
    try:
        yield port, failures
    finally:
        globalLogPublisher.removeObserver(observe)

        def stop() -> Any:
            factory.close_all()
            return listening.stopListening()

        threads.blockingCallFromThread(broker_reactor, stop)


@pytest.fixture(scope="module")
def postroom_transcripts(postroom: tuple[int, list[str]]) -> dict[str, list[Entry]]:
    return run_all(postroom[0], CASES)


def _connection_close_at(entries: list[Entry]) -> int | None:
    for index, entry in enumerate(entries):
        if entry.kind == "Connection.Close":
            return index
    return None


def lost_before_close(expected: list[Entry], actual: list[Entry]) -> bool:
    """Whether ``expected`` (RabbitMQ's) is ``actual`` with replies lost just before the
    broker's ``connection.close``, or written after it.

    RabbitMQ's channels are processes of their own, writing through a writer process, and an
    error that closes the connection (541 when a channel crashes on a headers table cut inside
    a value, 540 for ``basic.recover`` with ``requeue=false`` on another channel, 503 for a
    server-only method) is sent by the reader. Replies a channel made to the frames before (a
    ``queue.declare-ok``, a ``channel.open-ok``) are then written before the close, after it
    or not at all as the processes race: alone they always come first, on a loaded machine
    sometimes not (seen about once in 2,000 cases with four test workers). Postroom always
    writes them first. Such a first run is taken as RabbitMQ's race only when both brokers
    then answer alike run alone (:func:`compare_case`), and it is listed in the docs'
    "Differences from RabbitMQ".
    """
    at_expected, at_actual = _connection_close_at(expected), _connection_close_at(actual)
    if at_expected is None or at_actual is None or at_actual <= at_expected:
        return False
    if expected[:at_expected] != actual[:at_expected] or expected[at_expected] != actual[at_actual]:
        return False
    held, rest = actual[at_expected:at_actual], actual[at_actual + 1 :]
    # After its close, RabbitMQ's transcript is Postroom's, with some of the held replies (in
    # their order) written in among it, before its end.
    taken_held = taken_rest = 0
    for entry in expected[at_expected + 1 :]:
        if taken_rest < len(rest) and entry == rest[taken_rest]:
            taken_rest += 1
        elif taken_rest < len(rest) and entry in held[taken_held:]:
            taken_held = held.index(entry, taken_held) + 1
        else:
            return False
    return taken_rest == len(rest)


def compare_case(
    case: Case,
    expected: list[Entry],
    actual: list[Entry],
    rerun: Callable[[], tuple[list[Entry], list[Entry]]],
) -> None:
    """The case's two first-run transcripts are the same; a difference is run again alone, and
    reported with what the rerun showed (a difference that does not repeat is a finding too:
    a race in one broker, or a read the harness cut). RabbitMQ's own race before a connection
    close (:func:`lost_before_close`) is not one, when the rerun alone shows none."""
    if expected == actual:
        return
    if lost_before_close(expected, actual):
        again_expected, again_actual = rerun()
        if again_expected == again_actual:
            return
        assert_same_transcript(again_expected, again_actual, ("rabbitmq", "postroom"))
    try:
        assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))
    except AssertionError as first:
        again_expected, again_actual = rerun()
        repeated = "repeated when run alone" if again_expected != again_actual else "not repeated when run alone"
        raise AssertionError(f"{case.name}: differs on its first run ({repeated})\n{first}") from None


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_generated_case_matches_rabbitmq(
    case: Case,
    rabbitmq_port: int,
    postroom: tuple[int, list[str]],
    rabbitmq_transcripts: dict[str, list[Entry]],
    postroom_transcripts: dict[str, list[Entry]],
) -> None:
    compare_case(
        case,
        rabbitmq_transcripts[case.name],
        postroom_transcripts[case.name],
        lambda: (run_case(rabbitmq_port, case), run_case(postroom[0], case)),
    )


def test_no_generated_case_made_postroom_log_a_failure(
    postroom: tuple[int, list[str]], postroom_transcripts: dict[str, list[Entry]]
) -> None:
    assert len(postroom_transcripts) == len(CASES)
    assert postroom[1] == []


def test_every_family_is_generated() -> None:
    families = {case.family for case in CASES}
    assert families == {"place", "truncated", "table", "frame", "content", "declare"}
    assert len(CASES) > 500


def test_only_replies_lost_or_late_around_rabbitmqs_connection_close_are_let_pass() -> None:
    declare_ok = Entry(1, "Queue.DeclareOk", (("queue", "q"),))
    close = Entry(0, "Connection.Close", (("reply_code", 541), ("reply_text", "INTERNAL_ERROR - …")))
    start, ended = Entry(1, "Channel.OpenOk", ()), Entry(0, "CLOSED", ())
    postroom = [start, declare_ok, close, ended]
    assert lost_before_close([start, close, ended], postroom)
    assert not lost_before_close(postroom, postroom)  # nothing lost: compared as usual
    assert not lost_before_close([start, declare_ok, close, ended], [start, close, ended])  # Postroom's loss
    other = Entry(0, "Connection.Close", (("reply_code", 505), ("reply_text", "UNEXPECTED_FRAME - …")))
    assert lost_before_close([start, other, ended], [start, declare_ok, other, ended])
    assert not lost_before_close([start, close, ended], [start, declare_ok, other, ended])  # another close
    channel_close = Entry(1, "Channel.Close", (("reply_code", 404), ("reply_text", "NOT_FOUND - …")))
    assert not lost_before_close([start, channel_close], [start, declare_ok, channel_close])  # a channel's
    assert not lost_before_close([declare_ok, close, ended], [start, declare_ok, close, ended])
    assert lost_before_close([start, close, declare_ok, ended], postroom)  # written after the close
    assert not lost_before_close([start, close, ended, declare_ok], postroom)  # after the socket closed
    assert not lost_before_close([start, close, other, ended], postroom)  # not one it held
    opened = Entry(2, "Channel.OpenOk", ())
    both = [start, declare_ok, opened, close, ended]
    assert lost_before_close([start, close, opened, ended], both)
    assert not lost_before_close([start, close, opened, declare_ok, ended], both)  # out of order

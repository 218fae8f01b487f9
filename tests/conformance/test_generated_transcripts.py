"""The generated protocol cases (:mod:`generated_cases`), each run against RabbitMQ and Postroom.

RabbitMQ's transcripts are recorded once per run, all cases at once over
:data:`PARALLEL` connections, and Postroom's likewise against one broker of this module;
each case is then one test comparing the two. A read ends on a close, the end of the
stream, or :data:`QUIET` seconds without a byte (the answer to most of these inputs is a
close, to some it is silence); the connection is then ended as a client would (``close-ok``
to the broker's close, or its own ``connection.close``), and that is recorded too. A case
whose transcripts differ is run once more on each broker, one connection at a time, so a
read that a loaded machine cut short cannot fail it; a real difference shows both times.

Reply texts are compared by their code's name where RabbitMQ's text quotes Erlang terms
(``FRAME_ERROR - type 2, all octets = <<>>: {frame_too_short,…}``); everywhere else, whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
    connection_close,
    frames,
    loose_reply_text,
    method,
    open_connection,
    until,
)
from transcript import content as content_frames
from twisted.internet import threads
from twisted.logger import formatEventAsClassicLogText, globalLogPublisher

from broker.core.node import Node
from broker.protocol import AMQPServerFactory
from tests.conftest import BROKER_PORTS, CRASH_TEXTS

pytestmark = pytest.mark.integration

CASES = all_cases()
#: Connections running cases at once, per broker.
PARALLEL = 24
#: Seconds of silence that end a read (an answer comes in milliseconds; silence is an answer).
QUIET = 1.0

#: Reply texts that quote Erlang terms or an internal reason in RabbitMQ: compared by name only.
ERLANG_TEXTS = ("FRAME_ERROR", "SYNTAX_ERROR", "COMMAND_INVALID", "UNEXPECTED_FRAME", "INTERNAL_ERROR")


def _loosen(entry: Entry) -> Entry:
    if entry.kind in CLOSES:
        text = entry.get("reply_text")
        name = text.split(" - ", 1)[0] if isinstance(text, str) else ""
        if name in ERLANG_TEXTS:
            return loose_reply_text(entry)
    return entry


def run_case(port: int, case: Case) -> list[Entry]:
    """One case on a fresh connection: setup, the case's bytes, what follows, and the ending."""
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
    return [_loosen(entry) for entry in transcript.normalized()]


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


def compare_case(
    case: Case,
    expected: list[Entry],
    actual: list[Entry],
    rerun: Callable[[], tuple[list[Entry], list[Entry]]],
) -> None:
    if expected != actual:
        expected, actual = rerun()
    assert_same_transcript(expected, actual, ("rabbitmq", "postroom"))


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
    assert families == {"place", "truncated", "table", "frame", "content"}
    assert len(CASES) > 500

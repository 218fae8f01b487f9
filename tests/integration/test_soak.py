"""Short runs of the soak tools against a real ``postroom serve``: nothing logged, leaked or lost.

``bench/soak/fuzz.py`` replays 2,000 mutated recordings of pika and py-amqp sessions (a fixed
seed, so the same bytes every run) and ``bench/soak/soak.py`` opens 200 connections that each
end a different way (unread megabytes, RST or FIN mid-frame, a large ``basic.get`` cut short,
unacked deliveries on a closed channel, a heartbeat timeout). Each run starts its own broker
process on free loopback ports. The assertions are the tools' own summaries: no traceback in
the broker's log, file descriptors, connections, consumers and exclusive queues back at their
baseline, and every confirmed message in its queue exactly once. On failure the message is
the tool's report: each finding grouped by signature, with the case or connection to replay.

Measured on the 2-core machine, quiet: the fuzz run takes about 13 s (its three checks wait
about 3 s each for connections the broker closes on a timer after a failed handshake, as
RabbitMQ does), the soak run about 5 s. The integration hang guard ends any test at 60 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak"
sys.path.insert(0, str(SOAK))

import corpus  # noqa: E402
import fuzz  # noqa: E402
import mutations  # noqa: E402
import soak  # noqa: E402
import wire  # noqa: E402

#: The fuzz seed: any fixed one keeps the run repeatable; 1 is the one docs/rabbitmq-compatibility.md quotes.
SEED = 1
#: Cases: enough that every mutation meets every recorded session many times.
FUZZ_CASES = 2000
#: Cases between checks: two checks and the final one (each waits out the broker's close timers).
CHECK_EVERY = 1000
#: Connections: every ending about 30 times, ten of them heartbeat timeouts.
SOAK_CONNECTIONS = 200


def test_fuzzed_sessions_leave_no_traceback_no_leak_and_lose_no_confirmed_message(tmp_path: Path) -> None:
    summary = fuzz.run(FUZZ_CASES, SEED, check_every=CHECK_EVERY, jobs=4, workdir=str(tmp_path / "fuzz"))
    assert summary.cases == FUZZ_CASES
    assert summary.confirmed > 0
    assert summary.ok, summary.render()


def test_connections_ending_every_way_leave_nothing_behind(tmp_path: Path) -> None:
    summary = soak.run(SOAK_CONNECTIONS, jobs=4, workdir=str(tmp_path / "soak"))
    assert summary.connections == SOAK_CONNECTIONS
    assert set(summary.endings) == set(soak.ENDINGS)
    assert summary.confirmed > 0
    assert summary.ok, summary.render()


def test_a_case_is_the_same_bytes_for_the_same_seed_and_number() -> None:
    sessions = corpus.load()
    first = [mutations.make_case(sessions, SEED, number) for number in range(200)]
    again = [mutations.make_case(sessions, SEED, number) for number in reversed(range(200))][::-1]
    assert first == again
    assert len({case.data for case in first}) > 190  # and the cases differ from each other
    assert mutations.make_case(sessions, SEED + 1, 0) != first[0]


def test_the_recorded_sessions_are_whole_frames_with_field_tables_to_aim_at() -> None:
    sessions = {session.name: session for session in corpus.load()}
    assert set(sessions) == set(corpus.SCENARIOS)
    for session in sessions.values():
        assert session.header == wire.PROTOCOL_HEADER
        assert wire.describe_frame(session.frames[0]).endswith("Connection.StartOk")
        assert wire.describe_frame(session.frames[-1]).endswith("Connection.Close")
    headers = [frame for frame in sessions["pika-confirms"].frames if frame[0] == wire.FRAME_HEADER]
    tags = {frame[tag] for frame in headers for span in wire.find_tables(frame[7:-1], 7) for tag in span.tags}
    assert set(b"SxtIlDTFAV") <= tags  # every type pika encodes, found by the scanner

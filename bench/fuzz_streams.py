"""Coverage-guided fuzzing of the stream protocol's connection with atheris (``pip install atheris``).

Each input goes through :func:`broker.tools.fuzzing.stream_run_once`: a fresh connection,
optionally after a session start (a stream with messages, a publisher, subscriptions, a group
shared with a second connection), fed in pieces; anything that escapes the connection, an
answer with 15 INTERNAL_ERROR or a publisher, subscription, group member or watcher left after
the connection is gone is a crash, saved by atheris as ``crash-*`` for replay.

    python bench/fuzz_streams.py -atheris_runs=1000000 CORPUS/   # the run in docs/stream-protocol.md
    python bench/fuzz_streams.py crash-1234                      # replay one input
    python bench/fuzz_streams.py -max_total_time=600 CORPUS/     # ten minutes, keeping a corpus

The corpus starts from one request of each command after the session start; atheris's
mutations then follow the coverage they reach. Arguments go to libFuzzer as they are.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402

from bench.atheris_loop import fuzz  # noqa: E402

with atheris.instrument_imports(include=["postroom"]):
    from postroom.broker.tools.fuzzing import stream_publish, stream_request, stream_run_once

from postroom.broker.wire import streamframes as wire  # noqa: E402

#: Seeds, written to a corpus directory when one is given and it is empty.
SEEDS = [
    b"\x03" + stream_publish(1, [(3, b"\x00Sw\xa1\x01c"), (2, b"x")]),
    b"\x03" + wire.frame(wire.CREDIT, b"\x01\x00\x05") + stream_request(wire.UNSUBSCRIBE, 9, b"\x02"),
    b"\x03" + wire.frame(wire.CONSUMER_UPDATE | wire.RESPONSE, struct.pack(">IHHQ", 1, 1, 1, 0)),
    b"\x01" + stream_request(wire.SUBSCRIBE, 9, b"\x03" + wire.string("s") + struct.pack(">hQH", 4, 1, 9)),
    b"\x01" + stream_request(wire.QUERY_OFFSET, 9, wire.string("c") + wire.string("s")),
    b"\x01" + stream_request(wire.QUERY_PUBLISHER_SEQUENCE, 9, wire.string("p") + wire.string("s")),
    b"\x01" + stream_request(wire.DELETE_STREAM, 9, wire.string("s")),
    b"\x01" + stream_request(wire.METADATA, 9, wire.strings(["s", "t"])),
    b"\x01" + stream_request(wire.ROUTE, 9, wire.string("k") + wire.string("s")),
    b"\x01" + stream_request(wire.CLOSE, 9, struct.pack(">H", 1) + wire.string("bye")),
    b"\x00" + stream_request(wire.PEER_PROPERTIES, 1, wire.string_map({"product": "x"})),
]


def main() -> None:
    fuzz("fuzz_streams", SEEDS, stream_run_once)


if __name__ == "__main__":
    main()

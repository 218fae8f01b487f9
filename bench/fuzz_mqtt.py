"""Coverage-guided fuzzing of the MQTT connection with atheris (``pip install atheris``).

Each input goes through :func:`broker.tools.fuzzing.mqtt_run_once`: a fresh connection,
optionally after a CONNECT and a session start (subscriptions at each QoS, publishes at each
QoS, a QoS 2 exchange begun) and beside a second client subscribed to everything, fed in
pieces; anything that escapes the connection, a packet written that does not read back, or a
connection, consumer or clean session's queue left after it is gone is a crash, saved by
atheris as ``crash-*`` for replay.

    python bench/fuzz_mqtt.py -atheris_runs=1000000 CORPUS/   # the run in docs/mqtt.md
    python bench/fuzz_mqtt.py crash-1234                      # replay one input
    python bench/fuzz_mqtt.py -max_total_time=600 CORPUS/     # ten minutes, keeping a corpus

The corpus starts from one packet of each type after the session start; atheris's mutations
then follow the coverage they reach. Arguments go to libFuzzer as they are.
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
    from postroom.broker.tools.fuzzing import mqtt_connect, mqtt_packet, mqtt_run_once, mqtt_string

#: Seeds, written to a corpus directory when one is given and it is empty.
SEEDS = [
    b"\x01" + mqtt_packet(0x32, mqtt_string("a/b") + struct.pack(">H", 3) + b"payload"),
    b"\x05" + mqtt_packet(0x62, struct.pack(">H", 8)) + mqtt_packet(0x40, struct.pack(">H", 1)),
    b"\x03" + mqtt_packet(0xA2, struct.pack(">H", 4) + mqtt_string("a/#")),
    b"\x01" + mqtt_packet(0x31, mqtt_string("r/t") + b"kept") + mqtt_packet(0xC0, b""),
    b"\x01" + mqtt_connect("again"),
    b"\x00" + mqtt_connect("fresh", keep_alive=5) + mqtt_packet(0xE0, b""),
    b"\x00" + mqtt_packet(0x10, mqtt_string("MQTT") + b"\x05\x02\x00\x00" + mqtt_string("v5")),
]


def main() -> None:
    fuzz("fuzz_mqtt", SEEDS, mqtt_run_once)


if __name__ == "__main__":
    main()

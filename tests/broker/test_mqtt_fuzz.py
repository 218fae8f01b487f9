"""The MQTT connection under structured random input: runs of packets of every type (fields
of any value, flags right and wrong, lengths that lie, packets before CONNECT, a second
CONNECT, oversized lengths), cut and mutated, after a session start or none, leave it
answering or ending, never raising, writing only packets that read back, and releasing
everything once gone (:func:`broker.tools.fuzzing.mqtt_run_once`).

A short run of this is part of the test command; ``bench/fuzz_mqtt.py`` runs the
coverage-guided fuzzer for as long as it is asked (``docs/mqtt.md`` has its figures).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.broker.tools.fuzzing import mqtt_connect, mqtt_packet, mqtt_run_once, mqtt_string
from tests.broker.amqp.test_fuzz_core import cut_and_mutated

TOPICS = st.one_of(
    st.sampled_from(["a/x", "b/z", "#", "+", "a/#", "$SYS/x", "a/#/b", "", "+x", "/"]), st.text(max_size=8)
)
U16 = st.integers(0, 0xFFFF)


@st.composite
def packets(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 15))
    flags = draw(st.integers(0, 15))
    if kind == 3:  # PUBLISH
        qos = flags >> 1 & 3
        body = mqtt_string(draw(TOPICS)) + (struct.pack(">H", draw(U16)) if qos else b"") + draw(st.binary(max_size=40))
    elif kind in (4, 5, 6, 7, 11):  # acknowledgements
        body = struct.pack(">H", draw(U16))
    elif kind in (8, 10):  # SUBSCRIBE, UNSUBSCRIBE
        items = draw(st.lists(st.tuples(TOPICS, st.integers(0, 4)), max_size=3))
        body = struct.pack(">H", draw(U16)) + b"".join(
            mqtt_string(f) + (bytes([q]) if kind == 8 else b"") for f, q in items
        )
    elif kind == 1:  # CONNECT
        return mqtt_connect(draw(st.text(max_size=6)), draw(st.booleans()), draw(U16))
    else:
        body = draw(st.binary(max_size=8))
    if draw(st.integers(0, 9)) == 0:  # a remaining length that lies
        return bytes([kind << 4 | flags]) + draw(st.binary(min_size=1, max_size=5)) + body
    return mqtt_packet(kind << 4 | flags, body)


@settings(max_examples=400)
@given(mode=st.integers(0, 255), stream=cut_and_mutated(packets()))
def test_any_packet_stream_gets_an_answer_or_an_end(mode: int, stream: bytes) -> None:
    mqtt_run_once(bytes([mode]) + stream)


def test_the_harness_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    from postroom.broker.mqtt.connection import MqttConnection

    def broken(self: MqttConnection, packet: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(MqttConnection, "_subscribe", broken)
    with pytest.raises(RuntimeError):
        mqtt_run_once(b"\x01" + mqtt_packet(0x82, struct.pack(">H", 1) + mqtt_string("t") + b"\x00"))

"""The core under structured random input: any stream of frames built from the method table
(arguments of any value, tables of any shape), content, heartbeats and stray bytes, cut and
mutated, leaves it acting or closing with a reply code, never raising, never with 541.

A short run of this is part of the test command; ``bench/fuzz_core.py`` runs the coverage-guided
fuzzer for as long as it is asked (docs/rabbitmq-compatibility.md has its figures).
"""

from __future__ import annotations

import pamqp.commands as commands_module
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp.base import Frame

from postroom.broker.amqp.connection import ServerConnection
from postroom.broker.tools.fuzzing import SESSION_START, method_frame, raw_frame, run_once
from postroom.broker.tools.testing import publish_frames
from postroom.broker.wire.codec import FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT

#: Every method class pamqp knows (client and server methods alike).
METHODS: list[type[Frame]] = [
    method
    for group in vars(commands_module).values()
    if isinstance(group, type)
    for method in vars(group).values()
    if isinstance(method, type) and issubclass(method, Frame) and hasattr(method, "index")
]

_SCALARS = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=20),
    st.binary(max_size=20), st.none(),
)  # fmt: skip
TABLES = st.recursive(
    st.dictionaries(st.text(max_size=8), _SCALARS, max_size=4),
    lambda children: st.dictionaries(st.text(max_size=8), st.one_of(children, st.lists(children, max_size=3))),
    max_leaves=12,
)


@st.composite
def method_frames(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(METHODS))
    channel = draw(st.sampled_from([0, 1, 2, 3, 65535]))
    values = {}
    for name in method.__slots__:
        amqp_type = method.amqp_type(name)
        if amqp_type == "bit":
            values[name] = draw(st.booleans())
        elif amqp_type.endswith("str"):
            values[name] = draw(st.one_of(st.sampled_from(["", "q", "amq.direct", "c"]), st.text(max_size=30)))
        elif amqp_type == "table":
            values[name] = draw(TABLES)
        else:
            values[name] = draw(st.integers(0, 2**64 - 1))
    return method_frame(channel, method, **values)


FRAMES = st.one_of(
    method_frames(),
    st.builds(lambda body: publish_frames(1, "", "q", body), st.binary(max_size=300)),
    st.builds(lambda body: publish_frames(2, "", "q", body, mandatory=True), st.binary(max_size=300)),
    st.builds(lambda payload: raw_frame(FRAME_HEADER, 1, payload), st.binary(max_size=40)),
    st.builds(lambda payload: raw_frame(FRAME_BODY, 1, payload), st.binary(max_size=40)),
    st.just(raw_frame(FRAME_HEARTBEAT, 0, b"")),
    st.binary(min_size=1, max_size=12),
)


@st.composite
def cut_and_mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    """A run of ``frames``, then perhaps cut short and a few bytes changed."""
    data = b"".join(draw(st.lists(frames, min_size=1, max_size=12)))
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    for _ in range(draw(st.integers(0, 3))):
        if data:
            index = draw(st.integers(0, len(data) - 1))
            data = data[:index] + bytes([draw(st.integers(0, 255))]) + data[index + 1 :]
    return data


@settings(max_examples=500)
@given(mode=st.integers(0, 255), stream=cut_and_mutated(FRAMES))
def test_any_frame_stream_gets_an_action_or_a_reply_code(mode: int, stream: bytes) -> None:
    run_once(bytes([mode]) + stream)


def test_the_harness_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ServerConnection, channel_id: int, method: Frame) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ServerConnection, "_open_channel", broken)
    with pytest.raises(RuntimeError):
        run_once(b"\x01" + method_frame(3, commands.Channel.Open))
    assert SESSION_START.startswith(b"AMQP")

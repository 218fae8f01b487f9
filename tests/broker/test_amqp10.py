"""AMQP 1.0 messages as the stream protocol carries them, and their AMQP 0-9-1 form (RabbitMQ
3.10's ``rabbit_msg_record`` mapping)."""

from __future__ import annotations

import datetime
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from postroom.broker.wire.amqp10 import (
    APPLICATION_PROPERTIES,
    DATA,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    AMQP10Error,
    from_amqp091,
    sections,
    to_amqp091,
)
from postroom.broker.wire.codec import decode_properties, encode_content_header

UTC = datetime.timezone.utc


def test_a_0_9_1_message_maps_to_amqp_1_0_sections_as_rabbitmq_maps_it() -> None:
    properties = commands.Basic.Properties(
        content_type="application/json", headers={"n": 3, "s": "x", "ok": True}, delivery_mode=2, priority=4,
        message_id="m-1", correlation_id="c-1", reply_to="r", timestamp=datetime.datetime(2024, 1, 1, tzinfo=UTC),
        message_type="order", app_id="shop", expiration="1000", user_id="guest",
    )  # fmt: skip
    message = from_amqp091(b"\x04shop\x03a.b", encode_content_header(5, properties), b"hello")
    found = dict(sections(message))
    assert [code for code, _ in sections(message)] == [MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES, DATA]
    annotations = {k[1]: v for k, v in found[MESSAGE_ANNOTATIONS][1]}
    assert annotations == {
        "x-routing-key": ("utf8", "a.b"),
        "x-exchange": ("utf8", "shop"),
        "x-basic-priority": ("ubyte", 4),
        "x-basic-delivery-mode": ("ubyte", 2),
        "x-basic-expiration": ("utf8", "1000"),
    }
    fields = found[PROPERTIES][1]
    assert fields[0] == ("utf8", "m-1") and fields[1] == ("binary", b"guest") and fields[5] == ("utf8", "c-1")
    assert fields[6] == ("symbol", "application/json") and fields[9] == ("timestamp", 1704067200000)
    application = {k[1]: v for k, v in found[APPLICATION_PROPERTIES][1]}
    assert application == {
        "x-basic-app-id": ("utf8", "shop"),
        "x-basic-type": ("utf8", "order"),
        "n": ("long", 3),
        "s": ("utf8", "x"),
        "ok": ("boolean", True),
    }
    assert found[DATA] == ("binary", b"hello")
    # And back: the same properties, body, exchange and routing key.
    names, header, body = to_amqp091(message, "events")
    assert (names, body) == (b"\x04shop\x03a.b", b"hello")
    back = decode_properties(header)
    for field in ("content_type", "delivery_mode", "priority", "message_id", "correlation_id", "reply_to"):
        assert getattr(back, field) == getattr(properties, field), field
    assert (back.message_type, back.app_id, back.expiration, back.user_id) == ("order", "shop", "1000", "guest")
    assert back.timestamp == properties.timestamp and back.headers == {"n": 3, "s": "x", "ok": True}


def test_a_message_without_annotations_goes_to_the_stream_s_name_on_the_default_exchange() -> None:
    data = b"\x00\x53\x75\xa0\x02hi"
    names, header, body = to_amqp091(data, "events")
    assert names == b"\x00\x06events" and body == b"hi"
    assert decode_properties(header).headers is None


def test_ids_that_are_not_text_are_carried_with_their_type() -> None:
    ulong_id = b"\x00\x53\x73\xc0\x0a\x01\x80" + struct.pack(">Q", 42) + b"\x00\x53\x75\xa0\x00"
    _names, header, _body = to_amqp091(ulong_id)
    properties = decode_properties(header)
    assert properties.message_id == "42" and properties.headers == {"x-message-id-type": "ulong"}


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_bytes_that_are_not_a_message_raise_only_amqp10error(garbage: bytes) -> None:
    for candidate in (garbage, b"\x00\x53\x74" + garbage, b"\x00\x53\x73" + garbage):
        try:
            to_amqp091(candidate, "s")
        except AMQP10Error:
            pass


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=40),
        st.one_of(
            st.integers(-(2**63), 2**63 - 1),
            st.text(),
            st.binary(),
            st.booleans(),
            st.floats(allow_nan=False),
            st.none(),
        ),
        max_size=5,
    ),
    st.binary(max_size=50),
)
def test_any_0_9_1_message_converts_and_reads_back(headers: dict, body: bytes) -> None:
    header = encode_content_header(len(body), commands.Basic.Properties(headers=headers or None))
    message = from_amqp091(b"\x00\x01q", header, body)
    assert dict(sections(message))[DATA] == ("binary", body)
    _names, _header, back = to_amqp091(message, "q")
    assert back == body

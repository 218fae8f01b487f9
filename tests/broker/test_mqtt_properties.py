"""MQTT 5.0's PUBLISH properties on the AMQP side and back (``broker.mqtt.properties``), as
RabbitMQ 3.13's ``mc_mqtt`` maps them: what an AMQP 0-9-1 consumer reads of an MQTT 5.0
publish, and what an MQTT 5.0 subscriber gets of an AMQP message."""

from __future__ import annotations

from pamqp import commands

from postroom.broker.core.message import Message
from postroom.broker.mqtt.properties import amqp_header, mqtt_properties
from postroom.broker.wire import mqtt as v3
from postroom.broker.wire import mqtt5
from postroom.broker.wire.codec import decode_properties


def read(data: bytes) -> mqtt5.Properties:
    fields = v3.Body(data, "test")
    found = mqtt5.read_properties(fields, v3.PUBLISH)
    fields.end()
    return found


def test_an_mqtt5_publish_as_an_amqp_consumer_reads_it() -> None:
    found = mqtt5.Properties(
        {
            mqtt5.CONTENT_TYPE: "application/json",
            mqtt5.CORRELATION_DATA: b"req-7",
            mqtt5.RESPONSE_TOPIC: "replies/+/a",
            mqtt5.MESSAGE_EXPIRY_INTERVAL: 30,
            mqtt5.PAYLOAD_FORMAT_INDICATOR: 1,
        },
        (("zone", "eu"), ("trace", "t1"), ("zone", "us")),
    )
    properties = decode_properties(amqp_header(1, False, True, 5, found))
    assert (properties.content_type, properties.correlation_id, properties.expiration) == (
        "application/json",
        "req-7",
        "30000",
    )
    assert properties.delivery_mode == 2 and properties.reply_to is None
    assert properties.headers == {
        "trace": "t1",
        "zone": "eu",  # the first of each name, sorted (RabbitMQ's usort)
        "x-reply-to-topic": "replies.*.a",
        "x-mqtt-publish-qos": 1,
        "x-mqtt-dup": False,
        "x-mqtt-retain": True,
        "x-mqtt-payload-format": 1,
    }


def test_correlation_data_that_is_no_short_string_goes_in_a_header() -> None:
    found = mqtt5.Properties({mqtt5.CORRELATION_DATA: b"\xff\x00binary", mqtt5.CONTENT_TYPE: "t\u00e9xt"})
    properties = decode_properties(amqp_header(0, False, False, 3, found))
    assert properties.correlation_id is None and properties.content_type is None  # (not ASCII)
    assert properties.headers["x-correlation-id"] == b"\xff\x00binary"
    assert properties.delivery_mode == 1


def test_an_amqp_message_as_an_mqtt5_subscriber_gets_it() -> None:
    message = Message.build(
        "amq.topic",
        "orders.eu",
        b"{}",
        commands.Basic.Properties(
            content_type="application/json",
            correlation_id="c-1",
            headers={"x-reply-to-topic": "replies.a", "tenant": "acme", "count": 3, "flag": True, "nested": {"a": 1}},
        ),
    )
    written, retained = mqtt_properties(message, remaining_ms=12_999)
    found = read(written)
    assert found.values == {
        mqtt5.CONTENT_TYPE: "application/json",
        mqtt5.CORRELATION_DATA: b"c-1",
        mqtt5.RESPONSE_TOPIC: "replies/a",
        mqtt5.MESSAGE_EXPIRY_INTERVAL: 12,  # whole seconds left, rounded down
    }
    assert found.user == (("tenant", "acme"), ("count", "3"), ("flag", "true"))  # (a table has no such form)
    assert not retained


def test_an_mqtt5_publish_comes_back_to_an_mqtt5_subscriber_as_it_went() -> None:
    sent = mqtt5.Properties(
        {
            mqtt5.CONTENT_TYPE: "text/plain",
            mqtt5.CORRELATION_DATA: b"\x01\x02",
            mqtt5.RESPONSE_TOPIC: "r/1",
            mqtt5.PAYLOAD_FORMAT_INDICATOR: 1,
        },
        (("b", "2"), ("a", "1")),  # (in the order given, as RabbitMQ and Mosquitto hand them on)
    )
    header = amqp_header(2, True, True, 1, sent)
    message = Message("amq.topic", "t", b"", header, b"x")
    written, retained = mqtt_properties(message, remaining_ms=None)
    assert read(written) == sent and retained



def test_properties_that_do_not_decode_are_left_out_of_a_delivery() -> None:
    """A delivery runs after its publish was confirmed: it must not fail on what it holds."""
    header = bytes.fromhex("003c0000000000000000000120000000ff")  # a headers table that runs past the end
    written, retained = mqtt_properties(Message("amq.topic", "t", b"", header, b"x"), remaining_ms=None)
    assert read(written) == mqtt5.NONE and not retained

"""One broker, three protocols: what MQTT devices publish lands in a stream bound to
``amq.topic``, read back with RabbitMQ's stream protocol (``rstream``), and over AMQP 0-9-1
from the same stream, each message with the MQTT plugin's headers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from rstream import ConsumerOffsetSpecification, OffsetType

from postroom.broker.tools.testing import free_port
from tests.integration.test_crash import broker
from tests.integration.test_stream_protocol import read

pytestmark = pytest.mark.integration


def test_mqtt_publishes_are_read_from_a_stream_over_the_stream_protocol(tmp_path: Path) -> None:
    stream, port = free_port(), free_port()
    with broker(tmp_path / "data", mqtt=port, stream=stream) as (_process, amqp):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
        channel = connection.channel()
        channel.queue_declare("telemetry", durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_bind("telemetry", "amq.topic", "sensors.#")
        device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sensor-7")
        device.connect("127.0.0.1", port)
        device.loop_start()
        for n in range(3):
            device.publish(f"sensors/7/t{n}", b"%d" % n, 1).wait_for_publish(5)
        device.disconnect()
        device.loop_stop()
        got = asyncio.run(read(stream, ConsumerOffsetSpecification(OffsetType.FIRST, None), 3, stream="telemetry"))
        assert [(offset, body) for offset, body, _n in got] == [(0, b"0"), (1, b"1"), (2, b"2")]
        channel.basic_qos(prefetch_count=10)
        seen = []
        for method, properties, body in channel.consume("telemetry", arguments={"x-stream-offset": "first"}):
            seen.append((method.routing_key, body, properties.headers))
            channel.basic_ack(method.delivery_tag)
            if len(seen) == 3:
                break
        channel.cancel()
        connection.close()
    assert seen[2] == ("sensors.7.t2", b"2", {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False, "x-stream-offset": 2})

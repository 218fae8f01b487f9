"""MQTT 5.0 with paho-mqtt 2.2 in its v5 mode, against an in-process Postroom over loopback.
Each behaviour cites the specification's rule, or RabbitMQ 3.13's choice
(``docs/rabbitmq-mqtt5.md``) where the specification leaves it to the server."""

from __future__ import annotations

import queue
import time
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.integration.test_mqtt import TIMEOUT, MqttBroker, make_mqtt, server

pytestmark = pytest.mark.integration

__all__ = ["make_mqtt", "server"]  # (fixtures)


class Client5:
    """A paho client at protocol level 5 on its own network thread."""

    def __init__(
        self, server: MqttBroker, client_id: str = "", clean_start: bool = True, expiry: int | None = None, **will: Any
    ) -> None:
        self.raw = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[tuple[int, bool, Any]] = queue.Queue()
        self.subacks: queue.Queue[list[int]] = queue.Queue()
        self.acks: queue.Queue[int] = queue.Queue()
        self.disconnects: queue.Queue[int] = queue.Queue()
        self.raw.on_message = lambda _c, _u, message: self.messages.put(message)
        self.raw.on_connect = lambda _c, _u, flags, code, props: self.connacks.put(
            (code.value, flags.session_present, props)
        )
        self.raw.on_subscribe = lambda _c, _u, _mid, codes, _p: self.subacks.put([c.value for c in codes])
        self.raw.on_publish = lambda _c, _u, _mid, code, _p: self.acks.put(code.value)
        self.raw.on_disconnect = lambda _c, _u, _f, code, _p: self.disconnects.put(code.value)
        if will:
            self.raw.will_set(**will)
        properties = Properties(PacketTypes.CONNECT)
        if expiry is not None:
            properties.SessionExpiryInterval = expiry
        server.clients.append(self.raw)
        self.raw.connect("127.0.0.1", server.port, clean_start=clean_start, properties=properties)
        self.raw.loop_start()

    def connack(self) -> tuple[int, bool, Any]:
        return self.connacks.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> list[int]:
        self.raw.subscribe(topic, options=SubscribeOptions(qos=qos, **options))
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, **properties: Any) -> int:
        """Publish; the PUBACK's or PUBREC's reason code (0 at QoS 0)."""
        props = Properties(PacketTypes.PUBLISH)
        for name, value in properties.items():
            setattr(props, name, value)
        self.raw.publish(topic, payload, qos, retain, props if properties else None).wait_for_publish(TIMEOUT)
        return self.acks.get(timeout=TIMEOUT)

    def receive(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=TIMEOUT)

    def nothing(self, seconds: float = 0.3) -> None:
        try:
            message = self.messages.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {message.topic}: {message.payload!r}")

    def close(self) -> None:
        self.raw.disconnect()
        self.raw.loop_stop()


def connected(server: MqttBroker, client_id: str = "", **options: Any) -> Client5:
    client = Client5(server, client_id, **options)
    assert client.connack()[0] == 0
    return client


def test_connack_says_what_the_server_serves(server: MqttBroker) -> None:
    client = Client5(server, "")
    code, present, properties = client.connack()
    assert (code, present) == (0, False)
    assert len(properties.AssignedClientIdentifier) == 24  # an id for a client that sent none [MQTT-3.2.2-16]
    assert properties.TopicAliasMaximum == 16 and properties.SessionExpiryInterval == 0
    assert properties.SharedSubscriptionAvailable == 0
    assert not hasattr(properties, "MaximumQoS")  # QoS 2 is served
    assert not hasattr(properties, "SubscriptionIdentifierAvailable")  # and Subscription Identifiers


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_properties_go_from_publisher_to_subscriber(server: MqttBroker, qos: int) -> None:
    subscriber = connected(server, "sub")
    assert subscriber.subscribe("orders/#", qos) == [qos]
    publisher = connected(server, "pub")
    publisher.publish(
        "orders/eu",
        b"{}",
        qos,
        ContentType="application/json",
        CorrelationData=b"req-1",
        ResponseTopic="replies/pub",
        UserProperty=[("tenant", "acme")],
        MessageExpiryInterval=60,
    )
    message = subscriber.receive()
    props = message.properties
    assert (message.topic, message.qos, props.ContentType, props.CorrelationData) == (
        "orders/eu",
        qos,
        "application/json",
        b"req-1",
    )
    assert props.ResponseTopic == "replies/pub" and props.UserProperty == [("tenant", "acme")]
    assert 58 <= props.MessageExpiryInterval <= 60  # what is left of it [MQTT-3.3.2-6]


def test_a_publish_that_reaches_no_subscriber_is_told_so(server: MqttBroker) -> None:
    publisher = connected(server, "pub")
    assert publisher.publish("nobody/listens", b"x", 1) == 0x10  # No matching subscribers (3.4.2.1)
    connected(server, "sub").subscribe("somebody/#", 1)
    assert publisher.publish("somebody/listens", b"x", 1) == 0


def test_topic_aliases_from_the_client(server: MqttBroker) -> None:
    subscriber = connected(server, "sub")
    subscriber.subscribe("long/topic/name", 1)
    publisher = connected(server, "pub")
    publisher.publish("long/topic/name", b"first", 1, TopicAlias=1)
    publisher.publish("", b"second", 1, TopicAlias=1)  # by alias only [MQTT-3.3.2-12]
    assert [(m.topic, m.payload) for m in (subscriber.receive(), subscriber.receive())] == [
        ("long/topic/name", b"first"),
        ("long/topic/name", b"second"),
    ]
    props = Properties(PacketTypes.PUBLISH)
    props.TopicAlias = 17  # over CONNACK's Topic Alias Maximum
    publisher.raw.publish("t", b"x", 1, properties=props)
    assert publisher.disconnects.get(timeout=TIMEOUT) == 0x94  # Topic Alias invalid [MQTT-3.3.2-9]


def test_no_local_and_retain_options(server: MqttBroker) -> None:
    chatty = connected(server, "chatty")
    assert chatty.subscribe("room/#", 1, noLocal=True) == [1]
    other = connected(server, "other")
    other.subscribe("room/#", 1, retainAsPublished=True)
    chatty.publish("room/a", b"hello", 1, retain=True)
    message = other.receive()
    assert (message.payload, message.retain) == (b"hello", True)  # Retain As Published
    chatty.nothing()  # No Local [MQTT-3.8.3-3]
    late = connected(server, "late")
    late.subscribe("room/#", 1, retainHandling=2)
    late.nothing()  # Retain Handling 2: no retained messages
    late.subscribe("room/+", 1, retainHandling=1)
    assert late.receive().payload == b"hello"  # a new subscription
    late.subscribe("room/+", 1, retainHandling=1)
    late.nothing()  # not new any more
    chatty.publish("room/a", b"", 0, retain=True)


def test_shared_subscriptions_are_refused(server: MqttBroker) -> None:
    client = connected(server, "c")
    assert client.subscribe("$share/group/jobs", 1) == [0x9E]  # Shared Subscriptions not supported


def test_a_session_lasts_its_expiry_interval(server: MqttBroker) -> None:
    client = connected(server, "keeper", clean_start=False, expiry=300)
    client.subscribe("jobs/#", 1)
    client.close()
    connected(server, "pub").publish("jobs/1", b"while away", 1)
    back = Client5(server, "keeper", clean_start=False, expiry=0)
    code, present, properties = back.connack()
    assert (code, present, properties.SessionExpiryInterval) == (0, True, 0)
    assert back.receive().payload == b"while away"
    back.close()  # with 0 now, the session ends with the connection
    deadline = time.monotonic() + TIMEOUT
    while "mqtt-subscription-keeperqos1" in server.broker.queue_names() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "mqtt-subscription-keeperqos1" not in server.broker.queue_names()


def test_the_will_goes_with_disconnect_with_will_and_waits_its_delay(server: MqttBroker) -> None:
    watcher = connected(server, "watcher")
    watcher.subscribe("status/#", 1)
    delay = Properties(PacketTypes.WILLMESSAGE)
    delay.WillDelayInterval = 1
    leaving = connected(server, "leaving", expiry=60, topic="status/leaving", payload=b"gone", qos=1, properties=delay)
    leaving.raw.disconnect(reasoncode=mqtt.ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    started = time.monotonic()
    message = watcher.receive()
    assert message.payload == b"gone" and time.monotonic() - started >= 0.8  # after its delay
    back_soon = connected(server, "back", expiry=60, topic="status/back", payload=b"gone", qos=1, properties=delay)
    back_soon.raw.disconnect(reasoncode=mqtt.ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    connected(server, "back", clean_start=False, expiry=60)  # back within the delay: no will [MQTT-3.1.3-9]
    watcher.nothing(1.5)
    polite = connected(server, "polite", topic="status/polite", payload=b"gone", qos=1)
    polite.close()  # reason 0: no will
    watcher.nothing()


def test_a_protocol_error_is_answered_with_its_reason_code(server: MqttBroker) -> None:
    client = connected(server, "c")
    client.raw._send_publish(1, b"", b"x", 1, False, False, None, None)  # (an empty topic, no alias)
    assert client.disconnects.get(timeout=TIMEOUT) == 0x82  # Protocol Error [MQTT-3.3.2-1]


def test_an_amqp_consumer_reads_an_mqtt5_publish(server: MqttBroker) -> None:
    import pika

    amqp = pika.BlockingConnection(pika.URLParameters(server.broker.url))
    channel = amqp.channel()
    channel.queue_declare("v5-in")
    channel.queue_bind("v5-in", "amq.topic", "v5.#")
    connected(server, "pub").publish(
        "v5/x", b"1", 1, ContentType="text/plain", CorrelationData=b"c-9", UserProperty=[("k", "v")]
    )
    method, properties, body = channel.basic_get("v5-in", auto_ack=True)
    assert body == b"1" and (properties.content_type, properties.correlation_id) == ("text/plain", "c-9")
    assert properties.headers["k"] == "v"
    amqp.close()


def test_subscription_identifiers(server: MqttBroker) -> None:
    client = connected(server, "c")
    for topic, number in (("a/#", 7), ("a/b", 9)):
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = number
        client.raw.subscribe(topic, options=SubscribeOptions(qos=1), properties=props)
        assert client.subacks.get(timeout=TIMEOUT) == [1]
    connected(server, "pub").publish("a/b", b"x", 1)
    message = client.receive()
    assert message.properties.SubscriptionIdentifier == [7, 9]  # each matching one [MQTT-3.3.4-3]
    connected(server, "pub2").publish("a/c", b"y", 1)
    assert client.receive().properties.SubscriptionIdentifier == [7]


def test_a_retained_message_keeps_its_properties_and_expires(server: MqttBroker) -> None:
    publisher = connected(server, "pub")
    publisher.publish("state/a", b"on", 1, retain=True, ContentType="text/plain", UserProperty=[("unit", "W")],
                      MessageExpiryInterval=60)  # fmt: skip
    publisher.publish("state/b", b"brief", 1, retain=True, MessageExpiryInterval=1)
    time.sleep(1.2)
    late = connected(server, "late")
    late.subscribe("state/#", 1)
    message = late.receive()
    props = message.properties
    assert (message.topic, message.payload, message.retain, props.ContentType) == ("state/a", b"on", True, "text/plain")
    assert props.UserProperty == [("unit", "W")] and 58 <= props.MessageExpiryInterval <= 60
    late.nothing()  # state/b's expired [MQTT-3.3.2-5]
    publisher.publish("state/a", b"", 0, retain=True)

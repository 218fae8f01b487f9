"""What the MQTT connections of one node share: their settings (the ``mqtt:`` section), the client ids connected
(one connection per id: a second one takes the id over), the sessions kept for clients that
are away, and each vhost's retained messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from postroom.broker.core.node import Node
from postroom.broker.wire import mqtt as wire
from postroom.config.schema import MqttConfig

if TYPE_CHECKING:
    from postroom.broker.mqtt.session import MqttSession


@dataclass(slots=True)
class Retained:
    """A retained message: its payload and the QoS it was published with."""

    payload: bytes
    qos: int


class MqttRegistry:
    """The MQTT side of ``node`` (see the module's docstring)."""

    def __init__(self, node: Node, settings: MqttConfig | None = None) -> None:
        self.node = node
        #: The ``mqtt:`` section.
        self.settings = settings or MqttConfig()
        #: Client id -> its connection (``broker.mqtt.connection.MqttConnection``).
        self.clients: dict[str, Any] = {}
        #: (vhost, client id) -> its session, while it lasts.
        self.sessions: dict[tuple[str, str], MqttSession] = {}
        #: Vhost -> topic -> its retained message.
        self.retained: dict[str, dict[str, Retained]] = {}

    def retain(self, vhost: str, topic: str, payload: bytes, qos: int) -> None:
        """Keep ``payload`` as ``topic``'s retained message; an empty one clears it [MQTT-3.3.1-10]."""
        store = self.retained.setdefault(vhost, {})
        if payload:
            store[topic] = Retained(payload, qos)
        else:
            store.pop(topic, None)

    def retained_for(self, vhost: str, topic_filter: str) -> list[tuple[str, Retained]]:
        """The retained messages whose topics ``topic_filter`` matches, wildcards included."""
        store = self.retained.get(vhost)
        if not store:
            return []
        if "+" not in topic_filter and "#" not in topic_filter:
            found = store.get(topic_filter)
            return [(topic_filter, found)] if found is not None else []
        return [(topic, message) for topic, message in store.items() if wire.matches(topic_filter, topic)]

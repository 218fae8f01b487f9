"""What the MQTT connections of one node share: their settings (the ``mqtt:`` section), the
client ids connected (one connection per id: a second one takes the id over) and the sessions
kept for clients that are away. (Retained messages are the node's: ``broker.core.retained``.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from postroom.broker.core.node import Node
from postroom.config.schema import MqttConfig

if TYPE_CHECKING:
    from postroom.broker.mqtt.session import MqttSession


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
        #: Client id -> the call that publishes its will after its Will Delay Interval.
        self.delayed_wills: dict[str, Any] = {}

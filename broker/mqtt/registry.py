"""What the MQTT connections of one node share: their settings (the ``mqtt:`` section), the
client ids connected (one connection per id: a second one takes the id over) and the sessions
kept for clients that are away. (Retained messages are the node's: ``broker.core.retained``.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from postroom.broker.core.node import Node
from postroom.config.schema import MqttConfig

if TYPE_CHECKING:
    from postroom.broker.mqtt.session import MqttSession


#: Sessions kept, at least, before :meth:`MqttRegistry.forget_expired` first looks.
SWEEP_MIN = 1024


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
        #: Sessions kept when :meth:`forget_expired` next looks.
        self._sweep_at = SWEEP_MIN

    def keep(self, key: tuple[str, str], session: MqttSession) -> None:
        """Keep ``session`` under ``key`` (vhost, client id); now and then, forget those that
        expired first (each look costs one step per session, and comes after as many new ones)."""
        self.sessions[key] = session
        if len(self.sessions) >= self._sweep_at:
            self.forget_expired()
            self._sweep_at = max(SWEEP_MIN, 2 * len(self.sessions))

    def forget_expired(self) -> None:
        """Forget the sessions of clients that are away and whose expiry has passed: their
        queues went by their ``x-expires``, and a client id seen once holds no memory for ever
        (a session that never expires, or has queues still, is kept)."""
        clock = self.node.clock
        if clock is None:
            return
        now = clock.seconds()
        for key, session in list(self.sessions.items()):
            if session.expired(now):
                del self.sessions[key]
                self.node.awaiting_release.set(key[0], key[1], ())

"""Test helpers shipped with the broker: drive a :class:`ServerConnection` with pamqp frames.

Tests assert on decoded frames, not raw bytes, except where byte-exactness is the point.
No Twisted here: these helpers work on the sans-IO core.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from broker.amqp.codec import PROTOCOL_HEADER
from broker.amqp.connection import ServerConnection
from broker.core.node import Node


class FramePump:
    """Splits what the server wrote into ``(channel, frame)`` pairs, across calls."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        """Decode every complete frame in ``data`` (plus what was left over before)."""
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            if self._buffer.startswith(b"AMQP"):
                frames.append((0, self._buffer[:8]))
                self._buffer = self._buffer[8:]
                continue
            size = int.from_bytes(self._buffer[3:7], "big")
            if len(self._buffer) < size + 8:
                break
            consumed, channel, value = frame.unmarshal(self._buffer)
            frames.append((channel, value))
            self._buffer = self._buffer[consumed:]
        return frames


def encode(channel: int, *methods: Any) -> bytes:
    """Encode methods (and content header/body frames) for one channel with pamqp."""
    return b"".join(frame.marshal(method, channel) for method in methods)


def publish_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: commands.Basic.Properties | None = None,
    mandatory: bool = False,
    frame_max: int = 131072,
) -> bytes:
    """The frames of one ``basic.publish`` with its content, split at ``frame_max``."""
    parts = [
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        ContentHeader(0, len(body), properties or commands.Basic.Properties()),
    ]
    chunk = frame_max - 8
    parts += [ContentBody(body[start : start + chunk]) for start in range(0, len(body), chunk)]
    return encode(channel, *parts)


class Client:
    """A scripted client: sends frames to a :class:`ServerConnection`, reads its replies.

    :param node: the node to connect to
    :param loopback: whether the client appears to come from a loopback address
    """

    def __init__(self, node: Node, loopback: bool = True) -> None:
        self.connection = ServerConnection(node, loopback=loopback, peer="test")
        self.pump = FramePump()

    def send(self, data: bytes) -> list[tuple[int, Any]]:
        """Send raw bytes; return the frames the server wrote in reply (and anything pending)."""
        self.connection.receive_data(data)
        return self.read()

    def read(self) -> list[tuple[int, Any]]:
        """Frames the server has queued since the last read."""
        return self.pump.feed(self.connection.data_to_send())

    def call(self, channel: int, *methods: Any) -> list[tuple[int, Any]]:
        """Send methods on ``channel``; return the reply frames."""
        return self.send(encode(channel, *methods))

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        heartbeat: int = 0,
        frame_max: int = 131072,
        capabilities: dict[str, Any] | None = None,
    ) -> list[tuple[int, Any]]:
        """Run the handshake up to ``connection.open-ok``; return every frame the server sent."""
        frames = self.send(PROTOCOL_HEADER)
        caps = {"consumer_cancel_notify": True, "authentication_failure_close": True}
        if capabilities is not None:
            caps = capabilities
        frames += self.call(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": caps},
                mechanism="PLAIN",
                response=f"\x00{user}\x00{password}",
            ),
        )
        if self.connection.closed:
            return frames
        frames += self.call(
            0,
            commands.Connection.TuneOk(channel_max=0, frame_max=frame_max, heartbeat=heartbeat),
            commands.Connection.Open(virtual_host=vhost),
        )
        return frames

    def open_channel(self, channel: int = 1) -> None:
        """Open ``channel`` and check the server said ``channel.open-ok``."""
        reply = self.call(channel, commands.Channel.Open())
        assert [type(value) for _, value in reply] == [commands.Channel.OpenOk], reply


def methods(frames: Iterable[tuple[int, Any]]) -> list[Any]:
    """Just the decoded values of ``(channel, value)`` pairs."""
    return [value for _, value in frames]


def described(values: Iterable[Any]) -> list[tuple[str, dict[str, Any]]]:
    """Frames as ``(name, {argument: value})`` pairs, which compare by value (pamqp's do not)."""
    described = []
    for value in values:
        if isinstance(value, ContentHeader):
            described.append(("ContentHeader", {"body_size": value.body_size, **dict(value.properties)}))
        elif isinstance(value, ContentBody):
            described.append(("ContentBody", {"value": value.value}))
        else:
            described.append((value.name, dict(value)))
    return described

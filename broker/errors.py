"""AMQP reply codes and the two kinds of error the spec defines (AMQP 0-9-1 §1.2, "Constants").

A :class:`ChannelException` closes one channel (``channel.close``); a
:class:`ConnectionException` closes the whole connection (``connection.close``).
Both carry the method that caused them, so the close frame can name its class and method ids.
"""

from __future__ import annotations

from enum import IntEnum


class ReplyCode(IntEnum):
    """Reply codes of AMQP 0-9-1, with RabbitMQ's meaning of each."""

    SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


class AMQPError(Exception):
    """A protocol error with the reply code and text RabbitMQ would send.

    :param reply_code: the AMQP reply code
    :param reply_text: a short human-readable reason (at most 255 bytes on the wire)
    :param class_id: class id of the method that failed, or 0
    :param method_id: method id of the method that failed, or 0
    """

    def __init__(self, reply_code: ReplyCode, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(reply_code, reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id

    def __str__(self) -> str:
        return f"{self.reply_code.name} - {self.reply_text}"


class ChannelException(AMQPError):
    """An error that closes one channel with ``channel.close``."""


class ConnectionException(AMQPError):
    """An error that closes the connection with ``connection.close``."""


class ChannelCrash(ConnectionException):
    """What crashes RabbitMQ's channel process: its reader then closes the connection with a
    bare 541 INTERNAL_ERROR naming no method (class and method 0), and so do we."""

    def __init__(self) -> None:
        super().__init__(ReplyCode.INTERNAL_ERROR, "", 0, 0)


class ConnectionDropped(ConnectionException):
    """An error RabbitMQ answers by closing the socket without a word (an unknown method: its
    reader has no way to name it), and so do we."""

"""Messages as the broker holds them: the publisher's bytes, decoded only on demand.

A message keeps the content header payload exactly as the publisher sent it, so a delivery
writes those bytes again without re-encoding. Properties are decoded at most once, and only
when something reads them (the headers exchange, priority queues, ``user_id`` checks).
The property flags word tells which properties are present without decoding any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import commands

from postroom.broker.errors import AMQPError
from postroom.broker.wire.codec import (
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_PRIORITY,
    decode_properties,
    delivery_mode,
    encode_content_header,
    shortstr,
)
from postroom.broker.wire.content import EXPIRATION, PRIORITY, property_value


class Message:
    """One published message, shared by every queue it was routed to.

    :param exchange: the exchange it was published to
    :param routing_key: the routing key it was published with
    :param names: ``exchange`` and ``routing_key`` as short strings, reused in deliveries
    :param header: the content header payload (class, weight, body size, property flags, properties)
    :param body: the whole body
    """

    __slots__ = (
        "exchange",
        "routing_key",
        "names",
        "header",
        "_body",
        "size",
        "wal_location",
        "wal_start",
        "flags",
        "_properties",
        "wal_id",
        "wal_segment",
        "wal_vhost",
        "wal_queues",
        "wal_counts",
        "wal_counted",
    )

    def __init__(self, exchange: str, routing_key: str, names: bytes, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.names = names
        self.header = header
        self._body: bytes | None = body
        #: The body's length, known even while the body is paged out.
        self.size = len(body)
        #: Where its body is in the log: ``(read, segment, offset)``, once written there.
        self.wal_location: tuple[Callable[[int, int, int], bytes], int, int] | None = None
        #: Where its ``Published`` record starts in its log segment (0: not written there yet);
        #: the record ends where its body does.
        self.wal_start = 0
        #: The first property-flags word: which properties are present (bytes 12-13 of the header).
        self.flags = header[12] << 8 | header[13]
        self._properties: commands.Basic.Properties | None = None
        #: Its id in the write-ahead log once recorded there (0: not recorded).
        self.wal_id = 0
        #: The log segment holding its ``Published`` record (0: not written yet).
        self.wal_segment = 0
        #: Its vhost and the durable queues still holding it, as the log knows them: while any
        #: does, its record keeps its segment alive.
        self.wal_vhost = ""
        self.wal_queues: list[str] = []
        #: Delivery counts the log holds for it, by queue (``None`` until one is recorded).
        self.wal_counts: dict[str, int] | None = None
        #: Whether its body counts against the journal's in-memory budget.
        self.wal_counted = False

    @classmethod
    def build(
        cls,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties | None = None,
    ) -> Message:
        """Make a message from decoded parts (tests, tools and the broker's own publishes)."""
        properties = properties or commands.Basic.Properties()
        header = encode_content_header(len(body), properties)
        message = cls(exchange, routing_key, shortstr(exchange) + shortstr(routing_key), header, body)
        message._properties = properties
        return message

    @property
    def properties(self) -> commands.Basic.Properties:
        """The decoded content properties (decoded on first use).

        :raises ConnectionException: 502 SYNTAX_ERROR when they do not decode.
        """
        if self._properties is None:
            self._properties = decode_properties(self.header)
        return self._properties

    @property
    def headers(self) -> dict[str, Any] | None:
        """The ``headers`` table, or ``None`` when the message has none."""
        if not self.flags & FLAG_HEADERS:
            return None
        return self.properties.headers

    def lenient_headers(self) -> dict[str, Any]:
        """The ``headers`` table, empty when there is none or it does not decode.

        For the paths that run after a publish was confirmed (dead-lettering, recovery, the
        dead-letter event stream): they must not fail on what the message holds.
        """
        try:
            return self.headers or {}
        except AMQPError:
            return {}

    @property
    def priority(self) -> int:
        """The ``priority`` property, 0 when absent (read from the bytes, nothing decoded)."""
        if not self.flags & FLAG_PRIORITY:
            return 0
        value = property_value(self.header, PRIORITY)
        return value[0] if value else 0

    @property
    def expiration(self) -> bytes | None:
        """The ``expiration`` property's bytes, ``None`` when absent (nothing else decoded)."""
        if not self.flags & FLAG_EXPIRATION:
            return None
        return property_value(self.header, EXPIRATION)

    @property
    def persistent(self) -> bool:
        """Whether ``delivery_mode`` is 2 (read without decoding the other properties)."""
        return bool(self.flags & FLAG_DELIVERY_MODE) and delivery_mode(self.header) == 2

    @property
    def body(self) -> bytes:
        """The body; read back from the log when it was paged out to save memory."""
        body = self._body
        if body is None:
            assert self.wal_location is not None
            read, segment, offset = self.wal_location
            body = self._body = read(segment, offset, self.size)
        return body

    @property
    def resident(self) -> bool:
        """Whether the body is in memory."""
        return self._body is not None

    def page_out(self) -> None:
        """Drop the body from memory; :attr:`body` reads it back from :attr:`wal_location`."""
        assert self.wal_location is not None
        self._body = None

    @property
    def body_size(self) -> int:
        """The body length in bytes."""
        return self.size

    def __repr__(self) -> str:
        return f"<Message {self.exchange!r} {self.routing_key!r} {self.size} bytes>"

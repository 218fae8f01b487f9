"""Content headers as bytes: read one property, or change one, without touching the others.

A content header payload (AMQP 0-9-1 §4.2.6) is ``class:short weight:short body-size:longlong``,
then property flag words (the lowest bit of a word says another word follows), then the
present properties in flag order. The basic class has fourteen properties, each of a type
whose length the bytes give (short strings, octets, a timestamp, the headers table), so a
property is found by skipping those before it: no decoding, no allocation but the result.

The broker changes a message's header only where RabbitMQ does (dead-lettering), to add
its own ``x-delivery-count``, or to give a consumer that asks for it (``x-remaining-ttl``) a
message's remaining time to live as its ``expiration``, and then by splicing: every byte the publisher sent that is not
being changed is passed on as it came, whatever it holds.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from postroom.broker.wire.table import TableError, check_table, encode_entry, iter_table

#: Basic class property flags (AMQP 0-9-1 §4.2.6.1), highest bit first, with their types.
CONTENT_TYPE = 0x8000
CONTENT_ENCODING = 0x4000
HEADERS = 0x2000
DELIVERY_MODE = 0x1000
PRIORITY = 0x0800
CORRELATION_ID = 0x0400
REPLY_TO = 0x0200
EXPIRATION = 0x0100
MESSAGE_ID = 0x0080
TIMESTAMP = 0x0040
TYPE = 0x0020
USER_ID = 0x0010
APP_ID = 0x0008
CLUSTER_ID = 0x0004

_SHORTSTR, _OCTET, _TABLE, _STAMP = range(4)
_PROPERTIES: tuple[tuple[int, int], ...] = (
    (CONTENT_TYPE, _SHORTSTR),
    (CONTENT_ENCODING, _SHORTSTR),
    (HEADERS, _TABLE),
    (DELIVERY_MODE, _OCTET),
    (PRIORITY, _OCTET),
    (CORRELATION_ID, _SHORTSTR),
    (REPLY_TO, _SHORTSTR),
    (EXPIRATION, _SHORTSTR),
    (MESSAGE_ID, _SHORTSTR),
    (TIMESTAMP, _STAMP),
    (TYPE, _SHORTSTR),
    (USER_ID, _SHORTSTR),
    (APP_ID, _SHORTSTR),
    (CLUSTER_ID, _SHORTSTR),
)

_SHORTSTRS = frozenset(flag for flag, kind in _PROPERTIES if kind == _SHORTSTR)

#: Bytes before the first property flag word: class, weight, body size.
_PREFIX = 12
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")


class ContentError(ValueError):
    """A content header whose properties run past its end."""


def property_spans(header: bytes) -> tuple[int, dict[int, tuple[int, int]]]:
    """Where each present property's value is: ``(properties start, {flag: (start, end)})``.

    The span of a short string or the headers table includes its length prefix.

    :raises ContentError: the header is shorter than its flags say
    """
    size = len(header)
    if size < _PREFIX + 2:
        raise ContentError("content header shorter than 14 bytes")
    flags = _u16.unpack_from(header, _PREFIX)[0]
    # The two low bits (reserved, continuation) are ignored, as RabbitMQ ignores them: no
    # second flag word is read, so one that follows is bytes after the properties.
    pos = start = _PREFIX + 2
    spans: dict[int, tuple[int, int]] = {}
    for flag, kind in _PROPERTIES:
        if not flags & flag:
            continue
        if kind == _SHORTSTR:
            if pos >= size:
                raise ContentError("content property runs past the header")
            end = pos + 1 + header[pos]
        elif kind == _OCTET:
            end = pos + 1
        elif kind == _STAMP:
            end = pos + 8
        else:
            if pos + 4 > size:
                raise ContentError("headers table runs past the header")
            end = pos + 4 + _u32.unpack_from(header, pos)[0]
        if end > size:
            raise ContentError("content property runs past the header")
        spans[flag] = (pos, end)
        pos = end
    return start, spans


def property_value(header: bytes, flag: int) -> bytes | None:
    """A property's bytes (a short string without its length octet, an octet, the timestamp),
    ``None`` when it is absent or the header does not parse: nothing else is decoded, nothing raised.
    """
    if not (header[12] << 8 | header[13]) & flag:
        return None
    try:
        span = property_spans(header)[1].get(flag)
    except ContentError:
        return None
    if span is None:
        return None
    start, end = span
    return bytes(header[start + 1 : end]) if flag in _SHORTSTRS else bytes(header[start:end])


def replace_property(header: bytes, flag: int, value: bytes | None) -> bytes:
    """The header with property ``flag`` set to the wire bytes ``value``, or removed (``None``).

    Every other byte is kept; the flag word follows the change.

    :raises ContentError: as :func:`property_spans`
    """
    start, spans = property_spans(header)
    flags = _u16.unpack_from(header, _PREFIX)[0]
    span = spans.get(flag)
    if span is None:
        if value is None:
            return header
        at = start  # after the last present property that comes before this one
        for other, (_, other_end) in spans.items():
            if other > flag:
                at = other_end
        span = (at, at)
        flags |= flag
    elif value is None:
        flags &= ~flag
    return b"".join(
        (header[:_PREFIX], _u16.pack(flags), header[_PREFIX + 2 : span[0]], value or b"", header[span[1] :])
    )


def headers_content(header: bytes) -> bytes | None:
    """The headers table's entries as sent (without the length prefix), ``None`` without headers.

    :raises ContentError: as :func:`property_spans`
    """
    span = property_spans(header)[1].get(HEADERS)
    if span is None:
        return None
    return bytes(header[span[0] + 4 : span[1]])


def with_headers_content(header: bytes, content: bytes) -> bytes:
    """The header with its headers table's entries replaced by ``content`` (length prefix added)."""
    return replace_property(header, HEADERS, _u32.pack(len(content)) + content)


def set_entry(content: bytes, key: bytes, entry: bytes) -> bytes:
    """Table entries with ``key`` set to ``entry`` (a whole encoded entry, key included).

    An existing entry of that key is replaced where it stands; otherwise, or when the entries
    do not parse, ``entry`` is added at the end.
    """
    try:
        for name, _tag, start, end in iter_table(content, 0, len(content)):
            if name == key:
                return content[: start - 2 - len(name)] + entry + content[end:]
    except TableError:
        pass
    return content + entry


def with_header_entry(header: bytes, key: str, value: Any) -> bytes:
    """The header with ``headers[key]`` set to ``value`` (typed as :mod:`broker.wire.table` does).

    An entry of that name is replaced in place, otherwise the entry is added last; a message
    without headers gets a table holding just this entry. The publisher's other entries and
    properties keep their bytes. When the header itself does not parse it is returned unchanged.
    """
    raw_key = key.encode()
    entry = encode_entry(raw_key, value)
    try:
        content = headers_content(header)
        return with_headers_content(header, entry if content is None else set_entry(content, raw_key, entry))
    except ContentError:
        return header


def with_remaining_ttl(header: bytes, seconds: float) -> bytes:
    """The header with ``expiration`` set to ``seconds`` to live, in whole milliseconds
    (rounded up, 0 when past). When the header does not parse it is returned unchanged."""
    text = b"%d" % max(0, math.ceil(seconds * 1000))
    try:
        return replace_property(header, EXPIRATION, bytes((len(text),)) + text)
    except ContentError:
        return header


#: The length of a content header whose present properties are all of fixed size, by flags:
#: most publishes (no properties, or delivery-mode, priority, timestamp) are checked by this.
FIXED_LENGTHS = {
    flags: 14 + (1 if flags & DELIVERY_MODE else 0) + (1 if flags & PRIORITY else 0) + (8 if flags & TIMESTAMP else 0)
    for flags in range(0x10000)
    if not flags & ~(DELIVERY_MODE | PRIORITY | TIMESTAMP)
}


def check_properties(header: bytes) -> None:
    """Check that a content header's properties parse, the headers table to its deepest value,
    and end where the header ends. Builds nothing; O(length).

    :raises ContentError: they do not (RabbitMQ refuses such a publish: it decodes every
        content header when it is published)
    """
    expected = FIXED_LENGTHS.get(header[12] << 8 | header[13])
    if expected is not None:
        if len(header) != expected:
            raise ContentError("content header length does not match its properties")
        return
    start, spans = property_spans(header)
    end = max((span[1] for span in spans.values()), default=start)
    if end != len(header):
        raise ContentError("bytes after the content properties")
    span = spans.get(HEADERS)
    if span is not None:
        try:
            check_table(header, span[0] + 4, span[1])
        except TableError as error:
            raise ContentError(f"headers table: {error}") from error

"""Protocol cases generated from the AMQP 0-9-1 method table, not picked by hand.

Every case is a few bytes a client sends after a normal handshake (and channel 1 opened),
from one of these families:

* ``place``: every method of the method table (pamqp's ``INDEX_MAPPING``) sent where it does
  not belong: a server-only method from the client, a channel-level method on channel 0, a
  connection method on channel 1, any method on a channel never opened, on a channel the
  broker is closing, and in the middle of a message's content (on its channel and on
  another one);
* ``truncated``: every method a client may send, its arguments cut at every byte boundary,
  and followed by bytes that belong to nothing;
* ``table``: a field table in a method's arguments (``queue.declare``) and in a message's
  headers holding each field type (valid, cut inside the value, nested in a table and an
  array) and unknown type octets;
* ``frame``: frame-level violations (the end octet, unknown frame types, a size over the
  negotiated maximum and at its boundaries, a heartbeat with a payload);
* ``content``: content sequences out of order or with the wrong sizes;
* ``declare``: a ``queue.declare`` that differs from the queue's first declaration in one
  property or one argument (absent on either side, another value, the same value as another
  field type), or not at all, actively and passively, from the connection that declared the
  queue and from another one, for an exclusive and a shared queue.

Each :class:`Case` says what the connection must have done before (``setup``) and the bytes;
:func:`all_cases` is the whole set, named ``family/what``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pamqp import commands
from pamqp.base import Frame as MethodFrame
from transcript import FRAME_MAX, content, field, method, raw_frame, table

#: Methods only a server sends (AMQP 0-9-1 §1 "class" grammar: ``S:`` lines).
SERVER_ONLY = frozenset(
    {
        "Connection.Start", "Connection.Secure", "Connection.Tune", "Connection.OpenOk",
        "Connection.Blocked", "Connection.Unblocked", "Connection.UpdateSecretOk",
        "Channel.OpenOk",
        "Exchange.DeclareOk", "Exchange.DeleteOk", "Exchange.BindOk", "Exchange.UnbindOk",
        "Queue.DeclareOk", "Queue.BindOk", "Queue.PurgeOk", "Queue.DeleteOk", "Queue.UnbindOk",
        "Basic.QosOk", "Basic.ConsumeOk", "Basic.CancelOk", "Basic.Return", "Basic.Deliver",
        "Basic.GetOk", "Basic.GetEmpty", "Basic.RecoverOk",
        "Confirm.SelectOk", "Tx.SelectOk", "Tx.CommitOk", "Tx.RollbackOk",
    }
)  # fmt: skip

#: Every method, in index order.
METHODS: tuple[type[MethodFrame], ...] = tuple(cls for _, cls in sorted(commands.INDEX_MAPPING.items()))

#: A name used by the cases that need one (the same in both brokers' runs; nothing is created
#: under it but by a case that also deletes it).
NAME = "conformance-generated"

#: An exchange that exists on no broker: publishing to it makes the broker close channel 1.
MISSING_EXCHANGE = "conformance-generated-no-such-exchange"

#: RabbitMQ's field types (the AMQP 0-9-1 errata) with one valid value each.
FIELD_VALUES: dict[str, bytes] = {
    "t": b"\x01",
    "b": b"\xfe",
    "B": b"\xfe",
    "s": struct.pack(">h", -2),
    "u": struct.pack(">H", 65534),
    "I": struct.pack(">i", -2),
    "i": struct.pack(">I", 2**32 - 2),
    "l": struct.pack(">q", -2),
    "f": struct.pack(">f", 1.5),
    "d": struct.pack(">d", 1.5),
    "D": b"\x02" + struct.pack(">i", 12345),
    "T": struct.pack(">Q", 1_700_000_000),
    "S": struct.pack(">I", 3) + b"abc",
    "x": struct.pack(">I", 3) + b"\x00\xff\x01",
    "A": struct.pack(">I", 6) + b"S" + struct.pack(">I", 1) + b"z",
    "F": table(field("in", "S", struct.pack(">I", 1) + b"z")),
    "V": b"",
}

#: Type octets that are no field type of RabbitMQ's (``L`` and ``U`` are pamqp's, not RabbitMQ's).
UNKNOWN_TYPES = ("L", "U", "Z", "c", "p", "\x00", "\xff")


@dataclass(frozen=True)
class Case:
    """One generated input.

    :ivar name: ``family/what``, unique
    :ivar setup: ``open`` (channel 1 open), ``closing`` (channel 1 closed by the broker, its
        ``close-ok`` not sent) or ``content`` (a ``basic.publish`` and its content header on
        channel 1 sent, the body not)
    :ivar data: the bytes sent then, in one write
    :ivar other: bytes sent first on another connection (channel 1 open), whose answer is read
        and not recorded; that connection stays open until the case ends
    :ivar cleanup: queues deleted after the case (over a connection of their own)
    """

    name: str
    setup: str
    data: bytes
    other: bytes = b""
    cleanup: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]


def _arguments(cls: type[MethodFrame], values: dict[str, Any]) -> bytes:
    """The argument bytes of ``cls`` with ``values`` (the method frame's payload after its index)."""
    frame_bytes = method(0, cls, **values)
    return frame_bytes[7 + 4 : -1]


def _method_frame(channel: int, cls: type[MethodFrame], arguments: bytes) -> bytes:
    return raw_frame(1, channel, struct.pack(">I", cls.index) + arguments)


def _every_field_set(cls: type[MethodFrame]) -> dict[str, Any]:
    """Argument values with no field empty, so that every cut lands in a different place."""
    values: dict[str, Any] = {}
    for slot in cls.__slots__:
        amqp_type = cls.amqp_type(slot)
        if amqp_type == "shortstr":
            values[slot] = "direct" if slot == "exchange_type" else f"{NAME}-{slot}"
        elif amqp_type == "longstr":
            values[slot] = "secret"
        elif amqp_type == "table":
            values[slot] = table(field("gen", "S", struct.pack(">I", 1) + b"v"))
        elif amqp_type == "bit":
            values[slot] = slot in ("nowait", "no_ack")
        else:
            values[slot] = 3 if slot != "reply_code" else 200
    return values


def _snake(cls: type[MethodFrame]) -> str:
    return cls.name.lower().replace(".", "-")


def place_cases() -> Iterator[Case]:
    """Every method where it does not belong."""
    for cls in METHODS:
        frame = method(1, cls)
        is_connection = cls.name.startswith("Connection.")
        if cls.name in SERVER_ONLY and not is_connection:
            yield Case(f"place/server-only-on-channel-1/{_snake(cls)}", "open", frame)
        if cls.name in SERVER_ONLY and is_connection:
            yield Case(f"place/server-only-on-channel-0/{_snake(cls)}", "open", method(0, cls))
        if not is_connection:
            yield Case(f"place/on-channel-0/{_snake(cls)}", "open", method(0, cls))
        else:
            yield Case(f"place/connection-method-on-channel-1/{_snake(cls)}", "open", frame)
        if not is_connection:
            yield Case(f"place/on-unopened-channel/{_snake(cls)}", "open", method(3, cls))
            yield Case(f"place/on-closing-channel/{_snake(cls)}", "closing", frame)
        yield Case(f"place/in-content/{_snake(cls)}", "content", method(1 if not is_connection else 0, cls))
        if not is_connection:
            yield Case(
                f"place/in-content-other-channel/{_snake(cls)}",
                "content",
                method(2, commands.Channel.Open) + method(2, cls),
            )


#: Methods a client sends on an open connection, whose arguments are cut (the handshake's own
#: methods are covered by the handshake transcripts).
CLIENT_METHODS = tuple(
    cls
    for cls in METHODS
    if cls.name not in SERVER_ONLY
    and cls.name
    not in ("Connection.StartOk", "Connection.SecureOk", "Connection.TuneOk", "Connection.Open", "Connection.CloseOk")
)


def truncated_cases() -> Iterator[Case]:
    """Each client method's arguments cut at every byte boundary, and followed by stray bytes."""
    for cls in CLIENT_METHODS:
        channel = 0 if cls.name.startswith("Connection.") else 1
        arguments = _arguments(cls, _every_field_set(cls))
        for cut in range(len(arguments)):
            yield Case(
                f"truncated/{_snake(cls)}/{cut}-of-{len(arguments)}",
                "open",
                _method_frame(channel, cls, arguments[:cut]),
            )
        yield Case(f"truncated/{_snake(cls)}/trailing-bytes", "open", _method_frame(channel, cls, arguments + b"\x00"))


def _declare_with(arguments_table: bytes) -> bytes:
    """A ``queue.declare`` of a server-named exclusive queue with ``arguments_table`` as sent."""
    values = {"queue": "", "exclusive": True, "arguments": arguments_table}
    return method(1, commands.Queue.Declare, **values)


def _headers(headers_table: bytes) -> bytes:
    return struct.pack(">H", commands.Basic.Properties.flags["headers"]) + headers_table


def _publish_and_get(headers_table: bytes) -> bytes:
    """Publish a message carrying ``headers_table`` to a fresh server-named queue, then get it."""
    return (
        _declare_with(table())
        + method(1, commands.Basic.Publish, exchange="", routing_key="")
        + content(1, b"t", _headers(headers_table))
        + method(1, commands.Basic.Get, queue="", no_ack=True)
    )


def _tables() -> Iterator[tuple[str, bytes]]:
    """``(what, table bytes)``: every field type valid, cut, nested and unknown."""
    for type_char, value in FIELD_VALUES.items():
        name = f"type-{ord(type_char):02x}-{type_char}"
        yield f"{name}/valid", table(field("k", type_char, value))
        yield f"{name}/in-table", table(field("outer", "F", table(field("k", type_char, value))))
        yield (
            f"{name}/in-array",
            table(field("outer", "A", struct.pack(">I", 1 + len(value)) + type_char.encode("latin-1") + value)),
        )
        entry = field("k", type_char, value)
        for cut in range(3, len(entry)):  # inside the value (the key and type octet are whole)
            yield f"{name}/cut-{cut}", struct.pack(">I", cut) + entry[:cut]
    for type_char in UNKNOWN_TYPES:
        name = f"unknown-{ord(type_char):02x}"
        unknown = _raw_field("k", type_char, b"\x00\x00\x00\x00")
        yield f"{name}/top", struct.pack(">I", len(unknown)) + unknown
        yield f"{name}/in-table", table(field("outer", "F", struct.pack(">I", len(unknown)) + unknown))
    yield "key-past-the-end", struct.pack(">I", 3) + b"\x09ab"
    yield "length-past-the-frame", struct.pack(">I", 1000) + b"\x01kt\x01"


def _raw_field(key: str, type_char: str, payload: bytes) -> bytes:
    """A field-table entry whose type octet may be any byte (``field`` takes ASCII types only)."""
    return bytes([len(key)]) + key.encode() + type_char.encode("latin-1") + payload


def table_cases() -> Iterator[Case]:
    """Field tables in a method's arguments and in a message's headers."""
    for what, raw in _tables():
        yield Case(f"table/method-arguments/{what}", "open", _declare_with(raw))
        yield Case(f"table/headers/{what}", "open", _publish_and_get(raw))


def frame_cases() -> Iterator[Case]:
    """Frame-level violations."""
    qos = method(1, commands.Basic.Qos, prefetch_count=1)
    for end in (0x00, 0xCD, 0xCF, 0xFF):
        yield Case(f"frame/end-octet-{end:02x}", "open", qos[:-1] + bytes([end]))
    for frame_type in (0, 4, 5, 6, 7, 9, 65, 255):
        yield Case(f"frame/unknown-type-{frame_type}-channel-1", "open", raw_frame(frame_type, 1, b""))
        yield Case(f"frame/unknown-type-{frame_type}-channel-0", "open", raw_frame(frame_type, 0, b"x"))
    yield Case("frame/heartbeat-with-payload", "open", raw_frame(8, 0, b"x"))
    for size in (FRAME_MAX + 1, 2**31, 2**32 - 1):
        yield Case(f"frame/size-{size}", "open", struct.pack(">BHI", 1, 1, size) + b"\x00\x3c\x00\x0a")
    publish = method(1, commands.Basic.Publish, exchange="", routing_key=NAME)
    for delta in (-9, -8, -7, -1, 0):  # the body frame's payload around frame_max (8 is the frame's own)
        size = FRAME_MAX + delta
        header = raw_frame(2, 1, struct.pack(">HHQH", 60, 0, size, 0))
        yield Case(f"frame/body-payload-frame-max{delta:+d}", "open", publish + header + raw_frame(3, 1, b"b" * size))
    at_frame_max = struct.pack(">I", commands.Basic.Qos.index) + bytes(FRAME_MAX - 4)  # framed, but not a qos
    yield Case("frame/method-payload-at-frame-max", "open", raw_frame(1, 1, at_frame_max))
    yield Case("frame/channel-above-channel-max", "open", method(4000, commands.Channel.Open))
    yield Case("frame/channel-65535", "open", method(65535, commands.Channel.Open))


def content_cases() -> Iterator[Case]:
    """Content headers and bodies in the wrong order or with the wrong sizes."""
    publish = method(1, commands.Basic.Publish, exchange="", routing_key=NAME)

    def header(size: int, class_id: int = 60, weight: int = 0, flags: bytes = b"\x00\x00", channel: int = 1) -> bytes:
        return raw_frame(2, channel, struct.pack(">HHQ", class_id, weight, size) + flags)

    def body(data: bytes, channel: int = 1) -> bytes:
        return raw_frame(3, channel, data)

    sequences = {
        "header-without-publish": header(2),
        "body-without-header": publish + body(b"hi"),
        "body-longer-than-declared": publish + header(2) + body(b"hi!"),
        "body-shorter-than-declared-then-nothing": publish + header(3) + body(b"hi"),
        "two-bodies": publish + header(2) + body(b"h") + body(b"i"),
        "empty-body-frames": publish + header(2) + body(b"") + body(b"hi"),
        "body-after-zero-size": publish + header(0) + body(b"x"),
        "header-class-50": publish + header(2, class_id=50) + body(b"hi"),
        "header-class-0": publish + header(2, class_id=0) + body(b"hi"),
        "header-weight-1": publish + header(2, weight=1) + body(b"hi"),
        "header-flags-continued": publish + header(2, flags=b"\x00\x01\x00\x00") + body(b"hi"),
        "header-flag-bit-unused": publish + header(2, flags=b"\x00\x02") + body(b"hi"),
        "header-too-short": publish + raw_frame(2, 1, b"\x00\x3c\x00\x00"),
        "header-on-other-channel": publish + method(2, commands.Channel.Open) + header(2, channel=2) + body(b"hi"),
        "body-on-other-channel": publish + header(2) + method(2, commands.Channel.Open) + body(b"hi", channel=2),
        "header-twice": publish + header(2) + header(2) + body(b"hi"),
        "publish-twice": publish + publish + header(2) + body(b"hi"),
        "heartbeat-inside": publish + header(2) + raw_frame(8, 0, b"") + body(b"hi"),
        "other-channel-interleaved": publish
        + method(2, commands.Channel.Open)
        + header(2)
        + method(2, commands.Basic.Qos, prefetch_count=1)
        + body(b"hi"),
    }
    for name, data in sequences.items():
        yield Case(f"content/{name}", "open", data)


def _int(value: int) -> tuple[str, bytes]:
    return "I", struct.pack(">i", value)


def _longstr(value: str) -> tuple[str, bytes]:
    return "S", struct.pack(">I", len(value)) + value.encode()


#: The arguments RabbitMQ 3.10 compares when a classic queue is declared again (its
#: ``queue_arguments``), and one it does not: each with a valid value, another valid value, and
#: the first value as other field types (``l`` is an integer as ``I`` is, so equivalent; the
#: others are not). ``x-dead-letter-routing-key`` is declared beside a dead-letter exchange.
DECLARE_ARGUMENTS: dict[str, tuple[tuple[str, bytes], tuple[str, bytes], dict[str, tuple[str, bytes]]]] = {
    "x-expires": (_int(60000), _int(120000), {"l": ("l", struct.pack(">q", 60000)), "S": _longstr("60000")}),
    "x-message-ttl": (
        _int(1000),
        _int(2000),
        {"l": ("l", struct.pack(">q", 1000)), "d": ("d", struct.pack(">d", 1e3))},
    ),
    "x-dead-letter-exchange": (_longstr("dlx-a"), _longstr("dlx-b"), {"x": ("x", struct.pack(">I", 5) + b"dlx-a")}),
    "x-dead-letter-routing-key": (_longstr("dead-a"), _longstr("dead-b"), {}),
    "x-max-length": (_int(10), _int(20), {"b": ("b", b"\x0a"), "d": ("d", struct.pack(">d", 10.0))}),
    "x-max-length-bytes": (_int(1000), _int(2000), {"l": ("l", struct.pack(">q", 1000))}),
    "x-max-priority": (_int(5), _int(9), {"b": ("b", b"\x05"), "S": _longstr("5")}),
    "x-overflow": (_longstr("drop-head"), _longstr("reject-publish"), {}),
    "x-single-active-consumer": (("t", b"\x01"), ("t", b"\x00"), {"b": ("b", b"\x01")}),
    "x-queue-type": (_longstr("classic"), _longstr("quorum"), {}),
    "x-queue-mode": (_longstr("lazy"), _longstr("default"), {}),
    "x-queue-version": (_int(1), _int(2), {}),
    "x-queue-master-locator": (_longstr("min-masters"), _longstr("client-local"), {}),
    "x-not-compared": (_int(1), _int(2), {}),
}


def _declare_arguments(arguments: dict[str, tuple[str, bytes]]) -> bytes:
    return table(*(field(key, type_char, raw) for key, (type_char, raw) in arguments.items()))


def _declare_variants() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(what, first, again)``: the first declaration's properties and arguments and the
    redeclaration's, which differ in one place (or not at all)."""
    plain: dict[str, Any] = {"durable": False, "auto_delete": False, "arguments": {}}
    yield "same", plain, plain
    for flag in ("durable", "auto_delete"):
        yield f"{flag.replace('_', '-')}", plain, {**plain, flag: True}
    for key, (value, other, as_types) in DECLARE_ARGUMENTS.items():
        base = {"x-dead-letter-exchange": _longstr("dlx-a")} if key == "x-dead-letter-routing-key" else {}

        def declared(*entries: tuple[str, tuple[str, bytes]], base: dict[str, Any] = base) -> dict[str, Any]:
            return {**plain, "arguments": {**base, **dict(entries)}}

        yield f"{key}/absent-then-set", declared(), declared((key, value))
        yield f"{key}/set-then-absent", declared((key, value)), declared()
        yield f"{key}/other-value", declared((key, value)), declared((key, other))
        yield f"{key}/same-value", declared((key, value)), declared((key, value))
        for type_char, typed in as_types.items():
            yield f"{key}/as-type-{type_char}", declared((key, value)), declared((key, typed))


def declare_cases() -> Iterator[Case]:
    """Every way a ``queue.declare`` can differ from the queue's first declaration, from the
    connection that made it and from another, for an exclusive and a shared queue."""
    number = 0
    for what, first, again in _declare_variants():
        for exclusive in (True, False):
            for where in ("here", "elsewhere"):
                for passive in (False, True):
                    if passive and what != "same" and not what.endswith("/other-value") and what != "durable":
                        continue  # a passive declare compares nothing: one per kind of difference shows it
                    number += 1
                    name = f"{NAME}-declare-{number}"
                    original = method(
                        1,
                        commands.Queue.Declare,
                        queue=name,
                        durable=first["durable"],
                        exclusive=exclusive,
                        auto_delete=first["auto_delete"],
                        arguments=_declare_arguments(first["arguments"]),
                    )
                    redeclare = method(
                        1,
                        commands.Queue.Declare,
                        queue=name,
                        passive=passive,
                        durable=again["durable"],
                        exclusive=exclusive,
                        auto_delete=again["auto_delete"],
                        arguments=_declare_arguments(again["arguments"]),
                    )
                    kind = "exclusive" if exclusive else "shared"
                    label = f"declare/{kind}-declared-{where}/{'passive/' if passive else ''}{what}"
                    if where == "here":
                        yield Case(label, "open", original + redeclare, cleanup=(name,))
                    else:
                        yield Case(label, "open", redeclare, other=original, cleanup=(name,))
    for where in ("here", "elsewhere"):
        for exclusive in (True, False):
            number += 1
            name = f"{NAME}-declare-{number}"
            original = method(1, commands.Queue.Declare, queue=name, exclusive=exclusive)
            redeclare = method(1, commands.Queue.Declare, queue=name, exclusive=not exclusive)
            label = f"declare/{'exclusive' if exclusive else 'shared'}-declared-{where}/exclusive-flipped"
            if where == "here":
                yield Case(label, "open", original + redeclare, cleanup=(name,))
            else:
                yield Case(label, "open", redeclare, other=original, cleanup=(name,))


def all_cases() -> list[Case]:
    """Every generated case, names unique."""
    cases = [*place_cases(), *truncated_cases(), *table_cases(), *frame_cases(), *content_cases(), *declare_cases()]
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "generated case names must be unique"
    return cases

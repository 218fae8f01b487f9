"""Queue kinds: what ``x-queue-type`` selects, as RabbitMQ's ``rabbit_queue_type`` does.

A kind says which arguments a declaration may carry and how each is checked, which of them a
redeclaration must repeat, which properties it refuses, and makes the queue. Postroom has two
kinds: the classic queue (:data:`CLASSIC`, a ``WorkQueue``, which ``quorum`` declarations get
too, as a single node serves them) and the stream (:data:`STREAM`, a
``broker.core.stream.StreamQueue``, which answers as a queue where a channel or the vhost asks).

Checks answer in RabbitMQ's words (``rabbit_amqqueue:check_arguments``,
``rabbit_misc:assert_args_equivalence``), for the vhost to send as ``406 PRECONDITION_FAILED``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from postroom.broker.core.entry import Queue
from postroom.broker.core.queue import MAX_PRIORITY, WorkQueue
from postroom.broker.core.stream import NoLeadingDigit, StreamQueue, interval_seconds
from postroom.broker.errors import ChannelCrash, ChannelException, ReplyCode
from postroom.broker.wire.table import Float32, Int8, Int16, Int64, UInt8, UInt16, UInt32
from postroom.config.policies import KEYS as POLICY_KEYS
from postroom.config.policies import QUEUE_KEYS as QUEUE_POLICY_KEYS
from postroom.config.policies import STREAM_KEYS as STREAM_POLICY_KEYS


def is_int(value: object) -> bool:
    """Whether ``value`` came as one of the integer field types (a boolean is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _field_type(value: object) -> str:
    """RabbitMQ's name for the field type ``value`` came as (its reply texts name it)."""
    if isinstance(value, bool):
        return "bool"
    names = {Int8: "byte", UInt8: "unsignedbyte", Int16: "short", UInt16: "unsignedshort", UInt32: "unsignedint"}
    if is_int(value):
        return names.get(type(value), "long" if isinstance(value, Int64) else "signedint")
    if isinstance(value, Float32):
        return "float"
    kinds = ((float, "double"), (Decimal, "decimal"), (datetime, "timestamp"), (dict, "table"), (list, "array"))
    for kind, name in kinds:
        if isinstance(value, kind):
            return name
    if value is None:
        return "void"
    return "binary" if isinstance(value, (bytes, bytearray)) else "longstr"


def _term(value: object) -> object:
    """``value`` as RabbitMQ compares a redeclared queue's argument with the queue's own
    (``rabbit_misc:assert_args_equivalence``): equal when of one type class (every integer type
    is one, both float types another) with equal values, or as Erlang terms (a ``longstr`` and
    a ``binary`` of the same bytes are; ``1000`` and ``1000.0`` are not)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return ("float", float(value))
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dict):
        return tuple((_term(key), _term(item)) for key, item in value.items())
    if isinstance(value, list):
        return tuple(_term(item) for item in value)
    return value


def _erlang_float(value: float) -> str:
    """``value`` as Erlang's ``~p`` writes it: the shortest digits that read back as ``value``,
    in plain or scientific notation, whichever is shorter (plain on a tie): ``10.0``, ``1.0e3``."""
    text = repr(value)
    if not text[-1].isdigit():  # inf, nan
        return text
    sign = "-" if text.startswith("-") else ""
    mantissa, _, exponent_text = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    combined = whole + fraction
    digits = combined.lstrip("0").rstrip("0")
    if not digits:
        return f"{sign}0.0"
    exponent = int(exponent_text or 0) + len(whole) - 1 - (len(combined) - len(combined.lstrip("0")))
    scientific = f"{digits[0]}.{digits[1:] or '0'}e{exponent}"
    if exponent >= 0:
        padded = digits.ljust(exponent + 1, "0")
        plain = f"{padded[: exponent + 1]}.{padded[exponent + 1 :] or '0'}"
    else:
        plain = f"0.{'0' * (-exponent - 1)}{digits}"
    return sign + (plain if len(plain) <= len(scientific) else scientific)


#: RabbitMQ's largest TTL and expiry (``rabbit_misc:check_expiry``), in milliseconds.
MAX_EXPIRY = 315_360_000_000


def not_an_integer(value: object) -> str | None:
    """``None`` for an integer, else RabbitMQ's refusal (``"expected integer, got longstr"``)."""
    return None if is_int(value) else f'"expected integer, got {_field_type(value)}"'


def _non_negative(value: object) -> str | None:
    return not_an_integer(value) or (f"{{value_negative,{value}}}" if value < 0 else None)  # type: ignore[operator]


def _at_most(limit: int, term: str) -> Callable[[object], str | None]:
    """A check for a non-negative integer up to ``limit`` (RabbitMQ's ``{term,Value}`` above it)."""

    def check(value: object) -> str | None:
        error = _non_negative(value)
        return f"{{{term},{value}}}" if error is None and value > limit else error  # type: ignore[operator]

    return check


#: ``x-message-ttl``: an integer from 0 to :data:`MAX_EXPIRY`.
_expiry = _at_most(MAX_EXPIRY, "value_too_large")
#: ``x-max-priority``: 0 to :data:`MAX_PRIORITY`.
_max_priority = _at_most(MAX_PRIORITY, "max_value_exceeded")


def _expires(value: object) -> str | None:
    """``x-expires``: as a TTL, but not 0."""
    return not_an_integer(value) or ("{value_zero,0}" if value == 0 else _expiry(value))


def _positive(value: object) -> str | None:
    return not_an_integer(value) or (f"{{value_negative,{value}}}" if value <= 0 else None)  # type: ignore[operator]


def _string(value: object) -> str | None:
    kind = _field_type(value)
    return None if kind == "longstr" else f"{{unacceptable_type,{kind}}}"


def _overflow(value: object) -> str | None:
    error = _string(value)
    if error is not None:
        return error
    return None if value in ("drop-head", "reject-publish", "reject-publish-dlx") else "invalid_overflow"


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{_field_type(value)}}}"


def _queue_type(value: object) -> str | None:
    return None if value in ("classic", "quorum", "stream") else f"{{unacceptable_type,{_field_type(value)}}}"


#: Queue arguments Postroom understands, each with its check (``None``, or what is wrong in
#: RabbitMQ's words), in the order RabbitMQ checks them. Unknown ``x-`` arguments are kept and
#: ignored, as RabbitMQ does. These are also the arguments compared on redeclaration.
QUEUE_ARGUMENTS: dict[str, Callable[[object], str | None]] = {
    "x-queue-type": _queue_type,
    "x-expires": _expires,
    "x-message-ttl": _expiry,
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-max-length": _non_negative,
    "x-max-length-bytes": _non_negative,
    "x-max-priority": _max_priority,
    "x-overflow": _overflow,
    "x-single-active-consumer": _boolean,
    "x-delivery-limit": _non_negative,
    "x-visibility-timeout": _positive,
}


#: The arguments a queue's redeclaration must repeat, in the order RabbitMQ 3.10 compares a
#: classic queue's (``rabbit_classic_queue:capabilities/0``), then Postroom's own.
#: ``x-queue-mode``, ``x-queue-version`` and ``x-queue-master-locator`` change nothing in
#: Postroom, but RabbitMQ holds a redeclaration to them, so Postroom does too.
EQUIVALENT_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
    "x-delivery-limit",
    "x-visibility-timeout",
)


def describe(value: object) -> str:
    """``value`` as RabbitMQ writes an argument in a reply text (``'~s'`` or ``'~p'``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _erlang_float(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return repr(value) if not isinstance(value, str) else value


def _typed(value: object) -> str:
    """A value as RabbitMQ's ``rabbit_misc:val/1`` shows an argument only one side has."""
    return "none" if value is None else f"the value '{describe(value)}' of type '{_field_type(value)}'"


@dataclass(frozen=True)
class QueueKind:
    """One kind of queue.

    :ivar name: its ``x-queue-type``
    :ivar arguments: the arguments it understands, each with its check (``None``, or what is
        wrong in RabbitMQ's words), in the order RabbitMQ checks them; other ``x-`` arguments
        are kept and ignored, as RabbitMQ does
    :ivar equivalent: the arguments a redeclaration must repeat, in the order compared
    :ivar create: makes a queue of this kind (``WorkQueue``'s signature, and ``streams``: the
        node's stream store, or ``None``)
    :ivar refused: other kinds' arguments, which a declaration of this kind may not carry
    :ivar type_name: RabbitMQ's name for the kind, in its refusals
    :ivar server_named: whether a declaration may leave the name to the server
    :ivar properties: refuses the properties (durable, exclusive, auto-delete) this kind does
        not take: ``(name, where, durable, exclusive, auto_delete, arguments)``
    :ivar unsupported_policies: policy keys of other kinds: a policy with any of them does not
        apply to a queue of this kind (RabbitMQ's ``unsupported_policies`` capability)
    """

    name: str
    arguments: Mapping[str, Callable[[object], str | None]]
    equivalent: tuple[str, ...]
    create: Callable[..., Queue]
    refused: frozenset[str] = frozenset()
    type_name: str = ""
    server_named: bool = True
    properties: Callable[[str, str, bool, bool, bool, Mapping[str, Any]], None] | None = None
    unsupported_policies: frozenset[str] = frozenset()

    def check_arguments(self, name: str, where: str, arguments: Mapping[str, Any]) -> None:
        """Refuse a declaration of queue ``name`` (``where``: ``in vhost '/'``) whose arguments
        this kind does not take.

        :raises ChannelException: 406, naming the first argument refused and why
        """
        for key, check in self.arguments.items():
            if key not in arguments:
                continue
            error = check(arguments[key])
            if error is None and key == "x-dead-letter-routing-key" and "x-dead-letter-exchange" not in arguments:
                error = "routing_key_but_no_dlx_defined"
            if error is not None:
                raise ChannelException(
                    ReplyCode.PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{name}' {where}: {error}"
                )
        for key in arguments:  # in the order they came
            if key in self.refused:
                raise ChannelException(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid arg '{key}' for queue '{name}' {where} of queue type {self.type_name}",
                )

    def check_equivalent(
        self, queue: Queue, where: str, durable: bool, auto_delete: bool, arguments: Mapping[str, Any]
    ) -> None:
        """Refuse a redeclaration of ``queue`` that differs from it.

        :raises ChannelException: 406, naming the first field that differs, both values shown
        """
        checks: list[tuple[str, object, object]] = [
            ("durable", queue.durable, durable),
            ("auto_delete", queue.auto_delete, auto_delete),
        ]
        checks += [(key, queue.arguments.get(key), arguments.get(key)) for key in self.equivalent]
        for field, current, received in checks:
            if _term(current) != _term(received):
                if field == "x-queue-type" and {current, received} <= {None, "classic"}:
                    continue
                if current is None or received is None:  # RabbitMQ then names the type too
                    received_text, current_text = _typed(received), _typed(current)
                else:
                    received_text, current_text = f"'{describe(received)}'", f"'{describe(current)}'"
                raise ChannelException(
                    ReplyCode.PRECONDITION_FAILED,
                    f"inequivalent arg '{field}' for queue '{queue.name}' {where}: "
                    f"received {received_text} but current is {current_text}",
                )


#: The largest ``x-stream-max-segment-size-bytes`` (RabbitMQ's ``?MAX_STREAM_MAX_SEGMENT_SIZE``).
MAX_STREAM_SEGMENT_BYTES = 3_000_000_000

#: What RabbitMQ names the stream kind in its refusals.
STREAM_TYPE_NAME = "rabbit_stream_queue"


def _max_age(value: object) -> str | None:
    """``x-max-age``: digits and one of ``Y M D h m s`` (RabbitMQ's channel crashes on a value
    without leading digits: :class:`ChannelCrash`, 541, as it answers)."""
    error = _string(value)
    if error is not None:
        return error
    try:
        interval_seconds(value.decode() if isinstance(value, bytes) else str(value))
    except NoLeadingDigit:
        raise ChannelCrash() from None
    except ValueError:
        return "invalid_max_age"
    return None


def _initial_cluster_size(value: object) -> str | None:
    if not is_int(value):
        return not_an_integer(value)
    if value == 0:
        return "{value_zero,0}"
    return f"{{value_negative,{value}}}" if value < 0 else None  # type: ignore[operator]


def _leader_locator(value: object) -> str | None:
    if value in ("client-local", "balanced", "random", "least-leaders"):
        return None
    return "invalid_queue_locator_arg"


#: A stream's arguments, in the order RabbitMQ checks them (``rabbit_amqqueue:declare_args``).
STREAM_ARGUMENTS: dict[str, Callable[[object], str | None]] = {
    "x-queue-type": _queue_type,
    "x-max-length-bytes": _non_negative,
    "x-max-age": _max_age,
    "x-stream-max-segment-size-bytes": _non_negative,
    "x-initial-cluster-size": _initial_cluster_size,
    "x-queue-leader-locator": _leader_locator,
}

#: Arguments of the other queue types, refused on a stream (in wire order, the first found).
NOT_FOR_STREAMS = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-max-length",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-master-locator",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
    }
)

#: What a stream's redeclaration must repeat (``rabbit_stream_queue:capabilities/0``).
STREAM_EQUIVALENT = (
    "x-max-length-bytes",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
)


def _stream_properties(
    name: str, where: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: Mapping[str, Any]
) -> None:
    """A stream is durable, shared and kept (``rabbit_stream_queue:declare``'s checks, in its order)."""
    for refused, why in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
        if refused:
            raise ChannelException(
                ReplyCode.PRECONDITION_FAILED, f"invalid property '{why}' for queue '{name}' {where}"
            )
    size = arguments.get("x-stream-max-segment-size-bytes")
    if isinstance(size, int) and size > MAX_STREAM_SEGMENT_BYTES:
        raise ChannelException(
            ReplyCode.PRECONDITION_FAILED, "Exceeded max value for x-stream-max-segment-size-bytes"
        )


def _classic(name: str, vhost_name: str, streams: Any = None, **options: Any) -> WorkQueue:
    return WorkQueue(name, vhost_name, **options)


def _stream(name: str, vhost_name: str, streams: Any = None, **options: Any) -> StreamQueue:
    if streams is None:
        raise ChannelException(ReplyCode.PRECONDITION_FAILED, "streams need storage (storage.dir)")
    stream: StreamQueue = streams.open(name, vhost_name, options["arguments"])
    return stream


#: The classic queue: a ``WorkQueue``. (RabbitMQ's classic queues refuse ``delivery-limit``
#: policies too; Postroom's take them.)
CLASSIC = QueueKind(
    "classic",
    QUEUE_ARGUMENTS,
    EQUIVALENT_ARGUMENTS,
    _classic,
    unsupported_policies=frozenset(STREAM_POLICY_KEYS) - frozenset(QUEUE_POLICY_KEYS),
)

#: The stream: a ``StreamQueue``.
STREAM = QueueKind(
    "stream",
    STREAM_ARGUMENTS,
    STREAM_EQUIVALENT,
    _stream,
    refused=NOT_FOR_STREAMS,
    type_name=STREAM_TYPE_NAME,
    server_named=False,
    properties=_stream_properties,
    unsupported_policies=POLICY_KEYS - frozenset(STREAM_POLICY_KEYS) - {"alternate-exchange"},
)

#: The kinds by ``x-queue-type``.
KINDS: dict[str, QueueKind] = {"classic": CLASSIC, "quorum": CLASSIC, "stream": STREAM}


def kind_of(arguments: Mapping[str, Any]) -> QueueKind:
    """The kind a declaration's ``x-queue-type`` selects (classic when absent; a value no kind
    has is refused by the classic kind's check, in RabbitMQ's words)."""
    kind = arguments.get("x-queue-type")
    return KINDS.get(kind, CLASSIC) if isinstance(kind, str) else CLASSIC

"""pika (blocking and asynchronous) against an in-process broker over loopback.

Each test opens its own broker (the ``broker`` fixture) and pika connections (``pika_connect``,
closed after the test). Waiting is event-driven: :func:`wait_for` runs pika's I/O loop until a
condition holds, with a deadline, and a synchronous method (``queue.declare`` passive, say) on
the same connection proves the broker has handled everything sent before it, since the broker
answers in order.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import (
    ChannelClosedByBroker,
    ConnectionClosedByBroker,
    ProbableAuthenticationError,
    UnroutableError,
)

from postroom.broker.core.node import Limits, Node
from postroom.broker.core.users import User

pytestmark = [pytest.mark.integration, pytest.mark.interop]

Connect = Callable[..., BlockingConnection]
Delivery = tuple[pika.spec.Basic.Deliver, pika.BasicProperties, bytes]


def wait_for(connection: BlockingConnection, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Run ``connection``'s I/O loop until ``condition()`` holds.

    :raises AssertionError: when it does not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"condition not met within {timeout} s")
        connection.process_data_events(time_limit=remaining)


def ready_count(channel: BlockingChannel, queue: str) -> int:
    """The queue's ready message count, from a passive ``queue.declare``."""
    return channel.queue_declare(queue, passive=True).method.message_count


def drain(channel: BlockingChannel, queue: str) -> list[bytes]:
    """Every ready message body of ``queue``, taken with ``basic.get`` and auto-ack."""
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def collector(into: list[Delivery]) -> Callable[..., None]:
    """A ``basic_consume`` callback that appends each delivery to ``into``."""

    def on_message(_channel: BlockingChannel, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
        into.append((method, properties, body))

    return on_message


# -- publish and consume ----------------------------------------------------------------------


def test_round_trip_preserves_body_properties_and_headers_exactly(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("props")
    body = bytes(range(256)) * 4
    headers = {
        "text": "héllo wörld",
        "int": -42,
        "big": 2**40,
        "flag": True,
        "decimal": Decimal("3.14"),
        "list": [1, "two", False],
        "nested": {"a": {"b": "c"}, "n": 7},
    }
    properties = pika.BasicProperties(
        content_type="application/octet-stream",
        content_encoding="identity",
        headers=headers,
        delivery_mode=2,
        priority=3,
        correlation_id="corr-1",
        reply_to="replies",
        expiration="60000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="example",
        user_id="guest",
        app_id="postroom-tests",
    )
    channel.basic_publish("", "props", body, properties)
    received: list[Delivery] = []
    channel.basic_consume("props", collector(received), auto_ack=True)

    wait_for(connection, lambda: len(received) == 1)

    method, got, got_body = received[0]
    assert got_body == body
    assert (method.exchange, method.routing_key, method.redelivered) == ("", "props", False)
    assert got.headers == headers
    for name in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(got, name) == getattr(properties, name), name


def test_body_larger_than_frame_max_round_trips(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("big")
    body = bytes(i % 251 for i in range(300_000))  # three body frames at frame_max 131072

    channel.basic_publish("", "big", body)
    method, _properties, got = channel.basic_get("big", auto_ack=True)

    assert method is not None
    assert got == body


def test_publisher_confirms_ack_every_publish(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("confirmed")
    channel.confirm_delivery()

    for index in range(20):
        channel.basic_publish("", "confirmed", b"m%d" % index)  # raises NackError on a nack

    assert ready_count(channel, "confirmed") == 20


def test_mandatory_publish_to_no_queue_is_returned_with_312(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    returned: list[Delivery] = []
    channel.add_on_return_callback(
        lambda _channel, method, properties, body: returned.append((method, properties, body))
    )

    channel.basic_publish("amq.direct", "nobody", b"lost", pika.BasicProperties(message_id="r1"), mandatory=True)
    wait_for(connection, lambda: len(returned) == 1)

    method, properties, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == ("amq.direct", "nobody")
    assert (properties.message_id, body) == ("r1", b"lost")


def test_mandatory_publish_in_confirm_mode_raises_unroutable(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.confirm_delivery()

    with pytest.raises(UnroutableError) as excinfo:
        channel.basic_publish("", "no-such-queue", b"lost", mandatory=True)

    [message] = excinfo.value.messages
    assert (message.method.reply_code, message.method.routing_key, message.body) == (312, "no-such-queue", b"lost")
    assert channel.is_open


def test_basic_get_returns_messages_then_get_empty(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("gets")
    channel.basic_publish("", "gets", b"one")
    channel.basic_publish("", "gets", b"two")

    first = channel.basic_get("gets", auto_ack=True)
    second = channel.basic_get("gets", auto_ack=True)
    empty = channel.basic_get("gets", auto_ack=True)

    assert (first[0].message_count, first[2]) == (1, b"one")
    assert (second[0].message_count, second[2]) == (0, b"two")
    assert empty == (None, None, None)


# -- acknowledgements -------------------------------------------------------------------------


def test_ack_multiple_acknowledges_up_to_the_tag(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("acks")
    for index in range(4):
        channel.basic_publish("", "acks", b"%d" % index)
    tags = [channel.basic_get("acks")[0].delivery_tag for _ in range(4)]

    channel.basic_ack(tags[2], multiple=True)
    channel.close()  # the one unacked delivery (tag 4) goes back to the queue

    other = connection.channel()
    assert tags == [1, 2, 3, 4]
    assert drain(other, "acks") == [b"3"]


def test_nack_with_requeue_redelivers_with_redelivered_flag(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("nacks")
    channel.basic_publish("", "nacks", b"again")
    method, _properties, _body = channel.basic_get("nacks")
    assert method.redelivered is False

    channel.basic_nack(method.delivery_tag, requeue=True)
    again, _properties, body = channel.basic_get("nacks", auto_ack=True)

    assert (again.redelivered, body) == (True, b"again")


def test_nack_multiple_requeues_in_original_order(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("nack-many")
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "nack-many", body)
    tags = [channel.basic_get("nack-many")[0].delivery_tag for _ in range(3)]

    channel.basic_nack(tags[-1], multiple=True, requeue=True)

    assert drain(channel, "nack-many") == [b"a", b"b", b"c"]


def test_reject_without_requeue_drops_the_message(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("rejects")
    channel.basic_publish("", "rejects", b"bad")
    method, _properties, _body = channel.basic_get("rejects")

    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.close()

    assert ready_count(connection.channel(), "rejects") == 0


def test_ack_of_unknown_delivery_tag_closes_channel_with_406(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()

    channel.basic_ack(99)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("after-bad-ack")

    assert excinfo.value.reply_code == 406
    assert connection.is_open


# -- consumers --------------------------------------------------------------------------------


def test_three_consumers_share_thirty_messages_in_rotation(pika_connect: Connect) -> None:
    connection = pika_connect()
    publisher = connection.channel()
    publisher.queue_declare("work")
    received: list[list[bytes]] = [[], [], []]
    for index in range(3):
        consumer_channel = connection.channel()
        consumer_channel.basic_consume(
            "work",
            lambda _ch, _method, _props, body, index=index: received[index].append(body),
            auto_ack=True,
        )

    for number in range(30):
        publisher.basic_publish("", "work", b"%d" % number)
    wait_for(connection, lambda: sum(map(len, received)) == 30)

    assert received == [[b"%d" % number for number in range(start, 30, 3)] for start in range(3)]


def test_consumer_never_holds_more_than_prefetch_unacked(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("prefetch")
    channel.basic_qos(prefetch_count=5)
    received: list[Delivery] = []
    channel.basic_consume("prefetch", collector(received))

    for number in range(12):
        channel.basic_publish("", "prefetch", b"%d" % number)
    ready = ready_count(channel, "prefetch")  # answered after every delivery the publishes caused
    connection.process_data_events(time_limit=0)

    assert [body for _m, _p, body in received] == [b"0", b"1", b"2", b"3", b"4"]
    assert ready == 7

    channel.basic_ack(received[1][0].delivery_tag)
    wait_for(connection, lambda: len(received) == 6)
    assert received[5][2] == b"5"
    assert ready_count(channel, "prefetch") == 6


def test_global_qos_limits_the_channel_across_consumers(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    for name in ("global-a", "global-b"):
        channel.queue_declare(name)
        for number in range(5):
            channel.basic_publish("", name, b"%d" % number)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    received: list[Delivery] = []
    channel.basic_consume("global-a", collector(received))
    channel.basic_consume("global-b", collector(received))

    ready = ready_count(channel, "global-a") + ready_count(channel, "global-b")
    connection.process_data_events(time_limit=0)

    assert (len(received), ready) == (3, 7)
    channel.basic_ack(received[0][0].delivery_tag)
    wait_for(connection, lambda: len(received) == 4)
    assert ready_count(channel, "global-a") + ready_count(channel, "global-b") == 6


def test_unacked_deliveries_return_to_another_consumer_when_connection_closes(pika_connect: Connect) -> None:
    first = pika_connect()
    first_channel = first.channel()
    first_channel.queue_declare("handover")
    for number in range(3):
        first_channel.basic_publish("", "handover", b"%d" % number)
    held: list[Delivery] = []
    first_channel.basic_consume("handover", collector(held))
    wait_for(first, lambda: len(held) == 3)
    second = pika_connect()
    second_channel = second.channel()
    taken: list[Delivery] = []
    second_channel.basic_consume("handover", collector(taken))

    first.close()
    wait_for(second, lambda: len(taken) == 3)

    assert [(method.redelivered, body) for method, _props, body in taken] == [
        (True, b"0"),
        (True, b"1"),
        (True, b"2"),
    ]


def test_deleting_a_queue_cancels_its_consumer_with_notification(pika_connect: Connect) -> None:
    consumer = pika_connect()
    channel = consumer.channel()
    channel.queue_declare("doomed")
    cancels: list[Any] = []
    channel.add_on_cancel_callback(cancels.append)
    tag = channel.basic_consume("doomed", collector([]))

    deleter = pika_connect().channel()
    deleter.queue_delete("doomed")
    wait_for(consumer, lambda: len(cancels) == 1)

    assert cancels[0].method.consumer_tag == tag
    assert channel.consumer_tags == []


def test_auto_delete_queue_vanishes_when_last_consumer_cancels(pika_connect: Connect, broker: Any) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("fleeting", auto_delete=True)
    first = channel.basic_consume("fleeting", collector([]))
    second = channel.basic_consume("fleeting", collector([]))

    channel.basic_cancel(first)
    still_there = "fleeting" in broker.queue_names()
    channel.basic_cancel(second)

    assert still_there
    assert "fleeting" not in broker.queue_names()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("fleeting", passive=True)
    assert excinfo.value.reply_code == 404


def test_selectconnection_round_trip(broker: Any) -> None:
    parameters = pika.URLParameters(broker.url + "?connection_attempts=1&socket_timeout=5")
    received: list[bytes] = []
    errors: list[object] = []

    def on_open(connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel: Any) -> None:
        def on_declared(_frame: Any) -> None:
            channel.basic_consume("async", on_message, auto_ack=True)
            channel.basic_publish("", "async", b"via ioloop")

        channel.queue_declare("async", callback=on_declared)

    def on_message(channel: Any, _method: Any, _properties: Any, body: bytes) -> None:
        received.append(body)
        channel.connection.close()

    connection = pika.SelectConnection(
        parameters,
        on_open_callback=on_open,
        on_open_error_callback=lambda _c, error: errors.append(error),
        on_close_callback=lambda conn, _reason: conn.ioloop.stop(),
    )
    timer = connection.ioloop.call_later(5, connection.ioloop.stop)
    try:
        connection.ioloop.start()
    finally:
        connection.ioloop.remove_timeout(timer)
        connection.ioloop.close()

    assert errors == []
    assert received == [b"via ioloop"]
    assert connection.is_closed


# -- errors and ownership ---------------------------------------------------------------------


def test_exclusive_queue_is_locked_to_other_connections_with_405(pika_connect: Connect) -> None:
    owner = pika_connect().channel()
    owner.queue_declare("mine", exclusive=True)
    intruder_connection = pika_connect()

    with pytest.raises(ChannelClosedByBroker) as excinfo:
        intruder_connection.channel().queue_declare("mine")

    assert excinfo.value.reply_code == 405
    assert intruder_connection.is_open
    owner.basic_publish("", "mine", b"still mine")
    assert owner.basic_get("mine", auto_ack=True)[2] == b"still mine"


def test_consume_from_another_connections_exclusive_queue_is_refused_with_405(pika_connect: Connect) -> None:
    pika_connect().channel().queue_declare("mine", exclusive=True)
    channel = pika_connect().channel()

    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.basic_consume("mine", collector([]))

    assert excinfo.value.reply_code == 405


def test_exclusive_queue_is_removed_when_its_connection_closes(pika_connect: Connect, broker: Any) -> None:
    owner = pika_connect()
    owner.channel().queue_declare("ephemeral", exclusive=True)
    assert "ephemeral" in broker.queue_names()

    owner.close()

    assert "ephemeral" not in broker.queue_names()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        pika_connect().channel().queue_declare("ephemeral", passive=True)
    assert excinfo.value.reply_code == 404


def test_redeclare_with_other_durable_fails_406_and_connection_stays_usable(pika_connect: Connect) -> None:
    connection = pika_connect()
    connection.channel().queue_declare("settled", durable=False)
    channel = connection.channel()

    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("settled", durable=True)

    assert excinfo.value.reply_code == 406
    assert excinfo.value.reply_text.startswith("PRECONDITION_FAILED - inequivalent arg 'durable'")
    fresh = connection.channel()
    fresh.basic_publish("", "settled", b"fine")
    assert fresh.basic_get("settled", auto_ack=True)[2] == b"fine"


def test_passive_declare_of_missing_queue_fails_404(pika_connect: Connect) -> None:
    connection = pika_connect()

    with pytest.raises(ChannelClosedByBroker) as excinfo:
        connection.channel().queue_declare("ghost", passive=True)

    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        404,
        "NOT_FOUND - no queue 'ghost' in vhost '/'",
    )
    assert connection.is_open


def test_unknown_exchange_type_fails_406(pika_connect: Connect) -> None:
    connection = pika_connect()

    with pytest.raises(ChannelClosedByBroker) as excinfo:
        connection.channel().exchange_declare("odd", exchange_type="x-no-such-type")

    assert excinfo.value.reply_code == 406
    assert connection.is_open


def test_publish_to_missing_exchange_closes_channel_with_404(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()

    channel.basic_publish("no-such-exchange", "key", b"lost")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("after")  # the close arrives before this method's answer

    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        404,
        "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'",
    )
    assert connection.is_open


def test_user_id_other_than_the_login_closes_channel_with_406(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("ids")

    channel.basic_publish("", "ids", b"forged", pika.BasicProperties(user_id="mallory"))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("ids", passive=True)

    assert excinfo.value.reply_code == 406
    assert ready_count(connection.channel(), "ids") == 0


def test_wrong_password_is_refused(broker: Any) -> None:
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        broker.port,
        credentials=pika.PlainCredentials("guest", "wrong"),
        connection_attempts=1,
        socket_timeout=5,
        stack_timeout=5,
    )

    with pytest.raises(ProbableAuthenticationError) as excinfo:
        pika.BlockingConnection(parameters)

    assert "ACCESS_REFUSED" in str(excinfo.value)


def test_user_limited_to_other_vhost_is_refused_on_open(make_broker: Callable[..., Any]) -> None:
    broker = make_broker(Node(users=(User("app", "secret", vhosts=frozenset({"/"})),), vhost_names=("/", "other")))
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        broker.port,
        virtual_host="other",
        credentials=pika.PlainCredentials("app", "secret"),
        connection_attempts=1,
        socket_timeout=5,
        stack_timeout=5,
    )

    with pytest.raises(pika.exceptions.AMQPConnectionError) as excinfo:
        pika.BlockingConnection(parameters)

    assert "530" in repr(excinfo.value)


# -- routing ----------------------------------------------------------------------------------


def declare_bound(channel: BlockingChannel, exchange: str, bindings: dict[str, list[Any]]) -> None:
    """Declare each queue and bind it to ``exchange`` with each (routing key, arguments) pair."""
    for queue, keys in bindings.items():
        channel.queue_declare(queue)
        for key, arguments in keys:
            channel.queue_bind(queue, exchange, key, arguments)


def test_fanout_copies_to_every_bound_queue(pika_connect: Connect) -> None:
    channel = pika_connect().channel()
    channel.exchange_declare("fan", "fanout")
    declare_bound(channel, "fan", {name: [("ignored", None)] for name in ("f1", "f2", "f3")})

    channel.basic_publish("fan", "any-key", b"everyone")

    assert [drain(channel, name) for name in ("f1", "f2", "f3")] == [[b"everyone"]] * 3


@pytest.mark.parametrize(
    ("routing_key", "expected"),
    [
        ("a.b.c", {"one-word", "a-rest", "all"}),
        ("a", {"a-rest", "all"}),
        ("a.c", {"a-rest", "all"}),
        ("a.b.b.c", {"a-rest", "all"}),
        ("x.y", {"all"}),
        ("", {"all"}),
    ],
)
def test_topic_star_matches_one_word_and_hash_zero_or_more(
    pika_connect: Connect, routing_key: str, expected: set[str]
) -> None:
    channel = pika_connect().channel()
    channel.exchange_declare("topics", "topic")
    queues = {"one-word": [("a.*.c", None)], "a-rest": [("a.#", None)], "all": [("#", None)]}
    declare_bound(channel, "topics", queues)

    channel.basic_publish("topics", routing_key, b"t")

    assert {name for name in queues if drain(channel, name) == [b"t"]} == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"a": 1, "b": 2}, {"all", "any"}),
        ({"a": 1, "b": 2, "c": 3}, {"all", "any"}),
        ({"a": 1}, {"any"}),
        ({"a": 1, "b": 3}, {"any"}),
        ({"c": 1}, set()),
        (None, set()),
    ],
)
def test_headers_exchange_x_match_all_and_any(
    pika_connect: Connect, headers: dict[str, Any] | None, expected: set[str]
) -> None:
    channel = pika_connect().channel()
    channel.exchange_declare("hdrs", "headers")
    queues = {
        "all": [("", {"x-match": "all", "a": 1, "b": 2})],
        "any": [("", {"x-match": "any", "a": 1, "b": 2})],
    }
    declare_bound(channel, "hdrs", queues)

    channel.basic_publish("hdrs", "", b"h", pika.BasicProperties(headers=headers))

    assert {name for name in queues if drain(channel, name) == [b"h"]} == expected


def test_exchange_to_exchange_binding_routes_through(pika_connect: Connect) -> None:
    channel = pika_connect().channel()
    channel.exchange_declare("upstream", "topic")
    channel.exchange_declare("downstream", "fanout")
    channel.exchange_bind("downstream", "upstream", "orders.*")
    declare_bound(channel, "downstream", {"sink": [("", None)]})

    channel.basic_publish("upstream", "orders.created", b"yes")
    channel.basic_publish("upstream", "invoices.created", b"no")

    assert drain(channel, "sink") == [b"yes"]


def test_alternate_exchange_receives_unroutable_messages(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.exchange_declare("spill", "fanout")
    channel.exchange_declare("main", "direct", arguments={"alternate-exchange": "spill"})
    declare_bound(channel, "main", {"routed": [("known", None)]})
    declare_bound(channel, "spill", {"unrouted": [("", None)]})
    returned: list[Any] = []
    channel.add_on_return_callback(lambda *args: returned.append(args))

    channel.basic_publish("main", "known", b"direct")
    channel.basic_publish("main", "unknown", b"spilled", mandatory=True)

    assert drain(channel, "routed") == [b"direct"]
    assert drain(channel, "unrouted") == [b"spilled"]
    connection.process_data_events(time_limit=0)
    assert returned == []


def test_priority_queue_delivers_highest_priority_first(pika_connect: Connect) -> None:
    channel = pika_connect().channel()
    channel.queue_declare("urgent", arguments={"x-max-priority": 10})
    for body, priority in [(b"p1", 1), (b"p5a", 5), (b"none", None), (b"p10", 10), (b"p5b", 5), (b"p0", 0)]:
        channel.basic_publish("", "urgent", body, pika.BasicProperties(priority=priority))
    received: list[Delivery] = []
    channel.basic_consume("urgent", collector(received), auto_ack=True)

    wait_for(channel.connection, lambda: len(received) == 6)

    assert [body for _m, _p, body in received] == [b"p10", b"p5a", b"p5b", b"p1", b"none", b"p0"]


# -- transactions -----------------------------------------------------------------------------


def test_tx_publishes_appear_only_on_commit_and_rollback_discards(pika_connect: Connect) -> None:
    connection = pika_connect()
    observer = connection.channel()
    observer.queue_declare("txq")
    tx = connection.channel()
    tx.tx_select()

    tx.basic_publish("", "txq", b"one")
    tx.basic_publish("", "txq", b"two")
    before_commit = ready_count(observer, "txq")
    tx.tx_commit()
    after_commit = ready_count(observer, "txq")
    tx.basic_publish("", "txq", b"three")
    tx.tx_rollback()
    after_rollback = ready_count(observer, "txq")

    assert (before_commit, after_commit, after_rollback) == (0, 2, 2)
    assert drain(observer, "txq") == [b"one", b"two"]


def test_tx_acks_take_effect_only_on_commit(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("txacks")
    channel.basic_publish("", "txacks", b"a")
    channel.basic_publish("", "txacks", b"b")
    channel.tx_select()
    first = channel.basic_get("txacks")[0]
    second = channel.basic_get("txacks")[0]

    channel.basic_ack(first.delivery_tag)
    channel.tx_commit()
    channel.basic_ack(second.delivery_tag)
    channel.tx_rollback()
    channel.close()  # the rolled-back ack leaves "b" unacked, so closing requeues it

    assert drain(connection.channel(), "txacks") == [b"b"]


def test_tx_second_ack_of_the_same_tag_is_refused_at_once(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("txdouble")
    channel.basic_publish("", "txdouble", b"once")
    channel.tx_select()
    method = channel.basic_get("txdouble")[0]

    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("txdouble", passive=True)

    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - unknown delivery tag 1",
    )


# -- queue management and limits -------------------------------------------------------------


def test_purge_drops_ready_messages_and_reports_the_count(pika_connect: Connect) -> None:
    channel = pika_connect().channel()
    channel.queue_declare("purged")
    for number in range(4):
        channel.basic_publish("", "purged", b"%d" % number)
    held = channel.basic_get("purged")[0]

    purged = channel.queue_purge("purged").method.message_count
    channel.basic_nack(held.delivery_tag, requeue=True)  # unacked messages survive a purge

    assert purged == 3
    assert drain(channel, "purged") == [b"0"]


def test_delete_if_empty_refuses_a_queue_with_messages(pika_connect: Connect) -> None:
    connection = pika_connect()
    channel = connection.channel()
    channel.queue_declare("full")
    channel.basic_publish("", "full", b"keep me")

    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_delete("full", if_empty=True)

    assert excinfo.value.reply_code == 406
    other = connection.channel()
    assert other.queue_delete("full").method.message_count == 1


def test_message_over_the_size_limit_closes_channel_with_406(make_broker: Callable[..., Any]) -> None:
    broker = make_broker(Node(limits=Limits(max_message_bytes=1000)))
    connection = pika.BlockingConnection(pika.URLParameters(broker.url + "?connection_attempts=1&socket_timeout=5"))
    try:
        channel = connection.channel()
        channel.queue_declare("small")

        channel.basic_publish("", "small", b"x" * 1001)
        with pytest.raises(ChannelClosedByBroker) as excinfo:
            channel.queue_declare("small", passive=True)

        assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
            406,
            "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000",
        )
        fresh = connection.channel()
        fresh.basic_publish("", "small", b"x" * 1000)
        assert len(fresh.basic_get("small", auto_ack=True)[2]) == 1000
    finally:
        connection.close()


def test_broker_shutdown_closes_connections_with_320(pika_connect: Connect, broker: Any) -> None:
    connection = pika_connect()
    connection.channel()

    broker.stop()
    with pytest.raises(ConnectionClosedByBroker) as excinfo:
        wait_for(connection, lambda: False)

    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        320,
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
    )


def test_a_20_mb_message_round_trips_under_the_default_limit(pika_connect: Callable[..., Any]) -> None:
    # RabbitMQ 3.x accepts messages up to 128 MiB by default; aio-pika's and aiormq's own tests
    # publish 20-22 MB bodies.
    channel = pika_connect().channel()
    channel.queue_declare("large")
    channel.confirm_delivery()
    body = bytes(range(256)) * (20 * 1024 * 1024 // 256)
    channel.basic_publish("", "large", body)
    _method, _properties, got = channel.basic_get("large", auto_ack=True)
    assert got == body


def test_rpc_over_direct_reply_to(pika_connect: Connect) -> None:
    requester, responder = pika_connect(), pika_connect()
    server = responder.channel()
    server.queue_declare("rpc.add")

    def answer(channel: BlockingChannel, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
        total = sum(int(part) for part in body.split(b"+"))
        reply = pika.BasicProperties(correlation_id=properties.correlation_id)
        channel.basic_publish("", properties.reply_to, b"%d" % total, reply)

    server.basic_consume("rpc.add", answer, auto_ack=True)
    client = requester.channel()
    replies: list[Delivery] = []
    client.basic_consume("amq.rabbitmq.reply-to", collector(replies), auto_ack=True)
    for number, question in enumerate((b"2+2", b"40+2", b"1+1+1")):
        properties = pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=str(number))
        client.basic_publish("", "rpc.add", question, properties)
        deadline = time.monotonic() + 5
        while len(replies) <= number:  # each side's I/O loop in turn: one thread plays both
            assert time.monotonic() < deadline, "no reply within 5 s"
            responder.process_data_events(time_limit=0.01)
            requester.process_data_events(time_limit=0.01)
    assert [(props.correlation_id, body) for _method, props, body in replies] == [
        ("0", b"4"),
        ("1", b"42"),
        ("2", b"3"),
    ]


def test_single_active_consumer_fails_over_in_order_when_its_connection_is_killed(
    pika_connect: Connect, broker: Any
) -> None:
    # Not from the fixture, which closes what it opened: this one's socket is cut under it.
    first = BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    second, publisher = pika_connect(), pika_connect()
    arguments = {"x-single-active-consumer": True}
    first_channel = first.channel()
    first_channel.queue_declare("ordered", arguments=arguments)
    first_channel.basic_qos(prefetch_count=5)
    held: list[Delivery] = []
    first_channel.basic_consume("ordered", collector(held))
    second_channel = second.channel()
    second_channel.basic_qos(prefetch_count=1000)
    taken: list[Delivery] = []
    second_channel.basic_consume("ordered", collector(taken), arguments={"x-priority": 1})
    sender = publisher.channel()
    sender.confirm_delivery()
    for number in range(50):
        sender.basic_publish("", "ordered", b"%d" % number)
    wait_for(first, lambda: len(held) == 5)
    first_channel.basic_ack(held[1][0].delivery_tag, multiple=True)  # 0 and 1 done
    wait_for(first, lambda: len(held) == 7)
    second.process_data_events(time_limit=0.2)
    assert taken == []  # it waits while the first is active
    first._impl._transport._sock.shutdown(socket.SHUT_RDWR)  # killed: no connection.close, nothing acked
    wait_for(second, lambda: len(taken) == 48, 10)
    assert [int(body) for _m, _p, body in taken] == list(range(2, 50))
    assert [method.redelivered for method, _p, _b in taken[:5]] == [True] * 5


def test_consumer_priorities_send_work_to_the_highest_until_its_prefetch_is_full(pika_connect: Connect) -> None:
    low_connection, high_connection, publisher = pika_connect(), pika_connect(), pika_connect()
    low, high = low_connection.channel(), high_connection.channel()
    low.queue_declare("prioritised")
    for channel in (low, high):
        channel.basic_qos(prefetch_count=3)
    low_got: list[Delivery] = []
    high_got: list[Delivery] = []
    low.basic_consume("prioritised", collector(low_got))
    high.basic_consume("prioritised", collector(high_got), arguments={"x-priority": 10})
    sender = publisher.channel()
    sender.confirm_delivery()
    for number in range(5):
        sender.basic_publish("", "prioritised", b"%d" % number)
    wait_for(high_connection, lambda: len(high_got) == 3)
    wait_for(low_connection, lambda: len(low_got) == 2)
    assert [body for _m, _p, body in high_got] == [b"0", b"1", b"2"]
    assert [body for _m, _p, body in low_got] == [b"3", b"4"]
    high.basic_ack(high_got[0][0].delivery_tag)
    high.queue_declare("prioritised", passive=True)  # a round trip: the ack is in before the publish
    sender.basic_publish("", "prioritised", b"5")
    wait_for(high_connection, lambda: len(high_got) == 4)
    assert high_got[-1][2] == b"5"

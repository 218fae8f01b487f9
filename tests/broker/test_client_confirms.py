"""The blocking client's bookkeeping of publisher confirms, as brokers send them (no socket)."""

from __future__ import annotations

from postroom.broker.clients.client import Connection


def bookkeeping() -> Connection:
    connection = Connection.__new__(Connection)  # the confirm state only: nothing is connected
    connection._confirmed, connection._settled, connection._nacked = 0, set(), set()
    return connection


def test_a_nack_after_a_later_ack_still_refuses_its_publish() -> None:
    # RabbitMQ sends a batch's acks before its nacks: ack 2, then nack 1 as a multiple one.
    connection = bookkeeping()
    connection._confirm(2, False, False)
    assert connection._confirmed == 0  # publish 1 is not settled yet
    connection._confirm(1, True, True)
    assert (connection._confirmed, connection._nacked, connection._settled) == (2, {1}, set())


def test_multiple_confirms_settle_only_what_is_unsettled() -> None:
    connection = bookkeeping()
    connection._confirm(3, True, False)
    connection._confirm(5, False, True)
    connection._confirm(6, True, False)  # covers 4 and 6, not the refused 5 again
    assert (connection._confirmed, connection._nacked) == (6, {5})
    connection._confirm(9, True, True)
    assert (connection._confirmed, connection._nacked) == (9, {5, 7, 8, 9})
    connection._confirm(4, False, True)  # stale: already settled
    assert connection._nacked == {5, 7, 8, 9}


def test_a_publish_with_only_its_delivery_mode_encodes_as_pamqp_would() -> None:
    from pamqp import commands

    from postroom.broker.clients.client import publish_frames

    for persistent in (True, False):
        fast = publish_frames("ex", "key", b"body" * 100, 131072, persistent=persistent)
        properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
        built = publish_frames("ex", "key", b"body" * 100, 131072, basic_properties=properties)
        assert fast == built
    assert publish_frames("", "q", b"", 4096) != publish_frames("", "q", b"", 4096, headers={"a": 1})

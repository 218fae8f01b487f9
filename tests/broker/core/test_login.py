"""Logins: expensive hashes checked through ``run_blocking``, unknown names at the same cost,
failures throttled per host, counted, and logged with their reason. Deterministic: a
``Clock`` and a ``run_blocking`` the test completes by hand."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pamqp import commands
from twisted.internet.task import Clock

import postroom.broker.core.users as users_module
from postroom.broker.core.login import FAILURE_WINDOW, FREE_FAILURES, PENALTY, LoginThrottle, decoy_hash
from postroom.broker.core.node import Node
from postroom.broker.core.users import User, hash_password
from postroom.broker.errors import ReplyCode
from postroom.broker.tools.testing import Client, encode, methods
from postroom.broker.wire.codec import PROTOCOL_HEADER

SCRYPT = hash_password("secret", b"0123456789abcdef", n=2**10)


class HeldChecks:
    """A ``run_blocking`` that keeps each check until the test lets it finish."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def __call__(self, fn: Callable[[], Any], callback: Callable[[Any], None]) -> None:
        self.held.append((fn, callback))

    def finish_all(self) -> None:
        held, self.held = self.held, []
        for fn, callback in held:
            callback(fn())


def scrypt_node() -> tuple[Node, HeldChecks, Clock]:
    clock = Clock()
    node = Node(users=[User("app", password_hash=SCRYPT), User("guest", "guest")], clock=clock)
    held = HeldChecks()
    node.run_blocking = held
    return node, held, clock


def start_ok(user: str, password: str) -> commands.Connection.StartOk:
    return commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN",
        response=f"\x00{user}\x00{password}",
    )


def test_a_scrypt_check_waits_for_run_blocking_and_what_the_client_sent_meanwhile_is_kept() -> None:
    node, held, _clock = scrypt_node()
    client = Client(node)
    client.send(PROTOCOL_HEADER)

    # A client that does not wait for tune: start-ok, tune-ok and open in one write.
    replies = client.send(
        encode(0, start_ok("app", "secret"))
        + encode(
            0,
            commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0),
            commands.Connection.Open(virtual_host="/"),
        )
    )
    assert replies == []
    assert len(held.held) == 1

    held.finish_all()
    assert [type(m) for m in methods(client.read())] == [commands.Connection.Tune, commands.Connection.OpenOk]
    assert client.connection.is_open
    assert client.connection.user_name == "app"
    assert client.connection in node.dirty  # the shell writes it out


def test_an_unknown_name_costs_a_scrypt_check_like_a_wrong_password() -> None:
    node, held, _clock = scrypt_node()
    for user in ("app", "nobody"):
        client = Client(node)
        client.send(PROTOCOL_HEADER)
        client.call(0, start_ok(user, "wrong"))
        assert len(held.held) == 1, user
        held.finish_all()
        close = methods(client.read())
        assert [(type(m), m.reply_code) for m in close] == [(commands.Connection.Close, ReplyCode.ACCESS_REFUSED)]
        assert (
            str(client.connection.error) == f"ACCESS_REFUSED - PLAIN login refused: user '{user}' - invalid credentials"
        )
    assert node.counters["auth_attempts"] == 2
    assert node.counters["auth_failures"] == 2


def test_cheap_passwords_are_checked_at_once() -> None:
    node, held, _clock = scrypt_node()
    client = Client(node)
    assert client.handshake("guest", "guest")
    assert client.connection.is_open
    assert held.held == []
    assert node.counters["auth_successes"] == 1


def test_the_decoy_has_the_cost_parameters_of_the_first_scrypt_user() -> None:
    decoy = decoy_hash([User("a", "clear"), User("b", password_hash=SCRYPT)])

    assert decoy is not None
    assert decoy.split("$")[:4] == SCRYPT.split("$")[:4]
    assert not User("", password_hash=decoy).check_password("secret")
    assert decoy_hash([User("a", "clear")]) is None


def test_refusals_over_the_free_failures_of_a_name_from_a_host_come_once_per_penalty() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock.seconds)
    assert [throttle.failed("10.0.0.1", "app") for _ in range(FREE_FAILURES)] == [0.0] * FREE_FAILURES

    assert [throttle.failed("10.0.0.1", "app") for _ in range(3)] == [0.0, PENALTY, 2 * PENALTY]
    assert throttle.failed("10.0.0.2", "app") == 0.0  # other hosts are not slowed
    assert throttle.failed("10.0.0.1", "guest") == 0.0  # nor other names from this one
    clock.advance(FAILURE_WINDOW + 1)
    assert throttle.failed("10.0.0.1", "app") == 0.0  # the window passed without failures


def test_a_name_first_failing_when_many_are_counted_is_counted_too() -> None:
    """Past 4,096 names and hosts counted, the quiet ones are forgotten as a new one comes:
    the new one's failures are kept."""
    clock = Clock()
    throttle = LoginThrottle(clock.seconds)
    for number in range(4096):
        throttle.failed(f"10.0.{number // 256}.{number % 256}", "app")
    clock.advance(FAILURE_WINDOW + 1)  # all of them quiet now
    delays = [throttle.failed("10.1.0.1", "app") for _ in range(FREE_FAILURES + 2)]
    assert delays[-2:] == [0.0, PENALTY]


def test_a_good_login_from_a_host_with_many_refused_ones_is_answered_at_once() -> None:
    """100 refused logins for guest from the test client's host (a client retrying a stale
    password): a correct login is answered without the clock moving; refusals wait their turn."""
    node, held, clock = scrypt_node()
    for _ in range(100):
        node.login_throttle.failed("", "guest")
    queued = (100 - FREE_FAILURES) * PENALTY  # when the next refusal is due
    good = [Client(node) for _ in range(3)]
    bad = [Client(node) for _ in range(3)]
    for client in good + bad:
        client.send(PROTOCOL_HEADER)
    answers = [methods(client.call(0, start_ok("guest", "guest"))) for client in good]
    assert [[type(m) for m in answer] for answer in answers] == [[commands.Connection.Tune]] * 3
    assert [methods(client.call(0, start_ok("guest", "wrong"))) for client in bad] == [[], [], []]
    clock.advance(queued)
    assert [[type(m) for m in methods(client.read())] for client in bad] == [[commands.Connection.Close], [], []]
    clock.advance(2 * PENALTY)
    assert [len(methods(client.read())) for client in bad] == [0, 1, 1]
    assert held.held == []


def test_a_connection_that_closed_while_its_login_was_checked_ignores_the_result() -> None:
    node, held, _clock = scrypt_node()
    client = Client(node)
    client.send(PROTOCOL_HEADER)
    client.call(0, start_ok("app", "secret"))
    client.connection.connection_lost()

    held.finish_all()

    assert client.read() == []
    assert client.connection.user_name == ""


def test_too_much_data_before_tune_closes_the_connection() -> None:
    node, held, _clock = scrypt_node()
    client = Client(node)
    client.send(PROTOCOL_HEADER)
    client.call(0, start_ok("app", "secret"))
    client.send(b"\x01" * (node.limits.frame_max + 100))

    assert client.connection.closed
    assert client.connection.silent_close_delay > 0


def test_scrypt_runs_off_the_reactor_thread(
    broker_reactor: Any, make_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    check = users_module._scrypt_matches

    def recording(stored: str, password: str) -> bool:
        threads.append(threading.current_thread())
        return check(stored, password)

    monkeypatch.setattr(users_module, "_scrypt_matches", recording)
    broker = make_broker(Node(users=[User("app", password_hash=SCRYPT)]))
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.port, credentials=pika.PlainCredentials("app", "secret"))
    )
    connection.close()

    assert len(threads) == 1
    assert threads[0] is not broker_reactor_thread(broker_reactor)


def broker_reactor_thread(reactor: Any) -> threading.Thread:
    from twisted.internet import threads as twisted_threads

    return twisted_threads.blockingCallFromThread(reactor, threading.current_thread)

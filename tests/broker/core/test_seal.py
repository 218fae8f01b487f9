"""Seals on dead letters: made once per copy, kept by the key's file, broken by any change."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pamqp import commands

from postroom.broker.core.dead_lettering import DeadLetterReason, dead_lettered, with_delivery_count
from postroom.broker.core.message import Message
from postroom.broker.core.seal import SEAL_HEADER, SEAL_KEY_FILE, Sealer

KEY = bytes(range(32))


def sealed_copy(sealer: Sealer | None = None, body: bytes = b"job", dead_letter_id: int = 7) -> Message:
    original = Message.build(
        "orders", "order.created", body, commands.Basic.Properties(headers={"tenant": "eu"}, message_id="m-1")
    )
    return dead_lettered(
        original, "work", DeadLetterReason.REJECTED, 1_700_000_000, "dlx", None, 2, dead_letter_id,
        sealer or Sealer(KEY), "/",
    )  # fmt: skip


def verify(message: Message, sealer: Sealer | None = None, vhost: str = "/", body: bytes | None = None) -> str | None:
    return (sealer or Sealer(KEY)).verify(
        vhost, message.header, message.lenient_headers(), message.body if body is None else body
    )


def test_a_dead_letter_with_an_id_is_sealed_for_the_queue_it_died_in() -> None:
    copy = sealed_copy()
    headers = copy.headers
    assert headers is not None
    assert isinstance(headers[SEAL_HEADER], str) and len(headers[SEAL_HEADER]) == 32
    assert list(headers) == sorted(headers)  # the table stays sorted, as RabbitMQ sorts it
    assert verify(copy) == "work"


def test_a_copy_without_an_id_or_a_sealer_is_not_sealed() -> None:
    original = Message.build("", "work", b"job")
    for dead_letter_id, sealer in ((0, Sealer(KEY)), (7, None)):
        copy = dead_lettered(original, "work", DeadLetterReason.EXPIRED, 0, "", "dlq", 0, dead_letter_id, sealer, "/")
        assert SEAL_HEADER not in (copy.headers or {})


def test_a_client_passing_the_message_on_unchanged_keeps_the_seal() -> None:
    copy = sealed_copy()
    properties = commands.Basic.Properties(headers=dict(copy.headers or {}), message_id="m-1")
    assert verify(Message.build("dlx", "order.created", copy.body, properties)) == "work"


@pytest.mark.parametrize(
    "change",
    ["body", "vhost", "key", "header entry", "property", "x-death queue"],
)
def test_any_change_breaks_the_seal(change: str) -> None:
    copy = sealed_copy()
    headers = dict(copy.headers or {})
    if change == "body":
        assert verify(copy, body=b"jab") is None
        return
    if change == "vhost":
        assert verify(copy, vhost="other") is None
        return
    if change == "key":
        assert verify(copy, Sealer(bytes(32))) is None
        return
    properties = commands.Basic.Properties(headers=headers, message_id="m-1")
    if change == "header entry":
        properties.headers = {**headers, "tenant": "us"}
    elif change == "property":
        properties.message_id = "m-2"
    else:
        deaths = [dict(death) for death in headers["x-death"]]
        deaths[0]["queue"] = "payroll"
        properties.headers = {**headers, "x-death": deaths}
    assert verify(Message.build("dlx", "order.created", copy.body, properties)) is None


def test_a_seal_copied_onto_another_message_does_not_hold() -> None:
    genuine, other = sealed_copy(body=b"one"), sealed_copy(body=b"two", dead_letter_id=8)
    assert verify(Message("", "q", b"\x00\x01q", genuine.header, other.body)) is None


def test_the_dead_letter_queues_own_redelivery_count_is_not_sealed() -> None:
    copy = sealed_copy()
    redelivered = Message(copy.exchange, copy.routing_key, copy.names, with_delivery_count(copy, 3), copy.body)
    assert (redelivered.headers or {})["x-delivery-count"] == 3
    assert verify(redelivered) == "work"


def test_dying_again_replaces_the_seal() -> None:
    copy = sealed_copy()
    again = dead_lettered(copy, "dlq", DeadLetterReason.EXPIRED, 1_700_000_100, "", "parking", 0, 9, Sealer(KEY), "/")
    raw = again.header
    assert raw.count(SEAL_HEADER.encode()) == 1
    assert verify(again) == "dlq"


def test_the_key_is_made_once_owner_only_and_kept(tmp_path: Path) -> None:
    first = Sealer.for_directory(str(tmp_path))
    path = tmp_path / SEAL_KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(path.read_bytes()) == 32
    copy = sealed_copy(first)
    assert verify(copy, Sealer.for_directory(str(tmp_path))) == "work"  # after a restart
    assert os.listdir(tmp_path) == [SEAL_KEY_FILE]


def test_a_key_file_that_holds_no_key_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / SEAL_KEY_FILE).write_bytes(b"short")
    with pytest.raises(OSError, match=f"{SEAL_KEY_FILE}: 5 bytes, not a seal key"):
        Sealer.for_directory(str(tmp_path))


def test_a_seal_that_is_not_hex_text_does_not_hold() -> None:
    copy = sealed_copy()
    headers = dict(copy.headers or {})
    for forged in ("z\u00e9" * 16, b"\xff" * 32, 7, None):
        headers[SEAL_HEADER] = forged
        assert Sealer(KEY).verify("/", copy.header, headers, copy.body) is None

"""The example plugins of ``docs/plugins.md``, loaded from the guide itself and used with pika."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.exceptions import ChannelClosedByBroker, ProbableAuthenticationError

from postroom.broker.server.pluginloader import PluginError, load_plugins
from postroom.config.loader import loads

pytestmark = [pytest.mark.integration, pytest.mark.interop]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def guide_modules() -> dict[str, str]:
    """The guide's Python blocks that start with ``# module: NAME``, by module name."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    return {match.group(1): block for block in blocks if (match := re.match(r"# module: (\w+)\n", block))}


@pytest.fixture
def guide_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The guide's modules written to a directory on ``sys.path``."""
    modules = guide_modules()
    assert set(modules) == {"postroom_tally", "postroom_tokens"}
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in modules:
        sys.modules.pop(name, None)


def connect(port: int, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host="127.0.0.1",
            port=port,
            credentials=pika.PlainCredentials(user, password),
            connection_attempts=1,
            socket_timeout=5,
            stack_timeout=5,
        )
    )


def test_the_tally_example_counts_events_and_refuses_large_bodies(guide_on_path: Path, plugin_broker: Any) -> None:
    config = loads("plugins:\n  - {name: postroom_tally, settings: {max_body: 1KiB}}\n", "broker.yaml")
    broker = plugin_broker(*config.plugins)
    tally = sys.modules["postroom_tally"].plugin.tally
    connection = connect(broker.port)
    try:
        channel = connection.channel()
        channel.exchange_declare("dlx", "fanout")
        channel.queue_declare("dead")
        channel.queue_bind("dead", "dlx")
        channel.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx"})
        channel.confirm_delivery()
        for body in (b"one", b"two"):
            channel.basic_publish("", "work", body)
        first = channel.basic_get("work")[0]
        channel.basic_ack(first.delivery_tag)
        second = channel.basic_get("work")[0]
        channel.basic_reject(second.delivery_tag, requeue=False)
        assert channel.basic_get("dead", auto_ack=True)[2] == b"two"
        with pytest.raises(ChannelClosedByBroker) as excinfo:
            channel.basic_publish("", "work", b"x" * 1025)
        assert excinfo.value.reply_code == 406
        assert excinfo.value.reply_text == "PRECONDITION_FAILED - body of 1025 bytes is over 1024"
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()
    counts = broker.call(lambda: dict(tally.counts))
    assert counts == {
        "published": 2,
        "delivered work": 2,
        "delivered dead": 1,
        "acked": 1,
        "dead-lettered rejected": 1,
    }


def test_the_tally_example_refuses_bad_settings(guide_on_path: Path) -> None:
    config = loads("plugins:\n  - {name: postroom_tally, settings: {max_body: big}}\n", "broker.yaml")
    with pytest.raises(PluginError) as excinfo:
        load_plugins(config.plugins, source=config.source)
    assert str(excinfo.value).splitlines()[1] == (
        "  broker.yaml:2: plugins[0]: plugin 'postroom_tally': invalid settings: "
        "max_body: must be a size such as 64KiB, not 'big'"
    )


def test_the_token_example_lets_its_users_in_and_no_one_else(guide_on_path: Path, plugin_broker: Any) -> None:
    config = loads("plugins:\n  - {name: postroom_tokens, settings: {tokens: {svc: s3cret}}}\n", "broker.yaml")
    broker = plugin_broker(*config.plugins)
    connection = connect(broker.port, "svc", "s3cret")
    assert connection.is_open
    connection.close()
    with pytest.raises(ProbableAuthenticationError):
        connect(broker.port, "svc", "wrong")
    guest = connect(broker.port)  # the configured users still come first
    guest.close()

"""A queue deeper than the memory budget, over real sockets: bodies go to disk and come back in order."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest
from pamqp import commands

from postroom.broker.storage.spool_files import SPOOL_DIR, SPOOL_WINDOW
from postroom.broker.tools.testing import publish_frames
from tests.integration.test_crash import broker
from tests.integration.test_frames import RawClient, handshake


@pytest.mark.parametrize("mode", [1, 2], ids=["transient", "persistent"])
def test_a_queue_of_several_budgets_is_consumed_in_order_with_every_body(tmp_path: Path, mode: int) -> None:
    data = tmp_path / "data"
    bodies = [b"%05d" % number + bytes([number % 256]) * 4000 for number in range(400)]  # 1.6 MB, 25 budgets
    with broker(data, memory_budget="64KiB") as (_process, port):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5))
        channel = connection.channel()
        channel.queue_declare("deep", durable=True)
        channel.confirm_delivery()
        for number, body in enumerate(bodies):
            properties = pika.BasicProperties(delivery_mode=mode, headers={"n": number})
            channel.basic_publish("", "deep", body, properties)
        log = tmp_path / "broker.log"
        for _ in range(100):  # until the pager has looked at the queue (it looks every 50 ms)
            if "paged to disk" in log.read_text():
                break
            connection.sleep(0.05)
        paged = sorted((data / "paging").glob("*.page"))
        channel.basic_qos(prefetch_count=50)
        received = []
        for method, properties, body in channel.consume("deep", inactivity_timeout=5):
            assert method is not None, f"only {len(received)} of {len(bodies)} came back"
            assert properties.headers == {"n": len(received)}
            received.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(received) == len(bodies):
                break
        channel.cancel()
        connection.close()
    assert received == bodies
    text = log.read_text()
    assert "paged to disk" in text and "Traceback" not in text
    # Transient bodies went to the paging store; persistent ones were already in the log.
    assert bool(paged) == (mode == 1)


@pytest.mark.parametrize("mode", [1, 2], ids=["transient", "persistent"])
def test_a_queue_past_its_window_is_spooled_and_comes_back_whole_after_a_kill(tmp_path: Path, mode: int) -> None:
    """Over the memory budget, messages beyond the window live as records on disk; persistent
    ones survive a SIGKILL."""
    data = tmp_path / "data"
    count = 3 * SPOOL_WINDOW
    bodies = [b"%06d" % number + bytes([number % 256]) * 30 for number in range(count)]
    with broker(data, memory_budget="1MiB") as (_process, port):  # the window alone takes 2 MiB
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
        channel = connection.channel()
        channel.queue_declare("deep", durable=True)
        channel.confirm_delivery()
        for number, body in enumerate(bodies):
            channel.basic_publish("", "deep", body, pika.BasicProperties(delivery_mode=mode, headers={"n": number}))
        spooled = list((data / SPOOL_DIR).rglob("*.spool"))
        assert spooled, "nothing was spooled"
        if mode == 1:
            received = _drain(channel, count)
        connection.close()
    if mode == 2:  # the broker was killed (the context ends with SIGKILL): start it again
        with broker(data, memory_budget="1MiB") as (_process, port):
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
            channel = connection.channel()
            assert channel.queue_declare("deep", durable=True).method.message_count == count
            received = _drain(channel, count)
            connection.close()
    assert received == bodies
    text = (tmp_path / "broker.log").read_text()
    assert "Traceback" not in text


def _drain(channel: pika.adapters.blocking_connection.BlockingChannel, count: int) -> list[bytes]:
    channel.basic_qos(prefetch_count=500)
    received: list[bytes] = []
    for method, properties, body in channel.consume("deep", inactivity_timeout=10):
        assert method is not None, f"only {len(received)} of {count} came back"
        assert properties.headers == {"n": len(received)}
        received.append(body)
        if len(received) % 100 == 0 or len(received) == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if len(received) == count:
            break
    channel.cancel()
    return received


def test_a_flood_into_one_queue_spools_before_the_memory_alarm(tmp_path: Path) -> None:
    """With a 150 MiB watermark the budget in force is 75 MiB (not the default 256 MiB): the queue
    spools past it, and publishers are never blocked by the memory alarm."""
    data = tmp_path / "data"
    count, size = 400_000, 200  # about 280 MiB in memory, were it all kept there
    with broker(data, limits="memory_high_watermark: 150MiB") as (process, port):
        client = handshake(RawClient(port, timeout=60))
        client.send(1, commands.Queue.Declare(queue="flood"), commands.Confirm.Select())
        client.expect(commands.Queue.DeclareOk, 1)
        client.expect(commands.Confirm.SelectOk, 1)
        frames = publish_frames(1, "", "flood", bytes(size))
        for _ in range(count // 10_000):
            client.send_raw(frames * 10_000)
        confirmed = 0
        while confirmed < count:
            _channel, method = client.read()
            assert isinstance(method, commands.Basic.Ack), method
            confirmed = method.delivery_tag
        client.send(1, commands.Queue.Declare(queue="flood", passive=True))
        assert client.expect(commands.Queue.DeclareOk, 1).message_count == count
        assert list((data / SPOOL_DIR).rglob("*.spool"))
        client.close()
    text = (tmp_path / "broker.log").read_text()
    assert "spool what arrives to disk" in text and "budget (78643200 bytes)" in text
    assert "memory alarm set" not in text and "Traceback" not in text


def test_a_stream_twice_the_memory_watermark_never_raises_the_memory_alarm(tmp_path: Path) -> None:
    """A stream's messages live in its segment files: publishing twice the watermark into one
    and reading it all back from ``first`` blocks no publisher and sets no memory alarm."""
    from postroom.broker.clients.client import connect

    data = tmp_path / "data"
    count, size = 300_000, 1024  # 300 MiB of bodies, the watermark 150 MiB
    with broker(data, limits="memory_high_watermark: 150MiB") as (_process, port):
        client = handshake(RawClient(port, timeout=60))
        client.send(
            1,
            commands.Queue.Declare(queue="events", durable=True, arguments={"x-queue-type": "stream"}),
            commands.Confirm.Select(),
        )
        client.expect(commands.Queue.DeclareOk, 1)
        client.expect(commands.Confirm.SelectOk, 1)
        frames = publish_frames(1, "", "events", bytes(size))
        confirmed = 0
        for sent in range(10_000, count + 1, 10_000):
            client.send_raw(frames * 10_000)
            while confirmed < sent - 20_000:  # at most 30,000 unconfirmed
                _channel, method = client.read()
                assert isinstance(method, commands.Basic.Ack), method  # never connection.blocked
                confirmed = method.delivery_tag
        while confirmed < count:
            _channel, method = client.read()
            assert isinstance(method, commands.Basic.Ack), method
            confirmed = method.delivery_tag
        client.close()
        read = 0
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/", reconnect=False, timeout=60) as connection:
            first = {"x-stream-offset": "first"}
            for message in connection.consume("events", prefetch=1000, timeout=30, arguments=first):
                assert len(message.body) == size
                message.ack()
                read += 1
                if read == count:
                    break
    assert read == count
    text = (tmp_path / "broker.log").read_text()
    assert "memory alarm set" not in text and "Traceback" not in text

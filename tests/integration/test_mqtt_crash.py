"""MQTT's durable state across SIGKILLs of a ``postroom serve`` process: a persistent session
keeps its subscription and every QoS 1 message the broker PUBACKed while its client was away,
and a retained message PUBACKed is still the topic's (or a later one is) after the restart."""

from __future__ import annotations

import random
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from postroom.broker.tools.testing import free_port
from tests.integration.test_crash import broker

pytestmark = [pytest.mark.integration, pytest.mark.hang_timeout(300)]


def client(port: int, client_id: str, clean: bool = True) -> tuple[mqtt.Client, list[tuple[int, bool]]]:
    """A connected paho client (MQTT 3.1.1) and what its CONNACKs said (code, session present)."""
    raw = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
    raw.reconnect_delay_set(60, 60)  # (a broker killed under it: no reconnects in the test's time)
    connacks: list[tuple[int, bool]] = []
    raw.on_connect = lambda _c, _u, flags, code, _p: connacks.append((code.value, flags.session_present))
    raw.connect("127.0.0.1", port, keepalive=60)
    raw.loop_start()
    deadline = time.monotonic() + 10
    while not connacks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connacks and connacks[0][0] == 0, connacks
    return raw, connacks


def publish_until_killed(
    port: int, start: int, confirmed: list[int], retained: list[int], stop: threading.Event
) -> None:
    """QoS 1 publishes to ``jobs/<n>`` (and every tenth, retained, to ``state``), one at a time;
    each PUBACKed is noted."""
    raw, _ = client(port, f"publisher-{start}")
    number = start
    try:
        while not stop.is_set():
            number += 1
            keep = number % 10 == 0
            info = raw.publish("state" if keep else f"jobs/{number}", b"%d" % number, 1, retain=keep)
            info.wait_for_publish(5)
            if not info.is_published():
                return
            (retained if keep else confirmed).append(number)
    except (RuntimeError, ValueError, OSError):
        return  # the broker was killed under the publisher
    finally:
        raw.loop_stop()


def test_a_persistent_sessions_acknowledged_messages_and_retained_ones_survive_sigkills(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    rng = random.Random(20261206)
    with broker(data, mqtt=port):
        keeper, _ = client(port, "keeper", clean=False)
        subscribed = threading.Event()
        keeper.on_subscribe = lambda *_a: subscribed.set()
        keeper.subscribe("jobs/#", 1)
        assert subscribed.wait(5)
        keeper.disconnect()
        keeper.loop_stop()
    confirmed: list[int] = []
    retained: list[int] = []
    for cycle in range(3):
        with broker(data, mqtt=port) as (process, _amqp):
            stop = threading.Event()
            arguments = (port, cycle * 1_000_000, confirmed, retained, stop)
            publisher = threading.Thread(target=publish_until_killed, args=arguments)
            publisher.start()
            time.sleep(rng.uniform(0.5, 1.0))
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            stop.set()
            publisher.join(15)
    assert len(confirmed) > 50 and retained
    with broker(data, mqtt=port):
        received: list[int] = []
        done = threading.Event()

        def on_message(_c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
            received.append(int(message.payload))
            if set(confirmed) <= set(received):
                done.set()

        keeper = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="keeper", clean_session=False)
        keeper.on_message = on_message
        present: list[bool] = []
        keeper.on_connect = lambda _c, _u, flags, _code, _p: present.append(flags.session_present)
        keeper.connect("127.0.0.1", port)
        keeper.loop_start()
        done.wait(30)
        keeper.disconnect()
        keeper.loop_stop()
        assert present == [True]
        assert set(confirmed) - set(received) == set()
        state: list[bytes] = []
        watcher, _ = client(port, "watcher")
        watcher.on_message = lambda _c, _u, message: state.append(message.payload)
        watcher.subscribe("state", 1)
        deadline = time.monotonic() + 5
        while not state and time.monotonic() < deadline:
            time.sleep(0.02)
        watcher.disconnect()
        watcher.loop_stop()
        assert state and int(state[0]) >= retained[-1]
    print(f"confirmed {len(confirmed)}, received {len(received)}, retained {len(retained)}")


def test_a_qos2_publish_sent_again_after_a_sigkill_is_routed_once(tmp_path: Path) -> None:
    """A QoS 2 publish answered with PUBREC, then the broker killed: the client sends it
    again (DUP, same packet id) to the restarted broker, which answers PUBREC without routing
    it again, and PUBCOMP to its PUBREL [MQTT-4.3.3-2]. One copy reaches the queue."""
    import pika

    from postroom.broker.tools.fuzzing import mqtt_connect, mqtt_packet, mqtt_string

    data, port = tmp_path / "data", free_port()
    publish = mqtt_packet(0x34, mqtt_string("orders/7") + struct.pack(">H", 7) + b"once")
    with broker(data, mqtt=port) as (process, amqp_port):
        amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        channel = amqp.channel()
        channel.queue_declare("orders", durable=True)
        channel.queue_bind("orders", "amq.topic", "orders.#")
        amqp.close()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(mqtt_connect("devices-7", clean=False))
            assert read_exactly(sock, 4) == b"\x20\x02\x00\x00"
            sock.sendall(publish)
            assert read_exactly(sock, 4) == b"\x50\x02\x00\x07"  # PUBREC
            process.send_signal(signal.SIGKILL)
            process.wait(10)
    with broker(data, mqtt=port) as (_process, amqp_port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(mqtt_connect("devices-7", clean=False))
            assert read_exactly(sock, 4)[:2] == b"\x20\x02"
            sock.sendall(bytes([publish[0] | 0x08]) + publish[1:])  # DUP
            assert read_exactly(sock, 4) == b"\x50\x02\x00\x07"  # PUBREC again
            sock.sendall(b"\x62\x02\x00\x07")  # PUBREL
            assert read_exactly(sock, 4) == b"\x70\x02\x00\x07"  # PUBCOMP
        amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        declared = amqp.channel().queue_declare("orders", durable=True, passive=True)
        amqp.close()
    assert declared.method.message_count == 1


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data

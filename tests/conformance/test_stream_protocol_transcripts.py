"""RabbitMQ's stream protocol (port 5552), frame for frame against RabbitMQ 3.10.8 with its
``rabbitmq_stream`` plugin: the handshake and its refusals, ``create``, ``delete``,
``metadata``, ``close`` both ways, and what ends a connection before it is open.

Each scenario sends the same frames to both brokers, one at a time, and records every frame
that comes back (decoded to its fields) and whether the socket was closed. What differs by
nature is normalised before the comparison: the server's peer properties (product, version
...; both must answer with the same keys). Both advertise the same host and port
(``stream.advertised_host`` and ``stream.advertised_port``), which ``open`` and ``metadata``
answer with.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from transcript import oracle

from postroom.broker.tools.fuzzing import sub_entry_batch
from postroom.broker.tools.testing import free_port, wait_for_port
from postroom.broker.wire import streamframes as wire
from tests.integration.test_crash import broker

pytestmark = pytest.mark.integration

#: Seconds without a byte after which an answer is taken as whole.
SETTLE = 0.2

#: The host and port both brokers advertise (neither listens there: behind a port mapping).
ADVERTISED = ("streams.example.com", 15552)

#: The keys both brokers' peer properties have.
SERVER_PROPERTIES = ["cluster_name", "copyright", "information", "platform", "product", "version"]


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """``(postroom, rabbitmq)``: the stream ports of a Postroom process and of a RabbitMQ node."""
    rabbit_stream, stream = free_port(), free_port()
    config = (
        f"stream.listeners.tcp.1 = 127.0.0.1:{rabbit_stream}\n"
        f"stream.advertised_host = {ADVERTISED[0]}\nstream.advertised_port = {ADVERTISED[1]}\n"
    )
    directory = tmp_path_factory.mktemp("stream-protocol")
    extra = f"stream: {{advertised_host: {ADVERTISED[0]}, advertised_port: {ADVERTISED[1]}}}\n"
    with (
        oracle(config, ["rabbitmq_stream"], also=[rabbit_stream]),
        broker(directory / "data", stream=stream, extra=extra),
    ):
        wait_for_port(stream, 30)
        yield stream, rabbit_stream
    assert "Traceback" not in (directory / "broker.log").read_text()


class Peer:
    """A blocking stream-protocol client that records what it gets."""

    def __init__(self, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.reader = wire.FrameReader()
        self.log: list[Any] = []
        self.correlation = 0

    def send(self, key: int, body: bytes, correlated: bool = True) -> None:
        if correlated:
            self.correlation += 1
            body = struct.pack(">I", self.correlation) + body
        self.write(wire.frame(key, body))

    def write(self, data: bytes) -> None:
        """Send ``data``; a socket the server closed already is recorded as closed."""
        try:
            self.socket.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            if self.log[-1:] != ["closed"]:
                self.log.append("closed")

    def read(self, wait: float = 2.0) -> None:
        """Record the frames that arrive within ``wait`` seconds, or the socket's end."""
        self.socket.settimeout(wait)
        frames: list[bytes] = []
        try:
            while not frames:
                data = self.socket.recv(65536)
                if not data:
                    self.log.append("closed")
                    return
                frames = self.reader.feed(data)
        except TimeoutError:
            self.log.append("nothing")
            return
        except ConnectionResetError:
            self.log.append("closed")
            return
        # What follows at once belongs to the same answer (a broker may write it apart).
        self.socket.settimeout(SETTLE)
        closed = True
        try:
            while data := self.socket.recv(65536):
                frames += self.reader.feed(data)
        except TimeoutError:
            closed = False
        except ConnectionResetError:
            pass
        self.log += [decoded(frame) for frame in frames]
        if closed:
            self.log.append("closed")

    def close(self) -> None:
        self.socket.close()


def decoded(frame: bytes) -> Any:
    """A frame from a server as comparable fields (what differs by nature normalised)."""
    key, version = struct.unpack_from(">HH", frame)
    body = frame[4:]
    command = key & ~wire.RESPONSE
    if key == wire.PEER_PROPERTIES | wire.RESPONSE:
        correlation, code = struct.unpack_from(">IH", body)
        return ("peer_properties", correlation, code, sorted(strings_map(body[6:])))
    if key == wire.OPEN | wire.RESPONSE:
        correlation, code = struct.unpack_from(">IH", body)
        if len(body) > 6:
            return ("open", correlation, code, sorted(strings_map(body[6:]).items()))
        return ("open", correlation, code)
    if key == wire.SASL_HANDSHAKE | wire.RESPONSE:
        correlation, code = struct.unpack_from(">IH", body)
        return ("sasl_handshake", correlation, code, strings_list(body[6:]))
    if key == wire.METADATA | wire.RESPONSE:
        return ("metadata", *metadata(body))
    if key == wire.DELIVER:
        # The chunk's head but its timestamp (each broker's clock), then its entries.
        subscription, magic, kind, entries, records, _time, epoch, first, crc, size, trailer = struct.unpack_from(
            ">BBBHIqQQIII", body
        )
        data = body[struct.calcsize(">BBBHIqQQIIII") :]
        return ("deliver", subscription, magic, kind, entries, records, epoch, first, crc, size, trailer, data.hex())
    return (key, version, command, body.hex())


def strings_map(body: bytes) -> dict[str, str]:
    (count,) = struct.unpack_from(">I", body)
    at, found = 4, {}
    for _ in range(count):
        key, at = read_string(body, at)
        value, at = read_string(body, at)
        found[key] = value
    return found


def strings_list(body: bytes) -> list[str]:
    (count,) = struct.unpack_from(">I", body)
    at, found = 4, []
    for _ in range(count):
        value, at = read_string(body, at)
        found.append(value)
    return found


def read_string(body: bytes, at: int) -> tuple[str, int]:
    (size,) = struct.unpack_from(">h", body, at)
    return body[at + 2 : at + 2 + size].decode(), at + 2 + size


def metadata(body: bytes) -> tuple[Any, ...]:
    """Correlation id, brokers (reference, host, port), and per stream its name, code, leader
    and replicas."""
    correlation, count = struct.unpack_from(">II", body)
    at, brokers = 8, []
    for _ in range(count):
        (reference,) = struct.unpack_from(">H", body, at)
        host, at = read_string(body, at + 2)
        brokers.append((reference, host, struct.unpack_from(">I", body, at)[0]))
        at += 4
    (count,) = struct.unpack_from(">I", body, at)
    at += 4
    streams = []
    for _ in range(count):
        name, at = read_string(body, at)
        code, leader, replicas = struct.unpack_from(">HHI", body, at)
        at += 8 + 2 * replicas
        streams.append((name, code, leader, replicas))
    return correlation, brokers, streams


def s(value: str) -> bytes:
    return wire.string(value)


def handshake(peer: Peer, user: str = "guest", password: str = "guest", vhost: str = "/") -> None:
    peer.send(wire.PEER_PROPERTIES, wire.string_map({"product": "transcript"}))
    peer.read()
    peer.send(wire.SASL_HANDSHAKE, b"")
    peer.read()
    response = f"\0{user}\0{password}".encode()
    peer.send(wire.SASL_AUTHENTICATE, s("PLAIN") + struct.pack(">I", len(response)) + response)
    peer.read()
    if peer.log[-1] in ("closed", "nothing"):
        return
    if peer.log[-1][0] != wire.TUNE:
        peer.read()  # the server's tune (RabbitMQ writes it on its own)
    peer.write(wire.frame(wire.TUNE | wire.RESPONSE, struct.pack(">II", 1048576, 60)))
    peer.send(wire.OPEN, s(vhost))
    peer.read()


def compare(ports: tuple[int, int], scenario: Callable[[Peer], None]) -> list[Any]:
    """Run ``scenario`` against both brokers; their logs must be equal. Returns Postroom's."""
    logs = []
    for port in ports:
        peer = Peer(port)
        try:
            scenario(peer)
        finally:
            peer.close()
        logs.append(peer.log)
    assert logs[0] == logs[1], "\n".join(f"{a!r:80} | {b!r}" for a, b in zip(*logs, strict=False))
    return logs[0]


def test_the_handshake_creates_describes_and_deletes_streams_as_rabbitmq(ports: tuple[int, int]) -> None:
    def scenario(peer: Peer) -> None:
        handshake(peer)
        for name, arguments in [
            ("sp-a", {}),
            ("sp-a", {}),  # again: "stream already exists"
            ("sp-a", {"max-age": "2h"}),  # again, other arguments: "precondition failed"
            ("sp-b", {"max-length-bytes": "1000000", "max-age": "1h", "something-else": "x"}),
            ("amq.sp", {}),  # reserved
            ("", {}),
            ("sp-c", {"initial-cluster-size": "0"}),  # not valid
        ]:
            peer.send(wire.CREATE_STREAM, s(name) + wire.string_map(arguments))
            peer.read()
        peer.send(wire.METADATA, wire.strings(["sp-a", "missing", "sp-b", "sp-a"]))
        peer.read()
        peer.send(wire.METADATA, wire.strings(["missing"]))
        peer.read()
        for name in ("sp-a", "sp-a", "missing", "sp-b"):
            peer.send(wire.DELETE_STREAM, s(name))
            peer.read()
        peer.send(wire.HEARTBEAT, b"", correlated=False)
        peer.read(0.5)
        peer.send(wire.CLOSE, struct.pack(">H", 1) + s("done"))
        peer.read()

    log = compare(ports, scenario)
    assert log[0][2] == wire.OK and log[0][3] == SERVER_PROPERTIES
    host, port = ADVERTISED
    assert ("open", 4, wire.OK, [("advertised_host", host), ("advertised_port", str(port))]) in log
    assert [entry[2] for entry in log if entry[0] == "metadata"] == [[(0, host, port)], []]


@pytest.mark.parametrize(
    "case",
    ["wrong password", "unknown user", "unknown mechanism", "unknown vhost", "heartbeat first", "sasl first"],
)
def test_what_ends_a_connection_before_it_is_open_as_rabbitmq(ports: tuple[int, int], case: str) -> None:
    def scenario(peer: Peer) -> None:
        if case == "wrong password":
            handshake(peer, password="wrong")
        elif case == "unknown user":
            handshake(peer, user="nobody")
        elif case == "unknown vhost":
            handshake(peer, vhost="nowhere")
        elif case == "unknown mechanism":
            peer.send(wire.PEER_PROPERTIES, wire.string_map({}))
            peer.read()
            peer.send(wire.SASL_AUTHENTICATE, s("CRAM") + struct.pack(">i", -1))
            peer.read()
        elif case == "heartbeat first":
            peer.send(wire.HEARTBEAT, b"", correlated=False)
        elif case == "sasl first":
            peer.send(wire.SASL_HANDSHAKE, b"")
            peer.read()
        peer.read()

    assert compare(ports, scenario)[-1] == "closed"


@pytest.mark.parametrize(
    ("arguments", "outcome"),
    [
        ({"max-age": "true"}, "closed"),
        ({"max-age": ""}, "closed"),
        ({"max-age": "-1h"}, "closed"),
        ({"max-length-bytes": "x"}, "closed"),
        ({"stream-max-segment-size-bytes": "0"}, "created"),
        ({"stream-max-segment-size-bytes": "x"}, "closed"),
        ({"initial-cluster-size": "x"}, "closed"),
        ({"queue-leader-locator": "anywhere"}, "refused"),
        ({"queue-leader-locator": "balanced"}, "created"),
    ],
    ids=lambda value: ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value,
)
def test_create_with_an_argument_value_that_does_not_hold_as_rabbitmq(
    ports: tuple[int, int], arguments: dict[str, str], outcome: str
) -> None:
    """(A ``max-length-bytes`` below 0 is the one value answered otherwise: see the docs'
    differences.)"""
    name = "sp-bad-" + "-".join(arguments)

    def scenario(peer: Peer) -> None:
        handshake(peer)
        peer.send(wire.CREATE_STREAM, s(name) + wire.string_map(arguments))
        peer.read()
        peer.send(wire.METADATA, wire.strings([name]))
        peer.read()
        peer.send(wire.DELETE_STREAM, s(name))
        peer.read()

    answer = compare(ports, scenario)[5]
    code = {"closed": None, "created": wire.OK, "refused": wire.PRECONDITION_FAILED}[outcome]
    assert answer == "closed" if code is None else answer[3] == f"00000005{code:04x}"


def test_an_unknown_command_once_open_is_answered_with_close_13_as_rabbitmq(ports: tuple[int, int]) -> None:
    def scenario(peer: Peer) -> None:
        handshake(peer)
        peer.send(wire.PEER_PROPERTIES, wire.string_map({}))  # (a handshake command, once open)
        peer.read()
        peer.write(wire.frame(wire.CLOSE | wire.RESPONSE, struct.pack(">IH", 1, wire.OK)))
        peer.read()

    log = compare(ports, scenario)
    assert log[-1] == "closed"


def test_publishers_subscriptions_and_offsets_are_refused_as_on_rabbitmq(ports: tuple[int, int]) -> None:
    def scenario(peer: Peer) -> None:
        handshake(peer)
        peer.send(wire.CREATE_STREAM, s("sp-p") + wire.string_map({}))
        peer.read()
        for publisher, reference, stream in [
            (1, "", "missing"),  # stream does not exist
            (1, "ref-1", "sp-p"),
            (1, "ref-2", "sp-p"),  # the id is taken
            (2, "ref-1", "sp-p"),  # the reference is taken
            (3, "x" * 300, "sp-p"),  # too long
        ]:
            peer.send(wire.DECLARE_PUBLISHER, bytes((publisher,)) + s(reference) + s(stream))
            peer.read()
        for reference, stream in [("ref-1", "sp-p"), ("nobody", "sp-p"), ("ref-1", "missing")]:
            peer.send(wire.QUERY_PUBLISHER_SEQUENCE, s(reference) + s(stream))
            peer.read()
        # A publish of an unknown publisher: a publish_error per message.
        message = b"\x00\x53\x75\xa0\x01x"
        entry = struct.pack(">QI", 7, len(message)) + message
        peer.write(wire.frame(wire.PUBLISH, bytes((9,)) + struct.pack(">I", 1) + entry))
        peer.read()
        for subscription, stream in [(1, "missing"), (1, "sp-p"), (1, "sp-p")]:
            peer.send(wire.SUBSCRIBE, bytes((subscription,)) + s(stream) + struct.pack(">hH", wire.OFFSET_NEXT, 10))
            peer.read()
        peer.write(wire.frame(wire.CREDIT, bytes((5,)) + struct.pack(">h", 1)))  # unknown subscription
        peer.read()
        for reference, stream in [("nobody", "sp-p"), ("r", "missing")]:
            peer.send(wire.QUERY_OFFSET, s(reference) + s(stream))
            peer.read()
        for subscription in (1, 1):
            peer.send(wire.UNSUBSCRIBE, bytes((subscription,)))
            peer.read()
        for publisher in (1, 1):
            peer.send(wire.DELETE_PUBLISHER, bytes((publisher,)))
            peer.read()
        peer.send(wire.DELETE_STREAM, s("sp-p"))
        peer.read()

    log = compare(ports, scenario)
    assert (wire.QUERY_OFFSET | wire.RESPONSE, 1, wire.QUERY_OFFSET, "00000011" + "0013" + "00" * 8) in log


def test_sub_entry_batches_are_stored_and_delivered_as_rabbitmq(ports: tuple[int, int]) -> None:
    """A publish of a simple entry, an uncompressed sub-entry batch and a gzipped one (its
    reserved bits set): confirmed by their publishing ids, then delivered as one chunk of three
    entries and six messages, the reserved bits cleared."""
    plain = sub_entry_batch([b"\x00Su\xa0\x01b", b"\x00Su\xa0\x02cc"])
    gzipped = sub_entry_batch([b"\x00Su\xa0\x01d", b"\x00Su\xa0\x01e", b"\x00Su\xa0\x01f"], 1)
    single = b"\x00Su\xa0\x01a"
    messages = [
        struct.pack(">QI", 1, len(single)) + single,
        struct.pack(">Q", 2) + plain,
        struct.pack(">Q", 3) + bytes((gzipped[0] | 0x0F,)) + gzipped[1:],
    ]

    def scenario(peer: Peer) -> None:
        handshake(peer)
        peer.send(wire.CREATE_STREAM, s("sp-batches") + wire.string_map({}))
        peer.read()
        peer.send(wire.DECLARE_PUBLISHER, bytes((1,)) + s("") + s("sp-batches"))
        peer.read()
        peer.write(wire.frame(wire.PUBLISH, bytes((1,)) + struct.pack(">I", len(messages)) + b"".join(messages)))
        peer.read()
        peer.send(wire.SUBSCRIBE, bytes((1,)) + s("sp-batches") + struct.pack(">hH", wire.OFFSET_FIRST, 10))
        peer.read()
        if len(peer.log) and peer.log[-1][0] != "deliver":
            peer.read()
        peer.send(wire.DELETE_STREAM, s("sp-batches"))
        peer.read()

    log = compare(ports, scenario)
    (deliver,) = [entry for entry in log if entry[0] == "deliver"]
    assert deliver[4:6] == (3, 6) and bytes.fromhex(deliver[-1]).endswith(gzipped)


def entry(publishing_id: int, body: bytes) -> bytes:
    """A message of a ``publish`` frame: its id, size, and an AMQP 1.0 data section of ``body``."""
    message = b"\x00Su\xa0" + bytes((len(body),)) + body
    return struct.pack(">QI", publishing_id, len(message)) + message


def publish_frame(publisher: int, messages: list[bytes]) -> bytes:
    return wire.frame(wire.PUBLISH, bytes((publisher,)) + struct.pack(">I", len(messages)) + b"".join(messages))


def drain(peer: Peer, until: Callable[[list[Any]], bool], seconds: float = 30.0) -> None:
    """Read until ``until(peer.log)`` holds (or ``seconds`` pass: the comparison then shows it)."""
    deadline = time.monotonic() + seconds
    while not until(peer.log) and time.monotonic() < deadline:
        peer.read(1.0)


def delivered_messages(log: list[Any], subscription: int) -> int:
    return sum(entry[5] for entry in log if entry[0] == "deliver" and entry[1] == subscription)


def test_a_burst_is_stored_in_chunks_that_start_small_and_never_pass_the_cap_as_rabbitmq(
    ports: tuple[int, int],
) -> None:
    """A frame of 4,999 messages goes into chunks of at most 32 entries first, growing (RabbitMQ's
    writer's batches); ``last`` is the last of them. Then 200,000 messages of 10 B sent as fast
    as frames go reach a reader from ``first`` whole, in chunks of at most 8,192 entries."""
    results = []
    for port in ports:
        peer = Peer(port)
        try:
            handshake(peer)
            peer.send(wire.CREATE_STREAM, s("sp-burst") + wire.string_map({}))
            peer.read()
            peer.send(wire.DECLARE_PUBLISHER, bytes((1,)) + s("") + s("sp-burst"))
            peer.read()
            peer.write(publish_frame(1, [entry(n, b"b%d" % n) for n in range(4999)]))
            drain(peer, lambda log: confirmed(log) >= 4999)
            for subscription, offset in ((1, wire.OFFSET_FIRST), (2, wire.OFFSET_LAST)):
                peer.send(wire.SUBSCRIBE, bytes((subscription,)) + s("sp-burst") + struct.pack(">hH", offset, 1000))
                drain(peer, lambda log, n=subscription: delivered_messages(log, n) > 0)
            drain(peer, lambda log: delivered_messages(log, 1) >= 4999, 5)
            chunks = [e for e in peer.log if e[0] == "deliver" and e[1] == 1]
            (last,) = [e for e in peer.log if e[0] == "deliver" and e[1] == 2]
            data = b"".join(bytes.fromhex(e[-1]) for e in chunks)
            assert data == b"".join(entry(n, b"b%d" % n)[8:] for n in range(4999))
            assert last[2:] == chunks[-1][2:] and chunks[0][4] <= 32 and max(e[4] for e in chunks) <= 8192
            # 200,000 more, as fast as frames go, read from the first.
            # (credit for every chunk there can be: 200,000 messages in chunks of 32 at the fewest)
            peer.send(wire.SUBSCRIBE, bytes((3,)) + s("sp-burst") + struct.pack(">hH", wire.OFFSET_FIRST, 65535))
            for start in range(0, 200_000, 1000):
                peer.write(publish_frame(1, [entry(n, b"0123456789") for n in range(start, start + 1000)]))
            drain(peer, lambda log: delivered_messages(log, 3) >= 204_999, 60)
            sizes = [e[4] for e in peer.log if e[0] == "deliver" and e[1] == 3]
            results.append((len(data), last[5] < 4999, sum(sizes), max(sizes) <= 8192))
            peer.send(wire.DELETE_STREAM, s("sp-burst"))
            peer.read()
        finally:
            peer.close()
    assert results[0] == results[1] == (results[0][0], True, 204_999, True)


def test_publishing_ids_repeated_within_a_frame_are_stored_once_as_rabbitmq(ports: tuple[int, int]) -> None:
    """A named publisher's ids 1, 2, 3, 1, 2, 3 in one frame: three stored, all six confirmed,
    its sequence 3; then 2, 4, 3, 5 in the next: 4 and 5 stored."""

    def scenario(peer: Peer) -> None:
        handshake(peer)
        peer.send(wire.CREATE_STREAM, s("sp-dedup") + wire.string_map({}))
        peer.read()
        peer.send(wire.DECLARE_PUBLISHER, bytes((1,)) + s("my-publisher-ref") + s("sp-dedup"))
        peer.read()
        for ids in ([1, 2, 3, 1, 2, 3], [2, 4, 3, 5]):
            peer.write(publish_frame(1, [entry(n, b"m%d" % n) for n in ids]))
            sent = len(ids)
            drain(peer, lambda log, n=sent: confirmed(log) >= n, 5)
            confirms = [e for e in peer.log if e[0] == wire.PUBLISH_CONFIRM]
            # (RabbitMQ confirms the repeats in a frame of their own: the ids, in any grouping)
            peer.log = [e for e in peer.log if e[0] != wire.PUBLISH_CONFIRM]
            peer.log.append(("confirmed", sorted(confirmed_ids(confirms))))
            peer.send(wire.QUERY_PUBLISHER_SEQUENCE, s("my-publisher-ref") + s("sp-dedup"))
            peer.read()
        peer.send(wire.SUBSCRIBE, bytes((1,)) + s("sp-dedup") + struct.pack(">hH", wire.OFFSET_FIRST, 10))
        drain(peer, lambda log: delivered_messages(log, 1) >= 5, 5)
        peer.send(wire.DELETE_STREAM, s("sp-dedup"))
        peer.read()

    log = compare(ports, scenario)
    # (each chunk's trailer: the publisher's reference and its last id, 26 bytes, not sent)
    assert [(e[5], e[10]) for e in log if e[0] == "deliver"] == [(3, 26), (2, 26)]


def confirmed_ids(frames: list[Any]) -> list[int]:
    """The publishing ids ``publish_confirm`` frames (decoded) confirm."""
    ids = []
    for frame in frames:
        body = bytes.fromhex(frame[3])
        (count,) = struct.unpack_from(">I", body, 1)
        ids += struct.unpack_from(f">{count}Q", body, 5)
    return ids


def confirmed(log: list[Any]) -> int:
    return len(confirmed_ids([e for e in log if e[0] == wire.PUBLISH_CONFIRM]))

"""WebSocket's opening handshake and frames (RFC 6455), as the MQTT-over-WebSockets listener
reads and writes them: the RFC's own examples, and what a client may not send."""

from __future__ import annotations

import struct

import pytest

from postroom.broker.wire import websocket as ws

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # section 1.3's example


def request(path: str = "/ws", protocols: str = "mqtt", version: str = "13", key: str = KEY) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: {version}\r\nSec-WebSocket-Protocol: {protocols}\r\n\r\n"
    ).encode()


def masked(opcode: int, payload: bytes, fin: bool = True, mask: bytes = b"\x37\xfa\x21\x3d") -> bytes:
    length = len(payload)
    if length < 126:
        head = struct.pack(">BB", fin << 7 | opcode, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack(">BBH", fin << 7 | opcode, 0x80 | 126, length)
    else:
        head = struct.pack(">BBQ", fin << 7 | opcode, 0x80 | 127, length)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_the_accept_key_of_the_rfcs_example() -> None:
    assert ws.accept_key(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_an_opening_request_is_read_once_whole() -> None:
    data = request(protocols="mqttv3.1, mqtt") + b"\x82"
    assert ws.read_handshake(data[:40]) is None
    found = ws.read_handshake(data)
    assert found == ws.Request("/ws", KEY, ("mqttv3.1", "mqtt"), b"\x82")
    answer = ws.handshake_answer(found, "mqtt").decode()
    assert answer.startswith("HTTP/1.1 101 ") and "Sec-WebSocket-Protocol: mqtt\r\n" in answer
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in answer


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (request(version="8"), "426 Upgrade Required"),
        (request(key="short"), "400 Bad Request"),
        (b"POST /ws HTTP/1.1\r\n\r\n", "400 Bad Request"),
        (request().replace(b"Upgrade: websocket", b"Upgrade: h2c"), "426 Upgrade Required"),
        (b"GET /ws HTTP/1.1\r\n" + b"X: y\r\n" * 3000, "431 Request Header Fields Too Large"),
    ],
)
def test_requests_that_are_not_websocket_upgrades_are_refused(data: bytes, status: str) -> None:
    with pytest.raises(ws.HandshakeError) as refused:
        ws.read_handshake(data)
    assert refused.value.status == status


def test_frames_of_every_length_are_unmasked_in_pieces() -> None:
    reader = ws.FrameReader(1 << 20)
    payloads = [b"", b"x" * 125, b"y" * 126, b"z" * 70_000]
    stream = b"".join(masked(ws.BINARY, payload) for payload in payloads) + masked(ws.PING, b"hi")
    found = []
    for at in range(0, len(stream), 777):
        found += reader.feed(stream[at : at + 777])
    assert found == [*((ws.BINARY, True, p) for p in payloads), (ws.PING, True, b"hi")]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x82\x02ab", ws.PROTOCOL_ERROR),  # not masked
        (masked(ws.BINARY, b"x")[:1].replace(b"\x82", b"\xc2") + masked(ws.BINARY, b"x")[1:], ws.PROTOCOL_ERROR),
        (masked(ws.PING, b"p" * 126), ws.PROTOCOL_ERROR),  # a control frame over 125 bytes
        (masked(ws.CLOSE, b"", fin=False), ws.PROTOCOL_ERROR),  # a fragmented control frame
        (masked(ws.BINARY, b"b" * 2000), ws.TOO_BIG),
    ],
    ids=["not masked", "a reserved bit", "a long control frame", "a fragmented control frame", "too big"],
)
def test_frames_a_client_may_not_send_end_it_with_their_close_code(data: bytes, code: int) -> None:
    with pytest.raises(ws.WebSocketError) as error:
        ws.FrameReader(1024).feed(data)
    assert error.value.code == code


def test_a_servers_frames_are_final_and_unmasked() -> None:
    assert ws.frame(ws.BINARY, b"abc") == b"\x82\x03abc"
    assert ws.frame(ws.BINARY, b"a" * 300)[:4] == b"\x82\x7e\x01\x2c"
    assert ws.frame(ws.BINARY, b"a" * 70_000)[:10] == b"\x82\x7f" + struct.pack(">Q", 70_000)
    assert ws.close_frame(1000) == b"\x88\x02\x03\xe8"

"""WebSocket (RFC 6455), the server's side, as far as MQTT over WebSockets needs it (MQTT
3.1.1 section 6): the opening handshake read and answered, and frames read and written.

:func:`read_handshake` reads the client's HTTP upgrade request once it is whole;
:func:`handshake_answer` is the 101 that accepts it. :class:`FrameReader` cuts the client's
frames out of the byte stream (each must be masked, section 5.1) and unmasks them;
:func:`frame` writes a server's frame (never masked). A violation raises
:class:`WebSocketError` with the close code section 7.4.1 gives it.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

#: Opcodes (section 5.2).
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: Close codes (section 7.4.1).
NORMAL, PROTOCOL_ERROR, UNSUPPORTED_DATA, TOO_BIG = 1000, 1002, 1003, 1009

#: The GUID a server's accept key is made with (section 1.3).
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: The longest opening request read.
MAX_HANDSHAKE = 16 * 1024


class WebSocketError(ValueError):
    """The client broke the protocol: close with :attr:`code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class HandshakeError(ValueError):
    """The opening request is not one this server takes: answer it with :attr:`status`."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    """A client's opening handshake: its path, its key and the subprotocols it offers."""

    path: str
    key: str
    protocols: tuple[str, ...]
    #: The bytes that followed the request (the first frames), if any.
    rest: bytes


def read_handshake(data: bytes) -> Request | None:
    """The opening request in ``data``, or ``None`` while it is not whole.

    :raises HandshakeError: it is too long, or not a WebSocket upgrade of version 13
    """
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HANDSHAKE:
            raise HandshakeError("431 Request Header Fields Too Large", "an opening request over 16 KiB")
        return None
    lines = data[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] != "GET" or not parts[2].startswith("HTTP/1."):
        raise HandshakeError("400 Bad Request", f"not a GET request: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if "websocket" not in headers.get("upgrade", "").lower():
        raise HandshakeError("426 Upgrade Required", "not a WebSocket upgrade")
    if headers.get("sec-websocket-version") != "13":
        raise HandshakeError("426 Upgrade Required", "WebSocket version 13 only")
    key = headers.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError
    except ValueError:
        raise HandshakeError("400 Bad Request", "no valid Sec-WebSocket-Key") from None
    offered = tuple(p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip())
    return Request(parts[1].split("?")[0], key, offered, data[end + 4 :])


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (section 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def handshake_answer(request: Request, protocol: str | None) -> bytes:
    """The 101 that accepts ``request``, with the subprotocol chosen (``None``: none)."""
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {accept_key(request.key)}",
    ]
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def refusal(status: str, reason: str) -> bytes:
    """An HTTP answer that refuses an opening request."""
    body = reason.encode() + b"\n"
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


class FrameReader:
    """Cuts a client's frames out of a byte stream: :meth:`feed` returns ``(opcode, fin,
    payload)`` for each frame completed, unmasked.

    :param max_payload: the longest frame taken (a longer one: close 1009)
    """

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bool, bytes]]:
        buffer = self._buffer
        buffer += data
        frames = []
        at = 0
        while True:
            if len(buffer) - at < 2:
                break
            first, second = buffer[at], buffer[at + 1]
            if first & 0x70:
                raise WebSocketError(PROTOCOL_ERROR, "reserved bits set (no extension was agreed)")
            if not second & 0x80:
                raise WebSocketError(PROTOCOL_ERROR, "a client's frame that is not masked")
            length, head = second & 0x7F, 2
            if length == 126:
                if len(buffer) - at < 4:
                    break
                length, head = struct.unpack_from(">H", buffer, at + 2)[0], 4
            elif length == 127:
                if len(buffer) - at < 10:
                    break
                length, head = struct.unpack_from(">Q", buffer, at + 2)[0], 10
            if length > self.max_payload:
                raise WebSocketError(TOO_BIG, f"a frame of {length} bytes, over the {self.max_payload} taken")
            opcode = first & 0x0F
            if opcode >= 0x8 and (length > 125 or not first & 0x80):
                raise WebSocketError(PROTOCOL_ERROR, "a control frame over 125 bytes, or fragmented")
            end = at + head + 4 + length
            if len(buffer) < end:
                break
            mask = bytes(buffer[at + head : at + head + 4])
            frames.append((opcode, bool(first & 0x80), _unmask(bytes(buffer[at + head + 4 : end]), mask)))
            at = end
        del buffer[:at]
        return frames


def _unmask(payload: bytes, mask: bytes) -> bytes:
    if not payload:
        return payload
    repeated = (mask * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


def frame(opcode: int, payload: bytes) -> bytes:
    """A server's frame, final and unmasked."""
    length = len(payload)
    if length < 126:
        head = struct.pack(">BB", 0x80 | opcode, length)
    elif length < 1 << 16:
        head = struct.pack(">BBH", 0x80 | opcode, 126, length)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 127, length)
    return head + payload


def close_frame(code: int, reason: str = "") -> bytes:
    return frame(CLOSE, struct.pack(">H", code) + reason.encode()[:123])

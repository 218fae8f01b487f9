"""The frames of the link between a leader and a follower.

Each frame is ``length u32 | type u8 | payload`` (the length counts the type and the payload):

- ``HELLO`` (follower → leader): JSON ``{"name", "secret", "files": {path: [size, crc32]}}``;
- ``COPY`` (leader → follower): ops (``replication.encode_ops``) that bring the follower's files
  to the leader's, not acknowledged one by one;
- ``COPIED`` (leader → follower): ``seq u64``: the copy is complete up to batch ``seq``; the
  follower syncs what it was sent and acknowledges ``seq``;
- ``BATCH`` (leader → follower): ``seq u64 | ops``: one group commit's changes;
- ``ACK`` (follower → leader): ``seq u64``: every batch up to ``seq`` is applied and synced;
- ``REFUSED`` (leader → follower): a reason in UTF-8; the leader closes the link.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
from typing import Any

from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

__all__ = ["FrameReader", "Kind", "frame", "hello", "seq_frame", "tls_failure"]

HEAD = struct.Struct(">IB")
SEQ = struct.Struct(">Q")

#: The largest frame either side accepts.
MAX_FRAME = 1 << 30


class Kind(enum.IntEnum):
    HELLO = 1
    COPY = 2
    COPIED = 3
    BATCH = 4
    ACK = 5
    REFUSED = 6


def frame(kind: Kind, payload: bytes | list[bytes] = b"") -> list[bytes]:
    """A frame as pieces to write one after the other."""
    pieces = [payload] if isinstance(payload, bytes) else payload
    length = 1 + sum(len(piece) for piece in pieces)
    return [HEAD.pack(length, kind), *pieces]


def seq_frame(kind: Kind, seq: int, payload: Sequence[bytes] = ()) -> list[bytes]:
    """A frame whose payload starts with a batch number."""
    return frame(kind, [SEQ.pack(seq), *payload])


def hello(name: str, secret: str, files: dict[str, tuple[int, int]]) -> list[bytes]:
    body = {"name": name, "secret": secret, "files": {path: list(entry) for path, entry in files.items()}}
    return frame(Kind.HELLO, json.dumps(body).encode())


def read_hello(payload: bytes) -> tuple[str, str, dict[str, tuple[int, int]]]:
    """:raises ValueError: not a hello"""
    body: Any = json.loads(payload)
    files = {str(path): (int(entry[0]), int(entry[1])) for path, entry in body["files"].items()}
    return str(body["name"]), str(body["secret"]), files


class FrameReader(Protocol):
    """A protocol that hands each whole frame to :meth:`frameReceived`."""

    #: A TCP transport once connected (Twisted types it as any transport or none).
    transport: Any

    def __init__(self) -> None:
        self._buffer = bytearray()

    def dataReceived(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        try:
            while len(buffer) - at >= HEAD.size:
                length, kind = HEAD.unpack_from(buffer, at)
                if length < 1 or length > MAX_FRAME:
                    raise ValueError(f"a frame of {length} bytes")
                if len(buffer) - at < 4 + length:
                    break
                payload = memoryview(buffer[at + HEAD.size : at + 4 + length])  # (a copy: the buffer moves on)
                at += 4 + length
                self.frameReceived(Kind(kind), payload)
                if self.transport is None or getattr(self.transport, "disconnecting", False):
                    break
        except ValueError as error:
            self.bad(str(error))
            return
        del buffer[:at]

    def frameReceived(self, kind: Kind, payload: memoryview) -> None:
        raise NotImplementedError

    def bad(self, reason: str) -> None:
        """The peer sent something this side cannot read: the link is closed."""
        self.transport.loseConnection()

    def send(self, pieces: list[bytes]) -> None:
        self.transport.writeSequence(pieces)


def tls_failure(reason: Failure | None) -> str | None:
    """What went wrong with the link's TLS, if that is why it ended (``cluster.tls``): OpenSSL's
    reasons, such as ``certificate verify failed``."""
    if reason is None:
        return None
    try:
        from OpenSSL import SSL
    except ImportError:  # (no TLS without it)
        return None
    if not reason.check(SSL.Error):
        return None
    error = reason.value
    details = error.args[0] if error is not None and error.args else []
    if isinstance(details, list):
        found = [str(entry[2]) for entry in details if isinstance(entry, tuple) and len(entry) == 3 and entry[2]]
        if found:
            return "; ".join(found)
    return str(error) or error.__class__.__name__

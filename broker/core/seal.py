"""Seals on dead letters: what lets ``postroom dlq redrive`` trust where a message died.

A dead letter's ``x-death`` header says which queue it died in, but any client that may
publish to a dead-letter queue can write an ``x-death`` of its own. So the broker seals each
dead-lettered copy it makes: header ``x-postroom-dead-letter-seal`` holds an HMAC-SHA256,
under a key only the broker knows, of the vhost, the copy's dead-letter id, the queue it
died in, its content header as the broker wrote it and its body. A redrive publishes the
message, unchanged, to ``amq.postroom.redrive``; the broker checks the seal and sends the
message to the queue the seal names, or refuses it. A forged ``x-death``, a changed body or
header, or a copy of a seal onto another message all fail the check.

What a dead-letter queue adds on its own deliveries (``x-delivery-count``) is left out of the
check, as is the seal entry itself; everything else must be byte for byte what was sealed.

The key is 32 random bytes in ``<storage.dir>/dead-letter-seal.key`` (owner-only), made on the
first start, so dead letters recovered after a restart still verify. A broker without a
storage directory keeps a key for its own run only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from postroom.broker.wal.dead_letter_fields import DEAD_LETTER_ID_HEADER, SEAL_HEADER
from postroom.broker.wire.content import ContentError, headers_content, with_headers_content
from postroom.broker.wire.table import TableError, iter_table

__all__ = ["DEAD_LETTER_ID_HEADER", "SEAL_HEADER", "SEAL_KEY_FILE", "Sealer", "without_entries"]

#: The key's file, in the storage directory.
SEAL_KEY_FILE = "dead-letter-seal.key"
#: Header entries a seal does not cover: its own, and the count a queue adds on redelivery.
UNSEALED = (SEAL_HEADER.encode(), b"x-delivery-count")

_KEY_BYTES = 32
_SEAL_BYTES = 16


def without_entries(header: bytes, keys: tuple[bytes, ...]) -> bytes:
    """The content header with the headers table's entries named ``keys`` cut out (the
    other bytes as they are).

    :raises ContentError: the header, or its headers table, does not parse
    """
    content = headers_content(header)
    if content is None:
        return header
    kept: list[bytes] = []
    try:
        for key, _tag, start, end in iter_table(content, 0, len(content)):
            if key not in keys:
                kept.append(content[start - 2 - len(key) : end])
    except TableError as error:
        raise ContentError(str(error)) from None
    return with_headers_content(header, b"".join(kept))


class Sealer:
    """Seals dead letters and checks seals, with one key.

    :param key: the secret (at least 32 bytes)
    """

    def __init__(self, key: bytes) -> None:
        if len(key) < _KEY_BYTES:
            raise ValueError(f"a seal key has at least {_KEY_BYTES} bytes")
        self._key = key

    @classmethod
    def for_directory(cls, directory: str) -> Sealer:
        """The sealer whose key is kept in ``directory`` (made there, owner-only, when missing).

        :raises OSError: the key cannot be read or written, or the file holds no key
        """
        path = os.path.join(directory, SEAL_KEY_FILE)
        try:
            with open(path, "rb") as file:
                key = file.read()
        except FileNotFoundError:
            pass
        else:
            if len(key) < _KEY_BYTES:
                raise OSError(f"{path}: {len(key)} bytes, not a seal key (remove it to make a new one)")
            return cls(key)
        key = secrets.token_bytes(_KEY_BYTES)
        partial = f"{path}.{os.getpid()}.new"
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, key)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(partial, path)  # fails if another process made one meanwhile: use theirs
        except FileExistsError:
            with open(path, "rb") as file:
                key = file.read()
        finally:
            os.unlink(partial)
        return cls(key)

    def seal(self, vhost: str, dead_letter_id: int, queue: str, header: bytes, body: bytes) -> str:
        """The seal of a dead letter whose content ``header`` (without a seal) and ``body`` are
        final: it died in ``queue`` of ``vhost`` and has id ``dead_letter_id``."""
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (vhost.encode("utf-8", "surrogateescape"), str(dead_letter_id).encode(), _raw(queue)):
            mac.update(len(part).to_bytes(4, "big") + part)
        mac.update(hashlib.sha256(header).digest())
        mac.update(hashlib.sha256(body).digest())
        return mac.digest()[:_SEAL_BYTES].hex()

    def verify(self, vhost: str, header: bytes, headers: dict[str, object], body: bytes) -> str | None:
        """The queue a message died in, when ``headers`` (its decoded ``headers`` table) hold a
        seal this key made for exactly this message; ``None`` otherwise."""
        seal = headers.get(SEAL_HEADER)
        dead_letter_id = headers.get(DEAD_LETTER_ID_HEADER)
        deaths = headers.get("x-death")
        if isinstance(seal, str):  # compared as bytes: compare_digest refuses non-ASCII text
            seal = seal.encode("utf-8", "surrogateescape")
        if not isinstance(seal, bytes) or not isinstance(dead_letter_id, int) or isinstance(dead_letter_id, bool):
            return None
        if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
            return None
        queue = deaths[0].get("queue")
        if isinstance(queue, bytes):
            queue = queue.decode("utf-8", "surrogateescape")
        if not isinstance(queue, str):
            return None
        try:
            sealed_header = without_entries(header, UNSEALED)
        except ContentError:
            return None
        expected = self.seal(vhost, dead_letter_id, queue, sealed_header, body)
        return queue if hmac.compare_digest(expected.encode(), seal) else None


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")

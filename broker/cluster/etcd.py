"""A small etcd v3 client over etcd's JSON gateway (``/v3/...``), on Twisted's HTTP client.

Only what a cluster of Postroom nodes needs: keys (get, put, delete, transactions that
compare revisions), leases (grant, keep alive, revoke) and watches. Keys and values are
``bytes`` here; the gateway wants them base64-encoded, and gives revisions and lease ids as
decimal strings. ::

    etcd = Etcd(reactor, ["http://127.0.0.1:2379"])
    lease = await etcd.grant(2)
    won = await etcd.txn(
        [Compare.created(b"postroom/leader", 0)],
        [put_op(b"postroom/leader", b"node-a", lease)],
    )

Every call goes to the first endpoint that answers, starting with the last one that did; a
call fails with :class:`EtcdError` once every endpoint has failed it, or with the gateway's
own message (a lease that expired, a compare on a key that does not exist).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectError, ConnectionLost, TimeoutError
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone, _HTTP11ClientFactory, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

__all__ = ["Compare", "Etcd", "EtcdError", "KeyValue", "Watch", "delete_op", "prefix_end", "put_op"]

#: Seconds a call may take before the next endpoint is tried.
CALL_TIMEOUT = 3.0


class EtcdError(Exception):
    """etcd refused a call, or no endpoint answered it."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key as etcd holds it."""

    key: bytes
    value: bytes
    #: The revision that created the key, and the one that last changed it.
    create_revision: int
    mod_revision: int
    #: The lease the key is attached to (0: none).
    lease: int = 0

    @classmethod
    def of(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            _decode(kv.get("key", "")),
            _decode(kv.get("value", "")),
            int(kv.get("create_revision", 0)),
            int(kv.get("mod_revision", 0)),
            int(kv.get("lease", 0)),
        )


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _decode(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    """The end of the range of keys that start with ``prefix`` (etcd's ``range_end``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


class Compare:
    """The conditions of a transaction (all must hold)."""

    @staticmethod
    def created(key: bytes, revision: int) -> dict[str, Any]:
        """``key`` was created at ``revision`` (0: it does not exist)."""
        return {"key": _encode(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}

    @staticmethod
    def modified(key: bytes, revision: int) -> dict[str, Any]:
        """``key`` was last changed at ``revision``."""
        return {"key": _encode(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}

    @staticmethod
    def exists(key: bytes) -> dict[str, Any]:
        """``key`` exists."""
        return {"key": _encode(key), "target": "CREATE", "result": "GREATER", "create_revision": "0"}


def put_op(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    """A transaction's step: put ``key``."""
    request: dict[str, Any] = {"key": _encode(key), "value": _encode(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def delete_op(key: bytes, prefix: bool = False) -> dict[str, Any]:
    """A transaction's step: delete ``key`` (every key under it with ``prefix``)."""
    request = {"key": _encode(key)}
    if prefix:
        request["range_end"] = _encode(prefix_end(key))
    return {"request_delete_range": request}


@implementer(IBodyProducer)
class _Body:
    """A request body given whole (``twisted.web.client.FileBodyProducer`` without a thread)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> defer.Deferred[None]:
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _QuietFactory(_HTTP11ClientFactory):
    noisy = False


class Etcd:
    """Calls to an etcd cluster.

    :param endpoints: its client URLs (``http://host:port``)
    """

    _log = Logger()

    def __init__(self, reactor: Any, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.reactor = reactor
        self.endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = 4
        self._pool._factory = _QuietFactory
        self._agent = Agent(reactor, pool=self._pool, connectTimeout=CALL_TIMEOUT)
        #: The endpoint that answered last: calls start with it.
        self._current = 0

    async def call(self, path: str, request: dict[str, Any], timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
        """POST ``request`` to ``/v3/<path>``; the decoded answer.

        :raises EtcdError: etcd refused it, or no endpoint answered within ``timeout`` each
        """
        body = json.dumps(request).encode()
        problems = []
        for attempt in range(len(self.endpoints)):
            index = (self._current + attempt) % len(self.endpoints)
            url = f"{self.endpoints[index]}/v3/{path}".encode()
            try:
                response = await self._request(url, body, timeout)
                data = await readBody(response)
            except (ConnectError, ConnectionLost, TimeoutError, defer.CancelledError, OSError) as error:
                problems.append(f"{self.endpoints[index]}: {error.__class__.__name__}")
                continue
            except Exception as error:  # twisted.web's ResponseFailed, ResponseNeverReceived ...
                problems.append(f"{self.endpoints[index]}: {error.__class__.__name__}")
                continue
            self._current = index
            try:
                answer = json.loads(data)
            except ValueError:
                raise EtcdError(f"etcd answered {path} with {data[:200]!r}") from None
            if response.code != 200 or "error" in answer or ("code" in answer and "message" in answer):
                raise EtcdError(f"etcd refused {path}: {answer.get('message') or answer.get('error')}")
            return dict(answer)
        raise EtcdError(f"no etcd endpoint answered {path} ({'; '.join(problems)})")

    def _request(self, url: bytes, body: bytes, timeout: float) -> defer.Deferred[Any]:
        request = self._agent.request(b"POST", url, Headers({b"content-type": [b"application/json"]}), _Body(body))
        request.addTimeout(timeout, self.reactor)
        return request

    async def get(self, key: bytes) -> KeyValue | None:
        answer = await self.call("kv/range", {"key": _encode(key)})
        kvs = answer.get("kvs") or []
        return KeyValue.of(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """The keys under ``prefix``, and the revision they were read at."""
        answer = await self.call("kv/range", {"key": _encode(prefix), "range_end": _encode(prefix_end(prefix))})
        return [KeyValue.of(kv) for kv in answer.get("kvs") or []], int(answer["header"]["revision"])

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Put ``key``; the revision it was put at."""
        request: dict[str, Any] = {"key": _encode(key), "value": _encode(value)}
        if lease:
            request["lease"] = str(lease)
        answer = await self.call("kv/put", request)
        return int(answer["header"]["revision"])

    async def txn(
        self, compare: list[dict[str, Any]], success: list[dict[str, Any]], failure: Sequence[dict[str, Any]] = ()
    ) -> tuple[bool, int]:
        """Run ``success`` if every ``compare`` holds, else ``failure``; whether they held, and
        the revision the transaction ran at."""
        answer = await self.call("kv/txn", {"compare": compare, "success": success, "failure": list(failure)})
        return bool(answer.get("succeeded", False)), int(answer["header"]["revision"])

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds; its id and the TTL etcd gave it (at least its minimum)."""
        answer = await self.call("lease/grant", {"TTL": ttl})
        return int(answer["ID"]), int(answer["TTL"])

    async def keepalive(self, lease: int, timeout: float = CALL_TIMEOUT) -> int:
        """Renew ``lease``; the seconds it has from now (0: it has expired)."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)}, timeout)
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now: the keys attached to it are deleted."""
        await self.call("lease/revoke", {"ID": str(lease)})

    def watch(
        self, key: bytes, on_event: Callable[[str, KeyValue], None], prefix: bool = False, start_revision: int = 0
    ) -> Watch:
        """Call ``on_event(kind, kv)`` (``PUT`` or ``DELETE``) for each change of ``key`` (of the
        keys under it, with ``prefix``) after ``start_revision`` (0: from now), until the watch
        is cancelled or breaks (:attr:`Watch.ended` fires)."""
        request: dict[str, Any] = {"key": _encode(key)}
        if prefix:
            request["range_end"] = _encode(prefix_end(key))
        if start_revision:
            request["start_revision"] = str(start_revision)
        return Watch(self, request, on_event)

    async def close(self) -> None:
        await self._pool.closeCachedConnections()


class _WatchStream(Protocol):
    """Reads the gateway's watch answer: one JSON object per line, as they come."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                self.watch.received(json.loads(line))

    def connectionLost(self, reason: Failure = ResponseDone) -> None:  # type: ignore[assignment]
        self.watch.lost(reason)


class Watch:
    """A watch on one key or prefix, over a request of its own (see :meth:`Etcd.watch`)."""

    def __init__(self, etcd: Etcd, request: dict[str, Any], on_event: Callable[[str, KeyValue], None]) -> None:
        self.on_event = on_event
        #: Fires (with ``None``) once the watch has ended, whatever ended it.
        self.ended: defer.Deferred[None] = defer.Deferred()
        #: Fires once etcd has created the watch: changes from then on are seen.
        self.created: defer.Deferred[None] = defer.Deferred()
        self._transport: Any = None
        self._cancelled = False
        body = json.dumps({"create_request": request}).encode()
        index = etcd._current
        url = f"{etcd.endpoints[index]}/v3/watch".encode()
        # A connection of its own: the answer never ends while the watch lasts.
        pool = HTTPConnectionPool(etcd.reactor, persistent=False)
        pool._factory = _QuietFactory
        agent = Agent(etcd.reactor, connectTimeout=CALL_TIMEOUT, pool=pool)
        self._request = agent.request(b"POST", url, Headers({b"content-type": [b"application/json"]}), _Body(body))
        self._request.addCallbacks(self._response, self._failed)

    def _response(self, response: Any) -> None:
        stream = _WatchStream(self)
        response.deliverBody(stream)
        self._transport = stream.transport
        if self._cancelled:
            self.cancel()

    def _failed(self, failure: Failure) -> None:
        self.lost(failure)

    def received(self, message: dict[str, Any]) -> None:
        result = message.get("result") or {}
        if result.get("created") and not self.created.called:
            self.created.callback(None)
        if result.get("canceled"):
            self.cancel()
            return
        for event in result.get("events") or []:
            self.on_event(event.get("type", "PUT"), KeyValue.of(event.get("kv") or {}))

    def lost(self, reason: Failure) -> None:
        if not self.created.called:
            self.created.errback(EtcdError(f"the watch could not be made: {reason.getErrorMessage()}"))
        if not self.ended.called:
            self.ended.callback(None)

    def cancel(self) -> None:
        """End the watch (its connection is closed)."""
        self._cancelled = True
        if self._transport is not None:
            self._transport.stopProducing()
        elif not self._request.called:
            self._request.cancel()

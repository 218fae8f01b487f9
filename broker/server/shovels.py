"""Dynamic shovels run in the broker, on the reactor, as RabbitMQ's shovel plugin runs them.

A shovel is a runtime parameter of component ``shovel`` (``broker.core.shovel`` checks its
definition; ``broker.core.admin`` keeps it in the log). :class:`Shovels` watches those
parameters: each one set starts a :class:`Shovel` (one changed starts it again), each one
cleared stops it.

A shovel connects to its destination, then to its source (two :class:`broker.clients.link.Link`
connections, each to one of its URIs picked at random, the others tried when it fails),
declares the destination queue and the source queue when they are missing (or, for
``src-exchange``, an exclusive queue bound to it), and consumes. Each delivery is published
at the destination with its properties as they came (``dest-publish-properties``,
``x-shovelled`` and ``x-shovelled-timestamp`` added where asked) to ``dest-queue``, or to
``dest-exchange`` (its routing key, or ``dest-exchange-key``), or where it was published.

Acknowledgement (``ack-mode``): ``on-confirm`` (the default) acknowledges a message at the
source only once the destination confirmed it, so a failure of either side at any moment
loses nothing (a message may come twice: a delivery flagged redelivered counts as a possible
duplicate); ``on-publish`` once it is written to the destination; ``no-ack`` consumes without
acknowledgements. ``src-delete-after`` ends the shovel after that many messages (or the
source queue's length at start) and clears its parameter, as RabbitMQ's does.

A shovel whose connection fails or ends shows ``terminated`` with the reason (or ``starting``
while it cannot connect) and starts again: the first time at once, then after
``reconnect-delay`` seconds (5 by default; 0: never again), as RabbitMQ's supervisor does.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from OpenSSL import SSL
from pamqp import commands
from twisted.application.service import Service
from twisted.internet import defer, ssl
from twisted.internet.endpoints import SSL4ClientEndpoint, TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectError, DNSLookupError, TimeoutError
from twisted.internet.interfaces import (
    IDelayedCall,
    IOpenSSLClientConnectionCreator,
    IPushProducer,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from zope.interface import implementer

from postroom.broker.clients.link import Link, LinkClosed
from postroom.broker.core.users import User
from postroom.broker.server.identity import node_name
from postroom.broker.server.sockets import socket_of
from postroom.broker.wire.content import ContentError, headers_content, replace_property, with_header_entry
from postroom.broker.wire.table import Int64, decode_table
from postroom.config.shovels import COMPONENT, Endpoint, ShovelInvalid, ShovelSpec, parse, parse_uri

if TYPE_CHECKING:
    from postroom.broker.core.node import Node

_log = Logger()

#: The user a shovel's ``amqp://`` URI (no host: the node itself) connects as, over loopback.
INTERNAL_USER = "postroom-shovel"
#: Why a shovel whose consumer was cancelled (its source queue deleted) starts again.
RESTART = "needed a restart"

#: Each property ``dest-publish-properties`` may set: its flag in the content header, and
#: whether its value is an octet, a timestamp or a short string.
_PROPERTY_FLAGS = {
    "content_type": (0x8000, "s"), "content_encoding": (0x4000, "s"), "delivery_mode": (0x1000, "o"),
    "priority": (0x0800, "o"), "correlation_id": (0x0400, "s"), "reply_to": (0x0200, "s"),
    "expiration": (0x0100, "s"), "message_id": (0x0080, "s"), "timestamp": (0x0040, "t"), "type": (0x0020, "s"),
    "user_id": (0x0010, "s"), "app_id": (0x0008, "s"), "cluster_id": (0x0004, "s"),
}  # fmt: skip
_HEADERS_FLAG = 0x2000


def _property_bytes(kind: str, value: Any) -> bytes:
    if kind == "o":
        return bytes((int(value) & 0xFF,))
    if kind == "t":
        return int(value).to_bytes(8, "big", signed=False)
    raw = str(value).encode()[:255]
    return bytes((len(raw),)) + raw


def local_time(seconds: float) -> str:
    """A status's timestamp as RabbitMQ's shovel plugin writes it: local time, the hour not
    padded (``2026-11-28 9:05:03``)."""
    moment = time.localtime(seconds)
    day = f"{moment.tm_year}-{moment.tm_mon:02}-{moment.tm_mday:02}"
    return f"{day} {moment.tm_hour}:{moment.tm_min:02}:{moment.tm_sec:02}"


def erlang_close(code: int, text: str) -> str:
    """How RabbitMQ prints a shovel's end by a broker's close, in ``reason``."""
    return f'{{shutdown,{{server_initiated_close,{code},<<"{text}">>}}}}'


@implementer(IPushProducer)
class Shovel:
    """One dynamic shovel: connects, moves messages and starts again after failures.

    :param shovels: the node's shovels (where it reports and finds the node)
    :param spec: its definition
    """

    def __init__(self, shovels: Shovels, spec: ShovelSpec) -> None:
        self.shovels = shovels
        self.spec = spec
        self.clock = shovels.clock
        #: ``starting``, ``running`` or ``terminated``, as RabbitMQ's status shows it.
        self.state = "starting"
        self.reason = ""
        self.changed = time.time()
        self.source: Link | None = None
        self.dest: Link | None = None
        self.src_endpoint: Endpoint | None = None
        self.dest_endpoint: Endpoint | None = None
        self.queue = ""  # what the source consumes
        #: on-confirm: the source's delivery tag of each publish not confirmed yet, by sequence.
        self.pending: dict[int, int] = {}
        #: ``src-delete-after``: messages left to move (``None``: no end), and to publish.
        self.remaining: int | None = None
        self.remaining_unacked: int | None = None
        #: Counters over the shovel's life: moved (published and settled as the ack mode
        #: asks), refused by the destination, delivered again (possible duplicates).
        self.moved = self.nacked = self.redelivered = 0
        #: Failures since the shovel last ran (the first one starts it again at once), and
        #: starts after a failure over its life.
        self.failures = self.restarts = 0
        self.stopped = False
        self._restart: IDelayedCall | None = None
        self._generation = 0

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._report("starting")
        self._generation += 1
        generation = self._generation
        started = defer.Deferred.fromCoroutine(self._start(generation))
        started.addErrback(self._failed, generation)

    def stop(self) -> None:
        """Stop for good (the parameter was cleared or changed, or the broker stops)."""
        self.stopped = True
        if self._restart is not None and self._restart.active():
            self._restart.cancel()
        self._restart = None
        self._close()

    def _close(self) -> None:
        for link in (self.source, self.dest):
            if link is not None:
                # What the link still reads (frames already received) is not for this shovel
                # any more: a delivery left unacknowledged goes back to its queue.
                link.on_deliver = link.on_confirm = link.on_cancel = None
                link.close("shovel stopped")
        self.source = self.dest = None
        self.pending = {}

    def _report(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.changed = state, reason, time.time()

    def _failed(self, failure: Any, generation: int) -> None:
        """The start or a link failed: close both sides and start again (see the module).

        What the status shows, as RabbitMQ's: a broker's close, ``terminated`` with it; a
        consumer cancelled or a heartbeat missed, ``terminated`` with that; a connection that
        could not be made or was lost, nothing until the next start shows ``starting``.
        """
        if generation != self._generation or self.stopped:
            return
        error = failure.value
        if isinstance(error, LinkClosed):
            if error.reply_text in (RESTART, "heartbeat timeout"):
                self._report("terminated", f'"{error.reply_text}"')
            elif error.reply_code not in (200, 320):
                self._report("terminated", erlang_close(error.reply_code, error.reply_text))
        elif not isinstance(error, CONNECT_ERRORS):
            _log.failure(
                "shovel '{name}' in vhost '{vhost}' failed", failure, name=self.spec.name, vhost=self.spec.vhost
            )
            self._report("terminated", repr(error))
        _log.warn(
            "shovel '{name}' in vhost '{vhost}': {why}",
            name=self.spec.name, vhost=self.spec.vhost, why=failure.getErrorMessage(),
        )  # fmt: skip
        self._generation += 1
        self._close()
        delay = self.spec.reconnect_delay
        self.failures += 1
        if delay <= 0 and self.failures > 1:
            return  # (as RabbitMQ's: a shovel without a reconnect delay is not started again)
        self._restart = self.clock.callLater(0.0 if self.failures == 1 else delay, self._again)

    def _again(self) -> None:
        self._restart = None
        if not self.stopped:
            self.restarts += 1
            self.start()

    # -- connecting -----------------------------------------------------------------------------

    async def _connect(self, uris: tuple[str, ...], confirms: bool) -> tuple[Link, Endpoint]:
        """A link to one of ``uris``, picked at random, the others tried when it fails."""
        left = list(uris)
        random.shuffle(left)
        last: Exception = _NoEndpoint("no URI to connect to")
        for uri in left:
            endpoint = parse_uri(uri)
            link = self.shovels.link(endpoint, f"Shovel {self.spec.name}", confirms)
            try:
                await connectProtocol(self.shovels.endpoint(endpoint), link)
                # A broker that accepts and never answers counts as one that refused.
                await link.opened.addTimeout(_timeout(endpoint), self.clock)
            except CONNECT_ERRORS as error:
                if link.transport is not None:
                    socket_of(link).abortConnection()
                last = error
                continue
            return link, endpoint
        raise last

    async def _start(self, generation: int) -> None:
        spec = self.spec
        self.dest, self.dest_endpoint = await self._connect(spec.dest_uris, confirms=spec.ack_mode == "on-confirm")
        self.dest.closed.addCallback(self._lost, generation)
        self.source, self.src_endpoint = await self._connect(spec.src_uris, confirms=False)
        self.source.closed.addCallback(self._lost, generation)
        source, dest = self.source, self.dest
        if spec.dest_queue:
            await _ensure_queue(dest, spec.dest_queue, spec.dest_queue_args)
        if spec.src_queue is not None:
            await _ensure_queue(source, spec.src_queue, spec.src_queue_args)
            self.queue = spec.src_queue
        else:
            declared = await source.call(commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
            self.queue = declared.queue
            assert spec.src_exchange is not None  # (a spec names a source queue or a source exchange)
            bind = commands.Queue.Bind(queue=self.queue, exchange=spec.src_exchange, routing_key=spec.src_exchange_key)
            await source.call(bind, commands.Queue.BindOk)
        if spec.delete_after == "never":
            self.remaining = None
        elif spec.delete_after == "queue-length":
            passive = commands.Queue.Declare(queue=self.queue, passive=True)
            self.remaining = (await source.call(passive, commands.Queue.DeclareOk)).message_count
        else:
            self.remaining = int(spec.delete_after)
        self.remaining_unacked = self.remaining
        if self.remaining == 0:
            self._finished()
            return
        if spec.ack_mode != "no-ack":
            await source.call(commands.Basic.Qos(prefetch_count=spec.prefetch), commands.Basic.QosOk)
        source.on_deliver = self._deliver
        source.on_cancel = self._cancelled
        dest.on_confirm = self._confirmed
        socket_of(dest).registerProducer(self, True)  # the destination's pace holds the source back
        consume = commands.Basic.Consume(
            queue=self.queue, no_ack=spec.ack_mode == "no-ack", arguments=dict(spec.src_consumer_args)
        )
        await source.call(consume, commands.Basic.ConsumeOk)
        self.failures = min(self.failures, 1)
        self._report("running")
        _log.info("shovel '{name}' in vhost '{vhost}' running", name=spec.name, vhost=spec.vhost)

    def _lost(self, why: LinkClosed, generation: int) -> None:
        if generation == self._generation and not self.stopped:
            self._failed(_Failure(why), generation)

    def _cancelled(self) -> None:
        """The source queue was deleted: start again (it is declared again)."""
        self._failed(_Failure(LinkClosed(320, RESTART)), self._generation)

    # -- IPushProducer: the destination's transport asks the source to wait, then go on ----------

    def pauseProducing(self) -> None:
        if self.source is not None:
            self.source.pause()

    def resumeProducing(self) -> None:
        if self.source is not None:
            self.source.resume()

    def stopProducing(self) -> None:
        pass  # (the destination's end is seen through its link)

    # -- moving ---------------------------------------------------------------------------------

    def _deliver(
        self, tag: int, redelivered: bool, exchange: str, routing_key: str, header: bytes, body: bytes
    ) -> None:
        spec = self.spec
        if self.remaining_unacked is not None:
            if self.remaining_unacked <= 0:
                return  # over the count: left unacknowledged, it goes back when the shovel ends
            self.remaining_unacked -= 1
        if redelivered:
            self.redelivered += 1
        if spec.publish_properties or spec.add_forward_headers or spec.add_timestamp_header:
            header = self._properties(header)
        if spec.dest_queue:
            exchange, routing_key = "", spec.dest_queue
        else:
            if spec.dest_exchange is not None:
                exchange = spec.dest_exchange
            if spec.dest_exchange_key is not None:
                routing_key = spec.dest_exchange_key
        dest, source = self.dest, self.source
        if dest is None or source is None:
            return  # (stopped between two frames of one read: it goes back to its queue)
        sequence = dest.publish(exchange, routing_key, header, body)
        if spec.ack_mode == "on-confirm":
            self.pending[sequence] = tag
        elif spec.ack_mode == "on-publish":
            source.ack(tag)
            self._done(1)
        else:
            self._done(1)

    def _confirmed(self, sequence: int, multiple: bool, acked: bool) -> None:
        pending = self.pending
        tag = pending.get(sequence)
        if tag is None:
            return
        if multiple:
            settled = 0
            while pending:  # (in the order published)
                first = next(iter(pending))
                if first > sequence:
                    break
                del pending[first]
                settled += 1
        else:
            del pending[sequence]
            settled = 1
        source = self.source
        if source is not None:
            if acked:
                source.ack(tag, multiple)
            else:
                source.nack(tag, multiple)  # back to the source queue, as RabbitMQ's shovel does
                self.nacked += settled
        self._done(settled)

    def _done(self, count: int) -> None:
        self.moved += count
        if self.remaining is not None:
            self.remaining -= count
            if self.remaining <= 0:
                self._finished()

    def _finished(self) -> None:
        """``src-delete-after`` reached: the shovel ends and clears its own parameter."""
        spec = self.spec
        _log.info(
            "shovel '{name}' in vhost '{vhost}': no messages left to transfer, shutting down",
            name=spec.name, vhost=spec.vhost,
        )  # fmt: skip
        self.stop()
        self.shovels.finished(self)

    def _properties(self, header: bytes) -> bytes:
        spec = self.spec
        try:
            for name, value in spec.publish_properties.items():
                flag, kind = _PROPERTY_FLAGS[name]
                header = replace_property(header, flag, _property_bytes(kind, value))
            if spec.add_forward_headers:
                header = with_header_entry(header, "x-shovelled", [self._forward_table(), *_shovelled(header)])
            if spec.add_timestamp_header:
                header = with_header_entry(header, "x-shovelled-timestamp", Int64(int(time.time())))
        except (ContentError, ValueError):
            pass  # (a header that does not parse goes on as it came)
        return header

    def _forward_table(self) -> dict[str, str]:
        spec = self.spec
        assert self.src_endpoint is not None and self.dest_endpoint is not None
        table = {
            "shovelled-by": self.shovels.cluster_name(),
            "shovel-type": "dynamic",
            "shovel-name": spec.name,
            "shovel-vhost": spec.vhost,
            "src-uri": self.src_endpoint.shown,
            "dest-uri": self.dest_endpoint.shown,
        }
        table.update(self._endpoints("-"))
        return table

    def _endpoints(self, joiner: str) -> dict[str, str]:
        """Where the shovel takes from and puts to, as RabbitMQ names them (``src-queue`` in
        ``x-shovelled``, ``src_queue`` in a status): the source's queue or exchange and key, and
        whichever of the destination's exchange, key and queue were given."""
        spec = self.spec
        if spec.src_exchange is not None:
            shown = {"src-exchange": spec.src_exchange, "src-exchange-key": spec.src_exchange_key}
        else:
            shown = {"src-queue": spec.src_queue or ""}
        for key, value in (
            ("dest-exchange", spec.dest_exchange),
            ("dest-exchange-key", spec.dest_exchange_key),
            ("dest-queue", spec.dest_queue),
        ):
            if value is not None:
                shown[key] = value
        return {key.replace("-", joiner): value for key, value in shown.items()}

    # -- what is shown --------------------------------------------------------------------------

    def status(self, counters: bool = False) -> dict[str, Any]:
        """The shovel as ``GET /api/shovels`` shows it (RabbitMQ 3.10's fields; with
        ``counters``, Postroom's besides)."""
        spec = self.spec
        view: dict[str, Any] = {
            "node": node_name(),
            "timestamp": local_time(self.changed),
            "name": spec.name,
            "vhost": spec.vhost,
            "type": "dynamic",
            "state": self.state,
        }
        if self.state == "running" and self.src_endpoint is not None and self.dest_endpoint is not None:
            view["src_uri"] = self.src_endpoint.shown
            view["src_protocol"] = "amqp091"
            view["dest_protocol"] = "amqp091"
            view["dest_uri"] = self.dest_endpoint.shown
            view.update(self._endpoints("_"))
        elif self.state == "terminated":
            view["reason"] = self.reason
        if counters:
            view.update(messages=self.moved, redelivered=self.redelivered, nacked=self.nacked, restarts=self.restarts)
        return view


class _NoEndpoint(Exception):
    """A shovel's URI names the node itself, and the node has no AMQP listener to connect to."""


#: Why a connection could not be made or was lost: a shovel starts again after these.
CONNECT_ERRORS = (
    LinkClosed, ConnectError, DNSLookupError, TimeoutError, defer.TimeoutError, OSError, SSL.Error, _NoEndpoint,
)  # fmt: skip


def _timeout(endpoint: Endpoint) -> float:
    """Seconds to connect and open (the URI's ``connection_timeout``, in milliseconds: 60 s)."""
    try:
        return float(endpoint.query.get("connection_timeout") or 60000) / 1000
    except ValueError:
        return 60.0


class _Failure:
    """What :meth:`Shovel._failed` reads of a failure, for an error that was not raised."""

    def __init__(self, value: Exception) -> None:
        self.value = value

    def getErrorMessage(self) -> str:
        return str(self.value)


def _shovelled(header: bytes) -> list[Any]:
    """The ``x-shovelled`` history a message already has (the new entry goes first)."""
    content = headers_content(header)
    if content is None:
        return []
    length = len(content).to_bytes(4, "big")
    try:
        history = decode_table(length + content)[0].get("x-shovelled")
    except ValueError:
        return []
    return history if isinstance(history, list) else []


async def _ensure_queue(link: Link, name: str, arguments: Any) -> None:
    """Declare ``name`` (durable, with ``arguments``) unless it exists; one that exists is used
    as it is, as RabbitMQ's shovel does."""
    if not await link.exists(name):
        declare = commands.Queue.Declare(queue=name, durable=True, arguments=dict(arguments or {}))
        await link.call(declare, commands.Queue.DeclareOk)


class Shovels(Service):
    """The node's dynamic shovels: started with the broker (after its listeners), each one's
    parameter watched (see the module).

    :param node: the node whose ``shovel`` parameters are run
    :param reactor: the reactor
    """

    def __init__(self, node: Node, reactor: Any) -> None:
        super().__init__()
        self.node = node
        self.clock = reactor
        self.reactor = reactor
        self.active: dict[tuple[str, str], Shovel] = {}
        self._secret = secrets.token_urlsafe(32)
        node.internal_user = User(INTERNAL_USER, password=self._secret, loopback_only=True)
        node.admin.parameter_watchers.append(self._changed)

    def startService(self) -> None:
        super().startService()
        for (component, vhost, name), value in list(self.node.admin.parameters.items()):
            if component == COMPONENT:
                self._start(vhost, name, value)

    def stopService(self) -> Any:
        super().stopService()
        for shovel in list(self.active.values()):
            shovel.stop()
        self.active.clear()

    def __iter__(self) -> Iterator[Shovel]:
        return iter(sorted(self.active.values(), key=lambda shovel: (shovel.spec.vhost, shovel.spec.name)))

    def _changed(self, component: str, vhost: str, name: str, value: Any) -> None:
        if component != COMPONENT:
            return
        old = self.active.pop((vhost, name), None)
        if old is not None:
            old.stop()
        if value is not None and self.running:
            self._start(vhost, name, value)

    def _start(self, vhost: str, name: str, value: Any) -> None:
        try:
            spec = parse(vhost, name, value)
        except ShovelInvalid as invalid:
            _log.warn(
                "shovel '{name}' in vhost '{vhost}' is not started: {why}", name=name, vhost=vhost, why=invalid
            )  # (a definition kept from an older version's looser checks)
            return
        shovel = Shovel(self, spec)
        self.active[(vhost, name)] = shovel
        shovel.start()

    def restart(self, shovel: Shovel) -> None:
        """Stop ``shovel`` and start it again from its definition."""
        spec = shovel.spec
        if self.active.get((spec.vhost, spec.name)) is shovel:
            shovel.stop()
            del self.active[(spec.vhost, spec.name)]
            self._start(spec.vhost, spec.name, spec.value)

    def finished(self, shovel: Shovel) -> None:
        """A shovel reached its ``src-delete-after``: its parameter is cleared (it was stopped)."""
        spec = shovel.spec
        if self.active.get((spec.vhost, spec.name)) is shovel:
            del self.active[(spec.vhost, spec.name)]
            self.node.admin.clear_parameter(COMPONENT, spec.vhost, spec.name)

    def cluster_name(self) -> str:
        return self.node.admin.cluster_name or node_name()

    def link(self, endpoint: Endpoint, name: str, confirms: bool) -> Link:
        if endpoint.host is None:  # the node itself, as its internal user
            return Link(INTERNAL_USER, self._secret, endpoint.vhost, self.clock, name=name, confirms=confirms)
        try:
            heartbeat = int(endpoint.query.get("heartbeat") or 10)
        except ValueError:
            heartbeat = 10
        return Link(
            endpoint.user,
            endpoint.password,
            endpoint.vhost,
            self.clock,
            heartbeat=heartbeat,
            name=name,
            confirms=confirms,
        )

    def endpoint(self, endpoint: Endpoint) -> IStreamClientEndpoint:
        """Where a link to ``endpoint`` connects: TCP, or TLS for ``amqps://``."""
        timeout = _timeout(endpoint)
        if endpoint.host is None:
            listeners = [info for info in self.node.listeners if info.protocol == "amqp"]
            if not listeners:
                raise _NoEndpoint("the node has no AMQP listener for an amqp:// shovel URI to reach")
            return TCP4ClientEndpoint(self.reactor, "127.0.0.1", listeners[0].port, timeout=timeout)
        if not endpoint.tls:
            return TCP4ClientEndpoint(self.reactor, endpoint.host, endpoint.port, timeout=timeout)
        return SSL4ClientEndpoint(self.reactor, endpoint.host, endpoint.port, _tls_options(endpoint), timeout=timeout)


def _tls_options(endpoint: Endpoint) -> IOpenSSLClientConnectionCreator | ssl.CertificateOptions:
    """The client side of TLS for an ``amqps://`` URI's query: ``cacertfile``, ``certfile`` and
    ``keyfile``, ``verify`` (``verify_peer``: the broker's certificate is checked against the CA
    file and the host name, or ``server_name_indication``; otherwise it is not checked, as
    Erlang's default ``verify_none``)."""
    query = endpoint.query
    client = None
    if query.get("certfile"):
        with open(query["certfile"], "rb") as certificate:
            pem = certificate.read()
        if query.get("keyfile"):
            with open(query["keyfile"], "rb") as key:
                pem += b"\n" + key.read()
        client = ssl.PrivateCertificate.loadPEM(pem)
    name = query.get("server_name_indication") or endpoint.host or ""
    if query.get("verify") == "verify_peer":
        trust = None
        if query.get("cacertfile"):
            with open(query["cacertfile"], "rb") as ca:
                trust = ssl.Certificate.loadPEM(ca.read())
        return ssl.optionsForClientTLS(name, trustRoot=trust, clientCertificate=client)
    if client is not None:
        return ssl.CertificateOptions(privateKey=client.privateKey.original, certificate=client.original, verify=False)
    return ssl.CertificateOptions(verify=False)

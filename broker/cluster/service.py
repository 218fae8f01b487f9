"""A cluster node: who leads is decided in etcd; the leader serves, the followers copy its log.

:class:`ClusterNode` is the Twisted service ``postroom serve`` runs when the configuration has
a ``cluster:`` section. It keeps a lease in etcd and its address under
``<prefix>/nodes/<name>``, and then takes one of two roles:

- **Follower.** It copies the leader's files (``follower.FollowerLink``) and forwards every
  client connection on its listeners to the leader's (LavinMQ's choice too: clients given any
  node's address reach the leader, and a stock client's list of hosts needs no order). When
  the leader key is deleted (the leader stopped, or its lease ran out) it campaigns.
- **Leader.** It holds ``<prefix>/leader``, put under its lease in a transaction that also
  checks that ``<prefix>/isr/<name>`` exists: only a node in the in-sync set may lead (the
  first leader of a new cluster checks instead that ``<prefix>/initialized`` does not exist,
  and puts it). It starts the broker from its data directory, as a restart does (unacked
  deliveries come back redelivered), serves, and sends what its log writes to its followers
  (``leader.Replication``), which gates confirms.

**Fencing.** A leader counts its lease as lasting from when it sent the last keepalive that
etcd answered. Once that time may have passed, it releases no confirm, closes its clients'
connections, stops its broker and follows again: a node paused (SIGSTOP, a frozen VM) past its
lease sends no confirm when it resumes. The in-sync set is written only by a transaction that
checks the writer still holds the leader key, so a deposed leader cannot shrink it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.internet import error as network
from twisted.internet.endpoints import TCP4ClientEndpoint, serverFromString, wrapClientTLS
from twisted.internet.interfaces import IProtocolFactory
from twisted.internet.protocol import Factory
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.threadpool import ThreadPool

from postroom.broker.cluster.etcd import Compare, Etcd, EtcdError, KeyValue, Watch, delete_op, put_op
from postroom.broker.cluster.follower import FollowerLink
from postroom.broker.cluster.leader import Replication
from postroom.broker.cluster.proxy import LeaderProxy
from postroom.broker.cluster.replication import file_index
from postroom.broker.server.identity import set_node_name
from postroom.broker.server.listeners import ClientTLS, ServerTLS, advertised, loaded, with_backlog
from postroom.config.schema import BrokerConfig, ClusterConfig, ListenConfig
from postroom.config.tls import client_context, server_context

__all__ = ["ClusterNode"]

#: The directories of a data directory that are a leader's own, removed when it follows (the
#: leader's checkpoint comes with the copy of its files).
LOCAL_STATE = ("checkpoint", "checkpoint.new", "checkpoint.old", "spool", "paging")

#: Seconds between a follower's attempts to reach its leader, and after a refused attempt.
RETRY = 0.2
REFUSED_RETRY = 0.02
#: The longest wait between attempts of a follower that cannot write its copy, or whose TLS
#: handshake with the leader fails (each attempt reads its files for their checksums, and the
#: leader sends what differs): from 1 s, doubled.
BACKOFF_MAX = 8.0


def _forwarded(listen: ListenConfig) -> list[tuple[str, str]]:
    """The listeners a follower forwards to the leader's, by kind, with their endpoints."""
    kinds = (
        ("amqp", listen.amqp),
        ("amqps", listen.amqps),
        ("stream", listen.stream),
        ("stream_tls", listen.stream_tls),
        ("management", listen.management),
    )
    return [(kind, endpoint) for kind, endpoint in kinds if endpoint]


def _address(endpoint: str, host: str | None) -> str:
    found_host, port = advertised(endpoint, host)
    return f"{found_host}:{port}"


class ClusterNode(Service):
    """One node of a cluster (see the module's documentation).

    :param make_broker: builds the broker service from the data directory, sending what its
        log writes to the given replication, and showing the cluster as this node tells it
        (called each time this node becomes the leader)
    """

    _log = Logger()

    def __init__(
        self, reactor: Any, config: BrokerConfig, make_broker: Callable[[Replication, ClusterNode], Any]
    ) -> None:
        assert config.cluster is not None
        self.reactor = reactor
        self.config = config
        self.cluster: ClusterConfig = config.cluster
        self.make_broker = make_broker
        self.node_name = self.cluster.name
        set_node_name(f"postroom@{self.node_name}")
        prefix = self.cluster.prefix.rstrip("/").encode()
        self.leader_key = prefix + b"/leader"
        self.isr_prefix = prefix + b"/isr/"
        self.nodes_prefix = prefix + b"/nodes/"
        self.initialized_key = prefix + b"/initialized"
        self.secret_key = prefix + b"/secret"
        self.data_dir = config.storage.dir
        host = self.cluster.advertise
        #: What this node tells the others, as JSON in its node key and in the leader key.
        self.addresses = {
            "name": self.node_name,
            "replication": _address(self.cluster.listen, host),
            **{kind: _address(endpoint, host) for kind, endpoint in _forwarded(config.listen)},
        }
        self.etcd: Etcd | None = None
        self.lease = 0
        self.ttl = self.cluster.lease
        #: Until when (``time.monotonic``) this node's lease surely holds.
        self.valid_until = 0.0
        self.secret = ""
        #: ``starting``, ``follower``, ``candidate``, ``leader`` or ``stopped``.
        self.role = "starting"
        self.leader: dict[str, Any] | None = None
        #: The lease the leader followed holds its key under.
        self._leader_lease = 0
        #: The leader key as this node put it (its revision fences what the leader writes).
        self._leading: KeyValue | None = None
        self.broker: Any = None
        self.replication: Replication | None = None
        self._replication_port: Any = None
        self._proxies: list[tuple[LeaderProxy, Any]] = []
        self._link: FollowerLink | None = None
        self._watch: Watch | None = None
        self._keepalive = task.LoopingCall(self._renew)
        self._keepalive.clock = reactor
        self._pool = ThreadPool(1, 1, "postroom-follower")
        #: The links' TLS, both ends (``None``: plain TCP); the configuration's loader checked the files.
        self._tls_server: ServerTLS | None = None
        self._tls_client: ClientTLS | None = None
        tls = self.cluster.tls
        if tls is not None:
            self._tls_server = ServerTLS(loaded(config, lambda: server_context(tls, section="cluster.tls")))
            self._tls_client = ClientTLS(loaded(config, lambda: client_context(tls, section="cluster.tls")))
        #: Whether :meth:`_settle` is running.
        self._settling = False
        #: Times this node became the leader.
        self.elections = 0
        #: The nodes registered in etcd (with their addresses) and those in the in-sync set, as
        #: last read (at each renewal of the lease).
        self._registered: dict[str, dict[str, Any]] = {}
        self._in_sync: set[str] = set()

    # -- life --------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._pool.start()
        self.etcd = Etcd(self.reactor, self.cluster.etcd)
        defer.ensureDeferred(self._start()).addErrback(self._fatal)

    def _fatal(self, failure: Any) -> None:
        self._log.failure("the cluster node failed; stopping", failure)
        if self.reactor.running:
            self.reactor.stop()

    async def _start(self) -> None:
        etcd = self.etcd
        assert etcd is not None
        while True:
            try:
                self.secret = await self._secret()
                break
            except EtcdError as error:
                self._log.warn("etcd: {error}; trying again", error=str(error))
                await task.deferLater(self.reactor, 1.0, lambda: None)
        await self._register()
        self._keepalive.start(self.ttl / 4, now=False)
        self._log.info(
            "cluster node {name}: lease of {ttl} s in etcd; finding the leader", name=self.node_name, ttl=self.ttl
        )
        await self._settle()

    async def _secret(self) -> str:
        etcd = self.etcd
        assert etcd is not None
        fresh = os.urandom(24).hex().encode()
        await etcd.txn([Compare.created(self.secret_key, 0)], [put_op(self.secret_key, fresh)])
        found = await etcd.get(self.secret_key)
        assert found is not None
        return found.value.decode()

    def stopService(self) -> Any:
        super().stopService()
        self.role = "stopped"
        return defer.ensureDeferred(self._stop())

    async def _stop(self) -> None:
        if self._keepalive.running:
            self._keepalive.stop()
        if self._watch is not None:
            self._watch.cancel()
        try:
            try:
                await self._stop_leading()
            finally:
                await self._stop_following()
        finally:
            if self.etcd is not None and self.lease:
                try:
                    # The leader key and this node's key go with the lease: another node takes over now.
                    await self.etcd.revoke(self.lease)
                except EtcdError as error:
                    self._log.warn("etcd: the lease could not be revoked ({error})", error=str(error))
                await self.etcd.close()
            self._pool.stop()

    # -- the lease -----------------------------------------------------------------------

    def valid(self) -> bool:
        """Whether this node's lease surely holds now (a leader confirms nothing otherwise)."""
        return time.monotonic() < self.valid_until

    async def _renew_once(self) -> None:
        etcd = self.etcd
        assert etcd is not None
        sent = time.monotonic()
        try:
            ttl = await etcd.keepalive(self.lease, timeout=self.ttl / 2)
        except EtcdError as error:
            self._log.warn("etcd: the lease could not be renewed ({error})", error=str(error))
            ttl = -1
        if ttl > 0:
            self.valid_until = max(self.valid_until, sent + ttl)
        elif ttl == 0:
            self.valid_until = 0.0
        if not self.valid():
            await self._lost_lease()
            return
        try:
            registered, _revision = await etcd.get_prefix(self.nodes_prefix)
            in_sync, _revision = await etcd.get_prefix(self.isr_prefix)
        except EtcdError:
            return
        self._registered = {kv.key[len(self.nodes_prefix) :].decode(): json.loads(kv.value) for kv in registered}
        self._in_sync = {kv.key[len(self.isr_prefix) :].decode() for kv in in_sync}

    def _renew(self) -> Any:
        if self.role == "stopped":
            return None
        if self.role == "leader" and not self.valid():
            # The lease may have run out while this process was paused: stop before anything else.
            return defer.ensureDeferred(self._lost_lease())
        return defer.ensureDeferred(self._renew_once())

    async def _lost_lease(self) -> None:
        if self.role == "stopped" or self.lease == 0:
            return
        self._log.warn("cluster node {name}: its lease in etcd ran out", name=self.node_name)
        old, self.lease = self.lease, 0
        await self._stop_leading()
        etcd = self.etcd
        assert etcd is not None
        try:
            await etcd.revoke(old)
        except EtcdError:
            pass  # it has run out, or etcd cannot be reached: either way it is over
        await self._register()
        await self._settle()

    async def _register(self) -> None:
        """Take a new lease (``cluster.lease``, in whole seconds rounded up) and put this node's
        key under it, trying again until etcd answers."""
        etcd = self.etcd
        assert etcd is not None
        while self.role != "stopped":
            try:
                self.lease, ttl = await etcd.grant(math.ceil(self.cluster.lease))
                self.ttl = float(ttl)
                self.valid_until = time.monotonic() + self.ttl
                await etcd.put(
                    self.nodes_prefix + self.node_name.encode(), json.dumps(self.addresses).encode(), self.lease
                )
                return
            except EtcdError as error:
                self._log.warn("etcd: {error}; trying again", error=str(error))
                await task.deferLater(self.reactor, 0.5, lambda: None)

    # -- roles -------------------------------------------------------------------------

    async def _settle(self) -> None:
        """Lead if the leader key is free and this node may take it; else follow who holds it."""
        if self._settling:
            return  # (the one running watches the key from what it read: no change is missed)
        self._settling = True
        try:
            while self.role != "stopped":
                etcd = self.etcd
                assert etcd is not None
                try:
                    current = await etcd.get(self.leader_key)
                    if current is None:
                        if await self._campaign():
                            return
                        continue
                    leader = json.loads(current.value)
                    if leader.get("name") == self.node_name:
                        if current.lease != self.lease:
                            # This node's earlier run: it is not running any more.
                            await etcd.txn(
                                [Compare.modified(self.leader_key, current.mod_revision)],
                                [delete_op(self.leader_key)],
                            )
                            continue
                        if self.role == "leader":
                            return
                    await self._follow(leader, current)
                    return
                except EtcdError as error:
                    self._log.warn("etcd: {error}; trying again", error=str(error))
                    await task.deferLater(self.reactor, RETRY, lambda: None)
        finally:
            self._settling = False

    async def _campaign(self) -> bool:
        """Take the leader key if it is free and this node is in the in-sync set (or the cluster
        is new); whether it did."""
        etcd = self.etcd
        assert etcd is not None
        if not self.valid():
            return False
        value = json.dumps(self.addresses).encode()
        mine = self.isr_prefix + self.node_name.encode()
        won, revision = await etcd.txn(
            [Compare.created(self.leader_key, 0), Compare.exists(mine)],
            [put_op(self.leader_key, value, self.lease)],
        )
        if not won:
            won, revision = await etcd.txn(
                [Compare.created(self.leader_key, 0), Compare.created(self.initialized_key, 0)],
                [
                    put_op(self.leader_key, value, self.lease),
                    put_op(self.initialized_key, self.node_name.encode()),
                    put_op(mine, b"1"),
                ],
            )
            if won:
                self._log.info("cluster node {name}: a new cluster", name=self.node_name)
        if not won:
            current = await etcd.get(self.leader_key)
            if current is None:
                self._log.info(
                    "cluster node {name}: not in the in-sync set; waiting for a node that is", name=self.node_name
                )
                await self._wait_for_leader()
            return False
        self._leading = KeyValue(self.leader_key, value, revision, revision, self.lease)
        return await self._lead()

    async def _wait_for_leader(self) -> None:
        """Wait until some node holds the leader key (this one may not take it)."""
        etcd = self.etcd
        assert etcd is not None
        put: defer.Deferred[None] = defer.Deferred()

        def changed(kind: str, kv: KeyValue) -> None:
            if kind == "PUT" and not put.called:
                put.callback(None)

        watch = etcd.watch(self.leader_key, changed)
        try:
            await watch.created
            if await etcd.get(self.leader_key) is None:
                # Or try again after a while: the one that may lead may never come back.
                timeout = self.reactor.callLater(5.0, lambda: None if put.called else put.callback(None))
                await put
                if timeout.active():
                    timeout.cancel()
        finally:
            watch.cancel()

    def _watch_leader(self, revision: int) -> None:
        """Settle again once the leader key changes after ``revision``."""
        if self._watch is not None:
            self._watch.cancel()
        etcd = self.etcd
        assert etcd is not None

        def changed(kind: str, kv: KeyValue) -> None:
            if watch is not self._watch or self.role == "stopped":
                return
            watch.cancel()
            self._watch = None
            if self.role == "leader":
                # Deleted or replaced: this node no longer leads, whatever its lease says.
                self._log.warn("cluster node {name}: the leader key changed; stepping down", name=self.node_name)
                self.valid_until = 0.0
                defer.ensureDeferred(self._lost_lease())
            else:
                defer.ensureDeferred(self._settle())

        def ended(_: None) -> None:
            if watch is self._watch and self.role not in ("stopped",):
                self._watch = None
                defer.ensureDeferred(self._rewatch(revision))

        watch = self._watch = etcd.watch(self.leader_key, changed, start_revision=revision + 1)
        watch.ended.addCallback(ended)
        # (a watch that could not be made has ended too: ended() makes it again)
        watch.created.addErrback(lambda failure: failure.trap(EtcdError))

    async def _rewatch(self, revision: int) -> None:
        await task.deferLater(self.reactor, RETRY, lambda: None)
        if self.role == "stopped":
            return
        try:
            current = await self.etcd.get(self.leader_key)  # type: ignore[union-attr]
        except EtcdError:
            current = None
            self._watch_leader(revision)
            return
        if current is None or current.mod_revision != revision:
            if self.role == "leader":
                self.valid_until = 0.0
                await self._lost_lease()
            else:
                await self._settle()
        else:
            self._watch_leader(revision)

    # -- what the management API and /metrics show (broker.server.clusterview) ------------

    def members(self) -> list[dict[str, Any]]:
        followers = self.replication.followers() if self.replication is not None else {}
        leader = self.leader.get("name") if self.leader is not None else None
        entries = []
        for name in sorted({*self._registered, *self._in_sync, self.node_name}):
            link = followers.get(name, {})
            entries.append(
                {
                    "name": f"postroom@{name}",
                    "type": "disc",
                    "running": name in self._registered or name == self.node_name,
                    "postroom_cluster": {
                        "role": "leader" if name == leader else "follower",
                        "in_sync": name in self._in_sync,
                        "state": link.get("state"),
                        "lag_batches": link.get("lag_batches"),
                        "lag_bytes": link.get("lag_bytes"),
                        "lag_seconds": link.get("lag_seconds"),
                    },
                }
            )
        return entries

    def figures(self) -> dict[str, Any]:
        replication = self.replication
        if replication is None:
            return {"copies": 0, "elections": self.elections, "followers": {}, "held": 0, "held_seconds": 0.0}
        followers = {
            name: {"batches": view["lag_batches"], "bytes": view["lag_bytes"], "seconds": view["lag_seconds"]}
            for name, view in replication.followers().items()
        }
        return {
            "copies": 1 + len(replication.in_sync),
            "elections": self.elections,
            "followers": followers,
            "held": replication.waits,
            "held_seconds": replication.waited,
        }

    # -- leading -------------------------------------------------------------------------

    async def _lead(self) -> bool:
        """Start the broker from this node's copy and serve; whether it could (if not, it has
        given up the lead and its place in the in-sync set)."""
        assert self._leading is not None
        self.elections += 1
        await self._stop_following()
        self.role = "leader"
        self.leader = dict(self.addresses)
        self._log.info("cluster node {name} leads; starting the broker from its data directory", name=self.node_name)
        etcd = self.etcd
        assert etcd is not None
        # Followers join the in-sync set again as they catch up with this node; before its first
        # confirm, only this node may lead next.
        keys, _revision = await etcd.get_prefix(self.isr_prefix)
        others = [kv.key for kv in keys if kv.key != self.isr_prefix + self.node_name.encode()]
        for key in others:
            await self._set_in_sync(key[len(self.isr_prefix) :].decode(), False)
        replication = Replication(
            self.reactor,
            self.node_name,
            self.data_dir,
            self.secret,
            self.cluster.min_in_sync,
            self.cluster.in_sync_timeout,
            self.cluster.confirm_timeout,
            self._set_in_sync,
            self.valid,
        )
        self.replication = replication
        leading = self._leading
        try:
            self.broker = self.make_broker(replication, self)
            self.broker.factory.leading = self.valid
            self.broker.startService()
            # Followers are served once the start is done: what they copy is what it left.
            factory: IProtocolFactory = replication
            if self._tls_server is not None:
                factory = TLSMemoryBIOFactory(self._tls_server, False, replication, clock=self.reactor)
            self._replication_port = await serverFromString(self.reactor, self.cluster.listen).listen(factory)
        except Exception as error:
            # Its copy cannot be served (a damaged log, a port taken): the nodes that were in the
            # set are put back (this one confirmed nothing), one of them leads, and this one
            # follows and copies the leader's files again.
            self._log.error(
                "cluster node {name} cannot serve ({error}); leaving the in-sync set and the lead",
                name=self.node_name,
                error=f"{error.__class__.__name__}: {error}",
            )
            await self._stop_leading()
            await etcd.txn(
                [Compare.created(self.leader_key, leading.create_revision)],
                [
                    delete_op(self.isr_prefix + self.node_name.encode()),
                    delete_op(self.leader_key),
                    *(put_op(key, b"1") for key in others),
                ],
            )
            return False
        replication.start()
        self._watch_leader(leading.mod_revision)
        return True

    async def _set_in_sync(self, name: str, member: bool) -> bool:
        """Put or delete ``name``'s key in the in-sync set, if this node still leads."""
        etcd = self.etcd
        leading = self._leading
        if etcd is None or leading is None or not self.valid():
            return False
        key = self.isr_prefix + name.encode()
        try:
            done, _revision = await etcd.txn(
                [Compare.created(self.leader_key, leading.create_revision)],
                [put_op(key, b"1") if member else delete_op(key)],
            )
        except EtcdError as error:
            self._log.warn("etcd: the in-sync set could not be written ({error})", error=str(error))
            return False
        return done

    async def _stop_leading(self) -> None:
        if self.role != "leader" and self.broker is None:
            return
        if self.role == "leader":
            self.role = "candidate"
        # The broker first, with the followers still linked: the last writes of a clean stop
        # reach them and are confirmed (a node that lost its lease confirms nothing: the gate
        # holds them), then the links.
        broker, self.broker = self.broker, None
        try:
            if broker is not None and broker.running:
                self._log.info("cluster node {name}: stopping the broker", name=self.node_name)
                await broker.stopService()
        finally:
            self._leading = None
            replication, self.replication = self.replication, None
            if replication is not None:
                replication.stop()
            port, self._replication_port = self._replication_port, None
            if port is not None:
                await port.stopListening()

    # -- following -----------------------------------------------------------------------

    async def _follow(self, leader: dict[str, Any], current: KeyValue) -> None:
        if self.role == "stopped":
            return  # (stopped while it asked etcd who leads)
        self._watch_leader(current.mod_revision)
        if self.role == "follower" and self.leader == leader and self._leader_lease == current.lease:
            return  # already following it
        await self._stop_following()
        if self.role == "stopped":
            return
        self.leader = leader
        self._leader_lease = current.lease
        self.role = "follower"
        self._log.info("cluster node {name} follows {leader}", name=self.node_name, leader=leader.get("name"))
        self._forget_local_state()
        await self._proxy(leader)
        defer.ensureDeferred(self._replicate(leader, current.lease))

    def _forget_local_state(self) -> None:
        """What only a leader's run had (its checkpoint, spool, paged bodies) goes: the data
        directory becomes a copy of the leader's (its checkpoint comes with the copy)."""
        for name in LOCAL_STATE:
            path = os.path.join(self.data_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)

    async def _proxy(self, leader: dict[str, Any]) -> None:
        for kind, endpoint in _forwarded(self.config.listen):
            target = leader.get(kind)
            if not target:
                continue
            host, _, port = str(target).rpartition(":")
            factory = LeaderProxy(host, int(port))
            try:
                listening = await serverFromString(self.reactor, with_backlog(endpoint)).listen(factory)
            except Exception as error:
                self._log.warn("cannot forward {kind} connections to the leader: {error}", kind=kind, error=str(error))
                continue
            self._proxies.append((factory, listening))

    async def _replicate(self, leader: dict[str, Any], lease: int) -> None:
        """Keep a link to ``leader`` (holding the leader key under ``lease``) while this node
        follows it.

        A leader whose link was up and whose port then refuses connections twice is not
        running (a live leader listens until it revokes its own lease): its lease is revoked,
        so that a node in the in-sync set takes over now rather than when the lease runs out.
        That is safe whatever the leader's state: a confirm needs every follower in the set,
        and this one acknowledges nothing more to it.
        """
        host, _, port = str(leader["replication"]).rpartition(":")
        linked = False
        refused = 0
        backoff = 0.0
        tls_error: str | None = None
        while self.role == "follower" and self.leader is leader:
            files = await deferToThreadPool(self.reactor, self._pool, file_index, self.data_dir)
            if not (self.role == "follower" and self.leader is leader):
                return
            link = FollowerLink(
                self.reactor,
                self.data_dir,
                self.node_name,
                self.secret,
                files,
                self._pool,
                on_refused=lambda reason: self._log.error("the leader refused this node: {reason}", reason=reason),
            )
            try:
                factory = Factory.forProtocol(lambda link=link: link)  # type: ignore[misc]
                factory.noisy = False
                endpoint: Any = TCP4ClientEndpoint(self.reactor, host, int(port), timeout=2)
                if self._tls_client is not None:
                    endpoint = wrapClientTLS(self._tls_client, endpoint)
                await endpoint.connect(factory)
            except Exception as error:
                self._log.debug("cannot reach the leader ({error})", error=str(error))
                refused = refused + 1 if isinstance(error, network.ConnectionRefusedError) else 0
                if linked and refused == 2:
                    await self._revoke_dead_leader(leader, lease)
                await task.deferLater(self.reactor, RETRY if refused == 0 else REFUSED_RETRY, lambda: None)
                continue
            linked, refused = True, 0
            self._link = link
            linked_at = self.reactor.seconds()
            await link.closed
            if self._link is link:
                self._link = None
            if link.tls_error is not None and link.tls_error != tls_error:
                self._log.error(
                    "cluster node {name}: TLS with the leader {leader} failed ({reason}); trying again",
                    name=self.node_name,
                    leader=leader.get("name"),
                    reason=link.tls_error,
                )
            if link.tls_error is not None:
                tls_error = link.tls_error
            elif link.heard:
                tls_error = None
            # (a handshake refused may also end as a plain close: it is the same failure)
            if link.write_error is not None or (tls_error is not None and not link.heard):
                # (no quicker than this, while it fails the same way)
                backoff = min(BACKOFF_MAX, backoff * 2 or 1.0)
                await task.deferLater(self.reactor, backoff, lambda: None)
                continue
            backoff = 0.0
            if self.reactor.seconds() - linked_at < 1.0:
                await task.deferLater(self.reactor, RETRY, lambda: None)  # refused, or failing: not in a loop
            # Otherwise at once: a leader that was killed refuses now, and its lease can end now.

    async def _revoke_dead_leader(self, leader: dict[str, Any], lease: int) -> None:
        etcd = self.etcd
        assert etcd is not None
        try:
            current = await etcd.get(self.leader_key)
            if current is not None and current.lease == lease:
                self._log.info(
                    "cluster node {name}: leader {leader} is not running; ending its lease",
                    name=self.node_name,
                    leader=leader.get("name"),
                )
                await etcd.revoke(lease)
        except EtcdError as error:
            self._log.debug("etcd: the dead leader's lease was not revoked ({error})", error=str(error))

    async def _stop_following(self) -> None:
        proxies, self._proxies = self._proxies, []
        for factory, listening in proxies:
            await listening.stopListening()
            factory.close_all()
        link, self._link = self._link, None
        if self.role == "follower":
            self.role = "candidate"
        if link is not None and link.transport is not None:
            link.transport.loseConnection()
            await link.closed
        # What the link's thread was applying is on disk before anything reads the files.
        await deferToThreadPool(self.reactor, self._pool, lambda: None)

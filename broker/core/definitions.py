"""Applying a configuration's definitions (users, vhosts, exchanges, queues, bindings) to a node.

Definitions are applied idempotently: declaring what already exists with the same settings
changes nothing, so the same file can be applied at every start and again by
``postroom declare -f``. A definition the broker refuses (say, a queue redeclared with other
arguments) is reported with its key path, as in the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from postroom.broker.core.dead_letter_events import header_dead_letter_id
from postroom.broker.core.message import Message
from postroom.broker.core.node import DEFAULT_VHOST_DESCRIPTION, Limits, Node
from postroom.broker.core.policy import Policy, PolicyRefused, from_value
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.stores import QueuePager, StreamStorage
from postroom.broker.core.stream import StreamQueue
from postroom.broker.core.timers import Scheduler
from postroom.broker.core.users import User
from postroom.broker.core.vhost import VirtualHost
from postroom.broker.errors import AMQPError
from postroom.broker.wal.recovery import Snapshot
from postroom.broker.wire.codec import decode_field_table, shortstr
from postroom.config.schema import BrokerConfig, ExchangeConfig, QueueConfig, UserConfig, VhostConfig
from postroom.config.shovels import COMPONENT as SHOVEL
from postroom.config.values import ConfigError, Problem
from postroom.exchanges.registry import ExchangeTypeRegistry, default_registry

if TYPE_CHECKING:
    from postroom.broker.core.hooks import HookChain
    from postroom.broker.core.journal import Journal

_log = Logger()


def node_from_config(
    config: BrokerConfig,
    clock: Scheduler | None = None,
    journal: Journal | None = None,
    snapshot: Snapshot | None = None,
    read: Callable[[int, int, int], bytes] | None = None,
    registry: ExchangeTypeRegistry | None = None,
    hooks: HookChain | None = None,
    authenticators: Sequence[Any] = (),
    pager: QueuePager | None = None,
    before_messages: Callable[[Node], None] | None = None,
    streams: StreamStorage | None = None,
) -> Node:
    """A node with the configuration's limits, users and virtual hosts.

    With a ``journal``, durable state is recorded from now on; a ``snapshot`` (what the log
    held at start) is restored first, then the configuration's definitions are applied on
    top (declaring what already exists changes nothing). Policies come first, so that
    everything is declared under them: the recorded ones, then the configuration's (which
    replace recorded ones of the same name, as a RabbitMQ definitions import at boot does).

    :param registry: the exchange types, with those of the enabled plugins (built-ins only by default)
    :param hooks: the plugins' message hooks (``None``: none)
    :param authenticators: the plugins' authentication backends
    :param pager: pages and spools deep queues (``broker.storage.body_paging.Pager``), from before the
        messages are restored: a queue recovered deeper than its window spools the rest
    :param before_messages: called once the ``snapshot``'s topology is declared, before its
        messages are restored (a checkpoint's queues take their records then)
    :param streams: where stream queues keep their messages (``broker.storage.streams.StreamFiles``)

    :raises ConfigError: a definition was refused by the broker.
    """
    limits = config.limits
    node = Node(
        users=(),
        auth_mechanisms=config.auth_mechanisms,
        vhost_names=(),
        limits=Limits(
            frame_max=limits.frame_max,
            channel_max=limits.channel_max,
            heartbeat=limits.heartbeat,
            max_message_bytes=limits.max_message_bytes,
            max_connections=limits.max_connections,
            consumer_max_per_channel=limits.consumer_max_per_channel,
        ),
        clock=clock,
        registry=registry or default_registry(),
        hooks=hooks,
        authenticators=tuple(authenticators),
    )
    if journal is not None:
        node.set_journal(journal)
    if pager is not None:
        node.set_pager(pager)
    if streams is not None:
        node.set_streams(streams)
    initialised = False
    if snapshot is not None:
        _check_exchange_types(node, snapshot, config.source)
        initialised = node.admin.restore(snapshot.definitions.values(), lambda text: _log.warn("{text}", text=text))
    apply_accounts(node, config, initialised)
    if snapshot is not None:
        restore_policies(node, snapshot)
    apply_policies(node, config)
    apply_parameters(node, config)
    if snapshot is not None:
        restore_snapshot(node, snapshot, read, before_messages)
    apply_definitions(node, config)
    if not initialised:
        node.admin.initialise()
    return node


def config_user(user: UserConfig) -> User:
    """The user a configuration describes."""
    return User(
        user.name,
        password=user.password,
        password_hash=user.password_hash,
        loopback_only=user.loopback_only,
        permissions=user.permissions,
        topic_permissions=user.topic_permissions,
        tags=tuple(user.tags),
        max_connections=user.limits.max_connections,
        max_channels=user.limits.max_channels,
    )


def apply_accounts(node: Node, config: BrokerConfig, initialised: bool, imported: bool = False) -> None:
    """Apply the configuration's vhosts and users over what the log held, as RabbitMQ applies
    its definitions file at boot: a vhost it lists is created when missing; a user it lists is
    set as it says (password, tags, limits, permissions), replacing the stored one; what it does
    not list stays as stored. Sections left at their embedded defaults (guest, vhost ``/``)
    apply on the first start only (``initialised``: the log held definitions already).

    :param imported: a definitions import at run time (``POST /api/definitions``): a user it
        lists keeps the permissions it has on vhosts the document does not grant, as RabbitMQ's
        import only adds permissions
    """
    if not initialised and "/" in config.vhosts:
        node.admin.put_vhost("/", DEFAULT_VHOST_DESCRIPTION)  # (RabbitMQ's, on a fresh node)
    if not (initialised and "vhosts" in config.defaulted):
        for name in config.vhosts:
            node.admin.put_vhost(name)
    if not (initialised and "users" in config.defaulted):
        for user in config.users:
            wanted, old = config_user(user), node.users_by_name.get(user.name)
            if imported and old is not None:
                granted = {**node.admin.granted(old), **(wanted.permissions or {})}
                topics = {**(old.topic_permissions or {}), **(wanted.topic_permissions or {})}
                wanted = replace(wanted, permissions=granted, topic_permissions=topics or None)
            node.admin.put_user(wanted)


def _check_exchange_types(node: Node, snapshot: Snapshot, source: str) -> None:
    """Refuse to start when the log holds exchanges of a type no enabled plugin provides.

    :raises ConfigError: naming each such exchange and its type.
    """
    known = set(node.registry.names())
    problems = [
        Problem(
            None,
            "plugins",
            f"the write-ahead log holds durable exchange '{exchange.name}' in vhost '{exchange.vhost}' of type "
            f"'{exchange.type}', which no enabled plugin provides; enable the plugin that does",
        )
        for exchange in snapshot.exchanges.values()
        if exchange.type not in known
    ]
    if problems:
        raise ConfigError(source, problems)


def apply_policies(node: Node, config: BrokerConfig) -> None:
    """Set the configuration's policies and operator policies on ``node`` (recorded, like
    policies set at run time; setting one unchanged records nothing)."""
    for vhost_name, definitions in config.vhosts.items():
        vhost = _vhost(node, vhost_name)
        for policies, operator in ((definitions.policies, False), (definitions.operator_policies, True)):
            for policy in policies:
                vhost.set_policy(
                    Policy(policy.name, policy.pattern, policy.definition, policy.priority, policy.apply_to), operator
                )


def apply_parameters(node: Node, config: BrokerConfig) -> None:
    """Set the configuration's runtime parameters (its shovels) on ``node``: over what the log
    holds, as the YAML's users are (one it lists is as it says, one it leaves out stays)."""
    for vhost_name, definitions in config.vhosts.items():
        _vhost(node, vhost_name)
        for shovel in definitions.shovels:
            node.admin.set_parameter(SHOVEL, vhost_name, shovel.name, shovel.value)


def apply_definitions(node: Node, config: BrokerConfig) -> None:
    """Declare the configuration's exchanges, queues and bindings on ``node`` (its policies
    are :func:`apply_policies`'s).

    :raises ConfigError: the broker refused a definition (each problem names its key path).
    """
    problems: list[Problem] = []
    for vhost_name, definitions in config.vhosts.items():
        vhost = _vhost(node, vhost_name)
        problems += _apply_vhost(vhost, definitions, f"vhosts.{vhost_name}")
        # After the definitions: the limits bound what clients declare and open. A limit the
        # file leaves out keeps the value stored (set at run time).
        for limit, value in (
            ("max-connections", definitions.limits.max_connections),
            ("max-queues", definitions.limits.max_queues),
        ):
            if value is not None:
                node.admin.set_vhost_limit(vhost_name, limit, value)
    if problems:
        raise ConfigError(config.source, problems)


def _apply_vhost(vhost: VirtualHost, definitions: VhostConfig, path: str) -> list[Problem]:
    problems = []
    for where, item in definitions.declarations(path):
        try:
            if isinstance(item, ExchangeConfig):
                vhost.declare_exchange(item.name, item.type, **item.options())
            elif isinstance(item, QueueConfig):
                vhost.declare_queue(item.name, None, **item.options())
            elif item.queue is not None:
                vhost.bind_queue(item.queue, item.exchange, item.routing_key, item.arguments, None)
            else:
                assert item.destination_exchange is not None
                vhost.bind_exchange(item.destination_exchange, item.exchange, item.routing_key, item.arguments)
        except AMQPError as error:
            problems.append(_refused(where, error))
    return problems


def _refused(path: str, error: AMQPError) -> Problem:
    return Problem(None, path, f"refused by the broker: {error.reply_text}")


def restore_policies(node: Node, snapshot: Snapshot) -> None:
    """Set the policies the log holds, recording nothing. One this version refuses (none it
    wrote) is left out with a warning naming it and why."""
    journal = node.journal
    if journal is not None:
        journal.replaying = True
    try:
        for (vhost_name, operator, name), record in snapshot.policies.items():
            try:
                policy = from_value(name, json.loads(record.value.decode("utf-8", "surrogateescape")), operator)
            except (ValueError, PolicyRefused) as error:
                _log.warn(
                    "the write-ahead log holds {kind} '{name}' in vhost '{vhost}', which is not set: {error}",
                    kind="operator policy" if operator else "policy",
                    name=name,
                    vhost=vhost_name,
                    error=str(error),
                )
                continue
            _vhost(node, vhost_name).set_policy(policy, operator)
    finally:
        if journal is not None:
            journal.replaying = False


def restore_snapshot(
    node: Node,
    snapshot: Snapshot,
    read: Callable[[int, int, int], bytes] | None = None,
    before_messages: Callable[[Node], None] | None = None,
) -> int:
    """Rebuild the durable state a log described: topology first, then each queue's messages.

    Nothing is recorded again while restoring. Recovered messages are marked redelivered
    (a consumer may have seen them before the restart), keep their delivery counts, and keep
    their TTL counted from when they were first published.

    :param read: reads bytes back from a log segment, so recovered bodies can be paged out
    :param before_messages: called once the topology is declared, before the messages
    :returns: the number of messages restored (one per queue holding it)
    """
    journal = node.journal
    if journal is not None:
        journal.replaying = True
    try:
        for (vhost_name, _name), exchange in snapshot.exchanges.items():
            _vhost(node, vhost_name).declare_exchange(
                exchange.name,
                exchange.type,
                durable=True,
                auto_delete=exchange.auto_delete,
                internal=exchange.internal,
                arguments=decode_field_table(exchange.arguments),
            )
        for (vhost_name, _name), queue in snapshot.queues.items():
            declared = _vhost(node, vhost_name).declare_queue(
                queue.name,
                None,
                durable=True,
                auto_delete=queue.auto_delete,
                arguments=decode_field_table(queue.arguments),
            )
            if isinstance(declared, StreamQueue):
                offsets = snapshot.stream_offsets.get((vhost_name, queue.name), {})
                declared.recover_offsets(offsets)
        for binding in snapshot.bindings.values():
            vhost = _vhost(node, binding.vhost)
            arguments = decode_field_table(binding.arguments)
            if binding.destination_is_queue:
                vhost.bind_queue(binding.destination, binding.source, binding.routing_key, arguments, None)
            else:
                vhost.bind_exchange(binding.destination, binding.source, binding.routing_key, arguments)
        if before_messages is not None:
            before_messages(node)
        messages: dict[int, Message] = {}
        restored = 0
        for (vhost_name, queue_name), stored in snapshot.messages.items():
            into = _vhost(node, vhost_name).queues.get(queue_name)
            if not isinstance(into, WorkQueue):
                continue  # (gone; a stream keeps its messages itself)
            for message_id, item in sorted(stored.items()):
                spool = into.ready.spool
                if spool is not None and not spool.waiting and item.start and item.segment and journal is not None:
                    # Behind the window: a record pointing at the log, no object.
                    into.restore_spooled(item)
                    journal.ledger.restored_spooled(item.segment)
                    restored += 1
                    dead_letter = header_dead_letter_id(item.record.header)
                    if dead_letter is not None:  # known by its id when it comes back
                        node.recovered_dead_letters[queue_name] += 1
                    continue
                message = messages.get(message_id)
                if message is None:
                    record = item.record
                    message = Message(
                        record.exchange,
                        record.routing_key,
                        shortstr(record.exchange) + shortstr(record.routing_key),
                        record.header,
                        record.body,
                    )
                    message.wal_id = message_id
                    message.wal_start = item.start
                    messages[message_id] = message
                if journal is not None:
                    journal.restored(
                        message,
                        item.segment,
                        vhost_name,
                        queue_name,
                        item.delivery_count,
                        (read, item.end) if read is not None else None,
                    )
                into.restore(message, item.delivery_count, item.record.timestamp)
                restored += 1
        return restored
    finally:
        if journal is not None:
            journal.replaying = False


def _vhost(node: Node, name: str) -> VirtualHost:
    vhost = node.vhosts.get(name)
    if vhost is None:
        vhost = node.add_vhost(name)
    return vhost

"""Applying a configuration's definitions (users, vhosts, exchanges, queues, bindings) to a node.

Definitions are applied idempotently: declaring what already exists with the same settings
changes nothing, so the same file can be applied at every start and again by
``postroom declare -f``. A definition the broker refuses (say, a queue redeclared with other
arguments) is reported with its key path, as in the file.
"""

from __future__ import annotations

from broker.core.node import Limits, Node, Scheduler, User
from broker.core.vhost import VirtualHost
from broker.errors import AMQPError
from config.loader import ConfigError, Problem
from config.schema import BrokerConfig, VhostConfig


def node_from_config(config: BrokerConfig, clock: Scheduler | None = None) -> Node:
    """A node with the configuration's limits, users and virtual hosts, definitions applied.

    :raises ConfigError: a definition was refused by the broker.
    """
    limits = config.limits
    users = [
        User(
            user.name,
            password=user.password,
            password_hash=user.password_hash,
            loopback_only=user.loopback_only,
            vhosts=frozenset(user.permissions) if user.permissions is not None else None,
        )
        for user in config.users
    ]
    node = Node(
        users=users,
        vhost_names=tuple(config.vhosts),
        limits=Limits(
            frame_max=limits.frame_max,
            channel_max=limits.channel_max,
            heartbeat=limits.heartbeat,
            max_message_bytes=limits.max_message_bytes,
        ),
        clock=clock,
    )
    apply_definitions(node, config)
    return node


def apply_definitions(node: Node, config: BrokerConfig) -> None:
    """Declare the configuration's exchanges, queues and bindings on ``node``.

    :raises ConfigError: the broker refused a definition (each problem names its key path).
    """
    problems: list[Problem] = []
    for vhost_name, definitions in config.vhosts.items():
        vhost = node.vhosts.get(vhost_name)
        if vhost is None:
            vhost = node.vhosts[vhost_name] = VirtualHost(vhost_name, node.registry, node.rng, node.clock)
            vhost.on_backlog = node.note_backlog
        problems += _apply_vhost(vhost, definitions, f"vhosts.{vhost_name}")
    if problems:
        raise ConfigError(config.source, problems)


def _apply_vhost(vhost: VirtualHost, definitions: VhostConfig, path: str) -> list[Problem]:
    problems = []
    for index, exchange in enumerate(definitions.exchanges):
        try:
            vhost.declare_exchange(
                exchange.name,
                exchange.type,
                durable=exchange.durable,
                auto_delete=exchange.auto_delete,
                internal=exchange.internal,
                arguments=exchange.arguments,
            )
        except AMQPError as error:
            problems.append(_refused(f"{path}.exchanges[{index}]", error))
    for index, queue in enumerate(definitions.queues):
        try:
            vhost.declare_queue(
                queue.name,
                None,
                durable=queue.durable,
                auto_delete=queue.auto_delete,
                arguments=queue.queue_arguments(),
            )
        except AMQPError as error:
            problems.append(_refused(f"{path}.queues[{index}]", error))
    for index, binding in enumerate(definitions.bindings):
        try:
            if binding.queue is not None:
                vhost.bind_queue(binding.queue, binding.exchange, binding.routing_key, binding.arguments, None)
            else:
                assert binding.destination_exchange is not None
                vhost.bind_exchange(
                    binding.destination_exchange, binding.exchange, binding.routing_key, binding.arguments
                )
        except AMQPError as error:
            problems.append(_refused(f"{path}.bindings[{index}]", error))
    return problems


def _refused(path: str, error: AMQPError) -> Problem:
    return Problem(None, path, f"refused by the broker: {error.reply_text}")

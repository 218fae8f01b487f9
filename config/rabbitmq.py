"""Reading a RabbitMQ definitions export (``rabbitmqctl export_definitions``, ``GET /api/definitions``).

The export becomes the same :class:`BrokerConfig` a YAML file gives, so ``postroom serve
--config``, ``postroom config check`` and ``postroom declare -f`` apply it the way they apply
YAML definitions. Mapped:

* ``vhosts``; ``users`` with RabbitMQ's salted password hashes (``rabbit_password_hashing_sha256``,
  ``_sha512`` and ``_md5``: ``base64(salt + hash(salt + password))`` with a 4-byte salt), kept
  as ``rabbitmq-sha256$<base64>`` (``broker.core.node.User`` checks them); ``guest`` is
  loopback-only, as in RabbitMQ's default ``loopback_users``;
* ``permissions`` (configure/write/read regular expressions): a user with none has no vhost,
  as in RabbitMQ;
* ``exchanges`` (type, durable, auto_delete, internal, arguments); ``queues`` with their
  arguments (``x-message-ttl``, ``x-expires``, ``x-dead-letter-*``, ``x-max-length``,
  ``x-max-length-bytes``, ``x-overflow``, ``x-delivery-limit``, ``x-max-priority``,
  ``x-single-active-consumer``);
  ``bindings`` to queues and to exchanges;
* ``policies`` and operator policies (``parameters`` of component ``operator_policy``, where
  RabbitMQ 3.10 exports them), with the keys Postroom applies (``broker.core.policy``); other
  keys are noted.

What has no equivalent is not dropped silently: every such item becomes a note,
``FILE: key.path: reason``, in :attr:`BrokerConfig.notes`, and the rest is applied. Quorum
queues are declared as classic queues, stream queues as streams (with the arguments streams
take); a direct exchange with ``x-super-stream: true`` (a super stream's) routes by a hash of
the routing key (``exchanges.partitions``); runtime and global parameters (shovels,
federation) are not applied; an exchange
of an unknown type is skipped with the bindings that need it, and so is a binding to an
exchange or queue the file does not declare. Malformed JSON or values of the
wrong type raise :class:`ConfigError` naming the file, the key path and the reason.

Items without a ``vhost`` key (an export of one vhost) belong to ``/``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from postroom.config.policies import KEYS, OPERATOR_KEYS, check_apply_to, check_pattern, check_priority, validate
from postroom.config.reader import BUILTIN_EXCHANGE_TYPES, STANDARD_EXCHANGES, Reader
from postroom.config.schema import (
    BindingConfig,
    BrokerConfig,
    DeadLetterConfig,
    ExchangeConfig,
    Permission,
    PolicyConfig,
    QueueConfig,
    ShovelConfig,
    TopicPermission,
    UserConfig,
    UserLimits,
    VhostConfig,
    VhostLimits,
)
from postroom.config.shovels import validate as validate_shovel
from postroom.config.values import ConfigError, Problem, is_list

#: RabbitMQ's ``hashing_algorithm`` values and the ``password_hash`` prefix each becomes, with
#: the digest size: the hash is ``base64(salt[4] + digest(salt + utf8 password))``.
HASHING_ALGORITHMS = {
    "rabbit_password_hashing_sha256": ("rabbitmq-sha256", 32),
    "rabbit_password_hashing_sha512": ("rabbitmq-sha512", 64),
    "rabbit_password_hashing_md5": ("rabbitmq-md5", 16),
}
#: Exchange types of Postroom's bundled plugins (the broker needs the plugin enabled).
PLUGIN_EXCHANGE_TYPES = frozenset({"x-delayed-message", "x-consistent-hash"})
#: What a permission pattern that Python's ``re`` cannot compile is refused with.
_UNUSABLE_PATTERN = "not a regular expression Postroom can use"
#: Top-level keys of an export that say which broker wrote it and mean nothing to apply.
_INFORMATIVE = frozenset({"rabbit_version", "rabbitmq_version", "product_name", "product_version"})
#: Queue arguments with no equivalent, and why (anything else unknown gets a generic reason).
_UNSUPPORTED_ARGUMENTS = {
    "x-queue-mode": "lazy mode is what Postroom does anyway beyond storage.memory_budget",
    "x-queue-version": "Postroom has one storage format",
    "x-queue-master-locator": "Postroom runs on one node",
    "x-queue-leader-locator": "Postroom runs on one node",
    "x-quorum-initial-group-size": "Postroom runs on one node",
    "x-quorum-target-group-size": "Postroom runs on one node",
    "x-initial-cluster-size": "Postroom runs on one node",
    "x-ha-policy": "Postroom runs on one node",
    "x-dead-letter-strategy": "dead-lettering is at most once, as in classic queues",
    "x-max-in-memory-length": "bodies beyond storage.memory_budget stay on disk instead",
    "x-max-in-memory-bytes": "bodies beyond storage.memory_budget stay on disk instead",
    "x-max-age": "retention by age is for stream queues",
    "x-stream-max-segment-size-bytes": "segments are for stream queues",
    "x-stream-filter-size-bytes": "stream filtering came after RabbitMQ 3.10",
}
#: The arguments a stream queue of an export keeps (RabbitMQ 3.10's, which the broker checks).
_STREAM_ARGUMENTS = frozenset(
    {
        "x-max-length-bytes",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    }
)


def is_definitions_json(path: str, text: str) -> bool:
    """Whether a configuration file is a JSON definitions export (by extension or content)."""
    return path.lower().endswith(".json") or text.lstrip().startswith("{")


def loads_definitions(text: str, source: str = "<string>") -> BrokerConfig:
    """Read a RabbitMQ definitions export given as JSON text.

    :raises ConfigError: the text is not JSON, not an object, or holds values of the wrong type.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(source, [Problem(err.lineno, "", f"not valid JSON: {err.msg} (column {err.colno})")]) from err
    if not isinstance(document, dict):
        raise ConfigError(source, [Problem(None, "", "must be a JSON object (a RabbitMQ definitions export)")])
    definitions = _Definitions(source)
    config = definitions.build(document)
    if definitions.reader.problems:
        raise ConfigError(source, definitions.reader.problems)
    return config


class _Definitions:
    """Turns an export's lists into the schema's per-vhost definitions, noting what cannot apply."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.reader = Reader(source)
        self.notes: list[str] = []
        self.vhosts: dict[str, dict[str, Any]] = {}
        self.skipped: set[tuple[str, str, str]] = set()  # (kind, vhost, name)

    def note(self, path: str, reason: str) -> None:
        self.notes.append(f"{self.source}: {path}: {reason}")

    def items(self, document: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
        """``(path, item)`` for each object of the list at ``key``; other entries are problems."""
        result = []
        for index, item in enumerate(self.reader.typed(document.get(key), key, is_list, "a list", [])):
            path = f"{key}[{index}]"
            if isinstance(item, dict):
                result.append((path, item))
            else:
                self.reader.problem(path, f"must be an object, not {type(item).__name__}")
        return result

    def vhost(self, item: dict[str, Any], path: str) -> dict[str, Any]:
        name = self.reader.name(item.get("vhost", "/"), f"{path}.vhost")
        return self.vhosts.setdefault(name, _new_vhost())

    def build(self, document: dict[str, Any]) -> BrokerConfig:
        handled = {"vhosts", "users", "permissions", "topic_permissions", "policies", "parameters"}
        handled |= {"global_parameters", "exchanges", "queues", "bindings"}
        for key in document:
            if key not in handled | _INFORMATIVE:
                self.note(key, "unknown key: ignored")
        for path, item in self.items(document, "vhosts"):
            self.vhost_entry(item, path)
        for path, item in self.items(document, "exchanges"):
            self.exchange(item, path)
        for path, item in self.items(document, "queues"):
            self.queue(item, path)
        for path, item in self.items(document, "bindings"):
            self.binding(item, path)
        users = self.users(document) if "users" in document else BrokerConfig().users
        self.unsupported(document)
        vhosts = {
            name: VhostConfig(
                tuple(lists["exchanges"]),
                tuple(lists["queues"]),
                tuple(lists["bindings"]),
                VhostLimits(**self.limits_of(lists["limits"], lists["limits_path"], ("connections", "queues"))),
                tuple(lists["policies"]),
                tuple(lists["operator_policies"]),
                shovels=tuple(lists["shovels"]),
            )
            for name, lists in self.vhosts.items()
        } or {"/": VhostConfig()}
        return BrokerConfig(
            users=users,
            vhosts=vhosts,
            source=self.source,
            notes=tuple(self.notes),
            defaulted=frozenset({"users"} - set(document)) | frozenset({"vhosts"} if not self.vhosts else ()),
        )

    def vhost_entry(self, item: dict[str, Any], path: str) -> None:
        name = self.reader.name(item.get("name"), f"{path}.name")
        entry = self.vhosts.setdefault(name, _new_vhost())
        if item.get("limits"):  # a vhost-limits parameter, read later, takes its place
            entry["limits"] = item["limits"]
            entry["limits_path"] = f"{path}.limits"
        metadata = item.get("metadata")
        queue_type = metadata.get("default_queue_type") if isinstance(metadata, dict) else None
        if queue_type not in (None, "classic", "undefined"):
            self.note(
                f"{path}.metadata.default_queue_type", f"{queue_type} queues have no equivalent: queues are classic"
            )

    # -- users ----------------------------------------------------------------------------------

    def users(self, document: dict[str, Any]) -> tuple[UserConfig, ...]:
        read = self.reader
        entries: dict[str, dict[str, Any]] = {}
        refused: set[str] = set()
        for path, item in self.items(document, "users"):
            name = read.name(item.get("name"), f"{path}.name")
            tags = item.get("tags") or []
            tags = [tag for tag in tags.split(",") if tag] if isinstance(tags, str) else tags
            entry = self.credentials(item, path, name)
            if entry is None:
                refused.add(name)
                continue
            entry["tags"] = tuple(str(tag) for tag in tags)
            entry["limits"] = UserLimits(
                **self.limits_of(item.get("limits") or {}, f"{path}.limits", ("connections", "channels"))
            )
            entries[name] = entry
        for path, item in self.items(document, "permissions"):
            user = read.name(item.get("user"), f"{path}.user")
            vhost = read.name(item.get("vhost"), f"{path}.vhost")
            if user not in entries:
                reason = "was not created (see above)" if user in refused else "is not in this file"
                self.note(path, f"user '{user}' {reason}: permissions ignored")
                continue
            if vhost not in self.vhosts:
                read.problem(f"{path}.vhost", f"no vhost '{vhost}' is in this file")
                continue
            patterns = read.patterns(item, path, ("configure", "write", "read"), "", _UNUSABLE_PATTERN)
            entries[user]["permissions"][vhost] = Permission(**patterns)
        for path, item in self.items(document, "topic_permissions"):
            user = read.name(item.get("user"), f"{path}.user")
            vhost = read.name(item.get("vhost"), f"{path}.vhost")
            exchange = read.string(item.get("exchange"), f"{path}.exchange", "")
            if user not in entries:
                reason = "was not created (see above)" if user in refused else "is not in this file"
                self.note(path, f"user '{user}' {reason}: topic permissions ignored")
                continue
            if vhost not in self.vhosts:
                read.problem(f"{path}.vhost", f"no vhost '{vhost}' is in this file")
                continue
            patterns = read.patterns(item, path, ("write", "read"), "", _UNUSABLE_PATTERN)
            topics = entries[user].setdefault("topic_permissions", {})
            topics.setdefault(vhost, {})[exchange] = TopicPermission(**patterns)
        return tuple(UserConfig(**entry) for entry in entries.values())

    def limits_of(self, limits: Any, path: str, kinds: tuple[str, ...]) -> dict[str, int | None]:
        """RabbitMQ's ``{"max-connections": N, ...}`` as keyword arguments (negative: none);
        a limit Postroom does not have is noted."""
        result: dict[str, int | None] = {}
        if not isinstance(limits, dict):
            self.reader.problem(path, "must be a mapping")
            return result
        for key, value in limits.items():
            if key not in {f"max-{kind}" for kind in kinds}:
                self.note(f"{path}.{key}", f"limit '{key}' has no equivalent: ignored")
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                self.reader.problem(f"{path}.{key}", f"must be an integer, not {value!r}")
                continue
            result[key.replace("-", "_")] = max(value, -1)
        return result

    def credentials(self, item: dict[str, Any], path: str, name: str) -> dict[str, Any] | None:
        """The user's fields for :class:`UserConfig`, or ``None`` (noted) when it cannot log in here."""
        entry: dict[str, Any] = {"name": name, "loopback_only": name == "guest", "permissions": {}}
        if item.get("password") is not None:  # hand-written definitions may give it in clear
            entry["password"] = self.reader.string(item["password"], f"{path}.password", "")
            return entry
        stored = self.reader.string(item.get("password_hash"), f"{path}.password_hash", "")
        if not stored:
            self.note(
                f"{path}.password_hash",
                f"user '{name}' has no password (RabbitMQ lets it log in only by other means): "
                "not created; give it a password",
            )
            return None
        # Exports before RabbitMQ 3.6 carry no algorithm: their hashes are MD5.
        algorithm = self.reader.string(item.get("hashing_algorithm"), f"{path}.hashing_algorithm", "")
        algorithm = algorithm or "rabbit_password_hashing_md5"
        if algorithm not in HASHING_ALGORITHMS:
            self.note(
                f"{path}.hashing_algorithm",
                f"'{algorithm}' hashes cannot be checked: user '{name}' not created; give it a password",
            )
            return None
        prefix, digest_size = HASHING_ALGORITHMS[algorithm]
        try:
            raw = base64.b64decode(stored, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 4 + digest_size:
            self.note(
                f"{path}.password_hash",
                f"not a {algorithm} hash (base64 of a 4-byte salt and the digest): "
                f"user '{name}' not created; give it a password",
            )
            return None
        entry["password_hash"] = f"{prefix}${stored}"
        return entry

    # -- topology -------------------------------------------------------------------------------

    def exchange(self, item: dict[str, Any], path: str) -> None:
        read = self.reader
        lists = self.vhost(item, path)
        vhost = read.name(item.get("vhost", "/"), f"{path}.vhost")
        name = read.name(item.get("name"), f"{path}.name")
        exchange_type = read.string(item.get("type"), f"{path}.type", "direct")
        if name == "" or name.startswith("amq."):
            self.note(f"{path}.name", f"exchange '{name}' is built in: skipped")
            return
        if exchange_type not in BUILTIN_EXCHANGE_TYPES | PLUGIN_EXCHANGE_TYPES:
            self.note(
                f"{path}.type",
                f"unknown exchange type '{exchange_type}': exchange '{name}' and the bindings that need it are skipped",
            )
            self.skipped.add(("exchange", vhost, name))
            return
        lists["exchanges"].append(
            ExchangeConfig(
                name,
                exchange_type,
                durable=read.boolean(item.get("durable"), f"{path}.durable", True),
                auto_delete=read.boolean(item.get("auto_delete"), f"{path}.auto_delete", False),
                internal=read.boolean(item.get("internal"), f"{path}.internal", False),
                arguments=read.table(item.get("arguments"), f"{path}.arguments"),
            )
        )

    def queue(self, item: dict[str, Any], path: str) -> None:
        read = self.reader
        lists = self.vhost(item, path)
        name = read.name(item.get("name"), f"{path}.name")
        if name.startswith("amq."):
            self.note(f"{path}.name", f"queue '{name}' has a server-generated name: skipped")
            self.skipped.add(("queue", read.name(item.get("vhost", "/"), f"{path}.vhost"), name))
            return
        arguments = read.table(item.get("arguments"), f"{path}.arguments")
        where = f"{path}.arguments"
        queue_type = arguments.pop("x-queue-type", None)
        type_path = f"{where}.x-queue-type"
        if queue_type is None and "type" in item:  # RabbitMQ 3.13+ also exports it beside the arguments
            queue_type, type_path = item["type"], f"{path}.type"
        if queue_type == "stream":
            self.stream(name, arguments, where, lists)
            return
        if queue_type not in (None, "classic"):
            self.note(type_path, f"{queue_type} queues have no equivalent: '{name}' is declared as a classic queue")

        def milliseconds(key: str, minimum: int) -> float | None:
            value = read.integer(arguments.pop(key, None), f"{where}.{key}", None, minimum)
            return value / 1000 if value is not None else None

        message_ttl = milliseconds("x-message-ttl", 0)
        expires = milliseconds("x-expires", 1)
        visibility = milliseconds("x-visibility-timeout", 1)
        dead_letter = None
        exchange = arguments.pop("x-dead-letter-exchange", None)
        routing_key = arguments.pop("x-dead-letter-routing-key", None)
        if exchange is not None:
            dead_letter = DeadLetterConfig(
                read.string(exchange, f"{where}.x-dead-letter-exchange", ""),
                read.string(routing_key, f"{where}.x-dead-letter-routing-key"),
            )
        elif routing_key is not None:
            self.note(f"{where}.x-dead-letter-routing-key", "ignored without x-dead-letter-exchange, as in RabbitMQ")
        overflow = read.string(arguments.pop("x-overflow", None), f"{where}.x-overflow")
        if overflow is not None and overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
            read.problem(
                f"{where}.x-overflow", f"must be drop-head, reject-publish or reject-publish-dlx, not {overflow!r}"
            )
            overflow = None
        settings = {
            "max_length": read.integer(arguments.pop("x-max-length", None), f"{where}.x-max-length", None),
            "max_length_bytes": read.integer(
                arguments.pop("x-max-length-bytes", None), f"{where}.x-max-length-bytes", None
            ),
            "max_deliveries": read.integer(arguments.pop("x-delivery-limit", None), f"{where}.x-delivery-limit", None),
            "max_priority": read.integer(
                arguments.pop("x-max-priority", None), f"{where}.x-max-priority", None, 0, 255
            ),
            "single_active_consumer": read.boolean(
                arguments.pop("x-single-active-consumer", None), f"{where}.x-single-active-consumer", False
            ),
        }
        for key in sorted(arguments):
            reason = _UNSUPPORTED_ARGUMENTS.get(key, "not an argument Postroom knows")
            self.note(f"{where}.{key}", f"no equivalent ({reason}): not applied")
        lists["queues"].append(
            QueueConfig(
                name,
                durable=read.boolean(item.get("durable"), f"{path}.durable", True),
                auto_delete=read.boolean(item.get("auto_delete"), f"{path}.auto_delete", False),
                visibility_timeout=visibility,
                dead_letter=dead_letter,
                message_ttl=message_ttl,
                overflow=overflow,
                expires=expires,
                **settings,
            )
        )

    def stream(self, name: str, arguments: dict[str, Any], where: str, lists: dict[str, Any]) -> None:
        """A stream queue of the export: declared as a stream with the arguments streams take
        (the broker checks them as RabbitMQ does); those of other queue types are left out, each
        with a note."""
        kept: dict[str, Any] = {"x-queue-type": "stream"}
        for key in sorted(arguments):
            if key in _STREAM_ARGUMENTS:
                kept[key] = arguments[key]
            else:
                self.note(f"{where}.{key}", "not an argument of stream queues: not applied")
        lists["queues"].append(QueueConfig(name, arguments=kept))

    def binding(self, item: dict[str, Any], path: str) -> None:
        read = self.reader
        lists = self.vhost(item, path)
        vhost = read.name(item.get("vhost", "/"), f"{path}.vhost")
        source = read.name(item.get("source"), f"{path}.source")
        destination = read.name(item.get("destination"), f"{path}.destination")
        kind = read.string(item.get("destination_type"), f"{path}.destination_type", "queue")
        if kind not in ("queue", "exchange"):
            read.problem(f"{path}.destination_type", f"must be queue or exchange, not {kind!r}")
            return
        if source == "":
            self.note(path, f"bindings from the default exchange are implicit: '{destination}' skipped")
            return
        for needed_kind, needed in (("exchange", source), (kind, destination)):
            if (needed_kind, vhost, needed) in self.skipped:
                self.note(
                    path, f"binding from '{source}' to {kind} '{destination}' skipped with {needed_kind} '{needed}'"
                )
                return
            declared = {item.name for item in lists[f"{needed_kind}s"]}
            if needed_kind == "exchange":
                declared |= STANDARD_EXCHANGES
            if needed not in declared:
                # An export is whole; declaring this would fail and stop the rest (a 404).
                self.note(
                    path,
                    f"binding from '{source}' to {kind} '{destination}' skipped: "
                    f"no {needed_kind} '{needed}' in vhost '{vhost}' in this file",
                )
                return
        lists["bindings"].append(
            BindingConfig(
                exchange=source,
                queue=destination if kind == "queue" else None,
                destination_exchange=destination if kind == "exchange" else None,
                routing_key=read.string(item.get("routing_key"), f"{path}.routing_key", ""),
                arguments=read.table(item.get("arguments"), f"{path}.arguments"),
            )
        )

    # -- what has no equivalent -----------------------------------------------------------------

    def policy(self, item: dict[str, Any], path: str, operator: bool, vhost_item: dict[str, Any]) -> None:
        """A policy (``operator``: an operator policy's parameter, whose fields are in its
        ``value``): the keys Postroom has are applied, the others noted."""
        read = self.reader
        name = read.name(item.get("name"), f"{path}.name")
        if operator:
            path, item = f"{path}.value", item.get("value") if isinstance(item.get("value"), dict) else {}
        definition = item.get("definition") if isinstance(item.get("definition"), dict) else {}
        known = OPERATOR_KEYS if operator else KEYS
        dropped = sorted(key for key in definition if key not in known)
        if dropped:
            reasons = "; ".join(f"{key}: {_POLICY_KEYS_NOT_APPLIED.get(key, 'no equivalent')}" for key in dropped)
            self.note(f"{path}.definition", f"policy '{name}' keys not applied ({reasons})")
        kept = {key: value for key, value in definition.items() if key in known}
        if not kept:
            self.note(path, f"policy '{name}' has nothing Postroom applies: not applied")
            return
        pattern = read.string(item.get("pattern"), f"{path}.pattern", "")
        apply_to = read.string(item.get("apply-to", "all"), f"{path}.apply-to", "all")
        priority = item.get("priority", 0)
        checks = (check_pattern(pattern), check_apply_to(apply_to), check_priority(priority))
        problems = validate(kept, operator) + [problem for problem in checks if problem is not None]
        for problem in problems:
            read.problem(path, problem)
        if not problems:
            entry = self.vhost(vhost_item, path)
            entry["operator_policies" if operator else "policies"].append(
                PolicyConfig(name, pattern, kept, priority, apply_to)
            )

    def unsupported(self, document: dict[str, Any]) -> None:
        for path, item in self.items(document, "policies"):
            self.policy(item, path, False, item)
        for path, item in self.items(document, "parameters"):
            if item.get("component") == "operator_policy":
                self.policy(item, path, True, item)
                continue
            if item.get("component") == "vhost-limits":
                # RabbitMQ keeps a vhost's limits as this parameter (the vhost entry's
                # ``limits`` shows the same in an export, and its import reads only this).
                entry = self.vhost(item, path)
                entry["limits"] = item.get("value")
                entry["limits_path"] = f"{path}.value"
                continue
            if item.get("component") == "shovel":
                name, value = item.get("name"), item.get("value")
                problems = validate_shovel(str(name), value)
                for problem in problems:
                    self.reader.problem(f"{path}.value", problem)
                if not problems and isinstance(name, str):
                    self.vhost(item, path)["shovels"].append(ShovelConfig(name, dict(value)))
                continue
            self.note(
                path,
                f"{item.get('component')} parameter '{item.get('name')}' has no equivalent "
                "(no federation): not applied",
            )
        for path, item in self.items(document, "global_parameters"):
            self.note(path, f"global parameter '{item.get('name')}' has no equivalent: ignored")


def _new_vhost() -> dict[str, Any]:
    return {
        "exchanges": [],
        "queues": [],
        "bindings": [],
        "limits": {},
        "limits_path": "vhosts",
        "policies": [],
        "operator_policies": [],
        "shovels": [],
    }


#: Why a RabbitMQ policy key is not applied.
_POLICY_KEYS_NOT_APPLIED = {
    "queue-mode": "lazy mode is what Postroom does anyway beyond storage.memory_budget",
    "queue-version": "Postroom has one queue format",
    "max-in-memory-length": "bodies beyond storage.memory_budget stay on disk instead",
    "max-in-memory-bytes": "bodies beyond storage.memory_budget stay on disk instead",
    "ha-mode": "Postroom runs on one node",
    "ha-params": "Postroom runs on one node",
    "ha-sync-mode": "Postroom runs on one node",
    "ha-promote-on-shutdown": "Postroom runs on one node",
    "ha-promote-on-failure": "Postroom runs on one node",
    "queue-master-locator": "Postroom runs on one node",
}

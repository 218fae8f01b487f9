"""``postroom ctl VERB``: the everyday verbs of ``rabbitmqctl``, for operators who script.

Each verb is a request to the broker's management API (``--url``, credentials in it; the
embedded default's by default), so it needs an administrator's credentials, as ``rabbitmqctl``
needs the node's cookie. What it prints is what ``rabbitmqctl`` 3.10 prints:

* a banner (``Listing users ...``), left out with ``-q``/``--quiet``, ``-s``/``--silent`` or
  ``--formatter json``;
* the list verbs' tables: a header of column names (left out with ``-s`` or
  ``--no-table-headers``) and tab-separated rows; ``--formatter json`` prints a JSON array,
  one object a line, as ``rabbitmqctl`` streams it;
* errors on stderr, with ``rabbitmqctl``'s exit codes: 64 for a usage error, 65 for bad data
  (or a vhost that does not exist, for ``delete_vhost``), 67 for a user that does not exist, 69
  when the broker cannot be reached or refuses, 70 for a user that already exists.

``close_connection`` takes the connection's name (as ``list_connections name`` shows it), where
``rabbitmqctl`` takes an Erlang process id.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from postroom.broker.tools.management import DEFAULT_MANAGEMENT_URL, management_call

#: ``rabbitmqctl``'s exit codes (sysexits).
EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE = 64, 65, 67, 69, 70

#: The columns each list verb prints when none are named, and those it may be given.
QUEUE_COLUMNS = (
    "name", "messages", "messages_ready", "messages_unacknowledged", "consumers", "durable", "auto_delete",
    "exclusive", "arguments", "policy", "operator_policy", "effective_policy_definition", "state", "type", "vhost",
)  # fmt: skip
CONNECTION_COLUMNS = (
    "name", "user", "vhost", "state", "channels", "peer_host", "peer_port", "host", "port", "protocol",
    "auth_mechanism", "ssl", "timeout", "frame_max", "channel_max", "client_properties", "connected_at",
)  # fmt: skip
VHOST_COLUMNS = ("name", "description", "tags", "tracing", "default_queue_type")


class Failed(Exception):
    """A verb failed: what to print on stderr, and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code


class Out:
    """Where a verb prints, by the output options."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.json = args.formatter == "json"
        self.quiet = args.quiet or args.silent or self.json
        self.headers = not (args.silent or args.no_table_headers)

    def banner(self, text: str) -> None:
        if not self.quiet:
            print(text)

    def table(self, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
        """The rows' ``columns``, as ``rabbitmqctl``'s table or JSON formatter prints them."""
        rows = list(rows)
        if self.json:
            print("[")
            for index, row in enumerate(rows):
                item = {column: _json_value(column, row.get(column)) for column in columns}
                print(("," if index else "") + json.dumps(item, separators=(",", ":"), ensure_ascii=False))
            print("]")
            return
        if not rows:
            return
        if self.headers:
            print("\t".join(columns))
        for row in rows:
            print("\t".join(_text(row.get(column)) for column in columns))

    def done(self) -> None:
        """A change that went through: nothing more to say, but to a JSON reader."""
        if self.json:
            print(json.dumps({"result": "ok"}))


def _text(value: Any) -> str:
    """A value in a table cell, as ``rabbitmqctl`` prints it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "[" + ",".join(f'{{"{key}",{_erlang(item)}}}' for key, item in value.items()) + "]"
    return str(value)


def _erlang(value: Any) -> str:
    """A value inside a table cell's term (an argument's value)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return _text(value)
    if isinstance(value, list):
        return "[" + ",".join(_erlang(item) for item in value) + "]"
    return str(value)


def _amqp_type(value: Any) -> str:
    """The AMQP field type ``rabbitmqctl``'s JSON names for an argument's value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"  # (what a number set through the API or definitions is; a client's may be narrower)
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return "longstr"


def _json_value(column: str, value: Any) -> Any:
    """A value as ``--formatter json`` prints it: arguments and client properties as AMQP
    tables (``[name, type, value]``), an IPv4 address as its four numbers."""
    if column in ("arguments", "client_properties") and isinstance(value, dict):
        return [[key, _amqp_type(item), item] for key, item in value.items()]
    if column in ("peer_host", "host") and isinstance(value, str) and value.count(".") == 3:
        try:
            return [int(part) for part in value.split(".")]
        except ValueError:
            return value
    return value


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Broker:
    """The management API a verb talks to."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, path: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """``(status, answer)``; a broker that cannot be reached fails the verb (69)."""
        try:
            status, answer, _where = management_call(self.url, "/api/" + path, method, body, headers=headers)
        except OSError as error:
            raise Failed(f"Error: unable to reach the management API at {self.url}: {error}", EX_UNAVAILABLE) from None
        if status == 401:
            raise Failed(f"Error:\nthe management API refused the credentials of {self.url} ({_reason(answer)})", 77)
        return status, answer

    def must(self, path: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """The answer of a request that must succeed; any refusal fails the verb (69)."""
        status, answer = self.call(path, method, body, headers)
        if status >= 400:
            raise Failed(f"Error:\n{_reason(answer)}", EX_UNAVAILABLE)
        return answer

    def delete(self, path: str, missing: Failed | None = None, headers: dict[str, str] | None = None) -> None:
        """``DELETE`` ``path``; nothing there fails the verb with ``missing`` (``None``: fine)."""
        status, answer = self.call(path, "DELETE", headers=headers)
        if status == 404 and missing is not None:
            raise missing
        if status >= 400 and status != 404:
            raise Failed(f"Error:\n{_reason(answer)}", EX_UNAVAILABLE)

    def user(self, name: str, quoted: bool = True) -> dict[str, Any]:
        status, answer = self.call(f"users/{_quote(name)}")
        if status == 404:
            shown = f'"{name}"' if quoted else name  # (rabbitmqctl quotes it in some messages only)
            raise Failed(f"Error:\nUser {shown} does not exist", EX_NOUSER)
        if status >= 400:
            raise Failed(f"Error:\n{_reason(answer)}", EX_UNAVAILABLE)
        return dict(answer)

    def vhost_exists(self, name: str) -> bool:
        status, answer = self.call(f"vhosts/{_quote(name)}")
        if status >= 400 and status != 404:
            raise Failed(f"Error:\n{_reason(answer)}", EX_UNAVAILABLE)
        return status != 404


def _reason(answer: Any) -> str:
    if isinstance(answer, dict):
        reason = answer.get("reason", answer)
        return reason if isinstance(reason, str) else json.dumps(reason)
    return str(answer)


def _limits(text: str) -> dict[str, int]:
    try:
        limits = json.loads(text)
    except ValueError:
        raise Failed(f"Error:\nnot valid JSON: {text}", EX_DATAERR) from None
    if not isinstance(limits, dict):
        raise Failed(f"Error:\nlimits must be a JSON object: {text}", EX_DATAERR)
    return limits


# -- users ------------------------------------------------------------------------------------


def add_user(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Adding user "{args.user}" ...')
    password = args.password
    if password is None:
        password = sys.stdin.readline().rstrip("\n")
        if not password:
            raise Failed("Error:\nPassword is not provided via argument or stdin", EX_DATAERR)
    if broker.call(f"users/{_quote(args.user)}")[0] == 200:
        raise Failed(f'Error:\nUser "{args.user}" already exists', EX_SOFTWARE)
    broker.must(f"users/{_quote(args.user)}", "PUT", {"password": password, "tags": ""})
    if not out.quiet:
        print(
            "Done. Don't forget to grant the user permissions to some virtual hosts! "
            "See 'rabbitmqctl help set_permissions' to learn more."
        )
    out.done()


def change_password(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Changing password for user "{args.user}" ...')
    user = broker.user(args.user)
    broker.must(f"users/{_quote(args.user)}", "PUT", {"password": args.password, "tags": user["tags"]})
    out.done()


def delete_user(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Deleting user "{args.user}" ...')
    broker.delete(f"users/{_quote(args.user)}", Failed(f'Error:\nUser "{args.user}" does not exist', EX_NOUSER))
    out.done()


def set_user_tags(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Setting tags for user "{args.user}" to [{", ".join(args.tags)}] ...')
    user = broker.user(args.user)
    body = {"password_hash": user["password_hash"], "hashing_algorithm": user["hashing_algorithm"], "tags": args.tags}
    broker.must(f"users/{_quote(args.user)}", "PUT", body)
    out.done()


def list_users(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner("Listing users ...")
    users = broker.must("users")
    out.table(("user", "tags"), ({"user": user["name"], "tags": user["tags"]} for user in users))


# -- vhosts -----------------------------------------------------------------------------------


def add_vhost(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Adding vhost "{args.name}" ...')
    if not broker.vhost_exists(args.name):  # (an existing one is left as it is, as rabbitmqctl does)
        body = {"description": args.description or "", "tags": args.tags or ""}
        broker.must(f"vhosts/{_quote(args.name)}", "PUT", body)
    out.done()


def delete_vhost(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Deleting vhost "{args.name}" ...')
    broker.delete(f"vhosts/{_quote(args.name)}", Failed(f"Virtual host '{args.name}' does not exist", EX_DATAERR))
    out.done()


def list_vhosts(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    columns = _columns(args, ("name",), VHOST_COLUMNS)
    out.banner("Listing vhosts ...")
    out.table(columns, broker.must("vhosts"))


# -- permissions ------------------------------------------------------------------------------


def _user_and_vhost(broker: Broker, user: str, vhost: str) -> None:
    if not broker.vhost_exists(vhost):
        raise Failed(f"Error:\nVirtual host {vhost} does not exist", EX_UNAVAILABLE)
    broker.user(user, quoted=False)


def set_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Setting permissions for user "{args.user}" in vhost "{args.vhost}" ...')
    _user_and_vhost(broker, args.user, args.vhost)
    body = {"configure": args.conf, "write": args.write, "read": args.read}
    broker.must(f"permissions/{_quote(args.vhost)}/{_quote(args.user)}", "PUT", body)
    out.done()


def clear_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Clearing permissions for user "{args.user}" in vhost "{args.vhost}" ...')
    broker.delete(f"permissions/{_quote(args.vhost)}/{_quote(args.user)}")  # (none to clear is no error)
    out.done()


def list_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Listing permissions for vhost "{args.vhost}" ...')
    status, answer = broker.call(f"vhosts/{_quote(args.vhost)}/permissions")
    if status == 404:
        raise Failed(f"Error:\nVirtual host {args.vhost} does not exist", EX_UNAVAILABLE)
    out.table(("user", "configure", "write", "read"), answer)


def list_user_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Listing permissions for user "{args.user}" ...')
    broker.user(args.user)
    out.table(("vhost", "configure", "write", "read"), broker.must(f"users/{_quote(args.user)}/permissions"))


def set_topic_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Setting topic permissions on "{args.exchange}" for user "{args.user}" in vhost "{args.vhost}" ...')
    _user_and_vhost(broker, args.user, args.vhost)
    body = {"exchange": args.exchange, "write": args.write, "read": args.read}
    broker.must(f"topic-permissions/{_quote(args.vhost)}/{_quote(args.user)}", "PUT", body)
    out.done()


def clear_topic_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    on = f' on "{args.exchange}"' if args.exchange else ""
    out.banner(f'Clearing topic permissions{on} for user "{args.user}" in vhost "{args.vhost}" ...')
    path = f"topic-permissions/{_quote(args.vhost)}/{_quote(args.user)}"
    broker.delete(path + (f"/{_quote(args.exchange)}" if args.exchange else ""))
    out.done()


def list_topic_permissions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Listing topic permissions for vhost "{args.vhost}" ...')
    status, answer = broker.call(f"vhosts/{_quote(args.vhost)}/topic-permissions")
    if status == 404:
        raise Failed(f"Error:\nVirtual host {args.vhost} does not exist", EX_UNAVAILABLE)
    out.table(("user", "exchange", "write", "read"), answer)
    if not answer and not out.json:
        print()  # (rabbitmqctl prints an empty line for none)


# -- limits -----------------------------------------------------------------------------------


def _set_limits(broker: Broker, kind: str, name: str, limits: dict[str, Any]) -> None:
    """Make ``name``'s limits exactly ``limits`` (``kind``: ``vhost-limits``, ``user-limits``)."""
    current = broker.must(f"{kind}/{_quote(name)}")
    for item in current:
        for limit in item["value"]:
            if limit not in limits:
                broker.must(f"{kind}/{_quote(name)}/{_quote(limit)}", "DELETE")
    for limit, value in limits.items():
        status, answer = broker.call(f"{kind}/{_quote(name)}/{_quote(limit)}", "PUT", {"value": value})
        if status >= 400:
            raise Failed(f"Error:\n{_reason(answer)}", EX_DATAERR)


def _print_limits(out: Out, items: list[dict[str, Any]], one: bool = True) -> None:
    """Each item's limits as JSON; for one user's or vhost's without any, ``{}``."""
    for item in items:
        print(json.dumps(item["value"], separators=(",", ":")))
    if one and not items:
        print("{}")


def set_vhost_limits(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Setting vhost limits to "{args.definition}" for vhost "{args.vhost}" ...')
    if not broker.vhost_exists(args.vhost):
        raise Failed(f"Error:\nVirtual host {args.vhost} does not exist", EX_UNAVAILABLE)
    _set_limits(broker, "vhost-limits", args.vhost, _limits(args.definition))
    out.done()


def clear_vhost_limits(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Clearing vhost "{args.vhost}" limits ...')
    if not broker.vhost_exists(args.vhost):
        raise Failed(f"Error:\nVirtual host {args.vhost} does not exist", EX_UNAVAILABLE)
    _set_limits(broker, "vhost-limits", args.vhost, {})
    out.done()


def list_vhost_limits(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Listing limits for vhost "{args.vhost}" ...')
    status, answer = broker.call(f"vhost-limits/{_quote(args.vhost)}")
    if status == 404:
        raise Failed(f"Error:\nVirtual host {args.vhost} does not exist", EX_UNAVAILABLE)
    _print_limits(out, answer)


def set_user_limits(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Setting user limits to "{args.definition}" for user "{args.user}" ...')
    broker.user(args.user)
    _set_limits(broker, "user-limits", args.user, _limits(args.definition))
    out.done()


def clear_user_limits(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    which = "all limits" if args.limit == "all" else f'"{args.limit}" limit'
    out.banner(f'Clearing {which} for user "{args.user}" ...')
    broker.user(args.user)
    if args.limit == "all":
        _set_limits(broker, "user-limits", args.user, {})
    else:
        broker.must(f"user-limits/{_quote(args.user)}/{_quote(args.limit)}", "DELETE")
    out.done()


def list_user_limits(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    if args.user is None:
        out.banner("Listing limits for all users ...")
        _print_limits(out, broker.must("user-limits"), one=False)
        return
    out.banner(f'Listing limits for user "{args.user}" ...')
    broker.user(args.user)
    _print_limits(out, broker.must(f"user-limits/{_quote(args.user)}"))


# -- queues and connections -------------------------------------------------------------------


def _columns(args: argparse.Namespace, default: Sequence[str], known: Sequence[str]) -> Sequence[str]:
    columns = args.columns or default
    unknown = [column for column in columns if column not in known]
    if unknown:
        raise Failed(f"Error (argument validation): Info key(s) {','.join(unknown)} are not supported", EX_USAGE)
    return columns


def list_queues(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    columns = _columns(args, ("name", "messages"), QUEUE_COLUMNS)
    out.banner("Timeout: 60.0 seconds ...")
    out.banner(f"Listing queues for vhost {args.vhost} ...")
    status, queues = broker.call(f"queues/{_quote(args.vhost)}")
    if status == 404:
        raise Failed(f"Error:\nVirtual host {args.vhost} does not exist", EX_UNAVAILABLE)
    rows = [{**queue, "state": queue.get("state", "running")} for queue in queues]
    out.table(columns, rows)


def list_connections(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    columns = _columns(args, ("user", "peer_host", "peer_port", "state"), CONNECTION_COLUMNS)
    out.banner("Listing connections ...")
    out.table(columns, broker.must("connections"))


def close_connection(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f"Closing connection {args.name}, reason: {args.reason}...")
    missing = Failed(f"Error:\nno connection named {args.name} (see list_connections name)", EX_UNAVAILABLE)
    broker.delete(f"connections/{_quote(args.name)}", missing, headers={"X-Reason": args.reason})
    out.done()


def purge_queue(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f"Purging queue '{args.queue}' in vhost '{args.vhost}' ...")
    path = f"queues/{_quote(args.vhost)}/{_quote(args.queue)}/contents"
    broker.delete(path, Failed("Error:\nnot_found", EX_UNAVAILABLE))
    out.done()


def delete_queue(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    conditions = [text for flag, text in ((args.if_empty, "is empty"), (args.if_unused, "has no consumers")) if flag]
    condition = f" if queue {' and '.join(conditions)}" if conditions else ""
    out.banner(f"Deleting queue '{args.queue}' on vhost '{args.vhost}'{condition} ...")
    path = f"queues/{_quote(args.vhost)}/{_quote(args.queue)}"
    status, queue = broker.call(path)
    if status == 404:
        raise Failed("Error:\nQueue not found", EX_USAGE)
    flags = (("if-empty", args.if_empty), ("if-unused", args.if_unused))
    query = "&".join(f"{name}=true" for name, flag in flags if flag)
    status, answer = broker.call(path + (f"?{query}" if query else ""), "DELETE")
    if status >= 400:
        raise Failed(f"Error:\n{_reason(answer)}", EX_UNAVAILABLE if status != 404 else EX_USAGE)
    if not out.quiet:
        print(f"Queue was successfully deleted with {queue.get('messages_ready', 0)} ready messages")
    out.done()


# -- definitions and status -------------------------------------------------------------------


def export_definitions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    definitions = broker.must("definitions")
    text = json.dumps(definitions, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if args.path == "-":
        sys.stdout.write(text)
        return
    out.banner(f'Exporting definitions in JSON to a file at "{args.path}" ...')
    with open(args.path, "w", encoding="utf-8") as file:
        file.write(text)


def import_definitions(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    where = "standard input" if args.path == "-" else f'a file at "{args.path}"'
    out.banner(f"Importing definitions in JSON from {where} ...")
    try:
        text = sys.stdin.read() if args.path == "-" else open(args.path, encoding="utf-8").read()
        document = json.loads(text)
    except OSError as error:
        raise Failed(f"Error:\n{error}", EX_DATAERR) from None
    except ValueError as error:
        raise Failed(f"Error:\nnot valid JSON: {error}", EX_DATAERR) from None
    answer = broker.must("definitions", "POST", document)
    for note in (answer or {}).get("notes", ()):
        print(f"not applied as it is: {note}", file=sys.stderr)
    if not out.quiet:
        print("Successfully imported definitions.")
    out.done()


def status(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    overview = broker.must("overview")
    node = broker.must(f"nodes/{_quote(overview['node'])}")
    alarms = [name for name, on in (("memory", node["mem_alarm"]), ("disk", node["disk_free_alarm"])) if on]
    listeners = overview.get("listeners", [])
    if out.json:
        print(json.dumps({
            "pid": int(node["os_pid"]), "uptime": node["uptime"] // 1000, "product_name": overview["product_name"],
            "product_version": overview["product_version"], "rabbitmq_version": overview["rabbitmq_version"],
            "node": overview["node"], "cluster_name": overview["cluster_name"], "alarms": alarms,
            "listeners": [{"interface": item["ip_address"], "port": item["port"], "protocol": item["protocol"]}
                          for item in listeners],
            "memory": {"total": {"rss": node["mem_used"]}}, "vm_memory_high_watermark_limit": node["mem_limit"],
            "disk_free": node["disk_free"], "disk_free_limit": node["disk_free_limit"],
            "totals": overview["object_totals"],
        }, separators=(",", ":")))  # fmt: skip
        return
    out.banner(f"Status of node {overview['node']} ...")
    gigabytes = (lambda value: f"{value / 1e9:.4f} gb" if isinstance(value, int) else "unknown")  # noqa: E731
    lines = [
        "Runtime", "", f"OS PID: {node['os_pid']}", f"Uptime (seconds): {node['uptime'] // 1000}",
        f"{overview['product_name']} version: {overview['product_version']}",
        f"RabbitMQ version (of the behaviour and API followed): {overview['rabbitmq_version']}",
        f"Node name: {overview['node']}", f"Cluster name: {overview['cluster_name']}", "",
        "Listeners", "",
        *(f"Interface: {item['ip_address']}, port: {item['port']}, protocol: {item['protocol']}" for item in listeners),
        "", "Alarms", "", *(alarms or ["(none)"]), "",
        "Memory", "", f"Total memory used: {gigabytes(node['mem_used'])}",
        f"Memory high watermark, computed to: {gigabytes(node['mem_limit'])}", "",
        "Free disk space", "", f"Low free disk space watermark: {gigabytes(node['disk_free_limit'])}",
        f"Free disk space: {gigabytes(node['disk_free'])}", "",
        "Totals", "",
        *(f"{name.capitalize()}: {count}" for name, count in overview["object_totals"].items()),
    ]  # fmt: skip
    print("\n".join(lines))


# -- runtime parameters and shovels -----------------------------------------------------------


def set_parameter(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(
        f'Setting runtime parameter "{args.name}" for component "{args.component}" to "{args.value}" '
        f'in vhost "{args.vhost}" ...'
    )
    try:
        value = json.loads(args.value)
    except ValueError:
        raise Failed("Error:\nJSON decoding error. Reason: badarg", EX_UNAVAILABLE) from None
    path = f"parameters/{_quote(args.component)}/{_quote(args.vhost)}/{_quote(args.name)}"
    status, answer = broker.call(path, "PUT", {"value": value})
    if status >= 400:
        raise Failed(f"Error:\n{html.unescape(_reason(answer))}", EX_UNAVAILABLE)
    out.done()


def clear_parameter(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Clearing runtime parameter "{args.name}" for component "{args.component}" on vhost "{args.vhost}" ...')
    missing = Failed("Error:\nParameter does not exist", EX_UNAVAILABLE)
    broker.delete(f"parameters/{_quote(args.component)}/{_quote(args.vhost)}/{_quote(args.name)}", missing)
    out.done()


def list_parameters(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f'Listing runtime parameters for vhost "{args.vhost}" ...')
    items = broker.must("parameters")
    compact = (",", ":")
    rows = [
        {
            "component": item["component"],
            "name": item["name"],
            "value": json.dumps(item["value"], separators=compact, sort_keys=True),
        }
        for item in items
        if item["vhost"] == args.vhost
    ]
    if not rows and not out.json:
        print()  # (rabbitmqctl prints an empty line for an empty list of parameters)
    out.table(("component", "name", "value"), rows)


def _shovel_row(status: dict[str, Any]) -> dict[str, Any]:
    """A status from ``/api/shovels`` as ``rabbitmqctl shovel_status`` prints it."""
    row = {
        "name": status["name"],
        "vhost": status["vhost"],
        "type": status["type"],
        "state": status["state"],
        "last_changed": _zero_padded(status["timestamp"]),
        "source": status.get("src_uri", ""),
        "destination": status.get("dest_uri", ""),
        "termination_reason": status.get("reason", ""),
    }
    if status["state"] == "running":
        row["source_protocol"] = status["src_protocol"]
        row["destination_protocol"] = status["dest_protocol"]
        for key, column in (
            ("src_queue", "source_queue"), ("src_exchange", "source_exchange"),
            ("src_exchange_key", "source_exchange_key"), ("dest_queue", "destination_queue"),
            ("dest_exchange", "destination_exchange"), ("dest_exchange_key", "destination_exchange_key"),
        ):  # fmt: skip
            if key in status:
                row[column] = status[key]
    return row


def _zero_padded(timestamp: str) -> str:
    """``2026-11-28 9:05:03`` as ``rabbitmqctl`` prints it: ``2026-11-28 09:05:03``."""
    day, _space, clock = timestamp.partition(" ")
    return f"{day} {clock.zfill(8)}"


def shovel_status(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    node = broker.must("overview")["node"]
    out.banner(f"Shovel status on node {node}")
    rows = [_shovel_row(status) for status in broker.must("shovels")]
    out.table(sorted(rows[0]) if rows else (), rows)


def _shovel_missing(broker: Broker, vhost: str) -> Failed:
    node = broker.must("overview")["node"]
    return Failed(
        f"Error:\nShovel with the given name was not found on the target node '{node}' and / or virtual host '{vhost}'",
        EX_UNAVAILABLE,
    )


def delete_shovel(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    out.banner(f"Deleting shovel {args.name} in vhost {args.vhost}")
    broker.delete(f"shovels/vhost/{_quote(args.vhost)}/{_quote(args.name)}", _shovel_missing(broker, args.vhost))
    out.done()


def restart_shovel(args: argparse.Namespace, out: Out, broker: Broker) -> None:
    node = broker.must("overview")["node"]
    out.banner(f"Restarting dynamic Shovel {args.name} in virtual host {args.vhost} on node {node}")
    path = f"shovels/vhost/{_quote(args.vhost)}/{_quote(args.name)}/restart"
    broker.delete(path, _shovel_missing(broker, args.vhost))
    out.done()


# -- the parser -------------------------------------------------------------------------------

Verb = Callable[[argparse.Namespace, Out, Broker], None]


def add_parser(commands: Any) -> None:
    """Add ``ctl`` and its verbs to ``postroom``'s subcommands."""
    ctl = commands.add_parser("ctl", help="rabbitmqctl's everyday verbs, through the management API")
    verbs = ctl.add_subparsers(dest="verb", metavar="VERB")
    ctl.set_defaults(run=lambda args: (ctl.print_help(), EX_USAGE)[1])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=DEFAULT_MANAGEMENT_URL, help="the management API, credentials in it (%(default)s)"
    )
    common.add_argument("-p", "--vhost", default="/", help="the vhost (default: %(default)s)")
    common.add_argument("-q", "--quiet", action="store_true", help="no banner")
    common.add_argument("-s", "--silent", action="store_true", help="no banner and no table header")
    common.add_argument("--no-table-headers", action="store_true", help="no table header")
    common.add_argument("--formatter", choices=("table", "json"), default="table")

    def verb(name: str, run: Verb, description: str, *arguments: tuple[tuple[str, ...], dict[str, Any]]) -> None:
        parser = verbs.add_parser(name, parents=[common], help=description)
        for flags, options in arguments:
            parser.add_argument(*flags, **options)
        parser.set_defaults(run=lambda args: _run(run, args))

    user = (("user",), {})
    columns = (("columns",), {"nargs": "*", "help": "the columns to print"})
    verb("add_user", add_user, "add a user (the password from stdin when not given)", user,
         (("password",), {"nargs": "?"}))
    verb("change_password", change_password, "change a user's password", user, (("password",), {}))
    verb("delete_user", delete_user, "delete a user (its connections are closed)", user)
    verb("set_user_tags", set_user_tags, "replace a user's tags", user, (("tags",), {"nargs": "*"}))
    verb("list_users", list_users, "list users and their tags")
    verb("add_vhost", add_vhost, "add a vhost", (("name",), {}), (("--description",), {}), (("--tags",), {}))
    verb("delete_vhost", delete_vhost, "delete a vhost with everything in it", (("name",), {}))
    verb("list_vhosts", list_vhosts, "list vhosts", columns)
    verb("set_permissions", set_permissions, "set a user's permissions on a vhost", user,
         (("conf",), {}), (("write",), {}), (("read",), {}))
    verb("clear_permissions", clear_permissions, "clear a user's permissions on a vhost", user)
    verb("list_permissions", list_permissions, "list the permissions on a vhost")
    verb("list_user_permissions", list_user_permissions, "list a user's permissions", user)
    verb("set_topic_permissions", set_topic_permissions, "set a user's topic permissions on an exchange", user,
         (("exchange",), {}), (("write",), {}), (("read",), {}))
    verb("clear_topic_permissions", clear_topic_permissions, "clear a user's topic permissions", user,
         (("exchange",), {"nargs": "?"}))
    verb("list_topic_permissions", list_topic_permissions, "list the topic permissions on a vhost")
    verb("set_vhost_limits", set_vhost_limits, 'set a vhost\'s limits: \'{"max-queues": 100}\'', (("definition",), {}))
    verb("clear_vhost_limits", clear_vhost_limits, "clear a vhost's limits")
    verb("list_vhost_limits", list_vhost_limits, "print a vhost's limits")
    verb("set_user_limits", set_user_limits, 'set a user\'s limits: \'{"max-connections": 10}\'', user,
         (("definition",), {}))
    verb("clear_user_limits", clear_user_limits, "clear one of a user's limits (or all)", user, (("limit",), {}))
    verb("list_user_limits", list_user_limits, "print a user's limits (or every user's)", (("--user",), {}))
    verb("list_queues", list_queues, "list the queues of a vhost", columns)
    verb("list_connections", list_connections, "list connections", columns)
    verb("close_connection", close_connection, "close a connection (by its name) with a reason",
         (("name",), {}), (("reason",), {}))
    verb("purge_queue", purge_queue, "remove a queue's ready messages", (("queue",), {}))
    verb("delete_queue", delete_queue, "delete a queue", (("queue",), {}),
         (("-e", "--if-empty"), {"action": "store_true"}), (("-u", "--if-unused"), {"action": "store_true"}))
    verb("export_definitions", export_definitions, "write the definitions as JSON (- for stdout)", (("path",), {}))
    verb("import_definitions", import_definitions, "apply definitions from a JSON file (- for stdin)",
         (("path",), {}))
    verb("status", status, "the node: version, uptime, listeners, alarms, memory, disk")
    verb("set_parameter", set_parameter, "set a runtime parameter (a shovel: component shovel)",
         (("component",), {}), (("name",), {}), (("value",), {"help": "the value as JSON"}))
    verb("clear_parameter", clear_parameter, "clear a runtime parameter", (("component",), {}), (("name",), {}))
    verb("list_parameters", list_parameters, "list the runtime parameters of a vhost")
    verb("shovel_status", shovel_status, "the shovels and their state")
    verb("delete_shovel", delete_shovel, "delete a shovel (its parameter is cleared)", (("name",), {}))
    verb("restart_shovel", restart_shovel, "stop a shovel and start it again", (("name",), {}))  # fmt: skip


def _run(run: Verb, args: argparse.Namespace) -> int:
    try:
        run(args, Out(args), Broker(args.url))
    except Failed as failed:
        print(failed.message, file=sys.stderr)
        return failed.code
    return 0

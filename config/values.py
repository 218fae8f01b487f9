"""Reading a configuration file's values: YAML composed into plain values with their lines,
and the checks every section uses (types, names, durations, sizes, mappings with their keys).

:class:`ValueReader` collects every problem instead of stopping at the first; the sections
of the file (``config.loader``) and of a RabbitMQ definitions export (``config.rabbitmq``) are
read by its subclasses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|kB|KB|KiB|MB|MiB|GB|GiB|TB|TiB)?\s*$")


_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "KiB": 1024,
    "MB": 1000**2,
    "MiB": 1024**2,
    "GB": 1000**3,
    "GiB": 1024**3,
    "TB": 1000**4,
    "TiB": 1024**4,
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a configuration file."""

    line: int | None
    key: str
    reason: str


class ConfigError(Exception):
    """The configuration is refused; :attr:`problems` says why, each with its line and key path."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s) in the configuration:"]
        for problem in self.problems:
            where = f"{self.source}:{problem.line}" if problem.line else self.source
            lines.append(f"  {where}: {problem.key or '(top level)'}: {problem.reason}")
        return "\n".join(lines)


def parse_duration(value: Any) -> float:
    """Seconds in a duration with a unit (``500ms``, ``30s``, ``5m``, ``1h``, ``7d``).

    :raises ValueError: it is not one, saying what is expected
    """
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"must be a duration with a unit (e.g. 500ms, 30s, 5m, 1h, 7d), not {value!r}")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


#: Values (mappings, lists and scalars) a file may expand to, aliases counted each time they
#: are used. The example configuration holds about a hundred; definitions of 10,000 queues
#: with their settings and bindings about 100,000.
MAX_YAML_VALUES = 200_000


class _TooLarge(Exception):
    """The file expands past :data:`MAX_YAML_VALUES` (at ``line``)."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class ValueReader:
    """Turns composed YAML into plain values, remembering lines, and checks them."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self.lines: dict[str, int] = {}

    def parse(self, text: str) -> Any:
        loader = yaml.SafeLoader(text)
        self._values_left = MAX_YAML_VALUES
        try:
            node = loader.get_single_node()
            return {} if node is None else self._plain(node, "", loader)
        except _TooLarge as large:
            self.problems.append(
                Problem(
                    large.line,
                    "",
                    f"the file holds more than {MAX_YAML_VALUES:,} values once its aliases are expanded "
                    "(an alias used over and over, a 'billion laughs'): refused",
                )
            )
            return None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            self.problems.append(Problem(line, "", f"not valid YAML: {getattr(err, 'problem', None) or err}"))
            return None
        finally:
            loader.dispose()

    def _plain(self, node: yaml.Node, path: str, loader: yaml.SafeLoader) -> Any:
        self._values_left -= 1
        if self._values_left < 0:  # an alias is a reference; walking it is a copy
            raise _TooLarge(node.start_mark.line + 1)
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                child = f"{path}.{key}" if path else str(key)
                if not isinstance(key, str):
                    self.problems.append(Problem(key_node.start_mark.line + 1, child, "keys must be strings"))
                    continue
                if key in result:
                    self.problems.append(Problem(key_node.start_mark.line + 1, child, "duplicate key"))
                    continue
                result[key] = self._plain(value_node, child, loader)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self._plain(item, f"{path}[{index}]", loader) for index, item in enumerate(node.value)]
        return loader.construct_object(node, deep=True)

    def problem(self, path: str, reason: str) -> None:
        line = self.lines.get(path)
        probe = path
        while line is None and probe:
            probe = probe.rpartition(".")[0] if "." in probe else ""
            line = self.lines.get(probe)
        self.problems.append(Problem(line, path, reason))

    def mapping(self, value: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping, not {kind_of(value)}")
            return {}
        for key in value:
            if key not in allowed:
                self.problem(
                    f"{path}.{key}" if path else key, f"unknown key (expected one of: {', '.join(sorted(allowed))})"
                )
        for key in required - set(value):
            self.problem(path, f"missing required key '{key}'")
        return {key: item for key, item in value.items() if key in allowed}

    def typed(self, value: Any, path: str, check: Callable[[Any], bool], expected: str, default: Any) -> Any:
        if value is None:
            return default
        if not check(value):
            self.problem(path, f"must be {expected}, not {kind_of(value)} {value!r}")
            return default
        return value

    def string(self, value: Any, path: str, default: Any = None) -> Any:
        if isinstance(value, (bool, int, float)) and value is not None:
            self.problem(path, f"must be a string, not {kind_of(value)} {value!r} (quote it)")
            return default
        return self.typed(value, path, lambda v: isinstance(v, str), "a string", default)

    def patterns(
        self,
        section: Mapping[str, Any],
        path: str,
        keys: tuple[str, ...],
        default: str,
        refusal: str = "not a valid regular expression",
    ) -> dict[str, str]:
        """The regular expressions under ``keys`` of a permission's ``section`` (``default`` for
        one left out), each checked to compile; one that does not is a problem, ``refusal: why``."""
        values = {}
        for key in keys:
            pattern = self.string(section.get(key), f"{path}.{key}", default)
            try:
                re.compile(pattern)
            except re.error as err:
                self.problem(f"{path}.{key}", f"{refusal}: {err}")
            values[key] = pattern
        return values

    def name(self, value: Any, path: str) -> str:
        result = self.string(value, path, None)
        if result is None:
            if value is None:
                self.problem(path, "is required")
            return ""
        if len(result.encode("utf-8")) > 255:
            self.problem(path, "names are at most 255 bytes")
        return result

    def boolean(self, value: Any, path: str, default: bool) -> bool:
        return self.typed(value, path, lambda v: isinstance(v, bool), "true or false", default)

    def integer(self, value: Any, path: str, default: Any, minimum: int = 0, maximum: int | None = None) -> Any:
        result = self.typed(value, path, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", None)
        if result is None:
            return default
        if result < minimum or (maximum is not None and result > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            self.problem(path, f"must be {bound}, not {result}")
            return default
        return result

    def duration(self, value: Any, path: str, default: Any = None) -> Any:
        if value is None:
            return default
        try:
            return parse_duration(value)
        except ValueError as error:
            self.problem(path, str(error))
            return default

    def size(self, value: Any, path: str, default: Any = None) -> Any:
        if value is None:
            return default
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        match = _SIZE.match(value) if isinstance(value, str) else None
        if match is None:
            self.problem(path, f"must be a size in bytes or with a unit (e.g. 64KiB, 64MiB, 1GiB), not {value!r}")
            return default
        return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])

    def table(self, value: Any, path: str) -> dict[str, Any]:
        result = self.typed(value, path, lambda v: isinstance(v, dict), "a mapping", {})
        return dict(result)

    def tags(self, value: Any, path: str) -> tuple[str, ...]:
        """User tags: a list of names (RabbitMQ's; those it does not know give no rights)."""
        tags = []
        for index, tag in enumerate(self.typed(value, path, is_list, "a list", [])):
            if not isinstance(tag, str) or not tag:
                self.problem(f"{path}[{index}]", "a tag is a non-empty string")
                continue
            tags.append(tag)
        return tuple(tags)


def is_list(value: Any) -> bool:
    """Whether ``value`` is a YAML sequence."""
    return isinstance(value, list)


def is_text(value: Any) -> bool:
    """Whether ``value`` is a string."""
    return isinstance(value, str)


def is_string_list(value: Any) -> bool:
    """Whether ``value`` is a sequence of strings."""
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def kind_of(value: Any) -> str:
    """What ``value`` is, in the words of a problem (``a boolean``, ``a mapping``)."""
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)

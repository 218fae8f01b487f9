"""MkDocs hooks of Postroom's documentation site: the configuration reference, from the code.

``configuration-reference.md`` holds a marker line; :func:`on_page_markdown` puts in its place
the tables that :func:`render_reference` renders at every build. The keys, and what the loader
reads each one as, come from the loader itself (``config.reference.accepted_keys``); the
defaults and descriptions come from the frozen dataclasses of ``config/schema.py`` (their
``#:`` comments and docstrings). A key added to the loader appears without a change here, and
``tests/config/test_reference.py`` fails if one is missing.

This module imports nothing from MkDocs, so that the tests can import it too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The checkout this file belongs to: the ``config`` package is imported from there.
ROOT = Path(__file__).resolve().parent.parent
#: The page the reference goes in, and the line it replaces.
PAGE = "configuration-reference.md"
MARKER = "<!-- configuration keys: generated from config/reader.py and config/schema.py -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    """MkDocs hook: the reference page gets its tables; every other page is left as it is."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} no longer holds the line {MARKER!r}: there is nowhere to put the reference")
    return markdown.replace(MARKER, render_reference())


def render_reference() -> str:
    """Markdown: one table per mapping of the configuration file, the top level first, each
    followed by the mappings nested in it."""
    reference, schema = _config_modules()
    sections = {section.path: section for section in reference.accepted_keys()}
    docs = _field_docs(schema)
    out: list[str] = []

    def visit(path: str, cls: type | None, holder: tuple[type, str] | None) -> None:
        section = sections[path]
        fields = {field.name: field for field in dataclasses.fields(cls)} if cls is not None else {}
        hints = typing.get_type_hints(cls) if cls is not None else {}
        by_name = {key.name: key for key in section.keys}
        order = [name for name in fields if name in by_name] + sorted(set(by_name) - set(fields))
        arguments = _queue_arguments(cls, hints) if cls is not None else {}

        out.append(f"## {_title(path)} {{#{anchor(path)}}}\n")
        intro = _intro(path, sections, cls)
        if intro:
            out.append(intro + "\n")
        out.append("| key | type | default | description |")
        out.append("|---|---|---|---|")
        nested: list[tuple[str, type | None, tuple[type, str] | None]] = []
        for name in order:
            key = by_name[name]
            owner, field_name = cls, name
            if name not in fields and holder is not None:  # limits.disk_free_limit.mem_relative
                owner, field_name = holder[0], f"{holder[1]}_{name}"
            owner_fields = {field.name: field for field in dataclasses.fields(owner)} if owner is not None else {}
            field = owner_fields.get(field_name)
            hint = typing.get_type_hints(owner).get(field_name) if field is not None else None
            kinds = list(key.kinds) or ([_describe(hint)] if hint is not None else [])
            description = _rst(docs.get((owner.__name__, field_name), "")) if owner is not None else ""
            if name in arguments:
                names = ", ".join(f"`{argument}`" for argument in arguments[name])
                label = "Queue argument" if len(arguments[name]) == 1 else "Queue arguments"
                description = f"{description} {label} {names}.".strip()
            out.append(
                "| "
                + " | ".join(
                    (
                        f"`{key.path}`",
                        _cell(_type(key, kinds)),
                        "required" if key.required else _default(field, kinds),
                        _cell(description),
                    )
                )
                + " |"
            )
            if key.section is not None and key.section in sections:
                child = _dataclass_in(hint) if hint is not None else None
                nested.append((key.section, child, None if child is not None else (cls, name)))
        out.append("")
        for child_path, child, child_holder in nested:
            visit(child_path, child, child_holder)

    visit("", schema.BrokerConfig, None)
    return "\n".join(out)


def anchor(path: str) -> str:
    """The id of a section's heading: ``vhosts.<name>.queues[]`` is ``vhosts-name-queues``."""
    return re.sub(r"[^a-z0-9_]+", "-", path.lower()).strip("-") or "top-level"


# -- the code ------------------------------------------------------------------------------------


def _config_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """``config.reference`` and ``config.schema`` of this checkout."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    reference = importlib.import_module("postroom.config.reference")
    schema = importlib.import_module("postroom.config.schema")
    if not Path(schema.__file__).resolve().is_relative_to(ROOT):
        raise ImportError(f"config.schema was imported from {schema.__file__}, not from this checkout")
    return reference, schema


def _field_docs(module: types.ModuleType) -> dict[tuple[str, str], str]:
    """The ``#:`` comment lines just above each field of each class of ``module``."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    docs = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                comment: list[str] = []
                line = item.lineno - 2
                while line >= 0 and lines[line].strip().startswith("#:"):
                    comment.insert(0, lines[line].strip()[2:].strip())
                    line -= 1
                if comment:
                    docs[(node.name, item.target.id)] = " ".join(comment)
    return docs


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds: itself, or in an ``Optional``, a tuple or a dict's values."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    for argument in typing.get_args(hint):
        found = _dataclass_in(argument)
        if found is not None:
            return found
    return None


def _queue_arguments(cls: type, hints: dict[str, Any]) -> dict[str, list[str]]:
    """For a class with ``queue_arguments`` (a queue), the ``x-`` arguments each field sets:
    found by setting each one in turn and looking at what comes out."""
    if not callable(getattr(cls, "queue_arguments", None)):
        return {}
    required = {
        field.name: _sample(hints[field.name])
        for field in dataclasses.fields(cls)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    }
    base = cls(**required)
    plain = set(base.queue_arguments())
    result = {}
    for field in dataclasses.fields(cls):
        sample = _sample(hints[field.name])
        if sample is None:
            continue
        arguments = set(dataclasses.replace(base, **{field.name: sample}).queue_arguments()) - plain
        if arguments:
            result[field.name] = sorted(arguments)
    return result


def _sample(hint: Any) -> Any:
    """A value of a field's type that is not its default, or ``None`` where there is no simple one."""
    options = [option for option in typing.get_args(hint) if option is not type(None)] or [hint]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = options[0]
    if hint is bool:
        return True
    if hint is int:
        return 1
    if hint is float:
        return 1.0
    if hint is str:
        return "x"
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        return hint(**{field.name: _sample(hints[field.name]) for field in dataclasses.fields(hint)})
    return None


# -- the text ------------------------------------------------------------------------------------


def _title(path: str) -> str:
    return "The top level" if not path else f"`{path}`"


def _intro(path: str, sections: Mapping[str, Any], cls: type | None) -> str:
    """What a section is: where it sits, then its class's docstring."""
    parts = []
    if path.endswith("[]"):
        parts.append(f"Each item of the list `{path[:-2]}`.")
    elif path.endswith(".<name>.<name>"):
        parts.append(f"Each entry of `{path[: -len('.<name>.<name>')]}`, by two names.")
    elif path.endswith(".<name>"):
        parts.append(f"Each entry of `{path[: -len('.<name>')]}`, by name.")
    elif path:
        parent, _, name = path.rpartition(".")
        key = next((key for key in sections[parent].keys if key.name == name), None)
        if key is not None and key.kinds:
            parts.append(f"`{path}` may be this mapping instead of a value.")
    if cls is not None and cls.__doc__:
        parts.extend(_rst(" ".join(paragraph.split())) for paragraph in inspect.cleandoc(cls.__doc__).split("\n\n"))
    return "\n\n".join(parts)


def _type(key: Any, kinds: list[str]) -> str:
    if key.section is None:
        return "; or ".join(kinds)
    shape = {
        key.path: "a mapping",
        f"{key.path}[]": "a list of mappings",
        f"{key.path}.<name>": "a mapping of names to mappings",
        f"{key.path}.<name>.<name>": "a mapping of names to mappings of names to mappings",
    }.get(key.section, "a mapping")
    kept = [kind for kind in kinds if kind not in ("a list", "a mapping")]
    return "; or ".join([*kept, f"[{shape}](#{anchor(key.section)})"])


def _describe(hint: Any) -> str:
    """What a field's annotation says, for a key the loader reads without a check of its own."""
    options = [option for option in typing.get_args(hint) if option is not type(None)]
    if options and (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union):
        return " or ".join(dict.fromkeys(_describe(option) for option in options))
    origin = typing.get_origin(hint) or hint
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return "a mapping"
    if origin in (tuple, list):
        return "a list"
    return "a mapping" if dataclasses.is_dataclass(hint) else str(hint)


def _default(field: dataclasses.Field[Any] | None, kinds: list[str]) -> str:
    if field is None:
        return "—"
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "—"
    if dataclasses.is_dataclass(value):  # a section: its keys have their own defaults
        return "—"
    if value is None:
        return "not set"
    if isinstance(value, int) and not isinstance(value, bool) and any(kind.startswith("a size") for kind in kinds):
        return f"`{_size(value)}`"
    if isinstance(value, (int, float)) and any(kind.startswith("a duration") for kind in kinds):
        return f"`{_duration(value)}`"
    return f"`{_flow(_plain(value), top=True)}`"


def _size(value: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("GB", 10**9), ("MB", 10**6)):
        if value and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def _duration(seconds: float) -> str:
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds and seconds % factor == 0:
            return f"{int(seconds // factor)}{unit}"
    return f"{round(seconds * 1000)}ms"


def _plain(value: Any) -> Any:
    """A default as YAML would write it: a dataclass as its fields that differ from their defaults."""
    if dataclasses.is_dataclass(value):
        result = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if not field.compare:
                continue
            if field.default is not dataclasses.MISSING and item == field.default:
                continue
            if field.default_factory is not dataclasses.MISSING and item == field.default_factory():
                continue
            result[field.name] = _plain(item)
        return result
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _flow(value: Any, top: bool = False) -> str:
    """YAML in flow style, on one line."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow(key)}: {_flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z_][\w.-]*", value) or (top and re.fullmatch(r"[\w./=:-]+", value))
        if plain and _yaml_safe(value):
            return value
        return json.dumps(value)
    return repr(value)


def _yaml_safe(value: str) -> bool:
    """Whether YAML reads ``value`` unquoted as that string, not as a boolean or null."""
    return value.lower() not in ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~")


def _rst(text: str) -> str:
    """reStructuredText's inline markup in docstrings, as Markdown."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")

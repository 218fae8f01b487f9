"""The keys the configuration loader accepts, found by running the loader itself.

The loader (:class:`config.reader.Reader`) knows the keys of each mapping of the file only
where it reads that mapping: each section's method passes its allowed keys to ``mapping``,
which refuses any other. :func:`accepted_keys` runs a reader that notes those calls, and the
check each value goes through, on documents it grows until no new mapping turns up: a key
whose value may be a mapping, a list of mappings or a table of them is given one of each, in
turn, to see whether the loader reads keys inside it. A key added to the loader is therefore
found with no change here. Nothing here changes what the loader accepts or what it says.

Paths are written as the loader writes them, with ``[]`` for any item of a list and
``<name>`` for any name in a table: ``vhosts.<name>.queues[].dead_letter.exchange``. The
documentation site's configuration reference is rendered from this (``docs/hooks.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from postroom.config.reader import Reader

#: What stands for any name in a table (a vhost, an exchange) in a path.
NAME = "<name>"

_INDEX = re.compile(r"\[\d+\]")
_TOKEN = re.compile(r"\[\]|[^.\[\]]+")


@dataclass(frozen=True, slots=True)
class Key:
    """One key the loader accepts."""

    path: str
    #: The loader refuses a mapping without it.
    required: bool
    #: What the loader reads the value as, in the words of its checks (``a duration ...``).
    kinds: tuple[str, ...]
    #: The path of the mapping the loader reads inside the value, when it reads one: the value
    #: itself (``storage.archive``), an item of a list (``users[]``) or a name in a table, one
    #: level (``vhosts.<name>``) or two (``users[].topic_permissions.<name>.<name>``) deep.
    section: str | None

    @property
    def name(self) -> str:
        return _tokens(self.path)[-1]


@dataclass(frozen=True, slots=True)
class Section:
    """A mapping of the file, with the keys the loader accepts in it (sorted)."""

    path: str
    keys: tuple[Key, ...]


def accepted_keys() -> tuple[Section, ...]:
    """Every mapping of a configuration file and the keys the loader accepts in it, the top
    level first, then each section in the order it was found."""
    document: dict[str, Any] = {}
    run = _Tracer()
    run.absorb(_run(document))
    nested: dict[str, str] = {}
    probed: set[str] = set()
    while True:
        todo = [
            (section, key)
            for section, (allowed, _) in list(run.sections.items())
            for key in sorted(allowed)
            if _join(section, key) not in probed
        ]
        if not todo:
            break
        for section, key in todo:
            path = _join(section, key)
            probed.add(path)
            holder = _locate(document, section)
            for probe, inner in _PROBES:
                holder[key] = probe()
                trial = _run(document)
                run.absorb(trial)
                if inner(path) in trial.sections:
                    nested[path] = inner(path)
                    break
            else:
                holder[key] = None  # read as absent, so that its check is seen
        run.absorb(_run(document))
    return tuple(
        Section(
            section,
            tuple(
                Key(
                    _join(section, key),
                    key in required or _join(section, key) in run.required,
                    tuple(run.kinds.get(_join(section, key), ())),
                    nested.get(_join(section, key)),
                )
                for key in sorted(allowed)
            ),
        )
        for section, (allowed, required) in run.sections.items()
    )


def normalize(path: str) -> str:
    """A path as the loader reports it (``users[2].limits``) in the form used here (``users[].limits``)."""
    return _INDEX.sub("[]", path)


# -- the tracing reader ---------------------------------------------------------------------------


def _kind(describe: Callable[..., str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Note what a check of :class:`Reader` reads its value as, when it is the outermost one
    (``name`` calls ``string``, which calls ``typed``: a name is noted as a name)."""

    def wrap(check: Callable[..., Any]) -> Callable[..., Any]:
        def traced(self: _Tracer, value: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            if self.depth == 0:
                self.note(path, describe(*args, **kwargs))
            self.depth += 1
            try:
                return check(self, value, path, *args, **kwargs)
            finally:
                self.depth -= 1

        return traced

    return wrap


def _integer(default: Any, minimum: int = 0, maximum: int | None = None) -> str:
    if maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    return f"an integer, at least {minimum}"


class _Tracer(Reader):
    """A reader that notes each mapping it reads, with its allowed and required keys, and
    what each value is checked as; the problems it finds are of no interest here."""

    def __init__(self) -> None:
        super().__init__("<reference>")
        self.sections: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        self.kinds: dict[str, dict[str, None]] = {}
        #: Keys reported missing by their own check (``name`` says ``is required``).
        self.required: set[str] = set()
        self.depth = 0

    def note(self, path: str, kind: str) -> None:
        self.kinds.setdefault(normalize(path), {})[kind] = None

    def absorb(self, other: _Tracer) -> None:
        for section, keys in other.sections.items():
            self.sections.setdefault(section, keys)
        for path, kinds in other.kinds.items():
            self.kinds.setdefault(path, {}).update(kinds)
        self.required.update(normalize(problem.key) for problem in other.problems if problem.reason == "is required")

    def mapping(self, value: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:
        self.sections.setdefault(normalize(path), (frozenset(allowed), frozenset(required)))
        return super().mapping(value, path, allowed, required)

    typed = _kind(lambda check, expected, default: expected)(Reader.typed)
    string = _kind(lambda default=None: "a string")(Reader.string)
    name = _kind(lambda: "a name (a string of at most 255 bytes)")(Reader.name)
    boolean = _kind(lambda default: "true or false")(Reader.boolean)
    integer = _kind(_integer)(Reader.integer)
    duration = _kind(lambda default=None: "a duration with a unit (500ms, 30s, 5m, 1h, 7d)")(Reader.duration)
    size = _kind(lambda default=None: "a size: bytes, or with a unit (64KiB, 64MiB, 1GiB, 10MB)")(Reader.size)
    table = _kind(lambda: "a mapping")(Reader.table)
    tags = _kind(lambda: "a list of strings")(Reader.tags)
    endpoint = _kind(lambda default: "a Twisted endpoint: tcp:, tcp6: or unix:")(Reader.endpoint)
    optional_listener = _kind(lambda default: "a Twisted endpoint (tcp:, tcp6: or unix:), or false for none")(
        Reader.optional_listener
    )


def _run(document: dict[str, Any]) -> _Tracer:
    tracer = _Tracer()
    tracer.broker(document)
    return tracer


# -- documents ------------------------------------------------------------------------------------

#: What a key is given to find whether the loader reads a mapping inside it, and where that
#: mapping's path would then be: the value itself, an item of a list, a name in a table, a
#: name in a table of tables.
_PROBES: tuple[tuple[Callable[[], Any], Callable[[str], str]], ...] = (
    (lambda: {}, lambda path: path),
    (lambda: [{}], lambda path: f"{path}[]"),
    (lambda: {NAME: {}}, lambda path: f"{path}.{NAME}"),
    (lambda: {NAME: {NAME: {}}}, lambda path: f"{path}.{NAME}.{NAME}"),
)


def _tokens(path: str) -> list[str]:
    return _TOKEN.findall(path)


def _join(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def _locate(document: dict[str, Any], section: str) -> dict[str, Any]:
    """The mapping at ``section`` in ``document`` (built by the probes, so it is there)."""
    holder: Any = document
    for token in _tokens(section):
        holder = holder[0] if token == "[]" else holder[token]
    return holder

"""The configuration reference of the documentation site lists every key the loader accepts.

The reference is rendered by ``docs/hooks.py`` from ``postroom.config.reference``, which runs the
loader's reader. These tests find the accepted keys another way, from the loader's public
answers alone: a key it does not know is refused with the list of those it expects there
("unknown key (expected one of: ...)"), so putting one unknown key in each mapping of a file,
and going down into every key that holds mappings, gives every key the loader accepts.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import postroom.config.loader
import postroom.config.reader
import postroom.config.reference

ROOT = Path(__file__).resolve().parents[2]
#: A key no section has.
UNKNOWN = "zz_not_a_key"
#: What stands for any name in a table in the reference's paths.
NAME = "<name>"
EXPECTED = "unknown key (expected one of: "
ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)
#: The loader's reader as imported, put back after a test that changes it.
READER = postroom.config.reader


def load_hooks() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("postroom_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> types.ModuleType:
    return load_hooks()


# -- the keys, from the loader's answers ----------------------------------------------------------


def document(steps: tuple[str, ...], leaf: Any) -> Any:
    """A document with ``leaf`` at ``steps`` (keys, and ``[]`` for the first item of a list)."""
    value = leaf
    for step in reversed(steps):
        value = [value] if step == "[]" else {step: value}
    return value


def loader_path(steps: tuple[str, ...]) -> str:
    """``steps`` as the loader writes a key path (``users[0].name``)."""
    path = ""
    for step in steps:
        path = f"{path}[0]" if step == "[]" else f"{path}.{step}" if path else step
    return path


def expected_keys(steps: tuple[str, ...]) -> set[str] | None:
    """The keys the loader expects in the mapping at ``steps``, or ``None`` if it reads none there."""
    loader = postroom.config.loader  # looked up each time: a test replaces it
    try:
        loader.loads(yaml.safe_dump(document((*steps, UNKNOWN), 1)), "probe.yaml")
    except loader.ConfigError as error:
        where = loader_path((*steps, UNKNOWN))
        for problem in error.problems:
            if problem.key == where and problem.reason.startswith(EXPECTED):
                return set(problem.reason[len(EXPECTED) : -1].split(", "))
    return None


def keys_the_loader_accepts() -> set[str]:
    """Every key path the loader accepts, written as the reference writes them."""
    found: set[str] = set()
    mappings: list[tuple[str, ...]] = [()]
    while mappings:
        steps = mappings.pop()
        keys = expected_keys(steps)
        assert keys is not None, f"the loader no longer reads a mapping at {loader_path(steps)!r}"
        for key in keys:
            found.add(loader_path((*steps, key)).replace("[0]", "[]"))
            for shape in ((), ("[]",), (NAME,), (NAME, NAME)):  # a mapping, a list or a table of them
                inner = (*steps, key, *shape)
                if expected_keys(inner) is not None:
                    mappings.append(inner)
                    break
    return found


def documented(markdown: str) -> set[str]:
    """The keys the reference has a row for."""
    return set(ROW.findall(markdown))


@pytest.fixture(scope="module")
def accepted() -> set[str]:
    return keys_the_loader_accepts()


# -- the tests ------------------------------------------------------------------------------------


def test_the_crawl_finds_keys_at_every_depth(accepted: set[str]) -> None:
    for key in (
        "listen.amqp",
        "storage.archive.retention",
        "limits.disk_free_limit.mem_relative",
        "users[].topic_permissions.<name>.<name>.write",
        "vhosts.<name>.queues[].dead_letter.exchange",
        "plugins[].settings",
    ):
        assert key in accepted
    assert len(accepted) > 80


def test_every_key_the_loader_accepts_is_in_the_reference(hooks: types.ModuleType, accepted: set[str]) -> None:
    assert sorted(accepted - documented(hooks.render_reference())) == []


def test_the_reference_has_no_key_the_loader_refuses(hooks: types.ModuleType, accepted: set[str]) -> None:
    assert sorted(documented(hooks.render_reference()) - accepted) == []


def test_a_key_left_out_of_the_reference_is_reported(hooks: types.ModuleType, accepted: set[str]) -> None:
    markdown = hooks.render_reference()
    row = "| `storage.archive.retention` |"
    shorter = "\n".join(line for line in markdown.splitlines() if not line.startswith(row))
    assert shorter != markdown
    assert sorted(accepted - documented(shorter)) == ["storage.archive.retention"]


@pytest.fixture
def loader_with_a_new_key() -> Iterator[None]:
    """The loader as if ``metrics:`` had been given a key ``zz_added``: its reader's own source
    (``postroom.config.reader``), changed where the section's keys are written, run as the module
    everyone imports."""
    source = Path(postroom.config.reader.__file__).read_text(encoding="utf-8")
    assert source.count('"metrics", {"rabbitmq_compatible"}') == 1
    changed = types.ModuleType("postroom.config.reader")
    changed.__file__ = postroom.config.reader.__file__
    sys.modules["postroom.config.reader"] = changed
    try:
        exec(
            compile(
                source.replace('"metrics", {"rabbitmq_compatible"}', '"metrics", {"rabbitmq_compatible", "zz_added"}'),
                postroom.config.reader.__file__,
                "exec",
            ),
            changed.__dict__,
        )
        postroom.config.reader = changed
        importlib.reload(postroom.config.loader)
        importlib.reload(postroom.config.reference)
        yield
    finally:
        sys.modules["postroom.config.reader"] = READER
        postroom.config.reader = READER
        importlib.reload(postroom.config.loader)
        importlib.reload(postroom.config.reference)


def test_a_key_added_to_the_loader_appears_in_the_reference(
    hooks: types.ModuleType, loader_with_a_new_key: None
) -> None:
    assert "metrics.zz_added" in keys_the_loader_accepts()
    assert "metrics.zz_added" in documented(hooks.render_reference())


def test_the_page_holds_the_marker_and_the_hook_fills_it(hooks: types.ModuleType) -> None:
    page_text = (ROOT / "docs" / hooks.PAGE).read_text(encoding="utf-8")
    assert page_text.count(hooks.MARKER) == 1

    def page(src_uri: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(file=types.SimpleNamespace(src_uri=src_uri))

    filled = hooks.on_page_markdown(page_text, page=page(hooks.PAGE), config={}, files=[])
    assert hooks.MARKER not in filled
    assert "| `vhosts.<name>.queues[].visibility_timeout` |" in filled
    assert hooks.on_page_markdown(hooks.MARKER, page=page("index.md"), config={}, files=[]) == hooks.MARKER

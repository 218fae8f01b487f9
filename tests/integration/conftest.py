"""Fixtures of the cluster tests: one etcd member for a test file, and labs of three Postroom
nodes on it (``postroom.broker.tools.cluster_lab``), each under a key prefix of its own."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from postroom.broker.tools.cluster_lab import EtcdMissing, Lab, etcd_members

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    try:
        with etcd_members(1, tmp_path_factory.mktemp("etcd")) as urls:
            yield urls
    except EtcdMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(str(missing))
        pytest.skip(str(missing))


@pytest.fixture
def make_lab(etcd: list[str], tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    """Makes the test's lab (``start``: with every node started; other keywords go to
    :class:`Lab`), with a lease-sized ``in_sync_timeout`` and ``confirm_timeout``; stops it
    after the test, which then fails on a traceback in any node's log."""
    labs: list[Lab] = []

    def make(start: bool = True, **options: Any) -> Lab:
        lab = Lab(
            tmp_path,
            etcd,
            settings="in_sync_timeout: 1s\nconfirm_timeout: 2s",
            prefix=f"test{next(_prefixes)}-{time.monotonic_ns()}",
            **options,
        )
        labs.append(lab)
        if start:
            lab.start_all()
        return lab

    try:
        yield make
    finally:
        for lab in labs:
            lab.stop_all()
    for lab in labs:
        assert lab.tracebacks() == [], lab.logs()


@pytest.fixture
def lab(make_lab: Callable[..., Lab]) -> Lab:
    return make_lab()

"""The oracle for the conformance transcripts: one private RabbitMQ node for the whole session.

The node comes from the Debian ``rabbitmq-server`` package through
:func:`broker.tools.testing.rabbitmq_node`, on free loopback ports, and is stopped at the end of the
session. Where the package is missing, or the node does not come up here, every test that
needs it is skipped, saying why. Postroom's side of each comparison is the in-process
``broker`` fixture of ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from transcript import oracle


@pytest.fixture(scope="session")
def rabbitmq_port() -> Iterator[int]:
    """The AMQP port of a RabbitMQ node shared by every conformance test (each uses names of its own)."""
    with oracle() as port:
        yield port

"""The strict YAML loader: one file in, a frozen :class:`BrokerConfig` out, or every problem at once.

Rules (``docs/configuration.md``):

* YAML is read with PyYAML's safe loader; duplicate keys, unknown keys and wrong types are
  errors, and every error names the file, the line, the key path and the reason;
* names are strings: ``off`` or ``1`` where a name is expected is refused, not turned into
  ``False`` or ``1``;
* durations carry a unit (``500ms``, ``30s``, ``5m``, ``1h``, ``7d``); sizes are bytes or carry
  a unit (``64KiB``, ``64MiB``, ``1GiB``, ``10MB``);
* references must resolve: a binding's exchange and queue, a dead-letter exchange, a user's
  vhost; a name declared twice in one vhost is a conflict.

Nothing is started when any of this fails: :func:`load` raises :class:`ConfigError` with all
the problems found.
"""

from __future__ import annotations

from pathlib import Path

from postroom.config.rabbitmq import is_definitions_json, loads_definitions
from postroom.config.reader import Reader
from postroom.config.schema import BrokerConfig
from postroom.config.values import ConfigError, Problem


def load(path: str | Path) -> BrokerConfig:
    """Read and validate the YAML file at ``path``.

    A RabbitMQ definitions export (JSON, told by its ``.json`` name or its first character) is
    read by :func:`config.rabbitmq.loads_definitions` instead.

    :raises ConfigError: the file cannot be read or is not a valid configuration.
    """

    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(source, [Problem(None, "", f"cannot read the file: {err.strerror or err}")]) from err
    if is_definitions_json(source, text):
        return loads_definitions(text, source)
    return loads(text, source)


def loads(text: str, source: str = "<string>") -> BrokerConfig:
    """Validate a configuration given as YAML text.

    :raises ConfigError: it is not a valid configuration.
    """
    reader = Reader(source)
    document = reader.parse(text)
    config = reader.broker(document)
    if reader.problems:
        raise ConfigError(source, reader.problems)
    assert config is not None
    return config

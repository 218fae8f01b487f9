"""Tools around the broker: the ``postroom`` command line, the dead-letter tools, and the
helpers tests, benchmarks and fuzzers share (a RabbitMQ node to compare with, free ports).
"""

__all__: list[str] = []

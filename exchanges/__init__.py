"""Exchange types: direct, fanout, topic and headers, registered through ``IExchangeType``."""

__all__: list[str] = []

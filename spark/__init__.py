"""PySpark jobs over Postroom's dead-letter and write-ahead log segments."""

__all__: list[str] = []

"""Postroom configuration: the schema, the strict YAML loader and the example files."""

__all__: list[str] = []

"""Bundled Postroom plugins; every module here is imported by discovery.

Only this folder is: other plugins come from ``postroom.plugins`` entry points or dotted module
paths named in the configuration, never from folders of this name elsewhere on ``sys.path``
(another distribution's top-level ``plugins/`` is none of Postroom's business).
"""

__all__: list[str] = []

"""Routes of the management API, written as RabbitMQ's dispatcher writes them
(``/queues/:vhost/:queue``): the first route whose pattern matches the path takes the request."""

from __future__ import annotations

from collections.abc import Callable

from postroom.broker.server.management.common import Answer, Call

#: A request's handler: its status and the body to send as JSON (``None``: none).
Handler = Callable[[Call], Answer]


class Router:
    """Patterns of path segments (``:name`` matches any one segment) and the handler of each
    method under each."""

    def __init__(self) -> None:
        self._routes: list[tuple[tuple[str, ...], dict[str, Handler]]] = []

    def add(self, pattern: str, **methods: Handler) -> None:
        """Route ``pattern`` (such as ``/queues/:vhost/:queue``): ``GET=handler``, ``PUT=...``;
        a pattern routed before gets these methods too."""
        parts = tuple(part for part in pattern.split("/") if part)
        for routed, handlers in self._routes:
            if routed == parts:
                handlers.update(methods)
                return
        self._routes.append((parts, dict(methods)))

    def find(self, path: list[str]) -> tuple[dict[str, Handler], dict[str, str]] | None:
        """The handlers of the first route matching ``path``, and its parameters; ``None``
        when no route does."""
        for pattern, methods in self._routes:
            if len(pattern) != len(path):
                continue
            params: dict[str, str] = {}
            for part, segment in zip(pattern, path, strict=True):
                if part.startswith(":"):
                    params[part[1:]] = segment
                elif part != segment:
                    break
            else:
                return methods, params
        return None

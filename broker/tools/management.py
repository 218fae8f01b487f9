"""A client of a running broker's management API (HTTP, JSON, RabbitMQ's paths), for the
``postroom`` commands that go through it: ``queues``, ``policies``, ``streams``,
``definitions export``, ``ctl`` and ``migrate``.

Standard library only (``urllib``), imported when a request is made: the command line starts
without loading it.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MANAGEMENT_URL", "management_get", "management_request", "management_call"]

#: The management API of a broker on its embedded default.
DEFAULT_MANAGEMENT_URL = "http://guest:guest@127.0.0.1:15672/"


def management_get(url: str, path: str, timeout: float = 10.0) -> object:
    """GET ``path`` (e.g. ``/api/queues``) from the management API at ``url`` (credentials in the URL).

    :raises OSError: the broker cannot be reached, or answered with an error status
    """
    return management_request(url, path, timeout=timeout)


def management_request(url: str, path: str, method: str = "GET", body: object = None, timeout: float = 10.0) -> object:
    """Send ``method`` to ``path`` of the management API at ``url`` (credentials in the URL),
    with ``body`` as JSON; the answer's JSON (``None`` for an empty answer).

    :raises OSError: the broker cannot be reached, or answered with an error status (the
        message has the status and RabbitMQ's ``reason``)
    """
    status, answer, where = management_call(url, path, method, body, timeout)
    if status >= 400:
        reason = answer.get("reason", answer) if isinstance(answer, dict) else answer
        raise OSError(f"{method} {where}: HTTP {status}: {reason}")
    return answer


def management_call(
    url: str,
    path: str,
    method: str = "GET",
    body: object = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, object, str]:
    """Send ``method`` to ``path`` of the management API at ``url`` (credentials in the URL):
    the answer's status, its JSON (``None`` when empty; the text when not JSON) and the URL asked.

    :raises OSError: the broker cannot be reached
    """
    import base64
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    base = f"{parts.scheme or 'http'}://{host}:{parts.port or 15672}"
    credentials = f"{urllib.parse.unquote(parts.username or 'guest')}:{urllib.parse.unquote(parts.password or 'guest')}"
    sent = {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode(), **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    request = urllib.request.Request(base + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None, base + path
    except ValueError:
        return status, raw.decode("utf-8", "replace"), base + path

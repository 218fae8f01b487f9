"""The ``/api`` resource: finds a request's route, checks its login, runs its handler and
answers in RabbitMQ's shape.

As RabbitMQ's (cowboy's REST flow): a path no route matches is 404 and a method its route does
not take is 405, both before the login is looked at; then a failed login is 401 with the
challenge of RabbitMQ's realm; a user without a management tag is 401 too. A request that
changes what the write-ahead log keeps is answered once the change is durable.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from postroom.broker.server.http import BoundedSite
from postroom.broker.server.management import (
    dead_letter_endpoints,
    definitions,
    health,
    objects,
    parameters,
    policies,
    shovels,
    streams,
    users,
    views,
)
from postroom.broker.server.management.common import (
    DEFAULT_SORTS,
    MANAGEMENT_TAGS,
    REALM,
    Call,
    Context,
    Problem,
    json_default,
    not_authorised,
    not_found,
    query_of,
    segments,
    shaped,
)
from postroom.broker.server.management.rates import RateSampler
from postroom.broker.server.management.router import Handler, Router
from postroom.broker.server.protocol import is_loopback

if TYPE_CHECKING:
    from postroom.broker.core.node import Node
    from postroom.broker.core.users import User
    from postroom.broker.server.clusterview import ClusterView
    from postroom.broker.server.shovels import Shovels


#: Lists answered in the order they are made unless a ``sort`` is asked for (bindings come
#: in their exchanges' order; Postroom's dead-letter reports newest first; the rest sort by vhost
#: and name, as RabbitMQ's).
UNSORTED = frozenset(
    {"bindings", "definitions", "feature-flags", "extensions", "policies", "operator-policies", "dead-letters"}
)


#: Lists that answer a ``page`` (RabbitMQ's).
PAGINATED = frozenset({"queues", "exchanges", "vhosts", "connections", "channels"})


def routes() -> Router:
    """Every route of the API, in the order RabbitMQ's dispatcher lists them."""
    router = Router()
    parts = (health, views, streams, policies, parameters, definitions, objects, users, dead_letter_endpoints, shovels)
    for part in parts:
        part.install(router)
    return router


#: ``GET /api/auth``, which RabbitMQ answers without a login: how the UI logs in (OAuth 2 is
#: not offered here, as on a RabbitMQ without it configured).
NO_OAUTH = {"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""}


class ManagementAPI(Resource):
    """The ``/api`` tree (a leaf resource: it routes the path itself).

    :param context: what the handlers read (the node, its rates, the dead-letter analysis'
        reports, its shovels, the cluster it leads)
    """

    isLeaf = True
    _log = Logger()

    def __init__(self, context: Context) -> None:
        super().__init__()
        self.node = context.node
        self.context = context
        self.router = routes()

    # -- plumbing -------------------------------------------------------------------------------

    def render(self, request: Request) -> bytes | int:
        """Route the request, check its login (off the reactor for an expensive hash, see
        ``Node.login``), then answer it."""
        request.setHeader(b"Content-Type", b"application/json")
        try:
            path = segments(request.uri)
            if path == ["auth"] and request.method == b"GET":  # (asked before any login, as RabbitMQ)
                return json.dumps(NO_OAUTH).encode()
            found = self.router.find(path)
            if found is None:
                raise not_found()
            methods, params = found
            handler = methods.get(request.method.decode("latin-1"))
            if handler is None:
                raise Problem(405, "", "")  # answered without a body
        except Problem as problem:
            return self._refused(request, problem)
        header = (request.getHeader(b"authorization") or b"").decode("latin-1")
        scheme, _, encoded = header.partition(" ")
        try:
            username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            username = password = ""
        if scheme.lower() != "basic" or not username:
            return self._refused(request, Problem(401, "", ""), challenge=True)  # no credentials
        gone: list[object] = []
        request.notifyFinish().addBoth(gone.append)
        host = getattr(request.getClientAddress(), "host", "")

        def checked(user: User | None, reason: str) -> None:
            if gone:  # the client hung up while its login was checked
                return
            journal = self.node.journal
            before = journal.position if journal is not None else 0
            answer = self._answer(request, user, handler, params, path[0])
            if journal is None or journal.position == before:
                send(answer)
            else:
                journal.when_durable(lambda durable: send(answer if durable else self._not_written(request)))

        def send(answer: bytes) -> None:
            if not gone:
                request.write(answer)
                request.finish()

        self.node.login(username, password, is_loopback(host), host, checked)
        return NOT_DONE_YET

    def _answer(
        self, request: Request, user: User | None, handler: Handler, params: dict[str, str], kind: str
    ) -> bytes:
        """Run ``handler`` for ``user`` and render its answer (``kind``: the path's first segment)."""
        if user is None:
            return self._refused(request, Problem(401, "not_authorized", "Login failed"), challenge=True)
        try:
            if MANAGEMENT_TAGS.isdisjoint(user.tags):
                raise not_authorised("Not management user")
            query = query_of(request.uri)
            status, body = handler(Call(self.context, user, request, params, query))
            if isinstance(body, list) and request.method == b"GET":
                body = shaped(body, query, () if kind in UNSORTED else DEFAULT_SORTS, kind in PAGINATED)
            elif isinstance(body, dict) and request.method == b"GET" and "columns" in query:
                body = shaped([body], query, (), False)[0]  # (one object is cut to columns too)
        except Problem as problem:
            return self._refused(request, problem)
        except Exception:
            self._log.failure("management API request {path} failed", path=request.path)
            status, body = 500, {"error": "internal_error", "reason": "internal error (see the broker log)"}
        request.setResponseCode(status)
        if body is None:
            return b""
        return json.dumps(body, default=json_default).encode()

    @staticmethod
    def _refused(request: Request, problem: Problem, challenge: bool = False) -> bytes:
        """The answer to a refused request: its status and ``{"error", "reason"}`` (none for
        405 and 415, and for 401 without credentials, as RabbitMQ answers them); with
        ``challenge`` (a login that failed or was not given), the challenge of RabbitMQ's realm."""
        request.setResponseCode(problem.status)
        if challenge:
            request.setHeader(b"WWW-Authenticate", f'Basic realm="{REALM}"'.encode())
        if not problem.error:
            request.responseHeaders.removeHeader(b"Content-Type")
            return b""
        return json.dumps({"error": problem.error, "reason": problem.reason}).encode()

    @staticmethod
    def _not_written(request: Request) -> bytes:
        """The answer to a change the write-ahead log could not keep (it holds in memory)."""
        request.setResponseCode(500)
        reason = "the change was made but could not be written to the write-ahead log (see the broker log)"
        return json.dumps({"error": "internal_error", "reason": reason}).encode()


class UIFile(Resource):
    """One file of the web UI (``broker/server/management/ui``), with headers that keep it to
    its own origin: scripts and styles from the broker only, never in a frame."""

    isLeaf = True

    def __init__(self, name: str, content_type: bytes) -> None:
        super().__init__()
        self.path = os.path.join(UI_DIRECTORY, name)
        self.content_type = content_type

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", self.content_type)
        policy = b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
        request.setHeader(b"content-security-policy", policy)
        request.setHeader(b"x-frame-options", b"DENY")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"cache-control", b"no-cache")
        with open(self.path, "rb") as file:
            return file.read()


#: The web UI's files, served as they are (no build step).
UI_DIRECTORY = os.path.join(os.path.dirname(__file__), "ui")
UI_FILES = {"app.js": b"text/javascript; charset=utf-8", "style.css": b"text/css; charset=utf-8"}


def management_site(
    node: Node,
    sampler: RateSampler,
    reactor: Any = None,
    reports: str | None = None,
    shovels: Shovels | None = None,
    cluster: ClusterView | None = None,
) -> Site:
    """A twisted.web ``Site`` serving the API under ``/api`` and the web UI at ``/`` (its
    timeouts on ``reactor``, the global one by default; ``reports``: the folder of the
    dead-letter analysis' reports the UI lists; ``shovels``: the node's running shovels)."""
    root = Resource()
    root.putChild(b"api", ManagementAPI(Context(node, sampler, reports, shovels, cluster)))
    root.putChild(b"", UIFile("index.html", b"text/html; charset=utf-8"))
    root.putChild(b"reports", dead_letter_endpoints.ReportPage(reports, time.time))
    ui = Resource()
    for name, content_type in UI_FILES.items():
        ui.putChild(name.encode(), UIFile(name, content_type))
    root.putChild(b"ui", ui)
    return BoundedSite(root, reactor=reactor)

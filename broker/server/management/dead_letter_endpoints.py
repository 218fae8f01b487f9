"""Dead letters for the web UI (Postroom's own endpoints, beside RabbitMQ's):

* ``GET /api/dead-letters``: every dead-letter queue the user may read (a queue dead letters
  reached in this run, or one recovered holding them), with its count and, over its first
  :data:`SUMMARY_SCAN` messages, its dead letters by reason and by the queue they died in;
* ``GET /api/dead-letters/VHOST/QUEUE?limit=&reason=&source=&header=NAME=VALUE&age=SECONDS``:
  its first messages that match, each with its whole ``x-death`` history (nothing is taken);
* ``GET /api/dead-letters/reports[/NAME]``: the reports ``postroom dlq analyze`` wrote under the
  folder ``ui.reports`` names (each a folder with ``summary.json`` and ``report.html``): listed
  newest first with their totals, or one with its summary and a link to its HTML report
  (:class:`ReportPage`, which a browser opens in a tab of its own);
* ``POST /api/dead-letters/VHOST/QUEUE/redrive`` with ``ids`` (dead-letter ids) or ``filter``,
  ``to`` (``{"exchange", "routing_key"}``; left out: where each died) and ``rate`` (moves a
  second): a redrive job, run on the reactor a batch at a time; ``GET
  /api/dead-letters/jobs/ID`` shows its progress.

A redrive is what ``postroom dlq redrive`` does, in the broker: each dead letter going back
where it died must carry the broker's seal (``broker.core.seal``), which names the queue; the
copy is enqueued there (or routed to ``to``, without the seal and the dead-letter id), and the
dead letter is acknowledged in its queue only once the log holds the copy (confirm, then ack).
Messages that do not match, or that cannot go back (no seal, a seal that does not hold, no
such queue, no write permission), stay where they are, in their order.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import secrets
import time
from collections import Counter
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from twisted.logger import Logger
from twisted.web.resource import Resource

from postroom.broker.amqp.connection import reply_text
from postroom.broker.core.message import Message
from postroom.broker.core.queue import WorkQueue
from postroom.broker.core.seal import DEAD_LETTER_ID_HEADER, UNSEALED, without_entries
from postroom.broker.errors import ChannelException
from postroom.broker.server.management.common import SEE_ALL_TAGS, Answer, Call, Problem, not_authorised, not_found
from postroom.broker.server.management.router import Router
from postroom.broker.wire.codec import shortstr
from postroom.broker.wire.content import ContentError

if TYPE_CHECKING:
    from collections.abc import Callable

    from twisted.web.server import Request

    from postroom.broker.core.entry import Entry, Queue
    from postroom.broker.core.users import User
    from postroom.broker.core.vhost import VirtualHost

_log = Logger()

#: Messages of a dead-letter queue the summary reads (by reason, by source).
SUMMARY_SCAN = 1000
#: Messages a listing looks at, at most, for those that match.
LIST_SCAN = 10_000
#: Messages a listing shows, at most.
LIST_LIMIT = 1000
#: Bytes of a body a listing shows.
PREVIEW_BYTES = 200
#: Redrive jobs kept for their progress (the oldest finished ones go first).
KEPT_JOBS = 50

#: What a copy sent to ``to`` leaves behind, as the command line's redrive does.
_NOT_COPIED = (*UNSEALED, DEAD_LETTER_ID_HEADER.encode())


def install(router: Router) -> None:
    router.add("/dead-letters", GET=summary)
    router.add("/dead-letters/jobs/:job", GET=job_progress)
    router.add("/dead-letters/reports", GET=reports)
    router.add("/dead-letters/reports/:report", GET=report)
    router.add("/dead-letters/:vhost/:queue", GET=listing)
    router.add("/dead-letters/:vhost/:queue/redrive", POST=start_redrive)


def deaths(message: Message) -> list[dict[str, Any]]:
    """A message's ``x-death`` history, newest first, each entry with ``time`` in seconds."""
    history = message.lenient_headers().get("x-death")
    if not isinstance(history, list):
        return []
    shown = []
    for entry in history:
        if not isinstance(entry, dict):
            continue
        item: dict[str, Any] = {
            key: value for key, value in entry.items() if isinstance(value, str | int | float | list)
        }
        when = entry.get("time")
        if isinstance(when, datetime):
            when = when.timestamp()
        item["time"] = when if isinstance(when, int | float) else None
        shown.append(item)
    return shown


def _dead_letter_queues(call: Call) -> list[tuple[VirtualHost, Queue]]:
    found = []
    for vhost in call.context.vhosts(call.user):
        for queue in vhost.queues.values():
            watched = isinstance(queue, WorkQueue) and queue.dead_letter_watch is not None
            if queue.name in vhost.dead_letter_queues or watched:
                if _may_read(call.user, vhost, queue):
                    found.append((vhost, queue))
    return found


def _may_read(user: User, vhost: VirtualHost, queue: Queue) -> bool:
    access = user.access(vhost.name)
    if access is None:
        return queue.owner is None
    try:
        access.check("read", "queue", queue.name)
    except ChannelException:
        return False
    return queue.owner is None


def summary(call: Call) -> Answer:
    listed = []
    for vhost, queue in _dead_letter_queues(call):
        reasons: Counter[str] = Counter()
        sources: Counter[str] = Counter()
        entries = queue.ready.peek(SUMMARY_SCAN) if isinstance(queue, WorkQueue) else []
        for entry in entries:
            history = deaths(entry.message)
            if history:
                reasons[str(history[0].get("reason"))] += 1
                sources[str(history[0].get("queue"))] += 1
        listed.append(
            {
                "vhost": vhost.name,
                "name": queue.name,
                "messages": queue.message_count,
                "messages_unacknowledged": queue.unacked_count,
                "dead_lettered_total": vhost.dead_letter_queues.get(queue.name, 0),
                "reasons": dict(reasons.most_common()),
                "sources": dict(sources.most_common()),
                "sampled": len(entries),
            }
        )
    return 200, listed


class Filter:
    """Which dead letters a listing or a redrive takes: the latest death's reason and queue, a
    header's value, an age (seconds since the latest death), and dead-letter ids."""

    def __init__(self, values: dict[str, Any], ids: Any = None, now: float = 0.0) -> None:
        self.reason = str(values.get("reason") or "")
        self.source = str(values.get("source") or "")
        header = str(values.get("header") or "")
        self.header_name, _equals, self.header_value = header.partition("=")
        try:
            self.age = float(values.get("age") or 0)
        except ValueError:
            raise Problem(400, "bad_request", "age must be a number of seconds") from None
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) for i in ids)):
            raise Problem(400, "bad_request", "ids must be a list of dead-letter ids (integers)")
        self.ids = set(ids) if ids is not None else None
        self.now = now

    def matches(self, message: Message) -> bool:
        headers = message.lenient_headers()
        if self.ids is not None and headers.get(DEAD_LETTER_ID_HEADER) not in self.ids:
            return False
        history = deaths(message)
        latest = history[0] if history else {}
        if self.reason and latest.get("reason") != self.reason:
            return False
        if self.source and latest.get("queue") != self.source:
            return False
        if self.header_name and str(headers.get(self.header_name)) != self.header_value:
            return False
        if self.age:
            when = latest.get("time")
            if not isinstance(when, int | float) or self.now - when < self.age:
                return False
        return True


def _queue(call: Call) -> tuple[VirtualHost, WorkQueue]:
    queue = call.context.readable_queue(call.user, call.params["vhost"], call.params["queue"])
    vhost = call.node.vhosts[call.params["vhost"]]
    if not isinstance(queue, WorkQueue):
        raise Problem(400, "bad_request", "a stream is not a dead-letter queue here: its messages are not taken")
    return vhost, queue


def listing(call: Call) -> Answer:
    vhost, queue = _queue(call)
    query = {key: values[-1] for key, values in call.query.items()}
    try:
        limit = min(int(query.get("limit", "100")), LIST_LIMIT)
    except ValueError:
        raise Problem(400, "bad_request", "limit must be an integer") from None
    chosen = Filter(query, now=queue.now())
    entries = queue.ready.peek(LIST_SCAN)
    shown: list[dict[str, Any]] = []
    matched = 0
    for entry in entries:
        message = entry.message
        if not chosen.matches(message):
            continue
        matched += 1
        if len(shown) < limit:
            dead_letter_id = message.lenient_headers().get(DEAD_LETTER_ID_HEADER)
            shown.append(
                {
                    "dead_letter_id": dead_letter_id if isinstance(dead_letter_id, int) else None,
                    "routing_key": message.routing_key,
                    "deaths": deaths(message),
                    "payload_bytes": len(message.body),
                    "preview": message.body[:PREVIEW_BYTES].decode("utf-8", "replace"),
                }
            )
    return 200, {"scanned": len(entries), "matched": matched, "messages": shown}


class RedriveJob:
    """One redrive, run a batch at a time on the node's clock (see the module's text)."""

    _numbers = itertools.count(1)

    def __init__(
        self, call: Call, vhost: VirtualHost, queue: Queue, chosen: Filter, to: tuple[str, str] | None, rate: float
    ) -> None:
        self.id = next(self._numbers)
        self.node, self.user, self.vhost, self.queue = call.node, call.user, vhost, queue
        self.chosen, self.to, self.rate = chosen, to, rate
        self.state = "running"
        self.moved = self.refused = self.skipped = 0
        #: Why messages were left where they are (the first few distinct reasons).
        self.refusals: list[str] = []
        #: Messages taken and left where they are: given back, in order, at the end.
        self.held: list[Entry] = []
        #: Of the messages in the queue at the start, those not looked at yet.
        self.left = queue.message_count
        self.pending = 0

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "vhost": self.vhost.name,
            "queue": self.queue.name,
            "state": self.state,
            "moved": self.moved,
            "refused": self.refused,
            "skipped": self.skipped,
            "refusals": self.refusals,
            "left": self.left,
        }

    def start(self) -> None:
        if self.node.clock is None:  # (no reactor: every batch at once)
            while not self._step():
                pass
        else:
            self._tick()

    def _tick(self) -> None:
        if not self._step():
            self.node.clock.callLater(0.1, self._tick)  # type: ignore[union-attr]

    def _refuse(self, entry: Entry, reason: str) -> None:
        self.refused += 1
        self.held.append(entry)
        if reason not in self.refusals and len(self.refusals) < 5:
            self.refusals.append(reason)

    def _step(self) -> bool:
        """One batch; whether the job is over. A batch that fails on what a message holds ends
        the job as failed, and what it held still goes back to the queue."""
        try:
            done = self._batch()
        except Exception:
            _log.failure("redrive of {queue} in vhost {vhost} failed", queue=self.queue.name, vhost=self.vhost.name)
            self.state, done = "failed", True
        if done or self.state != "running":
            self._finish()
            return True
        return False

    def _batch(self) -> bool:
        """Move up to a tenth of a second's worth; whether no message is left to look at."""
        batch = max(1, int(self.rate / 10))  # ten batches a second
        moved: list[Entry] = []
        exhausted = False
        while len(moved) < batch and self.left > 0 and not self.queue.deleted:
            entry = self.queue.get()
            if entry is None:
                exhausted = True
                break
            self.left -= 1
            if not self.chosen.matches(entry.message):
                self.skipped += 1
                self.held.append(entry)
                continue
            reason = self._send(entry.message)
            if reason is not None:
                self._refuse(entry, reason)
                continue
            moved.append(entry)
        if moved:
            self.pending += 1
            journal = self.node.journal
            if journal is None:
                self._settle(moved, True)
            else:
                journal.when_durable(partial(self._settle, moved))
        return exhausted or self.left <= 0 or self.queue.deleted

    def _send(self, message: Message) -> str | None:
        """Send ``message``'s copy on; why not, when it cannot go."""
        try:
            header = without_entries(message.header, _NOT_COPIED)
        except ContentError:
            return "its content header does not parse"
        access = self.user.access(self.vhost.name)
        if self.to is not None:
            exchange_name, routing_key = self.to
            exchange = self.vhost.exchanges.get(exchange_name) if exchange_name else None
            if exchange_name and exchange is None:
                return f"no exchange '{exchange_name}' in vhost '{self.vhost.name}'"
            try:
                if access is not None:
                    access.check("write", "exchange", exchange_name)
            except ChannelException as refused:
                return reply_text(refused)
            names = shortstr(exchange_name) + shortstr(routing_key)
            copy = Message(exchange_name, routing_key, names, header, message.body)
            targets = self.vhost.route(exchange, copy)
            if not targets:
                return f"no queue takes routing key '{routing_key}' from '{exchange_name}'"
            self.vhost.enqueue_routed(targets, copy)
            return None
        sealer = self.vhost.dead_letters.sealer if self.vhost.dead_letters is not None else None
        origin = None
        if sealer is not None:
            origin = sealer.verify(self.vhost.name, message.header, message.lenient_headers(), message.body)
        if origin is None:
            self.node.counters["redrives_refused"] += 1
            return "no seal of this broker that holds: give an exchange and routing key to send it to"
        target = self.vhost.queues.get(origin)
        if target is None:
            return f"the queue it died in, '{origin}', is not there"
        try:
            if access is not None:
                access.check("write", "queue", origin)
        except ChannelException as refused:
            return reply_text(refused)
        self.vhost.enqueue_routed([target], Message("", origin, shortstr("") + shortstr(origin), header, message.body))
        return None

    def _settle(self, entries: list[Entry], durable: bool) -> None:
        """The copies are in the log (``durable``): the dead letters go; else they stay."""
        self.pending -= 1
        if durable:
            self.queue.acked += len(entries)
            self.queue.settle(entries)
            self.moved += len(entries)
        else:
            self.queue.return_entries(entries)
            self.state = "failed"
        self._maybe_done()

    def _finish(self) -> None:
        if self.state not in ("running", "failed"):
            return  # (finished already)
        held, self.held = self.held, []
        if held:
            self.queue.return_entries(held)
        if self.state == "running":
            self.state = "settling"
            self._maybe_done()

    def _maybe_done(self) -> None:
        if self.state == "settling" and not self.pending:
            self.state = "done"


#: Redrive jobs by id (the newest :data:`KEPT_JOBS`).
JOBS: dict[int, RedriveJob] = {}


def start_redrive(call: Call) -> Answer:
    vhost, queue = _queue(call)
    body = call.body()
    rate = body.get("rate", 500)
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 1 <= rate <= 100_000:
        raise Problem(400, "bad_request", "rate must be a number of moves a second, from 1 to 100000")
    to = body.get("to")
    if to is not None:
        if not isinstance(to, dict) or not isinstance(to.get("exchange", ""), str):
            raise Problem(400, "bad_request", 'to must be {"exchange": NAME, "routing_key": KEY}')
        to = (to.get("exchange", ""), str(to.get("routing_key", "")))
    chosen = Filter(body.get("filter") or {}, body.get("ids"), now=queue.now())
    job = RedriveJob(call, vhost, queue, chosen, to, float(rate))
    JOBS[job.id] = job
    for old in sorted(JOBS)[:-KEPT_JOBS]:
        if JOBS[old].state in ("done", "failed"):
            del JOBS[old]
    job.start()
    return 202, job.view()


def job_progress(call: Call) -> Answer:
    try:
        job = JOBS.get(int(call.params["job"]))
    except ValueError:
        job = None
    if job is None or (job.user.name != call.user.name and "administrator" not in call.user.tags):
        raise not_found()
    return 200, job.view()


#: A report's files the API reads, at most this many bytes each.
REPORT_BYTES = 16 << 20


def _reports_folder(call: Call) -> str:
    """The reports' folder; reports are for the users who see every queue's dead letters."""
    if SEE_ALL_TAGS.isdisjoint(call.user.tags):
        raise not_authorised("Not monitor user")
    folder = call.context.reports
    if folder is None:
        raise Problem(404, "not_found", "no reports folder is configured (ui.reports)")
    return folder


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read(REPORT_BYTES)
    except OSError:
        return None


def reports(call: Call) -> Answer:
    folder = _reports_folder(call)
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    listed = []
    for name in names:
        summary_path = os.path.join(folder, name, "summary.json")
        raw = _read(summary_path)
        if raw is None:
            continue  # (not a report)
        try:
            summary = json.loads(raw)
        except ValueError:
            summary = {}
        listed.append(
            {
                "name": name,
                "modified": os.stat(summary_path).st_mtime,
                "html": os.path.exists(os.path.join(folder, name, "report.html")),
                **{key: summary.get(key) for key in ("total", "pending", "first_death", "last_death", "by_reason")},
            }
        )
    return 200, sorted(listed, key=lambda item: item["modified"], reverse=True)


def report(call: Call) -> Answer:
    """One report: its ``summary`` and, as text, its self-contained ``html`` (plots inlined)."""
    folder = _reports_folder(call)
    name = call.params["report"]
    if name.startswith(".") or os.sep in name:  # (a folder's name, nothing else)
        raise not_found()
    raw = _read(os.path.join(folder, name, "summary.json"))
    if raw is None:
        raise not_found()
    try:
        summary = json.loads(raw)
    except ValueError:
        raise Problem(500, "internal_error", f"report {name}: summary.json is not JSON") from None
    html_url = None
    if os.path.exists(os.path.join(folder, name, "report.html")):
        expires = int(time.time()) + TICKET_SECONDS
        html_url = f"reports/{quote(name, safe='')}?expires={expires}&ticket={ticket(name, expires)}"
    return 200, {"name": name, "summary": summary, "html_url": html_url}


#: How long the link to a report's HTML page lets a browser open it without credentials.
TICKET_SECONDS = 600
#: The key tickets are signed with: new in each run, so a restart ends every link.
_TICKET_KEY = secrets.token_bytes(32)


def ticket(name: str, expires: int) -> str:
    """The signature that lets ``/reports/NAME?expires=&ticket=`` open one report until
    ``expires``: a new tab cannot send the UI's credentials, so the UI asks for a link."""
    signed = hmac.new(_TICKET_KEY, f"{name}\n{expires}".encode(), hashlib.sha256)
    return signed.hexdigest()


class ReportPage(Resource):
    """``/reports/NAME?expires=&ticket=``: one report's ``report.html``, for a ticket from
    ``GET /api/dead-letters/reports/NAME`` that has not expired. The report keeps to itself: its
    inline style and inlined plots, no script, no request anywhere (``download=1`` saves it)."""

    isLeaf = True

    def __init__(self, folder: str | None, now: Callable[[], float]) -> None:
        super().__init__()
        self.folder = folder
        self.now = now

    def render_GET(self, request: Request) -> bytes:
        name = unquote(b"/".join(request.postpath or ()).decode("utf-8", "replace"))
        arguments = request.args
        try:
            expires = int(arguments.get(b"expires", [b""])[0])
            given = arguments.get(b"ticket", [b""])[0].decode("ascii")
        except (ValueError, UnicodeDecodeError):
            expires, given = 0, ""
        html = None
        if self.folder is not None and name and not name.startswith(".") and os.sep not in name:
            if expires >= self.now() and hmac.compare_digest(given, ticket(name, expires)):
                html = _read(os.path.join(self.folder, name, "report.html"))
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"cache-control", b"no-store")
        if html is None:
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"No such report, or its link has expired: open it again from the web UI.\n"
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        policy = b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; sandbox"
        request.setHeader(b"content-security-policy", policy)
        if arguments.get(b"download") == [b"1"]:
            request.setHeader(b"content-disposition", f'attachment; filename="{quote(name)}.html"'.encode())
        return html

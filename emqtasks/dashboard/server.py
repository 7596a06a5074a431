"""The dashboard's HTTP server: routes, token auth, CSRF, server-sent events, /metrics.

The standard library's ThreadingHTTPServer (a thread per request: an SSE stream holds one)
and Jinja2 templates with autoescaping on: every value from Redis is escaped by the
template engine, never pasted into HTML by hand. Assets are files of the package.

Auth: with a token, every request must carry it, as ``Authorization: Bearer <token>``
(programs, Prometheus) or by the ``emq_session`` cookie that the login form sets (people:
an HMAC of the token, see guard.py); anything else is answered 401. CSRF: every POST
carries the page's CSRF token (a form field or the ``X-CSRF-Token`` header), a random value
of this process that only a reader of the pages can know, and no Origin but its own; the
cookie is SameSite=Strict and HttpOnly besides. Without a token, only a loopback Host name
is answered (no DNS rebinding).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from ..canvas import WorkflowHandle
from ..errors import EmqError, ScriptError
from ..keys import check_job_id
from ..metrics import CONTENT_TYPE, Exporter
from ..queue import Queue
from . import guard, views

log = logging.getLogger("emqtasks.dashboard")
COOKIE = "emq_session"
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".svg": "image/svg+xml"}


class Refused(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class Dashboard:
    """Everything a request needs: the queues, the settings, the templates."""

    def __init__(self, queues: list[Queue], token: str | None = None,
                 read_only: bool = False, metrics_only: bool = False,
                 top_groups: int = 50) -> None:
        self.queues = {q.name: q for q in queues}
        self.views = {q.name: views.QueueView(q) for q in queues}
        self.first = queues[0].name
        self.token = token or None
        self.read_only = read_only
        self.metrics_only = metrics_only
        self.csrf = secrets.token_urlsafe(24)
        self.exporter = Exporter(queues, top_groups)
        self.stopping = threading.Event()
        self._env: Any = None

    @property
    def env(self) -> Any:
        if self._env is None:
            import jinja2

            self._env = jinja2.Environment(
                loader=jinja2.PackageLoader("emqtasks.dashboard", "templates"),
                autoescape=True, undefined=jinja2.StrictUndefined)
            self._env.filters["ago"] = _ago
            self._env.filters["pct"] = _pct
            self._env.filters["when"] = _when
            self._env.filters["q"] = lambda v: quote(str(v), safe="")
        return self._env

    def render(self, name: str, **values: Any) -> str:
        return str(self.env.get_template(name).render(
            read_only=self.read_only, csrf=self.csrf, queues=list(self.queues),
            auth=self.token is not None, **values))

    def authorized(self, headers: Any) -> bool:
        if self.token is None:
            return True
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer "):].strip()
            return hmac.compare_digest(given.encode(), self.token.encode())
        try:
            cookie = SimpleCookie(headers.get("Cookie", ""))
        except CookieError:
            return False
        value = cookie[COOKIE].value if COOKIE in cookie else ""
        return hmac.compare_digest(value.encode(), guard.session_value(self.token).encode())


def serve(dashboard: Dashboard, host: str, port: int) -> ThreadingHTTPServer:
    """A server bound and ready (not yet serving: call serve_forever)."""
    handler = type("Handler", (Handler,), {"dash": dashboard})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class Handler(BaseHTTPRequestHandler):
    dash: Dashboard
    server_version = "emqtasks-dashboard"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # -- plumbing ----------------------------------------------------------------------
    def _send(self, status: int, body: bytes | str, ctype: str = "text/html; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; style-src 'self'; script-src 'self'; "
                         "img-src 'self' data:; frame-ancestors 'none'")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
        self._send(HTTPStatus.SEE_OTHER, "", headers={"Location": to, **(headers or {})})

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _form(self) -> dict[str, list[str]]:
        size = int(self.headers.get("Content-Length") or 0)
        if size > 1_000_000:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request too large")
        raw = self.rfile.read(size).decode("utf-8", "replace") if size else ""
        return parse_qs(raw, keep_blank_values=True)

    def _queue(self, name: str | None) -> tuple[Queue, views.QueueView]:
        name = name or self.dash.first
        if name not in self.dash.queues:
            raise Refused(HTTPStatus.NOT_FOUND, f"no queue {name!r} here")
        return self.dash.queues[name], self.dash.views[name]

    def _unauthorized(self) -> None:
        nxt = self.path if self.command == "GET" and self.path.startswith("/") else "/"
        body = self.dash.render("login.html", error=None, next=nxt)
        self._send(HTTPStatus.UNAUTHORIZED, body,
                   headers={"WWW-Authenticate": 'Bearer realm="emqtasks"'})

    def _answer_failure(self, exc: Exception, method: str, path: str) -> None:
        """The page for what handling a request raised: a refusal with its status, a bad
        argument as 400, a vanished client as nothing, anything else (a script's failure
        too) as a logged 500."""
        if isinstance(exc, Refused):
            self._send(exc.status, self.dash.render("error.html", message=str(exc)))
        elif isinstance(exc, EmqError) and not isinstance(exc, ScriptError):
            self._send(HTTPStatus.BAD_REQUEST, self.dash.render("error.html", message=str(exc)))
        elif isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            pass
        else:
            log.error("%s %s failed", method, path, exc_info=exc)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                       self.dash.render("error.html", message="internal error (see the log)"))

    # -- GET ---------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def _host_refused(self) -> bool:
        """A tokenless dashboard answers only to a loopback Host (guard.py)."""
        if self.dash.token is None and not guard.host_ok(self.headers.get("Host")):
            self._send(HTTPStatus.MISDIRECTED_REQUEST,
                       "this dashboard has no token: it answers only on a loopback address",
                       "text/plain; charset=utf-8")
            return True
        return False

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if self._host_refused():
            return
        try:
            if path == "/login" and not self.dash.metrics_only:
                self._send(HTTPStatus.OK, self.dash.render("login.html", error=None,
                                                           next=self._query().get("next",
                                                                                  "/")))
                return
            if not self.dash.authorized(self.headers):
                self._unauthorized()
                return
            if path == "/metrics":
                self._send(HTTPStatus.OK, self.dash.exporter.render(), CONTENT_TYPE)
                return
            if self.dash.metrics_only:
                raise Refused(HTTPStatus.NOT_FOUND, "only /metrics here")
            self._get(path)
        except Exception as exc:
            self._answer_failure(exc, "GET", path)

    def _get(self, path: str) -> None:
        qs = self._query()
        queue, view = self._queue(qs.get("queue"))
        common = {"queue": queue.name}
        if path.startswith("/static/"):
            self._static(path[len("/static/"):])
        elif path == "/events":
            self._events(view)
        elif path == "/":
            self._send(HTTPStatus.OK, self.dash.render("overview.html", page="overview",
                                                       o=view.overview(), **common))
        elif path == "/lanes":
            lanes = view.lanes(qs.get("sort", "-pending"), qs.get("state", ""),
                               qs.get("q", ""), _int(qs.get("page"), 1))
            name = "_lanes_table.html" if qs.get("fragment") else "lanes.html"
            self._send(HTTPStatus.OK, self.dash.render(name, page="lanes", lanes=lanes,
                                                       **common))
        elif path in ("/jobs", "/dead"):
            self._jobs(path, queue, qs, common)
        elif path == "/job":
            detail = views.job_detail(queue, qs.get("id", "")) if qs.get("id") else None
            if detail is None:
                raise Refused(HTTPStatus.NOT_FOUND, "no such job (or its row expired)")
            self._send(HTTPStatus.OK, self.dash.render("job.html", page="jobs", job=detail,
                                                       **common))
        elif path == "/workflow":
            page = _int(qs.get("page"), 1)
            wf = views.workflow_detail(queue, qs.get("id", ""), page)
            if wf is None:
                raise Refused(HTTPStatus.NOT_FOUND, "no such workflow (or it expired)")
            self._send(HTTPStatus.OK, self.dash.render(
                "workflow.html", page="jobs", wf=wf, pg=page,
                pages=views.page_count(wf["total"]), done=_count(qs.get("done")),
                **common))
        elif path == "/workers":
            self._send(HTTPStatus.OK, self.dash.render(
                "workers.html", page="workers", workers=queue.workers(),
                schedules=_schedules(queue), now=time.time(), **common))
        else:
            raise Refused(HTTPStatus.NOT_FOUND, "no such page")

    def _jobs(self, path: str, queue: Queue, qs: dict[str, str], common: dict[str, Any]) -> None:
        dead = path == "/dead"
        if not dead and qs.get("id"):
            self._redirect(f"/job?queue={quote(queue.name)}&id={quote(qs['id'])}")
            return
        state = "dead" if dead else qs.get("state", "dead")
        if state not in views.JOB_STATES:
            raise Refused(HTTPStatus.BAD_REQUEST, "unknown state")
        f = views.JobFilter(state, qs.get("group", ""), qs.get("task", ""), qs.get("text", ""))
        page = _int(qs.get("page"), 1)
        groups = (list(self.dash.views[queue.name].stats.get()["groups"])
                  if f.state == "pending" and not f.group else None)
        rows, total, complete = views.find_jobs(queue, f, (page - 1) * views.PAGE,
                                                groups=groups)
        pages = views.page_count(total) if complete else page + 1
        name = "dead.html" if dead else "jobs.html"
        if qs.get("fragment"):
            name = "_jobs_table.html"
        self._send(HTTPStatus.OK, self.dash.render(
            name, page="dead" if dead else "jobs", rows=rows, total=total, f=f, pg=page,
            pages=pages, complete=complete, done=_count(qs.get("done")),
            bound=views.dead_bound(queue) if dead else "", **common))

    def _static(self, name: str) -> None:
        folder = resources.files("emqtasks.dashboard") / "static"
        if "/" in name or name.startswith(".") or not (folder / name).is_file():
            raise Refused(HTTPStatus.NOT_FOUND, "no such file")
        ctype = _STATIC_TYPES.get(name[name.rfind("."):], "application/octet-stream")
        self._send(HTTPStatus.OK, (folder / name).read_bytes(), ctype)

    def _events(self, view: views.QueueView) -> None:
        """Server-sent events: the queue's counts once a second, until the client goes."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            while not self.dash.stopping.is_set():
                s = view.stats.get()
                event = {k: s[k] for k in ("pending", "active", "delayed", "dead", "ring",
                                           "paused")}
                event["groups"] = len(s["groups"])
                event["t"] = time.time()
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                self.dash.stopping.wait(1.0)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return

    # -- POST --------------------------------------------------------------------------
    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._host_refused():
            return
        try:
            if not guard.origin_ok(self.headers.get("Origin"), self.headers.get("Host")):
                raise Refused(HTTPStatus.FORBIDDEN, "refused: a request from another site")
            form = self._form()
            one = {k: v[-1] for k, v in form.items()}
            given = one.get("csrf") or self.headers.get("X-CSRF-Token") or ""
            if not hmac.compare_digest(given.encode(), self.dash.csrf.encode()):
                raise Refused(HTTPStatus.FORBIDDEN, "refused: missing or wrong CSRF token")
            if path == "/login" and not self.dash.metrics_only:
                self._login(one)
                return
            if not self.dash.authorized(self.headers):
                self._unauthorized()
                return
            if self.dash.read_only:
                raise Refused(HTTPStatus.FORBIDDEN, "refused: the dashboard is read-only")
            queue, _ = self._queue(one.get("queue"))
            self._act(path, queue, one, form)
        except Exception as exc:
            self._answer_failure(exc, "POST", path)

    def _login(self, one: dict[str, str]) -> None:
        token = one.get("token", "")
        nxt = one.get("next", "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"
        if self.dash.token is None or not hmac.compare_digest(token.encode(),
                                                              self.dash.token.encode()):
            self._send(HTTPStatus.UNAUTHORIZED, self.dash.render(
                "login.html", error="wrong token", next=nxt))
            return
        cookie = f"{COOKIE}={guard.session_value(token)}; HttpOnly; SameSite=Strict; Path=/"
        self._redirect(nxt, {"Set-Cookie": cookie})

    def _act(self, path: str, queue: Queue, one: dict[str, str],
             form: dict[str, list[str]]) -> None:
        back = one.get("back", "/lanes")
        if not back.startswith("/") or back.startswith("//"):
            back = "/lanes"
        group = one.get("group", "")
        view = self.dash.views[queue.name]
        if path == "/action/pause":
            queue.pause_group(group) if group else queue.pause()
        elif path == "/action/resume":
            queue.resume_group(group) if group else queue.resume()
        elif path == "/action/limit":
            queue.set_group_limit(group, _opt_int(one.get("value")))
        elif path == "/action/weight":
            queue.set_group_weight(group, _opt_int(one.get("value")))
        elif path == "/action/rate":
            value = _opt_int(one.get("value"))
            queue.set_group_rate(group, value, float(one.get("per") or 1))
        elif path == "/dead/confirm":
            # "All that match" where the page's count was a lower bound: count them all
            # first (one full search), then the action runs on the jobs counted.
            verb = one.get("verb", "")
            if verb not in ("requeue", "cancel"):
                raise Refused(HTTPStatus.BAD_REQUEST, "unknown action")
            f = views.JobFilter("dead", one.get("group", ""), one.get("task", ""),
                                one.get("text", ""))
            bound = views.dead_bound(queue)
            n = len(views.matching_ids(queue, f, bound=bound))
            self._send(HTTPStatus.OK, self.dash.render(
                "dead_confirm.html", page="dead", queue=queue.name, verb=verb, f=f,
                count=n, bound=bound, back=back))
            return
        elif path in ("/dead/requeue", "/dead/cancel"):
            ids = self._targets(queue, one, form)
            if path == "/dead/requeue":
                n = queue.requeue_dead_ids(ids)
            else:
                n = views.cancel_ids(queue, ids)
            sep = "&" if "?" in back else "?"
            back = f"{back}{sep}done={n}"
        elif path == "/workflow/cancel":
            handle = WorkflowHandle(queue, check_job_id(one.get("id", "")))
            n = handle.cancel()
            back = f"/workflow?queue={quote(queue.name)}&id={quote(handle.id)}&done={n}"
        else:
            raise Refused(HTTPStatus.NOT_FOUND, "no such action")
        view.stats._value = None    # the next page shows the change
        self._redirect(back)

    def _targets(self, queue: Queue, one: dict[str, str],
                 form: dict[str, list[str]]) -> list[str]:
        """The ids an action on dead letters applies to: one, the selected, or all that
        match the filter (which the page showed with its count)."""
        if one.get("scope") == "filter":
            f = views.JobFilter("dead", one.get("group", ""), one.get("task", ""),
                                one.get("text", ""))
            return views.matching_ids(queue, f, bound=one.get("bound", ""))
        ids = form.get("id", [])
        if not ids:
            raise Refused(HTTPStatus.BAD_REQUEST, "no job selected")
        return ids


def _schedules(queue: Queue) -> list[Any]:
    try:
        from ..schedules import ScheduleStore

        return list(ScheduleStore(queue).infos())
    except Exception:   # schedules are optional; a queue without any shows none
        return []


def _int(text: str | None, default: int) -> int:
    try:
        return max(1, int(text or default))
    except ValueError:
        return default


def _count(text: str | None) -> int | None:
    """A count a redirect carries back to the page (anything else is dropped)."""
    return int(text) if text is not None and text.isdigit() else None


def _opt_int(text: str | None) -> int | None:
    if text is None or text.strip() in ("", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise Refused(HTTPStatus.BAD_REQUEST, f"not a whole number: {text[:40]!r}") from None


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = float(seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def _when(ms: Any) -> str:
    if ms in (None, ""):
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(ms) / 1000)) + " UTC"
    except (TypeError, ValueError):
        return str(ms)

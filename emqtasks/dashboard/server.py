"""The dashboard's HTTP server: routes, token auth, CSRF, server-sent events, /metrics.

The standard library's ThreadingHTTPServer (a thread per request: an SSE stream holds one)
and Jinja2 templates with autoescaping on: every value from Redis is escaped by the
template engine, never pasted into HTML by hand. Assets are files of the package.

Auth: with tokens (one ``--token``, or named tokens with a role: roles.py), every request
must carry one, as ``Authorization: Bearer <token>``
(programs, Prometheus) or by the ``emq_session`` cookie that the login form sets (people:
a signed session, see guard.py); anything else is answered 401. CSRF: every POST of a
session carries that session's CSRF token (a form field or the ``X-CSRF-Token`` header),
which only its pages show, and no Origin but its own; the cookie is SameSite=Strict and
HttpOnly besides. A Bearer POST needs no CSRF token: a browser never adds that header of
its own accord. Without a token, only a loopback Host name is answered (no DNS
rebinding), and the CSRF token is one of this process. A viewer's POST is answered 403
before its body is read. Every change made here is written to the queue's audit log
(store/audit.py) with the name of the token that made it.

A POST is checked (Host, Origin, auth, read-only, its declared length: at most 64 KB)
before a byte of its body is read; a refusal then closes the connection. A client that
stalls for ``Handler.timeout`` seconds loses its connection.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from ..errors import CorruptKey, EmqError, ScriptError, UnknownJob
from ..observe.metrics import CONTENT_TYPE, Exporter
from ..producer.abort import abort as abort_job
from ..store.audit import AUDIT_DAYS, AUDIT_MAX
from ..store.keys import check_job_id
from ..store.queue import Queue
from ..workflows.canvas import WorkflowHandle
from . import actions, guard, roles, views
from .guard import Refused
from .roles import Account

log = logging.getLogger("emqtasks.dashboard")
COOKIE = "emq_session"
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".svg": "image/svg+xml"}
#: Pages past this are refused (400): an offset the server could not take.
MAX_PAGE = 1_000_000_000
_DIGITS = re.compile(r"[0-9]+")
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


@dataclass(frozen=True)
class Caller:
    """Who an authorized request comes from: the CSRF token its POSTs must carry (None where
    none is needed: the Bearer token), its account's name (the audit log's "who") and
    whether its role may change anything."""

    csrf: str | None
    name: str = roles.LOOPBACK
    can_act: bool = True


class Dashboard:
    """Everything a request needs: the queues, the settings, the templates."""

    def __init__(self, queues: list[Queue], token: str | None = None,
                 read_only: bool = False, metrics_only: bool = False,
                 top_groups: int = 50, accounts: list[Account] | None = None) -> None:
        self.queues = {q.name: q for q in queues}
        self.views = {q.name: views.QueueView(q) for q in queues}
        self.first = queues[0].name
        self.token = token or None
        #: Who may sign in: the named tokens and the one --token (an operator).
        self.accounts = roles.merge(list(accounts or []), self.token)
        self.read_only = read_only
        self.metrics_only = metrics_only
        # Signs the sessions and CSRF tokens: derived from the tokens (every process with
        # them agrees; a changed token or role ends every session), or, without any, a key
        # of this process.
        single = [a.token for a in self.accounts if a.name == roles.SINGLE]
        secret = (single[0] if len(self.accounts) == 1 and single else
                  "\n".join(sorted(f"{a.name}:{a.role}:{a.token}" for a in self.accounts)))
        self.key = guard.session_key(secret) if self.accounts else secrets.token_bytes(32)
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

    def render(self, name: str, csrf: str = "", caller: Caller | None = None,
               **values: Any) -> str:
        """A page; ``csrf``: the CSRF token of the caller's session, for its forms; a
        viewer's pages show no action (as a read-only dashboard's)."""
        viewer = caller is not None and not caller.can_act
        return str(self.env.get_template(name).render(
            read_only=self.read_only or viewer, csrf=csrf, queues=list(self.queues),
            auth=bool(self.accounts), who=caller.name if caller else "",
            role="viewer" if viewer else "", **values))

    def caller(self, headers: Any) -> Caller | None:
        """Who the request comes from, or None: not authorized."""
        if not self.accounts:
            return Caller(guard.csrf_token(self.key, ""))
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            account = self.account_for(auth[len("Bearer "):].strip())
            return None if account is None else Caller(None, account.name, account.can_act)
        try:
            cookie = SimpleCookie(headers.get("Cookie", ""))
        except CookieError:
            return None
        sid = guard.session_id(self.key, cookie[COOKIE].value) if COOKIE in cookie else None
        if sid is None:
            return None
        # The role is read now, not at sign-in: the session names its account
        name = sid.partition("~")[0] if "~" in sid else roles.SINGLE
        account = next((a for a in self.accounts if a.name == name), None)
        return None if account is None else Caller(guard.csrf_token(self.key, sid),
                                                   account.name, account.can_act)

    def account_for(self, given: str) -> Account | None:
        """The account whose token this is (each compared in constant time), or None."""
        found = None
        for account in self.accounts:
            if hmac.compare_digest(given.encode(), account.token.encode()):
                found = account
        return found

    def token_ok(self, given: str) -> bool:
        return self.account_for(given) is not None


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
    timeout = 30.0              # seconds a client may stall (socket timeout, StreamRequestHandler)
    body_unread = False         # a POST's body not read yet: an answer closes the connection
    csrf = ""                   # the caller's CSRF token, for the forms of the pages
    who: Caller | None = None   # the caller, once authorized (its role shapes the pages)

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
        if self.body_unread:   # or the rest of the body would be read as the next request
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
        self._send(HTTPStatus.SEE_OTHER, "", headers={"Location": to, **(headers or {})})

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _render(self, name: str, **values: Any) -> str:
        return self.dash.render(name, csrf=self.csrf, caller=self.who, **values)

    def handle_expect_100(self) -> bool:
        return True   # "100 Continue" only once the headers passed: see _form

    def _form(self) -> dict[str, list[str]]:
        """The POST's form, once its headers passed (guard.body_size: at most MAX_BODY)."""
        size = guard.body_size(self.headers)
        if self.headers.get("Expect", "").lower() == "100-continue":
            self.send_response_only(HTTPStatus.CONTINUE)
            self.end_headers()
        try:
            raw = self.rfile.read(size) if size else b""
        except TimeoutError:
            raise Refused(HTTPStatus.REQUEST_TIMEOUT, "the request body did not come") from None
        if len(raw) < size:
            raise Refused(HTTPStatus.BAD_REQUEST, "the request body ended early")
        self.body_unread = False
        return parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)

    def _check_csrf(self, caller: Caller, given: str) -> None:
        if caller.csrf is not None and not hmac.compare_digest(given.encode(),
                                                               caller.csrf.encode()):
            raise Refused(HTTPStatus.FORBIDDEN, "refused: missing or wrong CSRF token")

    def _queue(self, name: str | None) -> tuple[Queue, views.QueueView]:
        name = name or self.dash.first
        if name not in self.dash.queues:
            raise Refused(HTTPStatus.NOT_FOUND, f"no queue {name!r} here")
        return self.dash.queues[name], self.dash.views[name]

    def _unauthorized(self) -> None:
        nxt = guard.local_path(self.path) if self.command == "GET" else "/"
        body = self.dash.render("login.html", error=None, next=nxt)
        self._send(HTTPStatus.UNAUTHORIZED, body,
                   headers={"WWW-Authenticate": 'Bearer realm="emqtasks"'})

    def _answer_failure(self, exc: Exception, method: str, path: str) -> None:
        """The page for what handling a request raised: a refusal with its status, a bad
        argument as 400, a vanished client as nothing, anything else (a script's failure
        too) as a logged 500."""
        if isinstance(exc, Refused):
            self._send(exc.status, self._render("error.html", message=str(exc)))
        elif isinstance(exc, CorruptKey):   # the server's data, not the request, is at fault
            log.warning("%s %s: %s", method, path, exc)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                       self._render("error.html", message=str(exc)))
        elif isinstance(exc, EmqError) and not isinstance(exc, ScriptError):
            self._send(HTTPStatus.BAD_REQUEST, self._render("error.html", message=str(exc)))
        elif isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            pass
        else:
            log.error("%s %s failed", method, path, exc_info=exc)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                       self._render("error.html", message="internal error (see the log)"))

    # -- GET ---------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def _host_refused(self) -> bool:
        """A tokenless dashboard answers only to a loopback Host (guard.py)."""
        if not self.dash.accounts and not guard.host_ok(self.headers.get("Host")):
            self._send(HTTPStatus.MISDIRECTED_REQUEST,
                       "this dashboard has no token: it answers only on a loopback address",
                       "text/plain; charset=utf-8")
            return True
        return False

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        # a kept-alive connection may carry another caller's next request
        self.csrf, self.who = "", None
        if self._host_refused():
            return
        try:
            if path == "/login" and not self.dash.metrics_only:
                nxt = guard.local_path(self._query().get("next"))
                self._send(HTTPStatus.OK, self.dash.render("login.html", error=None, next=nxt))
                return
            caller = self.dash.caller(self.headers)
            if caller is None:
                self._unauthorized()
                return
            self.csrf, self.who = caller.csrf or "", caller
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
            self._send(HTTPStatus.OK, self._render("overview.html", page="overview",
                                                   o=view.overview(), **common))
        elif path == "/lanes":
            lanes = view.lanes(qs.get("sort", "-pending"), qs.get("state", ""),
                               qs.get("q", ""), _page(qs.get("page")))
            name = "_lanes_table.html" if qs.get("fragment") else "lanes.html"
            self._send(HTTPStatus.OK, self._render(name, page="lanes", lanes=lanes, **common))
        elif path in ("/jobs", "/dead"):
            self._jobs(path, queue, qs, common)
        elif path == "/job":
            detail = views.job_detail(queue, qs.get("id", "")) if qs.get("id") else None
            if detail is None:
                raise Refused(HTTPStatus.NOT_FOUND, "no such job (or its row expired)")
            done = qs.get("done")
            self._send(HTTPStatus.OK, self._render(
                "job.html", page="jobs", job=detail,
                done=done if done in ("aborting", "cancelled", "finished", "run", "duplicate")
                else None, **common))
        elif path == "/workflow":
            page = _page(qs.get("page"))
            wf = views.workflow_detail(queue, qs.get("id", ""), page)
            if wf is None:
                raise Refused(HTTPStatus.NOT_FOUND, "no such workflow (or it expired)")
            self._send(HTTPStatus.OK, self._render(
                "workflow.html", page="jobs", wf=wf, pg=page,
                pages=views.page_count(wf["total"]), done=_count(qs.get("done")),
                **common))
        elif path == "/audit":
            before = qs.get("before") or None
            if before is not None and not _STREAM_ID.fullmatch(before):
                raise Refused(HTTPStatus.BAD_REQUEST, "before= is an entry id (ms-seq)")
            rows = queue.audit_log(views.PAGE + 1, before)
            self._send(HTTPStatus.OK, self._render(
                "audit.html", page="audit", rows=rows[:views.PAGE],
                more=rows[views.PAGE - 1].id if len(rows) > views.PAGE else None,
                days=AUDIT_DAYS, cap=AUDIT_MAX, **common))
        elif path == "/enqueue":
            known = actions.known_tasks(queue, view.hour.get()["tasks"])
            self._send(HTTPStatus.OK, self._render(
                "enqueue.html", page="enqueue", tasks=sorted(known), **common))
        elif path == "/workers":
            self._send(HTTPStatus.OK, self._render(
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
        page = _page(qs.get("page"))
        groups = (list(self.dash.views[queue.name].stats.get()["groups"])
                  if f.state == "pending" and not f.group else None)
        rows, total, complete = views.find_jobs(queue, f, (page - 1) * views.PAGE,
                                                groups=groups)
        pages = views.page_count(total) if complete else page + 1
        name = "dead.html" if dead else "jobs.html"
        if qs.get("fragment"):
            name = "_jobs_table.html"
        self._send(HTTPStatus.OK, self._render(
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
        """Everything the headers can tell is checked before the body is read: a request
        refused on them costs a few hundred bytes, whatever body it declares."""
        path = urlsplit(self.path).path
        self.body_unread, self.csrf, self.who = True, "", None
        if self._host_refused():
            return
        try:
            if not guard.origin_ok(self.headers.get("Origin"), self.headers.get("Host")):
                raise Refused(HTTPStatus.FORBIDDEN, "refused: a request from another site")
            if path == "/login" and not self.dash.metrics_only:
                self._login({k: v[-1] for k, v in self._form().items()})
                return
            caller = self.dash.caller(self.headers)
            if caller is None:
                self._unauthorized()
                return
            self.who = caller
            if self.dash.read_only:
                raise Refused(HTTPStatus.FORBIDDEN, "refused: the dashboard is read-only")
            if not caller.can_act:
                raise Refused(HTTPStatus.FORBIDDEN, f"refused: {caller.name} is a viewer "
                                                    f"(it may look, not change)")
            header_token = self.headers.get("X-CSRF-Token")
            if header_token is not None:
                self._check_csrf(caller, header_token)
            form = self._form()
            one = {k: v[-1] for k, v in form.items()}
            if header_token is None:   # a plain HTML form carries it in the body
                self._check_csrf(caller, one.get("csrf", ""))
            self.csrf = caller.csrf or ""
            queue, _ = self._queue(one.get("queue"))
            self._act(path, queue, one, form, caller)
        except Exception as exc:
            self._answer_failure(exc, "POST", path)

    def _login(self, one: dict[str, str]) -> None:
        nxt = guard.local_path(one.get("next"))
        account = self.dash.account_for(one.get("token", ""))
        if account is None:
            self._send(HTTPStatus.UNAUTHORIZED, self.dash.render(
                "login.html", error="wrong token", next=nxt))
            return
        name = "" if account.name == roles.SINGLE else account.name
        cookie = (f"{COOKIE}={guard.new_session(self.dash.key, name)}; HttpOnly; "
                  f"SameSite=Strict; Path=/")
        self._redirect(nxt, {"Set-Cookie": cookie})

    def _act(self, path: str, queue: Queue, one: dict[str, str],
             form: dict[str, list[str]], caller: Caller) -> None:
        back = guard.local_path(one.get("back"))
        group = one.get("group", "")
        view = self.dash.views[queue.name]
        where = f"group {group}" if group else "queue"
        # what the audit log records of the change: (action, target, jobs)
        entry: tuple[str, str, int | None]
        if path == "/action/pause":
            queue.pause_group(group) if group else queue.pause()
            entry = ("pause", where, None)
        elif path == "/action/resume":
            queue.resume_group(group) if group else queue.resume()
            entry = ("resume", where, None)
        elif path == "/action/limit":
            value = _opt_int(one.get("value"))
            queue.set_group_limit(group, value)
            entry = ("limit", f"{where}: {value}", None)
        elif path == "/action/weight":
            value = _opt_int(one.get("value"))
            queue.set_group_weight(group, value)
            entry = ("weight", f"{where}: {value}", None)
        elif path == "/action/rate":
            value = _opt_int(one.get("value"))
            per = float(one.get("per") or 1)
            queue.set_group_rate(group, value, per)
            entry = ("rate", f"{where}: {value if value is None else f'{value}/{per:g}s'}",
                     None)
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
            self._send(HTTPStatus.OK, self._render(
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
            what = ids[0] if len(ids) == 1 else f"{len(ids)} dead jobs"
            entry = (path[len("/dead/"):], what, n)
        elif path == "/job/abort":
            job_id = check_job_id(one.get("id", ""))
            try:
                verdict = abort_job(queue, job_id)
            except UnknownJob:
                raise Refused(HTTPStatus.NOT_FOUND, "no such job (or its row expired)") from None
            back = f"/job?queue={quote(queue.name)}&id={quote(job_id)}&done={verdict}"
            entry = ("abort" if verdict == "aborting" else "cancel", job_id,
                     0 if verdict == "finished" else 1)
        elif path == "/job/run":
            job_id = check_job_id(one.get("id", ""))
            if not queue.run_now(job_id):
                raise Refused(HTTPStatus.CONFLICT, f"job {job_id} is not delayed: nothing to "
                                                   f"run now")
            back = f"/job?queue={quote(queue.name)}&id={quote(job_id)}&done=run"
            entry = ("run now", job_id, 1)
        elif path == "/action/enqueue":
            known = actions.known_tasks(queue, view.hour.get()["tasks"])
            job = actions.enqueue(queue, known, one)
            back = f"/job?queue={quote(queue.name)}&id={quote(job.id)}" + \
                ("&done=duplicate" if job.duplicate else "")
            entry = ("enqueue", f"{job.task} in group {job.group} as {job.id}",
                     0 if job.duplicate else 1)
        elif path == "/workflow/cancel":
            handle = WorkflowHandle(queue, check_job_id(one.get("id", "")))
            n = handle.cancel()
            back = f"/workflow?queue={quote(queue.name)}&id={quote(handle.id)}&done={n}"
            entry = ("cancel workflow", handle.id, n)
        else:
            raise Refused(HTTPStatus.NOT_FOUND, "no such action")
        queue.audit(caller.name, "dashboard", *entry)
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
        from ..schedules.schedule import ScheduleStore

        return list(ScheduleStore(queue).infos())
    except Exception:   # schedules are optional; a queue without any shows none
        return []


def _page(text: str | None) -> int:
    """A page number from the query: the first page when absent or not a number."""
    digits = (text or "").strip()
    if not _DIGITS.fullmatch(digits):
        return 1
    if len(digits) > len(str(MAX_PAGE)) or int(digits) > MAX_PAGE:
        raise Refused(HTTPStatus.BAD_REQUEST, f"page {digits[:24]} is out of range "
                                              f"(at most {MAX_PAGE:,})")
    return max(1, int(digits))


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

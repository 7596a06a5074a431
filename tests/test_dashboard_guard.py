"""The dashboard's guards beyond the token: the login cookie is not the token, a tokenless
dashboard answers only loopback Host names, a POST from another site is refused."""

from __future__ import annotations

from typing import Any

import pytest
from dashsrv import DashServer
from helpers import make_task

from emqtasks import App
from emqtasks.dashboard import guard
from emqtasks.observe.lanes import lane as lane_view
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(120)


def test_the_login_cookie_holds_an_hmac_of_the_token_not_the_token(queue: Queue) -> None:
    with DashServer([queue], token="s3cret-token") as d:
        status, _, headers = d.request("/login", {"token": "s3cret-token"})
        assert status == 303
        cookie = headers["Set-Cookie"].split(";")[0]
        assert "s3cret-token" not in cookie
        assert d.request("/lanes", headers={"Cookie": cookie})[0] == 200
        # The token itself in the cookie is no session; nor is a malformed Cookie header
        assert d.request("/lanes", headers={"Cookie": "emq_session=s3cret-token"})[0] == 401
        assert d.request("/lanes", headers={"Cookie": 'emq_session="\\'})[0] == 401


def test_a_tokenless_dashboard_answers_only_loopback_host_names(queue: Queue) -> None:
    with DashServer([queue]) as d:
        port = d.base.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
            assert d.request("/lanes", headers={"Host": host})[0] == 200, host
        for host in (f"rebind.example:{port}", "10.0.0.8", f"127.0.0.1.nip.io:{port}"):
            status, body, _ = d.request("/lanes", headers={"Host": host})
            assert status == 421 and "loopback" in body, host
            status, _, _ = d.request("/action/pause", {"csrf": "any"},
                                     headers={"Host": host})
            assert status == 421, host
    # With a token, any Host name is answered (the token guards it)
    with DashServer([queue], token="t") as d:
        assert d.request("/metrics", headers={"Host": "dash.example",
                                              "Authorization": "Bearer t"})[0] == 200


def test_a_post_from_another_site_is_refused_even_with_the_csrf_token(
        app: App, queue: Queue) -> None:
    make_task(app, group="acme").delay(1)
    with DashServer([queue]) as d:
        for origin in ("http://evil.example", "null", f"{d.base}.evil.example"):
            status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": d.csrf()},
                                     headers={"Origin": origin})
            assert status == 403, origin
        assert not lane_view(queue, "acme")["paused"]
        status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": d.csrf()},
                                 headers={"Origin": d.base})
        assert status == 303 and lane_view(queue, "acme")["paused"]


@pytest.mark.parametrize("header,name", [("127.0.0.1:8765", "127.0.0.1"),
                                         ("[::1]:8765", "::1"), ("LocalHost", "localhost"),
                                         ("::1", "::1")])
def test_host_names_are_read_from_the_header(header: str, name: str) -> None:
    assert guard.host_name(header) == name


# -- a POST is checked before its body is read ---------------------------------------------

def _post(d: DashServer, *headers: str, body: bytes = b"group=acme",
          path: str = "/action/pause") -> Any:
    """A POST written by hand whose body is only begun: the server must answer it without
    waiting for the rest (RawAnswer, see dashsrv.py)."""
    return d.raw([f"POST {path} HTTP/1.1", f"Host: {d.base.split('//')[1]}", *headers], body)


def test_a_post_is_refused_before_its_body_is_read(app: App, queue: Queue) -> None:
    # Given a dashboard with a token, a session, and a group to pause
    make_task(app, group="acme").delay(1)
    with DashServer([queue], token="tok") as d:
        cookie, csrf = d.sign_in("tok")
        session = (f"Cookie: {cookie}", f"X-CSRF-Token: {csrf}")
        # When POSTs declare a body they never finish, they are answered at once, and the
        # connection is closed (the unread body is not taken for the next request)
        refusals = [
            (401, ("Content-Length: 50000",)),                       # no session
            (401, ("Content-Length: -1",)),
            (401, ("Content-Length: 50000", "Expect: 100-continue")),   # no "100 Continue"
            (403, ("Content-Length: 50000", *session, "Origin: http://evil.example")),
            (403, ("Content-Length: 50000", f"Cookie: {cookie}", "X-CSRF-Token: guess")),
            (400, ("Content-Length: -1", *session)),                  # malformed lengths
            (400, ("Content-Length: abc", *session)),
            (400, ("Content-Length: +5", *session)),
            (400, ("Content-Length: 1e3", *session)),
            (400, ("Content-Length: 5", "Content-Length: 50", *session)),
            (411, ("Transfer-Encoding: chunked", *session)),
            (413, ("Content-Length: 65537", *session)),               # over 64 KB
            (413, (f"Content-Length: {10 ** 30}", *session)),
        ]
        for status, headers in refusals:
            answer = _post(d, *headers)
            assert (answer.status, answer.closed) == (status, True), (headers, answer)
        # Then nothing changed; and a whole body of 64 KB is read and acted on
        assert not lane_view(queue, "acme")["paused"]
        body = f"group=acme&csrf={csrf}&pad=".encode()
        body += b"x" * (65536 - len(body))
        answer = _post(d, f"Content-Length: {len(body)}", f"Cookie: {cookie}", body=body)
        assert answer.status == 303, answer
        assert lane_view(queue, "acme")["paused"]


def test_a_client_that_stalls_is_dropped_after_the_read_timeout(queue: Queue) -> None:
    with DashServer([queue]) as d:
        d.server.RequestHandlerClass.timeout = 0.5   # type: ignore[attr-defined]
        csrf = d.csrf()
        # a body begun and never finished: the thread that reads it gives up, and says so
        answer = d.raw(["POST /action/pause HTTP/1.1", f"Host: {d.base.split('//')[1]}",
                        f"X-CSRF-Token: {csrf}", "Content-Length: 100"], b"group=", wait=10)
        assert answer.status == 408 and answer.closed, answer


# -- redirects stay on the dashboard; the CSRF token is the session's ----------------------

HOSTILE_TARGETS = [
    "//evil.example/phish", "/\\evil.example/phish", "\\\\evil.example", "/lanes\\..\\x",
    "http://evil.example/", "https:evil.example", "javascript:alert(1)",
    "/x\r\nSet-Cookie: injected=1", "/x\nSet-Cookie: injected=1", "/x\rSet-Cookie: injected=1",
    "/x%0d%0aSet-Cookie:%20injected=1", "/x%0ASet-Cookie:%20injected=1", "/x%00",
    "/\tx", "/x\x00", " /lanes", "lanes", "", "/caf\u00e9", "/x\u2028",
]


def _login_form(d: DashServer, **fields: str) -> bytes:
    """The login form's body as a browser sends it: its hidden fields, then ``fields``."""
    import re
    from urllib.parse import urlencode

    form = dict(re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"',
                           d.request("/login")[1]))
    return urlencode({**form, **fields}).encode()


def _no_injected_header(answer: Any) -> None:
    assert all("injected" not in f"{k}:{v}" for k, v in answer.headers), answer.headers


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_a_login_redirect_goes_only_to_a_path_of_the_dashboard(queue: Queue,
                                                               target: str) -> None:
    with DashServer([queue], token="tok") as d:
        body = _login_form(d, token="tok", next=target)
        answer = _post(d, f"Content-Length: {len(body)}", body=body, path="/login")
        assert answer.status == 303 and answer.header("Location") == "/", answer
        _no_injected_header(answer)
        assert [k for k, _ in answer.headers].count("Set-Cookie") == 1


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_an_action_redirect_goes_only_to_a_path_of_the_dashboard(app: App, queue: Queue,
                                                                 target: str) -> None:
    from urllib.parse import urlencode

    make_task(app, group="acme").delay(1)
    with DashServer([queue]) as d:
        body = urlencode({"group": "acme", "csrf": d.csrf(), "back": target}).encode()
        answer = _post(d, f"Content-Length: {len(body)}", body=body)
        assert answer.status == 303 and answer.header("Location") == "/", answer
        _no_injected_header(answer)
        assert lane_view(queue, "acme")["paused"]


@pytest.mark.parametrize("target", ["/", "/lanes?queue=q&sort=-pending&page=2",
                                    "/job?queue=a%20b&id=x-1", "/dead?queue=q&done=3#top"])
def test_a_redirect_to_a_page_of_the_dashboard_is_kept(queue: Queue, target: str) -> None:
    with DashServer([queue], token="tok") as d:
        body = _login_form(d, token="tok", next=target)
        answer = _post(d, f"Content-Length: {len(body)}", body=body, path="/login")
        assert answer.status == 303 and answer.header("Location") == target, answer


def test_the_csrf_token_belongs_to_one_session_and_none_is_given_before_sign_in(
        app: App, queue: Queue) -> None:
    make_task(app, group="acme").delay(1)
    with DashServer([queue], token="tok") as d:
        # Before sign-in no page carries a CSRF token: not the login form, not a 401
        assert "csrf" not in d.request("/login")[1].lower()
        assert "csrf" not in d.request("/lanes")[1].lower()
        # Two sign-ins are two sessions, each with a token of its own
        (a_cookie, a_csrf), (b_cookie, b_csrf) = d.sign_in("tok"), d.sign_in("tok")
        assert a_cookie != b_cookie and a_csrf != b_csrf
        # Session A's POST with B's token (or none, or a near miss) is refused
        for token in (b_csrf, "", a_csrf[:-1]):
            for where in ("form", "header"):
                data = {"group": "acme", **({"csrf": token} if where == "form" else {})}
                headers = {"Cookie": a_cookie,
                           **({"X-CSRF-Token": token} if where == "header" else {})}
                status, body, _ = d.request("/action/pause", data, headers=headers)
                assert status == 403 and "CSRF" in body, (token, where, status)
        assert not lane_view(queue, "acme")["paused"]
        # A forged session cookie is no session
        forged = a_cookie.rsplit(".", 1)[0] + ".0" if "." in a_cookie else a_cookie + "x"
        assert d.request("/lanes", headers={"Cookie": forged})[0] == 401
        # Its own token works
        status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": a_csrf},
                                 headers={"Cookie": a_cookie})
        assert status == 303 and lane_view(queue, "acme")["paused"]


def test_a_program_with_the_bearer_token_needs_no_csrf_token(app: App, queue: Queue) -> None:
    # A browser never sends an Authorization header of its own accord: a POST carrying the
    # token cannot be forged by another site, so it needs no CSRF token
    make_task(app, group="acme").delay(1)
    with DashServer([queue], token="tok") as d:
        assert d.request("/action/pause", {"group": "acme"},
                         headers={"Authorization": "Bearer nope"})[0] == 401
        status, _, _ = d.request("/action/pause", {"group": "acme"},
                                 headers={"Authorization": "Bearer tok"})
        assert status == 303 and lane_view(queue, "acme")["paused"]

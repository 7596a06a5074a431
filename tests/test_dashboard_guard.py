"""The dashboard's guards beyond the token: the login cookie is not the token, a tokenless
dashboard answers only loopback Host names, a POST from another site is refused."""

from __future__ import annotations

import pytest
from dashsrv import DashServer
from helpers import make_task

from emqtasks import App
from emqtasks.dashboard import guard
from emqtasks.queue import Queue

pytestmark = pytest.mark.timeout(120)


def test_the_login_cookie_holds_an_hmac_of_the_token_not_the_token(queue: Queue) -> None:
    with DashServer([queue], token="s3cret-token") as d:
        status, _, headers = d.request("/login", {"token": "s3cret-token",
                                                  "csrf": d.dash.csrf})
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
            status, _, _ = d.request("/action/pause", {"csrf": d.dash.csrf},
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
            status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": d.dash.csrf},
                                     headers={"Origin": origin})
            assert status == 403, origin
        assert not queue.lane("acme")["paused"]
        status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": d.dash.csrf},
                                 headers={"Origin": d.base})
        assert status == 303 and queue.lane("acme")["paused"]


@pytest.mark.parametrize("header,name", [("127.0.0.1:8765", "127.0.0.1"),
                                         ("[::1]:8765", "::1"), ("LocalHost", "localhost"),
                                         ("::1", "::1")])
def test_host_names_are_read_from_the_header(header: str, name: str) -> None:
    assert guard.host_name(header) == name

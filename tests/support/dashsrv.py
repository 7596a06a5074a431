"""A dashboard server of a test's own, on a free loopback port, in a thread."""

from __future__ import annotations

import re
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from emqtasks.dashboard import roles
from emqtasks.dashboard.server import Dashboard, serve
from emqtasks.store.queue import Queue


@dataclass
class RawAnswer:
    """The server's answer to a request written by hand on a socket."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    closed: bool = False     # the server closed the connection after its answer

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class DashServer:
    def __init__(self, queues: list[Queue], token: str | None = None,
                 read_only: bool = False, tokens: str | None = None) -> None:
        accounts = roles.parse(tokens) if tokens else None
        self.dash = Dashboard(queues, token, read_only, accounts=accounts)
        self.server = serve(self.dash, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.dash.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> DashServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, path: str, data: dict[str, Any] | list[tuple[str, str]] | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
        """(status, body, headers); redirects are not followed."""
        body = None if data is None else urllib.parse.urlencode(data).encode()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        req = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        try:
            with opener.open(req, timeout=30) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def raw(self, head: list[str], body: bytes = b"", wait: float = 5.0) -> RawAnswer:
        """A request written by hand on a socket of its own: the head's lines (request line
        and headers, CRLF added) and then ``body`` — the start of a body that may never be
        finished: the socket stays open, so a server that waits for the rest of a body
        answers nothing within ``wait`` seconds, and that fails the test."""
        host, port = self.server.server_address[:2]
        with socket.create_connection((host, port), timeout=wait) as s:
            s.sendall("\r\n".join([*head, "", ""]).encode("latin-1") + body)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise AssertionError(f"the connection closed without an answer: {data!r}")
                    data += chunk
                top, rest = data.split(b"\r\n\r\n", 1)
                lines = top.decode("latin-1").split("\r\n")
                status = int(lines[0].split()[1])
                headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
                answer = RawAnswer(status, headers)   # type: ignore[arg-type]
                size = int(answer.header("Content-Length") or 0)
                while len(rest) < size:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                answer.body = rest[:size]
                if (answer.header("Connection") or "").lower() == "close":
                    try:   # the server said so: it does close (recv times out if not)
                        answer.closed = rest[size:] == b"" and s.recv(1) == b""
                    except ConnectionResetError:
                        answer.closed = True
                return answer
            except TimeoutError:
                raise AssertionError(f"no answer within {wait} s (is the server waiting for the "
                                     f"body?): {data!r}") from None

    def sign_in(self, token: str) -> tuple[str, str]:
        """A new signed-in session: (its Cookie header, the CSRF token its pages carry).
        The login form is sent as a browser sends it: its hidden fields and the token."""
        form = dict(re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"',
                               self.request("/login")[1]))
        status, _, headers = self.request("/login", {**form, "token": token})
        assert status == 303, status
        cookie = headers["Set-Cookie"].split(";")[0]
        return cookie, self.csrf({"Cookie": cookie})

    def csrf(self, headers: dict[str, str] | None = None) -> str:
        """The CSRF token the overview page carries for these request headers (those of a
        session; none for a dashboard without a token)."""
        status, body, _ = self.request("/", headers=headers)
        assert status == 200, status
        found = re.search(r'name="csrf" value="([^"]+)"', body)
        assert found, "the overview page carries no CSRF token"
        return found.group(1)

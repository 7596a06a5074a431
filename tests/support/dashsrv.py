"""A dashboard server of a test's own, on a free loopback port, in a thread."""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from emqtasks.dashboard.server import Dashboard, serve
from emqtasks.queue import Queue


class DashServer:
    def __init__(self, queues: list[Queue], token: str | None = None,
                 read_only: bool = False) -> None:
        self.dash = Dashboard(queues, token, read_only)
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

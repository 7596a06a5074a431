"""Django: the app (settings.EMQTASKS, `emqtasks worker --django`, delay_on_commit) and the
django.tasks backend, on the example site (examples/django_project) with a real server, a
real worker and, for its views, a real HTTP server.

One worker serves the whole module (started once: Django's import is most of its start);
each test uses its own ids, groups and lists, so the tests do not see each other's jobs.
On Python 3.11 this runs Django 5.2 with the django-tasks backport; on Django 6 the
built-in django.tasks (the backend takes whichever the process has).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

pytest.importorskip("django")

from emqtasks import App, TaskFailed, default_app
from emqtasks.producer.task import JobHandle
from emqtasks.testing import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "django_project"
TASKS = ROOT / "tests" / "tasks"
WAIT = 20.0


@dataclass
class Site:
    redis_url: str
    queue: str          # settings.EMQTASKS["QUEUE"]
    prefix: str         # settings.TASKS["default"]["OPTIONS"]["QUEUE_PREFIX"]
    env: dict[str, str]
    worker: WorkerProcess
    base_url: str       # the site on a real HTTP server


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("django")
    tag = uuid.uuid4().hex[:8]
    env = {"DJANGO_SETTINGS_MODULE": "mysite.settings", "MYSITE_REDIS_URL": redis_url,
           "MYSITE_QUEUE": f"site-{tag}", "MYSITE_QUEUE_PREFIX": f"dj-{tag}-",
           "MYSITE_DB": str(tmp / "db.sqlite3")}
    saved = default_app._settings
    with pytest.MonkeyPatch.context() as mp:
        # The settings, not the environment, must lead both sides to the server.
        for name in ("EMQ_REDIS_URL", "EMQ_QUEUE"):
            mp.delenv(name, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        mp.syspath_prepend(str(PROJECT))
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        worker_env = dict(os.environ)
        worker = WorkerProcess(["django_test_tasks"], concurrency=2, extra=["--django"],
                               tick=0.5,
                               path=os.pathsep.join([str(PROJECT), str(TASKS)]),
                               env=worker_env, log_path=tmp / "worker.log")
    from django.core.wsgi import get_wsgi_application

    server: WSGIServer = make_server("127.0.0.1", 0, get_wsgi_application(),
                                     handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        worker.wait_ready(timeout=30)
        yield Site(redis_url, env["MYSITE_QUEUE"], env["MYSITE_QUEUE_PREFIX"], env, worker,
                   f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        worker.stop()
        for name in (env["MYSITE_QUEUE"], f"{env['MYSITE_QUEUE_PREFIX']}default",
                     f"{env['MYSITE_QUEUE_PREFIX']}reports"):
            default_app.queue(name).purge()
        default_app.close()
        default_app._settings = saved


def wait(result: Any) -> Any:
    """Block until the job behind a django.tasks result ends (its done key: no polling),
    then read the result again."""
    try:
        result.task.get_backend().handle(result).get(timeout=WAIT)
    except TaskFailed:
        pass
    result.refresh()
    return result


def call(site: Site, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(f"{site.base_url}{path}", data=data, timeout=WAIT) as reply:
        return json.loads(reply.read())


# -- the worker: setup, autodiscovery, settings ----------------------------------------------
def test_the_worker_imports_every_apps_tasks_and_takes_its_settings(site: Site) -> None:
    log = site.worker.output()
    # autodiscovery: the shop's tasks module, found through INSTALLED_APPS
    assert "tasks modules: shop.tasks" in log, log
    for name in ("shop.tasks.send_receipt", "shop.tasks.account_report",
                 "django_test_tasks.add"):
        assert name in log, log
    # settings.EMQTASKS led it to the server and its queue (no EMQ_* in its environment),
    # beside the queues of the django.tasks backend, one share each
    assert "EMQ_REDIS_URL" not in site.env
    assert f"queues {site.queue}:1, {site.prefix}default:1, {site.prefix}reports:1 " \
           "(by weight)" in log, log
    assert site.redis_url.split("@")[-1] in log


def test_settings_configure_the_default_app_and_the_environment_wins(site: Site) -> None:
    from emqtasks.contrib.django.conf import app_options

    assert default_app.settings.redis_url == site.redis_url
    assert default_app.settings.queue == site.queue
    given = {"REDIS_URL": "redis://cache:6380/2", "QUEUE": "web", "MAX_PAYLOAD_BYTES": 4096}
    assert app_options(given, environ={}) == {
        "redis_url": "redis://cache:6380/2", "queue": "web", "max_payload_bytes": 4096}
    assert app_options(given, environ={"EMQ_QUEUE": "ops"}) == {
        "redis_url": "redis://cache:6380/2", "max_payload_bytes": 4096}


@pytest.mark.parametrize("value, message", [
    ({"REDIS_URL": "http://cache:6379"}, "settings.EMQTASKS['REDIS_URL']: "),
    ({"QUEUE": "a queue"}, "settings.EMQTASKS['QUEUE']: invalid queue name"),
    ({"MAX_PAYLOAD_BYTES": -1}, "settings.EMQTASKS['MAX_PAYLOAD_BYTES']: "),
    ({"REDIS": "redis://x"}, "settings.EMQTASKS['REDIS'] is not an option: one of REDIS_URL"),
    ("redis://x", "settings.EMQTASKS must be a dict"),
])
def test_a_bad_setting_is_one_line_naming_it(value: Any, message: str) -> None:
    from emqtasks.contrib.django.conf import SettingError, app_options

    with pytest.raises(SettingError) as caught:
        app_options(value, environ={})
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def _worker_line(redis_url: str, tmp_path: Path, settings: str | None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EMQ_REDIS_URL", "EMQ_QUEUE",
                                                            "DJANGO_SETTINGS_MODULE")}
    env.update(MYSITE_REDIS_URL=redis_url, MYSITE_DB=str(tmp_path / "db.sqlite3"))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(PROJECT), str(TASKS)])
    (tmp_path / "brokenapp").mkdir()
    (tmp_path / "brokenapp" / "__init__.py").write_text("")
    (tmp_path / "brokenapp" / "tasks.py").write_text("import no_such_module\n")
    if settings is not None:
        (tmp_path / "bad_settings.py").write_text(f"from mysite.settings import *\n{settings}\n")
        env["DJANGO_SETTINGS_MODULE"] = "bad_settings"
    out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "worker", "--django"],
                         env=env, capture_output=True, text=True, timeout=60)
    return out.returncode, out.stderr


@pytest.mark.parametrize("settings, expected", [
    (None, "--django needs DJANGO_SETTINGS_MODULE"),
    ("INSTALLED_APPS = ['shop']",
     "add 'emqtasks.contrib.django' to settings.INSTALLED_APPS"),
    ("EMQTASKS = {'REDIS_URL': 'http://cache:6379'}", "settings.EMQTASKS['REDIS_URL']"),
    ("INSTALLED_APPS = INSTALLED_APPS + ['brokenapp']",
     "ModuleNotFoundError: No module named 'no_such_module'"),
], ids=["no-settings-module", "app-not-installed", "bad-url", "tasks-module-fails"])
def test_a_misconfigured_django_worker_says_so_in_one_line_and_exits_2(
        redis_url: str, tmp_path: Path, settings: str | None, expected: str) -> None:
    code, err = _worker_line(redis_url, tmp_path, settings)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("emqtasks: error: ") and expected in err, err


def test_a_worker_with_neither_modules_nor_django_says_what_it_needs() -> None:
    out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "worker"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("emqtasks: error: worker: give the task modules "
                                  "(-A app.tasks) or --django (see 'emqtasks worker --help')")


def test_each_job_runs_between_two_close_old_connections(site: Site) -> None:
    from django_test_tasks import connections_opened

    # CONN_MAX_AGE is 0: Django's request cycle closes the connection after each request;
    # the worker after each job. Each job of a child so opens a connection of its own.
    seen: dict[int, list[int]] = {}
    for _ in range(4):   # one at a time: each job starts after the one before ended
        pid, opened = wait(connections_opened.enqueue()).return_value
        seen.setdefault(pid, []).append(opened)
    for opened in seen.values():
        assert opened == list(range(opened[0], opened[0] + len(opened))), seen
    assert "raised; carrying on" not in site.worker.output()   # no hook failed


def test_a_child_drops_the_connections_it_inherits_without_closing_them(site: Site) -> None:
    from django.db import connection

    from emqtasks.contrib.django import worker

    connection.ensure_connection()
    raw = connection.connection
    worker.drop_inherited()
    assert connection.connection is None
    assert worker._dropped[-1] is raw
    assert raw.execute("select 1").fetchone() == (1,)   # not closed: the master's still
    connection.ensure_connection()
    assert connection.connection is not raw


# -- delay_on_commit -------------------------------------------------------------------------
def test_a_rolled_back_transaction_enqueues_nothing(app: App) -> None:
    from django.db import transaction

    @app.task
    def notify(n: int) -> int:
        return n

    with pytest.raises(RuntimeError), transaction.atomic():
        handle = notify.delay_on_commit(1)
        assert handle.verdict == "on_commit"
        raise RuntimeError("roll back")
    assert app.queue().job(handle.id) is None
    assert app.stats()["pending"] == 0
    assert handle.verdict == "on_commit"


def test_a_committed_transaction_enqueues_exactly_once(app: App) -> None:
    from django.db import transaction

    @app.task
    def notify(n: int) -> int:
        return n

    with transaction.atomic():
        handle = notify.delay_on_commit(1)
        with pytest.raises(RuntimeError), transaction.atomic():   # a savepoint rolled back
            notify.apply_async((2,), on_commit=True)
            raise RuntimeError("roll back the savepoint only")
        assert app.queue().job(handle.id) is None    # not before the commit
    assert handle.verdict == "enqueued"
    assert app.queue().job(handle.id)["state"] == "pending"
    assert app.stats()["pending"] == 1


def test_outside_a_transaction_it_enqueues_at_once(app: App) -> None:
    @app.task
    def notify(n: int) -> int:
        return n

    handle = notify.apply_async((1,), job_id="order-1", on_commit=True)
    assert (handle.id, handle.verdict) == ("order-1", "enqueued")
    assert notify.delay_on_commit(1).verdict == "enqueued"
    assert app.stats()["pending"] == 2


def test_a_bad_call_fails_at_the_call_not_at_the_commit(app: App) -> None:
    from django.db import transaction

    from emqtasks import SerializationError

    @app.task
    def notify(n: Any) -> Any:
        return n

    with transaction.atomic(), pytest.raises(SerializationError):
        notify.delay_on_commit(object())
    assert app.stats()["pending"] == 0


def test_the_view_enqueues_on_commit_and_the_worker_finds_the_order(site: Site) -> None:
    placed = call(site, "/orders", {"account": "acme", "email": "a@acme.test", "total": 7})
    handle: JobHandle[str] = JobHandle(default_app.queue(), placed["job"])
    assert handle.get(timeout=WAIT) == f"receipt for order {placed['order']} sent to " \
                                       "a@acme.test"
    assert call(site, f"/orders/{placed['order']}")["receipt_sent"] is True


# -- the django.tasks backend ----------------------------------------------------------------
def test_a_django_task_runs_on_the_worker_and_its_result_reads_back(site: Site) -> None:
    from django_test_tasks import add

    result = add.enqueue(2, 3)
    assert str(result.status) == "READY" and result.enqueued_at is not None
    wait(result)
    got = add.get_result(result.id)
    assert str(got.status) == "SUCCESSFUL" and got.return_value == 5
    assert got.args == [2, 3] and got.kwargs == {} and got.errors == []
    assert got.attempts == 1 and len(got.worker_ids) == 1
    assert got.enqueued_at <= got.started_at <= got.finished_at
    assert got.task.func is add.func and got.backend == "default"


def test_a_raising_django_task_is_failed_with_its_error(site: Site) -> None:
    from django_test_tasks import fail

    result = wait(fail.enqueue("no such order"))
    assert str(result.status) == "FAILED"
    (error,) = result.errors
    assert error.exception_class_path == "builtins.LookupError"
    assert error.exception_class is LookupError
    assert "no such order" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError):
        result.return_value


def test_run_after_defers_a_django_task(site: Site) -> None:
    from django.utils import timezone
    from django_test_tasks import add

    at = timezone.now() + timedelta(seconds=0.5)
    result = add.using(run_after=at).enqueue(1, 1)
    assert str(add.get_result(result.id).status) == "READY"
    wait(result)
    assert str(result.status) == "SUCCESSFUL" and result.started_at >= at.replace(
        microsecond=at.microsecond // 1000 * 1000)


def test_django_priorities_order_a_group_larger_first(site: Site) -> None:
    from django_test_tasks import record

    backend = record.get_backend()
    queue = backend.app.queue(backend.queue_of("default"))
    group, key = f"acct-{uuid.uuid4().hex[:8]}", f"order-{uuid.uuid4().hex[:8]}"
    queue.set_group_limit(group, 1)    # one at a time, so the list is the order they ran in
    queue.pause_group(group)           # all waiting before the first may run
    results = [record.using(priority=p).enqueue(key, str(p), account_id=group)
               for p in (0, -50, 100, 10)]
    queue.resume_group(group)
    for result in results:
        wait(result)
    assert default_app.client.lrange(key, 0, -1) == ["100", "10", "0", "-50"]
    assert {queue.job(r.id)["group"] for r in results} == {group}
    default_app.client.delete(key)


def test_aenqueue_and_an_async_django_task(site: Site) -> None:
    from django_test_tasks import async_add

    async def scenario() -> Any:
        result = await async_add.aenqueue(20, 22)
        await asyncio.to_thread(result.task.get_backend().handle(result).get, WAIT)
        return await async_add.aget_result(result.id)

    got = asyncio.run(scenario())
    assert str(got.status) == "SUCCESSFUL" and got.return_value == 42


def test_a_task_that_takes_context_gets_its_attempt(site: Site) -> None:
    from django_test_tasks import attempt_of

    result = wait(attempt_of.enqueue("hi"))
    assert result.return_value == {"attempt": 1, "id": result.id, "note": "hi"}


def test_the_site_starts_a_report_and_reads_its_result(site: Site) -> None:
    for total in (3, 4):
        call(site, "/orders", {"account": "globex", "email": "g@globex.test", "total": total})
    started = call(site, "/reports", {"account": "globex"})
    from shop.tasks import account_report

    wait(account_report.get_result(started["result"]))
    assert call(site, f"/reports/{started['result']}") == {
        "result": started["result"], "status": "SUCCESSFUL",
        "value": {"orders": 2, "total": 7}}


def test_what_django_would_refuse_is_invalid_task(site: Site) -> None:
    from django.utils import timezone

    from emqtasks.contrib.django._framework import InvalidTask, task_backends

    try:
        from django.tasks import task
    except ImportError:
        from django_tasks import task
    from django_test_tasks import add

    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        task(queue_name="nope")(_module_level)
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=datetime.now())   # settings.USE_TZ: aware datetimes only
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(_module_level)
    assert task_backends["default"].supports_defer is True
    assert str(add.using(run_after=timezone.now()).enqueue(0, 0).status) == "READY"


def _module_level(n: int = 0) -> int:
    return n


@pytest.mark.parametrize("params, message", [
    ({"QUEUES": ["default"], "OPTIONS": {"RETRIES": 3}},
     "settings.TASKS['x']['OPTIONS']['RETRIES'] is not an option"),
    ({"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 0}},
     "settings.TASKS['x']['OPTIONS']: max_attempts"),
    ({"QUEUES": ["default"], "OPTIONS": {"REDIS_URL": "tcp://x"}},
     "settings.TASKS['x']['OPTIONS']['REDIS_URL']: "),
    ({"QUEUES": ["a queue"]},
     "settings.TASKS['x']['QUEUES'] (after QUEUE_PREFIX): invalid queue name"),
    ({"QUEUES": []}, "settings.TASKS['x']['QUEUES'] must name the queues"),
    ({"QUEUES": ["default"], "OPTIONS": {"GROUP_BY": "account-id"}},
     "settings.TASKS['x']['OPTIONS']['GROUP_BY'] names a keyword argument"),
])
def test_a_bad_backend_setting_is_named(site: Site, params: dict[str, Any],
                                        message: str) -> None:
    from emqtasks.contrib.django import TaskBackend
    from emqtasks.contrib.django._framework import InvalidTaskBackend

    with pytest.raises(InvalidTaskBackend) as caught:
        TaskBackend("x", params)
    assert str(caught.value).startswith(message), caught.value


def test_a_result_nobody_has_does_not_exist(site: Site) -> None:
    from django_test_tasks import add

    from emqtasks.contrib.django._framework import TaskResultDoesNotExist

    for result_id in ("0190000000000000deadbeef", "not an id"):
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(result_id)

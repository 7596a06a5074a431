"""emqtasks.celery (issue 27, items 1, 5, 6, 7): a Celery-style project (tests/tasks/celeryproj:
celery.py + tasks.py + Django-style settings) run by ``emqtasks worker -A celeryproj`` on a
real worker and Redis: shared_task, app.task(bind=True) and self.retry, Celery's defaults,
a Task subclass's handlers, Reject, task_routes, config_from_object with a namespace, beat,
and the refusals (a crontab field out of range, an unknown beat task, task_always_eager...).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from workerproc import HERE, WorkerProc

from emqtasks import App, AsyncResult, EmqError, InvalidArgument, InvalidCron
from emqtasks.producer.app import pointed_at
from emqtasks.schedules.schedule import ScheduleStore

celery = pytest.importorskip("emqtasks.celery")
from celeryproj import tasks as t  # noqa: E402
from celeryproj.celery import app as proj_app  # noqa: E402

from emqtasks.celery import Celery, crontab, signature, states  # noqa: E402
from emqtasks.celery.conf import settings_of  # noqa: E402

ROUTED = "celeryproj-routed"


@pytest.fixture(autouse=True)
def _clean(app: App):  # type: ignore[no-untyped-def]
    with pointed_at(app.settings.redis_url, app.settings.queue):
        yield
    for k in app.client.scan_iter(match="celeryproj:*"):
        app.client.delete(k)
    routed = App(redis_url=app.settings.redis_url, queue=ROUTED)
    routed.purge()
    routed.close()


def start(app: App, *extra: str, queue: str | None = None,
          module: str = "celeryproj") -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, queue or app.settings.queue, *extra,
                   modules=(module,))
    w.wait_ready()
    return w


def notes(app: App, key: str, count: int, timeout: float = 5.0) -> list[str]:
    """The first ``count`` notes the worker pushed on ``celeryproj:<key>``, waited for by
    BLPOP (each within what is left of ``timeout``); fewer if they do not come."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and (left := deadline - time.monotonic()) > 0:
        item = app.client.blpop([f"celeryproj:{key}"], timeout=max(left, 0.01))
        if item is None:
            break
        got.append(item[1])
    return got


# -- the project on a real worker -----------------------------------------------------------
def test_a_celery_project_runs_on_emqtasks_worker_dash_a_proj(app: App) -> None:
    tag = app.settings.queue
    with start(app) as w:
        assert t.add.delay(2, 3).get(timeout=10) == 5, w.output()[-2000:]
        # bind=True: self.retry(countdown=...) twice, then success; self.request.retries
        assert t.flaky.delay(f"{tag}-f", 3).get(timeout=10) == 2
        # Celery's default: no automatic retry (ours would retry a ValueError 3 times); get()
        # raises the task's own exception, as Celery's
        with pytest.raises(ValueError, match="no automatic retry"):
            t.fails.delay(f"{tag}-n").get(timeout=10)
        # Celery's max_retries=3: 4 runs, then dead
        with pytest.raises(celery.MaxRetriesExceededError, match="3 retries made"):
            t.retries_forever.delay(f"{tag}-m").get(timeout=10)
        # delay() answers an AsyncResult, as Celery's: state, ready(), successful(), result
        res = t.add.delay(4, 4)
        assert isinstance(res, AsyncResult) and res.get(timeout=10) == 8
        assert (res.state, res.status, res.ready(), res.successful(), res.failed(),
                res.result) == (states.SUCCESS, states.SUCCESS, True, True, False, 8)
        assert res.handle.verdict == "enqueued"
        # send_task by name, as a Django view does without importing the tasks
        assert proj_app.send_task("celeryproj.tasks.add", (1, 1)).get(timeout=10) == 2
    assert int(app.client.get(f"celeryproj:tries:{tag}-n") or 0) == 1
    assert int(app.client.get(f"celeryproj:tries:{tag}-m") or 0) == 4
    out = w.output()
    assert "celeryproj.tasks.add" in out and "celeryproj.tasks.recorded" in out   # discovered


def test_a_task_subclass_gets_on_success_on_retry_on_failure_and_after_return(
        app: App) -> None:
    assert t.recorded.spec.max_attempts == 2 and t.recorded.spec.retry_delay == 0.05
    with start(app) as w:
        ok = t.recorded.delay("hi")
        assert ok.get(timeout=10) == "HI"
        # a base class's __call__ runs around each run; self is the base class's instance
        assert t.in_context.delay(3).get(timeout=10) == [
            "in context", ["ContextTask", "in_context", 3]]
        bad = t.recorded.delay("key")   # autoretry_for=(KeyError,) from the class: 2 runs
        with pytest.raises(KeyError, match="key"):
            bad.get(timeout=10)
        # the handlers run just after the outcome is stored
        assert notes(app, ok.id, 2) == ["success HI ['hi']", "after SUCCESS"], \
            w.output()[-2000:]
        # each attempt's pair in its order (the second attempt, 0.05 s later and maybe in
        # another child, may push its notes before the first attempt's handlers are done)
        got = notes(app, bad.id, 4)
        assert sorted(got) == sorted(["retry KeyError", "after RETRY",
                                      "failure KeyError 'key' True", "after FAILURE"]), got
        assert got.index("retry KeyError") < got.index("after RETRY"), got
        assert got.index("failure KeyError 'key' True") < got.index("after FAILURE"), got
    assert notes(app, ok.id, 1, timeout=0.1) == []   # each handler once


def test_reject_sends_the_job_to_dead_or_requeues_it(app: App) -> None:
    with start(app):
        # requeue=False: dead at once, although autoretry_for=(Exception,) would retry it
        with pytest.raises(celery.Reject, match="not now"):
            t.rejects.delay(False).get(timeout=10)
        # requeue=True: back on the queue at once, as a retry (an attempt)
        assert t.rejects.delay(True).get(timeout=10) == 1


def test_task_routes_send_a_task_to_its_queue_at_decoration_and_by_name(app: App) -> None:
    assert t.routed.spec.queue == ROUTED and t.add.spec.queue is None
    by_object = t.routed.delay(4)
    by_name = proj_app.send_task("celeryproj.tasks.routed", (5,))
    routed = app.queue(ROUTED)
    for h in (by_object, by_name):   # waiting on the routed queue, not on the app's
        assert routed.status(h.id) == "pending" and app.queue().status(h.id) is None
    with start(app, queue=ROUTED):
        assert by_object.get(timeout=10) == 40 and by_name.get(timeout=10) == 50


def test_config_from_object_reads_the_namespace() -> None:
    c = proj_app.conf
    assert c.task_default_retry_delay == 0.05 and c.timezone == "Europe/Paris"
    assert c.task_soft_time_limit == 30 and t.add.spec.soft_time_limit == 30
    assert t.add.spec.time_limit == 60 and t.add.spec.retry_delay == 0.05

    class Settings:
        CELERY_BROKER_URL = "redis://127.0.0.1:1/3"
        CELERY_RESULT_EXPIRES = timedelta(hours=1)
        CELERY_TASK_DEFAULT_QUEUE = "mail"
        DATABASES = {"default": {}}     # not Celery's: not read
        SECRET_KEY = "x"

    read = settings_of(Settings, "CELERY")
    assert read == {"broker_url": "redis://127.0.0.1:1/3", "result_expires": timedelta(hours=1),
                    "task_default_queue": "mail"}
    other = Celery("other", set_as_current=False)
    other.config_from_object(Settings, namespace="CELERY")

    @other.task
    def noop() -> None: ...

    assert noop.spec.result_ttl == 3600 and other.settings.queue == "mail"
    assert other.settings.redis_url == "redis://127.0.0.1:1/3"
    assert noop.spec.policy.retry_for == () and noop.spec.max_attempts == 4
    assert noop.spec.retry_delay == 180.0   # Celery's default_retry_delay
    # a setting set after the task was made still reaches it, as Celery reads them lazily
    other.conf.update(task_routes=[{"*.noop": {"queue": "slow"}}], task_time_limit=9)
    assert noop.spec.queue == "slow" and noop.spec.time_limit == 9
    other.conf.task_ignore_result = True
    assert noop.spec.result_ttl == 0
    # conf: attribute and item access
    other.conf["timezone"] = "Asia/Tokyo"
    assert other.conf.timezone == "Asia/Tokyo" and other.conf["task_default_queue"] == "mail"


# -- beat ------------------------------------------------------------------------------------
def test_beat_schedule_is_loaded_at_worker_start_and_fires(app: App,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERYPROJ_BEAT", "fire")
    with start(app) as w:
        # every second: two slots within ~2 s
        assert notes(app, "ticks:beat", 2, timeout=4) == ["1", "1"], w.output()[-3000:]
        out = w.output()
    assert ("beat_schedule of 'celeryproj': 2 entries loaded: tick-every-second "
            "(celeryproj.tasks.tick, every 1s); nightly-report (celeryproj.tasks.tick, "
            "cron 30 3 * * mon-fri Europe/Paris, queue celeryproj-reports)") in out
    stored = {s.name: s for s in ScheduleStore(app.queue()).load()[0].values()}
    assert set(stored) == {"tick-every-second"}   # the other is for its own queue's workers
    assert stored["tick-every-second"].args == ("beat",)


def test_add_periodic_task_in_on_after_configure_is_loaded_and_fires(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery's examples/periodic-tasks: ``@app.on_after_configure.connect`` adding entries
    with ``sender.add_periodic_task(seconds | crontab, sig, name=)``."""
    monkeypatch.setenv("CELERYPROJ_BEAT", "periodic")
    with start(app) as w:
        assert notes(app, "ticks:added", 2, timeout=4) == ["1", "1"], w.output()[-3000:]
        out = w.output()
    assert "2 entries loaded: tick-added-every-second (celeryproj.tasks.tick, every 1s); " \
           "celeryproj.tasks.tick-Happy-Mondays (celeryproj.tasks.tick, cron 30 7 * * 1" in out, \
        out[-3000:]
    stored = {s.name: s for s in ScheduleStore(app.queue()).load()[0].values()}
    assert stored["tick-added-every-second"].args == ("added",)


def test_the_worker_refuses_a_bad_beat_schedule_or_eager_mode_in_one_line(
        app: App) -> None:
    cases = {
        "CELERYPROJ_BEAT=unknown": "beat_schedule['typo'] names task "
                                   "'celeryproj.tasks.no_such_task', which no module",
        "CELERYPROJ_BEAT=badcron": "crontab hour=24 is out of range",
        "CELERYPROJ_EAGER=1": "task_always_eager=True has no meaning in emqtasks: jobs always "
                              "go through Redis: in tests, run them with the pytest plugin",
    }
    for setting, message in cases.items():
        name, _, value = setting.partition("=")
        env = dict(os.environ, PYTHONPATH=str(HERE), **{name: value})
        out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "worker", "-A", "celeryproj",
                              "--redis-url", app.settings.redis_url, "-Q", app.settings.queue],
                             env=env, capture_output=True, text=True, timeout=30)
        errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
        assert out.returncode == 2 and len(errors) == 1, (setting, out.stderr)
        assert errors[0].startswith("emqtasks: error: ") and message in errors[0], errors
        assert "Traceback" not in out.stderr and "loaded" not in out.stderr
    assert not ScheduleStore(app.queue()).load()[0]   # nothing stored


def test_dash_a_module_colon_attribute_names_the_app(app: App) -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "worker",
                          "-A", "celeryproj.celery:nope", "--redis-url", app.settings.redis_url],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.strip() == (
        "emqtasks: error: -A celeryproj.celery:nope: celeryproj.celery has no App named 'nope'")
    with start(app, module="celeryproj.celery:app") as w:   # the right one runs
        assert t.add.delay(1, 2).get(timeout=10) == 3, w.output()[-2000:]


def test_beat_entries_and_crontab_map_onto_schedules() -> None:
    c = crontab(minute="*/15", hour=[9, 17], day_of_week="mon-fri", month_of_year="1-6")
    assert c.expr == "*/15 9,17 * 1-6 mon-fri"
    assert crontab().expr == "* * * * *"
    with pytest.raises(InvalidCron, match="crontab minute=60 is out of range"):
        crontab(minute=60)
    with pytest.raises(InvalidCron, match="day_of_month=32"):
        crontab(day_of_month=32)
    other = Celery("beat-check", set_as_current=False)
    other.conf.update(timezone="America/New_York", task_routes={"x.*": "xq"})
    other.conf.beat_schedule = {"Every 10 min!": {"task": "x.y", "schedule": timedelta(minutes=10),
                                                  "kwargs": {"a": 1}},
                                "morning": {"task": "z", "schedule": crontab(hour=7, minute=0)}}
    entries = {e.schedule.name: e for e in other.beat_entries()}
    assert entries["Every-10-min"].queue == "xq" and entries["morning"].queue is None
    assert entries["morning"].schedule.tz == "America/New_York"
    assert str(entries["Every-10-min"].schedule.timing) == "every 600s"
    before = dict(other.conf)
    for bad, message in [({"a": {"task": "x", "schedule": 0.5}}, "whole number of seconds"),
                         ({"a": {"task": "x", "schedule": 5, "options": {"expires": 3}}},
                          "expires"),
                         ({"a": {"schedule": 5}}, "needs 'task'"),
                         ({"a": {"task": "x", "schedule": "daily"}}, "crontab")]:
        with pytest.raises(Exception, match=message):
            other.conf.beat_schedule = bad
    assert dict(other.conf) == before   # nothing kept


# -- the refusals and the mappings, in this process -----------------------------------------
def test_meaningless_settings_are_refused_by_name_and_harmless_ones_accepted() -> None:
    other = Celery("refusals", set_as_current=False)
    other.conf.update(accept_content=["json"], task_serializer="json", enable_utc=True,
                      task_acks_late=True, worker_prefetch_multiplier=1,
                      task_always_eager=False)
    for key, value, message in [
            ("task_serializer", "pickle", "always JSON"),
            ("accept_content", ["pickle"], "must take 'json'"),
            ("task_always_eager", True, "pytest plugin"),
            ("broker_url", "amqp://guest@localhost//", "Redis"),
            ("result_backend", "django-db", "broker's Redis"),
            ("task_routes", lambda *a: None, "router function"),
            ("task_routes", {"a": {"queue": "q", "exchange": "e"}}, "exchange"),
            ("worker_concurrency", 4, "-c N"),
            ("celery_typo_setting", 1, "unknown Celery setting"),
            ("timezone", "Mars/Olympus", "unknown time zone")]:
        with pytest.raises(EmqError, match=message):
            other.conf.update({key: value, "task_default_queue": "never-set"})
        assert "task_default_queue" not in other.conf   # one refused: none set
    with pytest.raises(InvalidArgument, match="loader"):
        Celery("x", loader="default", set_as_current=False)
    with pytest.raises(InvalidArgument, match="serializer"):
        other.task(serializer="pickle")(lambda: None)
    assert other.task(serializer="json", name="json.ok")(lambda: None).name == "json.ok"
    assert other.task(lambda: None, name="direct").name == "direct"
    assert other.conf.accept_content == ["json"]


def test_signature_and_states() -> None:
    s = signature("celeryproj.tasks.add", (1,), {"y": 2}, options={"countdown": 3},
                  task_id="sig-1")
    assert (s.name, s.args, s.kwargs, s.options) == (
        "celeryproj.tasks.add", (1,), {"y": 2}, {"countdown": 3, "job_id": "sig-1"})
    assert signature({"task": "a.b", "args": [1], "immutable": True}).immutable
    assert states.SUCCESS in states.READY_STATES and states.PENDING not in states.READY_STATES
    assert (t.add.s(1) | t.add.s(2)).__class__.__name__ == "Chain"


_STAND_IN = """
import json
from emqtasks.celery import Celery, shared_task, current_app

@shared_task(bind=True)
def early(self, x):
    return x

before = early.app
app = Celery("late")
print(json.dumps([before.main, early.app is app, "__main__.early" in app.tasks,
                  "__main__.early" in before.tasks, current_app() is app,
                  early.spec.max_attempts]))
"""


def test_a_shared_task_made_before_any_app_moves_to_the_first_app_made() -> None:
    out = subprocess.run([sys.executable, "-c", _STAND_IN], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == ["default", True, True, False, True, 4]


def test_import_emqtasks_does_not_import_emqtasks_celery() -> None:
    code = ("import emqtasks, sys; "
            "print([m for m in sys.modules if m.startswith('emqtasks.celery')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


_DJANGO = """
import sys
from emqtasks.celery import Celery
from emqtasks.celery.worker import prepare
from emqtasks.producer.app import all_apps, default_app

app = Celery("dj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
assert "celeryproj.tasks" not in sys.modules   # imported when a worker starts
prepare()                                      # what the worker command calls
names = sorted(n for a in all_apps() for n in a.tasks)
print("celeryproj.tasks" in sys.modules, app.conf.timezone,
      app.conf.task_routes["celeryproj.tasks.routed"], "celeryproj.tasks.add" in names,
      # Django's connections handled as under --django
      all(default_app.hooks.has(e) for e in ("child_started", "task_started", "task_dead")))
"""


def test_autodiscover_tasks_without_packages_reads_django_installed_apps() -> None:
    pytest.importorskip("django")
    env = dict(os.environ, PYTHONPATH=str(HERE), DJANGO_SETTINGS_MODULE="celeryproj.settings")
    out = subprocess.run([sys.executable, "-c", _DJANGO], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.stdout.strip() == ("True Europe/Paris {'queue': 'celeryproj-routed'} True "
                                  "True"), out.stderr

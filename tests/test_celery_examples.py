"""Celery's own example projects (examples/celery: next-steps, django, app), ported by their
import lines only (issue 27, item 9), each run on a real worker the way its README or
docstring says, with the broker in CELERY_BROKER_URL as Celery reads it: the code keeps its
``broker='amqp://'``, which the environment overrides in Celery and here.

Each test copies its project to a temporary folder (the Django one writes its SQLite file
there), gives it a queue of its own (EMQ_QUEUE), and calls its tasks from a separate Python
process, as the project's shell would. myapp's ``add`` sleeps 10 s (as in Celery): its worker
and call start with the module (``myapp_run``), so the other tests overlap that sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from emqtasks import App, AsyncResult, ConfigError
from emqtasks.testing import WorkerProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "celery"
WAIT = 20.0


class Project:
    """One example project copied to ``folder``, its worker's and its clients' environment."""

    def __init__(self, name: str, tmp: Path, redis_url: str, queue: str) -> None:
        self.folder = tmp / name
        shutil.copytree(EXAMPLES / name, self.folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.sqlite3"))
        self.queue = queue
        self.app = App(redis_url=redis_url, queue=queue)
        env = {k: v for k, v in os.environ.items() if k not in ("EMQ_REDIS_URL", "EMQ_QUEUE")}
        # PYTHONUNBUFFERED: a task's print() (debug_task's) reaches the worker's log at once,
        # not when a forked child's stdout buffer fills
        self.env = dict(env, CELERY_BROKER_URL=redis_url, CELERY_RESULT_BACKEND=redis_url,
                        PYTHONUNBUFFERED="1",
                        EMQ_QUEUE=queue, PYTHONPATH=os.pathsep.join(
                            filter(None, [str(self.folder), env.get("PYTHONPATH")])))

    def worker(self, *args: str) -> WorkerProcess:
        """``emqtasks worker -A ... -c 2 <args>``: no --redis-url, CELERY_BROKER_URL says."""
        modules = [a for i, a in enumerate(args) if i and args[i - 1] == "-A"]
        extra = [a for i, a in enumerate(args) if a != "-A" and (not i or args[i - 1] != "-A")]
        w = WorkerProcess(modules, concurrency=2, tick=0.2, extra=extra, env=self.env,
                          log_path=self.folder.parent / f"worker-{time.time_ns()}.log")
        w.wait_ready()
        return w

    def run(self, *argv: str, code: str | None = None) -> str:
        """A Python process in the project's folder (``code``: ``python -c code``)."""
        cmd = [sys.executable, *argv, *(["-c", code] if code is not None else [])]
        done = subprocess.run(cmd, cwd=self.folder, env=self.env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture
def project(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
            queue_name: str) -> Iterator[Project]:
    p = Project(request.param, tmp_path, redis_url, queue_name)
    yield p
    p.app.purge()
    p.app.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("project", ["next-steps"], indirect=True)
def test_next_steps_proj_runs_celery_calls_and_canvas(project: Project) -> None:
    # celery -A proj worker -l INFO  ->  emqtasks worker -A proj -l INFO
    with project.worker("-A", "proj", "-l", "INFO") as w:
        out = project.run(code=f"""if True:
            import json
            from proj.celery import app
            from proj.tasks import add, mul, xsum
            from emqtasks.celery import AsyncResult, chain, chord, group
            T = {WAIT}
            r = add.delay(4, 4)
            got = {{"delay": r.get(timeout=T)}}
            again = AsyncResult(r.id)
            got["state"] = [again.state, again.result, again.successful()]
            got["apply_async"] = mul.apply_async((2, 3), countdown=0.1).get(timeout=T)
            got["group"] = group(add.s(i, i) for i in range(10))().get(timeout=T)
            got["chain"] = chain(add.s(4, 4) | mul.s(8))().get(timeout=T)
            got["chord"] = chord((add.s(i, i) for i in range(10)), xsum.s())().get(timeout=T)
            got["partial"] = (add.s(2, 2) | add.s(4) | mul.s(2))().get(timeout=T)
            got["result_ttl"] = add.spec.result_ttl
            print(json.dumps(got))
            """)
        got = json.loads(out)
        assert got == {"delay": 8, "state": ["SUCCESS", 8, True], "apply_async": 6,
                       "group": [0, 2, 4, 6, 8, 10, 12, 14, 16, 18], "chain": 64,
                       "chord": 90, "partial": 16,
                       "result_ttl": 3600}, w.output()   # app.conf.update(result_expires=3600)
        # include=['proj.tasks']: the worker imported the tasks module -A did not name
        assert "3 tasks registered (proj.tasks.add, proj.tasks.mul, proj.tasks.xsum)" \
            in w.output()
        assert "redis://" in w.output() and "amqp" not in w.output()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("project", ["django"], indirect=True)
def test_django_example_runs_shared_tasks_on_its_models(project: Project) -> None:
    project.run("manage.py", "migrate", "-v0")
    # celery -A proj worker -l INFO  ->  emqtasks worker -A proj -l INFO
    with project.worker("-A", "proj", "-l", "INFO") as w:
        out = project.run("manage.py", "shell", "-v0", code=f"""if True:
            import json
            from demoapp.models import Widget
            from demoapp.tasks import add, count_widgets, error_task, mul, rename_widget, xsum
            from proj.celery import debug_task
            T = {WAIT}
            res = add.delay_on_commit(2, 3)   # the example's README
            got = {{"add": res.get(timeout=T)}}
            got["mul"] = mul.delay(6, 7).get(timeout=T)
            got["xsum"] = xsum.delay([1, 2, 3]).get(timeout=T)
            w = Widget.objects.create(name="before")
            got["count"] = count_widgets.delay().get(timeout=T)
            rename_widget.delay(w.id, "after").get(timeout=T)
            w.refresh_from_db()
            got["renamed"] = w.name
            got["debug"] = debug_task.delay().id
            got["error"] = error_task.delay().id
            print(json.dumps(got))
            """)
        got = json.loads(out)
        assert {k: got[k] for k in ("add", "mul", "xsum", "count", "renamed")} == {
            "add": 5, "mul": 42, "xsum": 6, "count": 1, "renamed": "after"}, w.output()
        # bind=True, ignore_result=True: the task printed its request
        w.wait_for(lambda: f"Request: Request(id='{got['debug']}'" in w.output(),
                   WAIT, "debug_task's print")
        # autoretry_for=(Exception,), retry_kwargs max_retries=2 / countdown 600: retried,
        # not dead, and not due again for ten minutes
        w.wait_for(lambda: "failed, retry: Exception: Test error" in w.output(), WAIT,
                   "error_task's first failure")
        failed = AsyncResult(got["error"], project.app)
        assert failed.state == "RETRY"
        row = project.app.job(got["error"])
        assert row is not None and row["state"] == "delayed" and row["attempts"] == 1, row


class ScriptWorker(WorkerProcess):
    """``python <script> worker ...`` (Celery's ``app.start()``), with WorkerProcess's
    bounded waits and stop."""

    def __init__(self, project: Project, *argv: str) -> None:
        self.log_path = project.folder.parent / f"worker-{time.time_ns()}.log"
        self.log = open(self.log_path, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=project.folder,
                                     env=project.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)


class MyappRun:
    """myapp's worker and its client's ``add.delay(16, 16).get()``, started as the module
    starts: ``add`` sleeps 10 s, which the module's other tests overlap."""

    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.project = Project("app", tmp, redis_url, f"t-{uuid.uuid4().hex[:12]}")
        # (window1)$ python myapp.py worker -l INFO  -- app.start(): the script is -A
        self.worker = ScriptWorker(self.project, "myapp.py", "worker", "-l", "INFO", "-c", "2")
        self.client: subprocess.Popen[str] | None = None

    def call(self) -> None:
        """(window2)$ python  >>> from myapp import add; add.delay(16, 16).get()"""
        self.client = subprocess.Popen(
            [sys.executable, "-c", "from myapp import add; print(add.delay(16, 16).get())"],
            cwd=self.project.folder, env=self.project.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def close(self) -> None:
        if self.client is not None and self.client.poll() is None:
            self.client.kill()
            self.client.communicate()
        self.worker.__exit__()
        self.project.app.purge()
        self.project.app.close()


@pytest.fixture(scope="module", autouse=True)
def myapp_run(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[MyappRun]:
    run = MyappRun(tmp_path_factory.mktemp("myapp"), redis_url)
    try:
        run.call()    # queued until the worker is up: its start overlaps the tests' too
        yield run
    finally:
        run.close()


@pytest.mark.timeout(60)
def test_app_myapp_runs_as_its_docstring_says(myapp_run: MyappRun) -> None:
    w, client = myapp_run.worker, myapp_run.client
    assert client is not None
    w.wait_ready()
    assert "1 tasks registered (myapp.add)" in w.output()
    out, _ = client.communicate(timeout=40)   # add sleeps 10 s, from the module's start
    assert client.returncode == 0 and out.strip() == "32", out + w.output()
    assert w.stop() == 0


# -- what the ports needed of emqtasks.celery, in this process ------------------------------
def test_keyword_settings_and_the_environments_broker_as_celery_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from emqtasks.celery import AsyncResult as CeleryResult
    from emqtasks.celery import Celery, current_app

    # Celery('myapp', broker=..., task_acks_late=True): keyword arguments are settings,
    # checked as app.conf's (changes= too)
    kw = Celery("kw", broker="redis://127.0.0.1:1/0", task_acks_late=True,
                changes={"result_expires": 60}, set_as_current=False)
    assert (kw.conf.task_acks_late, kw.conf.result_expires) == (True, 60)
    with pytest.raises(ConfigError, match="-c N"):
        Celery("kw", worker_concurrency=4, set_as_current=False)
    with pytest.raises(ConfigError, match="unknown Celery setting 'task_acks_lat'"):
        Celery("kw", task_acks_lat=True, set_as_current=False)
    # broker='amqp://' is refused ... unless CELERY_BROKER_URL overrides it, as in Celery
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    with pytest.raises(ConfigError, match="Redis"):
        Celery("amqp", broker="amqp://", set_as_current=False)
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/3")
    monkeypatch.setenv("CELERY_RESULT_BACKEND", "redis://127.0.0.1:1/3")
    env = Celery("amqp", broker="amqp://", backend="db+sqlite:///results.sqlite",
                 set_as_current=False)
    assert env.conf.broker_url == env.settings.redis_url == "redis://127.0.0.1:1/3"
    assert env.conf.result_backend == "redis://127.0.0.1:1/3"
    assert Celery("no-broker", set_as_current=False).settings.redis_url == \
        "redis://127.0.0.1:1/3"
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://guest@localhost//")
    with pytest.raises(ConfigError, match="CELERY_BROKER_URL in the environment"):
        Celery("bad-env", set_as_current=False)
    monkeypatch.delenv("CELERY_BROKER_URL")
    # AsyncResult(id) reads the current Celery app's server; app.AsyncResult(id) its own
    assert CeleryResult("some-id").app is current_app()
    assert env.AsyncResult("some-id").app is env

"""The pytest plugin: a server, an App, workers and in-process runs for a user's own tests.

Registered as the ``pytest11`` entry point ``emqtasks``, so installing emqtasks makes the
fixtures available to every test suite of the environment; each is opt-in by name, and a
test that names none gets nothing of them (no server, no App changed, no output):

- ``emq_server`` (session): a private server on a free loopback port, without persistence,
  stopped at the end of the session; the system ``redis-server`` (``EMQ_REDIS_SERVER``
  names another), else the bundled Valkey; with the native module when it is built.
- ``emq_app``: an App (``emqtasks.testing.InlineApp``) on a fresh queue of that server.
  For the test's length every App of the process (the module-level ``@task``'s too)
  enqueues there, and ``EMQ_REDIS_URL`` / ``EMQ_QUEUE`` name it for Apps made and
  commands run meanwhile; the queue is purged at the end. ``emq_app.run_pending()`` runs
  the due jobs here (emqtasks.testing.run_pending).
- ``emq_worker``: ``emq_worker("app.tasks", concurrency=2)`` starts a real
  ``emqtasks worker`` on that queue, waits until it serves, and stops it (SIGTERM, a warm
  stop) when the test ends; its log is shown with a failed test's report.

The module is named ``pytest`` inside the package, as the issue asked: its own
``import pytest`` is absolute (as every import is since Python 3), so it is the real
pytest; only a script run from inside ``emqtasks/`` would see this file as ``pytest``, and
none is run from there.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from .ops.localserver import LocalRedis, private_binary
from .producer.app import pointed_at
from .testing import InlineApp, WorkerProcess

__all__ = ["WorkerFactory", "emq_app", "emq_server", "emq_worker"]

#: How many lines of a worker's log a failed test's report shows.
LOG_TAIL = 200

#: The workers a test started (their modules, for the report's title).
_WORKERS = pytest.StashKey[list[tuple[str, WorkerProcess]]]()


@pytest.fixture(scope="session")
def emq_server() -> Iterator[LocalRedis]:
    """A private server for the session, on a free loopback port: ``.url``, ``.port``,
    ``.binary``, ``.client()``."""
    with LocalRedis(binary=private_binary()) as server:
        yield server


@pytest.fixture
def emq_app(emq_server: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> Iterator[InlineApp]:
    """An App on a fresh queue of ``emq_server``, where every App enqueues during the test;
    ``run_pending()`` runs the due jobs in this process. Purged and closed at the end."""
    queue = f"test-{uuid.uuid4().hex[:12]}"
    app = InlineApp(redis_url=emq_server.url, queue=queue)
    monkeypatch.setenv("EMQ_REDIS_URL", emq_server.url)
    monkeypatch.setenv("EMQ_QUEUE", queue)
    with pointed_at(emq_server.url, queue):
        yield app
        app.purge()
    app.close()


class WorkerFactory:
    """``emq_worker``: starts real ``emqtasks worker`` processes on the test's queue."""

    def __init__(self, app: InlineApp, log_dir: Path, started: list[tuple[str, WorkerProcess]]
                 ) -> None:
        self.app = app
        self.log_dir = log_dir
        self.started = started

    def __call__(self, *modules: str, concurrency: int = 2, tick: float | None = None,
                 extra: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 ready_timeout: float = 30.0) -> WorkerProcess:
        """A worker importing ``modules`` (``-A``), ``concurrency`` children, serving the
        queue of ``emq_app``; returned once it has forked its children. ``extra``: more
        ``emqtasks worker`` options (``--grace 5``); ``tick``: ``--tick``."""
        if not modules:
            raise TypeError("emq_worker() needs the module(s) of your tasks: "
                            "emq_worker('app.tasks')")
        settings = self.app.settings
        worker = WorkerProcess(modules, redis_url=settings.redis_url, queue=settings.queue,
                               concurrency=concurrency, tick=tick, extra=extra,
                               path=_test_path(), env=env,
                               log_path=self.log_dir / f"worker-{len(self.started)}.log")
        self.started.append((" ".join(modules), worker))
        worker.wait_ready(ready_timeout)   # its log in the error if it exits or hangs
        return worker


@pytest.fixture
def emq_worker(emq_app: InlineApp, request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerFactory]:
    """A factory: ``emq_worker("app.tasks", concurrency=2)`` runs a worker until the test
    ends; each is stopped warm then, and one that does not stop cleanly fails the test's
    teardown with its log."""
    started: list[tuple[str, WorkerProcess]] = []
    request.node.stash[_WORKERS] = started
    yield WorkerFactory(emq_app, tmp_path_factory.mktemp("emq_worker"), started)
    unclean = []
    for modules, worker in started:
        if worker.proc.poll() is not None:   # the test stopped or killed it: its business
            continue
        code = worker.stop(timeout=20.0)
        if code != 0:
            unclean.append(f"emqtasks worker {worker.pid} ({modules}) exited with {code} on "
                           f"SIGTERM; its log:\n{worker.output(LOG_TAIL)}")
    if unclean:
        pytest.fail("\n\n".join(unclean), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None],
                              ) -> Generator[None, Any, None]:
    """A failed test that started workers shows their logs below its own output (a
    teardown that fails for a worker says its log already)."""
    outcome = yield
    started = item.stash.get(_WORKERS, None)
    if not started or call.when != "call":
        return
    report: pytest.TestReport = outcome.get_result()
    if report.failed:
        for modules, worker in started:
            report.sections.append((f"emqtasks worker {worker.pid} ({modules}) log",
                                    worker.output(LOG_TAIL)))


def _test_path() -> str:
    """The folders this test process imports from beyond the interpreter's own library and
    site-packages (the rootdir and test folders pytest put on sys.path, PYTHONPATH), for
    the worker's PYTHONPATH: it imports the modules the test can."""
    paths = sysconfig.get_paths()
    own = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders: list[str] = []
    for entry in sys.path:
        path = Path(entry or os.getcwd()).resolve()
        if path.is_dir() and not own & {path, *path.parents} and str(path) not in folders:
            folders.append(str(path))
    return os.pathsep.join(folders)

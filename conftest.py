"""The real Redis every test talks to, and a fresh queue name per test.

Order: EMQ_TEST_REDIS_URL if set; else, when EMQ_REDIS_SERVER names a server binary, a private
server of that binary; else a testcontainers Redis when a Docker engine answers; else a private
redis-server from PATH on a free loopback port (no persistence), stopped at the end. Tests
that kill or restart a server take ``private_redis`` instead, and private servers, local
clusters included, always run ``EMQ_REDIS_SERVER`` or the redis-server found on PATH
(emqtasks._dev.localserver.find_binary). The report header names both.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis, find_binary, server_name
from emqtasks.errors import NativeUnavailable

# tests/support: helpers and launchers; tests/tasks: the modules workers import with -A.
for _folder in ("support", "tasks"):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "tests" / _folder))

# The suite starts Python afresh hundreds of times (workers, the CLI): under
# PYTHONDONTWRITEBYTECODE each start compiled emqtasks from source again (~0.1 s of CPU).
# The subprocesses write their bytecode to a folder of this run instead, never into the tree.
if os.environ.get("PYTHONDONTWRITEBYTECODE"):
    _pycache = tempfile.mkdtemp(prefix="emq-test-pyc-")
    atexit.register(shutil.rmtree, _pycache, True)
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ.setdefault("PYTHONPYCACHEPREFIX", _pycache)


# pytester runs a user's test file in a fresh pytest (tests/test_pytest_plugin.py)
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # The emq_* fixtures (emqtasks/pytest.py) come from the package's pytest11 entry point;
    # a checkout installed before it existed, or a run with plugin autoload off, gets them
    # here (pip install -e . registers the entry point).
    manager = config.pluginmanager
    if not manager.has_plugin("emqtasks") and not manager.is_blocked("emqtasks"):
        manager.import_plugin("emqtasks.pytest")


@functools.cache
def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("EMQ_TEST_REDIS_URL")
    if url:
        yield url
    elif not os.environ.get("EMQ_REDIS_SERVER") and _docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as container:
            host = container.get_container_host_ip()
            yield f"redis://{host}:{container.get_exposed_port(6379)}/0"
    else:
        with LocalRedis() as server:
            yield server.url


def pytest_report_header(config: pytest.Config) -> list[str]:
    binary = find_binary("redis-server")
    private = f"{server_name(binary)} ({binary})" if binary else "no redis-server found"
    if os.environ.get("EMQ_TEST_REDIS_URL"):
        shared = "EMQ_TEST_REDIS_URL"
    elif not os.environ.get("EMQ_REDIS_SERVER") and _docker_answers():
        shared = "a redis:7 container (testcontainers)"
    else:
        shared = "a private server of that binary"
    return [f"emqtasks test servers: private {private}; shared: {shared}"]


@pytest.fixture
def queue_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def app(redis_url: str, queue_name: str) -> Iterator[App]:
    application = App(redis_url=redis_url, queue=queue_name)
    yield application
    application.purge()
    application.close()


@pytest.fixture(params=["lua", "native"])
def path_app(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, redis_url: str,
             queue_name: str) -> Iterator[App]:
    """An app whose hot verbs run the scripts, or the module's commands (its workers
    inherit the environment); skipped on the module's side where the server has none.
    Removes the ``t:<queue>:*`` keys tests' tasks write."""
    monkeypatch.setenv("EMQ_NATIVE", "off" if request.param == "lua" else "require")
    application = App(redis_url=redis_url, queue=queue_name)
    try:
        application.queue().claim(1)
    except NativeUnavailable:
        application.close()
        pytest.skip("the server has no emq module")
    yield application
    for key in application.client.scan_iter(match=f"t:{queue_name}:*"):
        application.client.delete(key)
    application.purge()
    application.close()


@pytest.fixture
def queue(app: App):  # type: ignore[no-untyped-def]
    return app.queue()


@pytest.fixture
def private_redis() -> Iterator[LocalRedis]:
    """A server of the test's own, to kill, restart or flush without disturbing others."""
    with LocalRedis() as server:
        yield server

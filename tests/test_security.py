"""Security: no pickle, task names only from the registry, TLS checks on by default, no
password or payload in logs and errors, the eviction warning, and least-privilege ACL users
for producers and workers (emqtasks/acl.py) that a real worker and producer run under."""

from __future__ import annotations

import ast
import os
import pickle
import shutil
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import security_tasks as st
from workerproc import HERE, WorkerProc

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis, free_port
from emqtasks.errors import TaskFailed
from emqtasks.native import module_path
from emqtasks.ops import acl
from emqtasks.store import connection as connection_module
from emqtasks.store.cluster import parse_url
from emqtasks.store.connection import connect
from emqtasks.store.queue import NewJob, Queue

pytestmark = pytest.mark.timeout(120)

PACKAGE = Path(__file__).resolve().parent.parent / "emqtasks"
ROOT = PACKAGE.parent


def _start(url: str, queue: str, *extra: str, concurrency: int = 2) -> WorkerProc:
    w = WorkerProc(url, queue, *extra, concurrency=concurrency, modules=("security_tasks",))
    w.wait_ready()
    return w


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    env.pop("EMQ_REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", *args], capture_output=True,
                          text=True, timeout=30, env=env)


# -- no pickle, no eval, no import from a payload ---------------------------------------------

#: Modules that turn bytes into code or arbitrary objects.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "jsonpickle",
                  "marshal", "shelve", "yaml", "copyreg"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


#: Benchmark harnesses that drive other task libraries for comparison (their actors'
#: ``send``, their modules imported by name); not on any path of emqtasks' own jobs. They
#: still may not import pickle and the like.
PEER_HARNESSES = {"peers.py", "peers_run.py", "peer_tasks.py"}
#: ``.send()`` calls that resume a generator, not a pipe: a store plan is a generator that
#: yields the commands to send and is sent their replies (store/plan.py).
GENERATOR_SENDS = {"emqtasks/store/plan.py"}


def _package_sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    return files


def test_the_package_never_imports_pickle_or_calls_eval() -> None:
    problems: list[str] = []
    for path in _package_sources():
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            else:
                names = []
            problems += [f"{where}:{node.lineno} imports {n}" for n in names
                         if n in UNSAFE_MODULES]
            if isinstance(node, ast.Call) and path.name not in PEER_HARNESSES:
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else \
                    fn.attr if isinstance(fn, ast.Attribute) else ""
                # the builtins, called bare (client.eval is Redis EVAL, re.compile a regex)
                if name in UNSAFE_CALLS and isinstance(fn, ast.Name):
                    problems.append(f"{where}:{node.lineno} calls {name}()")
                # multiprocess pipes: send()/recv() pickle (with dill); send_bytes does not
                if name in ("send", "recv") and isinstance(fn, ast.Attribute) \
                        and where.as_posix() not in GENERATOR_SENDS:
                    problems.append(f"{where}:{node.lineno} calls .{name}() (pickles)")
                # importing by a name known only at run time: only the operator's -A modules
                # (cli/worker.py), the fixed table of lazily loaded commands (cli/__init__),
                # and what a Celery app's own code names (include=, autodiscover_tasks,
                # config_from_object: code the operator wrote, never a job's data)
                if name == "import_module" and where.as_posix() not in (
                        "emqtasks/cli/worker.py", "emqtasks/cli/__init__.py",
                        "emqtasks/celery/app.py", "emqtasks/celery/conf.py"):
                    problems.append(f"{where}:{node.lineno} calls import_module()")
            if isinstance(node, ast.Attribute) and node.attr in (
                    "Queue", "SimpleQueue", "Manager", "JoinableQueue") and \
                    isinstance(node.value, ast.Name) and node.value.id in (
                        "multiprocess", "multiprocessing", "_ctx"):
                problems.append(f"{where}:{node.lineno} uses {node.value.id}.{node.attr} "
                                "(pickles)")
    assert problems == []


def test_children_are_forked_so_nothing_is_pickled_to_start_them() -> None:
    # The master hands a child its Child object by fork (the "fork" start method copies the
    # process), never through a pipe or a spawn, which would pickle it
    master = (PACKAGE / "worker" / "master.py").read_text()
    assert 'get_context("fork")' in master
    assert "send_bytes" in master and \
        "recv_bytes" in (PACKAGE / "worker" / "child.py").read_text()


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A module that, if anyone imports it, leaves a file behind."""
    folder = tmp_path_factory.mktemp("canary")
    name = f"emq_canary_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(folder / 'imported')!r}).write_text('yes')\n"
        "def run(*a, **k):\n    return 'ran'\n")
    return folder / f"{name}.py"


@pytest.fixture(scope="module")
def sec_pool(redis_url: str, canary: Path) -> Iterator[tuple[App, WorkerProc]]:
    name = f"sec-{uuid.uuid4().hex[:10]}"
    app = App(redis_url=redis_url, queue=name)
    with pytest.MonkeyPatch.context() as mp:
        # the canary's folder is importable by the worker, should it ever try
        mp.setenv("PYTHONPATH", str(canary.parent))
        w = _start(redis_url, name)
    with w:
        yield app, w
        w.stop()
    app.purge()
    app.close()


def _dead_at_once(app: App, w: WorkerProc, job_id: str) -> dict[str, Any]:
    w.wait_for(lambda: app.queue().status(job_id) == "dead", what=f"{job_id} dead")
    info = app.job(job_id)
    assert info is not None and info["attempts"] == 1
    return info


def test_a_task_name_that_is_a_module_path_is_never_imported(sec_pool, canary: Path,
                                                             tmp_path: Path) -> None:
    app, w = sec_pool
    marker = tmp_path / "system-ran"
    names = ["os.system", "subprocess.check_call", "builtins.exec", "posix.system",
             f"{canary.stem}.run", f"{canary.stem}:run", "importlib.import_module"]
    for i, task in enumerate(names):
        app.queue().enqueue_many([NewJob(f"mod-{i}", task,
                                         f'{{"v":1,"a":["touch {marker}"],"k":{{}}}}',
                                         "evil", 3, 30_000, 50, 3600)])
    for i, task in enumerate(names):
        info = _dead_at_once(app, w, f"mod-{i}")
        assert f"UnknownTask: unknown task {task!r}" in info["error"]
    # Nothing ran and nothing was imported
    assert not marker.exists()
    assert not (canary.parent / "imported").exists()
    # (the canary does work: importing it leaves its file)
    subprocess.run([sys.executable, "-c", f"import {canary.stem}"], check=True,
                   env=dict(os.environ, PYTHONPATH=str(canary.parent)))
    assert (canary.parent / "imported").exists()
    (canary.parent / "imported").unlink()
    assert app.send_task(st.add, (1, 2)).get(timeout=15) == 3


class _Boom:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_is_dead_lettered_and_never_unpickled(sec_pool, tmp_path: Path) -> None:
    app, w = sec_pool
    raw = redis.Redis.from_url(app.settings.redis_url)
    marker = tmp_path / "unpickled"
    payloads = {f"pk-{p}": pickle.dumps(_Boom(marker), protocol=p) for p in (0, 2, 5)}
    try:
        for job_id, payload in payloads.items():
            job = NewJob(job_id, "sec.add", payload,  # type: ignore[arg-type]
                         "evil", 3, 30_000, 50, 3600)
            Queue(raw, app.queue().name).enqueue_many([job])
        for job_id in payloads:
            assert "SerializationError: undecodable payload" in \
                _dead_at_once(app, w, job_id)["error"]
    finally:
        raw.close()
    assert not marker.exists()
    assert "Traceback" not in w.output()


# -- TLS ---------------------------------------------------------------------------------------

def _tls_of(client: Any) -> tuple[dict[str, Any], Any]:
    pool = client.connection_pool
    return pool.connection_kwargs, pool.make_connection()


def test_rediss_urls_check_the_certificate_and_the_host_name_by_default(monkeypatch) -> None:
    kwargs, conn = _tls_of(connect("rediss://:pw@redis.example.com:6380/0"))
    assert kwargs["ssl_cert_reqs"] == "required" and kwargs["ssl_check_hostname"] is True
    assert conn.cert_reqs == ssl.CERT_REQUIRED and conn.check_hostname is True
    # The URL may say otherwise, explicitly
    kwargs, conn = _tls_of(connect("rediss://h:6380/0?ssl_check_hostname=false"))
    assert conn.cert_reqs == ssl.CERT_REQUIRED and conn.check_hostname is False
    kwargs, conn = _tls_of(connect("rediss://h:6380/0?ssl_cert_reqs=none"))
    assert conn.cert_reqs == ssl.CERT_NONE
    # Plain redis:// stays plain
    kwargs, _ = _tls_of(connect("redis://h:6379/0"))
    assert "ssl_cert_reqs" not in kwargs
    # And a TLS cluster URL asks for both checks too (the cluster client connects as it
    # is made: its options are looked at on the way in)
    seen: dict[str, Any] = {}
    monkeypatch.setattr(connection_module, "connect_cluster",
                        lambda url, **defaults: seen.update(defaults, **parse_url(url)[1]))
    connect("rediss+cluster://:pw@h1:7000,h2:7001")
    assert seen["ssl"] is True and seen["ssl_cert_reqs"] == "required"
    assert seen["ssl_check_hostname"] is True
    seen.clear()
    connect("redis+cluster://h1:7000")
    assert "ssl" not in seen and "ssl_cert_reqs" not in seen


def _make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for the name ``localhost`` only."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=emqtasks test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")
    (folder / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf")
    return folder / "ca.crt", folder / "server.crt", folder / "server.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_rediss_refuses_an_untrusted_or_misnamed_server_and_talks_to_a_good_one(
        tmp_path: Path) -> None:
    ca, cert, key = _make_certs(tmp_path)
    port = free_port()
    try:
        server = LocalRedis(extra=("--tls-port", str(port), "--tls-cert-file", str(cert),
                                   "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                                   "--tls-auth-clients", "no")).start()
    except Exception as exc:   # a redis-server built without TLS
        pytest.skip(f"redis-server without TLS: {exc}")
    try:
        # A certificate the client does not trust: refused
        with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            connect(f"rediss://localhost:{port}/0").ping()
        # A trusted certificate for another name: refused
        with pytest.raises(redis.exceptions.ConnectionError, match="mismatch"):
            connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}").ping()
        # Trusted, and for the name asked: a job goes in
        app = App(redis_url=f"rediss://localhost:{port}/0?ssl_ca_certs={ca}", queue="tls")
        assert app.send_task("sec.add", (1, 2)).duplicate is False
        assert app.stats()["pending"] == 1
        app.close()
    finally:
        server.close()


# -- no password in logs or errors -------------------------------------------------------------

SECRET = "s3cret-Pw"


def test_a_worker_on_a_password_url_never_prints_the_password(private_redis: LocalRedis,
                                                              queue_name: str) -> None:
    private_redis.client().config_set("requirepass", SECRET)
    url = f"redis://:{SECRET}@127.0.0.1:{private_redis.port}/0"
    app = App(redis_url=url, queue=queue_name)
    try:
        with _start(url, queue_name) as w:
            assert app.send_task(st.add, (2, 2)).get(timeout=15) == 4
            with pytest.raises(TaskFailed):
                app.send_task(st.fails_loudly, ("x",)).get(timeout=15)
            assert w.stop() == 0
            out = w.log_path.read_text()   # everything, the shutdown lines included
        assert f"redis redis://:***@127.0.0.1:{private_redis.port}/0" in out
        assert SECRET not in out
        assert "maxmemory-policy" not in out    # noeviction: no warning
        # The admin commands do not print it either, working or failing
        ok = _cli("stats", "--redis-url", url, "-Q", queue_name)
        assert ok.returncode == 0 and SECRET not in ok.stdout + ok.stderr
        wrong = f"redis://:wrong-{SECRET}@127.0.0.1:{private_redis.port}/0"
        for args in (["stats"], ["worker", "-A", "security_tasks"]):
            bad = _cli(*args, "--redis-url", wrong, "-Q", queue_name)
            assert bad.returncode == 2 and SECRET not in bad.stdout + bad.stderr, bad.stderr
            assert "redis://:***@" in bad.stderr
    finally:
        app.close()


@pytest.mark.parametrize("args", [
    ["stats", "--redis-url", f"redis://:{SECRET}@127.0.0.1:1/0"],
    ["stats", "--redis-url", f"redis://user:{SECRET}@127.0.0.1:1/0"],
    ["stats", "--redis-url", f"redis://127.0.0.1:1/0?password={SECRET}"],
    ["stats", "--redis-url", f"redis://:{SECRET}@127.0.0.1:1/not-a-db"],
    ["stats", "--redis-url", f"rediss://:{SECRET}@127.0.0.1:1/0"],
    ["pause", "--redis-url", f"redis+cluster://:{SECRET}@127.0.0.1:notaport"],
    ["pause", "--redis-url", f"redis+cluster://{SECRET}@127.0.0.1:1/3"],
    ["dead", "--redis-url", f"redis+cluster://:{SECRET}@127.0.0.1:1?bogus=1"],
    ["worker", "-A", "security_tasks", "--redis-url", f"redis://:{SECRET}@127.0.0.1:1/0"],
], ids=["unreachable", "user-and-password", "password-option", "bad-db", "tls-unreachable",
        "cluster-bad-port", "cluster-bad-db", "cluster-bad-option", "worker-unreachable"])
def test_command_line_errors_never_print_the_password(args: list[str]) -> None:
    result = _cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("emqtasks: error: "), result.stderr
    assert SECRET not in result.stdout + result.stderr, result.stderr


# -- payloads are not logged in full -----------------------------------------------------------

def test_a_failing_task_with_a_100_kb_argument_logs_short_lines(app: App) -> None:
    blob = "y" * 100_000
    with _start(app.settings.redis_url, app.settings.queue) as w:
        h = app.send_task(st.fails_loudly, (blob,))
        with pytest.raises(TaskFailed):
            h.get(timeout=15)
        # Two children may write the lines out of order: the first logs its retry after
        # the retry is made, when the second may already have run the job again
        w.wait_for(lambda: "failed, dead" in w.output() and "failed, retry" in w.output(),
                   what="the retry and the dead line")
        out = w.output()
        w.stop()
    lines = sorted((ln for ln in out.splitlines() if h.id in ln),
                   key=lambda ln: "failed, dead" in ln)
    assert len(lines) == 2 and "failed, retry" in lines[0], lines   # one retry, then dead
    assert all(len(ln) < 1000 for ln in out.splitlines()), max(map(len, out.splitlines()))
    assert "y" * 1000 not in out
    assert f"({len('ValueError: cannot use ') + len(blob)} chars)" in lines[0]   # how much
    # The row keeps the whole error for whoever inspects the job
    assert blob in app.job(h.id)["error"]


# -- eviction ------------------------------------------------------------------------------------

def test_the_worker_warns_when_the_server_may_evict_queue_keys(queue_name: str) -> None:
    with LocalRedis(extra=("--maxmemory-policy", "allkeys-lru")) as server, \
            _start(server.url, queue_name) as w:
        out = w.output()
        w.stop()
    assert "maxmemory-policy is 'allkeys-lru': Redis may evict queue keys" in out
    assert "WARNING" in next(ln for ln in out.splitlines() if "maxmemory-policy" in ln)


# -- least-privilege ACL users ---------------------------------------------------------------------

PRODUCER, WORKER = "emq-producer", "emq-worker"


#: How servers word an ACL refusal, lower-cased. Redis 6.2 and 7: "NOPERM this user has no
#: permissions to run the 'x' command" / "... to access one of the keys" (redis-py strips the
#: NOPERM code), and inside a script "The user executing the script can't run this command" /
#: "can't access at least one of the keys". Valkey 9: "User u has no permissions to run the
#: 'x' command", "No permissions to access a key", inside a script prefixed "ACL failure in
#: script: ".
REFUSALS = ("noperm", "no permissions", "can't run", "can't access")


def _denied(fn: Any, *args: Any) -> str:
    """The call is refused by the ACL: any other outcome, or another error, fails."""
    with pytest.raises(redis.exceptions.ResponseError) as caught:
        fn(*args)
    text = str(caught.value)
    assert any(w in text.lower() for w in REFUSALS), text
    return text


def _acl_log(admin: redis.Redis) -> set[tuple[str, str, str]]:
    entries = admin.execute_command("ACL", "LOG")
    out = set()
    for e in entries:
        d = e if isinstance(e, dict) else dict(zip(e[::2], e[1::2]))
        # Redis 6.2 logs `config` where 7 logs `config|get`; redis-py's CLIENT SETINFO on
        # connect is refused and ignored on servers that do not know it (see the README)
        if d["object"].split("|")[0] != "client":
            out.add((d["username"], d["reason"], d["object"].split("|")[0]))
    return out


@pytest.mark.parametrize("mode", ["turns", "time"])
def test_a_worker_and_a_producer_run_under_least_privilege_acl_users(tmp_path: Path,
                                                                     mode: str) -> None:
    q = f"acl-{uuid.uuid4().hex[:8]}"
    with LocalRedis(extra=("--maxmemory-policy", "allkeys-lru")) as server:
        admin = server.client()
        Queue(server.client(), q).set_fairness(mode)
        # The module's commands are granted when the server loads it (test servers do,
        # when it is built), as the README says.
        native = module_path() is not None
        # FCALL and FUNCTION LOAD where the server has them (Redis >= 7.0, Valkey), as the
        # README says: else the first call of each queue object is refused and runs EVALSHA
        fn = int(admin.info("server")["redis_version"].split(".")[0]) >= 7
        admin.execute_command(*acl.setuser(
            PRODUCER, acl.producer_rules(q, native=native, functions=fn), "ppw").split())
        admin.execute_command(*acl.setuser(
            WORKER, acl.worker_rules(q, native=native, functions=fn), "wpw").split())
        admin.execute_command("ACL", "LOG", "RESET")
        purl = f"redis://{PRODUCER}:ppw@127.0.0.1:{server.port}/0"
        wurl = f"redis://{WORKER}:wpw@127.0.0.1:{server.port}/0"
        producer = App(redis_url=purl, queue=q)
        try:
            # A job whose worker died holding it (claimed as the worker user, never settled):
            # the next worker's reap brings it back once its 0.6 s lease runs out
            orphan = producer.send_task(st.sleep, (0.0,))
            worker_client = connect(wurl)
            assert [x.id for x in Queue(worker_client, q).claim()] == [orphan.id]
            time.sleep(0.7)
            with _start(wurl, q, "--grace", "0.3") as w:
                # enqueue -> claim -> ack -> get (BLPOP on the done key)
                assert producer.send_task(st.add, (2, 3)).get(timeout=15) == 5
                # a countdown: delayed, then promoted
                assert producer.send_task(st.add, (1, 1), countdown=0.3).get(timeout=15) == 2
                # a failure: retry, promote, dead
                failing = producer.send_task(st.fails_loudly, ("x",))
                with pytest.raises(TaskFailed):
                    failing.get(timeout=15)
                assert failing.info()["attempts"] == 2
                # a job longer than its lease: renewed (extend) by the master, run once
                long = producer.send_task(st.sleep, (1.5,))
                assert long.get(timeout=15) == 1.5 and long.info()["attempts"] == 1
                # the orphan was reaped (never seen running: its attempt given back) and run
                assert orphan.get(timeout=15) == 0.0 and orphan.info()["attempts"] == 1
                # every connection but the admin's is one of the two users
                users = {c["user"] for c in admin.client_list()} - {"default"}
                assert users <= {PRODUCER, WORKER} and WORKER in users
                # a warm stop mid-job releases it back to its lane
                cut = producer.send_task(st.sleep, (5.0,))
                w.wait_for(lambda: cut.status() == "active", what="the long job running")
                w.signal(signal.SIGTERM)
                assert w.proc.wait(20) == 0
                out = w.output()
            assert cut.status() == "pending" and cut.info()["attempts"] == 0
            # The eviction check could not use CONFIG GET, read INFO instead, and warned
            assert "maxmemory-policy is 'allkeys-lru'" in out
            assert "Traceback" not in out and "NOPERM" not in out
            # Nothing either user did was refused, but the worker's CONFIG GET
            assert _acl_log(admin) == {(WORKER, "command", "config")}

            # What the users may not do
            pc = connect(purl)
            _denied(pc.flushall)
            _denied(pc.config_get, "maxmemory-policy")
            _denied(pc.keys, "*")
            _denied(pc.hget, "emq:{other}:job:1", "state")       # another queue's keys
            _denied(pc.set, f"emq:{{{q}}}:paused", "1")           # a command it needs not
            _denied(pc.eval, "return redis.call('HGET', 'secret', 'x')", 0)
            _denied(Queue(pc, "other").enqueue_many,
                    [NewJob("j", "sec.add", '{"v":1,"a":[1,2],"k":{}}', "g", 3, 1000, 10, 60)])
            _denied(Queue(pc, q).claim)                           # producers do not claim
            _denied(worker_client.flushall)
            _denied(worker_client.hgetall, "emq:{other}:job:1")
            _denied(Queue(worker_client, "other").claim)
            _denied(worker_client.script_flush)
            pc.close()
            worker_client.close()
        finally:
            producer.close()


def test_the_readme_acl_lines_are_the_ones_the_module_makes() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = {ln.strip() for ln in readme.splitlines() if ln.strip().startswith("ACL SETUSER")}
    if not lines:
        pytest.skip("README has no ACL section yet")
    variants = [{"native": False}, {"native": True}, {"functions": True}]
    assert lines == {acl.setuser(PRODUCER, acl.producer_rules("default", **v))
                     for v in variants} | {
        acl.setuser(WORKER, acl.worker_rules("default", **v)) for v in variants}

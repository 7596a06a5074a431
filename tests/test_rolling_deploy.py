"""A rolling deploy: workers of the previous release and of this one share a queue.

What both must agree on (issue 25, "Must not change"): key names, row fields, reply shapes,
``EMQ.*`` names and arities, script ARGV contracts. The previous release is checked out of
git (``git archive``) into a tmp folder and runs in subprocesses whose PYTHONPATH (and cwd:
``python -m`` puts the cwd first) is that folder; this release runs in-process. The same
driver (tests/support/rolling.py, tasks in tests/tasks/rolling_tasks.py) serves both.

Paths (``PATHS``): both on the Lua scripts (a server without the module); both on the
module (the server loads this release's module: the previous release's Python wire sends
its ``EMQ.*`` commands to it, as it would during a deploy that upgraded the servers first);
and the previous release's Lua scripts beside this release's module on one queue. The
previous release's own module is not built for those (a C build per run): this release's
code against the previous module (a deploy that upgrades workers before servers) is covered
for the one argument added since, retry's span link (the last test builds that module).
"""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import assert_invariants, new_job
from rolling import MISSED, Side
from rolling_tasks import go_key, held_key

from emqtasks._dev.localserver import LocalRedis
from emqtasks.native import build, module_path
from emqtasks.ops.check import check
from emqtasks.producer.abort import abort as abort_job
from emqtasks.store.queue import Queue
from emqtasks.testing import WorkerProcess
from emqtasks.verdicts import (
    AbortedVerdict,
    AbortVerdict,
    AckVerdict,
    ExtendVerdict,
    ReleaseVerdict,
    RetryVerdict,
)

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tests" / "tasks"
DRIVER = ROOT / "tests" / "support" / "rolling.py"

#: The previous release: the parent of 4fec0f0 ("store: move keys, scripts, queue ... into
#: emqtasks/store"), the last commit before issue 25's store package work began.
PREVIOUS_RELEASE = "1e0289920aae62e8ceb55bddb11affd3680e8eda"

#: path name -> (the server loads this release's module, EMQ_NATIVE of the previous
#: release's code, EMQ_NATIVE of this release's code)
PATHS = {
    "lua": (False, "off", "off"),
    "native": (True, "require", "require"),
    "old-lua-new-c": (True, "off", "require"),
}

pytestmark = pytest.mark.timeout(60)


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no git here: the previous release cannot be checked out")


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's emqtasks/ and lua/ (pure Python and Lua; no module built)."""
    if _git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip("not a git checkout: the previous release cannot be checked out")
    if _git("cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE[:12]} (the previous release) is not in this "
                    "clone (a shallow clone?)")
    archive = _git("archive", "--format=tar", PREVIOUS_RELEASE, "emqtasks", "lua")
    assert archive.returncode == 0, archive.stderr.decode()
    dest = tmp_path_factory.mktemp("previous-release")
    # the "data" filter where this Python has it (3.10.12+, 3.11.4+): plain files only
    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, **safe)
    return dest


@pytest.fixture(params=list(PATHS))
def path(request: pytest.FixtureRequest) -> str:
    if PATHS[request.param][0] and module_path() is None:
        pytest.skip("the native module is not built (python -m emqtasks.native.build)")
    name: str = request.param
    return name


@pytest.fixture
def server(path: str) -> Iterator[LocalRedis]:
    with LocalRedis(module=PATHS[path][0]) as srv:
        yield srv


def old_env(old_tree: Path, native: str, **more: str) -> dict[str, str]:
    env = dict(os.environ, EMQ_NATIVE=native, **more)
    env["PYTHONPATH"] = os.pathsep.join([str(old_tree), str(TASKS)])
    return env


class OldSide:
    """tests/support/rolling.py's Side in a subprocess running the previous release."""

    def __init__(self, old_tree: Path, url: str, queue: str, native: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), url, queue, "old"], cwd=old_tree,
            env=old_env(old_tree, native), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        try:
            where = self.call("where")
        except BaseException:
            self.close()
            raise
        assert where.startswith(str(old_tree)), f"the old side imported emqtasks from {where}"

    def call(self, op: str, *args: Any, timeout: float = 15.0) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the previous release did not answer {op} within {timeout}s"
        line = self.proc.stdout.readline()
        assert line, f"the previous release exited ({self.proc.wait(5)}) during {op}"
        answer = json.loads(line)
        assert "error" not in answer, f"the previous release failed {op}:\n{answer['error']}"
        return answer["ok"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def sides(old_tree: Path, server: LocalRedis, path: str, queue_name: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[OldSide, Side]]:
    _, old_native, new_native = PATHS[path]
    monkeypatch.setenv("EMQ_NATIVE", new_native)
    old = OldSide(old_tree, server.url, queue_name, old_native)
    new = Side(server.url, queue_name, "new")
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def _plain(value: Any) -> Any:
    """As it comes back from the subprocess: JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def assert_drained(expect: dict[str, Any], report: dict[str, Any], old: OldSide,
                   new: Side) -> None:
    """Everything the producer wrote ended once, as both releases read it."""
    assert report["reaped"] == [1, 0]                 # the lost lease went back to its lane
    assert report["late_ack"] == AckVerdict.STALE     # and its holder's ack was refused
    slots = [int(s.rsplit(":", 1)[1]) for s in report["slots"]]
    if expect["schedule"]:
        assert len(slots) >= MISSED and slots == list(range(slots[0], slots[0] + len(slots)))
    ids = [*expect["results"], *expect["dead"], *expect["steps"], *report["slots"]]
    verdicts: dict[str, list[str]] = {}
    for job_id, verdict in report["outcomes"]:
        verdicts.setdefault(job_id, []).append(verdict)
    for job_id in ids:
        want = (["retry", "done"] if job_id == expect["flaky"] else
                ["dead"] if job_id in expect["dead"] else ["done"])
        assert verdicts.get(job_id) == want, job_id
    assert set(verdicts) == set(ids)

    jobs = {**{i: ["done", json.dumps(r)] for i, r in expect["results"].items()},
            **{s: ["done", "10"] for s in report["slots"]}}
    view = _plain(new.view(ids, list(expect["workflows"])))
    for job_id, want in jobs.items():
        assert view["jobs"][job_id][:2] == want, job_id
    # a row keeps its last error: why its lease came back, why it was retried
    assert "expired" in view["jobs"][report["lost"]][2]
    assert "first run" in view["jobs"][expect["flaky"]][2]
    for job_id in expect["dead"]:
        assert view["jobs"][job_id][0] == "dead" and "boom" in view["jobs"][job_id][2]
    assert all(view["jobs"][s][0] == "done" for s in expect["steps"])
    assert view["workflows"] == {w: ["done", r] for w, r in expect["workflows"].items()}
    assert view["totals"] == {"pending": 0, "active": 0, "delayed": 0, "dead": 1,
                              "stale_acks": 1}
    assert view["runs"] == {i: "2" if i == expect["flaky"] else "1" for i in ids}
    # the previous release reads the same rows, results and workflows
    assert old.call("view", ids, list(expect["workflows"])) == view
    assert check(new.q).ok, check(new.q).violations
    assert_invariants(new.q)


@pytest.mark.parametrize("path", ["lua", "native"], indirect=True)
def test_previous_release_produces_this_release_drains(
        sides: tuple[OldSide, Side], path: str) -> None:
    old, new = sides
    expect = old.call("produce", True)
    assert old.call("native") is (path == "native")
    report = _plain(new.drain(expect))
    assert new.native() is (path == "native")
    assert_drained(expect, report, old, new)


@pytest.mark.parametrize("path", ["lua", "native"], indirect=True)
def test_this_release_produces_previous_release_drains(
        sides: tuple[OldSide, Side], path: str) -> None:
    old, new = sides
    expect = _plain(new.produce(True))
    assert new.native() is (path == "native")
    report = old.call("drain", expect)
    assert old.call("native") is (path == "native")
    assert_drained(expect, report, old, new)


def test_leases_change_hands_between_releases(sides: tuple[OldSide, Side]) -> None:
    """Leases claimed by one release are renewed, acked, retried, released and reaped by the
    other; the fence (attempts, nonce) and its counter agree, and a late holder is refused."""
    old, new = sides
    stale = 0

    def row(job_id: str) -> dict[str, Any]:
        found = new.q.job(job_id)
        assert found is not None
        return found

    # claimed by the previous release; renewed and acked by this one
    [job] = old.call("enqueue", 1, "gm")
    [lease] = old.call("claim", 1)
    assert (lease[0], lease[3], lease[8]) == (job, 1, 1)
    assert new.extend([lease]) == [ExtendVerdict.EXTENDED]
    assert new.ack(lease, '"by new"') == AckVerdict.DONE
    # the same token's ack again (to the server, the holder whose reply was lost sending it
    # again): this release's verb (the module loaded is this release's) answers it done, the
    # previous release's script stale; either way nothing of it is written
    late = old.call("ack", lease, '"late"')
    assert late == (AckVerdict.DONE if old.call("native") else AckVerdict.STALE)
    stale += late == AckVerdict.STALE
    assert (row(job)["result"], row(job)["attempts"]) == ('"by new"', 1)

    # claimed by the previous release, retried by this one; the old holder's ack is late;
    # the next claim (previous release) carries attempt 2 and fence 2
    [job] = new.enqueue(1, "gm")
    [lease] = old.call("claim", 1)
    assert new.retry(lease, "failed in new", delay=0) == RetryVerdict.RETRIED
    assert old.call("ack", lease) == AckVerdict.STALE
    stale += 1
    assert old.call("promote") == 1
    [again] = old.call("claim", 1)
    assert (again[0], again[3], again[8]) == (job, 2, 2)
    assert new.ack(again, "2") == AckVerdict.DONE

    # claimed by this release, renewed and retried by the previous one, claimed again here
    [job] = old.call("enqueue", 1, "gm")
    [lease] = new.claim(1)
    assert old.call("extend", [lease]) == [ExtendVerdict.EXTENDED]
    assert old.call("retry", lease, "failed in old", 0) == RetryVerdict.RETRIED
    assert new.ack(lease) == AckVerdict.STALE
    stale += 1
    assert new.promote() == 1
    [again] = new.claim(1)
    assert (again[0], again[3], again[8]) == (job, 2, 2)
    assert old.call("ack", again, "3") == AckVerdict.DONE

    # released back and forth: the attempt rolls back, the fence counter does not
    [job] = new.enqueue(1, "gm")
    [lease] = old.call("claim", 1)
    assert new.release(lease) == ReleaseVerdict.RELEASED
    [lease] = new.claim(1)
    assert (lease[0], lease[3], lease[8]) == (job, 1, 2)
    assert old.call("release", lease) == ReleaseVerdict.RELEASED
    [lease] = old.call("claim", 1)
    assert (lease[0], lease[3], lease[8]) == (job, 1, 3)
    assert new.ack(lease, "4") == AckVerdict.DONE

    # a lease of this release expires and the previous release's reap takes it back
    [job] = old.call("enqueue", 1, "gm")
    [lease] = new.claim(1)
    assert new.extend([lease]) == [ExtendVerdict.EXTENDED]   # it ran: the reap spends it
    new.q.client.zadd(new.q.keys.active, {job: 0}, xx=True)
    assert old.call("reap") == [1, 0]
    assert new.ack(lease) == AckVerdict.STALE
    stale += 1
    [again] = old.call("claim", 1)
    assert (again[0], again[3], again[8]) == (job, 2, 2)
    assert new.ack(again, "5") == AckVerdict.DONE

    stats = new.app.stats()
    assert (stats["pending"], stats["active"], stats["delayed"], stats["dead"]) == (0,) * 4
    assert stats["stale_acks"] == stale
    assert check(new.q).ok, check(new.q).violations
    assert_invariants(new.q)


@pytest.mark.parametrize("path", ["lua", "old-lua-new-c"], indirect=True)
def test_workers_of_both_releases_drain_one_queue(
        old_tree: Path, server: LocalRedis, sides: tuple[OldSide, Side], path: str,
        queue_name: str, tmp_path: Path) -> None:
    """A real ``emqtasks worker`` of each release on one queue (one child each): a job
    that holds its child until both have started shows both serve it; then both drain what
    both releases produced."""
    old, new = sides
    _, old_native, new_native = PATHS[path]
    common = dict(redis_url=server.url, queue=queue_name, concurrency=1, tick=0.2)
    here = os.getcwd()
    os.chdir(old_tree)   # `python -m` imports from the cwd first
    try:
        old_worker = WorkerProcess(["rolling_worker"], **common, log_path=tmp_path / "old.log",
                                   env=old_env(old_tree, old_native, RD_SIDE="old"))
    finally:
        os.chdir(here)
    new_worker = WorkerProcess(["rolling_worker"], **common, path=str(TASKS),
                               log_path=tmp_path / "new.log",
                               env=dict(os.environ, EMQ_NATIVE=new_native, RD_SIDE="new"))
    with old_worker, new_worker:
        old_worker.wait_ready()
        new_worker.wait_ready()
        client = new.q.client
        holds = [new.tasks["hold"].delay().id for _ in range(2)]
        held = [client.blpop([held_key(queue_name)], 10) for _ in holds]
        assert sorted(h[1] for h in held if h) == ["new", "old"], (
            old_worker.output(), new_worker.output())
        client.rpush(go_key(queue_name), "go", "go")
        expect = [old.call("produce", False), _plain(new.produce(False))]
        deadline = time.monotonic() + 15
        for e in expect:
            for job_id in [*e["results"], *e["dead"], *e["steps"]]:
                assert new.q.wait_outcome(job_id, deadline).ended, job_id
        assert old_worker.stop() == 0, old_worker.output()
        assert new_worker.stop() == 0, new_worker.output()

    runs = client.hgetall(f"rd:{queue_name}:runs")
    for e in expect:
        for job_id, result in e["results"].items():
            assert new.q.outcome(job_id)[:2] == ("done", json.dumps(result))
            assert runs[job_id] == ("2" if job_id == e["flaky"] else "1")
        assert all(new.q.status(i) == "dead" and runs[i] == "1" for i in e["dead"])
        assert all(new.q.status(i) == "done" and runs[i] == "1" for i in e["steps"])
        for wf, result in e["workflows"].items():
            assert new.app.workflow(wf).get(timeout=2) == result
    assert all(new.q.status(h) == "done" for h in holds)
    stats = new.app.stats()
    assert (stats["pending"], stats["active"], stats["delayed"], stats["dead"]) == (0, 0, 0, 2)
    assert check(new.q).ok, check(new.q).violations


def test_a_traced_retry_against_the_previous_releases_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers upgraded before the servers: the previous release's module takes retry's six
    arguments, and refuses the seventh (the failed attempt's span, tlink) before it writes
    anything; this release writes the failure without it. The same for ack's sixth (the
    run's span, tparent on the steps it releases)."""
    cc = build.compiler()
    if cc is None:
        pytest.skip("no C compiler: the previous release's module cannot be built")
    if _git("rev-parse", "--is-inside-work-tree").returncode != 0 or \
            _git("cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}").returncode != 0:
        pytest.skip("the previous release is not in this checkout")
    archive = _git("archive", "--format=tar", PREVIOUS_RELEASE, "emqtasks/native")
    assert archive.returncode == 0, archive.stderr.decode()
    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, **safe)
    old = tmp_path / "emq-previous.so"
    made = subprocess.run([*cc, *build.CFLAGS, "-shared", "-o", str(old),
                           str(tmp_path / "emqtasks" / "native" / "emq.c"), "-lm"],
                          capture_output=True, text=True, timeout=240)
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("EMQ_NATIVE", "require")   # the module's verbs, not the scripts
    with LocalRedis(module=False, extra=("--loadmodule", str(old))) as srv:
        client = srv.client()
        q = Queue(client, "oldmod")
        assert q.enqueue_many([new_job("j1")])
        lease = q.claim()[0]
        span = f"00-{'ab' * 16}-{'cd' * 8}-01"
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            client.execute_command("EMQ.RETRY", *q.keys.fixed, lease.id, lease.attempts,
                                   lease.nonce, "boom", "0", "0", span)
        assert q.retry(lease, "boom", delay=0, link=span) == RetryVerdict.RETRIED
        assert client.hget(q.keys.job("j1"), "error") == "boom"
        assert q.retry_link("j1") is None
        assert calls_of(client, "emq.retry") == 3   # mine, refused, then without the link
        # the ack's sixth (the run's span, kept on the workflow steps it releases): refused
        # before anything is written, then made without it
        assert q.enqueue_many([new_job("j2")])
        lease = q.claim()[0]
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            client.execute_command("EMQ.ACK", *q.keys.fixed, lease.id, lease.attempts,
                                   lease.nonce, "1", "", span)
        assert q.status("j2") == "active"
        assert q.ack(lease, "1", span=span).verdict == AckVerdict.DONE
        assert q.outcome("j2")[:2] == ("done", "1")
        assert calls_of(client, "emq.ack") == 3     # mine, refused, then without the span
        # An abort through this release (EMQ_NATIVE=auto): that module has no EMQ.ABORT, so
        # abort alone goes to its script; the other verbs stay on the module
        monkeypatch.setenv("EMQ_NATIVE", "auto")
        q2 = Queue(client, "oldabort")
        assert q2.enqueue_many([new_job("a1")])
        lease = q2.claim()[0]
        assert abort_job(q2, "a1") == AbortVerdict.ABORTING
        assert q2.abort_end(lease, "Aborted: by request") == AbortedVerdict.ABORTED
        assert q2.status("a1") == "aborted"
        assert q2.hot.serves["claim"] is True and q2.hot.serves["abort"] is False
        client.close()


def calls_of(client: Any, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))

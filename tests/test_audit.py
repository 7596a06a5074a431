"""The dashboard's actions (run a delayed job now, enqueue a task by name), its roles
(operator, viewer) and the audit log of every change, from the dashboard and the admin CLI:
a real dashboard server over HTTP, real `emqtasks` processes, a real Redis."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dashsrv import DashServer
from helpers import make_task, server_ms

from emqtasks import App
from emqtasks.dashboard import roles
from emqtasks.errors import ConfigError
from emqtasks.observe.lanes import lane as lane_view
from emqtasks.schedules.schedule import ScheduleStore
from emqtasks.store import audit
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(120)
TOKENS = "alice:operator:op-secret-1,bots:viewer:view-secret-2"
ALICE = {"Authorization": "Bearer op-secret-1"}
BOTS = {"Authorization": "Bearer view-secret-2"}


@pytest.fixture
def cli(redis_url: str, queue_name: str):  # type: ignore[no-untyped-def]
    """`emqtasks VERB ARGS... --redis-url URL -Q QUEUE`, run in this process (click's
    runner: the command's own code, without a Python start per command); its exit code
    and output."""
    from click.testing import CliRunner

    from emqtasks.cli import main

    def run(*args: str) -> Any:
        return CliRunner().invoke(main, [*args, "--redis-url", redis_url, "-Q", queue_name])

    return run


def _ok(result: Any) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return str(result.output).strip()


def _log(queue: Queue) -> list[tuple[str, str, str, str, int | None]]:
    """The audit entries, oldest first: (who, via, action, target, jobs)."""
    return [(e.who, e.via, e.action, e.target, e.jobs) for e in reversed(queue.audit_log(1000))]


def _jobs(queue: Queue) -> list[str]:
    return sorted(k for k in queue.scan(queue.keys.job("*")))


def _dead(app: App, queue: Queue, n: int) -> list[str]:
    t = make_task(app, name="t.dead", group="g", max_attempts=1)
    ids = [t.delay(i).id for i in range(n)]
    for _ in ids:
        (lease,) = queue.claim()
        queue.retry(lease, "boom", 0, True)
    return ids


# -- the store: when, who, bounded ---------------------------------------------------------

def test_an_entry_says_when_who_what_and_how_many_newest_first(queue: Queue) -> None:
    before = server_ms(queue)
    queue.audit("alice", "dashboard", "pause", "group acme")
    queue.audit("bob@host", "cli", "requeue", "all dead jobs", 7)
    newest, oldest = queue.audit_log()
    assert (newest.who, newest.via, newest.action, newest.target, newest.jobs) == \
        ("bob@host", "cli", "requeue", "all dead jobs", 7)
    assert (oldest.action, oldest.jobs) == ("pause", None)
    assert before <= oldest.when <= newest.when <= server_ms(queue)
    assert [e.id for e in queue.audit_log(1, before=newest.id)] == [oldest.id]


def test_the_log_is_capped_in_size(queue: Queue) -> None:
    for i in range(30):
        audit.record(queue.client, queue.keys, "alice", "cli", "limit", f"group g{i}",
                     max_entries=10)
    entries = queue.audit_log(100)
    assert len(entries) == 10 and entries[0].target == "group g29" \
        and entries[-1].target == "group g20"
    assert audit.AUDIT_MAX == 10_000   # the default bound every write applies


def test_entries_older_than_30_days_are_dropped_by_the_next_write(queue: Queue) -> None:
    old = server_ms(queue) - (audit.AUDIT_DAYS * 86_400_000 + 60_000)
    recent = server_ms(queue) - (audit.AUDIT_DAYS - 1) * 86_400_000
    queue.client.xadd(queue.keys.audit, {"who": "x", "action": "pause"}, id=f"{old}-0")
    queue.client.xadd(queue.keys.audit, {"who": "y", "action": "pause"}, id=f"{recent}-0")
    queue.audit("alice", "cli", "resume", "queue")
    assert [e.who for e in queue.audit_log()] == ["alice", "y"]


def test_a_purge_keeps_the_audit_log_and_is_in_it(app: App, queue: Queue, cli) -> None:
    make_task(app, group="acme").delay(1)
    _ok(cli("pause"))
    _ok(cli("purge", "--yes"))
    assert list(queue.scan(queue.keys.all_pattern)) == [queue.keys.audit]
    assert [e[2] for e in _log(queue)] == ["pause", "purge"]


# -- the CLI -------------------------------------------------------------------------------

def test_every_admin_command_records_who_what_and_how_many(app: App, queue: Queue,
                                                           cli) -> None:
    dead = _dead(app, queue, 3)
    waiting = make_task(app, name="t.wait", group="acme").apply_async(countdown=600)
    _ok(cli("pause", "--group", "acme"))
    _ok(cli("resume", "--group", "acme"))
    _ok(cli("limit", "acme", "3"))
    _ok(cli("weight", "acme", "2"))
    _ok(cli("rate", "acme", "5/1"))
    _ok(cli("maxsize", "acme", "100"))
    _ok(cli("defaults", "--limit", "4"))
    _ok(cli("fairness", "time"))
    _ok(cli("requeue", dead[0]))
    _ok(cli("cancel", waiting.id))
    _ok(cli("requeue", "--all"))
    # a command that changes nothing records nothing
    assert cli("cancel", "no-such-job").exit_code == 1
    assert _ok(cli("defaults")).startswith("limit")
    who = audit.cli_user()
    assert _log(queue) == [
        (who, "cli", "pause", "group acme", None),
        (who, "cli", "resume", "group acme", None),
        (who, "cli", "limit", "group acme: 3", None),
        (who, "cli", "weight", "group acme: 2", None),
        (who, "cli", "rate", "group acme: 5/1s", None),
        (who, "cli", "maxsize", "group acme: 100", None),
        (who, "cli", "defaults", "limit: 4", None),
        (who, "cli", "fairness", "time", None),
        (who, "cli", "requeue", dead[0], 1),
        (who, "cli", "cancel", waiting.id, 1),
        (who, "cli", "requeue", "all dead jobs", 2),
    ]
    assert "@" in who
    shown = json.loads(_ok(cli("audit", "--json", "-n", "2")))
    assert [(e["action"], e["jobs"]) for e in shown] == [("requeue", 2), ("cancel", 1)]
    text = _ok(cli("audit")).splitlines()
    assert len(text) == 11 and "requeue" in text[0] and "(2 jobs)" in text[0] \
        and who in text[0]


def test_schedule_changes_abort_and_enqueue_are_recorded(app: App, queue: Queue,
                                                         cli) -> None:
    t = make_task(app, name="t.tick")
    ScheduleStore(queue).note_tasks([t.spec])
    _ok(cli("schedule", "add", "nightly", "t.tick", "--cron", "0 3 * * *"))
    run_id = _ok(cli("schedule", "run", "nightly"))
    _ok(cli("schedule", "remove", "nightly"))
    job_id = _ok(cli("enqueue", "t.tick", "--group", "acme"))
    _ok(cli("abort", job_id))
    assert [(a, tgt, n) for _, _, a, tgt, n in _log(queue)] == [
        ("schedule add", "nightly: t.tick cron 0 3 * * * (UTC)", None),
        ("schedule run", f"nightly as {run_id}", 1),
        ("schedule remove", "nightly", None),
        ("enqueue", f"t.tick in group acme as {job_id}", 1),
        ("cancel", job_id, 1),    # not started yet: an abort cancels it
    ]


# -- roles -----------------------------------------------------------------------------------

def test_a_viewer_sees_everything_and_changes_nothing(app: App, queue: Queue) -> None:
    make_task(app, group="acme").delay(1)
    delayed = make_task(app, name="t.later", group="acme").apply_async(countdown=600)
    queue.audit("alice", "cli", "limit", "group acme: 2")
    with DashServer([queue], tokens=TOKENS) as d:
        for path in ("/", "/lanes", "/jobs?state=delayed", "/audit", "/enqueue",
                     f"/job?id={delayed.id}"):
            status, body, _ = d.request(path, headers=BOTS)
            assert status == 200, path
            assert 'method="post"' not in body, path   # no action shown
        assert "group acme: 2" in d.request("/audit", headers=BOTS)[1]
        for path, form in (("/action/pause", {"group": "acme"}),
                           ("/job/run", {"id": delayed.id}),
                           ("/action/enqueue", {"task": "tests.helpers.noop"}),
                           ("/job/abort", {"id": delayed.id})):
            status, body, _ = d.request(path, form, headers=BOTS)
            assert status == 403 and "bots is a viewer" in body, path
        # and by a signed-in session too
        cookie, csrf = _session(d, "view-secret-2")
        status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": csrf},
                                 headers={"Cookie": cookie})
        assert status == 403
    assert not lane_view(queue, "acme")["paused"]
    assert queue.status(delayed.id) == "delayed"
    assert len(_log(queue)) == 1


def _session(d: DashServer, token: str) -> tuple[str, str]:
    form = dict(re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"',
                           d.request("/login")[1]))
    status, _, headers = d.request("/login", {**form, "token": token})
    assert status == 303
    cookie = headers["Set-Cookie"].split(";")[0]
    found = re.search(r'name="csrf" value="([^"]*)"', d.request("/", headers={
        "Cookie": cookie})[1])
    return cookie, found.group(1) if found else ""


def test_an_operator_acts_and_the_log_names_it(app: App, queue: Queue) -> None:
    make_task(app, group="acme").delay(1)
    with DashServer([queue], tokens=TOKENS) as d:
        assert d.request("/action/pause", {"group": "acme"}, headers=ALICE)[0] == 303
        cookie, csrf = _session(d, "op-secret-1")
        assert "alice" in d.request("/", headers={"Cookie": cookie})[1]
        status, _, _ = d.request("/action/limit", {"group": "acme", "value": "3",
                                                   "csrf": csrf}, headers={"Cookie": cookie})
        assert status == 303
        status, body, _ = d.request("/audit", headers={"Cookie": cookie})
        assert status == 200 and body.count('class="who">alice<') == 2
    assert lane_view(queue, "acme")["paused"] and lane_view(queue, "acme")["limit"] == 3
    assert _log(queue) == [("alice", "dashboard", "pause", "group acme", None),
                           ("alice", "dashboard", "limit", "group acme: 3", None)]


def test_one_token_stays_an_operator(app: App, queue: Queue) -> None:
    make_task(app, group="acme").delay(1)
    with DashServer([queue], token="s3cret") as d:
        cookie, csrf = d.sign_in("s3cret")
        status, _, _ = d.request("/action/pause", {"group": "acme", "csrf": csrf},
                                 headers={"Cookie": cookie})
        assert status == 303
    assert _log(queue) == [(roles.SINGLE, "dashboard", "pause", "group acme", None)]


def test_tokens_come_from_a_file_and_bad_entries_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("# the dashboard's people\nalice:operator:t1\nbots:viewer:t:2  # a bot\n")
    assert roles.parse(f"@{f}") == [roles.Account("alice", "operator", "t1"),
                                    roles.Account("bots", "viewer", "t:2")]
    for bad, words in (("alice:admin:t1", "operator or viewer"), ("alice:viewer:", "no token"),
                       ("al ice:viewer:t", "a name is"), ("a:viewer:t,a:operator:u", "same name"),
                       ("a:viewer:t,b:operator:t", "same token"),
                       (f"@{tmp_path / 'nope'}", "cannot read")):
        with pytest.raises(ConfigError, match=words):
            roles.parse(bad)


def test_the_dashboard_command_refuses_bad_tokens_in_one_line(redis_url: str) -> None:
    r = subprocess.run([sys.executable, "-m", "emqtasks.cli", "dashboard", "--redis-url",
                        redis_url, "--port", "0"], capture_output=True, text=True, timeout=30,
                       env={**_env(), "EMQ_DASHBOARD_TOKENS": "alice:boss:t1"})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "emqtasks: error: dashboard token entry 1 ('alice'): the role is operator or viewer, "
        "not 'boss'"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("EMQ_DASHBOARD")}


# -- run a delayed job now -------------------------------------------------------------------

def test_run_now_moves_a_delayed_job_to_its_lane(app: App, queue: Queue) -> None:
    later = make_task(app, name="t.later", group="acme").apply_async(args=(1,), countdown=600)
    other = make_task(app, name="t.later", group="acme").apply_async(args=(2,), countdown=600)
    with DashServer([queue], tokens=TOKENS) as d:
        status, body, _ = d.request(f"/job?id={later.id}", headers=ALICE)
        assert 'id="run-now"' in body
        status, _, headers = d.request("/job/run", {"id": later.id}, headers=ALICE)
        assert status == 303 and headers["Location"].endswith("done=run")
        assert queue.status(later.id) == "pending"
        (lease,) = queue.claim()
        assert lease.id == later.id
        # a job that is not delayed: refused, nothing written
        status, body, _ = d.request("/job/run", {"id": later.id}, headers=ALICE)
        assert status == 409 and "not delayed" in body
        assert d.request("/job/run", {"id": "no such id!"}, headers=ALICE)[0] == 400
    assert queue.status(other.id) == "delayed"
    assert _log(queue) == [("alice", "dashboard", "run now", later.id, 1)]


def test_a_job_run_now_is_run_by_a_live_worker(app: App, queue: Queue) -> None:
    import worker_tasks as wt
    from workerproc import WorkerProc

    h = app.send_task(wt.record, ("now:1",), countdown=3600)
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1) as w:
        w.wait_ready()
        assert queue.status(h.id) == "delayed"
        with DashServer([queue], tokens=TOKENS) as d:
            assert d.request("/job/run", {"id": h.id}, headers=ALICE)[0] == 303
        # the parked master is woken by the move (no tick to wait for): well within 10 s
        assert h.get(timeout=10) == "now:1"
        assert w.stop() == 0


# -- enqueue by name ---------------------------------------------------------------------------

def test_enqueue_a_task_by_name_with_arguments_group_and_countdown(app: App,
                                                                   queue: Queue) -> None:
    t = make_task(app, name="t.report", max_attempts=7)
    ScheduleStore(queue).note_tasks([t.spec])
    with DashServer([queue], tokens=TOKENS) as d:
        assert "t.report" in d.request("/enqueue", headers=ALICE)[1]
        status, _, headers = d.request("/action/enqueue", {
            "task": "t.report", "args": '[1, "x"]', "kwargs": '{"k": true}',
            "group": "acme", "countdown": "30"}, headers=ALICE)
        assert status == 303
        job_id = headers["Location"].split("id=")[1]
        status, _, headers = d.request("/action/enqueue", {"task": "t.report"}, headers=ALICE)
        now_id = headers["Location"].split("id=")[1]
    job = queue.job(job_id)
    assert job is not None
    assert (job["state"], job["task"], job["group"], job["max_attempts"]) == \
        ("delayed", "t.report", "acme", 7)
    payload = json.loads(queue.client.hget(queue.keys.job(job_id), "payload"))
    assert (payload["a"], payload["k"]) == ([1, "x"], {"k": True})
    assert queue.status(now_id) == "pending"
    assert _log(queue) == [
        ("alice", "dashboard", "enqueue", f"t.report in group acme as {job_id}", 1),
        ("alice", "dashboard", "enqueue", f"t.report in group default as {now_id}", 1)]


@pytest.mark.parametrize(("form", "words"), [
    ({"task": "t.nope"}, "unknown task"),
    ({"task": ""}, "task name"),
    ({"task": "t.report", "args": "[1,"}, "not valid JSON"),
    ({"task": "t.report", "args": '{"a": 1}'}, "must be a JSON array"),
    ({"task": "t.report", "kwargs": "[]"}, "must be a JSON object"),
    ({"task": "t.report", "countdown": "-5"}, "countdown"),
    ({"task": "t.report", "countdown": "nan"}, "countdown"),
    ({"task": "t.report", "countdown": "soon"}, "countdown"),
    ({"task": "t.report", "group": "x" * 300}, "group"),
])
def test_bad_input_is_refused_with_the_reason_and_nothing_written(
        app: App, queue: Queue, form: dict[str, Any], words: str) -> None:
    ScheduleStore(queue).note_tasks([make_task(app, name="t.report").spec])
    with DashServer([queue], tokens=TOKENS) as d:
        status, body, _ = d.request("/action/enqueue", form, headers=ALICE)
    assert status == 400 and words in body, body
    assert _jobs(queue) == [] and _log(queue) == []


def test_a_log_key_of_the_wrong_type_is_named_not_a_raw_error(app: App, queue: Queue,
                                                              cli) -> None:
    from emqtasks.errors import CorruptKey
    from emqtasks.ops.check import check

    queue.client.set(queue.keys.audit, "spoilt")
    with pytest.raises(CorruptKey, match="holds a string, not a stream"):
        queue.audit_log()
    r = cli("pause")   # the change is made; that it could not be recorded is said, exit 1
    assert r.exit_code == 1 and "pause done, but not recorded" in r.output \
        and "holds a string, not a stream" in r.output
    assert queue.client.exists(queue.keys.paused)
    assert any("audit" in v for v in check(queue).violations)


def test_the_audit_page_pages_and_escapes(queue: Queue) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    queue.audit(hostile, "cli", "pause", f"group {hostile}")
    for i in range(59):
        queue.audit("alice", "dashboard", "limit", f"group g{i}: 2")
    with DashServer([queue], tokens=TOKENS) as d:
        status, body, _ = d.request("/audit", headers=BOTS)
        assert status == 200 and body.count('class="who">') == 50
        assert "group g58: 2" in body and "group g9: 2" in body and "group g8: 2" not in body
        older = re.search(r'id="older" href="([^"]+)"', body)
        assert older is not None
        status, body, _ = d.request(older.group(1).replace("&amp;", "&"), headers=BOTS)
        assert status == 200 and body.count('class="who">') == 10 and 'id="older"' not in body
        assert "<img src=x" not in body and "&lt;img src=x" in body
        assert d.request("/audit?before=nope", headers=BOTS)[0] == 400

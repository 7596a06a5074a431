"""The admin verbs of the `emqtasks` command, run as users run them: real processes, real Redis.

Effects are checked in Redis through the `app` fixture; errors are checked for their exit code
and for being exactly one line `emqtasks: error: ...` on stderr.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from helpers import make_task

from emqtasks import App
from emqtasks.cli import main
from emqtasks.serialization import loads_args

pytestmark = pytest.mark.timeout(90)

TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'


@pytest.fixture
def cli(redis_url: str, queue_name: str):  # type: ignore[no-untyped-def]
    """Run `python -m emqtasks.cli VERB ARGS... --redis-url URL -Q QUEUE` as a subprocess."""

    def run(*args: str, queue: str | None = None,
            url: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "emqtasks.cli", *args, "--redis-url", url or redis_url,
               "-Q", queue or queue_name]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)

    return run


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout.strip()


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("emqtasks: error: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def make_dead(app: App, job_id: str, group: str = "acme", error: str = TRACEBACK) -> None:
    app.send_task("t.doomed", (1,), job_id=job_id, group=group)
    q = app.queue()
    lease = q.claim(1)[0]
    assert lease.id == job_id
    q.retry(lease, error, final=True)
    assert app.job(job_id)["state"] == "dead"


# -- pause / resume ----------------------------------------------------------------------

def test_pause_and_resume_the_whole_queue(app: App, cli, queue_name: str) -> None:
    assert ok(cli("pause")) == f"paused queue {queue_name}"
    assert app.stats()["paused"] is True
    assert ok(cli("resume")) == f"resumed queue {queue_name}"
    assert app.stats()["paused"] is False


def test_pause_and_resume_one_group(app: App, cli) -> None:
    app.send_task("t.x", (), group="acme")
    app.send_task("t.x", (), group="globex")
    assert ok(cli("pause", "--group", "acme")) == "paused group acme"
    stats = app.stats()
    assert stats["groups"]["acme"]["paused"] is True
    assert stats["groups"]["globex"]["paused"] is False and stats["paused"] is False
    assert ok(cli("pause", "--group", "acme")) == "group acme was already paused"
    # the parked lane is skipped by claims; the other lane is served
    assert [lease.group for lease in app.queue().claim(5)] == ["globex"]
    assert ok(cli("resume", "--group", "acme")) == "resumed group acme"
    assert app.stats()["groups"]["acme"]["paused"] is False
    assert ok(cli("resume", "--group", "acme")) == "group acme was not paused"
    assert [lease.group for lease in app.queue().claim(5)] == ["acme"]


# -- limit / weight ----------------------------------------------------------------------

def test_limit_sets_and_clears_a_group_limit(app: App, cli) -> None:
    assert ok(cli("limit", "acme", "2")) == "limit of group acme set to 2"
    assert app.stats()["groups"]["acme"]["limit"] == 2
    assert ok(cli("limit", "acme", "none")) == "limit of group acme cleared"
    assert "acme" not in app.stats()["groups"] or app.stats()["groups"]["acme"]["limit"] is None


def test_weight_sets_a_group_weight(app: App, cli) -> None:
    assert ok(cli("weight", "acme", "3")) == "weight of group acme set to 3"
    assert app.stats()["groups"]["acme"]["weight"] == 3


@pytest.mark.parametrize("args, words", [
    (["limit", "acme", "0"], ["limit", "integer >= 1", "'0'"]),
    (["limit", "acme", "abc"], ["limit", "integer >= 1", "'abc'"]),
    (["limit", "acme", "1.5"], ["integer >= 1"]),
    (["limit", "acme", "2_0"], ["integer >= 1"]),
    (["limit", "acme", "-1"], ["limit: No such option", "--help"]),
    (["limit", "acme"], ["limit: Missing argument", "limit --help"]),
    (["weight", "acme", "0"], ["weight", "integer >= 1"]),
    (["weight", "acme", "heavy"], ["weight", "integer >= 1"]),
    (["limit", "", "2"], ["invalid group"]),
])
def test_bad_limits_and_weights_are_one_line_and_exit_2(app: App, cli, args: list[str],
                                                        words: list[str]) -> None:
    one_line_error(cli(*args), 2, *words)
    assert app.stats()["groups"] == {}, "nothing was written"


# -- dead / requeue ----------------------------------------------------------------------

def test_dead_lists_dead_jobs_with_the_last_line_of_the_error(app: App, cli) -> None:
    assert ok(cli("dead")) == "no dead jobs"
    make_dead(app, "d-1", group="acme")
    make_dead(app, "d-2", group="globex", error="RuntimeError: plain")
    lines = ok(cli("dead")).splitlines()
    assert lines[0] == "2 dead jobs"
    assert lines[1].split() == ["id", "task", "group", "attempts", "error"]
    assert lines[2].split()[:4] == ["d-2", "t.doomed", "globex", "1/3"]   # newest first
    assert lines[2].endswith("RuntimeError: plain")
    assert lines[3].split()[:4] == ["d-1", "t.doomed", "acme", "1/3"]
    assert lines[3].endswith("ValueError: boom") and "Traceback" not in lines[3]
    # --limit shows the newest N and says so
    lines = ok(cli("dead", "--limit", "1")).splitlines()
    assert lines[0] == "2 dead jobs (showing the newest 1)" and len(lines) == 3


def test_dead_json_gives_full_rows(app: App, cli) -> None:
    make_dead(app, "d-1")
    rows = json.loads(ok(cli("dead", "--json")))
    assert rows == app.dead_jobs()
    assert rows[0]["id"] == "d-1" and rows[0]["error"] == TRACEBACK
    assert rows[0]["group"] == "acme" and rows[0]["state"] == "dead"


def test_requeue_all_brings_dead_jobs_back(app: App, cli) -> None:
    make_dead(app, "d-1")
    make_dead(app, "d-2", group="globex")
    assert ok(cli("requeue", "--all")) == "requeued 2 jobs"
    stats = app.stats()
    assert stats["dead"] == 0 and stats["pending"] == 2
    assert app.job("d-1")["state"] == "pending" and app.job("d-1")["attempts"] == 0
    assert ok(cli("requeue", "--all")) == "requeued 0 jobs"


def test_requeue_one_job_by_id(app: App, cli) -> None:
    make_dead(app, "d-1")
    make_dead(app, "d-2")
    assert ok(cli("requeue", "d-1")) == "requeued 1 job"
    assert app.job("d-1")["state"] == "pending" and app.job("d-2")["state"] == "dead"


def test_requeue_of_a_job_not_dead_is_exit_1(app: App, cli) -> None:
    app.send_task("t.x", (), job_id="p-1")
    one_line_error(cli("requeue", "p-1"), 1, "p-1", "not dead", "pending")
    one_line_error(cli("requeue", "nope"), 1, "no job nope")
    assert app.job("p-1")["state"] == "pending"


@pytest.mark.parametrize("args", [["requeue"], ["requeue", "d-1", "--all"]])
def test_requeue_takes_exactly_one_of_id_and_all(app: App, cli, args: list[str]) -> None:
    make_dead(app, "d-1")
    one_line_error(cli(*args), 2, "JOB_ID or --all")
    assert app.job("d-1")["state"] == "dead"


# -- cancel ------------------------------------------------------------------------------

def test_cancel_a_pending_job(app: App, cli) -> None:
    app.send_task("t.x", (), job_id="c-1", group="acme")
    assert ok(cli("cancel", "c-1")) == "cancelled job c-1"
    assert app.job("c-1")["state"] == "cancelled"
    assert app.stats()["pending"] == 0
    one_line_error(cli("cancel", "c-1"), 1, "c-1", "finished")


def test_cancel_refusals_are_exit_1(app: App, cli) -> None:
    one_line_error(cli("cancel", "ghost"), 1, "ghost", "missing")
    app.send_task("t.x", (), job_id="a-1")
    app.queue().claim(1)
    one_line_error(cli("cancel", "a-1"), 1, "a-1", "active")
    assert app.job("a-1")["state"] == "active"
    one_line_error(cli("cancel", "bad id!"), 2, "invalid job id")


# -- purge -------------------------------------------------------------------------------

def test_purge_refuses_without_yes(app: App, cli) -> None:
    app.send_task("t.x", (), job_id="k-1")
    one_line_error(cli("purge"), 2, "--yes")
    assert app.job("k-1") is not None


def test_purge_with_yes_removes_every_key(app: App, cli, queue_name: str) -> None:
    app.send_task("t.x", (), job_id="k-1", group="acme")
    app.set_group_limit("acme", 2)
    n = len(list(app.client.scan_iter(match=f"emq:{{{queue_name}}}:*")))
    assert n >= 3
    assert ok(cli("purge", "--yes")) == f"purged queue {queue_name}: {n} keys removed"
    # all but the audit log, which now says who purged it (test_audit.py)
    assert list(app.client.scan_iter(match=f"emq:{{{queue_name}}}:*")) == \
        [app.queue().keys.audit]


# -- enqueue -----------------------------------------------------------------------------

def test_enqueue_by_name_with_group_and_id(app: App, cli) -> None:
    out = ok(cli("enqueue", "reports.build", "--args", '["acme", 42]', "--kwargs",
                 '{"fmt": "pdf"}', "--group", "acme", "--job-id", "r-42"))
    assert out == "r-42"
    view = app.job("r-42")
    assert view["task"] == "reports.build" and view["group"] == "acme"
    assert view["state"] == "pending"
    lease = app.queue().claim(1)[0]
    assert loads_args(lease.payload) == (["acme", 42], {"fmt": "pdf"})
    # the same id again is a duplicate, not an error, and nothing changes
    assert ok(cli("enqueue", "reports.build", "--job-id", "r-42")) == "r-42 duplicate"
    assert app.job("r-42")["state"] == "active"


def test_enqueue_defaults_and_countdown(app: App, cli) -> None:
    job_id = ok(cli("enqueue", "t.x"))
    view = app.job(job_id)
    assert view["group"] == "default" and view["state"] == "pending"
    later = ok(cli("enqueue", "t.x", "--countdown", "60"))
    assert app.job(later)["state"] == "delayed" and app.stats()["delayed"] == 1


@pytest.mark.parametrize("args, words", [
    (["--args", "[1,"], ["--args", "not valid JSON"]),
    (["--args", '{"a": 1}'], ["--args", "JSON array", "dict"]),
    (["--kwargs", "[1]"], ["--kwargs", "JSON object", "list"]),
    (["--kwargs", "nope"], ["--kwargs", "not valid JSON"]),
    (["--job-id", "bad id!"], ["invalid job id"]),
    (["--countdown", "-1"], ["--countdown", "--help"]),
])
def test_bad_enqueues_are_one_line_and_exit_2(app: App, cli, args: list[str],
                                              words: list[str]) -> None:
    one_line_error(cli("enqueue", "t.x", *args), 2, *words)
    assert app.stats()["pending"] == 0 and app.stats()["delayed"] == 0


# -- job ---------------------------------------------------------------------------------

def test_job_shows_one_job(app: App, cli) -> None:
    make_dead(app, "j-1")
    assert json.loads(ok(cli("job", "j-1", "--json"))) == app.job("j-1")
    text = ok(cli("job", "j-1"))
    assert "state:        dead" in text and "group:        acme" in text
    assert "ValueError: boom" in text
    assert re.search(r"^created: +20\d\d-\d\d-\d\dT[0-9:.]+Z$", text, re.M), text
    one_line_error(cli("job", "j-2"), 1, "no job j-2")


# -- shared behaviour --------------------------------------------------------------------

@pytest.mark.parametrize("verb", [["pause"], ["dead"], ["enqueue", "t.x"], ["purge", "--yes"]])
def test_unreachable_redis_is_one_line_and_exit_2(cli, verb: list[str]) -> None:
    one_line_error(cli(*verb, url="redis://127.0.0.1:1/0"), 2,
                   "cannot reach Redis at redis://127.0.0.1:1/0")


def test_bad_queue_name_is_one_line_and_exit_2(cli) -> None:
    one_line_error(cli("limit", "acme", "2", queue="bad name!"), 2, "invalid queue name")


@pytest.mark.parametrize("verb", ["pause", "resume", "limit", "weight", "dead", "requeue",
                                  "cancel", "purge", "enqueue", "job"])
def test_every_admin_command_has_help_with_the_queue_options(verb: str) -> None:
    result = CliRunner().invoke(main, [verb, "--help"])
    assert result.exit_code == 0, result.output
    assert "--redis-url" in result.output and "-Q, --queue" in result.output
    summary = result.output.split("\n\n")[1].strip()
    assert summary and not summary.startswith("Options")


def test_env_vars_select_the_queue(app: App, redis_url: str, queue_name: str) -> None:
    result = CliRunner().invoke(main, ["pause", "--group", "acme"],
                                env={"EMQ_REDIS_URL": redis_url, "EMQ_QUEUE": queue_name})
    assert result.exit_code == 0, result.output
    assert app.stats()["groups"]["acme"]["paused"] is True


def test_stats_watch_redraws_the_lane_table(cli, app) -> None:  # type: ignore[no-untyped-def]
    make_task(app, group=lambda g, *_: g).map([("busy", i) for i in range(5)] + [("calm", 1)])
    out = ok(cli("stats", "--watch", "--watch-count", "2"))
    assert out.count("(Ctrl-C to stop)") == 2    # drawn twice (in place on a terminal)
    assert out.count("busy") == 2 and "this minute:" in out
    assert "6 pending" in out

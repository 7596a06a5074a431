"""`emqtasks worker --log-format json` (or EMQ_LOG_FORMAT=json): one JSON object per line,
a job's lines with the job's fields; a real worker process against a real Redis."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from workerproc import HERE, WorkerProc

from emqtasks import App

pytestmark = pytest.mark.timeout(60)

#: Today's text line: the default, unchanged.
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) emqtasks\[\d+\] ")


def start(app: App, *extra: str) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, *extra, concurrency=1,
                   modules=("log_tasks",))
    w.wait_ready()
    return w


def parsed(output: str) -> list[dict[str, Any]]:
    """Every line of the output as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in output.splitlines()]


def test_every_line_is_json_and_a_jobs_lines_carry_its_fields(app: App) -> None:
    with start(app, "--log-format", "json") as w:
        said = app.send_task("t.log.says", ("hi",), group="acme")
        retried = app.send_task("t.log.second_time", group="globex")
        lost = app.send_task("t.log.dies_first", group="initech")
        assert said.get(timeout=10) == "hi" and retried.get(timeout=10) == 2
        assert lost.get(timeout=10) == 2
        # the success line follows the ack the result waited for
        w.wait_for(lambda: w.output().count('"outcome": "done"') == 3, 10, "done lines")
        assert w.stop() == 0
        lines = parsed(w.output())
    for line in lines:
        assert {"ts", "level", "logger", "pid", "msg"} <= line.keys(), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"]), line
        assert "trace_id" not in line   # no tracing yet: the field is absent, not null
    assert any("tasks registered" in line["msg"] for line in lines)
    queue = app.settings.queue
    # the task's own logging line carries its job
    own = [line for line in lines if line["logger"] == "app.tasks"]
    assert len(own) == 1 and own[0]["msg"] == "saying hi", own
    assert {k: own[0][k] for k in ("job_id", "group", "task", "queue", "attempt")} == {
        "job_id": said.id, "group": "acme", "task": "t.log.says", "queue": queue,
        "attempt": 1}
    assert "outcome" not in own[0]
    # the job's outcome line: every field
    done = [line for line in lines if line.get("job_id") == said.id and "outcome" in line]
    assert len(done) == 1, done
    assert done[0]["level"] == "INFO" and done[0]["logger"] == "emqtasks.child"
    assert done[0]["outcome"] == "done" and done[0]["attempt"] == 1
    assert done[0]["group"] == "acme" and done[0]["task"] == "t.log.says"
    assert done[0]["queue"] == queue
    assert isinstance(done[0]["duration_ms"], float) and done[0]["duration_ms"] >= 0
    # a retried job: attempt 1 retried, attempt 2 done
    runs = [(line["attempt"], line["outcome"], line["level"]) for line in lines
            if line.get("job_id") == retried.id and "outcome" in line]
    assert runs == [(1, "retry", "WARNING"), (2, "done", "INFO")], runs
    assert all(line["group"] == "globex" for line in lines if line.get("job_id") == retried.id)
    # a job whose child died: the master's line carries the job too
    settled = [line for line in lines if line.get("job_id") == lost.id and "outcome" in line]
    assert [(s["logger"], s["attempt"], s["outcome"]) for s in settled] == [
        ("emqtasks.worker", 1, "retry"), ("emqtasks.child", 2, "done")], settled
    assert "WorkerLost" in settled[0]["msg"] and settled[0]["queue"] == queue
    assert settled[0]["duration_ms"] >= 0
    # (its child's slot names the job, not its task and group: left out, not empty)
    assert settled[0].get("group") in (None, "initech"), settled[0]


def test_the_environment_variable_turns_json_on(app: App,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_LOG_FORMAT", "json")
    with start(app) as w:
        assert w.stop() == 0
        lines = parsed(w.output())
    assert lines and any("tasks registered" in line["msg"] for line in lines)


def test_text_stays_the_default(app: App) -> None:
    with start(app) as w:
        retried = app.send_task("t.log.second_time")
        assert retried.get(timeout=10) == 2
        assert w.stop() == 0
        lines = w.output().splitlines()
    assert lines and all(TEXT_LINE.match(line) for line in lines), lines
    failed = [line for line in lines if retried.id in line]
    assert len(failed) == 1 and "failed, retry: ValueError: not the first time" in failed[0]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_bad_log_format_is_one_line_and_exit_2(how: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    args = ["-A", "log_tasks"]
    if how == "option":
        args += ["--log-format", "yaml"]
    else:
        env["EMQ_LOG_FORMAT"] = "yaml"
    result = subprocess.run([sys.executable, "-m", "emqtasks.cli", "worker", *args],
                            capture_output=True, text=True, timeout=20, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("emqtasks: error: "), result.stderr
    assert "'yaml' is not one of 'text', 'json'" in lines[0], lines[0]

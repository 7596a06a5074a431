"""emqtasks.contrib.sentry: the job's tags on every event of a task, a dead job reported once,
retried attempts only when asked. Sentry's client with a transport that keeps the envelopes
in memory (never the network); the jobs run here through the worker's Runner."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
import sentry_tasks as st
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from emqtasks import App, current_job
from emqtasks.contrib.sentry import EmqtasksIntegration, init
from emqtasks.errors import TaskFailed
from emqtasks.testing import WorkerProcess, run_pending

pytestmark = pytest.mark.timeout(60)
TASKS = Path(__file__).resolve().parent / "tasks"


class Recorder(Transport):
    """Keeps every envelope the client sends."""

    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        return [e for e in (env.get_event() for env in self.envelopes) if e is not None]


def _start(**options: Any) -> Recorder:
    recorder = Recorder()
    # No default integrations: they would patch threading and http.client for the rest
    # of this test process
    init(dsn="https://key@sentry.invalid/1", transport=recorder, default_integrations=False,
         auto_enabling_integrations=False, **options)
    return recorder


def _stop() -> None:
    sentry_sdk.get_client().close()
    # no client for whatever runs next (sentry_sdk.init() would patch as said above)
    sentry_sdk.get_global_scope().set_client(None)


@pytest.fixture
def sentry() -> Iterator[Recorder]:
    yield _start()
    _stop()


def _tags(event: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in event.get("tags", {}).items() if k.startswith("emqtasks.")}


def test_a_dead_job_is_one_error_event_with_the_jobs_tags(app: App, sentry: Recorder) -> None:
    @app.task(name="sentry_t.dies", max_attempts=2, retry_delay=0, group=lambda who: who)
    def dies(who: str) -> None:
        raise ValueError(f"no such user {who}")

    h = dies.delay("ann")
    assert [o.verdict for o in run_pending(app.queue())] == ["retry", "dead"]
    [event] = sentry.events()   # the retried attempt made none
    assert _tags(event) == {"emqtasks.task": "sentry_t.dies", "emqtasks.job_id": h.id,
                            "emqtasks.queue": app.settings.queue, "emqtasks.group": "ann",
                            "emqtasks.attempt": "2", "emqtasks.outcome": "dead"}
    assert event["level"] == "error"
    [exc] = event["exception"]["values"]
    assert exc["type"] == "ValueError" and exc["value"] == "no such user ann"
    assert exc["mechanism"] == {"type": "emqtasks", "handled": False}
    assert exc["stacktrace"]["frames"][-1]["function"] == "dies"   # the task's own frame
    assert event["contexts"]["emqtasks"]["job_id"] == h.id
    assert "otel.trace_id" not in event["tags"]   # no tracing: no trace id


def test_with_opentelemetry_on_an_event_carries_the_jobs_trace_id(app: App,
                                                                  sentry: Recorder) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util._once import Once

    @app.task(name="sentry_t.traced", max_attempts=1)
    def traced() -> None:
        sentry_sdk.capture_message("inside")
        raise ValueError("dead")

    provider = TracerProvider()
    trace.set_tracer_provider(provider)
    try:
        with trace.get_tracer("test").start_as_current_span("request") as request:
            h = traced.delay()
        assert [o.verdict for o in run_pending(app.queue())] == ["dead"]
    finally:   # the API sets a provider once per process: the reset its own tests make
        provider.shutdown()
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None
    trace_id = f"{request.get_span_context().trace_id:032x}"
    inside, dead = sentry.events()
    for event in (inside, dead):
        assert event["tags"]["otel.trace_id"] == trace_id
        assert event["contexts"]["emqtasks"]["trace_id"] == trace_id
        assert event["tags"]["emqtasks.job_id"] == h.id
    assert dead["tags"]["emqtasks.outcome"] == "dead"


def test_retried_attempts_are_reported_only_when_asked(app: App) -> None:
    @app.task(name="sentry_t.flaky", max_attempts=3, retry_delay=0)
    def flaky() -> str:
        if current_job().attempts < 3:
            raise ConnectionError("try again")
        return "ok"

    try:
        recorder = _start(report_retries=True)
        h = flaky.delay()
        assert [o.verdict for o in run_pending(app.queue())] == ["retry", "retry", "done"]
        events = recorder.events()
        assert [(e["level"], _tags(e)["emqtasks.attempt"], _tags(e)["emqtasks.outcome"])
                for e in events] == [("warning", "1", "retry"), ("warning", "2", "retry")]
        assert {_tags(e)["emqtasks.job_id"] for e in events} == {h.id}
        assert all(e["exception"]["values"][0]["mechanism"]["handled"] for e in events)
    finally:
        _stop()


def test_a_message_captured_in_a_task_carries_the_jobs_tags(app: App,
                                                            sentry: Recorder) -> None:
    @app.task(name="sentry_t.notes", group=lambda n: f"g{n}")
    def notes(n: int) -> None:
        sentry_sdk.capture_message(f"note {n}")

    @app.task(name="sentry_t.async_notes", group=lambda n: f"g{n}")
    async def async_notes(n: int) -> None:
        sentry_sdk.capture_message(f"note {n}")

    handles = [notes.delay(1), async_notes.delay(2)]   # an async task: the same tags
    assert [o.verdict for o in run_pending(app.queue())] == ["done", "done"]
    sentry_sdk.capture_message("outside")   # no job: no job tags, nothing left from the last
    by_message = {e["message"]: e for e in sentry.events()}
    for n, h, name in zip((1, 2), handles, ("sentry_t.notes", "sentry_t.async_notes")):
        assert _tags(by_message[f"note {n}"]) == {
            "emqtasks.task": name, "emqtasks.job_id": h.id,
            "emqtasks.queue": app.settings.queue, "emqtasks.group": f"g{n}",
            "emqtasks.attempt": "1"}
    assert _tags(by_message["outside"]) == {}


def test_without_the_integration_nothing_is_tagged_or_reported(app: App) -> None:
    @app.task(name="sentry_t.plain", max_attempts=1)
    def plain() -> None:
        sentry_sdk.capture_message("plain")
        raise ValueError("dead")

    recorder = Recorder()
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=recorder,
                    default_integrations=False, auto_enabling_integrations=False)
    try:
        assert sentry_sdk.get_client().get_integration(EmqtasksIntegration) is None
        plain.delay()
        assert [o.verdict for o in run_pending(app.queue())] == ["dead"]
        [event] = recorder.events()
        assert event["message"] == "plain" and _tags(event) == {}
    finally:
        _stop()


def test_a_real_worker_reports_from_its_child_and_from_its_master(app: App,
                                                                  tmp_path: Path) -> None:
    """A task's own message and its dead job from the child that ran it, sent before the
    child ends; a job whose child was killed from the master (WorkerLost), tagged from the
    job's row."""
    out = tmp_path / "events.jsonl"

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in out.read_text().splitlines()] \
            if out.exists() else []

    env = dict(os.environ, EMQ_REDIS_URL=app.settings.redis_url, EMQ_SENTRY_FILE=str(out))
    with WorkerProcess(["sentry_tasks"], redis_url=app.settings.redis_url,
                       queue=app.settings.queue, concurrency=1, tick=0.2, path=str(TASKS),
                       env=env, log_path=tmp_path / "worker.log",
                       # a child per job: the one that ran `fails` ends before `dies` kills
                       # its own (a child killed takes its unsent events with it)
                       extra=["--max-tasks-per-child", "1"]) as w:
        w.wait_ready()
        failed, died = app.send_task(st.fails, (7,)), app.send_task(st.dies)
        for h in (failed, died):
            with pytest.raises(TaskFailed):
                h.get(timeout=20)
        # the events were queued (as an HTTP transport queues them), written by a flush:
        # the child's as it ends after its one job (its finalizer), the master's at its exit
        assert w.stop() == 0
    seen = events()
    assert len(seen) == 3, [(e["pid"], e["event"].get("message"), _tags(e["event"])) for e in seen]
    message, dead, lost = sorted(
        seen, key=lambda e: (e["event"]["tags"]["emqtasks.job_id"] != failed.id,
                             "message" not in e["event"]))
    assert message["event"]["message"] == "charging order 7"
    assert _tags(message["event"]) == {
        "emqtasks.task": "sentry_w.fails", "emqtasks.job_id": failed.id,
        "emqtasks.queue": app.settings.queue, "emqtasks.group": "shop-1",
        "emqtasks.attempt": "1"}
    assert dead["event"]["exception"]["values"][0]["type"] == "LookupError"
    assert _tags(dead["event"])["emqtasks.outcome"] == "dead"
    assert dead["pid"] == message["pid"] != w.pid            # in the child that ran it
    assert lost["pid"] == w.pid                              # in the master
    assert _tags(lost["event"]) == {
        "emqtasks.task": "sentry_w.dies", "emqtasks.job_id": died.id,
        "emqtasks.queue": app.settings.queue, "emqtasks.group": "shop-2",
        "emqtasks.attempt": "1", "emqtasks.outcome": "dead"}
    [exc] = lost["event"]["exception"]["values"]
    assert exc["type"] == "WorkerLost" and "signal 9" in exc["value"]

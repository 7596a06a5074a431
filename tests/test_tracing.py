"""OpenTelemetry (observe/tracing.py): a PRODUCER span at enqueue whose context the job
carries, and a CONSUMER span per run in the worker, child of it; a real worker process
against a real Redis, its spans exported to a file the test reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import spanfile
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from workerproc import WorkerProc
from workflow_tasks import add as wf_add

from emqtasks import App, chain, chord, group
from emqtasks.errors import SerializationError
from emqtasks.store.functions import function_name

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """This process's spans. The global provider is set for the test only (the API sets it
    once per process; the reset is the one OpenTelemetry's own tests make): the tests after
    it run with the API and no SDK, where an enqueue carries nothing."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    yield memory
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


def _add(a: int, b: int) -> int:
    return a + b


def _total(values: list[int]) -> int:
    return sum(values)


def _attempts() -> int:
    return 1


def records(memory: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [spanfile.as_record(s) for s in memory.get_finished_spans()]


def one(spans: list[dict[str, Any]], name: str, **attributes: Any) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name
             and all(s["attributes"].get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, (name, attributes, spans)
    return found[0]


def test_a_job_runs_in_the_trace_of_the_request_that_sent_it(
        app: App, exported: InMemorySpanExporter, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "spans.jsonl"
    monkeypatch.setenv("EMQ_TEST_SPANS", str(out))
    queue = app.settings.queue
    with WorkerProc(app.settings.redis_url, queue, concurrency=1,
                    modules=("otel_tasks",)) as w:
        w.wait_ready()
        with trace.get_tracer("test").start_as_current_span("request") as request:
            added = app.send_task("t.otel.add", (2, 3), group="acme")
            flaky = app.send_task("t.otel.second_time", group="globex")
            add = app.task(name="t.otel.add")(_add)   # the worker's, known here by name
            flow = chain(add.s(1, 2), add.s(3), add.s(4)).apply_async(app=app)
            total = app.task(name="t.otel.total")(_total)
            both = chord(group(add.s(1, 1), add.s(2, 2), add.s(3, 3)), total.s()).apply_async(
                app=app)
        assert added.get(timeout=10) == 5 and flaky.get(timeout=10) == 2
        assert flow.get(timeout=10) == 10 and both.get(timeout=10) == 12
        assert w.stop() == 0   # the child flushed its provider on its way out
    trace_id = f"{request.get_span_context().trace_id:032x}"
    mine = records(exported)
    sent_add = one(mine, "send t.otel.add", **{"messaging.message.id": added.id})
    sent_flaky = one(mine, "send t.otel.second_time")
    for sent, job, lane in ((sent_add, added, "acme"), (sent_flaky, flaky, "globex")):
        assert sent["kind"] == "PRODUCER" and sent["trace_id"] == trace_id
        assert sent["parent_id"] == f"{request.get_span_context().span_id:016x}"
        assert sent["attributes"] == {
            "messaging.system": "emqtasks", "messaging.destination.name": queue,
            "messaging.operation.type": "send", "messaging.message.id": job.id,
            "emqtasks.task": sent["name"].removeprefix("send "), "emqtasks.group": lane}
    theirs = spanfile.read(out)
    assert {s["trace_id"] for s in theirs} == {trace_id}   # one trace, end to end
    ran = one(theirs, "process t.otel.add", **{"messaging.message.id": added.id})
    assert ran["kind"] == "CONSUMER" and ran["parent_id"] == sent_add["span_id"]
    assert ran["status"] == "UNSET" and ran["events"] == []
    assert ran["attributes"] == {
        "messaging.system": "emqtasks", "messaging.destination.name": queue,
        "messaging.operation.type": "process", "messaging.message.id": added.id,
        "emqtasks.task": "t.otel.add", "emqtasks.group": "acme", "emqtasks.attempt": 1}
    first = one(theirs, "process t.otel.second_time", **{"emqtasks.attempt": 1})
    second = one(theirs, "process t.otel.second_time", **{"emqtasks.attempt": 2})
    assert first["status"] == "ERROR" and first["events"] == ["exception"]
    assert second["status"] == "UNSET" and second["events"] == []
    assert first["links"] == [] and second["links"] == [first["span_id"]]   # the retry's link
    for run in (first, second):
        assert run["parent_id"] == sent_flaky["span_id"]
        assert run["attributes"]["messaging.message.id"] == flaky.id
        assert run["attributes"]["emqtasks.group"] == "globex"
    # a workflow: one send span for all its steps; the first step's run a child of it, each
    # step after a child of the step that released it
    sent_flow = one(mine, "send t.otel.add", **{"messaging.message.id": flow.id})
    assert sent_flow["attributes"]["messaging.batch.message_count"] == 3
    parent = sent_flow
    for step in flow.steps():
        ran_step = one(theirs, "process t.otel.add", **{"messaging.message.id": step["id"]})
        assert ran_step["parent_id"] == parent["span_id"] and ran_step["links"] == []
        assert ran_step["status"] == "UNSET"
        parent = ran_step
    # a chord: its members children of its one send span; its callback a child of the member
    # that released it (the last in) and linked to the other two
    sent_chord = one(mine, "send t.otel.add", **{"messaging.message.id": both.id})
    assert sent_chord["attributes"]["messaging.batch.message_count"] == 4
    members = [s for s in theirs if s["parent_id"] == sent_chord["span_id"]]
    assert [s["name"] for s in members] == ["process t.otel.add"] * 3
    callback = one(theirs, "process t.otel.total")
    member_ids = {s["span_id"] for s in members}
    assert callback["parent_id"] in member_ids
    assert sorted(callback["links"]) == sorted(member_ids - {callback["parent_id"]})
    assert len(theirs) == 10


def test_a_run_the_master_settles_is_an_error_span_the_retry_links_to_and_logs_say_the_trace(
        app: App, exported: InMemorySpanExporter, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "spans.jsonl"
    monkeypatch.setenv("EMQ_TEST_SPANS", str(out))
    with WorkerProc(app.settings.redis_url, app.settings.queue, "--log-format", "json",
                    concurrency=1, modules=("otel_tasks",)) as w:
        w.wait_ready()
        with trace.get_tracer("test").start_as_current_span("request") as request:
            lost = app.send_task("t.otel.dies_once", group="initech")
            limited = app.send_task("t.otel.ignores_its_limit")
            said = app.send_task("t.otel.says", ("hi",))
        alone_job = app.send_task("t.otel.says", ("quiet",))
        assert lost.get(timeout=10) == 2 and said.get(timeout=10) == "hi"
        assert limited.get(timeout=15) == 2
        assert alone_job.get(timeout=10) == "quiet"
        w.wait_for(lambda: w.output().count('"outcome": "done"') == 4, 10, "done lines")
        assert w.stop() == 0
        output = w.output()
    trace_id = f"{request.get_span_context().trace_id:032x}"
    sent = one(records(exported), "send t.otel.dies_once")
    theirs = spanfile.read(out)
    # the child's span died with it: the master's stands for the run, ERROR, in the trace
    dead = one(theirs, "process t.otel.dies_once", **{"emqtasks.attempt": 1})
    assert dead["trace_id"] == trace_id and dead["parent_id"] == sent["span_id"]
    assert dead["kind"] == "CONSUMER" and dead["status"] == "ERROR"
    assert dead["events"] == ["exception"] and dead["links"] == []
    assert dead["error"].startswith("WorkerLost: child pid ")
    assert dead["attributes"]["emqtasks.settled_by"] == "master"
    assert dead["attributes"]["messaging.message.id"] == lost.id
    assert dead["attributes"]["emqtasks.group"] == "initech"
    again = one(theirs, "process t.otel.dies_once", **{"emqtasks.attempt": 2})
    assert again["parent_id"] == sent["span_id"] and again["status"] == "UNSET"
    assert again["links"] == [dead["span_id"]]
    # killed at its time limit: the same, its exception TimeLimitExceeded
    sent_limited = one(records(exported), "send t.otel.ignores_its_limit")
    killed = one(theirs, "process t.otel.ignores_its_limit", **{"emqtasks.attempt": 1})
    assert killed["trace_id"] == trace_id and killed["parent_id"] == sent_limited["span_id"]
    assert killed["status"] == "ERROR" and killed["events"] == ["exception"]
    assert killed["error"] == "TimeLimitExceeded: ran past its time limit of 0.2s"
    assert killed["attributes"]["emqtasks.settled_by"] == "master"
    rerun = one(theirs, "process t.otel.ignores_its_limit", **{"emqtasks.attempt": 2})
    assert rerun["links"] == [killed["span_id"]] and rerun["status"] == "UNSET"
    # JSON logs: the trace id on the job's lines, the master's and the task's own
    lines = [json.loads(line) for line in output.splitlines()]
    mine = [line for line in lines if line.get("job_id") in (lost.id, said.id)]
    assert {line["trace_id"] for line in mine} == {trace_id}
    failed = [line for line in mine if line.get("outcome") == "retry"]
    assert len(failed) == 1 and failed[0]["pid"] == w.pid   # the master's line
    [own] = [line for line in mine if line["logger"] == "app.tasks"]
    assert own["msg"] == "saying hi" and own["job_id"] == said.id
    # a job sent outside the request: a trace of its own (its send span the root), which
    # its lines name
    alone = one(records(exported), "send t.otel.says", **{"messaging.message.id": alone_job.id})
    root = one(theirs, "process t.otel.says", **{"messaging.message.id": alone_job.id})
    assert alone["parent_id"] is None and root["parent_id"] == alone["span_id"]
    assert root["trace_id"] == alone["trace_id"] != trace_id
    quiet = [line for line in lines if line.get("job_id") == alone_job.id]
    assert len(quiet) == 2 and {line["trace_id"] for line in quiet} == {root["trace_id"]}


def test_each_firing_of_a_schedule_is_a_trace_of_its_own(
        app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "spans.jsonl"
    monkeypatch.setenv("EMQ_TEST_SPANS", str(out))
    add = app.task(name="t.otel.add")(_add)
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=("otel_tasks",)) as w:
        w.wait_ready()
        app.schedule("otel-tick", add, every=1, args=(5, 6))
        try:
            w.wait_for(lambda: sum(s["name"] == "process t.otel.add"
                                   for s in spanfile.read(out)) >= 2, 10, "two runs")
        finally:
            app.unschedule("otel-tick")
        assert w.stop() == 0
    spans = spanfile.read(out)
    sends = {s["span_id"]: s for s in spans if s["name"] == "send t.otel.add"}
    runs = [s for s in spans if s["name"] == "process t.otel.add"]
    assert len(runs) >= 2 and len({r["trace_id"] for r in runs}) == len(runs)
    for run in runs:
        sent = sends[run["parent_id"]]    # the master's span of the firing, in the file
        assert sent["kind"] == "PRODUCER" and sent["parent_id"] is None
        assert sent["trace_id"] == run["trace_id"]
        job_id = run["attributes"]["messaging.message.id"]
        assert job_id.startswith("sched:otel-tick:")
        assert sent["attributes"]["messaging.message.id"] == job_id
        assert sent["attributes"]["emqtasks.schedule"] == "otel-tick"
        assert job_id == f"sched:otel-tick:{sent['attributes']['emqtasks.schedule.slot']}"


def test_map_sends_one_span_per_batch_and_every_job_carries_it(
        app: App, exported: InMemorySpanExporter) -> None:
    add = app.task(name="t.otel.add")(_add)
    handles = add.map([(1, 2), (3, 4), (5, 6)])
    [sent] = records(exported)
    assert sent["name"] == "send t.otel.add" and sent["parent_id"] is None
    assert sent["attributes"]["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in sent["attributes"]
    q = app.queue()
    for h in handles:
        payload = q.client.hget(q.keys.job(h.id), "payload")
        carrier = json.loads(payload)["t"]
        assert carrier["traceparent"].startswith(f"00-{sent['trace_id']}-{sent['span_id']}-")


def test_a_failed_enqueue_marks_its_span_error(app: App,
                                              exported: InMemorySpanExporter) -> None:
    with pytest.raises(SerializationError):
        app.send_task("t.otel.add", ({1, 2},))   # a set is not JSON
    [sent] = records(exported)
    assert sent["status"] == "ERROR" and sent["events"] == ["exception"]


def test_without_an_sdk_a_job_carries_nothing(app: App) -> None:
    # The API imported (this module did), no provider installed: the envelope is as before
    h = app.send_task("t.otel.add", (1, 2))
    q = app.queue()
    assert q.client.hget(q.keys.job(h.id), "payload") == '{"v":1,"a":[1,2],"k":{}}'


def test_without_an_sdk_a_current_context_is_passed_on(app: App) -> None:
    # A context current with the API alone (extracted from a request, say): the job carries
    # it unchanged, the API's no-op span being the context's own
    ctx = trace.SpanContext(0x1234, 0x5678, is_remote=True,
                            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    with trace.use_span(trace.NonRecordingSpan(ctx)):
        h = app.send_task("t.otel.add", (1, 2))
    q = app.queue()
    carrier = json.loads(q.client.hget(q.keys.job(h.id), "payload"))["t"]
    assert carrier == {"traceparent": f"00-{0x1234:032x}-{0x5678:016x}-01"}


def test_without_tracing_an_ack_sends_nothing_more(app: App) -> None:
    """A worker with no SDK (its tasks module installs none): a chain's acks carry the five
    arguments they did (no span), and the steps they release keep none. The server's slow
    log, told to keep every command, holds each ack as sent."""
    q = app.queue()
    client = q.client
    before = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    try:
        with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                        modules=("workflow_tasks",)) as w:
            w.wait_ready()
            # the worker's own task (one function per task name in a process: an in-process
            # runner merges every App's tasks)
            flow = chain(wf_add.s(1, 2), wf_add.s(3), wf_add.s(4)).apply_async(app=app)
            assert flow.get(timeout=10) == 10
            assert w.stop() == 0
        entries = client.slowlog_get(100_000)
    finally:
        for name, value in before.items():
            client.config_set(name, value)
    keys, sha = len(q.keys.fixed), q.scripts.ack.sha
    step_ids = [step["id"] for step in flow.steps()]
    acks: dict[str, list[str]] = {}
    for entry in entries:
        command = entry["command"]
        words = (command.decode() if isinstance(command, bytes) else command).split(" ")
        if words[0].upper() == "EMQ.ACK":
            args = words[1 + keys:]
        elif words[0].upper() == "EVALSHA" and words[1] == sha:
            args = words[3 + keys:]
        elif words[0].upper() == "FCALL" and words[1] == function_name("ack"):
            args = words[3 + int(words[2]):]   # (the library is sent one key)
        else:
            continue
        acks[args[0]] = args
    assert sorted(acks) == sorted(step_ids)
    assert all(len(args) == 5 for args in acks.values()), acks   # id .. next: no span
    for step_id in step_ids:
        assert client.hmget(q.keys.job(step_id), "tparent", "tlinks") == [None, None]


def test_a_released_step_whose_child_dies_is_still_the_child_of_the_step_before(
        app: App, exported: InMemorySpanExporter, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain's second step dies on its first attempt: the master's span of that run and
    the retry's run are both children of the first step's run (the row's tparent), the
    retry linked to the run that died."""
    out = tmp_path / "spans.jsonl"
    monkeypatch.setenv("EMQ_TEST_SPANS", str(out))
    add = app.task(name="t.otel.add")(_add)
    dies_once = app.task(name="t.otel.dies_once")(_attempts)   # the worker's, by name
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=("otel_tasks",)) as w:
        w.wait_ready()
        flow = chain(add.s(1, 2), dies_once.si()).apply_async(app=app)
        assert flow.get(timeout=15) == 2
        assert w.stop() == 0
    theirs = spanfile.read(out)
    first = one(theirs, "process t.otel.add")
    died = one(theirs, "process t.otel.dies_once", **{"emqtasks.attempt": 1})
    again = one(theirs, "process t.otel.dies_once", **{"emqtasks.attempt": 2})
    assert died["attributes"]["emqtasks.settled_by"] == "master"
    assert died["parent_id"] == first["span_id"] and died["status"] == "ERROR"
    assert again["parent_id"] == first["span_id"] and again["links"] == [died["span_id"]]
    assert {s["trace_id"] for s in theirs} == {first["trace_id"]}

"""A malformed row or a wrongly typed key costs that job or that group, never the queue
(issue #24), on both paths: a claim buries a row it cannot read in `dead` with the reason and
goes on, a group whose books it cannot read leaves the ring, a queue-wide key of the wrong
type fails the call with nothing written."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import worker_tasks as wt
from helpers import make_task
from workerproc import WorkerProc

from emqtasks import App, Queue
from emqtasks.errors import CorruptKey
from emqtasks.ops.check import check, repair

pytestmark = pytest.mark.timeout(60)


def _lanes(app: App) -> tuple[Queue, str]:
    """A queue holding the job to spoil at the head of lane `bad`, one more job behind it,
    and one job in each of three healthy groups; returns the spoilt job's id."""
    t = make_task(app, name="tests.malformed", group=lambda g, i: g)
    bad = t.delay("bad", 0).id
    t.delay("bad", 1)
    t.map([(f"ok{i}", i) for i in range(3)])
    return app.queue(), bad


ROW_FAULTS: dict[str, tuple[Callable[[Any, str], Any], str]] = {
    "attempts not an integer": (lambda r, k: r.hset(k, "attempts", "abc"),
                                "attempts is not an integer"),
    "lease not an integer": (lambda r, k: r.hset(k, "lease", "1.5"), "lease is not an integer"),
    "no max": (lambda r, k: r.hdel(k, "max"), "no max"),
    "no group": (lambda r, k: r.hdel(k, "group"), "no group"),
    "fence not an integer": (lambda r, k: r.hset(k, "fence", " 3"), "fence is not an integer"),
    "a string for a row": (lambda r, k: (r.delete(k), r.set(k, "x")),
                           "the key holds a string, not a hash"),
}


@pytest.mark.parametrize("fault", sorted(ROW_FAULTS))
def test_a_row_a_claim_cannot_read_goes_dead_and_the_claim_goes_on(path_app: App,
                                                                     fault: str) -> None:
    # Given the head of lane `bad` spoilt
    q, bad = _lanes(path_app)
    spoil, reason = ROW_FAULTS[fault]
    spoil(q.client, q.keys.job(bad))
    # When a worker claims
    leases = q.claim(10)
    # Then every healthy job is leased, the next one of lane `bad` included
    assert sorted(lease.group for lease in leases) == ["bad", "ok0", "ok1", "ok2"]
    assert bad not in {lease.id for lease in leases}
    # And the spoilt one is dead with the reason, under its lane's group, and nothing is lost
    row = q.client.hgetall(q.keys.job(bad))
    assert row["state"] == "dead" and row["group"] == "bad"
    assert row["error"] == f"unreadable job row: {reason}"
    assert q.client.zscore(q.keys.dead, bad) is not None
    assert check(q).ok, check(q).violations
    # And it reads like any dead job (emqtasks dead, the dashboard)
    assert [(j["id"], j["error"]) for j in q.dead_jobs()] == [(bad, row["error"])]


GROUP_FAULTS: dict[str, Callable[[Queue], Any]] = {
    "its lane is a string": lambda q: (q.client.delete(q.keys.lane("bad")),
                                       q.client.set(q.keys.lane("bad"), "x")),
    "its gactive is not an integer": lambda q: q.client.hset(q.keys.gactive, "bad", "abc"),
    "its limit is not an integer": lambda q: q.client.hset(q.keys.glimit, "bad", "two"),
    "its weight is 0": lambda q: q.client.hset(q.keys.gweight, "bad", "0"),
    "its turn count is not an integer": lambda q: (
        q.client.hset(q.keys.gweight, "bad", "3"),
        q.client.hset(q.keys.base + "gturn", "bad", "x")),
}


@pytest.mark.parametrize("fault", sorted(GROUP_FAULTS))
def test_a_group_whose_books_a_claim_cannot_read_leaves_the_ring(path_app: App,
                                                                  fault: str) -> None:
    # Given group `bad` on the ring with broken books
    q, bad = _lanes(path_app)
    GROUP_FAULTS[fault](q)
    rows = {k: q.client.hgetall(k) for k in (q.keys.job(bad),)}
    # When a worker claims, again and again
    leases = q.claim(10) + q.claim(10)
    # Then the other groups are served, `bad` left the ring and its jobs wait untouched
    assert sorted(lease.group for lease in leases) == ["ok0", "ok1", "ok2"]
    assert "bad" not in q.client.lrange(q.keys.ring, 0, -1)
    assert {k: q.client.hgetall(k) for k in rows} == rows
    # And the checker says what is wrong with the group
    assert not check(q).ok


@pytest.mark.parametrize("name", ["active", "gturn", "dead"])
def test_a_queue_wide_key_of_the_wrong_type_fails_the_claim_with_nothing_written(
        path_app: App, name: str) -> None:
    # Given a queue whose `active` (a lease writes it), `gturn` (a turn of the ring) or
    # `dead` (the burial of the unreadable row at the head of the ring) holds a string
    q, bad = _lanes(path_app)
    if name == "dead":
        q.client.hset(q.keys.job(bad), "attempts", "abc")
    key = q.keys.base + name
    q.client.delete(key)
    q.client.set(key, "x")
    before = {k: q.client.type(k) for k in q.scan(q.keys.all_pattern)}
    lanes = q.client.zrange(q.keys.lane("bad"), 0, -1, withscores=True)
    ring = q.client.lrange(q.keys.ring, 0, -1)
    # When a worker claims, Then the server refuses and names the key
    with pytest.raises(Exception, match=f"WRONGTYPE emq: {re.escape(key)} holds a string"):
        q.claim(1)
    # And nothing was written: every job still in its lane, pending, the ring as it was
    assert {k: q.client.type(k) for k in q.scan(q.keys.all_pattern)} == before
    assert q.client.zrange(q.keys.lane("bad"), 0, -1, withscores=True) == lanes
    assert q.client.lrange(q.keys.ring, 0, -1) == ring
    assert q.client.hget(q.keys.job(bad), "state") == "pending"


# -- emqtasks check and check --repair ---------------------------------------------------------

def _spoil_everything(q: Queue, bad: str) -> str:
    """Spoilt rows and books of every kind on one queue; returns the id of a running job
    whose `active` entry is lost with the key."""
    r, k = q.client, q.keys
    first, held = q.claim(2)                           # a lease held while `active` breaks
    assert first.id == bad and q.release(first)       # (lane `bad` back as it was)
    running = held.id
    r.hset(k.job(bad), "attempts", "abc")              # the head of lane `bad`: unreadable
    second = r.zrange(k.lane("bad"), 1, 1)[0]
    r.delete(k.job(second))
    r.set(k.job(second), "x")                          # a job key holding a string
    r.delete(k.active)
    r.set(k.active, "x")                               # a derived key of the wrong type
    r.hset(k.gactive, "ok1", "abc")                    # a derived book unreadable
    r.hset(k.glimit, "ok2", "two")                     # a setting unreadable
    r.set(k.gmax, "x")                                 # a setting of the wrong type
    return running


def test_check_names_every_unreadable_key_and_row_and_never_fails(path_app: App) -> None:
    q, bad = _lanes(path_app)
    second = q.client.zrange(q.keys.lane("bad"), 1, 1)[0]
    _spoil_everything(q, bad)
    # When checked, Then each problem is one line naming it, and nothing raises
    report = check(q)
    text = "\n".join(report.violations)
    assert f"key {q.keys.active} holds a string, not a zset" in text
    assert f"key {q.keys.gmax} holds a string, not a hash" in text
    assert f"key {q.keys.job(second)} holds a string, not a hash" in text
    assert f"job {bad}: unreadable row (attempts is not an integer)" in text
    assert f"group ok1: its jobs in flight ({q.keys.gactive}) is 'abc'" in text
    assert f"group ok2: its limit ({q.keys.glimit}) is 'two'" in text


def test_repair_buries_unreadable_rows_rebuilds_derived_keys_and_names_the_rest(
        path_app: App) -> None:
    q, bad = _lanes(path_app)
    second = q.client.zrange(q.keys.lane("bad"), 1, 1)[0]
    running = _spoil_everything(q, bad)
    # When repaired
    mended = repair(q)
    # Then the unreadable rows are dead with the reason, the derived keys rebuilt
    assert mended.buried == 2
    assert q.client.hget(q.keys.job(bad), "error") == "unreadable job row: attempts is not " \
                                                      "an integer"
    assert q.client.hget(q.keys.job(second), "error") == "unreadable job row: the key holds " \
                                                         "a string, not a hash"
    assert q.keys.active in mended.rebuilt
    assert q.client.zscore(q.keys.active, running) is not None     # its lease restored
    # And the settings, which only their owner can set, are named and left alone
    assert any(q.keys.gmax in line for line in mended.not_repaired)
    assert any(f"its limit ({q.keys.glimit}) is 'two'" in line for line in mended.not_repaired)
    left = check(q).violations
    assert all("gmax" in v or "glimit" in v for v in left), left
    # And once the owner mends them, the queue is whole and every healthy job is served
    q.client.delete(q.keys.gmax)
    q.client.hdel(q.keys.glimit, "ok2")
    repair(q)
    assert check(q).ok, check(q).violations
    assert sorted(lease.group for lease in q.claim(10)) == ["ok1", "ok2"]   # ok0's runs


def test_the_check_command_reports_a_wrongly_typed_key_in_one_line(path_app: App) -> None:
    q, _bad = _lanes(path_app)
    q.client.delete(q.keys.lane("ok0"))
    q.client.set(q.keys.lane("ok0"), "x")
    done = subprocess.run([sys.executable, "-m", "emqtasks.cli", "check", "--redis-url",
                           path_app.settings.redis_url, "-Q", q.keys.name],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr == ""
    assert f"violation: key {q.keys.lane('ok0')} holds a string, not a zset" in done.stdout
    mended = subprocess.run([sys.executable, "-m", "emqtasks.cli", "check", "--repair",
                             "--redis-url", path_app.settings.redis_url, "-Q", q.keys.name],
                            capture_output=True, text=True, timeout=60)
    assert mended.returncode == 0, mended.stdout + mended.stderr
    assert "1 keys of the wrong type rebuilt" in mended.stdout


# -- a producer on a wrongly typed key ---------------------------------------------------------

def _keys(q: Queue) -> dict[str, str]:
    return {key: q.client.type(key) for key in q.scan(q.keys.all_pattern)
            if not key.startswith(q.keys.base + "h:")}


@pytest.mark.parametrize("where", ["its lane", "the ring", "delayed", "its limit"])
def test_delay_on_a_wrongly_typed_key_raises_a_named_error_and_writes_nothing(
        path_app: App, where: str) -> None:
    # Given a queue with one key of the job's way broken
    t = make_task(path_app, name="tests.malformed", group=lambda g, i: g)
    t.delay("ok", 0)
    q = path_app.queue()
    key = {"its lane": q.keys.lane("bad"), "the ring": q.keys.ring,
           "delayed": q.keys.delayed, "its limit": q.keys.glimit}[where]
    if where == "its limit":
        q.client.hset(key, "bad", "two")
    else:
        q.client.delete(key)
        q.client.set(key, "x")
    before = _keys(q)
    # When a producer enqueues into it, Then a named error says which key, nothing written
    with pytest.raises(CorruptKey, match=re.escape(key)) as caught:
        t.apply_async(("bad", 1), countdown=60 if where == "delayed" else None)
    assert "emqtasks check" in str(caught.value)
    assert _keys(q) == before
    # And the other groups' producers go on (but the queue-wide keys' own)
    if where in ("its lane", "its limit"):
        assert t.delay("ok", 2).verdict == "enqueued"
        assert [h.verdict for h in t.map([("bad", 3), ("ok", 4)])] == ["unreadable", "enqueued"]


# -- a real worker ----------------------------------------------------------------------------

def _worker(app: App, concurrency: int = 2) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=concurrency,
                   tick=0.2)
    w.wait_ready()
    return w


@pytest.mark.timeout(90)
def test_a_worker_runs_every_healthy_job_while_a_poisoned_row_sits_in_the_ring(
        path_app: App) -> None:
    # Given a row no claim can read at the head of the ring, and 100 jobs in 10 other groups
    q = path_app.queue()
    poisoned = path_app.send_task(wt.record, ("poison:0",)).id
    q.client.hset(q.keys.job(poisoned), "attempts", "abc")
    handles = [path_app.send_task(wt.record, (f"g{i % 10}:{i}",)) for i in range(100)]
    with _worker(path_app) as w:
        began = time.monotonic()
        # When a worker runs, Then every healthy job runs, within seconds
        assert [h.get(timeout=30) for h in handles] == [f"g{i % 10}:{i}" for i in range(100)]
        assert time.monotonic() - began < 20, w.output(tail=30)
        # And the poisoned one is dead with the reason, and no child crashed
        row = q.client.hgetall(q.keys.job(poisoned))
        assert row["state"] == "dead", row
        assert row["error"] == "unreadable job row: attempts is not an integer"
        assert "restarting it in" not in w.output() and "Traceback" not in w.output()
        w.stop()
    assert check(q).ok, check(q).violations


@pytest.mark.timeout(90)
def test_a_child_backs_off_on_a_refused_claim_and_never_crashes(path_app: App) -> None:
    # Given a job, and a queue-wide key every claim refuses to write (`gturn`, a string)
    q = path_app.queue()
    handle = path_app.send_task(wt.record, ("a:1",))
    gturn = q.keys.base + "gturn"
    q.client.set(gturn, "x")
    with _worker(path_app, concurrency=1) as w:
        child = w.children()
        # When claims are refused, Then the child says so once and backs off, alive
        w.wait_for(lambda: "claims refused" in w.output(), timeout=10, what="the refusal")
        time.sleep(2)    # a window in which a crash-looping child would restart
        assert w.output().count("claims refused") == 1, w.output(tail=30)
        assert gturn in w.output()
        assert "restarting it in" not in w.output() and "Traceback" not in w.output()
        assert w.children() == child
        # And once the key is mended, the job runs (a bounded back-off)
        q.client.delete(gturn)
        assert handle.get(timeout=15) == "a:1"
        w.wait_for(lambda: "claims are served again" in w.output(), timeout=5,
                   what="the end of the refusals")
        w.stop()


@pytest.mark.timeout(90)
def test_a_row_without_a_task_name_goes_dead_and_the_child_lives(path_app: App) -> None:
    # Given a job whose row lost its task name, then a healthy one
    q = path_app.queue()
    nameless = path_app.send_task(wt.record, ("a:1",)).id
    q.client.hdel(q.keys.job(nameless), "task")
    after = path_app.send_task(wt.record, ("a:2",))
    with _worker(path_app, concurrency=1) as w:
        child = w.children()
        # When the worker meets it, Then it is dead with the reason and the child goes on
        assert after.get(timeout=15) == "a:2"
        row = q.client.hgetall(q.keys.job(nameless))
        assert row["state"] == "dead" and "no task name" in row["error"], row
        assert w.children() == child
        assert "restarting it in" not in w.output() and "Traceback" not in w.output()
        w.stop()


# -- the verbs past the claim: reap, promote, ack, retry, release, requeue ---------------------

def _respoil(q: Queue, key: str) -> None:
    q.client.delete(key)
    q.client.set(key, "x")


@pytest.mark.parametrize("fault", ["a string for a row", "attempts not an integer", "no group"])
def test_reap_buries_a_lease_it_cannot_read_and_reaps_the_rest(path_app: App,
                                                                fault: str) -> None:
    # Given three expired leases, the first of which is spoilt while it runs
    q, _bad = _lanes(path_app)
    leases = q.claim(3)
    spoilt, rest = leases[0], leases[1:]
    {"a string for a row": lambda: _respoil(q, q.keys.job(spoilt.id)),
     "attempts not an integer": lambda: q.client.hset(q.keys.job(spoilt.id), "attempts", "x"),
     "no group": lambda: q.client.hdel(q.keys.job(spoilt.id), "group")}[fault]()
    for lease in leases:
        q.client.zadd(q.keys.active, {lease.id: 0})
    # When the reaper runs, Then it buries the spoilt one and reaps the rest
    assert q.reap() == (2, 1)
    row = q.client.hgetall(q.keys.job(spoilt.id))
    assert row["state"] == "dead" and row["error"].startswith("unreadable job row: "), row
    assert q.client.zscore(q.keys.dead, spoilt.id) is not None
    assert q.client.zcard(q.keys.active) == 0
    for lease in rest:
        assert q.client.hget(q.keys.job(lease.id), "state") == "pending"
    # And the reaper runs again without an error
    assert q.reap() == (0, 0)


@pytest.mark.parametrize("fault", ["a string for a row", "no group"])
def test_promote_buries_a_delayed_job_it_cannot_read_and_promotes_the_rest(
        path_app: App, fault: str) -> None:
    # Given three due delayed jobs, the first spoilt
    t = make_task(path_app, name="tests.malformed", group=lambda g, i: g)
    ids = [t.apply_async((f"g{i}", i), countdown=60).id for i in range(3)]
    q = path_app.queue()
    if fault == "a string for a row":
        _respoil(q, q.keys.job(ids[0]))
    else:
        q.client.hdel(q.keys.job(ids[0]), "group")
    q.client.zadd(q.keys.delayed, {i: 0 for i in ids})
    # When promoted, Then the rest are pending and the spoilt one is dead with the reason
    assert q.promote()[0] == 3
    assert q.client.hget(q.keys.job(ids[0]), "state") == "dead"
    assert q.client.hget(q.keys.job(ids[0]), "error").startswith("unreadable job row: ")
    assert q.client.zcard(q.keys.delayed) == 0
    assert sorted(lease.id for lease in q.claim(5)) == sorted(ids[1:])


def test_promote_buries_a_job_whose_lane_is_a_string_naming_it(path_app: App) -> None:
    # Given a due job whose lane holds a string, and one of another group
    t = make_task(path_app, name="tests.malformed", group=lambda g, i: g)
    broken = t.apply_async(("bad", 0), countdown=60).id
    fine = t.apply_async(("ok", 1), countdown=60).id
    q = path_app.queue()
    _respoil(q, q.keys.lane("bad"))
    q.client.zadd(q.keys.delayed, {broken: 0, fine: 0})
    # When promoted, Then the job is dead naming the lane, the other pending
    q.promote()
    row = q.client.hgetall(q.keys.job(broken))
    assert row["state"] == "dead", row
    assert row["error"] == "its group's lane (g:bad:pending) holds a string, not a zset"
    assert q.client.zscore(q.keys.dead, broken) is not None
    assert [lease.id for lease in q.claim(5)] == [fine]
    assert q.client.zcard(q.keys.delayed) == 0


BOOK_FAULTS: dict[str, Callable[[Queue], Any]] = {
    "its gactive is not an integer": lambda q: q.client.hset(q.keys.gactive, "bad", "abc"),
    "its limit is not an integer": lambda q: q.client.hset(q.keys.glimit, "bad", "two"),
    "its lane is a string": lambda q: _respoil(q, q.keys.lane("bad")),
}


def _settle(q: Queue, verb: str, lease: Any) -> Any:
    if verb == "ack":
        return q.ack(lease, '"r"').verdict
    if verb == "retry":
        return q.retry(lease, "boom", delay=0)
    return q.release(lease)


@pytest.mark.parametrize("verb", ["ack", "retry", "release"])
@pytest.mark.parametrize("fault", sorted(BOOK_FAULTS))
def test_a_settling_verb_settles_the_job_when_its_group_books_are_unreadable(
        path_app: App, verb: str, fault: str) -> None:
    # Given a job of group `bad` running, then its group's books spoilt
    q, bad = _lanes(path_app)
    lease = next(x for x in q.claim(10) if x.id == bad)
    BOOK_FAULTS[fault](q)
    books = {k: q.client.hgetall(k) for k in (q.keys.gactive, q.keys.glimit)}
    # When the worker settles it, Then the call succeeds and the job is settled
    assert _settle(q, verb, lease)
    row = q.client.hgetall(q.keys.job(lease.id))
    assert q.client.zscore(q.keys.active, lease.id) is None
    want = {"ack": {"done"}, "retry": {"delayed"}, "release": {"pending"}}[verb]
    if fault == "its lane is a string" and verb == "release":
        want = {"dead"}                      # it cannot go back: dead, naming the lane
        assert row["error"] == "its group's lane (g:bad:pending) holds a string, not a zset"
        assert q.client.zscore(q.keys.dead, lease.id) is not None
    assert (row.get("state") or "done") in want, row
    if verb == "release" and want == {"pending"}:
        assert q.client.zscore(q.keys.lane("bad"), lease.id) is not None
    # And the broken books are left as they were, not half-written
    if fault != "its lane is a string":
        assert {k: q.client.hgetall(k) for k in books} == books
    # And the other groups go on
    make_task(path_app, name="tests.malformed", group=lambda g, i: g).delay("ok0", 9)
    assert [x.group for x in q.claim(10)] == ["ok0"]


def test_requeue_brings_back_a_dead_row_without_a_group_into_the_default_group(
        path_app: App) -> None:
    # Given a dead job whose row lost its group
    t = make_task(path_app, name="tests.malformed", group=lambda g, i: g)
    job = t.delay("a", 0).id
    q = path_app.queue()
    (lease,) = q.claim(1)
    assert q.retry(lease, "boom", final=True)
    q.client.hdel(q.keys.job(job), "group")
    # When requeued, Then it is pending in the default group, and runs
    assert q.requeue_dead(job) == 1
    row = q.client.hgetall(q.keys.job(job))
    assert row["state"] == "pending" and row["group"] == "default"
    assert q.client.zscore(q.keys.dead, job) is None
    assert [(x.id, x.group) for x in q.claim(1)] == [(job, "default")]


def test_requeue_leaves_a_dead_job_whose_lane_is_broken_in_dead_with_the_reason(
        path_app: App) -> None:
    t = make_task(path_app, name="tests.malformed", group=lambda g, i: g)
    job = t.delay("bad", 0).id
    q = path_app.queue()
    (lease,) = q.claim(1)
    assert q.retry(lease, "boom", final=True)
    _respoil(q, q.keys.lane("bad"))
    assert q.requeue_dead(job) == 0
    assert q.client.zscore(q.keys.dead, job) is not None
    assert q.client.hget(q.keys.job(job), "error") == \
        "not requeued: its group's lane (g:bad:pending) holds a string, not a zset"

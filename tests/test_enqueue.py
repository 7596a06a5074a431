"""Enqueue: idempotent ids, batch verdicts and map, input gates that write nothing (ids,
payloads, groups, queue names), and task basics."""

from __future__ import annotations

import json
import threading

import pytest
from helpers import count_keys, make_task, new_job

from emqtasks import App
from emqtasks.errors import (
    InvalidGroup,
    InvalidJobId,
    InvalidQueueName,
    PayloadTooLarge,
    SerializationError,
)
from emqtasks.store.keys import QueueKeys
from emqtasks.verdicts import EnqueueVerdict

ENQUEUED, DUPLICATE = EnqueueVerdict.ENQUEUED, EnqueueVerdict.DUPLICATE


def add(x, y):
    return x + y


def build_report(tenant, report_id=0, **options):
    return None


def args_of(queue, job_id):
    env = json.loads(queue.client.hget(queue.keys.job(job_id), "payload"))
    return env["a"], env["k"]


# -- idempotent enqueue ------------------------------------------------------------------

def test_same_job_id_twice_is_a_duplicate_and_leaves_the_first_row_untouched(app, queue):
    # Given a job enqueued under a caller-chosen id
    t = make_task(app, group="billing")
    first = t.apply_async(args=(7,), kwargs={"note": "first"}, job_id="inv-7")
    row_before = queue.client.hgetall(queue.keys.job("inv-7"))
    # When the same id is enqueued again with other arguments and another group
    second = t.apply_async(args=(8,), kwargs={"note": "second"}, job_id="inv-7",
                           group="elsewhere")
    # Then the second is a duplicate and the row is exactly the first one
    assert first.duplicate is False and first.id == "inv-7"
    assert second.duplicate is True and second.id == "inv-7"
    assert queue.client.hgetall(queue.keys.job("inv-7")) == row_before
    assert args_of(queue, "inv-7") == ([7], {"note": "first"})
    assert queue.client.zcard(queue.keys.lane("billing")) == 1
    assert not queue.client.exists(queue.keys.lane("elsewhere"))


def _race(redis_url, queue_name, barrier, i, out):
    producer = App(redis_url=redis_url, queue=queue_name)
    try:
        t = make_task(producer, group="race")
        producer.client.ping()  # connect before the barrier, so the enqueues truly race
        barrier.wait(timeout=10)
        out[i] = t.apply_async(args=(i,), job_id="the-one")
    finally:
        producer.close()


@pytest.mark.timeout(30)
def test_eight_producers_racing_on_one_id_admit_exactly_one(redis_url, queue_name, queue):
    # Given eight producers, each with its own App and connection, behind a barrier
    barrier = threading.Barrier(8)
    out: list = [None] * 8
    threads = [threading.Thread(target=_race, args=(redis_url, queue_name, barrier, i, out))
               for i in range(8)]
    # When they all enqueue the same id at once
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    # Then exactly one was admitted, and the lane holds one job: the winner's
    assert all(h is not None for h in out)
    winners = [i for i, h in enumerate(out) if not h.duplicate]
    assert len(winners) == 1
    assert queue.client.zcard(queue.keys.lane("race")) == 1
    assert args_of(queue, "the-one") == ([winners[0]], {})


def test_batch_enqueue_gives_a_verdict_per_job(app, queue):
    # Given one job already in the queue
    assert queue.enqueue_many([new_job("old-1")]) == [ENQUEUED]
    # When a batch mixes new ids, the existing id and an id repeated within the batch
    verdicts = queue.enqueue_many([new_job("new-1"), new_job("old-1"), new_job("new-2"),
                                   new_job("new-1")])
    # Then each job has its own verdict and only the new ones were added
    assert verdicts == [ENQUEUED, DUPLICATE, ENQUEUED, DUPLICATE]
    lane = queue.client.zrange(queue.keys.lane("default"), 0, -1)
    assert sorted(lane) == ["new-1", "new-2", "old-1"]


def test_map_returns_a_handle_per_call_in_one_batch(app, queue):
    # Given a task grouped by its first argument, as in the design
    t = app.task(build_report, group=lambda tenant, **_: tenant)
    # When calls are mapped: tuples of args and dicts of kwargs
    handles = t.map([("acme", 1), ("globex", 2), {"tenant": "acme", "n": 3}])
    # Then every call got a fresh id, none a duplicate, each in its lane
    assert [h.duplicate for h in handles] == [False, False, False]
    assert len({h.id for h in handles}) == 3
    assert queue.client.zcard(queue.keys.lane("acme")) == 2
    assert queue.client.zcard(queue.keys.lane("globex")) == 1
    assert args_of(queue, handles[2].id) == ([], {"tenant": "acme", "n": 3})


def test_generated_ids_are_time_ordered(app):
    t = make_task(app)
    ids = [h.id for h in t.map([(i,) for i in range(50)])]
    assert ids == sorted(ids) and len(set(ids)) == 50


# -- bad input: a clear error, nothing written -------------------------------------------

@pytest.mark.parametrize("bad_id", ["has space", "", "x" * 129, "a{b}", "é", "a/b", "a\nb"])
def test_bad_job_id_is_refused_and_nothing_is_written(app, queue, bad_id):
    # Given a queue with one job in it
    t = make_task(app)
    t.delay(1)
    before = count_keys(queue)
    # When a call, and a batch holding one bad id among good ones, are enqueued
    with pytest.raises(InvalidJobId):
        t.apply_async(args=(2,), job_id=bad_id)
    with pytest.raises(InvalidJobId):
        queue.enqueue_many([new_job("good-1"), new_job(bad_id), new_job("good-2")])
    # Then nothing at all was written
    assert count_keys(queue) == before
    assert not queue.client.exists(queue.keys.job("good-1"))


def test_the_longest_job_id_is_accepted(app, queue):
    h = make_task(app).apply_async(job_id="x" * 128)
    assert h.duplicate is False and h.status() == "pending"


def test_bad_queue_name_is_refused(redis_url):
    # Given an App on a queue name with a space
    bad = App(redis_url=redis_url, queue="bad name")
    # Then its settings and its queue refuse it, and so do the key builders
    with pytest.raises(InvalidQueueName):
        bad.settings
    with pytest.raises(InvalidQueueName):
        bad.queue()
    for name in ("a{b}", "", "a*", "x" * 65, "é"):
        with pytest.raises(InvalidQueueName):
            QueueKeys(name)


def test_app_refuses_a_bad_queue_name_for_another_queue(app):
    with pytest.raises(InvalidQueueName):
        app.queue("bad name")


def test_empty_group_is_refused_and_nothing_is_written(app, queue):
    # Given a queue with one job in it
    make_task(app).delay(0)
    before = count_keys(queue)
    # When a job names an empty group, directly or through its group function
    with pytest.raises(InvalidGroup):
        make_task(app, name="t.explicit").apply_async(args=(1,), group="")
    with pytest.raises(InvalidGroup):
        make_task(app, name="t.callable", group=lambda *a, **k: "").delay(1)
    with pytest.raises(InvalidGroup):
        make_task(app, name="t.not-str", group=lambda *a, **k: 5).delay(1)
    with pytest.raises(InvalidGroup):
        make_task(app, name="t.raises", group=lambda *a, **k: 1 / 0).delay(1)
    with pytest.raises(InvalidGroup):
        make_task(app, name="t.long").apply_async(group="g" * 257)
    with pytest.raises(InvalidGroup):
        make_task(app, name="t.long").apply_async(group="é" * 129)  # 258 bytes
    # Then nothing was written
    assert count_keys(queue) == before


@pytest.mark.parametrize("bad_arg", [object(), {1, 2}, float("nan"), float("inf")],
                         ids=["object", "set", "nan", "inf"])
def test_arguments_json_cannot_encode_are_refused(app, queue, bad_arg):
    t = make_task(app)
    t.delay(0)
    before = count_keys(queue)
    with pytest.raises(SerializationError):
        t.delay(bad_arg)
    with pytest.raises(SerializationError):
        t.apply_async(kwargs={"x": bad_arg})
    with pytest.raises(SerializationError):  # one bad call spoils the whole batch
        t.map([(1,), (bad_arg,), (2,)])
    assert count_keys(queue) == before


def test_payload_over_the_limit_is_refused(redis_url, queue_name):
    # Given an App capped at 1000 payload bytes
    small = App(redis_url=redis_url, queue=queue_name, max_payload_bytes=1000)
    try:
        q = small.queue()
        t = make_task(small)
        # When payloads cross the limit, in ASCII or in multi-byte characters
        with pytest.raises(PayloadTooLarge):
            t.delay("x" * 1000)
        with pytest.raises(PayloadTooLarge):
            t.delay("é" * 600)  # 600 characters, 1200 bytes
        with pytest.raises(PayloadTooLarge):
            t.map([("ok",), ("x" * 2000,)])
        # Then nothing was written, and a payload under the limit still goes through
        assert count_keys(q) == 0
        assert t.delay("x" * 900).duplicate is False
        assert issubclass(PayloadTooLarge, SerializationError)
    finally:
        small.purge()
        small.close()


# -- handles and tasks --------------------------------------------------------------------

def test_status_is_pending_then_delayed_for_a_countdown(app, queue):
    t = make_task(app)
    now_job = t.delay(1)
    later = t.apply_async(args=(2,), countdown=60)
    assert now_job.status() == "pending"
    assert later.status() == "delayed"
    assert queue.client.zscore(queue.keys.delayed, later.id) is not None
    assert queue.client.zscore(queue.keys.lane("default"), later.id) is None
    info = later.info()
    assert info["state"] == "delayed" and info["attempts"] == 0 and info["max_attempts"] == 3


def test_group_callable_receives_args_and_kwargs(app, queue):
    # Given the design's group function, which names only the argument it needs
    t = app.task(build_report, group=lambda tenant, **_: tenant)
    # When the task is called positionally, by keyword, and mixed
    t.delay("acme", 42)
    t.apply_async(kwargs={"tenant": "globex", "report_id": 1})
    t.delay("initech", report_id=7, fmt="pdf")
    # Then each job lands in the tenant's lane
    for lane in ("acme", "globex", "initech"):
        assert queue.client.zcard(queue.keys.lane(lane)) == 1


def test_group_callable_taking_the_call_as_made(app, queue):
    seen = []

    def group_of(tenant, *args, **kwargs):
        seen.append((tenant, args, kwargs))
        return tenant

    t = make_task(app, group=group_of)
    t.delay("acme", 42, flag=True)
    t.apply_async(kwargs={"tenant": "globex", "n": 1})
    assert seen == [("acme", (42,), {"flag": True}), ("globex", (), {"n": 1})]
    assert queue.client.zcard(queue.keys.lane("acme")) == 1
    assert queue.client.zcard(queue.keys.lane("globex")) == 1


def test_callable_objects_that_cannot_be_hashed_serve_as_group_and_task(app, queue):
    from dataclasses import dataclass

    from emqtasks.worker.runner import Runner

    @dataclass
    class Tenant:          # __eq__ without __hash__: an object no cache can key on
        field: str

        def __call__(self, tenant, report_id):
            return tenant if self.field == "tenant" else str(report_id)

    # Given a task and its group function that are such objects
    t = app.task(Tenant("report"), name="t.unhashable", group=Tenant("tenant"))
    # When it is enqueued and claimed, Then the group is found and the worker's argument
    # check lets the job run (it fell back to binding the call each time)
    t.delay("acme", 42)
    (lease,) = queue.claim()
    assert lease.group == "acme"
    fn, args, kwargs = Runner(queue, app.registry).prepare(lease)
    assert fn(*args, **kwargs) == "42"


def test_calling_the_task_runs_it_in_process_and_enqueues_nothing(app, queue):
    t = app.task(add)
    assert t(2, 3) == 5
    assert t.__name__ == "add" and t.__wrapped__ is add
    assert count_keys(queue) == 0


def test_default_task_name_is_module_and_qualname(app):
    t = app.task(add)
    assert t.name == f"{add.__module__}.add" == f"{__name__}.add"
    assert app.tasks[t.name] is t


@pytest.mark.parametrize("group", ["a{b}c", "}{", "*?[x]", "café", "with space", "g:x:pending",
                                   "é" * 128])
def test_odd_group_names_round_trip_and_keep_the_queue_tag(app, queue, group):
    # Given a job in a lane whose name holds braces, globs, spaces or multi-byte text
    h = make_task(app).apply_async(args=(1,), group=group)
    # Then its lane key still hashes on the queue's tag (the first {...} of the key)
    lane = queue.keys.lane(group)
    assert lane[lane.index("{") + 1 : lane.index("}")] == queue.name
    # And the group is found again by stats and served by claim
    assert app.stats()["groups"][group]["pending"] == 1
    (lease,) = queue.claim()
    assert (lease.id, lease.group) == (h.id, group)

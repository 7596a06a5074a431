"""Canvas as Celery writes it (issue 27, item 4), on real workers: nesting of any depth (a
group of chains, group | group, chains and chords in a chord's header, nested chords, a
group as the last stage, a chord whose body is a group or a chain) gives Celery's result
shapes; partial arguments, .si(), chain.apply_async(args=..., kwargs=...), link_error on a
chain; a failure deep in a tree fails the whole workflow; the bounds hold on trees and a
refused tree writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import workflow_tasks as wt
from helpers import count_keys
from workerproc import WorkerProc

from emqtasks import (
    App,
    EmptyGroup,
    LaneFull,
    TaskFailed,
    UnknownTask,
    WorkflowError,
    WorkflowTooLarge,
    chord,
    group,
)
from emqtasks.ops.check import check
from emqtasks.workflows.canvas import MAX_DEPTH, MAX_STEPS, WorkflowHandle

pytestmark = pytest.mark.timeout(60)


def start(app: App) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=2, tick=0.1,
                   modules=("workflow_tasks",))
    try:
        w.wait_ready()
    except BaseException:
        w.__exit__(None, None, None)
        raise
    return w


add, tsum, sub, ident = wt.add, wt.tsum, wt.sub, wt.ident

#: (name, send(app) -> handle, the result Celery gives)
SHAPES: list[tuple[str, Callable[[App], WorkflowHandle], Any]] = [
    ("chain of three", lambda app: (add.s(1, 2) | add.s(10) | add.s(100)).apply_async(app=app),
     113),
    ("a step then a group", lambda app: (add.s(1, 1) | group(add.s(10), add.s(20)))
     .apply_async(app=app), [12, 22]),
    ("chord", lambda app: chord(group(add.s(1), add.s(2)), tsum.s()).apply_async(app=app), 3),
    ("group | step is a chord", lambda app: (group(add.s(1), add.s(2)) | tsum.s())
     .apply_async(app=app), 3),
    (".si ignores its parent", lambda app: (add.s(1, 2) | add.si(5, 5) | add.s(1))
     .apply_async(app=app), 11),
    ("partial args: the parent's result first", lambda app: (add.s(10) | sub.s(3))
     .apply_async(app=app), 7),
    ("chain.apply_async(args, kwargs) to the first step", lambda app: (add.s() | sub.s(3))
     .apply_async(args=(5,), kwargs={"y": 1}, app=app), 3),
    ("group of chains", lambda app: group(add.s(1, 1) | add.s(10), add.s(2, 2) | add.s(20))
     .apply_async(app=app), [12, 24]),
    ("group of chains into a chord", lambda app: chord(
        [add.s(1, 1) | add.s(10), add.s(2, 2) | add.s(20) | sub.s(4)], tsum.s())
     .apply_async(app=app), 12 + 20),
    ("group | group: each member gets the list", lambda app: (
        group(add.s(1, 1), add.s(2, 2)) | group(tsum.s(), ident.s())).apply_async(app=app),
     [6, [2, 4]]),
    ("chain and chord in a chord's header", lambda app: chord(
        [chord([add.s(1, 1), add.s(2, 2)], tsum.s()), add.s(3, 3) | add.s(1)], ident.s())
     .apply_async(app=app), [6, 7]),
    ("nested chords", lambda app: chord(
        [chord([add.s(1, 1), add.s(2, 2)], tsum.s()), chord([add.s(3, 3)], tsum.s())],
        tsum.s() | add.s(100)).apply_async(app=app), 112),
    ("a group in a group is unrolled, as Celery's", lambda app: group(
        add.s(1, 1), group(add.s(2, 2), add.s(3, 3) | add.s(1))).apply_async(app=app),
     [2, 4, 7]),
    ("a member chain ending in a group gives its list", lambda app: group(
        add.s(1, 1), add.s(2, 2) | group(add.s(10), add.s(20))).apply_async(app=app),
     [2, [14, 24]]),
    ("nested lists collected", lambda app: (
        group(add.s(3), add.s(1) | group(add.s(1), add.s(2)) | group(tsum.s(), ident.s()))
        | ident.s()).apply_async(app=app), [3, [5, [2, 3]]]),
    ("a chord whose body is a group", lambda app: chord(
        [add.s(1), add.s(2)], group(tsum.s(), ident.s(), add.si(9))).apply_async(app=app),
     [3, [1, 2], 9]),
    ("a group of one chain: a one-element list", lambda app: (
        group([add.s(1) | add.s(1)]) | ident.s()).apply_async(app=app), [2]),
    ("apply_async((10,)): args to each first step", lambda app: (
        group(add.s(1), add.s(2)) | tsum.s()).on_error(wt.on_error.s())
     .apply_async((10,), app=app), 23),
]


@pytest.mark.parametrize("send,expected", [(s, e) for _, s, e in SHAPES],
                         ids=[n for n, _, _ in SHAPES])
def test_a_shape_gives_celerys_result(app: App, send: Callable[[App], WorkflowHandle],
                                      expected: Any) -> None:
    with start(app) as w:
        h = send(app)
        assert h.get(timeout=30) == expected
        assert h.status() == "done"
        assert {s["state"] for s in h.steps()} == {"done"}
        assert w.stop() == 0
    assert check(app.queue()).ok


def test_a_failing_member_of_a_nested_chord_fails_the_tree_and_releases_link_error(
        app: App) -> None:
    # Given nested chords whose inner member fails (after its retries), a chain beside it
    # held at a gate, and an errback set on the canvas Celery's way
    inner = chord([add.s(1), wt.boom.s(2).set(job_id="deep-boom")], tsum.s().set(job_id="in"))
    slow = wt.gate.s(1, "g").set(job_id="held") | add.s(1).set(job_id="after-held")
    canvas = chord([inner, slow], tsum.s().set(job_id="out")) | add.s(1).set(job_id="last")
    errback = canvas.link_error(wt.on_error.s())
    assert errback.name == "wf.on_error"
    h = canvas.apply_async(app=app)
    with start(app) as w:
        # When the member goes dead: the workflow fails at it
        with pytest.raises(TaskFailed, match="deep-boom") as info:
            h.get(timeout=30)
        assert info.value.job_id == "deep-boom"
        # Then every step still waiting is cancelled (the inner and outer callbacks, the
        # last step, the chain's step behind the gate), the errback runs once with its id
        assert app.client.blpop([f"wt:{app.settings.queue}:errors"], timeout=30)[1] \
            == "deep-boom"
        states = {s["id"]: s["state"] for s in h.steps()}
        assert states["deep-boom"] == "dead"
        for waiting in ("in", "out", "last", "after-held"):
            assert states[waiting] == "cancelled", states
        app.client.rpush(f"wt:{app.settings.queue}:open:g", "1")
        assert h.status() == "failed"
        assert w.stop() == 0
    assert app.queue().status("after-held") == "cancelled"
    assert int(app.client.hget(f"wt:{app.settings.queue}:tasks", "on_error") or 0) == 1
    assert int(app.client.hget(f"wt:{app.settings.queue}:tasks", "tsum") or 0) == 0


def test_the_bounds_hold_on_a_tree_and_a_refused_tree_writes_nothing(app: App) -> None:
    q = app.queue()
    # more than MAX_STEPS steps, as a group of chains: refused before a row is built
    pairs = MAX_STEPS // 2 + 1
    with pytest.raises(WorkflowTooLarge, match=f"{2 * pairs} steps"):
        group([add.s(i) | add.s(1) for i in range(pairs)]).apply_async(app=app)
    # nested deeper than MAX_DEPTH: refused before anything recurses over it
    deep: Any = add.s(0)
    for _ in range(MAX_DEPTH + 1):
        deep = chord([deep, add.s(1)], tsum.s())
    with pytest.raises(WorkflowTooLarge, match="levels deep"):
        deep.apply_async(app=app)
    # a collected tree whose declared results exceed the payload limit
    with pytest.raises(WorkflowTooLarge):
        chord([group([add.s(i).set(result_bytes=60_000) for i in range(20)]),
               add.s(1) | add.s(2)], tsum.s()).apply_async(app=app)
    # an empty group deep in a tree, an unknown task at the end of a chain in a header
    with pytest.raises(EmptyGroup):
        chord([add.s(1), add.s(2) | group()], tsum.s()).apply_async(app=app)
    with pytest.raises(UnknownTask):
        chord([add.s(1), add.s(2) | app.signature("no.such")], tsum.s()).apply_async(app=app)
    # an errback on a step inside the tree: one errback serves the whole workflow
    inner = add.s(2)
    inner.link_error(wt.on_error.s())
    with pytest.raises(WorkflowError, match="link_error"):
        (add.s(1) | inner).apply_async(app=app)
    assert count_keys(q) == 0
    # a deep step's id that exists, and a deep ready step into a full lane: the server
    # refuses the whole tree, the existing rows untouched
    app.send_task(add, (1,), job_id="taken")
    app.set_group_max_size("capped", 1)
    app.send_task(add, (0,), group="capped")
    before = count_keys(q)
    with pytest.raises(WorkflowError, match="taken"):
        chord([add.s(1), group(add.s(2), add.s(3) | add.s(4).set(job_id="taken"))],
              tsum.s()).apply_async(app=app)
    with pytest.raises(LaneFull):
        (group(add.s(1), group(add.s(2), add.s(3).set(group="capped"))) | tsum.s()) \
            .apply_async(app=app)
    assert count_keys(q) == before
    assert q.status("taken") == "pending"


def test_rows_of_the_shapes_before_trees_keep_their_form(app: App) -> None:
    """Rows keep the form they had before trees (`next`: ids, one `slot`), so a worker of
    the previous release hands over what it knew during a rolling deploy; a step after a
    value of nested lists holds its `shape`, the workflow's hash its own."""
    q = app.queue()
    chord([add.s(1).set(job_id="m0"), add.s(2).set(job_id="m1")],
          tsum.s().set(job_id="cb")).apply_async(app=app)
    assert app.client.hmget(q.keys.job("m1"), "next", "slot") == ["cb", "1"]
    (add.s(1).set(job_id="a") | group(add.s(2).set(job_id="b"), add.s(3).set(job_id="c"))) \
        .apply_async(app=app)
    assert app.client.hmget(q.keys.job("a"), "next", "slot") == ["b c", None]
    (group(add.s(1).set(job_id="x"), add.s(2).set(job_id="y"))
     | group(tsum.s().set(job_id="t1"), group(ident.s().set(job_id="t2")))).apply_async(app=app)
    assert app.client.hmget(q.keys.job("y"), "next", "slot") == ["t1 t2", "1"]
    (group(add.s(1).set(job_id="u"), add.s(2)) | group(tsum.s().set(job_id="v"))) \
        .apply_async(app=app)
    assert app.client.hmget(q.keys.job("u"), "next", "slot") == ["v", "0"]
    (group(add.s(1) | group(add.s(1).set(job_id="g0"), add.s(2).set(job_id="g1")), add.s(3))
     | ident.s().set(job_id="col")).apply_async(app=app)
    assert app.client.hmget(q.keys.job("col"), "nslots", "shape") == ["3", "[[#,#],#]"]
    assert app.client.hmget(q.keys.job("g1"), "next", "slot") == ["col", "1"]
    h = group(add.s(1), add.s(2) | group(add.s(3), add.s(4))).apply_async(app=app)
    assert app.client.hget(q.keys.workflow(h.id), "shape") == "[#,[#,#]]"
    flat = group(add.s(1), group(add.s(2), add.s(3))).apply_async(app=app)   # unrolled
    assert app.client.hmget(q.keys.workflow(flat.id), "kind", "shape") == ["group", None]

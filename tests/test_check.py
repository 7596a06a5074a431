"""The invariant checker finds what is broken, and repair mends what a restart can break."""

from __future__ import annotations

from emqtasks import App
from emqtasks.ops.check import check, repair


def _setup(app: App):  # type: ignore[no-untyped-def]
    @app.task(name="chk.t", group=lambda tenant, n: tenant)
    def t(tenant: str, n: int) -> None: ...

    t.map([("acme", i) for i in range(3)] + [("globex", 1)])
    return app.queue()


def test_a_healthy_queue_has_no_violation(app: App) -> None:
    q = _setup(app)
    q.claim(2)
    report = check(q)
    assert report.ok, report.violations
    assert report.jobs == 4 and report.groups == 2


def test_lost_books_are_reported_and_repaired(app: App) -> None:
    q = _setup(app)
    q.claim(1)   # acme's first job in flight
    # Given a restart that lost the ring and the in-flight books
    app.client.delete(q.keys.ring, q.keys.gactive)
    report = check(q)
    assert not report.ok
    assert any("gactive of acme" in v for v in report.violations)
    assert any("serviceable but not on the ring" in v for v in report.violations)
    # When repaired, Then the queue is whole and claims serve both groups again
    repair(q)
    assert check(q).ok, check(q).violations
    assert {lease.group for lease in q.claim(2)} == {"acme", "globex"}


def test_a_lost_lane_is_restored_and_its_group_rejoins_the_ring(app: App) -> None:
    # Given a restart that lost a lane key (and the ring) but kept the job rows
    q = _setup(app)
    app.client.delete(q.keys.lane("acme"), q.keys.ring)
    assert any("lost" in v for v in check(q).violations)
    # When repaired
    restored = repair(q).restored
    # Then the jobs are back in their lane, and the group is on the ring to be claimed
    assert restored == 3
    assert check(q).ok, check(q).violations
    groups = [lease.group for lease in q.claim(4)]
    assert groups.count("acme") == 3 and groups.count("globex") == 1

"""The invariant checker finds what is broken, and repair mends what a restart can break."""

from __future__ import annotations

from click.testing import CliRunner

from emqtasks import App
from emqtasks.cli import main
from emqtasks.ops.check import check, repair
from emqtasks.verdicts import AbortAsk, AbortedVerdict


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


def test_stale_abort_lists_are_reported_and_deleted(path_app: App) -> None:
    # Given two masters in the queue's index: one alive (its heartbeat is there), one gone
    # (only its index entry is left: abort.lua still pushes to it until a reader drops it)
    app = path_app
    q = _setup(app)
    alive, gone = "host:2:2", "host:1:1"
    app.client.set(q.keys.worker(alive), "{}", px=60_000)
    app.client.hset(q.keys.workers, mapping={alive: "1", gone: "1"})
    lease = q.claim(1)[0]
    # When the running job is aborted: a token on both masters' lists
    assert q.abort_ask(lease.id) == AbortAsk.ASKED
    token = f"{lease.id} {lease.nonce}"
    assert app.client.lrange(q.keys.aborts(gone), 0, -1) == [token]
    # Then the gone master's list is stale; the live one's token aims at a running attempt
    report = check(q)
    assert report.ok, report.violations   # a note, not a violation: the lists expire
    assert report.dead_abort_lists == {gone}
    assert report.stale_aborts == {gone: [token]}
    # and once the attempt is over, its token on the live master's list is stale too
    assert q.abort_end(lease, "Aborted: by the test") == AbortedVerdict.ABORTED
    assert check(q).stale_aborts == {gone: [token], alive: [token]}
    out = CliRunner().invoke(main, ["check", "--redis-url", app.settings.redis_url,
                                    "-Q", app.settings.queue])
    assert "note: 2 abort tokens no master will act on (1 lists" in out.output, out.output
    # When repaired, Then both are deleted, and the live master's heartbeat is untouched
    assert repair(q).aborts_dropped == 2
    assert not app.client.exists(q.keys.aborts(gone), q.keys.aborts(alive))
    assert app.client.exists(q.keys.worker(alive))
    report = check(q)
    assert report.ok and report.stale_aborts == {} and report.dead_abort_lists == set()


def test_repair_keeps_the_abort_list_of_a_master_that_came_back(path_app: App) -> None:
    # Given a master's list read while its heartbeat was gone, and the master beating again
    # before the repair: the list is its own again (fenced), nothing is dropped
    app = path_app
    q = _setup(app)
    wid = "host:3:3"
    app.client.rpush(q.keys.aborts(wid), "x y")
    assert check(q).dead_abort_lists == {wid}
    app.client.set(q.keys.worker(wid), "{}", px=60_000)
    assert q.drop_aborts(wid, ["x y"], whole=True) == 0
    assert app.client.lrange(q.keys.aborts(wid), 0, -1) == ["x y"]

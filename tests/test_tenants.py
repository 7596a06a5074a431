"""Two-level lanes: fair between tenants, then between each tenant's groups (issue 30).

Each test runs on the scripts and on the module (path_app). The claims are driven by hand
with 4 jobs in flight (a worker of -c 4 without its timing noise): claim until 4 are
leased, ack the oldest, again. The flood measurement prints its figures (pytest -s).
"""

from __future__ import annotations

import random
import subprocess
import tempfile
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from workerproc import WorkerProc

from emqtasks import App, InvalidArgument, InvalidGroup
from emqtasks.cli import main
from emqtasks.ops.check import check, repair
from emqtasks.store.keys import TENANT_MARK, QueueKeys
from emqtasks.store.queue import NewJob, Queue
from emqtasks.store.scripts import compose
from emqtasks.verdicts import EnqueueVerdict

pytestmark = pytest.mark.timeout(180)


def _job(job_id: str, group: str, tenant: str | None = None) -> tuple[NewJob, str | None]:
    return NewJob(job_id, "t.noop", "{}", group, 1, 60_000, 0, 60), tenant


def _send(q: Queue, jobs: list[tuple[NewJob, str | None]]) -> list[EnqueueVerdict]:
    return q.enqueue_many([j for j, _ in jobs], None, [t for _, t in jobs])


def _run(q: Queue, claims: int, concurrency: int = 4) -> list[tuple[str, str]]:
    """(id, group) of each claim, in order, with `concurrency` jobs in flight: up to
    `claims` claims or until nothing is serviceable."""
    flight: deque[Any] = deque()
    order: list[tuple[str, str]] = []
    while len(order) < claims:
        while len(flight) < concurrency and len(order) < claims:
            got = q.claim(1)
            if not got:
                break
            flight.append(got[0])
            order.append((got[0].id, got[0].group))
        if not flight:
            break
        q.ack(flight.popleft())
    return order


def _jain(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 1.0


def _flood(q: Queue, tenants: bool) -> dict[str, float]:
    """A spreads 10,000 jobs over 1,000 groups; then B sends 10 jobs in one group. Returns
    the claim (1-based, after B's arrival) at which B's last job started, and the Jain
    index of the first 20 claims after B's arrival (A and B both backlogged)."""
    a = [_job(f"a-{i}", f"user-{i % 1000}", "A" if tenants else None) for i in range(10_000)]
    _send(q, a)
    warm = _run(q, 100)                      # the workers are busy with A when B arrives
    assert len(warm) == 100
    _send(q, [_job(f"b-{i}", "b-user", "B" if tenants else None) for i in range(10)])
    order = _run(q, 12_000)
    at = [n + 1 for n, (job_id, _) in enumerate(order) if job_id.startswith("b-")]
    assert len(at) == 10
    first = order[:20]
    b_share = sum(1 for job_id, _ in first if job_id.startswith("b-"))
    return {"last_b": at[-1], "first_b": at[0], "jain": _jain([20 - b_share, b_share])}


def test_a_tenant_spreading_over_many_groups_gets_one_turn(path_app: App) -> None:
    # Given A's 10,000 jobs over 1,000 groups and B's 10 in one group behind them, -c 4
    two = _flood(path_app.queue(), tenants=True)
    path_app.purge()
    flat = _flood(path_app.queue(), tenants=False)
    print(f"\nflood, B's 10 jobs: two-level lanes: all started within {two['last_b']} claims "
          f"(Jain {two['jain']:.2f}); groups only: first at {flat['first_b']}, last at "
          f"{flat['last_b']} (Jain {flat['jain']:.2f})")
    # Then with tenants B's jobs all start within the first 30 claims after they arrive
    assert two["last_b"] <= 30
    assert two["jain"] > 0.99
    # and without them B waits a turn of 1,000 groups per job
    assert flat["first_b"] > 500 and flat["last_b"] > 5_000


def _shares(q: Queue, claims: int) -> tuple[int, int]:
    _send(q, [_job(f"a-{i}", f"a-{i % 100}", "A") for i in range(claims)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(claims)])
    order = _run(q, claims)
    a = sum(1 for job_id, _ in order if job_id.startswith("a-"))
    return a, len(order) - a


def test_equal_weights_share_claims_one_to_one_and_weight_three_three_to_one(
        path_app: App) -> None:
    a, b = _shares(path_app.queue(), 2_000)
    print(f"\nequal weights, 2,000 claims: A {a} B {b}")
    assert abs(a / b - 1) <= 0.05
    path_app.purge()
    path_app.set_tenant_weight("A", 3)
    a, b = _shares(path_app.queue(), 2_000)
    print(f"A weight 3, 2,000 claims: A {a} B {b}")
    assert abs(a / b / 3 - 1) <= 0.05
    # and the history shows it: shares against the entitled ones, Jain's index
    seen = path_app.tenant_shares(minutes=2)
    assert {t: v["claims"] for t, v in seen["tenants"].items()} == {"A": 1500, "B": 500}
    assert seen["tenants"]["A"]["entitled"] == 0.75 and seen["tenants"]["A"]["share"] == 0.75
    assert max(j for _, j in seen["jain"] if j is not None) > 0.99


def test_a_tenant_at_its_limit_leaves_the_ring_and_a_completion_returns_it(
        path_app: App) -> None:
    q = path_app.queue()
    path_app.set_tenant_limit("A", 2)
    _send(q, [_job(f"a-{i}", f"a-{i % 3}", "A") for i in range(9)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(9)])
    leases = q.claim(8)
    tenants = [lease.id[0] for lease in leases]
    assert tenants.count("a") == 2                   # its limit, over all its groups
    info = path_app.tenant("A")
    assert info["active"] == 2 and not info["on_ring"]
    assert info["waits"] == "at its limit: 2 of 2 jobs in flight"
    path_app.client.delete(q.keys.wake)
    q.ack(next(lease for lease in leases if lease.id.startswith("a-")))
    assert path_app.client.lrange(q.keys.wake, 0, -1) == ["1"]   # a wake: A is back
    assert path_app.tenant("A")["on_ring"]
    assert sorted(lease.id[0] for lease in q.claim(2)) == ["a", "b"]   # A's turn again
    # raising the limit frees it at once; clearing it too
    path_app.set_tenant_limit("A", None)
    assert path_app.tenant("A")["on_ring"]


def test_the_command_line_sets_and_explains_a_tenant(path_app: App) -> None:
    q = path_app.queue()
    _send(q, [_job(f"a-{i}", f"a-{i % 2}", "A") for i in range(4)])
    url, name = path_app.settings.redis_url, path_app.settings.queue

    def cli(*args: str) -> str:
        out = CliRunner().invoke(main, [*args, "--redis-url", url, "--queue", name])
        assert out.exit_code == 0, out.output
        return out.output

    assert cli("limit", "--tenant", "A", "1") == "limit of tenant A set to 1\n"
    assert cli("weight", "--tenant", "A", "2") == "weight of tenant A set to 2\n"
    q.claim(1)
    shown = cli("tenant", "A")
    assert shown.startswith("tenant A: waits: at its limit: 1 of 1 jobs in flight\n"), shown
    assert "2 groups, 3 jobs waiting, 1 in flight" in shown
    assert "tenant_at_limit" in cli("lane", "a-1")
    assert cli("pause", "--tenant", "A") == "paused tenant A\n"
    assert cli("limit", "--tenant", "A", "none") == "limit of tenant A cleared\n"
    assert "waits: paused" in cli("tenant", "A")
    assert cli("resume", "--tenant", "A") == "resumed tenant A\n"
    assert cli("limit", "a-1", "3") == "limit of group a-1 set to 3\n"
    assert "tenant limit:     2" in cli("defaults", "--tenant-limit", "2")
    assert "tenant limit" not in cli("defaults", "--tenant-limit", "none")
    bad = CliRunner().invoke(main, ["limit", "--tenant", "A", "0", "--redis-url", url])
    assert bad.exit_code == 2 and "limit" in bad.output


def test_defaults_for_every_tenant_and_a_tenants_own_setting_wins(path_app: App) -> None:
    q = path_app.queue()
    _send(q, [_job(f"{t}-{i}", f"{t}-{i % 2}", t.upper()) for t in "abc" for i in range(4)])
    path_app.set_tenant_defaults(limit=1, weight=2)
    path_app.set_tenant_limit("C", 3)                 # its own wins over the default
    assert path_app.tenant_defaults() == {"limit": 1, "weight": 2}
    leases = q.claim(20)
    assert sorted(lease.id[0] for lease in leases) == ["a", "b", "c", "c", "c"]
    assert path_app.tenant("A")["waits"] == "at its limit: 1 of 1 jobs in flight"
    assert path_app.tenant("B")["weight"] == 2
    seen = path_app.stats()["tenants"]
    assert {t: (v["groups"], v["pending"], v["active"], v["limit"], v["weight"], v["state"])
            for t, v in seen.items()} == {"A": (2, 3, 1, 1, 2, "at_limit"),
                                          "B": (2, 3, 1, 1, 2, "at_limit"),
                                          "C": (2, 1, 3, 3, 2, "at_limit")}
    assert path_app.stats()["groups"]["a-0"]["tenant"] == "A"
    path_app.clear_tenant_defaults("limit")           # every tenant at the default opens
    assert sorted(lease.id[0] for lease in q.claim(20)).count("a") == 3
    with pytest.raises(InvalidArgument):
        path_app.set_tenant_defaults(limit=0)
    assert path_app.tenant_defaults() == {"weight": 2}
    assert check(q).ok


def test_a_paused_tenant_keeps_its_backlog_and_runs_again_on_resume(path_app: App) -> None:
    q = path_app.queue()
    _send(q, [_job(f"a-{i}", f"a-{i % 2}", "A") for i in range(4)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(4)])
    assert path_app.pause_tenant("A") and not path_app.pause_tenant("A")
    assert path_app.tenant("A")["waits"] == "paused (resume_tenant)"
    assert {lease.id[0] for lease in q.claim(10)} == {"b"}
    assert path_app.resume_tenant("A")
    assert sorted(lease.id for lease in q.claim(10)) == ["a-0", "a-1", "a-2", "a-3"]


def test_a_busy_group_refuses_a_second_tenant_with_nothing_written(path_app: App) -> None:
    @path_app.task(name="tests.tenants.report", group=lambda user, org: user,
                   tenant=lambda user, org: org)
    def report(user: str, org: str) -> None: ...

    h = report.delay("ann", "acme")
    q = path_app.queue()
    assert path_app.client.hget(q.keys.gtenant, "ann") == "acme"
    report.map([("bob", "acme")])
    assert path_app.client.hget(q.keys.gtenant, "bob") == "acme"
    # Then another tenant for the busy group is refused, nothing written
    with pytest.raises(InvalidGroup, match="another tenant"):
        report.apply_async(("ann", "globex"), job_id="refused")
    with pytest.raises(InvalidGroup, match="another tenant"):
        report.apply_async(("ann", "acme"), job_id="refused", tenant="globex")
    assert path_app.queue().status("refused") is None
    assert path_app.client.zcard(q.keys.lane("ann")) == 1
    # no tenant at all is a tenant of its own: refused too
    assert _send(q, [_job("none", "ann")]) == [EnqueueVerdict.TENANT]
    # Once the group is empty (nothing waiting, nothing in flight) it may change tenant
    lease = q.claim(1)[0]
    assert lease.id == h.id
    assert _send(q, [_job("x", "ann", "globex")]) == [EnqueueVerdict.TENANT]
    q.ack(lease)
    report.apply_async(("ann", "globex"), job_id="moved")
    assert path_app.client.hget(q.keys.gtenant, "ann") == "globex"
    # a job refused for its lane's cap (0 here) moves no group either
    path_app.set_group_max_size("zero", 0)
    assert _send(q, [_job("z", "zero", "acme")]) == [EnqueueVerdict.FULL]
    assert path_app.client.hget(q.keys.gtenant, "zero") is None
    # bad input, refused before anything is sent
    with pytest.raises(InvalidGroup):
        report.apply_async(("ann", "acme"), tenant="")
    with pytest.raises(InvalidArgument):
        path_app.set_tenant_weight("acme", 0)
    with pytest.raises(InvalidArgument):
        path_app.set_tenant_limit("acme", -1)
    assert not path_app.client.exists(q.keys.tweight, q.keys.tlimit)


def test_the_checker_and_repair_know_the_tenants_books(path_app: App) -> None:
    q = path_app.queue()
    _send(q, [_job(f"a-{i}", f"a-{i % 3}", "A") for i in range(6)])
    _send(q, [_job(f"c-{i}", "c") for i in range(2)])
    path_app.set_tenant_limit("A", 5)
    q.claim(2)
    assert check(q).ok
    # the derived books lost (a server restart without full persistence): repair rebuilds
    path_app.client.delete(q.keys.ring, q.keys.tenant_ring("A"), q.keys.tactive)
    report = check(q)
    assert not report.ok
    repair(q)
    assert check(q).ok
    assert path_app.client.hget(q.keys.tactive, "A") is not None
    left = _run(q, 100)
    assert len(left) == 6


def test_time_mode_serves_a_tenants_groups_and_turns_mode_takes_them_back(
        path_app: App) -> None:
    q = path_app.queue()
    _send(q, [_job(f"a-{i}", f"a-{i % 3}", "A") for i in range(6)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(2)])
    assert path_app.set_fairness("time") == 4
    assert path_app.client.llen(q.keys.ring) == 0
    assert path_app.set_fairness("turns") == 4
    assert path_app.client.lrange(q.keys.ring, 0, -1) == [TENANT_MARK + "A", TENANT_MARK + "B"]
    assert len(_run(q, 100)) == 8


def test_time_mode_shares_between_tenants_first_then_their_groups(path_app: App) -> None:
    # Given a time-fair queue: tenant A spreads its jobs over 100 groups, B keeps one group
    path_app.set_fairness("time")
    q = path_app.queue()
    _send(q, [_job(f"a-{i}", f"a-{i % 100}", "A") for i in range(1_000)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(1_000)])
    # When 400 jobs (equally short) run, 4 at a time
    order = _run(q, 400)
    # Then each tenant had about half of them (flat, A's 100 groups would have had 100 of
    # 101; the charges are the jobs' real run times, so a loaded machine's noise moves the
    # split by a few claims), and A's groups shared A's half
    a = sum(1 for job_id, _ in order if job_id.startswith("a-"))
    assert abs(a / (400 - a) - 1) <= 0.25, a
    assert len({g for _, g in order if g.startswith("a-")}) == 100
    # and the marks stand in `gvt`, the groups in their tenants' own zsets (a group whose
    # runs took next to nothing may have been served until its lane emptied: it left)
    assert sorted(path_app.client.zrange(q.keys.gvt, 0, -1)) == [TENANT_MARK + "A",
                                                                  TENANT_MARK + "B"]
    assert 90 <= path_app.client.zcard(q.keys.tenant_gvt("A")) <= 100
    assert check(q).ok


def test_time_mode_keeps_a_tenants_limit_and_pause(path_app: App) -> None:
    path_app.set_fairness("time")
    q = path_app.queue()
    path_app.set_tenant_limit("A", 2)
    _send(q, [_job(f"a-{i}", f"a-{i % 3}", "A") for i in range(9)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(9)])
    leases = q.claim(8)
    assert [lease.id[0] for lease in leases].count("a") == 2     # its limit, over its groups
    info = path_app.tenant("A")
    assert not info["on_ring"] and info["waits"] == "at its limit: 2 of 2 jobs in flight"
    assert check(q).ok
    path_app.client.delete(q.keys.wake)
    q.ack(next(lease for lease in leases if lease.id.startswith("a-")))
    assert path_app.client.lrange(q.keys.wake, 0, -1) == ["1"]   # a wake: A is back
    assert path_app.tenant("A")["on_ring"]
    assert [lease.id[0] for lease in q.claim(2)].count("a") == 1
    # a pause holds all its groups back, a resume returns them
    path_app.set_tenant_limit("A", None)
    assert path_app.pause_tenant("A")
    assert path_app.tenant("A")["waits"] == "paused (resume_tenant)"
    assert {lease.id[0] for lease in q.claim(10)} == {"b"}
    assert check(q).ok
    assert path_app.resume_tenant("A")
    assert {lease.id[0] for lease in q.claim(10)} == {"a"}
    assert check(q).ok


def test_a_live_worker_serves_a_quiet_tenant_behind_a_spread_flood(app: App) -> None:
    # Given tenant A's 600 jobs over 200 groups, then tenant B's 5 jobs in one group
    app.pause()
    for i in range(600):
        app.send_task("f.tick", (f"a{i % 200}", f"a-{i}"), job_id=f"a-{i}", group=f"a{i % 200}",
                      tenant="A")
    for i in range(5):
        app.send_task("f.tick", ("b", f"b-{i}"), job_id=f"b-{i}", group="b", tenant="B")
    # When a worker of 4 children drains the queue
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=4,
                    modules=("fairness_tasks",), tick=0.5) as w:
        w.wait_ready()
        app.resume()
        w.wait_for(lambda: all(app.queue().status(f"b-{i}") == "done" for i in range(5)),
                   30, "tenant B's jobs")
        w.wait_for(lambda: app.stats()["pending"] == 0, 60, "the flood")
    # Then B's jobs started among the first claims, one turn in two
    started = sorted((int(app.job(f"a-{i}")["started"]), f"a-{i}") for i in range(600))
    started += [(int(app.job(f"b-{i}")["started"]), f"b-{i}") for i in range(5)]
    order = [job for _, job in sorted(started)]
    last_b = max(order.index(f"b-{i}") for i in range(5)) + 1
    assert last_b <= 20, order[:30]


# -- a queue that never names a tenant: the same claims and replies as before ------------

def _previous_lua() -> Path:
    """The Lua sources of the commit this branch started from (git merge-base with main)."""
    root = Path(__file__).resolve().parents[1]
    base = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=root, capture_output=True,
                          text=True, check=True).stdout.strip()
    out = Path(tempfile.mkdtemp(prefix="emq-prev-lua-"))
    tar = subprocess.run(["git", "archive", base, "lua"], cwd=root, capture_output=True,
                         check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out / "lua"


def test_a_queue_without_tenants_claims_as_before(app: App) -> None:
    # Given the same seeded workload (enqueues, claims, acks, weights, limits, pauses) sent
    # to the previous release's scripts on one queue and this release's on another
    try:
        prev = _previous_lua()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("no git history to take the previous scripts from")
    now = Path(__file__).resolve().parents[1] / "lua"
    c = app.client
    replies: dict[str, list[Any]] = {}
    for side, folder in (("prev", prev), ("now", now)):
        keys = QueueKeys(f"{app.settings.queue}-{side}")
        texts = {v: compose(folder, v) for v in ("enqueue", "claim", "ack", "weight", "limit",
                                                 "pause_group", "release")}
        rnd = random.Random(30)
        held: list[Any] = []
        out: list[Any] = []

        def call(verb: str, *args: Any, keys: QueueKeys = keys,
                 texts: dict[str, str] = texts) -> Any:
            return c.eval(texts[verb], len(keys.fixed), *keys.fixed, *args)

        for step in range(3_000):
            r = rnd.random()
            g = f"g{rnd.randrange(40)}"
            if r < 0.35:
                n = rnd.randrange(1, 4)
                args: list[Any] = [n]
                for i in range(n):
                    args += [f"j{step}-{i}", "t", "{}", g, 3, 60_000, 0, 60, 0,
                             rnd.choice((0, 0, 0, 5, -5))]
                out.append(call("enqueue", *args))
            elif r < 0.65:
                got = call("claim", rnd.randrange(1, 4), f"n{step}")
                held += got
                out.append([row[:4] + row[5:] for row in got])
            elif r < 0.85 and held:
                row = held.pop(rnd.randrange(len(held)))
                out.append(call("ack", row[0], row[3], row[4], "null",
                                f"n{step}" if rnd.random() < 0.5 else ""))
            elif r < 0.9 and held:
                row = held.pop(rnd.randrange(len(held)))
                out.append(call("release", row[0], row[3], row[4], "r", 0))
            elif r < 0.95:
                out.append(call("weight", g, rnd.choice(("", "1", "2", "3"))))
            elif r < 0.98:
                out.append(call("limit", g, rnd.choice(("", "1", "2"))))
            else:
                out.append(call("pause_group", g, rnd.choice(("0", "1"))))
        replies[side] = out
        for k in c.scan_iter(match=keys.base + "*"):
            c.delete(k)
    # Then every reply matches, claim by claim (the leases' order included)
    assert len(replies["now"]) == len(replies["prev"])
    for n, (a, b) in enumerate(zip(replies["prev"], replies["now"])):
        assert a == b, f"step {n}: {a!r} != {b!r}"


def test_a_queue_without_tenants_claims_as_before_in_time_mode(app: App) -> None:
    # Given the same seeded workload in time mode sent to the previous release's scripts and
    # this release's, with a clock of the test's own (the scripts' TIME replaced by a key the
    # test advances: a job's run time, hence its charge, is the same on both sides)
    try:
        prev = _previous_lua()
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("no git history to take the previous scripts from")
    now = Path(__file__).resolve().parents[1] / "lua"
    c = app.client
    clock = f"{app.settings.queue}-clock"
    fake = f"{{string.match(redis.call('GET', '{clock}'), '(%d+) (%d+)')}}"
    replies: dict[str, list[Any]] = {}
    for side, folder in (("prev", prev), ("now", now)):
        keys = QueueKeys(f"{app.settings.queue}-{side}")
        texts = {v: compose(folder, v).replace("redis.call('TIME')", fake)
                 for v in ("enqueue", "claim", "ack", "weight", "limit", "pause_group",
                           "release", "retry", "fairness")}
        assert all(fake in texts[v] for v in ("enqueue", "claim", "ack", "release", "retry"))
        rnd = random.Random(31)
        held: list[Any] = []
        out: list[Any] = []
        ms = 1_700_000_000_000

        def call(verb: str, *args: Any, keys: QueueKeys = keys,
                 texts: dict[str, str] = texts) -> Any:
            return c.eval(texts[verb], len(keys.fixed), *keys.fixed, *args)

        c.set(clock, f"{ms // 1000} {ms % 1000 * 1000}")
        out.append(call("fairness", "time"))
        for step in range(1_200):
            ms += rnd.choice((0, 1, 1, 2, 5, 20, 100))
            c.set(clock, f"{ms // 1000} {ms % 1000 * 1000}")
            r = rnd.random()
            g = f"g{rnd.randrange(30)}"
            if r < 0.35:
                n = rnd.randrange(1, 4)
                args: list[Any] = [n]
                for i in range(n):
                    args += [f"j{step}-{i}", "t", "{}", g, 3, 60_000, 0, 60, 0,
                             rnd.choice((0, 0, 0, 5, -5))]
                out.append(call("enqueue", *args))
            elif r < 0.65:
                got = call("claim", rnd.randrange(1, 4), f"n{step}")
                held += got
                out.append([row[:4] + row[5:] for row in got])
            elif r < 0.85 and held:
                row = held.pop(rnd.randrange(len(held)))
                out.append(call("ack", row[0], row[3], row[4], "null", ""))
            elif r < 0.88 and held:
                row = held.pop(rnd.randrange(len(held)))
                out.append(call("release", row[0], row[3], row[4], "r", 0))
            elif r < 0.9 and held:
                row = held.pop(rnd.randrange(len(held)))
                out.append(call("retry", row[0], row[3], row[4], "boom", 0, 0))
            elif r < 0.95:
                out.append(call("weight", g, rnd.choice(("", "1", "2", "3"))))
            elif r < 0.98:
                out.append(call("limit", g, rnd.choice(("", "1", "2"))))
            else:
                out.append(call("pause_group", g, rnd.choice(("0", "1"))))
        replies[side] = out
        for k in c.scan_iter(match=keys.base + "*"):
            c.delete(k)
    c.delete(clock)
    # Then every reply matches, claim by claim (the leases' order included)
    assert sum(1 for r in replies["now"] if isinstance(r, list) and r and
               isinstance(r[0], list)) > 150
    assert len(replies["now"]) == len(replies["prev"])
    for n, (a, b) in enumerate(zip(replies["prev"], replies["now"])):
        assert a == b, f"step {n}: {a!r} != {b!r}"


def test_a_tenants_wait_percentiles_and_oldest_job(path_app: App) -> None:
    # Given tenant A's jobs that waited about 2 s (their lane scores moved 2 s back) and
    # 0 s, and tenant B's that waited about 40 s, all claimed
    q, c = path_app.queue(), path_app.client
    _send(q, [_job(f"a-{i}", f"a-{i % 2}", "A") for i in range(8)])
    _send(q, [_job(f"b-{i}", "b", "B") for i in range(3)])
    secs, micros = c.time()
    now = int(secs) * 1000 + int(micros) // 1000
    for i in range(6):
        c.zadd(q.keys.lane(f"a-{i % 2}"), {f"a-{i}": now - 2_000}, xx=True)
    for i in range(3):
        c.zadd(q.keys.lane("b"), {f"b-{i}": now - 40_000}, xx=True)
    assert len(q.claim(10)) == 10                   # one of A's jobs stays waiting
    # Then App.tenant gives its wait p50 / p95 / p99 over 1, 5 and 60 minutes: the bulk of
    # A's starts in the 1-2.5 s bucket, B's in the 30-60 s one; and its oldest job's age
    a = path_app.tenant("A")
    assert set(a["wait"]) == {"1m", "5m", "60m"}
    one = a["wait"]["1m"]
    assert one["starts"] == 7 and 1_000 <= one["p50_ms"] <= 2_500, one
    assert one["p99_ms"] is not None and one["p99_ms"] <= 2_500
    assert a["wait"]["60m"]["starts"] == 7
    assert a["oldest_age"] is not None and a["oldest_age"] >= 0
    b = path_app.tenant("B")
    assert 30_000 <= b["wait"]["5m"]["p50_ms"] <= 60_000 and b["oldest_age"] is None
    # stats() has them per tenant, the command line says them
    assert path_app.stats()["tenants"]["B"]["wait"]["1m"]["starts"] == 3
    out = CliRunner().invoke(main, ["tenant", "A", "--redis-url", path_app.settings.redis_url,
                                    "--queue", path_app.settings.queue])
    assert out.exit_code == 0 and "wait  1m:  p50 " in out.output and "(7 starts)" in out.output
    assert "oldest:" in out.output, out.output


def test_time_mode_target_share_counts_a_tenant_by_its_weight(path_app: App) -> None:
    # Given a time-fair queue: tenant A of weight 3 (two groups), a group with no tenant
    path_app.set_fairness("time")
    path_app.set_tenant_weight("A", 3)
    q = path_app.queue()
    _send(q, [_job(f"a-{i}", f"a-{i % 2}", "A") for i in range(4)] + [_job("s-0", "solo")])
    # Then the lone group's target is its weight over A's and its own: 1 / (3 + 1)
    assert path_app.lane("solo")["target_share"] == pytest.approx(0.25)
    assert path_app.lane("a-0")["target_share"] is None     # within its tenant: not read

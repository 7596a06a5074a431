"""The dashboard over HTTP: a real server on real data (auth, CSRF, escaping, paging,
dead-letter actions, read-only, /metrics), and `emqtasks dashboard` / `metrics`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from dashsrv import DashServer
from helpers import make_task

from emqtasks import App
from emqtasks.observe.lanes import lane as lane_view
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(120)
HOSTILE = '<img src=x onerror="alert(1)">'


def _dead(app: App, queue: Queue, errors: list[str], group: str = "g") -> list[str]:
    t = make_task(app, name="t.dead", group=group)
    ids = [t.delay(i).id for i in range(len(errors))]
    for error in errors:
        (lease,) = queue.claim()
        queue.retry(lease, error, 0, True)
    return ids


def test_a_token_is_required_on_every_request(queue: Queue) -> None:
    with DashServer([queue], token="s3cret") as d:
        for path in ("/", "/lanes", "/metrics", "/events", "/static/app.js", "/dead"):
            status, body, headers = d.request(path)
            assert status == 401, path
            assert 'name="token"' in body and headers.get("WWW-Authenticate")
        assert d.request("/lanes", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert d.request("/lanes", headers={"Authorization": "Bearer s3cret"})[0] == 200
        assert d.request("/metrics", headers={"Authorization": "Bearer s3cret"})[0] == 200
        # People: the login form sets a cookie
        status, body, _ = d.request("/login", {"token": "wrong"})
        assert status == 401 and "wrong token" in body
        status, _, headers = d.request("/login", {"token": "s3cret", "next": "/lanes"})
        assert status == 303 and headers["Location"] == "/lanes"
        cookie = headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert d.request("/lanes", headers={"Cookie": cookie.split(";")[0]})[0] == 200


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(app: App,
                                                                      queue: Queue) -> None:
    make_task(app, group="acme").delay(1)
    with DashServer([queue]) as d:
        status, body, _ = d.request("/action/pause", {"group": "acme"})
        assert status == 403 and "CSRF" in body
        assert d.request("/action/pause", {"group": "acme", "csrf": "guess"})[0] == 403
        assert not lane_view(queue, "acme")["paused"]
        status, _, headers = d.request("/action/pause", {"group": "acme", "csrf": d.csrf()})
        assert status == 303 and lane_view(queue, "acme")["paused"]
        d.request("/action/limit", {"group": "acme", "value": "3", "csrf": d.csrf()})
        d.request("/action/weight", {"group": "acme", "value": "2", "csrf": d.csrf()})
        assert (lane_view(queue, "acme")["limit"], lane_view(queue, "acme")["weight"]) == (3, 2)
        assert d.request("/action/limit", {"group": "acme", "value": "x",
                                           "csrf": d.csrf()})[0] == 400


def test_a_hostile_group_name_and_error_text_are_escaped(app: App, queue: Queue) -> None:
    _dead(app, queue, [f"Traceback\n{HOSTILE}</pre><script>alert(2)</script>"], group=HOSTILE)
    make_task(app, name="t.h", group=HOSTILE).delay(1)
    job_id = queue.client.zrange(queue.keys.dead, 0, 0)[0]
    with DashServer([queue]) as d:
        for path in ("/", "/lanes", "/dead", "/jobs?state=pending", f"/job?id={job_id}",
                     "/lanes?fragment=1"):
            status, body, _ = d.request(path)
            assert status == 200, path
            assert "<img src=x" not in body and "<script>alert" not in body, path
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in d.request("/lanes")[1]
        assert "&lt;script&gt;alert(2)" in d.request(f"/job?id={job_id}")[1]


def test_a_workflow_page_shows_its_steps_a_page_at_a_time_and_cancels_them(
        app: App, queue: Queue) -> None:
    from emqtasks import chain, chord
    step = make_task(app, name="t.step")
    line = chain(step.s(1), step.s(2), step.s(3)).apply_async(app=app)
    wide = chord([step.s(i) for i in range(120)], step.s()).apply_async(app=app)
    first = line.steps()[0]["id"]
    with DashServer([queue]) as d:
        # Given a step's job page, Then it links to its workflow
        status, body, _ = d.request(f"/job?id={first}")
        assert status == 200 and f"/workflow?queue={queue.name}&id={line.id}" in body
        # And the workflow's page shows each step, its state and a link to it
        status, body, _ = d.request(f"/workflow?id={line.id}")
        assert status == 200 and 'id="wf-status">running<' in body
        assert body.count('class="step"') == 3 and body.count(">waiting<") == 2
        assert f"/job?queue={queue.name}&id={first}" in body
        # And a 121-step chord is shown 50 steps a page, the last page holding the rest
        assert d.request(f"/workflow?id={wide.id}")[1].count('class="step"') == 50
        last = d.request(f"/workflow?id={wide.id}&page=3")[1]
        assert last.count('class="step"') == 21 and 'id="wf-total">121<' in last
        # When the cancel button is pressed, Then the steps not started are cancelled
        status, _, _ = d.request("/workflow/cancel", {"id": line.id, "csrf": d.csrf()})
        assert status == 303 and line.status() == "cancelled"
        body = d.request(f"/workflow?id={line.id}&done=3")[1]
        assert 'id="done">3 step(s) cancelled' in body
        assert 'id="wf-status">cancelled<' in body and 'id="cancel-workflow"' not in body
        # And bad or unknown ids are a clear refusal
        assert d.request("/workflow?id=no-such-workflow")[0] == 404
        assert d.request("/workflow?id=bad%20id")[0] == 400
        assert d.request("/workflow/cancel", {"id": "bad id", "csrf": d.csrf()})[0] == 400
    assert wide.status() == "running"


def test_lanes_are_paged_sorted_and_filtered_on_the_server(app: App, queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    t.map([(f"tenant{i:03d}", j) for i in range(120) for j in range(i % 3 + 1)])
    with DashServer([queue]) as d:
        body = d.request("/lanes")[1]
        assert body.count('class="lane ') == 50 and "120</span> of 120 groups" in body
        assert "page 1 of 3" in body
        last = d.request("/lanes?page=3")[1]
        assert last.count('class="lane ') == 20
        top = re.findall(r'data-group="([^"]+)"', d.request("/lanes?sort=-pending")[1])
        assert all(int(g[-3:]) % 3 == 2 for g in top[:40])          # the 3-job lanes first
        found = d.request("/lanes?q=tenant11")[1]
        assert found.count('class="lane ') == 10                     # tenant110..119
        assert d.request("/lanes?state=paused")[1].count('class="lane ') == 0


def test_dead_letters_requeue_and_cancel_by_filter_with_a_count(app: App,
                                                                queue: Queue) -> None:
    _dead(app, queue, ["TimeoutError: slow"] * 6 + ["ValueError: bad"] * 4)
    with DashServer([queue]) as d:
        body = d.request("/dead?text=timeout")[1]
        assert "6 match" in body and "requeue all 6 that match" in body
        status, _, headers = d.request("/dead/requeue", {
            "scope": "filter", "text": "timeout", "csrf": d.csrf(),
            "back": "/dead?text=timeout"})
        assert status == 303 and headers["Location"].endswith("done=6")
        assert queue.client.zcard(queue.keys.dead) == 4 and queue_stats(queue)["pending"] == 6
        ids = queue.client.zrange(queue.keys.dead, 0, 1)
        status, _, headers = d.request("/dead/cancel", [("id", ids[0]), ("id", ids[1]),
                                                        ("csrf", d.csrf())])
        assert status == 303 and headers["Location"].endswith("done=2")
        assert queue.client.zcard(queue.keys.dead) == 2
        assert "2 match" in d.request("/dead")[1]
        assert d.request("/dead?text=timeout")[1].count('class="job"') == 0


def test_read_only_hides_and_refuses_the_actions(app: App, queue: Queue) -> None:
    _dead(app, queue, ["boom"])
    make_task(app, group="acme").delay(1)
    with DashServer([queue], read_only=True) as d:
        for path in ("/", "/lanes", "/dead"):
            body = d.request(path)[1]
            assert 'method="post"' not in body and "read-only" in body, path
        status, body, _ = d.request("/action/pause", {"group": "acme", "csrf": "any"})
        assert status == 403 and "read-only" in body
        assert d.request("/dead/requeue", {"scope": "filter", "csrf": "any"})[0] == 403
        assert not lane_view(queue, "acme")["paused"] and queue.client.zcard(queue.keys.dead) == 1


def test_metrics_parse_and_count_the_work_done(app: App, queue: Queue) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    t = make_task(app, name="t.ok", group=lambda g, *_: g)
    t.map([("a", i) for i in range(7)] + [("b", i) for i in range(3)])
    for _ in range(10):
        (lease,) = queue.claim()
        queue.ack(lease)
    _dead(app, queue, ["x", "y"])
    make_task(app, name="t.ok", group="waiting").map([(i,) for i in range(4)])
    with DashServer([queue]) as d:
        text = d.request("/metrics")[1]
        families = {f.name: f for f in text_string_to_metric_families(text)}
        value = {}
        for f in families.values():
            for s in f.samples:
                value[(s.name, tuple(sorted(s.labels.items())))] = s.value
        q = queue.name
        assert value[("emqtasks_jobs_total", (("outcome", "succeeded"), ("queue", q),
                                              ("task", "t.ok")))] == 10
        assert value[("emqtasks_jobs_total", (("outcome", "dead"), ("queue", q),
                                              ("task", "t.dead")))] == 2
        assert value[("emqtasks_queue_jobs", (("queue", q), ("state", "pending")))] == 4
        assert value[("emqtasks_queue_jobs", (("queue", q), ("state", "dead")))] == 2
        assert value[("emqtasks_group_pending", (("group", "waiting"), ("queue", q)))] == 4
        assert value[("emqtasks_job_wait_seconds_count", (("queue", q),))] == 12
        assert value[("emqtasks_job_run_seconds_count", (("queue", q), ("task", "t.ok")))] == 10
        assert value[("emqtasks_workers", (("queue", q),))] == 0
        # A second scrape never counts less (the closed minutes are added once)
        again = d.request("/metrics")[1]
        assert f'emqtasks_jobs_total{{queue="{q}",task="t.ok",outcome="succeeded"}} 10' in again


def test_the_lanes_page_stays_fast_with_10000_groups(app: App, queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    t.map([(f"tenant{i:05d}", 0) for i in range(10_000)])
    with DashServer([queue]) as d:
        t0 = time.perf_counter()
        status, body, _ = d.request("/lanes")
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        d.request("/lanes?page=100&sort=group")
        cached = time.perf_counter() - t0
        print(f"lanes page, 10,000 groups: {first * 1000:.0f} ms (a fresh read), "
              f"{cached * 1000:.0f} ms (within the 1 s cache)")
        assert status == 200 and "10000</span> of 10000 groups" in body
        assert body.count('class="lane ') == 50
        assert first < 20 and cached < 10


def _cli(url: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, EMQ_REDIS_URL=url)
    env.pop("EMQ_DASHBOARD_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "emqtasks", *args], env=env, text=True,
                          capture_output=True, timeout=timeout)


def test_binding_beyond_loopback_needs_a_token(redis_url: str) -> None:
    out = _cli(redis_url, "dashboard", "--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 2 and "needs a token" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_the_metrics_command_serves_metrics_only(redis_url: str, queue_name: str) -> None:
    env = dict(os.environ, EMQ_REDIS_URL=redis_url)
    proc = subprocess.Popen([sys.executable, "-m", "emqtasks", "metrics", "-Q", queue_name,
                             "--port", "0", "--token", "t0k", "--metrics-tenants", "7"],
                            env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(re.search(r":(\d+)/metrics", line).group(1))   # type: ignore[union-attr]
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": "Bearer t0k"})
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
            assert "emqtasks_queue_jobs" in text and "the 7 busiest tenants" in text
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as other:
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/lanes", headers={"Authorization": "Bearer t0k"}),
                timeout=10)
        assert other.value.code == 404
    finally:
        proc.terminate()
        proc.wait(10)


def test_metrics_label_values_stay_on_their_line_whatever_the_names(app: App,
                                                                    queue: Queue) -> None:
    import unicodedata

    from prometheus_client.parser import text_string_to_metric_families

    # Given groups and a task whose names hold every kind of character a line reader trips on
    odd = {"a\rb": "a\\x0db", "a\x00b": "a\\x00b", "a\x1bb": "a\\x1bb", "a\x7fb": "a\\x7fb",
           "a\x85b": "a\\x85b", "a\u2028b": "a\\u2028b", "a\nb": "a\nb", 'a"b': 'a"b',
           "a\\b": "a\\b", "a\tb": "a\\x09b", "caf\u00e9": "caf\u00e9"}
    for group in odd:
        make_task(app, name="t.cr\r", group=group).map([(1,), (2,)])
    (lease,) = queue.claim()
    queue.ack(lease)
    with DashServer([queue]) as d:
        text = d.request("/metrics")[1]
    # Then the exposition is printable text in lines: LF ends a line, nothing else breaks one
    assert text.splitlines() == text.split("\n")[:-1]
    assert not [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Zl", "Zp")]
    # and it parses, each name written as the format escapes it (\\, \", \n) or, for the
    # other control characters, as the visible text \xHH / \uHHHH
    families = {f.name: f for f in text_string_to_metric_families(text)}
    groups = {s.labels["group"] for s in families["emqtasks_group_pending"].samples}
    assert groups == set(odd.values())
    tasks = {s.labels["task"] for s in families["emqtasks_jobs_started"].samples}
    assert tasks == {"t.cr\\x0d"}


@pytest.mark.parametrize("path", ["/dead", "/jobs?state=dead", "/jobs?state=pending",
                                  "/jobs?state=dead&text=x", "/lanes", "/workflow?id=w"])
def test_a_page_number_out_of_range_is_a_400_not_a_500(app: App, queue: Queue,
                                                       path: str) -> None:
    _dead(app, queue, ["boom"])
    sep = "&" if "?" in path else "?"
    with DashServer([queue]) as d:
        for page in ("99999999999999999999", str(2 ** 63), "1" + "0" * 400):
            status, body, _ = d.request(f"{path}{sep}page={page}")
            assert status == 400 and "page" in body, (page, status)
        assert d.request(f"{path}{sep}page=2")[0] in (200, 404)   # in range: the page


@pytest.mark.parametrize("args", [["metrics", "--port", "99999"],
                                  ["dashboard", "--port", "-1"],
                                  ["dashboard", "--port", "http"],
                                  ["metrics", "--metrics-groups", "-3"],
                                  ["metrics", "--metrics-tenants", "-3"],
                                  ["dashboard", "--bogus"]])
def test_bad_options_of_dashboard_and_metrics_are_one_line_and_exit_2(
        redis_url: str, args: list[str]) -> None:
    out = _cli(redis_url, *args)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("emqtasks: error: "), \
        out.stderr
    assert args[1] in out.stderr


def test_the_tenants_page_lists_each_tenant_its_share_and_why_it_waits(app: App,
                                                                       queue: Queue) -> None:
    # Given acme's work spread over 3 groups, globex's in one, initech's one job
    t = make_task(app, name="t.ten", group=lambda g, *_: g, tenant=lambda _g, tn: tn)
    t.map([(f"acme-{i % 3}", "acme") for i in range(9)] + [("gx", "globex")] * 2
          + [("it", "initech")])
    # And one claim each for acme and globex (the ring of tenants turns once per claim)
    claimed = {lease.group for lease in queue.claim(2)}
    assert claimed == {"acme-0", "gx"}
    app.set_tenant_limit("acme", 1)
    app.set_tenant_weight("initech", 3)
    app.pause_tenant("globex")
    with DashServer([queue]) as d:
        # The lanes page links to the tenants page
        assert f'href="/tenants?queue={queue.name}"' in d.request("/lanes")[1]
        status, body, _ = d.request("/tenants")
        assert status == 200
        rows = {m.group(1): m.group(2) for m in re.finditer(
            r'<tr class="tenant [^"]*" data-tenant="([^"]+)">(.*?)</tr>', body, re.S)}
        assert list(rows) == ["acme", "globex", "initech"]   # the most waiting, then in flight

        def cell(tenant: str, name: str) -> str:
            found = re.search(rf'<td class="{name}">([^<]*)</td>', rows[tenant])
            assert found, (tenant, name)
            return found.group(1)

        assert (cell("acme", "groups"), cell("acme", "pending"), cell("acme", "active"),
                cell("acme", "limit"), cell("acme", "state")) == ("3", "8", "1", "1",
                                                                  "at_limit")
        assert cell("acme", "why") == "at its limit: 1 of 1 jobs in flight"
        assert (cell("globex", "paused"), cell("globex", "why")) == (
            "yes", "paused (resume_tenant)")
        assert (cell("initech", "weight"), cell("initech", "limit")) == ("3", "∞")
        assert "its turn" in cell("initech", "why")
        # Claims over the last minutes: one each, entitled to half each (the served two)
        assert (cell("acme", "share"), cell("acme", "entitled")) == ("50.0%", "50.0%")
        assert (cell("globex", "share"), cell("initech", "share")) == ("50.0%", "—")
        assert re.search(r'id="jain">1\.000<', body)
        # Each tenant's wait p50 / p95 / p99 over 5 minutes (issue 30): initech never started
        assert re.fullmatch(r"\d+ / \d+ / \d+", cell("acme", "waits")), cell("acme", "waits")
        assert cell("initech", "waits") == "— / — / —"
        # And the chart of the busiest tenant's received vs entitled share, last hour
        assert 'id="chart-tenant">acme<' in body and "<polyline" not in body   # one minute
        assert body.count("<circle") == 2 and 'aria-label="received, entitled per minute"' in body
        status, body, _ = d.request("/tenants?tenant=initech")
        assert status == 200 and 'id="chart-tenant">initech<' in body
        assert "<circle" not in body   # never served: no point


def test_the_tenant_share_timeline_says_received_against_entitled_per_minute(
        app: App, queue: Queue) -> None:
    from emqtasks.observe.tenants import shares, timeline

    t = make_task(app, name="t.ten", group=lambda g, *_: g, tenant=lambda _g, tn: tn)
    t.map([(f"a{i}", "A") for i in range(8)] + [("b", "B")] * 8)
    app.set_tenant_weight("A", 3)
    for lease in queue.claim(8):
        queue.ack(lease)
    (point,) = [p for p in timeline(shares(queue, 60), "A") if p["received"] is not None]
    assert (point["received"], point["entitled"]) == (6 / 8, 3 / 4)


def test_the_tenants_page_escapes_and_pages(app: App, queue: Queue) -> None:
    make_task(app, name="t.plain", group="no-tenant").delay(1)
    with DashServer([queue]) as d:   # a group with no tenant is its own: not listed
        status, body, _ = d.request("/tenants")
        assert status == 200 and 'id="tenant-total">0<' in body and "share-chart" not in body
    t = make_task(app, name="t.ten", group=lambda g, *_: g, tenant=lambda _g, tn: tn)
    t.map([(f"g{i}", f"t{i:03d}") for i in range(60)] + [("h", "acme<b>")])
    with DashServer([queue]) as d:
        first = d.request("/tenants")[1]
        assert 'id="tenant-total">61<' in first and first.count('class="tenant ') == 50
        assert "acme&lt;b&gt;" in first and "acme<b>" not in first
        second = d.request("/tenants?page=2")[1]
        assert second.count('class="tenant ') == 11 and 'data-tenant="t059"' in second


def test_metrics_per_tenant_stay_bounded_with_10000_tenants(app: App, queue: Queue) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from emqtasks.observe.metrics import Exporter

    # Given 10,000 tenants of one group each, and five busier ones
    t = make_task(app, name="t.many", group=lambda g, *_: g, tenant=lambda _g, tn: tn)
    t.map([(f"g{i}", f"t{i:05d}") for i in range(10_000)])
    t.map([(f"big{b}", f"big{b}") for b in range(5) for _ in range(3 + b)])
    claimed = len(queue.claim(40))
    started = time.monotonic()
    text = Exporter([queue], top_tenants=5).render()
    assert time.monotonic() - started < 20
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric in ("emqtasks_tenant_pending", "emqtasks_tenant_active",
                   "emqtasks_tenant_claims"):
        samples = families[metric].samples
        # Then at most N + 1 series a tenant metric: the N busiest by name, the rest summed
        assert len(samples) == 6, metric
        tenants = {s.labels["tenant"] for s in samples}
        assert tenants == {"big0", "big1", "big2", "big3", "big4", "_other"}, metric
    total = {m: sum(s.value for s in families[f"emqtasks_tenant_{m}"].samples)
             for m in ("pending", "active", "claims")}
    # And nothing is lost in the sum
    assert total == {"pending": 10_000 + 25 - claimed, "active": claimed, "claims": claimed}

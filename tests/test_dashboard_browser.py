"""The dashboard in a real browser: the system's chromium, driven by Selenium 4 through the
system's chromedriver (no browser or driver download). Skipped only where chromium is not
installed (Debian: apt-get install chromium chromium-driver). Screenshots of the main pages
are kept in the test's temporary directory."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import worker_tasks as wt
from dashsrv import DashServer
from helpers import make_task
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.observe.lanes import lane as lane_view
from emqtasks.store.queue import Queue

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                       reason="chromium and chromium-driver are not installed"),
]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM   # type: ignore[assignment]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, predicate: Any, timeout: float = 15.0) -> Any:
    """Until predicate(driver) holds; an element that went stale under it (the page
    re-rendered between its lookup and its read) is looked up again at the next poll."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2,
                         ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: predicate(d))


def _row(driver: Any, group: str) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        for row in driver.find_elements(By.CSS_SELECTOR, "tr.lane"):
            if row.get_attribute("data-group") == group:
                return row
    except StaleElementReferenceException:   # the live refresh replaced the table
        pass
    return None


def _cell(driver: Any, group: str, css: str) -> str | None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        row = _row(driver, group)
        return None if row is None else row.find_element(By.CSS_SELECTOR, css).text
    except StaleElementReferenceException:
        return None


def _click(driver: Any, group: str, css: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def attempt(d: Any) -> bool:
        try:
            _row(d, group).find_element(By.CSS_SELECTOR, css).click()
            return True
        except (StaleElementReferenceException, AttributeError):
            return False
    _wait(driver, attempt)


def _state(driver: Any, group: str) -> str | None:
    return _cell(driver, group, "td.state")


def test_lanes_pause_live_updates_and_dead_requeue_in_a_browser(
        app: App, queue: Queue, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    # Given a flooding group, a quiet one, and a dead job of a task a worker can run
    h = app.send_task(wt.record, ("revived:1",))
    (lease,) = queue.claim()
    queue.retry(lease, "ValueError: first try failed", 0, True)
    make_task(app, name="t.flood", group="flood").map([(i,) for i in range(300)])
    make_task(app, name="t.quiet", group="quiet").delay(1)
    with DashServer([queue], token="tok") as d:
        # A request without the token is refused; the login form lets a person in
        browser.get(d.base + "/lanes")
        assert browser.find_element(By.ID, "token")
        browser.save_screenshot(str(tmp_path / "login.png"))
        browser.find_element(By.ID, "token").send_keys("tok")
        browser.find_element(By.ID, "login").click()
        _wait(browser, lambda b: _row(b, "flood") is not None)
        # The lanes page shows the flooding group and the quiet one, with their states
        _wait(browser, lambda b: _state(b, "flood") == "ready")
        _wait(browser, lambda b: _cell(b, "flood", "td.pending") == "300")
        _wait(browser, lambda b: _state(b, "quiet") == "ready")
        _wait(browser, lambda b: "its turn" in (_cell(b, "quiet", "td.why") or ""))
        browser.save_screenshot(str(tmp_path / "lanes.png"))
        # Clicking pause on a group pauses it in Redis, and the page shows it
        _click(browser, "flood", "button.pause")
        _wait(browser, lambda b: _state(b, "flood") == "paused")
        assert lane_view(queue, "flood")["paused"]
        # A job enqueued while the page is open appears without a reload
        marker = browser.execute_script("window.__same_page = 1; return 1")
        assert marker == 1
        make_task(app, name="t.late", group="latecomer").delay(1)
        _wait(browser, lambda b: _row(b, "latecomer") is not None, 15)
        assert browser.execute_script("return window.__same_page") == 1   # no reload
        pending = int(browser.find_element(By.ID, "c-pending").text)
        assert pending >= 300
        # Overview and dead letters
        browser.get(d.base + "/")
        browser.save_screenshot(str(tmp_path / "overview.png"))
        browser.get(d.base + "/dead")
        assert "1 match" in browser.find_element(By.ID, "job-total").text
        browser.save_screenshot(str(tmp_path / "dead.png"))
        # A dead job requeued from the page runs
        with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1) as w:
            w.wait_ready()
            browser.get(d.base + f"/job?id={h.id}")
            assert browser.find_element(By.ID, "f-state").text == "dead"
            browser.save_screenshot(str(tmp_path / "job.png"))
            browser.find_element(By.ID, "requeue-one").click()
            # the click's POST lands asynchronously: get() on a still-dead job raises
            _wait(browser, lambda b: queue.status(h.id) != "dead")
            assert h.get(timeout=30) == "revived:1"
            browser.get(d.base + f"/job?id={h.id}")
            assert browser.find_element(By.ID, "f-state").text == "done"
            assert w.stop() == 0
    assert list(tmp_path.glob("*.png"))


def test_read_only_hides_and_refuses_actions_in_a_browser(app: App, queue: Queue,
                                                          browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    make_task(app, name="t.x", group="acme").delay(1)
    with DashServer([queue], read_only=True) as d:
        browser.get(d.base + "/lanes")
        _wait(browser, lambda b: _row(b, "acme") is not None)
        assert browser.find_elements(By.CSS_SELECTOR, "button.pause") == []
        assert "read-only" in browser.find_element(By.CSS_SELECTOR, ".badge").text
        browser.save_screenshot(str(tmp_path / "lanes-read-only.png"))
        # A POST sent from the page anyway is refused
        status = browser.execute_script(
            "var f = new FormData(); f.append('group', 'acme'); f.append('csrf', arguments[0]);"
            "return fetch('/action/pause', {method: 'POST', body: new URLSearchParams(f)})"
            ".then(function (r) { return r.status; });", "any")
        assert status == 403    # answered: nothing is still on its way
        assert not lane_view(queue, "acme")["paused"]


def test_sign_in_stays_on_the_dashboard_and_its_csrf_token_is_its_own_in_a_browser(
        app: App, queue: Queue, browser: Any) -> None:
    from urllib.parse import quote, urlsplit

    from selenium.webdriver.common.by import By

    make_task(app, name="t.x", group="acme").delay(1)
    with DashServer([queue], token="tok") as d:
        # A link to the login form whose next page is another site, or smuggles a header
        for target in ("/x\r\nSet-Cookie: injected=1", "/\\evil.example/phish",
                       "//evil.example/phish", "/x%0d%0aSet-Cookie:%20injected=1"):
            browser.delete_all_cookies()
            browser.get(f"{d.base}/login?next={quote(target, safe='')}")
            assert "csrf" not in browser.page_source.lower()   # nothing handed out yet
            browser.find_element(By.ID, "token").send_keys("tok")
            browser.find_element(By.ID, "login").click()
            _wait(browser, lambda b: not b.current_url.startswith(d.base + "/login")
                  and b.execute_script("return document.readyState") == "complete")
            # signing in lands on the dashboard's own root, with its cookie only
            where = urlsplit(browser.current_url)
            assert (where.netloc, where.path) == (urlsplit(d.base).netloc, "/"), target
            assert [c["name"] for c in browser.get_cookies()] == ["emq_session"], target
        # The page's CSRF token is this session's: another session's is refused
        _, other = d.sign_in("tok")
        status = browser.execute_script(
            "var f = new URLSearchParams(); f.append('group', 'acme');"
            "f.append('csrf', arguments[0]);"
            "return fetch('/action/pause', {method: 'POST', body: f})"
            ".then(function (r) { return r.status; });", other)
        assert status == 403 and not lane_view(queue, "acme")["paused"]
        own = browser.find_element(By.CSS_SELECTOR, "input[name=csrf]").get_attribute("value")
        assert own != other
        browser.find_element(By.ID, "queue-toggle").click()   # the page's own token
        _wait(browser, lambda b: b.find_element(By.ID, "queue-toggle").text
              == "resume the queue")


def _sign_in(browser: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(base + "/login")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login").click()
    _wait(browser, lambda b: not b.current_url.startswith(base + "/login")
          and b.execute_script("return document.readyState") == "complete")


def test_enqueue_run_now_audit_and_roles_in_a_browser(app: App, queue: Queue, browser: Any,
                                                      tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from emqtasks.schedules.schedule import ScheduleStore

    ScheduleStore(queue).note_tasks([make_task(app, name="t.report").spec])
    tokens = "alice:operator:op-tok,bots:viewer:view-tok"
    with DashServer([queue], tokens=tokens) as d:
        # An operator enqueues a task by name with a countdown: the job waits, delayed
        _sign_in(browser, d.base, "op-tok")
        assert browser.find_element(By.ID, "who").text == "alice"
        browser.find_element(By.LINK_TEXT, "enqueue").click()
        _wait(browser, lambda b: b.find_elements(By.ID, "enqueue-form"))
        browser.find_element(By.ID, "e-task").send_keys("t.report")
        browser.find_element(By.ID, "e-args").clear()
        browser.find_element(By.ID, "e-args").send_keys('[7, "x"]')
        browser.find_element(By.ID, "e-group").send_keys("acme")
        browser.find_element(By.ID, "e-countdown").send_keys("600")
        browser.save_screenshot(str(tmp_path / "enqueue.png"))
        browser.find_element(By.ID, "e-send").click()
        _wait(browser, lambda b: b.find_elements(By.ID, "f-state"))
        assert browser.find_element(By.ID, "f-state").text == "delayed"
        assert browser.find_element(By.ID, "f-group").text == "acme"
        job_id = browser.current_url.split("id=")[1].split("&")[0]
        # ...and runs it now: it moves to its lane
        browser.find_element(By.ID, "run-now").click()
        _wait(browser, lambda b: b.find_elements(By.ID, "done"))
        assert browser.find_element(By.ID, "f-state").text == "pending"
        assert queue.status(job_id) == "pending"
        # A bad countdown is refused with the reason, nothing written
        browser.get(d.base + "/enqueue")
        browser.find_element(By.ID, "e-task").send_keys("t.report")
        browser.find_element(By.ID, "e-countdown").send_keys("-5")
        browser.find_element(By.ID, "e-send").click()
        _wait(browser, lambda b: b.find_elements(By.ID, "error"))
        assert "countdown" in browser.find_element(By.ID, "error").text
        # The audit page says who did what
        browser.get(d.base + "/")
        browser.find_element(By.LINK_TEXT, "audit").click()
        _wait(browser, lambda b: b.find_elements(By.ID, "audit"))
        rows = [(r.find_element(By.CSS_SELECTOR, ".who").text,
                 r.find_element(By.CSS_SELECTOR, ".action").text)
                for r in browser.find_elements(By.CSS_SELECTOR, "#audit tr")[1:]]
        assert rows == [("alice", "run now"), ("alice", "enqueue")]
        browser.save_screenshot(str(tmp_path / "audit.png"))
        # A viewer sees the same pages, with no action on them, and a POST is refused
        _sign_in(browser, d.base, "view-tok")
        assert browser.find_element(By.ID, "read-only").text == "viewer"
        browser.get(d.base + "/audit")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#audit tr")) == 3
        browser.get(d.base + f"/job?id={job_id}")
        assert browser.find_elements(By.ID, "abort-one") == []
        browser.get(d.base + "/enqueue")
        assert browser.find_elements(By.ID, "enqueue-form") == []
        browser.save_screenshot(str(tmp_path / "viewer.png"))
        status = browser.execute_script(
            "var f = new URLSearchParams(); f.append('id', arguments[0]);"
            "return fetch('/job/abort', {method: 'POST', body: f})"
            ".then(function (r) { return r.status; });", job_id)
        assert status == 403 and queue.status(job_id) == "pending"
    assert len(queue.audit_log()) == 2


def test_the_tenants_page_from_the_lanes_page_in_a_browser(app: App, queue: Queue,
                                                          browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    # Given a tenant whose work is spread over 20 groups, at its limit, and a paused one
    t = make_task(app, name="t.tb", group=lambda g, *_: g, tenant=lambda _g, tn: tn)
    t.map([(f"user-{i % 20}", "acme") for i in range(40)] + [("solo", "globex")] * 3)
    queue.claim(2)
    app.set_tenant_limit("acme", 1)
    app.pause_tenant("globex")
    with DashServer([queue]) as d:
        # When one follows the lanes page's link to the tenants page
        browser.get(d.base + "/lanes")
        browser.find_element(By.ID, "to-tenants").click()
        _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "tr.tenant"))
        rows = {r.get_attribute("data-tenant"): r
                for r in browser.find_elements(By.CSS_SELECTOR, "tr.tenant")}
        browser.save_screenshot(str(tmp_path / "tenants.png"))

        def cell(tenant: str, css: str) -> str:
            return str(rows[tenant].find_element(By.CSS_SELECTOR, css).text)

        # Then each tenant shows its groups, in flight, limit, share and why it waits
        assert list(rows) == ["acme", "globex"]
        assert (cell("acme", "td.groups"), cell("acme", "td.active"),
                cell("acme", "td.limit")) == ("20", "1", "1")
        assert cell("acme", "td.why") == "at its limit: 1 of 1 jobs in flight"
        assert cell("globex", "td.why") == "paused (resume_tenant)"
        assert cell("acme", "td.share") == "50.0%" and cell("globex", "td.share") == "50.0%"
        # And a chart of the busiest tenant's received vs entitled share over the hour
        assert browser.find_element(By.ID, "chart-tenant").text == "acme"
        assert browser.find_elements(By.CSS_SELECTOR, "#share-chart svg circle")
        # And it links back to the lanes
        browser.find_element(By.ID, "to-lanes").click()
        _wait(browser, lambda b: _row(b, "solo") is not None)

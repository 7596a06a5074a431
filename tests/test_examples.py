"""Every program in examples/ runs against a real server and says what it should."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: What examples/fastapi_app.py needs beside emqtasks (the `test` extra has them).
WEB = ("fastapi", "uvicorn", "httpx")


def run_example(name: str, redis_url: str) -> str:
    env = dict(os.environ, EMQ_REDIS_URL=redis_url)
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], env=env,
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, expected", [
    ("reports", ["acme: 8 reports, at most 1 at once", "globex: 4 reports"]),
    ("retries", ["order 1 confirmed after 3 calls", "dead after its attempts",
                 "ValueError: order 2 is malformed", "requeued 1 dead job(s)"]),
    ("batch", ["enqueued 5000 jobs in one call", "all 5000 done, checksum 23747500"]),
    ("results", ["add -> 5 (status done)", "divide failed remotely: ZeroDivisionError",
                 "slow is still active after 0.1 s", "slow -> finally"]),
    ("noisy_tenant", ["served alpha, beta, gamma while spammy waits with 2000 jobs parked",
                      "after resume: spammy has 0 pending"]),
    ("workflows", ["chain -> 20", "chord of 100 -> 328350",
                   "chord failed at step flaky-3; status failed", "link_error ran for flaky-3",
                   "total cancelled"]),
    pytest.param("fastapi_app", ["50 concurrent /add -> 1275",
                                 "/divide by 0 -> 422 failed on the worker: job",
                                 "ZeroDivisionError: division by zero",
                                 "/reports/acme -> 3 jobs accepted",
                                 "report states: done, done, done"],
                 marks=pytest.mark.skipif(
                     not all(importlib.util.find_spec(m) for m in WEB),
                     reason=f"needs {', '.join(WEB)} (pip install -e '.[test]')")),
])
def test_example_runs_and_reports(name: str, expected: list[str], redis_url: str) -> None:
    out = run_example(name, redis_url)
    for line in expected:
        assert line in out, out


def test_every_example_is_exercised() -> None:
    tested = {"reports", "retries", "batch", "results", "noisy_tenant", "workflows",
              "fastapi_app"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_every_example_folder_is_run_by_a_test_file() -> None:
    # A folder is a project of its own, run by the test file that sets it up.
    runs = {"fencing": "test_examples_day2.py", "django_project": "test_django.py",
            "celery": "test_celery_examples.py"}
    folders = {p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(runs)
    tests = Path(__file__).resolve().parent
    for folder, test_file in runs.items():
        assert folder in (tests / test_file).read_text(), (folder, test_file)

"""The day-two examples (examples/fencing/) run against a real server and say what they
should."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.timeout(120)
def test_the_fenced_writes_example_refuses_the_stale_holder(redis_url: str) -> None:
    result = subprocess.run([sys.executable, str(EXAMPLES / "fencing" / "fenced_writes.py")],
                            env=dict(os.environ, EMQ_REDIS_URL=redis_url),
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ["claim with fence 2: still_holds() = True, write accepted",
                 "claim with fence 1: still_holds() = False, write refused",
                 "row doc-1: 'hello', fence 2"]:
        assert line in result.stdout, result.stdout

"""``emqtasks worker -A rolling_worker``: the rolling-deploy tasks on the default app, the
release that runs them named by ``RD_SIDE`` (tests/test_rolling_deploy.py)."""

from __future__ import annotations

import os

from rolling_tasks import register

from emqtasks import default_app

TASKS = register(default_app, os.environ.get("RD_SIDE", "?"))

"""Pausing a noisy tenant: its lane keeps its backlog while everyone else is served.

    python examples/noisy_tenant.py
"""

from __future__ import annotations

import os
from pathlib import Path

from emqtasks import App
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-noisy")


@app.task(group=lambda tenant, n: tenant)
def sync_contacts(tenant: str, n: int) -> str:
    return tenant


def main() -> None:
    app.purge()
    app.pause_group("spammy")                       # parked: kept, not served
    spam = sync_contacts.map([("spammy", i) for i in range(2000)])
    others = [sync_contacts.delay(t, 1) for t in ("alpha", "beta", "gamma")]
    with worker_process(["noisy_tenant"], concurrency=2, path=str(Path(__file__).parent)):
        served = [h.get(timeout=30) for h in others]
        waiting = app.stats()["groups"]["spammy"]["pending"]
        print(f"served {', '.join(served)} while spammy waits with {waiting} jobs parked")
        app.resume_group("spammy")                  # back on the ring, with a wake
        spam[-1].get(timeout=60)
        left = app.stats()["groups"].get("spammy", {}).get("pending", 0)
        print(f"after resume: spammy has {left} pending")
    app.purge()


if __name__ == "__main__":
    main()

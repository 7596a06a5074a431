"""A multi-tenant report builder: one lane per tenant, and a per-tenant concurrency limit.

    python examples/reports.py          # EMQ_REDIS_URL, or the embedded server by default
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from emqtasks import App
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-reports")


@app.task(group=lambda tenant, report_id: tenant)
def build_report(tenant: str, report_id: int) -> dict[str, float]:
    started = time.time()
    time.sleep(0.05)                    # the real work: queries, rendering, upload...
    return {"report": report_id, "started": started, "ended": time.time()}


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def main() -> None:
    app.purge()
    app.set_group_limit("acme", 1)      # acme's reports run one at a time, whatever its backlog
    with worker_process(["reports"], concurrency=4, path=str(Path(__file__).parent)):
        handles = {t: build_report.map([(t, i) for i in range(n)])
                   for t, n in (("acme", 8), ("globex", 4), ("initech", 4))}
        for tenant, hs in handles.items():
            results = [h.get(timeout=60) for h in hs]
            peak = most_at_once([(r["started"], r["ended"]) for r in results])
            print(f"{tenant}: {len(results)} reports, at most {peak} at once")
    app.purge()


if __name__ == "__main__":
    main()

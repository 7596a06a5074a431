"""Prometheus metrics (text exposition 0.0.4), read from the server's history and books.

Counters and histograms come from the per-minute history the verbs keep (history.py), so
they count the work of every worker process. A counter must never go down while the
exporter runs, yet the oldest minute of history expires each minute: the exporter adds
each minute to its running totals once the server's clock has passed it (no verb writes a
minute after that), and shows the current minute on top. Its first scrape starts from the
whole retention. A restarted exporter starts again from the history, which Prometheus reads
as a counter reset.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from ..store.queue import Queue
from . import history
from .history import BUCKETS_MS, Counts
from .lanetable import LaneTable
from .tenants import shares as tenant_shares

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_TOP_GROUPS = 50
DEFAULT_TOP_TENANTS = 50
#: The label value under which the tenants past the top N are summed.
OTHER_TENANT = "_other"
#: emqtasks_tenant_claims counts the claims of this many minutes of history.
CLAIM_MINUTES = 5
STATES = ("pending", "active", "delayed", "dead")
#: Only this many minutes are read on the first scrape (the retention may be longer).
FIRST_SPAN = 24 * 60


#: Characters a reader may take for the end of a line, or choke on, besides the LF the
#: format escapes: the other C0 and C1 controls, DEL, U+2028/2029, and lone surrogates (a
#: name that was not valid UTF-8; see app.connect).
_UNSAFE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape(value: str) -> str:
    r"""A label value as the text format writes it: backslash, double quote and line feed
    escaped (\\, \", \n), and the other characters of _UNSAFE as the visible text ``\xHH``
    or ``\uHHHH`` behind an escaped backslash (a parser reads it back as that text), so the
    exposition is printable lines whatever a task or group is named."""
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return _UNSAFE.sub(_visible, value)


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\\\x{code:02x}" if code < 0x100 else f"\\\\u{code:04x}"


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


class _Running:
    """One queue's running totals: closed minutes added once, the current one on top."""

    def __init__(self) -> None:
        self.frontier: int | None = None           # first minute not yet added
        self.tasks: dict[str, Counts] = {}
        self.lock = threading.Lock()

    def read(self, queue: Queue) -> dict[str, Counts]:
        with self.lock:
            now = queue.server_minute()
            floor = now - FIRST_SPAN + 1
            start = floor if self.frontier is None else max(self.frontier, floor)
            rows = queue.minutes(now - start + 1, now)
            for m in rows[:-1]:
                for task, c in m.tasks.items():
                    self.tasks.setdefault(task, Counts()).add(c)
            self.frontier = now
            out = {t: _sum_counts([c]) for t, c in self.tasks.items()}
            for task, c in rows[-1].tasks.items():
                out.setdefault(task, Counts()).add(c)
            return out


class Exporter:
    """Renders the metrics of some queues; keeps the running totals between scrapes."""

    def __init__(self, queues: Sequence[Queue], top_groups: int = DEFAULT_TOP_GROUPS,
                 top_tenants: int = DEFAULT_TOP_TENANTS) -> None:
        self.queues = list(queues)
        self.top_groups = top_groups
        self.top_tenants = top_tenants
        self._running = {q.name: _Running() for q in self.queues}
        # The gauges read the lane table, not stats(): no SCAN of the keyspace per scrape.
        self._tables = {q.name: LaneTable(q) for q in self.queues}

    def render(self) -> str:
        out: list[str] = []
        per_queue = [(q, self._running[q.name].read(q), self._tables[q.name].stats(),
                      q.workers())
                     for q in self.queues]
        out += ["# HELP emqtasks_jobs_total Jobs that ended, by outcome (from the history).",
                "# TYPE emqtasks_jobs_total counter"]
        for q, tasks, _, _ in per_queue:
            for task, c in sorted(tasks.items()):
                for outcome in history.OUTCOMES:
                    out.append(f"emqtasks_jobs_total"
                               f"{_labels(queue=q.name, task=task, outcome=outcome)} "
                               f"{getattr(c, outcome)}")
        out += ["# HELP emqtasks_jobs_started_total Jobs claimed by a worker (from the history).",
                "# TYPE emqtasks_jobs_started_total counter"]
        for q, tasks, _, _ in per_queue:
            for task, c in sorted(tasks.items()):
                out.append(f"emqtasks_jobs_started_total{_labels(queue=q.name, task=task)} "
                           f"{c.started}")
        out += ["# HELP emqtasks_stale_acks_total Acks the fence refused: the job's lease had "
                "expired and it was handed on (counted by the server for every worker).",
                "# TYPE emqtasks_stale_acks_total counter"]
        for q, _, stats, _ in per_queue:
            out.append(f"emqtasks_stale_acks_total{_labels(queue=q.name)} {stats['stale_acks']}")
        out += ["# HELP emqtasks_queue_jobs Jobs of the queue now, by state.",
                "# TYPE emqtasks_queue_jobs gauge"]
        for q, _, stats, _ in per_queue:
            for state in STATES:
                out.append(f"emqtasks_queue_jobs{_labels(queue=q.name, state=state)} "
                           f"{stats[state]}")
        out += ["# HELP emqtasks_groups Groups of the queue now, by lane state.",
                "# TYPE emqtasks_groups gauge"]
        for q, _, stats, _ in per_queue:
            by_state: dict[str, int] = {}
            for row in stats["groups"].values():
                by_state[row["state"]] = by_state.get(row["state"], 0) + 1
            for state, n in sorted(by_state.items()):
                out.append(f"emqtasks_groups{_labels(queue=q.name, state=state)} {n}")
        out += [f"# HELP emqtasks_group_pending Waiting jobs of the {self.top_groups} groups "
                f"with the most.", "# TYPE emqtasks_group_pending gauge"]
        for q, _, stats, _ in per_queue:
            top = sorted(stats["groups"].items(), key=lambda kv: (-kv[1]["pending"], kv[0]))
            for g, row in top[: self.top_groups]:
                if row["pending"]:
                    out.append(f"emqtasks_group_pending{_labels(queue=q.name, group=g)} "
                               f"{row['pending']}")
        out += self._tenants(per_queue)
        out += ["# HELP emqtasks_workers Live worker processes (masters) of the queue.",
                "# TYPE emqtasks_workers gauge"]
        for q, _, _, workers in per_queue:
            out.append(f"emqtasks_workers{_labels(queue=q.name)} {len(workers)}")
        out += _histogram("emqtasks_job_wait_seconds",
                          "Time from due to start (from the history).",
                          [({"queue": q.name}, _sum_counts(tasks.values()), "wait")
                           for q, tasks, _, _ in per_queue])
        out += _histogram("emqtasks_job_run_seconds",
                          "Run time of the jobs that succeeded (from the history).",
                          [({"queue": q.name, "task": t}, c, "run")
                           for q, tasks, _, _ in per_queue for t, c in sorted(tasks.items())])
        return "\n".join(out) + "\n"


    def _tenants(self, per_queue: list[tuple[Queue, Any, dict[str, Any], Any]]) -> list[str]:
        """Per tenant its waiting jobs, jobs in flight and claims of the last CLAIM_MINUTES,
        for the ``top_tenants`` busiest (most waiting + in flight, then most claims) by name
        and the rest summed under ``tenant="_other"``: at most N + 1 series a metric per
        queue, whatever the number of tenants (Prometheus keeps every series it ever saw).
        A tenant really named "_other" is always counted in the sum."""
        metrics = (("pending", "Waiting jobs over all the tenant's groups"),
                   ("active", "The tenant's jobs in flight"),
                   ("claims", f"The tenant's claims over the last {CLAIM_MINUTES} minutes "
                              f"(from the history)"))
        series: dict[str, list[str]] = {m: [] for m, _ in metrics}
        for q, _, stats, _ in per_queue:
            if not stats["tenants"]:
                continue
            claims = {t: row["claims"] for t, row in tenant_shares(q, CLAIM_MINUTES)
                      ["tenants"].items() if t in stats["tenants"]}
            values = {t: {"pending": r["pending"], "active": r["active"],
                          "claims": claims.get(t, 0)} for t, r in stats["tenants"].items()}
            ranked = sorted((t for t in values if t != OTHER_TENANT),
                            key=lambda t: (-(values[t]["pending"] + values[t]["active"]),
                                           -values[t]["claims"], t))
            top = ranked[: self.top_tenants]
            rest = set(values) - set(top)
            for m, _ in metrics:
                for t in top:
                    series[m].append(f"emqtasks_tenant_{m}{_labels(queue=q.name, tenant=t)} "
                                     f"{values[t][m]}")
                if rest:
                    series[m].append(
                        f"emqtasks_tenant_{m}{_labels(queue=q.name, tenant=OTHER_TENANT)} "
                        f"{sum(values[t][m] for t in rest)}")
        out: list[str] = []
        for m, help_text in metrics:
            out += [f"# HELP emqtasks_tenant_{m} {help_text}: the {self.top_tenants} busiest "
                    f"tenants, the rest under tenant=\"{OTHER_TENANT}\".",
                    f"# TYPE emqtasks_tenant_{m} gauge", *series[m]]
        return out


def _sum_counts(counts: Any) -> Counts:
    total = Counts()
    for c in counts:
        total.add(c)
    return total


def _histogram(name: str, help_text: str,
               series: list[tuple[dict[str, str], Counts, str]]) -> list[str]:
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for labels, c, kind in series:
        buckets = c.wait_buckets if kind == "wait" else c.run_buckets
        total_ms = c.wait_ms if kind == "wait" else c.run_ms
        seen = 0
        for bound, n in zip(BUCKETS_MS, buckets):
            seen += n
            out.append(f"{name}_bucket{_labels(**labels, le=_le(bound))} {seen}")
        count = sum(buckets)
        out.append(f"{name}_bucket{_labels(**labels, le='+Inf')} {count}")
        out.append(f"{name}_sum{_labels(**labels)} {total_ms / 1000:g}")
        out.append(f"{name}_count{_labels(**labels)} {count}")
    return out


def _le(bound_ms: int) -> str:
    return f"{bound_ms / 1000:g}"

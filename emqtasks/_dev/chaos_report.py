"""The chaos soak's report (chaos.py): what it did and found, and whether every promise held."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Report:
    """What the soak did and found; ``ok`` when every promise held."""

    seconds: float
    seed: int
    redis_version: str
    workers: int
    concurrency: int
    jobs: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    countdowns: int = 0
    groups: int = 0
    refused_full: int = 0    # jobs whose enqueue a full server refused (not acknowledged)
    events: dict[str, int] = field(default_factory=dict)
    poisoned: dict[str, int] = field(default_factory=dict)   # flavour -> jobs written
    lost: list[str] = field(default_factory=list)
    unexpected_dead: list[str] = field(default_factory=list)
    undead: list[str] = field(default_factory=list)      # doomed jobs that did not die
    unburied: list[str] = field(default_factory=list)    # poisoned jobs not dead, or no reason
    duplicated_jobs: int = 0
    extra_runs: int = 0
    max_runs: int = 0
    check_ok: bool = False
    violations: list[str] = field(default_factory=list)
    repaired: dict[str, int] = field(default_factory=dict)   # check --repair's counts, if run
    repaired_violations: list[str] = field(default_factory=list)   # what check said before
    backlog: int = 0         # jobs not yet finished when the chaos ended
    drain_seconds: float = 0.0
    worker_errors: list[str] = field(default_factory=list)
    worker_exits: list[str] = field(default_factory=list)   # last log line of each exit
    log_dir: str = ""
    chords: int = 0          # chords acknowledged
    operations: dict[str, int] = field(default_factory=dict)   # history records, by op type
    history_violations: list[str] = field(default_factory=list)   # history_check's, printed
    skipped: dict[str, str] = field(default_factory=dict)   # fault -> why it did not strike
    sentinel: bool = False   # the --sentinel mode: primary, 2 replicas, 3 sentinels, durable

    @property
    def ok(self) -> bool:
        # A failover is an outage the workers ride out: over Sentinel an ERROR line in a
        # worker's log is a broken promise. On one server the faults themselves (poisoned
        # rows, a full server) make workers log errors they handle: counted, not judged.
        return (self.jobs > 0 and self.check_ok and not self.lost and not self.unexpected_dead
                and not self.undead and not self.unburied and not self.history_violations
                and not (self.sentinel and self.worker_errors))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def lines(self) -> list[str]:
        e, k = self.events, self.kinds
        restarted = e.get("worker_restarts", 0)
        poisoned = sum(self.poisoned.values())
        setup = ("a primary, 2 replicas and 3 sentinels, durable replicas=1"
                 if self.sentinel else "appendfsync always")
        return [
            f"chaos soak: {self.seconds:.0f} s, seed {self.seed}, redis {self.redis_version} "
            f"({setup}), {self.workers} workers -c {self.concurrency}",
            "events: " + ", ".join(f"{n} {EVENT_NAMES.get(name, name)}"
                                   for name, n in e.items() if name != "worker_restarts")
            + (f" (and {restarted} worker(s) restarted after exiting)" if restarted else ""),
            f"jobs: {self.jobs:,} acknowledged enqueues over {self.groups} groups "
            f"({k.get('work', 0):,} plain, {k.get('flaky', 0):,} failing once, "
            f"{k.get('doomed', 0):,} always failing; {self.countdowns:,} with a countdown); "
            f"{self.refused_full:,} refused by a full server",
            f"outcome: {len(self.lost)} lost, {len(self.unexpected_dead)} dead that should not "
            f"be, {k.get('doomed', 0) - len(self.undead)}/{k.get('doomed', 0)} doomed jobs "
            f"dead, {poisoned - len(self.unburied)}/{poisoned} poisoned jobs dead with a "
            f"reason ({_counts(self.poisoned)}); check {'clean' if self.check_ok else 'BROKEN'}"
            + (f" after one --repair ({_counts(self.repaired)}) of the "
               f"{len(self.repaired_violations)} poisoned rows and books it named"
               if self.repaired_violations else ""),
            f"duplicates: {self.duplicated_jobs} jobs ran more than once ({self.extra_runs} "
            f"extra runs; at most {self.max_runs} runs of one job)",
            f"history: {sum(self.operations.values()):,} operations ("
            + ", ".join(f"{n:,} {op}" for op, n in sorted(self.operations.items()))
            + f"; {self.chords:,} chords); violations: "
            f"{sum(1 for v in self.history_violations if not v.startswith(' '))}",
            *(f"  {line}" for line in self.history_violations[:60]),
            *(f"skipped: {fault}: {why}" for fault, why in self.skipped.items()),
            f"drain after the chaos: {self.backlog:,} jobs in {self.drain_seconds:.1f} s; "
            f"worker log errors: "
            f"{len(self.worker_errors)}"
            + (f" (logs kept in {self.log_dir})" if self.worker_errors else ""),
            *(f"  lost: {i}" for i in self.lost[:10]),
            *(f"  dead, should not be: {i}" for i in self.unexpected_dead[:10]),
            *(f"  poisoned, not dead with a reason: {i}" for i in self.unburied[:10]),
            *(f"  violation: {v}" for v in self.violations[:10]),
            *(f"  worker error: {line}" for line in self.worker_errors[:5]),
            *(f"  a worker exited: {line}" for line in self.worker_exits[:5]),
            "OK" if self.ok else f"FAILED (worker logs in {self.log_dir})",
        ]


#: How the report names each fault.
EVENT_NAMES = {"child_kills": "child kills", "master_restarts": "master restarts",
               "connection_kills": "connection kills", "server_restarts": "server restarts",
               "poisoned_rows": "poisoned rows", "full_servers": "full servers",
               "master_freezes": "master freezes", "partitions": "partitions",
               "server_stalls": "server stalls", "clock_steps": "clock steps",
               "failovers": "failovers"}


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in counts.items() if n) or "none"

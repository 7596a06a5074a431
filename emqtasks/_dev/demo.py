"""``emqtasks demo``: a flood from one tenant and a trickle from others, on a live worker pool.

The tasks the demo's worker runs live here too (``-A emqtasks._dev.demo``). Each job records how
long it waited between enqueue and start, so the summary can show the quiet tenants being
served while the flood is still draining.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import click

from ..config import redacted
from ..ops.embedded import folder_of, is_embedded
from ..ops.servers import describe
from ..producer.app import App

demo_app = App()
FLOOD = "bigcorp"


@demo_app.task(name="emqtasks.demo.handle", group=lambda tenant, *_: tenant, max_attempts=1)
def handle(tenant: str, enqueued_at: float, work_ms: float) -> None:
    """A stand-in for real work: wait a little, note how long this job queued."""
    waited_ms = (time.time() - enqueued_at) * 1000
    time.sleep(work_ms / 1000)
    r = demo_app.client
    pipe = r.pipeline(transaction=False)
    pipe.hincrby(_k("done"), tenant, 1)
    pipe.rpush(_k(f"wait:{tenant}"), f"{waited_ms:.1f}")
    pipe.execute()


def _k(name: str) -> str:
    return f"emqdemo:{{{demo_app.settings.queue}}}:{name}"


class Demo:
    def __init__(self, redis_url: str, concurrency: int, flood: int, tenants: int,
                 trickle_every: float, work_ms: float) -> None:
        self.queue_name = f"demo-{uuid.uuid4().hex[:8]}"
        demo_app.configure(redis_url=redis_url, queue=self.queue_name)
        self.redis_url = redis_url
        self.concurrency = concurrency
        self.flood = flood
        self.quiet = [f"tenant-{i + 1}" for i in range(tenants)]
        self.trickle_every = trickle_every
        self.work_ms = work_ms
        self.sent = {t: 0 for t in [FLOOD, *self.quiet]}
        self.tty = sys.stdout.isatty()
        self._lines = 0
        self.server = ""

    def run(self) -> int:
        client = demo_app.client
        client.ping()
        self.server = f"{describe(client)}, " + (
            f"the embedded server in {folder_of(self.redis_url)}" if is_embedded(self.redis_url)
            else redacted(self.redis_url))
        click.echo(f"server: {self.server}")
        worker = self._start_worker()
        try:
            started = time.monotonic()
            handle.map([(FLOOD, time.time(), self.work_ms) for _ in range(self.flood)])
            self.sent[FLOOD] = self.flood
            next_trickle = time.monotonic()
            last_draw = 0.0
            while True:
                now = time.monotonic()
                done = self._done()
                flood_left = self.flood - done.get(FLOOD, 0)
                if now >= next_trickle and flood_left > 0:
                    for t in self.quiet:
                        handle.delay(t, time.time(), self.work_ms)
                        self.sent[t] += 1
                    next_trickle = now + self.trickle_every
                if now - last_draw >= 0.25:
                    self._draw(done, now - started)
                    last_draw = now
                if sum(done.values()) >= sum(self.sent.values()) and flood_left <= 0:
                    break
                if worker.poll() is not None:
                    raise click.ClickException("the demo's worker exited early")
                if now - started > 120:
                    raise click.ClickException("the demo did not finish in 120 s")
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            self._draw(self._done(), elapsed)
            self._summary(elapsed)
        finally:
            self._stop_worker(worker)
            self._cleanup()
        return 0

    def _start_worker(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "emqtasks.cli", "worker", "-A", "emqtasks._dev.demo",
               "-c", str(self.concurrency), "-Q", self.queue_name,
               "--redis-url", self.redis_url, "--loglevel", "WARNING"]
        return subprocess.Popen(cmd, start_new_session=True)

    def _stop_worker(self, worker: subprocess.Popen[bytes]) -> None:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(5)

    def _done(self) -> dict[str, int]:
        return {k: int(v) for k, v in demo_app.client.hgetall(_k("done")).items()}

    def _draw(self, done: dict[str, int], elapsed: float) -> None:
        stats = demo_app.stats()["groups"]
        rows = [f"emqtasks demo  queue {self.queue_name}  {elapsed:5.1f}s  "
                f"{sum(done.values())} jobs done", f"{'tenant':<10} {'sent':>6} {'done':>6} "
                f"{'pending':>8} {'active':>6}  progress"]
        for t in [FLOOD, *self.quiet]:
            n, d = self.sent[t], done.get(t, 0)
            g = stats.get(t, {})
            bar = "#" * int(20 * d / n) if n else ""
            rows.append(f"{t:<10} {n:>6} {d:>6} {g.get('pending', 0):>8} "
                        f"{g.get('active', 0):>6}  [{bar:<20}]")
        if self.tty:
            if self._lines:
                sys.stdout.write(f"\x1b[{self._lines}F")
            sys.stdout.write("\n".join(r + "\x1b[K" for r in rows) + "\n")
            self._lines = len(rows)
        else:
            sys.stdout.write(" | ".join(rows[:1] + [r.split("[")[0].strip()
                                                     for r in rows[2:]]) + "\n")
        sys.stdout.flush()

    def _summary(self, elapsed: float) -> None:
        total = sum(self._done().values())
        click.echo(f"\n{total} jobs in {elapsed:.1f}s: {total / elapsed:,.0f} jobs/s "
                   f"at -c {self.concurrency} on {self.server}")
        flood_waits = self._waits(FLOOD)
        median = statistics.median(flood_waits)
        click.echo(f"{FLOOD:<10} (the flood) waited median {median:8.1f} ms,"
                   f" max {max(flood_waits):8.1f} ms")
        for t in self.quiet:
            w = self._waits(t)
            if w:
                click.echo(f"{t:<10} (quiet)     waited median {statistics.median(w):8.1f} ms, "
                           f"max {max(w):8.1f} ms  ({len(w)} jobs)")
        click.echo("The quiet tenants were served within a turn of the ring while the flood "
                   "drained: fairness without polling.")
        if is_embedded(self.redis_url):
            click.echo("The embedded server keeps running for your next command "
                       "(`emqtasks embedded stop` stops it).")

    def _waits(self, tenant: str) -> list[float]:
        return [float(x) for x in demo_app.client.lrange(_k(f"wait:{tenant}"), 0, -1)]

    def _cleanup(self) -> None:
        r = demo_app.client
        for key in list(r.scan_iter(match=_k("*"))):
            r.delete(key)
        demo_app.purge()


@click.command()
@click.option("--redis-url", envvar="EMQ_REDIS_URL", default="embedded", show_default=True,
              help="server to use; 'embedded' runs the bundled development server")
@click.option("-c", "--concurrency", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--flood", type=click.IntRange(1), default=5000, show_default=True,
              help="jobs the noisy tenant sends at once")
@click.option("--tenants", type=click.IntRange(1, 20), default=4, show_default=True,
              help="quiet tenants trickling in beside the flood")
@click.option("--work-ms", type=click.FloatRange(0), default=20.0, show_default=True,
              help="how long each job works")
def demo(redis_url: str, concurrency: int, flood: int, tenants: int, work_ms: float) -> Any:
    """Watch a flood from one tenant not starve the others (embedded server by default)."""
    sys.exit(Demo(redis_url, concurrency, flood, tenants, 0.3, work_ms).run())

"""The shared slots between a master and its children, read while another process writes
them: a reader sees the master's real heartbeat and whole jobs, never a half-written value.

Two real processes (a fork, as the master's children are) on one Slots; bounded in time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from emqtasks.store.queue import Lease
from emqtasks.worker.slots import Slots

#: How long each test reads while the other process writes (seconds).
READING = 1.0


@contextmanager
def writing(slots: Slots, write: Callable[[int], None]) -> Iterator[None]:
    """A forked process calls write(n), n = 0, 1, ... until the slots' stop flag is set
    (or a few seconds pass), as a master beats or a child starts and clears jobs."""
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the writer process
        code = 1
        try:
            end, n = time.monotonic() + READING + 5, 0
            while not slots.stopping and time.monotonic() < end:
                write(n)
                n += 1
            code = 0
        finally:
            os._exit(code)
    try:
        yield
    finally:
        slots.set_stopping()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_child_reads_the_masters_heartbeat_while_it_beats_never_a_zeroed_one() -> None:
    # Given a master beating as fast as it can
    slots = Slots(2)
    slots.beat()
    silent: list[float] = []
    with writing(slots, lambda _n: slots.beat()):
        # When a child reads the heartbeat over and over meanwhile
        end = time.monotonic() + READING
        while time.monotonic() < end:
            s = slots.master_silent()
            if s:
                silent.append(s)
    # Then every read found the master fresh (pack_into zeroed the word before writing
    # it: a child read 0.0, a master silent since the machine booted)
    assert silent == [], f"{len(silent)} reads took the master as silent, e.g. {silent[:3]}"


def test_the_master_reads_a_slot_a_child_rewrites_as_a_whole_job_or_free() -> None:
    # Given a child starting and clearing two different jobs in its slot as fast as it can
    slots = Slots(1)
    leases = [Lease(f"{c}" * 26, "", "", 1, f"{c}" * 32, "", 30_000) for c in "ab"]

    def start_and_clear(n: int) -> None:
        if n % 2:
            slots.clear(0)
        else:
            slots.start(0, leases[n // 2 % 2], 5.0)

    seen, wrong = 0, []
    with writing(slots, start_and_clear):
        # When the master reads the slot meanwhile
        end = time.monotonic() + READING
        while time.monotonic() < end:
            job = slots.read(0)
            if job is None:
                continue
            seen += 1
            # Then each job it sees is one the child wrote, whole
            if (job.lease.id, job.lease.nonce) not in {(x.id, x.nonce) for x in leases} \
                    or job.started <= 0 or job.time_limit != 5.0:
                wrong.append(job)
    assert seen > 0
    assert wrong == [], f"{len(wrong)} torn reads, e.g. {wrong[:2]}"


def test_the_jobs_a_child_holds_are_read_back_until_it_starts_or_releases_them() -> None:
    # Given a child (the second of two) that claimed a batch of four, then a batch of two
    slots = Slots(2, held=4)
    batch = [Lease(f"j{i}", "", "", i + 1, f"n{i}" * 8, "g", 30_000) for i in range(6)]
    slots.hold(1, batch[:4])
    assert [(h.id, h.attempts, h.nonce) for h in slots.held(1)] == [
        (b.id, b.attempts, b.nonce) for b in batch[:4]]
    # When it starts the first, releases the third and hands the rest on
    slots.unhold(1, batch[0])
    slots.unhold(1, batch[2])
    assert [h.id for h in slots.held(1)] == ["j1", "j3"]
    slots.hold(1, batch[4:])
    # Then the master reads only the jobs held now; the other child holds none
    assert [h.id for h in slots.held(1)] == ["j4", "j5"]
    assert slots.held(0) == []
    # And a replacement child starts with none (a lease never held is ignored)
    slots.unhold(1, batch[0])
    slots.reset(1)
    assert slots.held(1) == []


def test_a_child_holds_at_most_its_cap_the_rest_wait_for_their_lease() -> None:
    slots = Slots(1, held=2)
    batch = [Lease(f"j{i}", "", "", 1, f"n{i}", "g", 30_000) for i in range(3)]
    slots.hold(0, batch)
    assert [h.id for h in slots.held(0)] == ["j0", "j1"]
    slots.unhold(0, batch[2])
    slots.unhold(0, batch[0])
    assert [h.id for h in slots.held(0)] == ["j1"]

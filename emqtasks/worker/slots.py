"""Shared memory between a master and its children: what each child runs, and the stop flag.

Each child has ``per_child`` slots (one per job it may run at once: 1, or its async
concurrency); slot ``child * per_child + j`` is its j-th. A child writes a job into a slot
at its start and clears it at the end, so the master can renew leases, enforce time limits
and fail the jobs of a dead child without a message per job. Each slot is guarded by a
sequence counter (odd while a write is under way) so the master never acts on a torn read.
The master writes one thing back per child: the nonce of a job it found past its time
limit, just before it sends the child SIGTERM. And one for all: its heartbeat, the monotonic
time of its main loop's last turn (the loop that renews the leases). A child claims only
while it is fresh, so a master frozen (SIGSTOP, a debugger, a VM pause) stops its children
claiming work that nobody would renew. A child that is about to write a job's
failure notes it in the slot first (the error, its delay, whether it is final): a child
that dies writing it leaves the master the real reason to write (see Master).

A batching child also lists the jobs it holds (claimed, not started: child.py,
``_drain_batches``) in ``held`` entries of its own: it writes a batch's leases as it claims
them and clears each as it starts it or hands it back. A child that is killed (a hard stop)
or dies leaves the master the ones still listed, to release (fenced) rather than leave
active until their lease runs out. The master reads them only once the child is gone: an
entry torn by its death, or one the child had released already, is a stale token the
server refuses.
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import NamedTuple

from ..store.queue import Lease

#: The most of a failure's error text a slot keeps (bytes): its first line and the start of
#: its traceback, enough for the master to write the real reason.
FAILURE_TEXT_MAX = 1000

# A slot: its sequence counter (an 8-byte word of its own), then its body: running, kind,
# queue, started (monotonic), time_limit, retry_delay, lease_ms, attempts, id, nonce,
# abort_grace (< 0: the worker's); then
# the failure being written: 0 none / 1 a retry / 2 final, its delay (< 0: the row's), the
# start of its error text (UTF-8). Padded to whole words, so every counter is 8-aligned.
_BODY = struct.Struct(f"=BBBdddqq128s48sdBd{FAILURE_TEXT_MAX}s")
_SLOT_SIZE = -(-(8 + _BODY.size) // 8) * 8
_HEADER_SIZE = 16     # the pool-wide stop flag (byte 0), the master's heartbeat (word 1)
_BEAT_WORD = 1
#: A master whose loop has not turned for this long is taken as frozen: its children claim
#: nothing more until it turns again. The loop turns every 0.1 s while a child is busy, and
#: writes the heartbeat before it wakes an idle child (an idle master may wait 1 s).
MASTER_SILENT_AFTER = 1.0
_LIMIT = struct.Struct("=48s")  # master -> child: nonce of the job past its time limit
_ABORT = struct.Struct("=48s")  # master -> child, per slot: nonce of the attempt to abort
# A held entry (child -> master, read once the child is gone): its live word (0: free, an
# 8-byte word of its own, written after the body), then attempts, id, nonce
_HELD = struct.Struct("=q128s48s")
_HELD_SIZE = -(-(8 + _HELD.size) // 8) * 8
_HELD_WORDS = _HELD_SIZE // 8
# The heartbeat and the counters are read while another process writes them, so each is
# written and read as one aligned 8-byte word through a memoryview (one load or store);
# never with struct.pack_into, which zeroes its bytes before it writes them: a child that
# read the heartbeat then took a master that had just beaten for one silent since boot.

SYNC, ASYNC = 0, 1              # kinds of job: a sync one is stopped by SIGTERM at its limit


class Running(NamedTuple):
    """A job a child is running, as the master sees it."""

    lease: Lease
    started: float
    time_limit: float
    kind: int = SYNC
    queue: int = 0              # index of the job's queue in the worker's -Q list
    retry_delay: float = -1.0   # the delay its policy gives a retry now; < 0: the row's
    failure: str = ""           # the failure its child was writing when it died, if any
    final: bool = False         # ... into dead at once
    failure_delay: float = -1.0  # ... its retry delay; < 0: the row's
    abort_grace: float = -1.0   # s it gets to return once aborted; < 0: the worker's


class Slots:
    """``per_child`` slots per child in an anonymous shared mapping, made before the fork."""

    def __init__(self, children: int, per_child: int = 1, held: int = 0) -> None:
        self.children = children
        self.per_child = per_child
        self.count = children * per_child
        #: The most jobs a child lists as held (its batch size cap); more wait for their lease
        self.held_per_child = held
        self._held_base = (_HEADER_SIZE + _SLOT_SIZE * self.count + _LIMIT.size * children
                           + _ABORT.size * self.count)   # 8-aligned: both sizes are 48
        self.mem = mmap.mmap(-1, self._held_base + _HELD_SIZE * held * children)
        self._words = memoryview(self.mem).cast("Q")   # the slots' counters
        self._floats = memoryview(self.mem).cast("d")  # the heartbeat
        self._seq = [0] * self.count
        #: Child side: the job fields last written to each slot (failing() rewrites them).
        self._job: list[tuple[object, ...]] = [(0,) * 11] * self.count
        #: Child side: the leases each child's held entries list (None: free), in order.
        self._held: list[list[Lease | None]] = [[None] * held for _ in range(children)]
        self._held_top = [0] * children   # ... past the last one written
        self._held_word0 = self._held_base // 8

    def of_child(self, child: int) -> range:
        """The slot indexes of one child."""
        return range(child * self.per_child, (child + 1) * self.per_child)

    def _offset(self, index: int) -> int:
        return _HEADER_SIZE + _SLOT_SIZE * index

    def _limit_offset(self, child: int) -> int:
        return _HEADER_SIZE + _SLOT_SIZE * self.count + _LIMIT.size * child

    def _abort_offset(self, index: int) -> int:
        return self._limit_offset(self.children) + _ABORT.size * index

    # -- child side ------------------------------------------------------------------
    def _write(self, index: int, values: tuple[object, ...]) -> None:
        word = self._offset(index) // 8
        seq = self._seq[index] + 1
        self._words[word] = seq   # odd: write under way
        _BODY.pack_into(self.mem, word * 8 + 8, *values)
        self._seq[index] = seq + 1
        self._words[word] = seq + 1
        self._job[index] = values[:11]

    def start(self, index: int, lease: Lease, time_limit: float, kind: int = SYNC,
              queue: int = 0, retry_delay: float | None = None,
              abort_grace: float | None = None) -> None:
        self._write(index, (1, kind, queue, time.monotonic(), time_limit,
                            -1.0 if retry_delay is None else retry_delay, lease.lease_ms,
                            lease.attempts, lease.id.encode(), lease.nonce.encode(),
                            -1.0 if abort_grace is None else abort_grace, 0, -1.0, b""))

    def failing(self, child: int, lease: Lease, error: str, delay: float | None,
                final: bool) -> None:
        """Note the failure a child is about to write for one of its jobs (found by its
        nonce), so the master can write it should the child die first."""
        nonce = lease.nonce.encode()
        for index in self.of_child(child):
            job = self._job[index]
            if job[0] and job[9] == nonce:
                text = error.encode("utf-8", "backslashreplace")[:FAILURE_TEXT_MAX]
                self._write(index, (*job, 2 if final else 1,
                                    -1.0 if delay is None else delay, text))
                return

    def clear(self, index: int) -> None:
        self._write(index, (0, 0, 0, 0.0, 0.0, -1.0, 0, 0, b"", b"", -1.0, 0, -1.0, b""))

    def take_time_limit(self, child: int, nonce: str) -> bool:
        """Whether the master flagged the job with this nonce as past its time limit; the
        flag is consumed, so a later SIGTERM means what it says."""
        off = self._limit_offset(child)
        if not nonce or _LIMIT.unpack_from(self.mem, off)[0].rstrip(b"\0") != nonce.encode():
            return False
        _LIMIT.pack_into(self.mem, off, b"")
        return True

    def hold(self, child: int, leases: list[Lease]) -> None:
        """Child side: the jobs it just claimed, held until it starts or releases each
        (``unhold``); the entries of the ones held before are free again (each was started
        or released). Past ``held_per_child`` the rest are not listed (their lease runs out)."""
        words, held = self._words, self._held[child]
        word = self._held_word(child, 0)
        n = min(len(leases), self.held_per_child)
        for i in range(n):
            lease = leases[i]
            words[word] = 0
            _HELD.pack_into(self.mem, word * 8 + 8, lease.attempts, lease.id.encode(),
                            lease.nonce.encode())
            words[word] = 1
            held[i] = lease
            word += _HELD_WORDS
        for i in range(n, self._held_top[child]):   # the rest of the last batch's entries
            if held[i] is not None:
                words[word] = 0
                held[i] = None
            word += _HELD_WORDS
        self._held_top[child] = n

    def unhold(self, child: int, lease: Lease) -> None:
        """Child side: a held job was started (its slot written first) or released."""
        held = self._held[child]
        for i in range(self._held_top[child]):
            h = held[i]
            if h is lease or (h is not None and h == lease):
                held[i] = None
                self._words[self._held_word(child, i)] = 0
                return

    def _held_word(self, child: int, i: int) -> int:
        """The index (in 8-byte words) of the live word of a child's i-th held entry."""
        return self._held_word0 + (self.held_per_child * child + i) * _HELD_WORDS

    def reset(self, child: int) -> None:
        """Master side, before a replacement child takes the child's slots."""
        for index in self.of_child(child):
            seq = self._words[self._offset(index) // 8]
            self._seq[index] = seq + seq % 2
            self.clear(index)
        _LIMIT.pack_into(self.mem, self._limit_offset(child), b"")
        for index in self.of_child(child):
            _ABORT.pack_into(self.mem, self._abort_offset(index), b"")
        for i in range(self.held_per_child):
            self._words[self._held_word(child, i)] = 0
            self._held[child][i] = None
        self._held_top[child] = 0

    def abort_asked(self, index: int) -> str:
        """Child side: the nonce of the attempt the master asked to abort in this slot
        ('' none); the child acts only when it is the nonce of the job it runs there."""
        return str(_ABORT.unpack_from(self.mem, self._abort_offset(index))[0]
                   .rstrip(b"\0").decode())

    # -- master side -----------------------------------------------------------------
    def read(self, index: int) -> Running | None:
        """The job in a slot, or None when free (or mid-write: ask again later)."""
        word = self._offset(index) // 8
        seq = self._words[word]
        if seq % 2:
            return None
        (running, kind, queue, started, limit, retry_delay, lease_ms, attempts, raw_id,
         raw_nonce, abort_grace, failing, failure_delay,
         failure) = _BODY.unpack_from(self.mem, word * 8 + 8)
        if not running or self._words[word] != seq:
            return None
        lease = Lease(raw_id.rstrip(b"\0").decode(), "", "", attempts,
                      raw_nonce.rstrip(b"\0").decode(), "", lease_ms)
        text = failure.rstrip(b"\0").decode("utf-8", "ignore") if failing else ""
        return Running(lease, started, limit, kind, queue, retry_delay, text, failing == 2,
                       failure_delay, abort_grace)

    def running(self, child: int) -> list[Running]:
        """Every job a child runs now."""
        return [r for r in map(self.read, self.of_child(child)) if r is not None]

    def held(self, child: int) -> list[Lease]:
        """The jobs a child that is gone listed as held (claimed, not started); as fencing
        tokens only (id, attempts, nonce). Not for a live child: no read here is guarded."""
        leases = []
        for i in range(self.held_per_child):
            word = self._held_word(child, i)
            if self._words[word]:
                attempts, raw_id, raw_nonce = _HELD.unpack_from(self.mem, word * 8 + 8)
                leases.append(Lease(raw_id.rstrip(b"\0").decode("utf-8", "replace"), "", "",
                                    attempts, raw_nonce.rstrip(b"\0").decode("utf-8", "replace"),
                                    "", 0))
        return leases

    def ask_abort(self, index: int, nonce: str) -> None:
        """Ask the child of slot ``index`` to abort the attempt ``nonce`` it runs there,
        before the signal that makes it look (SIGUSR1)."""
        _ABORT.pack_into(self.mem, self._abort_offset(index), nonce.encode())

    def flag_time_limit(self, child: int, nonce: str) -> None:
        """Mark the child's job (by its nonce) as past its time limit, before the SIGTERM
        that asks the child to stop it."""
        _LIMIT.pack_into(self.mem, self._limit_offset(child), nonce.encode())

    @property
    def stopping(self) -> bool:
        return self.mem[0] == 1

    def set_stopping(self) -> None:
        self.mem[0] = 1

    def beat(self) -> None:
        """Master side: its main loop turned now (the time is the system's monotonic
        clock, the same in every process)."""
        self._floats[_BEAT_WORD] = time.monotonic()

    def master_silent(self) -> float:
        """Child side: seconds since the master's loop last turned, when that is longer
        than MASTER_SILENT_AFTER (else 0.0)."""
        silent = time.monotonic() - self._floats[_BEAT_WORD]
        return silent if silent > MASTER_SILENT_AFTER else 0.0

"""Shared memory between a master and its children: what each child runs, and the stop flag.

A child writes its current job into its slot at start and clears it at the end, so the
master can renew leases, enforce time limits and fail the job of a dead child without a
message per job. Each slot is guarded by a sequence counter (odd while a write is under
way) so the master never acts on a torn read. The master writes one thing back per slot:
the nonce of a job it found past its time limit, just before it sends the child SIGTERM.
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import NamedTuple

from ..queue import Lease

# seq, running, started (monotonic), time_limit, lease_ms, attempts, id, nonce
_SLOT = struct.Struct("=QBddqq128s48s")
_HEADER = struct.Struct("=B")   # the pool-wide stop flag
_LIMIT = struct.Struct("=48s")  # master -> child: nonce of the job past its time limit


class Running(NamedTuple):
    """A job a child is running, as the master sees it."""

    lease: Lease
    started: float
    time_limit: float


class Slots:
    """One slot per child in an anonymous shared mapping, made before the fork."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.mem = mmap.mmap(-1, _HEADER.size + (_SLOT.size + _LIMIT.size) * count)
        self._seq = [0] * count

    def _offset(self, index: int) -> int:
        return _HEADER.size + _SLOT.size * index

    def _limit_offset(self, index: int) -> int:
        return _HEADER.size + _SLOT.size * self.count + _LIMIT.size * index

    # -- child side ------------------------------------------------------------------
    def _write(self, index: int, running: int, started: float, limit: float, lease_ms: int,
               attempts: int, job_id: str, nonce: str) -> None:
        off = self._offset(index)
        seq = self._seq[index] + 1
        struct.pack_into("=Q", self.mem, off, seq)  # odd: write under way
        _SLOT.pack_into(self.mem, off, seq, running, started, limit, lease_ms, attempts,
                        job_id.encode(), nonce.encode())
        self._seq[index] = seq + 1
        struct.pack_into("=Q", self.mem, off, seq + 1)

    def start(self, index: int, lease: Lease, time_limit: float) -> None:
        self._write(index, 1, time.monotonic(), time_limit, lease.lease_ms, lease.attempts,
                    lease.id, lease.nonce)

    def clear(self, index: int) -> None:
        self._write(index, 0, 0.0, 0.0, 0, 0, "", "")

    def take_time_limit(self, index: int, nonce: str) -> bool:
        """Whether the master flagged the job with this nonce as past its time limit; the
        flag is consumed, so a later SIGTERM means what it says."""
        off = self._limit_offset(index)
        if not nonce or _LIMIT.unpack_from(self.mem, off)[0].rstrip(b"\0") != nonce.encode():
            return False
        _LIMIT.pack_into(self.mem, off, b"")
        return True

    def reset(self, index: int) -> None:
        """Master side, before a replacement child takes the slot."""
        seq = struct.unpack_from("=Q", self.mem, self._offset(index))[0]
        self._seq[index] = seq + seq % 2
        self.clear(index)
        _LIMIT.pack_into(self.mem, self._limit_offset(index), b"")

    # -- master side -----------------------------------------------------------------
    def read(self, index: int) -> Running | None:
        """The child's current job, or None when idle (or mid-write: ask again later)."""
        off = self._offset(index)
        seq, running, started, limit, lease_ms, attempts, raw_id, raw_nonce = \
            _SLOT.unpack_from(self.mem, off)
        if seq % 2 or not running:
            return None
        if struct.unpack_from("=Q", self.mem, off)[0] != seq:
            return None
        lease = Lease(raw_id.rstrip(b"\0").decode(), "", "", attempts,
                      raw_nonce.rstrip(b"\0").decode(), "", lease_ms)
        return Running(lease, started, limit)

    def flag_time_limit(self, index: int, nonce: str) -> None:
        """Mark the child's job (by its nonce) as past its time limit, before the SIGTERM
        that asks the child to stop it."""
        _LIMIT.pack_into(self.mem, self._limit_offset(index), nonce.encode())

    @property
    def stopping(self) -> bool:
        return self.mem[0] == 1

    def set_stopping(self) -> None:
        self.mem[0] = 1

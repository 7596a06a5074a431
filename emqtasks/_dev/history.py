"""The chaos soak's history: an append-only log of operations, as a Jepsen test keeps one.

Each process that takes part (the soak's producer and reader threads, every worker child)
appends JSON lines to a file of its own in one folder: ``{"op": ..., "type": ..., "t": ...,
"pid": ...}`` plus the operation's fields. ``t`` is ``time.monotonic()``: on Linux one clock
for every process of the machine, so the records of different processes can be ordered.
A line is one ``write(2)`` on an ``O_APPEND`` descriptor: a SIGKILL cannot leave half a
record behind but for the last line, which the reader skips. history_check.py judges it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: The folder the worker children append to (set in their environment by the soak).
ENV = "EMQ_CHAOS_HISTORY"


class Recorder:
    """Appends records to ``folder/<name>-<pid>.jsonl``; a forked child gets its own file."""

    def __init__(self, folder: Path | str, name: str) -> None:
        self.folder, self.name = Path(folder), name
        self._fd: int | None = None
        self._pid = 0

    def record(self, op: str, type_: str, **fields: Any) -> None:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            self._fd = os.open(self.folder / f"{self.name}-{pid}.jsonl",
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = pid
        line = json.dumps({"op": op, "type": type_, "t": time.monotonic(), "pid": pid,
                           **fields}, separators=(",", ":"))
        os.write(self._fd, line.encode() + b"\n")

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


def read(folder: Path | str) -> list[dict[str, Any]]:
    """Every record of the folder, in time order (a torn last line is skipped)."""
    records: list[dict[str, Any]] = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue   # the line a SIGKILL cut short
    records.sort(key=lambda r: r["t"])
    return records

"""Live workers: the heartbeat each master writes on its tick, and how long it lives.

The beat's row, its keys and their reads are the store's (store/beats.py: ``Beat``,
``Queue.reap_tick(beat=...)`` writes it with the tick's reap, ``Queue.workers()`` lists the
live ones, ``Queue.remove_beat`` is a stopping master's goodbye). A beat lives BEAT_TICKS
ticks, so a master that dies drops off the list by itself.
"""

from __future__ import annotations

import os
import socket
import time

from .._version import __version__
from ..store.beats import Beat

__all__ = ["BEAT_TICKS", "Beat", "new_beat"]

#: A heartbeat lives this many ticks: a master missing two beats in a row is gone.
BEAT_TICKS = 3


def new_beat(queues: list[str], concurrency: int) -> Beat:
    return Beat(socket.gethostname(), os.getpid(), list(queues), concurrency, __version__,
                time.time())

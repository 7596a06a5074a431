"""What every part of ``Queue`` shares: the client, the keys, the scripts, the hot path's
selection, and the reads the verbs' own errors and arguments need (the queue's groups, why a
verb refused)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from ..errors import CorruptKey
from .autopipe import Batcher, autopipeline_mode
from .cluster import is_cluster, node_kwargs, scan_keys
from .diagnose import diagnose_plan
from .durable import Durable
from .functions import scripts as bind_scripts
from .groups import GROUP_BOOKS, group_names, queue_group_books
from .keys import QueueKeys
from .plan import Cmd, Pipe, Recorder, Scan, Steps, run
from .selection import HotVerbs

T = TypeVar("T")


class QueueCore:
    """One queue on one Redis client. Thread-compatible like the client it wraps."""

    def __init__(self, client: Any, name: str, native: str | None = None,
                 autopipeline: bool | None = None) -> None:
        self.client = client
        self.keys = QueueKeys(name)
        self.name = name
        self.scripts = bind_scripts(client)
        #: The hot verbs: the module's commands when the server has them (EMQ_NATIVE, or
        #: ``native`` = auto / off / require), else the scripts.
        self.hot = HotVerbs(client, self.scripts, native)
        self._k = self.keys.fixed
        #: The durable setting of the writes a worker makes (the ack that stores a result,
        #: a schedule's firing) when the call gives none (store/durable.py); None: off.
        self.durable: Durable | None = None
        #: Auto-pipelining of the enqueues of this queue's threads (store/autopipe.py;
        #: ``autopipeline`` None reads EMQ_AUTOPIPELINE); None: off, or a cluster client.
        on = autopipeline_mode() if autopipeline is None else autopipeline
        self.batcher: Batcher | None = (
            Batcher(self.enqueue_now) if on and not is_cluster(client) else None)

    def enqueue_now(self, jobs: Any, expires_ms: Any = None, tenants: Any = None,
                    durable: Any = None) -> Any:
        raise NotImplementedError    # hot.py's

    def run(self, steps: Steps[T]) -> T:
        """Carry out a verb's plan (plan.py) on this queue's client."""
        return run(steps, self.client, self.scripts, self.hot)

    def ping(self) -> bool:
        """One round trip to the server holding the queue (on a cluster, the node serving
        its slot), so the connection a first claim would need is open."""
        return bool(self.client.ping(**node_kwargs(self.client, self.keys.ring)))

    def server_ms(self) -> int:
        """The server's clock, in ms (on a cluster, the clock of the queue's node)."""
        return server_ms(self.client, self.keys)

    def scan(self, match: str) -> Iterator[str]:
        """Keys of this queue matching a pattern, by SCAN of the server that holds the queue
        (on a cluster, only the node serving its slot: see cluster.scan_keys)."""
        return scan_keys(self.client, match, self.keys.ring)

    def groups(self) -> set[str]:
        """Every group the queue knows of (store/groups.py): with a lane, or named by a book
        (on the ring, in flight, configured, backing off, held back, paused); a book of the
        wrong type names none (stats() names the key)."""
        return self.run(groups_plan(self.keys))

    def corrupt(self, groups: Iterable[str], outcome: str) -> CorruptKey:
        """The error for a verb refused by a key of the wrong type (or a book it cannot
        read), naming what the checker finds (store/diagnose.py)."""
        return self.run(corrupt_plan(self.keys, groups, outcome))


def groups_plan(keys: QueueKeys) -> Steps[set[str]]:
    """QueueCore.groups: the lanes by a SCAN, the books in one round trip."""
    found = yield Scan(keys.lane_pattern, keys.ring)
    lanes = [keys.group_of_lane(key) for key in found]
    books = Recorder()
    queue_group_books(books, keys)
    replies = yield Pipe(books.cmds, raise_on_error=False)
    return group_names(lanes, {name: r for (name, _), r in zip(GROUP_BOOKS, replies)})


def corrupt_plan(keys: QueueKeys, groups: Iterable[str], outcome: str) -> Steps[CorruptKey]:
    """QueueCore.corrupt: the error, naming what diagnose finds."""
    found = yield from diagnose_plan(keys, groups)
    what = "; ".join(found) if found else "a key of the queue holds the wrong type"
    return CorruptKey(f"queue {keys.name}: {outcome}: {what} (emqtasks check names every "
                      "such key, emqtasks check --repair mends what it can)", tuple(found))


def clock_plan(keys: QueueKeys) -> Steps[int]:
    """server_ms as a plan."""
    secs, micros = yield Cmd("time", node=keys.ring)
    return int(secs) * 1000 + int(micros) // 1000


def server_ms(client: Any, keys: QueueKeys) -> int:
    """The server's clock (ready_at and oldest_age are server times); on a cluster, the
    clock of the node that holds the queue (a cluster pipeline refuses TIME)."""
    secs, micros = client.time(**node_kwargs(client, keys.ring))
    return int(secs) * 1000 + int(micros) // 1000

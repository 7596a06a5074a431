"""Bad input: broken payloads, unknown tasks, misfit arguments, oversized payloads, odd group
and queue names. Each is refused with a clear error or stored safely; a worker never crashes
on one, never retries it, and keeps serving good work; no key leaves ``emq:{q}:``.

(Unknown task, one misfit and one garbled payload also run in test_worker.py; the cases here
are the ones it does not cover, each checked for a single attempt and an unchanged pool.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from workerproc import HERE, WorkerProc

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.errors import (
    InvalidGroup,
    InvalidQueueName,
    PayloadTooLarge,
    SerializationError,
)
from emqtasks.store.keys import FIXED, GROUP_MAX_BYTES, QueueKeys, check_group
from emqtasks.store.queue import NewJob, Queue
from emqtasks.verdicts import AckVerdict

pytestmark = pytest.mark.timeout(120)

ENVELOPE_ERROR = "payload is not a version-1 emqtasks envelope"


def _noop(*args: Any, **kwargs: Any) -> None:
    """The body of the tasks registered here; nothing in this process runs them."""


# -- a worker pool shared by the payload cases ------------------------------------------------

@dataclass
class Pool:
    app: App
    worker: WorkerProc
    raw: redis.Redis   # replies as bytes: writes what no emqtasks producer would
    children: set[int] = frozenset()   # type: ignore[assignment]
    log_from: int = 0                  # where this test's part of the worker log begins

    def baseline(self) -> None:
        self.children = set(self.worker.children())
        self.log_from = len(self.worker.output())

    @property
    def queue(self) -> Queue:
        return self.app.queue()

    def enqueue_raw(self, job_id: str, task: str | bytes, payload: str | bytes,
                    group: str | bytes = "bad") -> None:
        """A job row written through the real enqueue verb, its fields as given (bytes go to
        Redis as they are: invalid UTF-8 included)."""
        job = NewJob(job_id, task, payload, group, 3, 30_000, 50, 3600)  # type: ignore[arg-type]
        if isinstance(group, bytes):   # check_group takes text; the verb takes any bytes
            args: list[Any] = [1, *job]
            assert Queue(self.raw, self.queue.name).scripts.enqueue(
                self.queue.keys.fixed, args) == [1]
            return
        assert Queue(self.raw, self.queue.name).enqueue_many([job]) == [1]

    def settle(self, job_id: str, state: str = "dead") -> dict[str, Any]:
        self.worker.wait_for(lambda: self.queue.status(job_id) == state, timeout=15,
                             what=f"{job_id} {state}")
        info = self.queue.job(job_id)
        assert info is not None
        return info

    def log_line(self, job_id: str) -> str:
        """The worker's log line about a job (written just after its outcome is)."""
        found: list[str] = []

        def seen() -> bool:
            found[:] = [ln for ln in self.worker.output().splitlines() if job_id in ln]
            return bool(found)

        self.worker.wait_for(seen, timeout=5, what=f"a log line about {job_id}")
        return found[0]

    def assert_healthy(self) -> None:
        """The same children as at start (none crashed or was replaced), no traceback in the
        log, and a good job still runs."""
        assert self.app.send_task("sec.add", (2, 3)).get(timeout=15) == 5
        out = self.worker.output()[self.log_from:]
        assert set(self.worker.children()) == self.children, out[-3000:]
        assert "Traceback" not in out and "exited with" not in out, out[-3000:]


@pytest.fixture(scope="module")
def shared_pool(redis_url: str) -> Iterator[Pool]:
    name = f"bad-{uuid.uuid4().hex[:10]}"
    app = App(redis_url=redis_url, queue=name)
    raw = redis.Redis.from_url(redis_url)
    with WorkerProc(redis_url, name, modules=("security_tasks",), concurrency=2) as w:
        w.wait_ready()
        w.wait_for(lambda: len(w.children()) == 2, what="both children")
        yield Pool(app, w, raw)
        assert w.stop() == 0
    app.purge()
    app.close()
    raw.close()


@pytest.fixture
def pool(shared_pool: Pool) -> Pool:
    """The module's worker pool, its children and log as they stand when the test starts
    (so a test is judged on what happened during it)."""
    shared_pool.baseline()
    return shared_pool


def assert_dead_once(pool: Pool, job_id: str, *reason: str) -> dict[str, Any]:
    """Dead on its first attempt, with the reason; in `dead` and nowhere else."""
    info = pool.settle(job_id)
    assert info["attempts"] == 1, info
    for words in reason:
        assert words in (info["error"] or ""), (words, info["error"])
    q = pool.queue
    c, k = q.client, q.keys
    assert c.zscore(k.dead, job_id) is not None
    assert c.zscore(k.active, job_id) is None and c.zscore(k.delayed, job_id) is None
    assert c.zscore(k.lane("bad"), job_id) is None
    return info


# -- payloads --------------------------------------------------------------------------------

DEEP = 100_000

PAYLOADS = [
    # invalid JSON
    ("truncated", '{"v":1,"a":[1', "undecodable payload"),
    ("trailing-garbage", '{"v":1,"a":[1,2],"k":{}} trailing', "undecodable payload"),
    ("empty", "", "undecodable payload"),
    ("single-quotes", "{'v':1,'a':[1,2],'k':{}}", "undecodable payload"),
    ("deeply-nested", '{"v":1,"a":[' + "[" * DEEP + "]" * DEEP + '],"k":{}}', "nested too deeply"),
    ("int-too-long", '{"v":1,"a":[' + "9" * 5000 + ',1],"k":{}}', "undecodable payload"),
    # NaN and Infinity: Python's json reads them, JSON has no such thing, our encoder never
    # writes them: refused (serialization.loads_args)
    ("nan", '{"v":1,"a":[NaN,1],"k":{}}', "NaN is not JSON"),
    ("infinity", '{"v":1,"a":[Infinity,1],"k":{}}', "Infinity is not JSON"),
    ("minus-infinity", '{"v":1,"a":[1,2],"k":{"x":-Infinity}}', "-Infinity is not JSON"),
    ("overflow-to-inf", '{"v":1,"a":[1e999,1],"k":{}}', "overflows"),
    # invalid UTF-8 (raw bytes; a worker child decodes replies as UTF-8)
    ("utf8-in-string", b'{"v":1,"a":["\xff\xfe",1],"k":{}}', "not valid UTF-8 (bad byte 0xff"),
    ("utf8-garbage", b"\xff\xfe\x00\x01garbage", "not valid UTF-8"),
    ("utf8-surrogate-cesu", b'{"v":1,"a":["\xed\xa0\x80",1],"k":{}}', "not valid UTF-8"),
    ("utf8-truncated-seq", b'{"v":1,"a":["\xe2\x82",1],"k":{}}', "not valid UTF-8"),
    # a top level that is not the envelope
    ("top-list", "[1,2]", ENVELOPE_ERROR),
    ("top-number", "42", ENVELOPE_ERROR),
    ("top-string", '"hello"', ENVELOPE_ERROR),
    ("top-null", "null", ENVELOPE_ERROR),
    ("top-true", "true", ENVELOPE_ERROR),
    ("empty-object", "{}", ENVELOPE_ERROR),
    ("version-2", '{"v":2,"a":[1,2],"k":{}}', ENVELOPE_ERROR),
    ("args-not-list", '{"v":1,"a":{"a":1},"k":{}}', ENVELOPE_ERROR),
    ("kwargs-not-object", '{"v":1,"a":[1,2],"k":[]}', ENVELOPE_ERROR),
]


@pytest.mark.parametrize("case, payload, reason", PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_a_broken_payload_is_dead_on_its_first_attempt_and_the_pool_goes_on(
        pool: Pool, case: str, payload: str | bytes, reason: str) -> None:
    # Given a job of a registered task whose payload row is broken
    job_id = f"p-{case}-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(job_id, "sec.add", payload)
    # Then it lands in dead with the reason, on its first attempt (retrying cannot help)
    info = assert_dead_once(pool, job_id, "SerializationError", reason)
    # And the worker logged one short line about it, not a traceback
    line = pool.log_line(job_id)
    assert "failed, dead" in line and len(line) < 1000, line
    # And the pool is the same pool, still serving good work
    pool.assert_healthy()
    assert info["task"] == "sec.add"


def test_the_row_of_an_undecodable_payload_stays_readable(pool: Pool) -> None:
    # Given a dead job whose payload is not UTF-8
    job_id = f"p-readable-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(job_id, "sec.add", b'{"v":1,"a":["\xff"],"k":{}}')
    assert_dead_once(pool, job_id, "not valid UTF-8")
    # Then a producer's view of it (HGETALL of the row, payload included) does not fail,
    # and the stored bytes are the bytes written
    assert pool.app.job(job_id)["state"] == "dead"
    assert pool.raw.hget(pool.queue.keys.job(job_id), "payload") == b'{"v":1,"a":["\xff"],"k":{}}'


def test_non_utf8_task_and_group_names_in_a_row_do_not_crash_the_worker(pool: Pool) -> None:
    # A task name that is not UTF-8: unknown, dead at once
    bad_task = f"p-task-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(bad_task, b"sec.\xff\xfe", '{"v":1,"a":[1,2],"k":{}}')
    assert_dead_once(pool, bad_task, "UnknownTask")
    # A group name that is not UTF-8 (only a raw write can make one): served as any other
    bad_group = f"p-group-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(bad_group, "sec.add", '{"v":1,"a":[1,2],"k":{}}', group=b"g\xff")
    assert pool.settle(bad_group, "done")["attempts"] == 1
    pool.assert_healthy()


RESULTS = [
    ("lone-surrogate", "sec.echo", '{"v":1,"a":["\\ud800"],"k":{}}'),   # a JSON escape
    ("nested-too-deep", "sec.nested", '{"v":1,"a":[100000],"k":{}}'),
]


@pytest.mark.parametrize("case, task, payload", RESULTS, ids=[r[0] for r in RESULTS])
def test_a_result_that_cannot_be_stored_is_dead_not_a_crashed_child(
        pool: Pool, case: str, task: str, payload: str) -> None:
    job_id = f"r-{case}-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(job_id, task, payload)
    assert_dead_once(pool, job_id, "SerializationError: task result is not JSON-encodable")
    pool.assert_healthy()


# -- unknown tasks and misfit arguments ------------------------------------------------------

UNKNOWN = [
    ("unregistered", "sec.no_such_task"),
    ("empty-name", ""),
    ("nul-in-name", "sec.add\x00"),
    ("case-differs", "SEC.ADD"),
    ("10kb-name", "t" * 10_240),
]


@pytest.mark.parametrize("case, task", UNKNOWN, ids=[u[0] for u in UNKNOWN])
def test_an_unknown_task_name_is_dead_on_its_first_attempt(pool: Pool, case: str,
                                                           task: str) -> None:
    job_id = f"u-{case}-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(job_id, task, '{"v":1,"a":[1,2],"k":{}}')
    assert_dead_once(pool, job_id, "UnknownTask", "not registered in this worker")
    line = pool.log_line(job_id)
    assert len(line) < 1000, len(line)   # a 10 KB task name is not logged in full
    pool.assert_healthy()


MISFITS = [
    ("too-few", "[1]", "{}", "missing a required argument: 'b'"),
    ("too-many", "[1,2,3]", "{}", "too many positional arguments"),
    ("unexpected-kwarg", "[1,2]", '{"c":3}', "unexpected keyword argument 'c'"),
    ("given-twice", "[1,2]", '{"a":3}', "multiple values for argument 'a'"),
    ("kwargs-only-missing", "[]", '{"a":1}', "missing a required argument: 'b'"),
]


@pytest.mark.parametrize("case, args, kwargs, reason", MISFITS, ids=[m[0] for m in MISFITS])
def test_arguments_that_do_not_fit_the_signature_are_dead_on_the_first_attempt(
        pool: Pool, case: str, args: str, kwargs: str, reason: str) -> None:
    job_id = f"m-{case}-{uuid.uuid4().hex[:6]}"
    pool.enqueue_raw(job_id, "sec.add", f'{{"v":1,"a":{args},"k":{kwargs}}}')
    assert_dead_once(pool, job_id, "TypeError: arguments do not fit sec.add(", reason)
    pool.assert_healthy()


# -- oversized and unencodable payloads at the producer ---------------------------------------

def _server_keys(client: Any) -> set[str]:
    return set(client.scan_iter(match="*", count=1000))


def test_a_50_mb_payload_is_refused_quickly_and_writes_nothing(solo: App) -> None:
    app = solo
    t = app.task(_noop, name="tests.bad.noop")
    app.send_task("sec.add", (1, 2))   # the queue exists: its keys are counted
    before = _server_keys(app.client)
    blob = "x" * 50_000_000
    for enqueue in (lambda: t.delay(blob), lambda: t.map([("ok",), (blob,)]),
                    lambda: app.send_task("sec.add", (blob, 1)),
                    lambda: t.apply_async(kwargs={"blob": blob}, job_id="big-1")):
        started = time.monotonic()
        with pytest.raises(PayloadTooLarge) as caught:
            enqueue()
        assert time.monotonic() - started < 3.0
        assert "over the 1000000-byte limit (max_payload_bytes)" in str(caught.value)
    # Nothing was written, on the whole server
    assert _server_keys(app.client) == before


def test_the_payload_cap_counts_utf8_bytes_exactly(redis_url: str, queue_name: str) -> None:
    small = App(redis_url=redis_url, queue=queue_name, max_payload_bytes=100)
    try:
        t = small.task(_noop, name="tests.bad.noop")
        envelope = len('{"v":1,"a":[""],"k":{}}')
        assert t.delay("x" * (100 - envelope)).duplicate is False   # exactly at the cap
        with pytest.raises(PayloadTooLarge, match="101 bytes is over the 100-byte limit"):
            t.delay("x" * (101 - envelope))
        with pytest.raises(PayloadTooLarge):
            t.delay("é" * ((100 - envelope) // 2 + 1))   # fewer characters than bytes
    finally:
        small.purge()
        small.close()


@pytest.mark.parametrize("arg", ["lone \ud800 surrogate", float("nan"), float("-inf")],
                         ids=["lone-surrogate", "nan", "minus-inf"])
def test_arguments_that_are_not_json_text_are_refused_at_the_producer(solo: App, arg) -> None:
    app = solo
    t = app.task(_noop, name="tests.bad.noop")
    app.send_task("sec.add", (1, 2))
    before = _server_keys(app.client)
    with pytest.raises(SerializationError):
        t.delay(arg)
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(SerializationError):
        t.delay(nested)
    assert _server_keys(app.client) == before


@pytest.mark.parametrize("args, kwargs, path", [
    (({1: "a", "1": "b"},), {}, "args[0]"),
    (({1: "a"},), {}, "args[0]"),
    (([{"x": {None: 1}}],), {}, "args[0][0]['x']"),
    ((), {"opts": {"x": [{2.5: 1}]}}, "kwargs['opts']['x'][0]"),
    ((({True: 1},),), {}, "args[0][0]"),
    (({("a",): 1},), {}, "args[0]"),
], ids=["int-and-str", "int", "none-deep", "float-in-kwargs", "bool-in-tuple", "tuple"])
def test_a_dict_key_that_is_not_a_string_is_refused_with_its_path(
        solo: App, args: tuple[Any, ...], kwargs: dict[str, Any], path: str) -> None:
    # JSON keys are strings: {1: 'a', '1': 'b'} would arrive as one key, {1: 'a'} as '1'
    app = solo
    t = app.task(_noop, name="tests.bad.noop")
    app.send_task("sec.add", (1, 2))
    before = _server_keys(app.client)
    with pytest.raises(SerializationError, match=re.escape(f"at {path}")):
        t.delay(*args, **kwargs)
    if args:   # a batch: refused whole
        with pytest.raises(SerializationError, match="not a string"):
            t.map([(1,), args])
    assert _server_keys(app.client) == before
    with pytest.raises(SerializationError, match=re.escape("at kwargs")):
        t.apply_async((), {1: "a"})   # type: ignore[dict-item]


# -- group names -----------------------------------------------------------------------------

#: Stored safely: a lane of their own, every key under the queue's base, one slot.
#: NUL, newlines and other control characters are accepted (keys are binary-safe); the
#: only limits are non-empty, valid UTF-8 and GROUP_MAX_BYTES (256) bytes.
GROUPS_OK = {
    "open-brace": "{", "close-brace": "}", "a-close-b": "a}b", "braced": "{x}",
    "colon": ":", "a-colon-pending": "a:pending", "a": "a", "pending": "pending",
    "space": " ", "spaces": "with  spaces ", "newline": "line\nbreak", "nul": "nul\x00byte",
    "only-nul": "\x00", "emoji": "tenant 🎉", "emoji-256-bytes": "🎉" * 64,
    "ascii-256-bytes": "x" * 256, "fixed-key-name": "ring", "g-colon": "g:a",
    "colon-pending-pending": ":pending:pending", "glob": "*", "class": "[a-z]",
    "backslash": "\\", "double-tag": "}{q}{",
}
GROUPS_REFUSED = {
    "empty": "", "10kb": "x" * 10_240, "257-bytes": "x" * 257, "emoji-260-bytes": "🎉" * 65,
    "lone-surrogate": "a\ud800b",
}


@pytest.fixture(scope="module")
def own_server() -> Iterator[LocalRedis]:
    """A server nobody else writes to, so a SCAN of all of it sees only this test's keys."""
    with LocalRedis() as server:
        yield server


@pytest.fixture
def solo(own_server: LocalRedis) -> Iterator[App]:
    a = App(redis_url=own_server.url, queue=f"g-{uuid.uuid4().hex[:10]}")
    yield a
    a.purge()
    a.close()


@pytest.mark.parametrize("group", GROUPS_OK.values(), ids=GROUPS_OK.keys())
def test_an_odd_group_name_is_stored_safely_under_the_queue(solo: App, group: str) -> None:
    q = solo.queue()
    base = q.keys.base
    t = solo.task(_noop, name="tests.bad.noop")
    before = _server_keys(solo.client)
    # When two jobs are enqueued in the group
    h1 = t.apply_async(args=(1,), group=group)
    h2 = t.apply_async(args=(2,), group=group)
    # Then every new key on the server is the queue's, in the queue's slot, and the lane is
    # the group's own
    made = _server_keys(solo.client) - before
    assert made and all(k.startswith(base) for k in made), made
    assert {key_slot(k.encode("utf-8", "surrogateescape")) for k in made} == \
        {key_slot(q.keys.ring.encode())}
    assert q.keys.lane(group) in made
    assert solo.stats()["groups"][group]["pending"] == 2
    # And claim and ack serve it
    for h in (h1, h2):
        (lease,) = q.claim()
        assert (lease.id, lease.group) == (h.id, group)
        assert q.ack(lease, "1")[0] is AckVerdict.DONE
        assert h.status() == "done"
    after = _server_keys(solo.client) - before
    assert all(k.startswith(base) for k in after), after
    assert solo.stats()["pending"] == 0


def test_no_two_group_names_share_a_key(solo: App) -> None:
    q = solo.queue()
    k = q.keys
    groups = list(GROUPS_OK.values())
    # Statically: one lane per group, none of them a fixed key, a job row or a done list,
    # and the group is read back from its lane exactly
    lanes = [k.lane(g) for g in groups]
    assert len(set(lanes)) == len(groups)
    fixed = set(k.fixed)
    for g, lane in zip(groups, lanes):
        assert lane not in fixed
        assert not lane.startswith((k.base + "job:", k.base + "done:"))
        assert k.group_of_lane(lane) == g
    # And live: one job in each group, all in one queue; each lane holds exactly its own
    t = solo.task(_noop, name="tests.bad.noop")
    handles = {g: t.apply_async(args=(i,), group=g) for i, g in enumerate(groups)}
    per_group = solo.stats()["groups"]
    assert set(per_group) == set(groups)
    assert all(per_group[g]["pending"] == 1 for g in groups)
    leases = q.claim(len(groups))
    assert {(lease.group, lease.id) for lease in leases} == \
        {(g, h.id) for g, h in handles.items()}
    assert q.claim() == []


@pytest.mark.parametrize("group", GROUPS_REFUSED.values(), ids=GROUPS_REFUSED.keys())
def test_a_bad_group_name_is_refused_with_a_clear_error_and_writes_nothing(
        solo: App, group: str) -> None:
    q = solo.queue()
    t = solo.task(_noop, name="tests.bad.noop")
    t.delay(0)
    before = _server_keys(solo.client)
    with pytest.raises(InvalidGroup, match="invalid group"):
        t.apply_async(args=(1,), group=group)
    with pytest.raises(InvalidGroup):
        solo.task(_noop, name="tests.bad.noop", group=lambda *a, **k: group).delay(1)
    with pytest.raises(InvalidGroup):
        q.enqueue_many([NewJob("j-1", "tests.bad.noop", '{"v":1,"a":[1],"k":{}}', group,
                               3, 30_000, 50, 3600)])
    for verb in (q.pause_group, q.resume_group, lambda g: q.set_group_limit(g, 2),
                 lambda g: q.set_group_weight(g, 2)):
        with pytest.raises(InvalidGroup):
            verb(group)
    assert _server_keys(solo.client) == before


def test_group_limits_are_documented_and_count_bytes() -> None:
    assert GROUP_MAX_BYTES == 256
    assert check_group("é" * 128) == "é" * 128            # 256 bytes
    with pytest.raises(InvalidGroup, match="258 bytes is longer than 256"):
        check_group("é" * 129)
    for not_text in (None, 5, b"bytes", ["a"]):
        with pytest.raises(InvalidGroup, match="non-empty string"):
            check_group(not_text)


# -- queue names -----------------------------------------------------------------------------

BAD_QUEUES = {"empty": "", "open": "{", "close": "}", "braced": "{q}", "inner": "a{b}c",
              "a-close-b": "a}b"}


@pytest.mark.parametrize("name", BAD_QUEUES.values(), ids=BAD_QUEUES.keys())
def test_a_bad_queue_name_is_refused_by_every_api_and_writes_nothing(
        own_server: LocalRedis, name: str) -> None:
    good = App(redis_url=own_server.url, queue="fine")
    client = own_server.client()
    before = _server_keys(client)
    try:
        with pytest.raises(InvalidQueueName, match="invalid queue name"):
            App(redis_url=own_server.url, queue=name).queue()
        with pytest.raises(InvalidQueueName):
            good.queue(name)                       # "" is refused, not the default queue
        with pytest.raises(InvalidQueueName):
            good.send_task("sec.add", (1, 2), queue=name)
        with pytest.raises(InvalidQueueName):     # at registration, not at the first delay
            good.task(_noop, name="tests.bad.noop", queue=name)
        with pytest.raises(InvalidQueueName):
            Queue(client, name)
        with pytest.raises(InvalidQueueName):
            QueueKeys(name)
        assert _server_keys(client) == before
    finally:
        good.close()
        client.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(HERE), **(env or {}))
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", *args], capture_output=True,
                          text=True, timeout=30, env=full_env)


@pytest.mark.parametrize("name", BAD_QUEUES.values(), ids=BAD_QUEUES.keys())
@pytest.mark.parametrize("verb", [["stats"], ["worker", "-A", "security_tasks"]],
                         ids=["stats", "worker"])
def test_a_bad_queue_name_on_the_command_line_is_one_line_and_exit_2(
        own_server: LocalRedis, verb: list[str], name: str) -> None:
    before = _server_keys(own_server.client())
    result = _cli(*verb, "--redis-url", own_server.url, "-Q", name)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("emqtasks: error: invalid queue name"), \
        result.stderr
    assert _server_keys(own_server.client()) == before


def test_a_bad_queue_name_in_the_environment_is_one_line_and_exit_2(
        own_server: LocalRedis) -> None:
    result = _cli("stats", env={"EMQ_REDIS_URL": own_server.url, "EMQ_QUEUE": "a{b}"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "emqtasks: error: invalid queue name 'a{b}': use 1-64 letters, digits, '_', '.' or '-'"]


def test_the_fixed_keys_leave_room_for_no_lane() -> None:
    # A lane is base + "g:" + group + ":pending"; no fixed key starts with "g:"
    assert not any(name.startswith("g:") for name in FIXED)

"""The Lua verbs as a Redis Functions library (store/functions.py): FCALL where the server
has it (Redis >= 7.0, Valkey), EVALSHA where it has not or may not, the same replies."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import make_task

from emqtasks import App
from emqtasks.store.functions import function_name, library
from emqtasks.store.keys import QueueKeys
from emqtasks.store.scripts import compose_library, lua_dir
from emqtasks.verdicts import AckVerdict

#: Local slots the library's build function keeps free (as each verb's script does).
LOCAL_SLOTS_SPARE = 8


def _functions_server(r) -> None:   # type: ignore[no-untyped-def]
    if int(r.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("Redis Functions need Redis >= 7.0 or Valkey")


def _calls(r, command: str) -> int:   # type: ignore[no-untyped-def]
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _libraries(r) -> set[str]:   # type: ignore[no-untyped-def]
    libs = r.execute_command("FUNCTION", "LIST")
    return {lib["library_name"] if isinstance(lib, dict) else lib[lib.index("library_name") + 1]
            for lib in libs}


@pytest.fixture
def on_scripts(monkeypatch):   # type: ignore[no-untyped-def]
    monkeypatch.setenv("EMQ_NATIVE", "off")
    monkeypatch.setenv("EMQ_LUA_FUNCTIONS", os.environ.get("EMQ_LUA_FUNCTIONS", "1"))


def test_the_verbs_run_as_functions_where_the_server_has_them(private_redis, on_scripts):
    # Given a server with FUNCTION (Redis >= 7.0) and a queue on the scripts
    admin = private_redis.client()
    _functions_server(admin)
    app = App(redis_url=private_redis.url, queue="fn-on")
    try:
        t = make_task(app, name="fn_on_task", group="A")
        # When jobs are enqueued, claimed and acked
        first, second = t.delay(1), t.delay(2)
        q = app.queue()
        leases = q.claim(2)
        assert q.ack(leases[0])[0] is AckVerdict.DONE
        # Then each verb went as FCALL of this release's library, none as EVALSHA
        assert [l.id for l in leases] == [first.id, second.id]
        assert _calls(admin, "fcall") >= 4 and _calls(admin, "evalsha") == 0
        assert _libraries(admin) == {library()[0]}
    finally:
        app.purge()
        app.close()
        admin.close()


def test_two_queues_served_by_one_library_keep_their_own_keys(private_redis, on_scripts):
    # Given one library (its helpers built once) serving two queues, calls interleaved
    admin = private_redis.client()
    _functions_server(admin)
    a = App(redis_url=private_redis.url, queue="fn-a")
    b = App(redis_url=private_redis.url, queue="fn-b")
    try:
        ta = make_task(a, name="fn_a_task", group="GA")
        tb = make_task(b, name="fn_b_task", group="GB")
        ja, jb = ta.delay(1), tb.delay(2)
        # When each queue claims
        la, lb = b.queue().claim(1), a.queue().claim(1)
        # Then each got its own job: no key of the first call was kept by the build
        assert [l.id for l in la] == [jb.id] and [l.id for l in lb] == [ja.id]
        assert ja.status() == "active" and jb.status() == "active"
    finally:
        for app in (a, b):
            app.purge()
            app.close()
        admin.close()


def test_verbs_keep_working_across_function_flush(private_redis, on_scripts):
    # Given the library loaded by a first call
    admin = private_redis.client()
    _functions_server(admin)
    app = App(redis_url=private_redis.url, queue="fn-flush")
    try:
        t = make_task(app, name="fn_flush_task", group="A")
        first = t.delay(1)
        q = app.queue()
        # When the server's functions are flushed between calls (a FUNCTION FLUSH, a fresh
        # replica promoted), each time
        admin.function_flush()
        second = t.delay(2)
        admin.function_flush()
        leases = q.claim(2)
        admin.function_flush()
        # Then each call loads the library again and runs, still as FCALL
        assert second.duplicate is False
        assert [l.id for l in leases] == [first.id, second.id]
        assert q.ack(leases[0])[0] is AckVerdict.DONE
        assert _calls(admin, "evalsha") == 0
    finally:
        app.purge()
        app.close()
        admin.close()


def test_the_setting_off_keeps_evalsha(private_redis, on_scripts, monkeypatch):
    monkeypatch.setenv("EMQ_LUA_FUNCTIONS", "0")
    admin = private_redis.client()
    app = App(redis_url=private_redis.url, queue="fn-off")
    try:
        t = make_task(app, name="fn_off_task", group="A")
        t.delay(1)
        assert len(app.queue().claim(1)) == 1
        assert _calls(admin, "fcall") == 0 and _calls(admin, "evalsha") >= 2
    finally:
        app.purge()
        app.close()
        admin.close()


def test_a_user_refused_fcall_runs_the_scripts(private_redis, on_scripts):
    # Given a user whose ACL grants EVALSHA but neither FCALL nor FUNCTION
    from emqtasks.ops import acl

    admin = private_redis.client()
    _functions_server(admin)
    admin.execute_command(*acl.setuser("w", acl.worker_rules("fn-acl"), "pw").split())
    url = f"redis://w:pw@127.0.0.1:{private_redis.port}/0"
    app = App(redis_url=url, queue="fn-acl")
    try:
        t = make_task(app, name="fn_acl_task", group="A")
        # When it enqueues and claims
        job = t.delay(1)
        # Then the verbs ran as EVALSHA, with the same replies
        assert [l.id for l in app.queue().claim(1)] == [job.id]
        assert _calls(admin, "evalsha") >= 2
    finally:
        app.close()
        admin.execute_command("ACL", "DELUSER", "w")
        admin.close()


def test_two_releases_each_load_and_call_their_own_library(private_redis, on_scripts,
                                                           tmp_path: Path):
    # Given another release's library already on the server (its Lua text differs)
    admin = private_redis.client()
    _functions_server(admin)
    other = tmp_path / "lua"
    shutil.copytree(lua_dir(), other)
    (other / "ack.lua").write_text((other / "ack.lua").read_text() + "\n-- next release\n")
    other_name, other_text = compose_library(other)
    assert other_name != library()[0]
    admin.function_load(other_text)
    app = App(redis_url=private_redis.url, queue="fn-roll")
    try:
        # When this release enqueues
        job = make_task(app, name="fn_roll_task", group="A").delay(1)
        # Then it loaded its own library beside the other, which is left as it was
        assert _libraries(admin) == {other_name, library()[0]}
        assert job.status() == "pending"
        assert function_name("ack") != f"emq_ack_{other_name.split('_', 1)[1]}"
    finally:
        app.purge()
        app.close()
        admin.close()


def test_the_library_loads_with_local_slots_to_spare(private_redis):
    """Every helper file is a local of the library's build function (Lua allows 200): it
    still loads with LOCAL_SLOTS_SPARE more in front of them."""
    admin = private_redis.client()
    _functions_server(admin)
    spare = "local " + ", ".join(f"_spare{i}" for i in range(LOCAL_SLOTS_SPARE)) + "\n"
    name, text = library()
    # and with LOCAL_SLOTS_SPARE more upvalues for it (Lua 5.1 allows a function 60: the
    # build closes over every per-call name of the main chunk, the keys of lib/keys.lua too)
    ups = ", ".join(f"_up{i}" for i in range(LOCAL_SLOTS_SPARE))
    text = text.replace("local function build_()\n",
                        f"local {ups}\nlocal function build_()\n{spare}local _ = {{{ups}}}\n", 1)
    admin.function_load(text)
    # the build runs at the first call: an empty queue's claim
    keys = list(QueueKeys("fn-spare").fixed)
    assert admin.fcall(function_name("claim"), len(keys), *keys, 1, "w") == []
    admin.close()


def test_a_user_granted_functions_loads_and_calls_the_library(private_redis, on_scripts):
    # Given a worker's user with the functions' rules (acl.worker_rules(functions=True))
    from emqtasks.ops import acl

    admin = private_redis.client()
    _functions_server(admin)
    rules = acl.worker_rules("fn-acl2", functions=True)
    admin.execute_command(*acl.setuser("w2", rules, "pw").split())
    app = App(redis_url=f"redis://w2:pw@127.0.0.1:{private_redis.port}/0", queue="fn-acl2")
    try:
        # When it enqueues and claims on a server that has no library yet
        job = make_task(app, name="fn_acl2_task", group="A").delay(1)
        assert [l.id for l in app.queue().claim(1)] == [job.id]
        # Then it loaded the library and ran the verbs as FCALL, nothing refused
        assert _libraries(admin) == {library()[0]}
        assert _calls(admin, "evalsha") == 0
        log = admin.execute_command("ACL", "LOG")
        objects = {(e if isinstance(e, dict) else dict(zip(e[::2], e[1::2])))["object"]
                   for e in log}
        # redis-py's CLIENT SETINFO on connect is refused and ignored (see the README)
        assert {o for o in objects if not o.startswith("client")} == set()
    finally:
        app.close()
        admin.execute_command("ACL", "DELUSER", "w2")
        admin.close()


def test_the_masters_piped_tick_goes_as_fcall_once_it_is_known(private_redis, on_scripts):
    # Given a queue on the scripts, on a server that runs the library
    admin = private_redis.client()
    _functions_server(admin)
    app = App(redis_url=private_redis.url, queue="fn-tick")
    try:
        q = app.queue()
        admin.config_resetstat()
        # When the master's tick (reap piped with its heartbeat) runs a few times
        for _ in range(4):
            q.hot.call_piped("reap", q.keys.fixed, [1000], lambda pipe: pipe.ping())
        # Then only the first asked the script cache (NOSCRIPT: it was never EVALed);
        # the others went as FCALL in the pipeline
        errors = admin.info("errorstats")
        assert errors.get("errorstat_NOSCRIPT", {}).get("count", 0) <= 1
        # (the first FCALL answered "Function not found": loaded, then called once more)
        assert _calls(admin, "fcall") == 5 and _calls(admin, "evalsha") == 1
    finally:
        app.close()
        admin.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["library", "source"])
def test_the_lua_text_is_composed_once_however_many_threads_ask_first(
        monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    # Given nothing composed yet, and a composition that waits (up to 0.5 s) for a second
    # one to begin: 20 threads whose first script call comes at once (issue 24 item 2: 500
    # get()s on the module's path, whose first script is `wait`, each composed the library,
    # for tens of seconds, past their timeouts)
    import emqtasks.store.functions as functions
    import emqtasks.store.scripts as scripts
    module, name = (functions, "compose_library") if what == "library" else (scripts,
                                                                             "compose")
    real = getattr(module, name)
    calls: list[int] = []
    second = threading.Event()

    def composing(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            second.wait(0.5)
        else:
            second.set()
        return real(*args)

    monkeypatch.setattr(module, name, composing)
    monkeypatch.setattr(functions, "_LIBRARY", None, raising=False)
    for cached in (getattr(functions.library, "cache_clear", None),
                   getattr(scripts, "_source", scripts.source).cache_clear):
        if cached:
            cached()
    start = threading.Barrier(20, timeout=10)
    texts: list[Any] = []

    def first_call() -> None:
        start.wait()
        texts.append(functions.library() if what == "library" else scripts.source("ack"))

    threads = [threading.Thread(target=first_call) for _ in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    # Then one thread composed it and the others took its text
    assert len(texts) == 20 and len(set(texts)) == 1
    assert len(calls) == 1, f"composed {len(calls)} times"


def _counts(r) -> dict[str, int]:   # type: ignore[no-untyped-def]
    return {k[len("cmdstat_"):]: int(v["calls"])
            for k, v in r.info("commandstats").items()}


def _sent(r, before: dict[str, int]) -> dict[str, int]:   # type: ignore[no-untyped-def]
    after = _counts(r)
    return {k: n - before.get(k, 0) for k, n in after.items()
            if n > before.get(k, 0) and k not in ("info", "fcall")}


def test_the_hot_verbs_send_no_command_they_can_do_without(private_redis, on_scripts):
    # Given a queue on the library, history on (the default), a job leased from group A
    # and one more waiting in its lane
    admin = private_redis.client()
    _functions_server(admin)
    app = App(redis_url=private_redis.url, queue="fn-lean")
    try:
        t = make_task(app, name="fn_lean_task", group="A")
        t.delay(1)
        t.delay(2)
        q = app.queue()
        lease = q.claim(1)[0]
        # When one more job is enqueued into that lane, which holds a job
        before = _counts(admin)
        t.delay(3)
        enq = _sent(admin, before)
        # Then the lane's size is read once, before the write (not again after its ZADD:
        # the lane was not empty, so its group stands where it stood)
        assert enq["zcard"] == 1 and enq["zadd"] == 1
        # When the leased job is acked with the claim of the next in one call
        before = _counts(admin)
        acked = q.ack(lease, claim_next=True)
        ack = _sent(admin, before)
        assert acked.next is not None
        # Then the group's limit is read once by the ack (its books, then its in-flight
        # drop): HGET of gactive, glimit, gtenant; and the claim's seat: gactive, glimit,
        # gweight, grate
        assert ack["hget"] == 7
        # and the minute's history hash, just written by the ack's counters, is not asked
        # its TYPE by the claim (gturn is)
        assert ack["type"] == 1
        # and no DEL: no guard write (a full server refuses an FCALL before it runs:
        # lib/core.lua runs_when_full), and the row is kept for its ttl
        assert "del" not in ack
    finally:
        app.purge()
        app.close()
        admin.close()


def test_an_fcall_sends_the_first_key_alone_and_the_library_forms_the_rest(
        private_redis, on_scripts):
    # Given a queue on the library, its library loaded by a first job
    admin = private_redis.client()
    _functions_server(admin)
    app = App(redis_url=private_redis.url, queue="fn-keys")
    try:
        t = make_task(app, name="fn_keys_task", group="A")
        first = t.delay(0)
        # When one more job is enqueued, watched by MONITOR
        with admin.monitor() as m:
            second = t.delay(1)
            for _ in range(20):   # the FCALL, after whatever else the client sends first
                cmd = m.next_command()["command"].split()
                if cmd[0] == "FCALL":
                    break
        # Then the FCALL declared one key, the queue's ring (the library forms the other
        # fixed keys from it), and the verbs found every key where the full list names it
        assert cmd[2:4] == ["1", QueueKeys("fn-keys").ring]
        leases = app.queue().claim(2)
        assert [l.id for l in leases] == [first.id, second.id]
        assert admin.zcard(QueueKeys("fn-keys").active) == 2
    finally:
        app.purge()
        app.close()
        admin.close()

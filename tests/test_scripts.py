"""The Lua verbs: found on disk, opened by their contract, run by SHA with a reload on NOSCRIPT."""

from __future__ import annotations

import pytest
from helpers import make_task

from emqtasks import App, scripts
from emqtasks.errors import ConfigError
from emqtasks.keys import FIXED
from emqtasks.verdicts import AckVerdict


def test_the_lua_folder_is_found_and_holds_every_verb():
    folder = scripts.lua_dir()
    assert folder.is_dir()
    assert (folder / "_common.lua").is_file()
    for name in scripts.VERBS:
        assert (folder / f"{name}.lua").is_file(), name


@pytest.mark.parametrize("name", scripts.VERBS)
def test_each_verb_opens_with_its_contract(name):
    # Given the verb's file on disk
    text = (scripts.lua_dir() / f"{name}.lua").read_text()
    head = text.split("\n\n", 1)[0]
    # Then it opens with its name, its KEYS and its Reply, and the loader accepts it
    assert head.startswith(f"-- {name}:")
    assert "KEYS" in head and "Reply" in head
    full = scripts.source(name)
    # composed as prelude (the fixed keys and BASE), the shared helpers, then the verb
    assert full.startswith("local K_ring")
    assert all(f"K_{k}" in full.split("\n", 1)[0] for k in FIXED)
    assert full.index("function claim_one(") < full.index(f"-- {name}:")
    assert full.endswith(text)


def test_a_verb_without_its_contract_is_refused():
    with pytest.raises(ConfigError):
        scripts._check_header("claim", "return 1\n")
    with pytest.raises(ConfigError):
        scripts._check_header("claim", "-- claim: no contract here\n\nKEYS Reply")
    scripts._check_header("claim", "-- claim: x\n-- KEYS: fixed\n-- Reply: y\n\nreturn 1")


def test_verbs_keep_working_across_script_flush(private_redis, monkeypatch):
    # Given an App of its own on a private server, on the scripts (not the native module),
    # its scripts loaded by a first call
    app = App(redis_url=private_redis.url, queue="flush")
    try:
        monkeypatch.setenv("EMQ_NATIVE", "off")
        q = app.queue()
        t = make_task(app, group="A")
        first = t.delay(1)
        admin = private_redis.client()
        assert admin.script_exists(q.scripts.enqueue.sha) == [True]
        # When the server's script cache is flushed between calls
        admin.script_flush()
        assert admin.script_exists(q.scripts.enqueue.sha) == [False]
        # Then enqueue, claim and ack reload transparently
        second = t.delay(2)
        assert second.duplicate is False
        admin.script_flush()
        leases = q.claim(2)
        assert [l.id for l in leases] == [first.id, second.id]
        admin.script_flush()
        assert q.ack(leases[0])[0] is AckVerdict.DONE
        admin.script_flush()
        assert q.retry(leases[1], "boom", delay=0) == 1
        admin.script_flush()
        assert q.promote()[0] == 1
        assert app.stats()["groups"]["A"]["pending"] == 1
        admin.close()
    finally:
        app.purge()
        app.close()


def test_every_verb_runs_on_an_empty_queue(app, queue):
    # Each verb loads and answers on a queue that holds nothing at all
    assert queue.claim(3) == []
    assert queue.reap() == (0, 0)
    assert queue.promote() == (0, None)
    assert queue.requeue_dead() == 0
    assert queue.cancel("nothing") == "missing"
    app.pause()
    app.resume()
    app.set_group_limit("A", 1)
    app.set_group_limit("A", None)
    app.set_group_weight("A", 2)
    assert app.pause_group("A") is True
    assert app.resume_group("A") is True
    stats = app.stats()
    assert (stats["pending"], stats["active"], stats["ring"]) == (0, 0, 0)

"""The Lua verbs: found on disk, opened by their contract, run by SHA with a reload on NOSCRIPT."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import make_task
from luanames import free_names, top_level_names

from emqtasks import App
from emqtasks.errors import ConfigError
from emqtasks.store import scripts
from emqtasks.store.keys import FIXED
from emqtasks.verdicts import AckVerdict


def test_the_lua_folder_is_found_and_holds_every_verb():
    folder = scripts.lua_dir()
    assert folder.is_dir()
    assert (folder / "lib" / "keys.lua").is_file()
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
    assert len(re.findall(r"^-- Includes: ", head, re.MULTILINE)) == 1
    full = scripts.source(name)
    # composed as prelude (the fixed keys and BASE), the helpers it includes, then the verb
    assert full.startswith("local K_ring")
    assert all(f"K_{k}" in full.split("\n", 1)[0] for k in FIXED)
    helpers = "".join((scripts.lua_dir() / "lib" / f"{lib}.lua").read_text() + "\n"
                      for lib in scripts.load_order(scripts.lua_dir(), name))
    assert full == scripts._prelude(name) + helpers + text


def test_a_verb_without_its_contract_is_refused():
    with pytest.raises(ConfigError):
        scripts._check_header("claim", "return 1\n")
    with pytest.raises(ConfigError):
        scripts._check_header("claim", "-- claim: no contract here\n\nKEYS Reply")
    scripts._check_header("claim", "-- claim: x\n-- KEYS: fixed\n-- Reply: y\n\nreturn 1")


# ---- the helper files (lua/lib) and the loader's includes ---------------------------------

LIB = scripts.lua_dir() / "lib"
HELPERS = sorted(p.stem for p in LIB.glob("*.lua"))


def _lua_folder(tmp_path: Path, files: dict[str, str]) -> Path:
    """A folder of Lua sources: path under it -> text (a verb gets a contract header)."""
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _verb(includes: str, body: str = "return 1") -> str:
    return f"-- pause: test\n-- KEYS: fixed\n-- Includes: {includes}\n-- Reply: 1\n\n{body}\n"


@pytest.mark.parametrize("name", scripts.VERBS)
def test_every_name_a_verb_uses_is_defined_in_what_it_loads(name):
    # Redis refuses an undefined global only when its line runs: read the composed text
    assert free_names(scripts.source(name)) == set()


@pytest.mark.parametrize("lib", HELPERS)
def test_every_helper_file_loads_what_it_uses_itself(lib):
    # Given a helper file, which opens with its name, composed alone after the files it
    # names (not its verbs')
    assert (LIB / f"{lib}.lua").read_text().startswith(f"-- {lib}: ")
    folder = scripts.lua_dir()
    text = "".join((LIB / f"{n}.lua").read_text() + "\n"
                   for n in scripts.load_order(folder, f"lib/{lib}"))
    text = scripts._prelude() + text + (LIB / f"{lib}.lua").read_text()
    # Then nothing in it is left undefined
    assert free_names(text) == set()


def test_each_include_supplies_a_name_its_file_uses():
    # Every file named on an Includes line is there for a name the including file itself
    # uses (a verb does not load a file for nothing); each helper is loaded by some verb.
    folder = scripts.lua_dir()
    files = [f"lib/{n}" for n in HELPERS] + list(scripts.VERBS)
    for rel in files:
        text = (folder / f"{rel}.lua").read_text()
        used = free_names(scripts._prelude() + text)
        for lib in scripts.includes(text, rel):
            assert top_level_names((LIB / f"{lib}.lua").read_text()) & used, (rel, lib)
    loaded = {lib for v in scripts.VERBS for lib in scripts.load_order(folder, v)}
    assert loaded == set(HELPERS)


def test_helper_files_declare_distinct_names():
    # A name declared by two helper files would shadow the first for the verbs loading both
    seen: dict[str, str] = {}
    for lib in HELPERS:
        for n in top_level_names((LIB / f"{lib}.lua").read_text()):
            assert n not in seen, f"{n} in both lib/{seen[n]}.lua and lib/{lib}.lua"
            seen[n] = lib


def test_a_verb_calling_a_helper_it_did_not_include_is_caught(tmp_path):
    # Given a verb that calls wake() but includes only the keys
    lib = {f"lib/{n}.lua": (LIB / f"{n}.lua").read_text() for n in HELPERS}
    folder = _lua_folder(tmp_path, {**lib, "pause.lua": _verb("keys", "wake()\nreturn 1")})
    # Then the check names it; with wake included it passes
    assert free_names(scripts.compose(folder, "pause")) == {"wake"}
    (folder / "pause.lua").write_text(_verb("keys, wake", "wake()\nreturn 1"))
    assert free_names(scripts.compose(folder, "pause")) == set()


def test_each_helper_is_loaded_once_after_what_it_includes(tmp_path):
    # Given a diamond: the verb includes b and c, each of which includes a
    folder = _lua_folder(tmp_path, {
        "pause.lua": _verb("c, b"),
        "lib/a.lua": "-- a: x\n\nlocal A = 1",
        "lib/b.lua": "-- b: x\n-- Includes: a (for A)\n\nlocal B = A",
        "lib/c.lua": "-- c: x\n-- Includes: a, b\n\nlocal C = A + B",
    })
    # Then a comes first and once, every file after the files it includes
    assert scripts.load_order(folder, "pause") == ["a", "b", "c"]
    full = scripts.compose(folder, "pause")
    assert full.count("local A = 1") == 1
    assert full.index("local A =") < full.index("local B =") < full.index("local C =")
    assert full.endswith(_verb("c, b"))


@pytest.mark.parametrize(("files", "says"), [
    ({"pause.lua": _verb("nosuch")},
     "lua/pause.lua includes 'nosuch': there is no lua/lib/nosuch.lua"),
    ({"pause.lua": _verb("a"), "lib/a.lua": "-- a: x\n-- Includes: gone\n\nlocal A"},
     "lua/lib/a.lua includes 'gone'"),
    ({"pause.lua": _verb("a"), "lib/a.lua": "-- a: x\n-- Includes: b\n\nlocal A",
      "lib/b.lua": "-- b: x\n-- Includes: a\n\nlocal B"},
     "lua/lib/b.lua closes a cycle of includes: lib/a.lua -> lib/b.lua -> lib/a.lua"),
    ({"pause.lua": _verb("a"), "lib/a.lua": "-- a: x\n-- Includes: a\n\nlocal A"},
     "lua/lib/a.lua closes a cycle of includes: lib/a.lua -> lib/a.lua"),
    ({"pause.lua": _verb("../pause")}, "lua/pause.lua includes '../pause': not a helper"),
    ({"pause.lua": _verb("a").replace("-- Reply", "-- Includes: b\n-- Reply")},
     "lua/pause.lua has more than one '-- Includes:' line"),
])
def test_the_loader_refuses_a_bad_include_naming_the_file(tmp_path, files, says):
    folder = _lua_folder(tmp_path, files)
    with pytest.raises(ConfigError, match=re.escape(says)):
        scripts.compose(folder, "pause")


def test_the_free_name_check_reads_lua_scopes():
    # The check itself: what it must see, and what it must not take for a global
    assert free_names("local x = x") == {"x"}
    assert free_names("local function f(a) return f(a, b) end") == {"b"}
    assert free_names("local t = {a = 1, b = c}\nt.d = e\nt:m(f)") == {"c", "e", "f"}
    assert free_names("for i, v in ipairs(t) do g(i, v) end\nreturn i") == {"t", "g", "i"}
    assert free_names("local a\nif a then local b = 1 elseif a then return b else end") == {"b"}
    assert free_names("local f\ndo local y = 1 function f() return y end end\nreturn y") == {"y"}
    assert free_names("local s = 'wake()' -- wake()\nreturn redis.call('GET', KEYS[1])") == set()
    assert free_names("local a, b = 1,\n  c\nlocal d = a .. b") == {"c"}


def test_verbs_keep_working_across_script_flush(private_redis, monkeypatch):
    # Given an App of its own on a private server, on the scripts (not the native module),
    # its scripts loaded by a first call
    app = App(redis_url=private_redis.url, queue="flush")
    try:
        monkeypatch.setenv("EMQ_NATIVE", "off")
        monkeypatch.setenv("EMQ_LUA_FUNCTIONS", "0")   # the scripts' cache, not FUNCTION's
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


#: Local slots each verb's script keeps free: Lua allows a function 200 active locals, and a
#: verb's main function holds the top-level locals of every file it includes.
LOCAL_SLOTS_SPARE = 8


@pytest.mark.parametrize("name", scripts.VERBS)
def test_each_verb_compiles_with_local_slots_to_spare(app: App, name: str) -> None:
    """A library that grows by a few top-level locals must not stop a verb compiling (ack
    once went over 200 after two features each added a few): each script still compiles
    with LOCAL_SLOTS_SPARE more locals in front of it."""
    spare = "local " + ", ".join(f"_spare{i}" for i in range(LOCAL_SLOTS_SPARE)) + "\n"
    app.client.script_load(spare + scripts.source(name))

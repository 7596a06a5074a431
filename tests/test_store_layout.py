"""emqtasks/store/ alone speaks the server's protocol: keys, scripts, EMQ.* commands.

Read from the source with ``ast`` (no import): a string constant that names a key of a queue
(the prefix ``emq:{``) or an ``EMQ.`` command, a call of a script (EVALSHA, EVAL, SCRIPT
LOAD, redis-py's ``register_script`` / ``Script``, or a verb taken off ``queue.scripts``)
anywhere outside the store fails here. Docstrings and comments may describe keys: they send
nothing. And the store imports no optional part of the package.

What the three languages share is written three times, by hand: the constants and the fixed
keys' order (store/keys.py), a job's arguments, a row's fields, the rows read field by field
and the lease reply (store/protocol.py). The checks below read lua/lib and native/src and
fail on any difference; and a new job's row has one writer in each language (new_job), and a
group's settings one reader (lib/settings.lua, src/settings.c).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from luanames import tokens

from emqtasks.store import keys, protocol, scripts
from emqtasks.store.queue import Lease, NewJob

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "emqtasks"
STORE = PACKAGE / "store"

#: Outside the store, yet allowed to speak the protocol on their own: the native module's
#: build and microbenchmark (they measure the raw commands and scripts, not a queue's
#: verbs), and the development tools (the chaos soak writes poisoned rows by hand, the
#: benchmark's tasks keep counters of their own with scripts). None of them is imported by
#: a producer, a worker or the store (tests/test_layout.py, and below).
EXEMPT = (
    PACKAGE / "native" / "build.py",
    PACKAGE / "native" / "microbench.py",
    PACKAGE / "native" / "hatch_hook.py",
    PACKAGE / "_dev",
)
#: Script calls allowed by name: acl.py asks the server's ACL what a user may run
#: (redis.acl_check_cmd in a one-line EVAL on the doctor's probe key); it runs no verb and
#: reads or writes no key of a queue.
ALLOWED_CALLS = {("acl.py", "eval")}

SCRIPT_CALLS = frozenset({"evalsha", "eval", "eval_ro", "evalsha_ro", "script_load",
                          "register_script"})
COMMAND = re.compile(r"\bEMQ\.[A-Z]")


def _outside_store() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if not p.is_relative_to(STORE)
                  and not any(p == e or p.is_relative_to(e) for e in EXEMPT))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.add(id(first.value))
    return found


def _protocol_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    where = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs:
            # an f-string's literal parts are constants too, its {{ already undone
            if "emq:{" in node.value:
                out.append(f"{where}:{line}: names a key ({node.value[:40]!r})")
            if COMMAND.search(node.value):
                out.append(f"{where}:{line}: names an EMQ.* command ({node.value[:40]!r})")
        elif isinstance(node, ast.Attribute):
            if node.attr in SCRIPT_CALLS and (path.name, node.attr) not in ALLOWED_CALLS:
                out.append(f"{where}:{line}: calls a script (.{node.attr})")
            if isinstance(node.value, ast.Attribute) and node.value.attr == "scripts":
                out.append(f"{where}:{line}: runs a verb's script (.scripts.{node.attr})")
        elif isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            if node.module and node.module.endswith("store.scripts") or (
                    node.module == "redis.commands.core" and "Script" in names):
                out.append(f"{where}:{line}: imports the script loader ({node.module})")
    return out


def test_only_the_store_names_keys_scripts_and_module_commands() -> None:
    checked = _outside_store()
    assert len(checked) > 40          # the walk found the package
    found = [use for path in checked for use in _protocol_uses(path)]
    assert found == []


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    # Given a module outside the store that does each forbidden thing once
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""A docstring may say emq:{q}:ring and EMQ.CLAIM."""\n'
        "from redis.commands.core import Script\n"
        "def f(q, c, name):\n"
        "    c.hget(f'emq:{{{name}}}:job:1', 'state')\n"
        "    c.execute_command('EMQ.CLAIM')\n"
        "    c.evalsha('0' * 40, 0)\n"
        "    q.scripts.claim(q.keys.fixed, [1])\n")
    # Then each is named, and the docstring is not
    found = _protocol_uses(bad)
    kinds = sorted(use.split(": ", 1)[1].split(" (")[0] for use in found)
    assert kinds == ["calls a script", "imports the script loader", "names a key",
                     "names an EMQ.* command", "runs a verb's script"]


#: What the store must not import: the optional parts (the embedded server, the native
#: module's build and microbenchmark) and the development tools.
UPWARD = ("emqtasks.ops.embedded", "emqtasks.native.build", "emqtasks.native.microbench",
          "emqtasks.native.hatch_hook", "emqtasks._dev")


def _imports(path: Path) -> set[str]:
    """Every module a file imports (at any depth of the file), relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}   # `from . import x`
    return found


@pytest.mark.parametrize("path", sorted(STORE.glob("*.py")), ids=lambda p: p.name)
def test_the_store_imports_no_optional_part(path: Path) -> None:
    upward = {m for m in _imports(path) if m.startswith(UPWARD)}
    assert upward == set()


def test_the_import_reader_resolves_relative_imports(tmp_path: Path) -> None:
    # the parametrized test above would pass on a reader that resolves nothing
    found = _imports(STORE / "selection.py")
    assert "emqtasks.native.module_path" in found
    assert "emqtasks.store.commands.COMMANDS" in found


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.M)
    assert match, pattern
    return float(match.group(1))


LUA = ROOT / "lua"
SRC = PACKAGE / "native" / "src"


def _lua_lib(*names: str) -> str:
    return "".join((LUA / "lib" / f"{n}.lua").read_text() for n in names)


def _quoted(text: str) -> list[str]:
    return re.findall(r"'([^']*)'", text)


def _lua_fields(args: str) -> list[str]:
    """The field names of a Lua HSET's field/value arguments (the even ones: a value may be
    a quoted text too, '0', or a call)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(args + ","):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(args[start:i].strip())
            start = i + 1
    return [item.strip("'") for item in items[0::2]]


def _lua_list(name: str, text: str) -> tuple[str, ...]:
    """The strings of ``local NAME = {'a', 'b', ...}``."""
    match = re.search(rf"^local {name} = \{{(.*?)\}}", text, re.M | re.S)
    assert match, name
    return tuple(_quoted(match.group(1)))


def _lua_indexes(prefix: str, text: str) -> dict[str, int]:
    """``local P_A, P_B = 1, 2`` (over lines too): each constant's value."""
    match = re.search(rf"^local ({prefix}_\w+(?:,\s*{prefix}_\w+)*)\s*=\s*([\d,\s]+)$",
                      text, re.M)
    assert match, prefix
    names = re.findall(r"\w+", match.group(1))
    values = [int(v) for v in re.findall(r"\d+", match.group(2))]
    assert len(names) == len(values), prefix
    return dict(zip(names, values))


def _named_in_order(fields: tuple[str, ...], prefix: str, indexes: dict[str, int],
                    base: int) -> bool:
    """Each of ``fields`` has its constant PREFIX_FIELD at its position (from ``base``)."""
    return indexes == {f"{prefix}_{f.upper()}": i + base for i, f in enumerate(fields)}


def _balanced(text: str, start: str) -> str:
    """The text of the call that opens at the first ``start`` (which ends in its ``(``)."""
    at = text.index(start) + len(start)
    depth = 1
    for i in range(at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[at:i]
    raise AssertionError(f"no end to {start!r}")


def _body(text: str, head: str) -> str:
    """A C function's text, from its head to its closing brace."""
    at = text.index(head)
    return text[at:text.index("\n}\n", at)]


def _c_field_names() -> dict[str, str]:
    """The module's field strings, made once at load: F_NAME -> "name"."""
    return dict(re.findall(r"(F_\w+) = mk\(ctx, \"([^\"]*)\"\)", (SRC / "module.c").read_text()))


def _c_fields(text: str) -> tuple[str, ...]:
    names = _c_field_names()
    return tuple(names[f] for f in re.findall(r"\bF_[A-Z_]+\b", text))


def _c_enum(first: str, last: str, text: str) -> list[str]:
    match = re.search(rf"enum \{{\s*({first}\b.*?),\s*{last}\s*\}}", text, re.S)
    assert match, first
    return re.findall(r"\w+", match.group(1))


def test_the_constants_the_three_languages_share_agree() -> None:
    lua = "".join((ROOT / "lua" / "lib" / f"{lib}.lua").read_text() for lib in ("wake", "keys"))
    native = PACKAGE / "native"
    c = "\n".join(f.read_text() for f in (native / "emq.c", *sorted(native.glob("src/*.[ch]"))))
    assert _number(r"^local WAKE_CAP = (\S+)", lua) == keys.WAKE_CAP
    assert _number(r"^#define WAKE_CAP (\S+)", c) == keys.WAKE_CAP
    assert _number(r"^local WAKE_TTL = (\S+)", lua) == keys.WAKE_TTL
    assert _number(r"^#define WAKE_TTL_MS (\S+)", c) == keys.WAKE_TTL * 1000
    assert _number(r"^local PRIO_SPAN = (\S+)", lua) == keys.PRIO_SPAN
    assert _number(r"^#define PRIO_SPAN (\S+)", c) == keys.PRIO_SPAN
    assert re.search(r"^local DEFAULT_GROUP = '([^']*)'", lua, re.M)[1] == keys.DEFAULT_GROUP

    # The fixed keys' order: the scripts' prelude is made from FIXED; lib/keys.lua and emq.c
    # describe it, and the module's FIXED[] and K_* enum index by it.
    assert re.findall(r"\bK_(\w+) \(", lua.split("-- and BASE", 1)[0]) == list(keys.FIXED)
    assert scripts._prelude().startswith(
        "local " + ", ".join(f"K_{k}" for k in keys.FIXED) + " = KEYS[1], ")
    common = (SRC / "common.h").read_text()
    fixed = re.search(r"static const char \*FIXED\[NFIXED\] = \{(.*?)\};", common, re.S)
    assert fixed and re.findall(r'"(\w+)"', fixed[1]) == list(keys.FIXED)
    assert _c_enum("K_RING", "NFIXED", common) == [f"K_{k.upper()}" for k in keys.FIXED]
    said = re.search(r"FIXED order\n \* \(([a-z ]+)\)", (native / "emq.c").read_text())
    assert said and said[1].split() == list(keys.FIXED)


def test_the_rows_and_replies_the_three_languages_share_agree() -> None:
    # A job's arguments: NewJob's fields (each with its unit after a '_'), the J_* of
    # lib/jobrow.lua (offsets from the id's ARGV index) and of the module.
    assert tuple(f.split("_")[0] for f in NewJob._fields) == protocol.JOB_ARGS
    jobrow_lua, jobrow_c = _lua_lib("jobrow"), (SRC / "jobrow.c").read_text()
    assert _named_in_order(protocol.JOB_ARGS, "J", _lua_indexes("J", jobrow_lua), 0)
    assert _c_enum("J_ID", "NJOB", jobrow_c) == [f"J_{a.upper()}" for a in protocol.JOB_ARGS]
    # ... and the helpers that read them by one unpack name them in that order ('_': unused)
    unpacked = re.findall(r"local ([\w, ]+) =\s*unpack\(ARGV, at, at \+ J_(\w+)\)", jobrow_lua)
    assert len(unpacked) == 2                          # new_job's and skip_job's
    for listed, last in unpacked:
        names = [n.strip() for n in listed.split(",")]
        assert len(names) == protocol.JOB_ARGS.index(last.lower()) + 1
        assert all(n in ("_", arg) for n, arg in zip(names, protocol.JOB_ARGS))

    # A new job's row: the fields new_job writes, in order, in both languages.
    lua_row = _lua_fields(_balanced(jobrow_lua[jobrow_lua.index("function new_job"):],
                                    "redis.call('HSET', jk, "))
    assert tuple(lua_row) == protocol.NEW_ROW
    new_job_c = _body(jobrow_c, "static int new_job(")
    assert _c_fields(_balanced(new_job_c, "RedisModule_HashSet(job, ")) == protocol.NEW_ROW
    assert _c_fields(_balanced(new_job_c, 'RedisModule_Replicate(q->ctx, "HSET", ')) \
        == protocol.NEW_ROW

    # The fenced row: lib/fence.lua's list and F_* indexes; the module reads the same.
    fence_lua = _lua_lib("fence")
    assert _lua_list("FENCED_ROW", fence_lua) == protocol.FENCED_ROW
    assert _named_in_order(protocol.FENCED_ROW, "F", _lua_indexes("F", fence_lua), 1)
    fenced_c = _body((SRC / "fence.c").read_text(), "static int fenced_as(")
    assert _c_fields(fenced_c) == protocol.FENCED_ROW

    # A claim's row: lib/rows.lua's list and R_* indexes, the module's R_* and its read.
    rows_lua, rows_c = _lua_lib("rows"), (SRC / "rows.c").read_text()
    assert _lua_list("LEASE_ROW", rows_lua) == protocol.LEASE_ROW
    assert _named_in_order(protocol.LEASE_ROW, "R", _lua_indexes("R", rows_lua), 1)
    assert _c_enum("R_TASK", "NROW", rows_c) == [f"R_{f.upper()}" for f in protocol.LEASE_ROW]
    read = _balanced((SRC / "claim.c").read_text(), "RedisModule_HashGet(job, ")
    assert _c_fields(read) == protocol.LEASE_ROW
    assert re.findall(r"&row\[R_(\w+)\]", read) == [f.upper() for f in protocol.LEASE_ROW]
    # ... and the integer fields every verb reads, in store/protocol.py, lib/rows.lua and
    # rows.c.
    ints_lua = [(name, req == ", true") for at, name, req in re.findall(
        r"int_fault\(row\[R_(\w+)\], '(\w+)'(, true)?\)", rows_lua) if at.lower() == name]
    ints_c = [(name, req == "1") for at, name, req in re.findall(
        r"\{R_(\w+), \"(\w+)\", ([01])\}", rows_c) if at.lower() == name]
    assert ints_lua == ints_c == list(protocol.ROW_INTS)

    # The lease reply: Lease's fields, lib/claim.lua's reply, the module's reply_job.
    assert Lease._fields == protocol.LEASE_REPLY
    said = {"row[R_TASK]": "task", "row[R_PAYLOAD]": "payload", "att": "attempts",
            "g": "group", "lease": "lease_ms"}     # the scripts' names for them
    reply = re.search(r"return \{(id, .*?)\}", _lua_lib("claim"))
    assert reply and tuple(said.get(v, v) for v in reply[1].split(", ")) \
        == protocol.LEASE_REPLY
    sent = re.findall(r"j->(\w+)", _body((SRC / "claim.c").read_text(), "static void reply_job"))
    assert tuple(dict.fromkeys({"lease": "lease_ms"}.get(v, v) for v in sent)) \
        == protocol.LEASE_REPLY

    # Every field these name, and every field the module names, is a row's (but the fields
    # of other hashes the module writes: a workflow's, the clock's, the tally's).
    reads = (protocol.NEW_ROW + protocol.FENCED_ROW + protocol.LEASE_ROW
             + _lua_list("EXPIRED_ROW", (LUA / "reap.lua").read_text())
             + _lua_list("CANCEL_ROW", _lua_lib("withdraw")) + ("prio",))
    not_rows = {"failed", "waiting", "lerr", "seen", "stale_acks", ""}
    assert set(reads) | (set(_c_field_names().values()) - not_rows) <= set(protocol.ROW_FIELDS)


#: The fields of a row no verb writes after the job's creation (``created`` is left out: a
#: workflow's own hash has one too): an HSET naming one of them writes a new job's row.
_CREATED_ONLY = frozenset({"task", "max", "lease", "delay", "ttl"})


def _row_writes_lua(text: str) -> list[str]:
    out = []
    for match in re.finditer(r"redis\.p?call\(\s*'HSET'", text):
        fields = set(_quoted(_balanced(text[match.start():], "(")))
        if fields & _CREATED_ONLY:
            out.append(text[match.start():].split("\n", 1)[0])
    return out


def _row_writes_c(text: str) -> list[str]:
    names = _c_field_names()
    out = []
    for match in re.finditer(r"RedisModule_HashSet\(|RedisModule_Replicate\([^,]+, \"HSET\"",
                             text):
        call = _balanced(text[match.start():], "(")
        fields = {names[f] for f in re.findall(r"\bF_[A-Z_]+\b", call)}
        if fields & _CREATED_ONLY:
            out.append(text[match.start():].split("\n", 1)[0])
    return out


def test_a_new_job_row_is_written_by_new_job_alone() -> None:
    # Given every Lua file and every C file of the module
    lua = {p.relative_to(LUA): p.read_text()
           for p in (*LUA.glob("*.lua"), *LUA.glob("lib/*.lua"))}
    c = {p.name: p.read_text() for p in SRC.glob("*.c")}
    # Then only the job row's helpers write a new row's fields (lib/jobrow.lua new_job and
    # skip_job, src/jobrow.c new_job), and the check sees theirs
    writers = {str(p) for p, text in lua.items() if _row_writes_lua(text)}
    writers |= {f"src/{n}" for n, text in c.items() if _row_writes_c(text)}
    assert writers == {"lib/jobrow.lua", "src/jobrow.c"}
    assert len(_row_writes_lua(lua[Path("lib/jobrow.lua")])) == 2
    assert len(_row_writes_c(c["jobrow.c"])) == 2       # the write and its replication
    # And a row written by hand elsewhere would be seen
    assert _row_writes_lua("redis.call('HSET', jk, 'task', t, 'group', tostring(g))")
    assert _row_writes_lua("redis.pcall('HSET', jk, 'state', s,\n  'ttl', now)")
    assert _row_writes_c("RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_LEASE, l, NULL)")
    assert not _row_writes_lua("redis.call('HSET', wk, 'state', 'running', 'created', now)")


#: The hashes of a group's settings and of the defaults for every group: lib/settings.lua and
#: src/settings.c alone read them (a group's own setting, else the default: the rule, once
#: per language). keys.lua declares the books; the setter verbs write them.
_SETTINGS = ("glimit", "gweight", "grate", "gmax", "gdefaults")
_WRITES = ("'HSET'", "'HDEL'")


def _settings_reads_lua(text: str) -> list[str]:
    """Each mention of a settings hash (its K_ name, or its name quoted) that is not the key
    of a write (``redis.call('HSET' | 'HDEL', K_x``), comments left out."""
    toks = tokens(text)
    out = []
    for i, (kind, val) in enumerate(toks):
        if kind == "name" and val.startswith("K_") and val[2:] in _SETTINGS:
            head = [v for _, v in toks[max(0, i - 4):i]]      # call ( 'HSET' ,
            if not (len(head) == 4 and head[0] in ("call", "pcall") and head[1] == "("
                    and head[2] in _WRITES and head[3] == ","):
                out.append(val)
        elif kind == "lit" and val.strip("'\"") in _SETTINGS:
            out.append(val)
    return out


def _settings_reads_c(text: str) -> list[str]:
    """Each mention, comments left out, of a settings hash outside a fixed-key mask
    (``B(K_GLIMIT)``, what a command opens up front): its fixed key, its book's name, or a
    default read out of the call's cache (``q->dflt[D_...]``)."""
    code = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    names = "|".join(_SETTINGS)
    return re.findall(rf'(?<!B\()\bK_G(?:LIMIT|WEIGHT)\b|"(?:{names})"|\bdflt\[D_\w+', code)


def test_a_groups_settings_are_read_by_settings_alone() -> None:
    # Given every Lua file (but keys.lua, which names the books) and every C file
    lua = {p.relative_to(LUA): p.read_text()
           for p in (*LUA.glob("*.lua"), *LUA.glob("lib/*.lua")) if p.name != "keys.lua"}
    c = {p.name: p.read_text() for p in SRC.glob("*.c")}
    # Then only the settings files read them
    readers = {str(p) for p, text in lua.items() if _settings_reads_lua(text)}
    readers |= {f"src/{n}" for n, text in c.items() if _settings_reads_c(text)}
    assert readers == {"lib/settings.lua", "src/settings.c"}
    # and the setters' writes are not counted as reads
    assert not _settings_reads_lua((LUA / "rate.lua").read_text())
    assert not _settings_reads_c((SRC / "lease.c").read_text())
    # And a read planted elsewhere would be seen, in either language
    assert _settings_reads_lua("local w = redis.call('HGET', K_gweight, g) or default('w')")
    assert _settings_reads_lua("local K_grate = K_grate")
    assert _settings_reads_lua("redis.call('HGETALL', BASE .. 'gmax')")
    assert not _settings_reads_lua("redis.call('HSET', K_grate, g, r) -- K_grate read")
    assert _settings_reads_c('if (book_get(q, "grate", g, &v) < 0) return -1;')
    assert _settings_reads_c("RMK *h = fx(q, K_GLIMIT, 0);")
    assert _settings_reads_c("double h = dflt_num(q->dflt[D_HISTORY], 24);")
    assert not _settings_reads_c("q_init(&q, ctx, argv, 0, B(K_GLIMIT)); /* K_GWEIGHT */")

"""emqtasks/store/ alone speaks the server's protocol: keys, scripts, EMQ.* commands.

Read from the source with ``ast`` (no import): a string constant that names a key of a queue
(the prefix ``emq:{``) or an ``EMQ.`` command, a call of a script (EVALSHA, EVAL, SCRIPT
LOAD, redis-py's ``register_script`` / ``Script``, or a verb taken off ``queue.scripts``)
anywhere outside the store fails here. Docstrings and comments may describe keys: they send
nothing. And the store imports no optional part of the package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from emqtasks.store import keys

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

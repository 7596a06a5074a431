"""The README's verb table (Internals) against the code: a row per verb; its Lua file and
the includes its header names; the C file of its EMQ.* command; the Queue methods that run
it; its CLI commands and options; its test files."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import click
import pytest

from emqtasks.cli import main
from emqtasks.store.commands import COMMANDS
from emqtasks.store.queue import Queue
from emqtasks.store.scripts import VERBS, includes

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["verb", "Lua file", "Lua includes", "C file", "`store` method", "CLI", "test file"]


def verb_table() -> dict[str, dict[str, str]]:
    """verb -> {column: cell} of the table whose header is COLUMNS."""
    lines = (ROOT / "README.md").read_text().splitlines()
    header = "| " + " | ".join(COLUMNS) + " |"
    start = lines.index(header) + 2     # past the header and its --- row
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == len(COLUMNS), line
        rows[cells[0]] = dict(zip(COLUMNS, cells))
    return rows


def ticked(cell: str) -> list[str]:
    """The `code` spans of a cell."""
    return re.findall(r"`([^`]+)`", cell)


TABLE = verb_table()


def test_the_table_has_one_row_per_verb() -> None:
    assert sorted(TABLE) == sorted(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_the_lua_columns_are_the_verbs_file_and_its_includes_line(verb: str) -> None:
    row = TABLE[verb]
    assert ticked(row["Lua file"])[0] == f"{verb}.lua"
    text = (ROOT / "lua" / f"{verb}.lua").read_text()
    listed = [n.strip() for n in row["Lua includes"].split(",")]
    assert listed == includes(text, f"lua/{verb}.lua")


@pytest.mark.parametrize("verb", VERBS)
def test_the_c_column_names_the_file_of_the_verbs_command(verb: str) -> None:
    cell = TABLE[verb]["C file"]
    src = ROOT / "emqtasks" / "native" / "src"
    for name in (t for t in ticked(cell) if t.endswith(".c")):
        assert (src / name).is_file(), name
    if verb not in COMMANDS:
        assert cell.startswith("—"), f"{verb} has no EMQ.* command: its C file is —"
        return
    first = ticked(cell)[0]
    assert re.search(rf"^static int cmd_{verb}\(", (src / first).read_text(), re.MULTILINE), (
        f"{first} does not define cmd_{verb}")
    assert f"`{COMMANDS[verb]}`" in cell


def _queue_methods_by_verb() -> dict[str, set[str]]:
    """verb -> the public Queue methods that run it (self.scripts.<verb>, self.hot.call /
    call_piped("<verb>"), or a plan of store/plan.py that yields Hot("<verb>", ...) /
    Script("<verb>", ...), directly or through another method of Queue or another plan of
    the store). Queue's methods are those of the classes it is made of (store/queue.py:
    the store's mixins); the plans, the store's module-level functions."""
    bodies: list[ast.stmt] = []
    plans: list[ast.stmt] = []
    for cls in Queue.__mro__:
        if cls.__module__.startswith("emqtasks.store."):
            tree = ast.parse(Path(inspect.getfile(cls)).read_text())
            bodies += next(n for n in tree.body
                           if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
    for path in sorted((ROOT / "emqtasks" / "store").glob("*.py")):
        plans += [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)]
    direct: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    public: set[str] = set()
    for fn in [*bodies, *plans]:
        if not isinstance(fn, ast.FunctionDef):
            continue
        name = fn.name if fn in bodies else f"plan:{fn.name}"
        if fn in bodies and not fn.name.startswith("_"):
            public.add(name)
        direct.setdefault(name, set())
        calls.setdefault(name, set())
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name):
                if node.func.id in ("Hot", "Script") and isinstance(node.args[0], ast.Constant):
                    direct[name].add(node.args[0].value)
                else:
                    calls[name].add(f"plan:{node.func.id}")
                continue
            if not isinstance(node.func, ast.Attribute):
                continue
            f, owner = node.func, node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "scripts":
                direct[name].add(f.attr)
            elif (isinstance(owner, ast.Attribute) and owner.attr == "hot"
                  and f.attr in ("call", "call_piped") and isinstance(node.args[0], ast.Constant)):
                direct[name].add(node.args[0].value)
            elif isinstance(owner, ast.Name) and owner.id == "self":
                calls[name].add(f.attr)

    def runs(method: str, seen: frozenset[str]) -> set[str]:
        out = set(direct[method])
        for other in calls[method] & direct.keys() - seen:
            out |= runs(other, seen | {method})
        return out

    found: dict[str, set[str]] = {}
    for method in public:
        for verb in runs(method, frozenset()):
            found.setdefault(verb, set()).add(method)
    return found


def test_the_store_column_names_every_queue_method_that_runs_the_verb() -> None:
    found = _queue_methods_by_verb()
    assert sorted(found) == sorted(VERBS), "a verb no Queue method runs, or an unknown one"
    for verb, methods in found.items():
        cell = TABLE[verb]["`store` method"]
        named = {re.split(r"[(\s]", t, maxsplit=1)[0] for t in ticked(cell)}
        assert methods <= named, f"{verb}: the table does not name {sorted(methods - named)}"


def test_the_cli_column_names_commands_and_options_that_exist() -> None:
    ctx = click.Context(main)
    for verb, row in TABLE.items():
        # a remark in parentheses says who runs the verb (the worker, the dashboard)
        for text in ticked(re.sub(r"\([^)]*\)", "", row["CLI"])):
            words = text.split()
            command = main.get_command(ctx, words[0])
            assert command is not None, f"{verb}: no command {words[0]!r}"
            options = {o for p in command.params for o in p.opts}
            for word in words[1:]:
                if word.startswith("-"):
                    assert word in options, f"{verb}: {words[0]} has no option {word}"
                elif isinstance(command, click.Group) and word != "/":
                    assert word in command.commands, f"{verb}: {words[0]} has no {word}"


def test_the_test_column_names_files_that_exist() -> None:
    for verb, row in TABLE.items():
        files = ticked(row["test file"])
        assert files, verb
        for name in files:
            assert (ROOT / "tests" / name).is_file(), f"{verb}: no tests/{name}"

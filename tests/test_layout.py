"""The package's shape, as a user and a type checker see it: import boundaries and types."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

import emqtasks
from emqtasks import App, Signature
from emqtasks.errors import UnknownTask
from emqtasks.producer import registry
from emqtasks.producer.celery_options import TRANSLATED
from emqtasks.producer.registry import POLICY_OPTIONS, SCHEDULE_OPTION, TaskOptions, TaskSpec

ROOT = Path(__file__).resolve().parent.parent


def _loaded_after(statement: str) -> set[str]:
    code = (f"{statement}\nimport json, sys\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('emqtasks'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    return set(json.loads(out.stdout))


def test_a_producer_imports_no_worker_cli_or_dev_module() -> None:
    loaded = _loaded_after("import emqtasks")
    assert "emqtasks.producer.app" in loaded
    assert not {m for m in loaded if m.startswith(("emqtasks.worker", "emqtasks.cli",
                                                  "emqtasks._dev"))}
    out = subprocess.run([sys.executable, "-c", "import emqtasks, sys; "
                          "print('multiprocess' in sys.modules)"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_a_producer_imports_no_framework() -> None:
    # Django and Sentry's SDK are optional extras: neither the package nor its Django package
    # (what INSTALLED_APPS names, and what a settings module imports the backend from) loads
    # them; only emqtasks.contrib.sentry imports sentry_sdk
    code = ("import sys, emqtasks, emqtasks.contrib.django; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('django', 'django_tasks', 'asgiref', 'sentry_sdk')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


#: Imports the package and the worker, prints the opentelemetry modules they loaded beyond
#: redis-py's, then opens a send span. argv[1] "absent": OpenTelemetry is made uninstallable first.
_OTEL_PROBE = """
import sys
if sys.argv[1] == "absent":
    class Absent:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}")
    sys.meta_path.insert(0, Absent())
import redis
before = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
import emqtasks, emqtasks.cli, emqtasks.cli.worker, emqtasks.worker.master
import emqtasks.worker.runner, emqtasks.observe.tracing as t
after = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
print(sorted(set(after) - set(before)))
with t.sending("x", "q") as s:   # no SDK: nothing to carry
    assert s.carrier is None
t.flush()
"""


@pytest.mark.parametrize("otel", ["absent", "installed"])
def test_neither_the_package_nor_the_worker_imports_opentelemetry(otel: str) -> None:
    # Tracing is an optional extra (emqtasks[otel]): without it the package and the worker
    # run as before; with it installed (the test extra) they import nothing of it beyond
    # what redis-py does (redis 8 loads it when it is there): observe/tracing.py uses it
    # only once the process has it (then at enqueue), and without an SDK a job carries
    # nothing.
    out = subprocess.run([sys.executable, "-c", _OTEL_PROBE, otel], capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
    assert importlib.util.find_spec("opentelemetry.trace") is not None   # the test extra


def test_the_worker_command_imports_no_benchmark_demo_or_dev_module() -> None:
    loaded = _loaded_after("import emqtasks.cli")
    assert "emqtasks.cli.worker" in loaded
    assert not {m for m in loaded if m.startswith("emqtasks._dev")}


#: One interpreter started, each module imported as a fresh interpreter would import it: in a
#: fork of a process that holds just what a fresh import of that module holds before the
#: module's own code runs, its parent packages (importing ``a.b.c`` runs ``a``, then ``a.b``,
#: then ``a.b.c``). A package's process forks one child per module of the package, and a
#: subpackage's child forks again for the modules under it, so each package's imports run once
#: instead of once per module below it. argv: a JSON {package: [its modules]}, "" the root.
_FRESH_IMPORTS = """
import importlib, json, os, sys, traceback

TREE = json.loads(sys.argv[1])

def each_fresh(package):
    failed = 0
    for name in TREE.get(package, ()):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                importlib.import_module(name)
                code = 1 if each_fresh(name) else 0
            except BaseException:
                traceback.print_exc()
                print(f"importing {name} first, in a fresh interpreter, failed", file=sys.stderr)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        failed += os.waitpid(pid, 0)[1] != 0
    return failed

sys.exit(1 if each_fresh("") else 0)
"""


def test_no_module_of_the_package_imports_a_sibling_cycle(tmp_path: Path) -> None:
    # Every module imports cleanly on its own, first, as in a fresh interpreter: a cycle
    # shows up as an ImportError of a partially initialised module, and a module that only
    # works once another was imported as a missing name.
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "emqtasks").rglob("*.py")
        if p.name not in ("__main__.py",) and "peer_tasks" not in p.name)
    tree: dict[str, list[str]] = {}
    for name in modules:
        parent = name.rpartition(".")[0]
        assert parent in ("", *modules), f"{name}: its package {parent} is not a module"
        tree.setdefault(parent, []).append(name)
    # With bytecode written, a module the forks import again and again is compiled once:
    # where the suite's processes write theirs (conftest.py), else to a folder of the test's
    # own under PYTHONDONTWRITEBYTECODE.
    env = dict(os.environ)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env.setdefault("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))
    out = subprocess.run([sys.executable, "-c", _FRESH_IMPORTS, json.dumps(tree)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr


def _noop() -> None:
    """A task body; nothing here runs it."""


def test_each_task_option_is_declared_once_and_reaches_one_receiver() -> None:
    spec_fields = {f.name for f in fields(TaskSpec)}
    for option in TaskOptions.__optional_keys__:
        receivers = [option in spec_fields, option in POLICY_OPTIONS, option == SCHEDULE_OPTION,
                     option in TRANSLATED]
        assert receivers.count(True) == 1, option
    # both decorators take the one declaration
    for fn in (App.task, emqtasks.task):
        hints = inspect.signature(fn).parameters["options"].annotation
        assert hints == "Unpack[TaskOptions]", fn


def test_an_unknown_task_option_is_a_type_error_at_decoration() -> None:
    app = App()
    for register in (app.task, emqtasks.task):
        with pytest.raises(TypeError, match=r"^App\.task\(\) got an unexpected keyword "
                                            r"argument 'max_atempts'$"):
            register(max_atempts=3)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="unexpected keyword argument 'grop'"):
            register(_noop, grop="billing")  # type: ignore[call-overload]
    assert not app.tasks


def test_a_signature_by_name_without_an_app_uses_the_default_app() -> None:
    # canvas.py finds emqtasks.default_app through the registry, not by importing app.py
    assert registry.default_app() is emqtasks.default_app
    with pytest.raises(UnknownTask, match="workflow step 'no.such.task' is not a registered"):
        Signature("no.such.task").delay()


USER_FILE = '''
from emqtasks import App, JobHandle, task

app = App()


@app.task
def charge(invoice_id: int) -> str:
    return f"charged {invoice_id}"


@task(group="billing", max_attempts=5)
def refund(invoice_id: int, amount: float = 0.0) -> float:
    return amount


ok: JobHandle[str] = charge.delay(7)
text: str = ok.get(timeout=1)
refund.delay(7, amount=2.5)
BAD_LINE
'''


def _mypy(tmp_path: Path, bad_line: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy")
    user = tmp_path / "user_code.py"
    user.write_text(textwrap.dedent(USER_FILE).replace("BAD_LINE", bad_line))
    # Incremental, in a cache of the test's own: the second call re-checks the user file only
    return subprocess.run([sys.executable, "-m", "mypy", "--strict",
                           "--cache-dir", str(tmp_path / ".mypy"), str(user)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.timeout(600)
def test_a_type_checker_checks_delay_against_the_task_function(tmp_path: Path) -> None:
    # A right call passes
    good = _mypy(tmp_path, "")
    assert good.returncode == 0, good.stdout
    # A wrong number of arguments, a wrong type, a wrong keyword and a wrong result type
    # are each reported on their line
    bad = _mypy(tmp_path, "\n".join([
        'charge.delay("x", 1, 2)',
        'charge.delay("seven")',
        'refund.delay(7, amont=1.0)',
        'n: int = charge.delay(1).get()',
        'task(max_atempts=5)',
        'app.task(lease="30")',
    ]))
    assert bad.returncode == 1
    for line in (20, 21, 22, 23, 24, 25):
        assert f"user_code.py:{line}: error" in bad.stdout, bad.stdout


def test_the_worker_never_imports_the_web_stack() -> None:
    # The dashboard is an optional extra: the CLI lists it, the worker never loads it (nor
    # Sentry's SDK: a tasks module that uses emqtasks.contrib.sentry imports it)
    code = ("import sys, emqtasks.cli, emqtasks.cli.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jinja2', 'selenium', 'prometheus_client', 'sentry_sdk') "
            "or m.startswith(('emqtasks.dashboard', 'emqtasks.observe.metrics', "
            "'emqtasks.observe.lanetable'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# -- the import graph --------------------------------------------------------------------------
# Import edges that close a cycle today and belong to another part of the restructuring
# (issue 25: the server-facing code moves into emqtasks/store/). Remove an entry with the
# cycle; an edge not listed here that closes a cycle fails the test.
ALLOWED_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def _module_names() -> dict[str, Path]:
    names = {}
    for path in (ROOT / "emqtasks").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at the top or in a function (lazy), but not those under
    ``if TYPE_CHECKING:``: annotations only (every module has ``from __future__ import
    annotations``), they never run."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (n for child in node.orelse for n in _imports_in(child))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def import_graph() -> dict[str, set[str]]:
    """emqtasks module -> the emqtasks modules it imports (``from pkg import sub`` counts as
    importing the submodule, ``from pkg import name`` as importing pkg)."""
    modules = _module_names()

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {known(a.name) for a in node.names if a.name.startswith("emqtasks")}
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] != "emqtasks":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                edges.add(sub if sub in modules else known(base))
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in groups:   # the shortest way back to the group's first module
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(graph[v] & group):
                if w == start:
                    found.append(paths[v] + [start])
                    queue = []
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    # the graph is real: a top-level, a lazy (in a function) and a relative import each
    assert "emqtasks.producer.app" in graph["emqtasks"]
    assert "emqtasks.worker.async_child" in graph["emqtasks.worker.child"]
    assert "emqtasks.producer.jobs" in graph["emqtasks.producer.task"]
    for (source, target), why in ALLOWED_CYCLE_EDGES.items():
        assert target in graph[source], f"allowed edge {source} -> {target} is gone ({why}):" \
                                        " remove it from ALLOWED_CYCLE_EDGES"
        graph[source].discard(target)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


# -- the layers --------------------------------------------------------------------------------
#: The package's layers, lowest first: a module imports from its own layer or those below it,
#: never from one above. A name stands for the module and everything under it; the longest
#: name that matches a module places it, and the package root ``emqtasks`` only itself.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # what every part uses: errors, numbers checked, verdicts, clock steps, the JSON envelope
    ("base", ("emqtasks._seconds", "emqtasks._version", "emqtasks.errors", "emqtasks.validate",
              "emqtasks.verdicts", "emqtasks.clock", "emqtasks.serialization")),
    # the protocol's owner; the settings (store/cluster.py redacts URLs with config.py, which
    # checks queue names with store/keys.py) and native/__init__ (finds the built module)
    ("store", ("emqtasks.store", "emqtasks.config", "emqtasks.native")),
    # the domains, side by side on top of the store
    ("domains", ("emqtasks.producer", "emqtasks.workflows", "emqtasks.schedules",
                 "emqtasks.observe", "emqtasks.ops")),
    # the public face: the package root, the documented old paths
    ("package", ("emqtasks", "emqtasks.canvas", "emqtasks.hooks", "emqtasks.acl",
                 "emqtasks.queue")),
    ("worker", ("emqtasks.worker",)),
    # the integrations with the frameworks a team's code lives in (optional extras): built on
    # the public face; the worker command turns on the Django one (--django)
    # and emqtasks.celery, Celery's API on the public face (no module of the package
    # imports it; the worker command calls it for a Celery app, beat and autodiscovery)
    ("integrations", ("emqtasks.contrib", "emqtasks.celery")),
    # the programs: the command line (its `native build` runs native/build.py), the dashboard,
    # the wheel's build hook; and what runs a user's tasks in a user's tests: the worker
    # launcher and run_pending (testing.py, which runs the worker's Runner), the pytest plugin
    ("apps", ("emqtasks.cli", "emqtasks.__main__", "emqtasks.dashboard",
              "emqtasks.native.build", "emqtasks.native.hatch_hook", "emqtasks.testing",
              "emqtasks.pytest")),
    # optional tools no program imports: the microbenchmark and the development tools
    ("tools", ("emqtasks.native.microbench", "emqtasks._dev")),
)

#: Edges that run upwards today, each with the change that removes it. Remove an entry with
#: its edge (the test fails on an entry whose edge is gone); an upward edge not listed fails.
ALLOWED_UPWARD_EDGES: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest name that places ``module``."""
    best, found = "", -1
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            matches = module == name or (name != "emqtasks" and module.startswith(name + "."))
            if matches and len(name) > len(best):
                best, found = name, rank
    return found


def upward_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(source, target) for source, targets in graph.items() for target in targets
            if layer_of(target) > layer_of(source)}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in import_graph() if layer_of(m) < 0)
    assert unplaced == [], "place these in LAYERS"


def test_nothing_imports_upwards() -> None:
    graph = import_graph()
    # the check is real: each layer has modules, and an upward edge is seen as one
    for rank, (name, _) in enumerate(LAYERS):
        assert any(layer_of(m) == rank for m in graph), f"layer {name} is empty"
    assert upward_edges({"emqtasks.store.keys": {"emqtasks.producer.app"}}) == {
        ("emqtasks.store.keys", "emqtasks.producer.app")}
    assert layer_of("emqtasks.native") < layer_of("emqtasks.native.build")
    found = upward_edges(graph)
    for edge, why in ALLOWED_UPWARD_EDGES.items():
        assert edge in found, f"allowed edge {' -> '.join(edge)} is gone ({why}): remove it" \
                              " from ALLOWED_UPWARD_EDGES"
    upward = sorted(found - ALLOWED_UPWARD_EDGES.keys())
    assert upward == [], "imports that run upwards:\n" + "\n".join(
        f"{s} ({LAYERS[layer_of(s)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})" for s, t in upward)


#: Module paths the README documents (or that callers of the last release import), and the
#: module that now holds them: each old path is that very module, not a copy.
DOCUMENTED_PATHS = {
    "emqtasks.canvas": "emqtasks.workflows.canvas",
    "emqtasks.hooks": "emqtasks.producer.hooks",
    "emqtasks.acl": "emqtasks.ops.acl",
    "emqtasks.queue": "emqtasks.store.queue",
}


def test_the_documented_module_paths_still_import() -> None:
    code = ("import importlib, json, sys\n"
            f"paths = {DOCUMENTED_PATHS!r}\n"
            "print(json.dumps({old: importlib.import_module(old) is importlib.import_module(new)"
            " for old, new in paths.items()}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == dict.fromkeys(DOCUMENTED_PATHS, True)
    from emqtasks.errors import EmqError
    from emqtasks.native import build, microbench, module_path
    from emqtasks.queue import Queue
    from emqtasks.testing import WorkerProcess, worker_process
    from emqtasks.verdicts import AckVerdict
    from emqtasks.worker.child import Runner
    assert all((EmqError, build.main, microbench, module_path, Queue, WorkerProcess,
                worker_process, AckVerdict, Runner))
    assert {name: hasattr(emqtasks, name) for name in emqtasks.__all__} == dict.fromkeys(
        emqtasks.__all__, True)

"""The package's shape, as a user and a type checker see it: import boundaries and types."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _loaded_after(statement: str) -> set[str]:
    code = (f"{statement}\nimport json, sys\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('emqtasks'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    return set(json.loads(out.stdout))


def test_a_producer_imports_no_worker_cli_or_dev_module() -> None:
    loaded = _loaded_after("import emqtasks")
    assert "emqtasks.app" in loaded
    assert not {m for m in loaded if m.startswith(("emqtasks.worker", "emqtasks.cli",
                                                  "emqtasks._dev"))}
    out = subprocess.run([sys.executable, "-c", "import emqtasks, sys; "
                          "print('multiprocess' in sys.modules)"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_the_worker_command_imports_no_benchmark_demo_or_dev_module() -> None:
    loaded = _loaded_after("import emqtasks.cli")
    assert "emqtasks.cli.worker" in loaded
    assert not {m for m in loaded if m.startswith("emqtasks._dev")}


def test_no_module_of_the_package_imports_a_sibling_cycle() -> None:
    # Every module imports cleanly on its own, first, in a fresh interpreter: a cycle
    # shows up as an ImportError of a partially initialised module.
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "emqtasks").rglob("*.py")
        if p.name not in ("__main__.py",) and "peer_tasks" not in p.name)
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m.startswith('emqtasks')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
    subprocess.run([sys.executable, "-c", code, *modules], check=True, timeout=120)


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
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
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
    ]))
    assert bad.returncode == 1
    for line in (20, 21, 22, 23):
        assert f"user_code.py:{line}: error" in bad.stdout, bad.stdout


def test_the_worker_never_imports_the_web_stack() -> None:
    # The dashboard is an optional extra: the CLI lists it, the worker never loads it
    code = ("import sys, emqtasks.cli, emqtasks.cli.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jinja2', 'selenium', 'prometheus_client') "
            "or m.startswith(('emqtasks.dashboard', 'emqtasks.metrics', "
            "'emqtasks.lanetable'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"

"""What the README says CI runs is what .ci/run runs: the README's test command verbatim,
and the matrix subset the table of supported servers names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    command = next(ln for ln in README.splitlines()
                   if ln.startswith("python3 -m venv") and "pytest" in ln)
    assert command in CI.splitlines() or f"  {command}" in CI.splitlines()


def test_the_readme_names_the_matrix_subset_ci_runs() -> None:
    listed = re.search(r"`tests/test_\{([a-z_,]+)\}\.py`", README)
    assert listed, "the README's footnote of the matrix subset"
    readme_files = {f"tests/test_{name}.py" for name in listed.group(1).split(",")}
    block = re.search(r"MATRIX_TESTS=\((.*?)\)", CI, re.S)
    assert block
    assert set(block.group(1).split()) == readme_files
    assert all((ROOT / f).is_file() for f in readme_files)

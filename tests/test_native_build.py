"""The native module's sources: emq.c is one translation unit over src/ (a unity build).

No compiler and no server: these read the files. The build and the module themselves are
tested in test_native_diff.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from emqtasks.native import build

INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def _included(path: Path, seen: list[Path]) -> list[Path]:
    """Every file path includes with #include "...", at any depth, in include order."""
    for name in INCLUDE.findall(path.read_text()):
        inc = (path.parent / name).resolve()
        if inc not in seen:
            seen.append(inc)
            _included(inc, seen)
    return seen


def test_the_build_watches_every_file_emq_c_includes() -> None:
    # A file emq.c includes that build.py does not list would leave a stale module in place.
    included = _included(build.SOURCES[0], [])
    assert len(included) > 10                       # the walk found src/
    assert set(included) == set(build.HEADERS)


def test_no_c_file_of_the_module_is_over_800_lines() -> None:
    files = [build.SOURCES[0], *build.HEADERS]
    long = {p.name: n for p in files if (n := len(p.read_text().splitlines())) > 800}
    assert long == {}

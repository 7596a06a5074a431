"""Compile ``emq.c`` into the server module ``emq.so`` with the machine's C compiler.

``emq.c`` is one translation unit that includes ``src/*.c`` (a unity build: every function
stays static and inlines across files); the module is stale when any of them is newer.

``build(out_dir)`` returns the path of the built module, or None (with the reason in
``last_reason``) when no compiler is found or the compile fails: the module is optional,
emqtasks runs on the Lua scripts without it. ``python -m emqtasks.native.build [OUT_DIR]``
prints the path (exit status 1 and the reason when it could not build).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: What the compiler is given: the one translation unit.
SOURCES = (HERE / "emq.c",)
#: What emq.c includes (src/*.c in its order, src/common.h, src/emq_api.h): not compiled on
#: their own, but a change to any of them rebuilds the module.
HEADERS = tuple(sorted((HERE / "src").glob("*.[ch]")))
NAME = "emq.so"
ASAN_NAME = "emq-asan.so"
CFLAGS = ["-std=c99", "-O2", "-fPIC", "-Wall", "-Wextra", "-fvisibility=hidden"]
#: AddressSanitizer, and UndefinedBehaviorSanitizer (overflows, casts of out-of-range
#: doubles) stopping at the first report.
ASAN_CFLAGS = ["-std=c99", "-O1", "-g", "-fPIC", "-Wall", "-Wextra",
               "-fsanitize=address,undefined,float-cast-overflow",
               "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

#: Why the last build() returned None.
last_reason: str | None = None


def compiler() -> list[str] | None:
    """The C compiler command: $CC, else the one Python was built with, else cc / gcc."""
    candidates = [os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"]
    for cand in candidates:
        if not cand:
            continue
        words = shlex.split(cand)
        if words and shutil.which(words[0]):
            return words
        if cand == os.environ.get("CC"):
            return None    # an explicit CC that is not there: do not guess another
    return None


def is_fresh(target: Path) -> bool:
    """The file exists and is newer than every source of the module."""
    if not target.exists():
        return False
    built = target.stat().st_mtime
    return all(src.stat().st_mtime <= built for src in (*SOURCES, *HEADERS))


def build(out_dir: str | os.PathLike[str] | None = None, sanitize: bool = False,
          force: bool = False) -> Path | None:
    """Build the module into out_dir (default: this folder); the path, or None with a reason.

    sanitize=True builds an AddressSanitizer + UBSan variant (``emq-asan.so``) for the
    memory-safety tests: load it into a server started with LD_PRELOAD of the compiler's
    libasan.
    """
    global last_reason
    out = Path(out_dir) if out_dir is not None else HERE
    target = out / (ASAN_NAME if sanitize else NAME)
    if not force and is_fresh(target):
        return target
    cc = compiler()
    if cc is None:
        last_reason = "no C compiler found (set CC, or install cc / gcc)"
        return None
    out.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    flags = ASAN_CFLAGS if sanitize else CFLAGS
    cmd = [*cc, *flags, "-shared", "-o", str(tmp), *map(str, SOURCES), "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except OSError as exc:
        last_reason = f"{cc[0]} could not run: {exc}"
        return None
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        last_reason = f"{shlex.join(cmd)} failed:\n{proc.stderr.strip()}"
        return None
    os.replace(tmp, target)   # atomic: a server loading the old file never sees half of it
    last_reason = None
    return target


def asan_runtime() -> str | None:
    """The compiler's libasan shared library (to LD_PRELOAD into a server), or None."""
    cc = compiler()
    if cc is None:
        return None
    proc = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                          check=False)
    path = proc.stdout.strip()
    return path if proc.returncode == 0 and os.path.isabs(path) and os.path.exists(path) \
        else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sanitize = "--asan" in args
    rest = [a for a in args if a != "--asan"]
    path = build(rest[0] if rest else None, sanitize=sanitize, force=True)
    if path is None:
        print(f"emq module not built: {last_reason}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

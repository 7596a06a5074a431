"""Hatchling build hook: compile the optional emq module into the package when it can.

Configured in pyproject.toml (``[tool.hatch.build.targets.wheel.hooks.custom]``). A wheel
gets ``emqtasks/native/emq.so`` and a platform tag; an editable install builds the module
next to its source, where ``emqtasks.native.module_path()`` looks. Without a C compiler,
or when the compile fails, the build goes on without the module (a warning says why):
emqtasks runs on its Lua scripts alone.
"""

from __future__ import annotations

import importlib.util
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:        # outside the isolated build: importable (the layout test), unused
    BuildHookInterface = object


def _load_build(root: str) -> Any:
    # build.py by path: importing the emqtasks package would need its dependencies,
    # which an isolated build environment does not have.
    path = Path(root) / "emqtasks" / "native" / "build.py"
    spec = importlib.util.spec_from_file_location("_emq_native_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EmqNativeHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        native = _load_build(self.root)
        if version == "editable":
            out = Path(self.root) / "emqtasks" / "native"
        else:
            out = Path(tempfile.mkdtemp(prefix="emq-wheel-"))
        built = native.build(out)
        if built is None:
            self.app.display_warning(f"emqtasks: building without the native module: "
                                     f"{native.last_reason}")
            return
        self.app.display_info(f"emqtasks: built the native module {built}")
        if version != "editable":
            build_data["force_include"][str(built)] = "emqtasks/native/emq.so"
            build_data["pure_python"] = False
            platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
            build_data["tag"] = f"py3-none-{platform}"

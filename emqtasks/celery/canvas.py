"""Celery's canvas names: ``signature`` (Celery's form of a Signature) and emqtasks'
workflows (chain, group, chord), which take Celery's ``|`` and ``.s()`` / ``.si()``."""

from __future__ import annotations

from typing import Any

from ..workflows.canvas import Signature, chain, chord, group

__all__ = ["Signature", "chain", "chord", "group", "signature", "subtask"]


def signature(varies: Any, args: Any = (), kwargs: dict[str, Any] | None = None, *,
              options: dict[str, Any] | None = None, immutable: bool = False,
              app: Any = None, **extra: Any) -> Signature:
    """Celery's ``signature(name_or_task, args, kwargs, options={...})`` (also a dict as
    Celery serialises one, or a Signature, returned as is). ``task_id`` is job_id here."""
    if isinstance(varies, Signature):
        return varies
    if isinstance(varies, dict):
        return signature(varies["task"], varies.get("args") or (), varies.get("kwargs"),
                         options=varies.get("options"), immutable=bool(varies.get("immutable")),
                         app=app)
    opts = {**(options or {}), **extra}
    if "task_id" in opts:
        opts["job_id"] = opts.pop("task_id")
    return Signature(varies, tuple(args or ()), kwargs, immutable=immutable, app=app, **opts)


subtask = signature

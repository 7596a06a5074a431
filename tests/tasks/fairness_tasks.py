"""Tasks for the fairness-controls tests: each notes its start on the server clock."""

from __future__ import annotations

from emqtasks import RateLimited, default_app, task


def _k(name: str) -> str:
    return f"t:{default_app.settings.queue}:{name}"


def _note_start(group: str, tag: str) -> None:
    r = default_app.client
    secs, micros = r.time()
    r.rpush(_k(f"starts:{group}"), f"{tag}:{int(secs) * 1000 + int(micros) // 1000}")


@task(name="f.tick", group=lambda group, tag: group, result_ttl=600)
def tick(group: str, tag: str) -> str:
    """A no-op that notes when it started."""
    _note_start(group, tag)
    return tag


@task(name="f.partner", group=lambda group, tag: group, result_ttl=600)
def partner(group: str, tag: str) -> str:
    """Calls a partner API that answers 429 the first time it is asked for this tag."""
    _note_start(group, tag)
    if default_app.client.hincrby(_k("asked"), tag, 1) == 1:
        raise RateLimited(2.0, "partner API answered 429")
    return tag

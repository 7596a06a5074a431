"""``emqtasks workflow ID``: show a workflow's steps (state, job id, attempts); --cancel."""

from __future__ import annotations

import json

import click

from ..errors import TaskFailed
from ..store.keys import check_job_id
from ..store.queue import Queue
from ..workflows.canvas import WorkflowHandle
from .common import AdminCommand, Refused, queue_options, run_admin


def _view(q: Queue, workflow_id: str, cancel: bool) -> dict[str, object] | None:
    h = WorkflowHandle(q, check_job_id(workflow_id))
    try:
        if cancel:
            h.cancel()
        return h.info()
    except TaskFailed:
        return None


@click.command(cls=AdminCommand)
@click.argument("workflow_id")
@queue_options
@click.option("--cancel", is_flag=True, help="first cancel every step not yet started")
@click.option("--json", "as_json", is_flag=True, help="the workflow as a JSON object")
def workflow(redis_url: str | None, queue: str | None, workflow_id: str, cancel: bool,
             as_json: bool) -> None:
    """Show a workflow (chain, group, chord): its status and each step's state, job id and
    attempts."""
    view = run_admin(redis_url, queue, lambda q: _view(q, workflow_id, cancel),
                     lambda v: ("cancel workflow", workflow_id, None) if cancel and v else None)
    if view is None:
        raise Refused(f"no workflow {workflow_id} (never was, or it expired)")
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    failed = f", failed at step {view['failed_step']}" if view["failed_step"] else ""
    click.echo(f"workflow {view['id']} ({view['kind']}): {view['status']}{failed}")
    click.echo(f"{'step':<32} {'task':<28} {'state':<10} {'attempts':>8}  group")
    steps = view["steps"]
    assert isinstance(steps, list)
    for s in steps:
        attempts = "-" if s["attempts"] is None else s["attempts"]
        click.echo(f"{s['id']:<32} {str(s['task'])[:28]:<28} {str(s['state']):<10} "
                   f"{attempts!s:>8}  {s['group'] or ''}")


COMMANDS = (workflow,)

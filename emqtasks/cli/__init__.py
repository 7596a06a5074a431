"""The ``emqtasks`` command: one click group, and every command wired onto it here.

Each command family lives in a module of its own and never imports this one. The
development commands (``bench``, ``demo``) are loaded only when invoked, so a worker
process never imports the benchmark or the private-server code.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from .. import __version__
from . import admin, audit, fairness, native, observe, schedules, workflows
from .doctor import doctor
from .embedded import embedded
from .worker import worker

#: Commands imported on first use: name -> "module:attribute".
LAZY_COMMANDS = {
    "bench": ("emqtasks._dev.bench.command:bench",
              "Measure emqtasks on a private server (--peers, --cluster)."),
    "dashboard": ("emqtasks.cli.dashboard:dashboard",
                  "A web dashboard: lanes and fairness, jobs, dead letters, workers, /metrics."),
    "metrics": ("emqtasks.cli.dashboard:metrics",
                "Serve only Prometheus /metrics (from the server's history)."),
    "demo": ("emqtasks._dev.demo:demo",
             "Watch a flood from one tenant not starve the others (embedded server by default)."),
}


class LazyGroup(click.Group):
    """A group that imports the modules of LAZY_COMMANDS only when one is run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        target, _ = LAZY_COMMANDS[cmd_name]
        module, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        # The listing of `emqtasks --help` must not import the lazy modules.
        rows = [(name, cmd.get_short_help_str(60)) for name, cmd in self.commands.items()]
        rows += [(name, help_text) for name, (_, help_text) in LAZY_COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="emqtasks")
def main() -> None:
    """emqtasks: fair background tasks on Redis."""


main.add_command(worker)
main.add_command(embedded)
main.add_command(doctor)
for _command in (*admin.COMMANDS, *fairness.COMMANDS, *native.COMMANDS, *schedules.COMMANDS,
                 *workflows.COMMANDS, *observe.COMMANDS, *audit.COMMANDS):
    main.add_command(_command)

"""``python -m emqtasks``: the same as the ``emqtasks`` command."""

from emqtasks.cli import main

main()

"""``python -m emqtasks``: the same as the ``emqtasks`` command."""

from .cli import main

main()

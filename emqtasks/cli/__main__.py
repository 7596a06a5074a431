"""``python -m emqtasks.cli``: the same command as ``emqtasks``."""

from emqtasks.cli import main

main()

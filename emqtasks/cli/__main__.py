"""``python -m emqtasks.cli``: the same command as ``emqtasks``."""

from . import main

main()

"""Moved to ``emqtasks.workflows.canvas``; this documented path stays for the callers that name it.

The module object is the moved one (not a copy of its names), so what patches or reads a
name here patches or reads it there.
"""

import sys

from .workflows import canvas as _moved
from .workflows.canvas import *  # noqa: F403  (the public names, for type checkers)

sys.modules[__name__] = _moved

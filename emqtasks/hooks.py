"""Moved to ``emqtasks.producer.hooks``; this documented path stays for the callers that name it.

The module object is the moved one (not a copy of its names), so what patches or reads a
name here patches or reads it there.
"""

import sys

from .producer import hooks as _moved
from .producer.hooks import *  # noqa: F403  (the public names, for type checkers)

sys.modules[__name__] = _moved

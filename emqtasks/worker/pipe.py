"""The words a master and its children say over their pipe (one message each).

Here, below child.py and async_child.py, so the two drains share them without importing
each other.
"""

from __future__ import annotations

GO, STOP = b"go", b"stop"          # master -> child
#: child -> master: "claimed, and more is waiting" (+ one byte: the queue's index) / "I
#: accept a go" (idle, or an async child with room for more jobs) / "I stopped claiming
#: because you were silent": a master that reads it is alive again and answers GO
GOT_WORK, IDLE, HELD = b"g", b"i", b"h"

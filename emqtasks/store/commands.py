"""The module's command of each hot verb: the only place an ``EMQ.*`` name is written.

A leaf (it imports nothing), so emqtasks.native re-exports it without a cycle.
"""

from __future__ import annotations

#: Lua verb -> module command.
COMMANDS = {
    "enqueue": "EMQ.ENQUEUE",
    "claim": "EMQ.CLAIM",
    "ack": "EMQ.ACK",
    "retry": "EMQ.RETRY",
    "extend": "EMQ.EXTEND",
    "release": "EMQ.RELEASE",
    "reap": "EMQ.REAP",
    "promote": "EMQ.PROMOTE",
    "abort": "EMQ.ABORT",
}

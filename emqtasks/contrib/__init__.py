"""Integrations with frameworks a team's code already lives in, each an optional extra.

Nothing here is imported by ``import emqtasks``; each integration imports its framework
itself, so a producer that does not use it never loads it.
"""

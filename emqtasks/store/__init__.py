"""The store: the only code that speaks the server's protocol.

It alone names a key (``keys.py``), a row field or a reply position (``protocol.py``, the
decoders in ``queue.py``), a script (``scripts.py``, which loads ``lua/``) or an ``EMQ.*``
command (``commands.py``); ``Queue`` has one method per verb, sent through the module or the
scripts (``selection.py``, ``wire.py``) on a client from ``connection.py`` / ``cluster.py``.
Workflows, schedules, the checker, the lane table, the dashboard and the worker call it.
It imports no optional part of emqtasks (tests/test_store_layout.py).
"""

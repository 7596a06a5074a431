"""The store: the only code that speaks the server's protocol.

It alone names a key (``keys.py``), a row field or a reply position (``protocol.py``, the
decoders of ``replies.py``, and the rows of ``minutes.py`` and ``beats.py``), a script
(``scripts.py``, which loads ``lua/``) or an ``EMQ.*`` command (``commands.py``); ``Queue``
(``queue.py``) has one method per verb, by role in ``hot.py``, ``admin.py``, ``flows.py``
and ``reads.py`` on ``core.py``, sent through the module or the scripts (``selection.py``,
``wire.py``) on a client from ``connection.py`` / ``cluster.py``. A producer's verb is written
once, as a plan (``plan.py``: the commands it sends, the decoding of their replies), which
``Queue`` carries out on a redis-py client and ``AsyncQueue`` (``aqueue.py``) awaits on a
``redis.asyncio`` one (``aconnection.py``). The rules Python shares
with the scripts live here once: a group's effective settings and readable books
(``settings.py``), the list of a queue's groups (``groups.py``), why a verb refused
(``diagnose.py``). Workflows, schedules, the checker, the lane table, the dashboard and the
worker call it; it imports nothing above it (tests/test_layout.py) and no optional part
(tests/test_store_layout.py).
"""

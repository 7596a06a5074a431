"""``emqtasks dashboard``: a small web app over a queue's server state (server.py, views.py).

Pages: overview, lanes (every group, why it waits, its share of the starts against its fair
share; paged server-side), jobs (lookup, search, detail), dead letters (requeue / cancel one,
the selected, or all that match), workers and schedules; /metrics for Prometheus; live
updates by server-sent events. Templates and assets ship in this package (no CDN).
"""

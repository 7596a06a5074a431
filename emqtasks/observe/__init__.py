"""Read models over the store: a lane's state (lanes.py), every lane at once (lanetable.py),
the verbs' per-minute counters (history.py), the masters' heartbeats (heartbeat.py) and the
Prometheus exposition (metrics.py)."""

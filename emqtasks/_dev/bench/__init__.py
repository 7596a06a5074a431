"""`emqtasks bench`: the benchmark, loaded only when the command runs.

core (sizes, meters, the worker subprocess, one scenario's queue), scenarios (emqtasks'
own figures), command (the click command), peers / peers_run (Huey and Dramatiq side by
side), cluster (shard scaling), tasks / peer_tasks (the task bodies the workers import).
"""

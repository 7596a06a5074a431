"""The private servers of emqtasks' own tests and benchmarks: emqtasks.ops.localserver, which
the pytest plugin (product code, that may not import this tree) runs too."""

from ..ops.localserver import (
    LocalRedis,
    find_binary,
    free_port,
    server_name,
    server_version,
    wait_ready,
)

__all__ = ["LocalRedis", "find_binary", "free_port", "server_name",
           "server_version", "wait_ready"]

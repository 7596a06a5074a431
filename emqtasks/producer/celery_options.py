"""Celery's spelling of ``@task`` options, read onto ours at decoration.

Three kinds: aliases of an option of ours (``autoretry_for`` is ``retry_for``), options that
become one of ours (``max_retries`` is ``max_attempts`` - 1, ``ignore_result`` is
``result_ttl=0``, ``acks_late=True`` is what we always do), and options that have no meaning
here: refused by name with what to use instead, never silently ignored. Celery's defaults
are not taken here (a plain ``@task`` keeps ours); ``rate_limit`` strings are parsed here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .. import validate
from ..errors import InvalidArgument

#: Celery's name -> ours.
ALIASES = {"autoretry_for": "retry_for", "default_retry_delay": "retry_delay"}
#: Celery's options read onto one of ours by ``translate`` (tests/test_layout.py counts these
#: and ALIASES as the receiver of a TaskOptions key).
TRANSLATED = frozenset({*ALIASES, "max_retries", "ignore_result", "acks_late"})

#: Celery options with no meaning here, and what to do instead.
REFUSED = {
    "serializer": "arguments and results are always JSON: drop serializer=",
    "compression": "payloads are not compressed: drop compression= (max_payload_bytes caps "
                   "their size)",
    "typing": "a call's arguments are always checked against the function when it is sent: "
              "drop typing=",
    "throws": "an expected exception is one not to retry: dont_retry_for=(...) sends it to "
              "dead at once",
    "backend": "results are kept on the queue's own Redis: drop backend= (result_ttl= sets "
               "how long)",
    "track_started": "a running job's status is always 'active': drop track_started=",
    "reject_on_worker_lost": "a job whose child dies is always retried (WorkerLost, through "
                             "its lease): drop reject_on_worker_lost=",
    "store_errors_even_if_ignored": "a dead job's error stays on its row and in dead_jobs(): "
                                    "drop store_errors_even_if_ignored=",
    "priority": "a priority is given per call: apply_async(priority=-100..100, lower first "
                "within the group's lane)",
    "base": "@task takes no base class (the hooks of emqtasks.hooks / app.on replace "
            "on_success / on_failure; emqtasks.celery's @app.task(base=MyTask) takes one)",
    "trail": "a workflow's steps are followed by app.workflow(id).steps(): drop trail=",
}

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*([smh]))?\s*$")


def refuse_meaningless(options: Mapping[str, Any]) -> None:
    """InvalidArgument for the first Celery option that has no meaning here."""
    for key in options:
        if key in REFUSED:
            raise InvalidArgument(f"@task option {key}= (Celery's) has no meaning in "
                                  f"emqtasks: {REFUSED[key]}")


def translate(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options in our names (InvalidArgument for a value we cannot take, or for an
    option given in both spellings)."""
    out = dict(options)
    for celery, ours in ALIASES.items():
        if celery in out:
            if ours in out:
                raise InvalidArgument(f"give {celery}= or {ours}= (the same option), not both")
            out[ours] = out.pop(celery)
    if "max_retries" in out:
        if "max_attempts" in out:
            raise InvalidArgument("give max_retries= or max_attempts= (max_retries + 1), "
                                  "not both")
        out["max_attempts"] = _attempts_of(out.pop("max_retries"))
    if "ignore_result" in out:
        ignore = out.pop("ignore_result")
        if not isinstance(ignore, bool):
            raise InvalidArgument(f"ignore_result is True or False, not {ignore!r}")
        if ignore:
            if out.get("result_ttl", 0) != 0:
                raise InvalidArgument("ignore_result=True is result_ttl=0: not with "
                                      f"result_ttl={out['result_ttl']!r}")
            out["result_ttl"] = 0
    if "acks_late" in out:
        late = out.pop("acks_late")
        if late is not True:
            raise InvalidArgument(
                f"acks_late={late!r}: emqtasks always acknowledges a job after its run "
                f"(at least once, fenced by its lease); there is no ack before the run, so "
                f"only acks_late=True (or no acks_late) is accepted")
    return out


def _attempts_of(max_retries: Any) -> int:
    """max_attempts of Celery's max_retries: None (retry for ever) is the most attempts a
    job may have (validate.MAX_ATTEMPTS)."""
    if max_retries is None:
        return validate.MAX_ATTEMPTS
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) \
            or not 0 <= max_retries < validate.MAX_ATTEMPTS:
        raise InvalidArgument(f"max_retries is None (no end) or a whole number from 0 to "
                              f"{validate.MAX_ATTEMPTS - 1}, not {max_retries!r}")
    return max_retries + 1


def parse_rate(value: Any) -> tuple[int, float] | None:
    """(max_jobs, per seconds) of a rate_limit: ``"10/m"``, ``"5/s"``, ``"100/h"``, or a
    number (per second); None: no rate. A fractional count is one job per its share of the
    window (``"0.5/s"`` is 1 per 2 s)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        count, per = float(value), 1.0
    elif isinstance(value, str) and (m := _RATE.match(value)):
        count, per = float(m.group(1)), _UNITS[m.group(2) or "s"]
    else:
        raise InvalidArgument(f"rate_limit is a number of jobs per second or a string "
                              f"such as '10/s', '10/m' or '10/h', not {value!r}")
    if not count > 0 or count != count:
        raise InvalidArgument(f"rate_limit {value!r}: the count must be above 0 (no rate: "
                              f"leave rate_limit out)")
    if count.is_integer():
        return validate.integer(int(count), "rate_limit's count"), per
    return 1, validate.seconds(per / count, "rate_limit's window", above_low=True)

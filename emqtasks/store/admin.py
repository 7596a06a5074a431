"""The admin verbs: pauses, the fairness controls and their defaults, cancel and requeue,
the checker's repair, the history's settings, purge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import WatchError

from ..errors import InvalidArgument, ScriptError
from ..validate import MAX_COUNT, integer, seconds
from ..verdicts import CancelVerdict
from .audit import AuditEntry, entries, record
from .core import QueueCore
from .keys import TENANT_MARK, QueueKeys, check_group, check_job_id, check_tenant
from .minutes import DEFAULT_HOURS, DEFAULT_MAX_GROUPS, MAX_HOURS
from .plan import Script, Steps
from .settings import SETTINGS, parse_rate

#: The fairness modes: one claim per turn of the ring, or a share of the worker time.
FAIRNESS_MODES = ("turns", "time")


class Admin(QueueCore):
    """What an operator (the CLI, the dashboard, App's admin methods) changes."""

    def pause(self) -> None:
        self.scripts.pause(self._k, ["1"])

    def resume(self) -> None:
        self.scripts.pause(self._k, ["0"])

    def pause_group(self, group: str) -> bool:
        return bool(self.scripts.pause_group(self._k, [check_group(group), "1"]) == 1)

    def resume_group(self, group: str) -> bool:
        return bool(self.scripts.pause_group(self._k, [check_group(group), "0"]) == 1)

    # -- the fairness controls -----------------------------------------------------------
    def set_group_limit(self, group: str, limit: int | None) -> None:
        value = "" if limit is None else integer(limit, "a group limit", 1)
        self.scripts.limit(self._k, [check_group(group), value])

    def set_group_weight(self, group: str, weight: int | None) -> None:
        """None clears the group's own weight (it then has the default weight, else 1)."""
        value = "" if weight is None else integer(weight, "a group weight", 1)
        self.scripts.weight(self._k, [check_group(group), value])

    def set_group_rate(self, group: str, max_jobs: int | None, per: float = 1.0) -> None:
        """At most max_jobs starts of the group in any window of ``per`` seconds (a burst
        of max_jobs allowed); None clears the group's own rate."""
        self.scripts.rate(self._k, [check_group(group), *rate_args(max_jobs, per)])

    def set_group_max_size(self, group: str, max_size: int | None) -> None:
        """Cap the group's waiting jobs (enqueues into a full lane are refused); None clears."""
        value = "" if max_size is None else integer(max_size, "a lane cap (max_size)", 0)
        self.scripts.maxsize(self._k, [check_group(group), value])

    def set_group_defaults(self, **values: Any) -> tuple[int, int]:
        """Set defaults for every group without a setting of its own: limit, rate
        ((max_jobs, per) or "max_jobs:per_ms"), max_size, weight; a value of None clears that
        default. Lanes already waiting follow at once; returns (groups on the ring, groups
        held back by their rate)."""
        pairs: list[Any] = []
        for name, value in values.items():
            pairs += [name, default_arg(name, value)]
        groups = sorted(self.groups())
        ringed, waiting = self.scripts.defaults(self._k, [len(pairs) // 2, *pairs, *groups])
        return int(ringed), int(waiting)

    def group_defaults(self) -> dict[str, Any]:
        """The defaults for every group that are set (rate as (max_jobs, per seconds))."""
        raw = self.client.hgetall(self.keys.gdefaults)
        return {name: parse_rate(value) if name == "rate" else int(value)
                for name, value in raw.items() if name in SETTINGS}

    # -- tenants: the same controls one level up (lua/tenant.lua) ---------------------------
    def set_tenant_weight(self, tenant: str, weight: int | None) -> None:
        """The tenant's consecutive claims per turn of the ring (None: 1)."""
        value = "" if weight is None else integer(weight, "a tenant weight", 1)
        self.scripts.tenant(self._k, ["weight", check_tenant(tenant), value])

    def set_tenant_limit(self, tenant: str, limit: int | None) -> None:
        """At most ``limit`` of the tenant's jobs in flight, over all its groups (None: no
        limit)."""
        value = "" if limit is None else integer(limit, "a tenant limit", 1)
        self.scripts.tenant(self._k, ["limit", check_tenant(tenant), value])

    def set_tenant_rate(self, tenant: str, max_jobs: int | None, per: float = 1.0) -> None:
        """At most max_jobs starts over all the tenant's groups in any window of ``per``
        seconds (None clears its own rate): a tenant past it leaves the ring of tenants until
        its next start is due."""
        t = check_tenant(tenant)
        self.scripts.tenant(self._k, ["rate", t, tenant_rate_arg(max_jobs, per)])

    def set_tenant_max_size(self, tenant: str, max_size: int | None) -> None:
        """Cap the jobs waiting over all the tenant's groups (an enqueue past it is refused,
        LaneFull); None clears its own cap."""
        value = "" if max_size is None else integer(max_size, "a tenant lane cap (max_size)", 1)
        self.scripts.tenant(self._k, ["max_size", check_tenant(tenant), value])

    def set_tenant_default(self, name: str, value: Any) -> None:
        """The ``limit``, ``weight``, ``rate`` ((max_jobs, per) or "max_jobs:per_ms") or
        ``max_size`` of every tenant without its own (None clears it); tenants already
        waiting follow at once."""
        if name not in ("limit", "weight", "rate", "max_size"):
            raise InvalidArgument(
                f"a tenant default is limit, weight, rate or max_size, not {name!r}")
        if name == "rate":
            text = str(default_arg("rate", value))    # (max_jobs, per) or "10/s"
        else:
            text = "" if value is None else str(integer(value, f"a default tenant {name}", 1))
        self.scripts.tenant(self._k, [name, "", text])

    def tenant_defaults(self) -> dict[str, Any]:
        """The defaults for every tenant that are set (limit, weight, max_size, and rate as
        (max_jobs, per seconds))."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.keys.tlimit, "")
        pipe.hget(self.keys.tweight, "")
        pipe.hget(self.keys.tmax, "")
        pipe.hget(self.keys.trate, "")
        limit, weight, max_size, rate = pipe.execute()
        out: dict[str, Any] = {
            name: int(v) for name, v in (("limit", limit), ("weight", weight),
                                         ("max_size", max_size)) if v is not None}
        if rate is not None:
            out["rate"] = rate_pair(rate)
        return out

    def pause_tenant(self, tenant: str) -> bool:
        return bool(self.scripts.tenant(self._k, ["pause", check_tenant(tenant), "1"]) == 1)

    def resume_tenant(self, tenant: str) -> bool:
        return bool(self.scripts.tenant(self._k, ["pause", check_tenant(tenant), "0"]) == 1)

    def tenant(self, tenant: str) -> dict[str, Any]:
        """What the queue holds of a tenant: its groups, their waiting jobs, its jobs in
        flight, its weight, limit and pause, whether it stands on the ring, and ``waits``:
        why it is not served now (None when it is, or has nothing waiting)."""
        k, t = self.keys, check_tenant(tenant)
        groups = sorted(g for g, owner in self.client.hgetall(k.gtenant).items() if owner == t)
        pipe = self.client.pipeline(transaction=False)
        for g in groups:
            pipe.zcard(k.lane(g))
        pipe.hget(k.tactive, t)
        pipe.hget(k.tlimit, t)
        pipe.hget(k.tweight, t)
        pipe.sismember(k.tpaused, t)
        pipe.llen(k.tenant_ring(t))
        pipe.hget(k.tlimit, "")
        pipe.hget(k.tweight, "")
        for book in (k.trate, k.tmax):
            pipe.hget(book, t)
            pipe.hget(book, "")
        pipe.zscore(k.twait, t)
        pipe.zcard(k.tenant_gvt(t))          # time mode: its zset, its mark in gvt
        pipe.zscore(k.gvt, TENANT_MARK + t)
        *sizes, active, limit, weight, paused, ringed, dlimit, dweight, rate, drate, cap, dcap, \
            due, tz, tv = pipe.execute()
        limit = dlimit if limit is None else limit        # its own, else the default
        weight = dweight if weight is None else weight
        rate = drate if rate is None else rate
        cap = dcap if cap is None else cap
        standing = tv is not None or TENANT_MARK + t in self.client.lrange(k.ring, 0, -1)
        ringed = int(ringed) + int(tz)
        waiting = sum(sizes)
        info: dict[str, Any] = {
            "tenant": t, "groups": dict(zip(groups, sizes)), "waiting": waiting,
            "active": int(active or 0), "limit": None if limit is None else int(limit),
            "weight": int(weight or 1), "paused": bool(paused), "groups_ready": int(ringed),
            "on_ring": standing, "rate": None if rate is None else rate_pair(rate),
            "max_size": None if cap is None else int(cap),
        }
        why = None
        if waiting and not standing:
            if paused:
                why = "paused (resume_tenant)"
            elif limit is not None and info["active"] >= int(limit):
                why = f"at its limit: {info['active']} of {limit} jobs in flight"
            elif due is not None:
                why = "rate: its next start is due at server ms " + str(int(float(due)))
            elif not ringed:
                why = "each of its groups waits for its own reason (see emqtasks lane)"
        info["waits"] = why
        return info

    def set_fairness(self, mode: str) -> int:
        """"turns" (one claim per turn of the ring, the default) or "time" (each backlogged
        group gets a share of the worker time proportional to its weight); returns the
        groups moved to the new mode's ring (0 when the queue had that mode already)."""
        if mode not in FAIRNESS_MODES:
            raise InvalidArgument(f"a fairness mode is 'turns' or 'time', not {mode!r}")
        return int(self.scripts.fairness(self._k, [mode]))

    def fairness(self) -> str:
        """The queue's fairness mode: "turns" or "time"."""
        return "time" if self.client.get(self.keys.fairness) == "time" else "turns"

    # -- jobs -----------------------------------------------------------------------------
    def cancel(self, job_id: str) -> CancelVerdict:
        """CANCELLED, MISSING, ACTIVE (running jobs are not interrupted) or FINISHED."""
        return self.run(cancel_plan(self.keys, job_id))

    def forget(self, job_id: str) -> int:
        """Delete a finished job's row and result (lua/forget.lua): 1 forgotten, 0 no such
        job, -1 not finished (pending, delayed, waiting or active: nothing deleted)."""
        return int(self.scripts.forget(self._k, [check_job_id(job_id)]))

    def cancel_many(self, ids: Sequence[str], per_trip: int = 500) -> int:
        """cancel() each id, ``per_trip`` calls a round trip; how many were cancelled (the
        dashboard's bulk action)."""
        done = 0
        for i in range(0, len(ids), per_trip):
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids[i:i + per_trip]:
                self.scripts.cancel(self._k, [job_id], client=pipe)
            done += sum(1 for r in pipe.execute() if int(r) == 1)   # CANCELLED's code
        return done

    def run_now(self, job_id: str) -> bool:
        """Make a delayed job (a countdown, an eta, a retry's back-off) due now and move it
        to its lane, behind the work already waiting there; False when it is not delayed.

        No verb of its own: its due time (its score in ``delayed``) is set to 0, only if it
        is still there (ZADD XX: a job cancelled or promoted meanwhile is left alone), and
        promote, which moves the earliest due entries first, moves it."""
        key = self.keys.delayed
        if self.client.zscore(key, check_job_id(job_id)) is None:
            return False
        self.client.zadd(key, {job_id: 0}, xx=True)
        self.hot.call("promote", self._k, [1])   # the earliest due entry: this one
        return True

    # -- the audit log (audit.py) -----------------------------------------------------------
    def audit(self, who: str, via: str, action: str, target: str = "",
              jobs: int | None = None) -> str:
        """Record a change an operator made; the entry's id."""
        return record(self.client, self.keys, who, via, action, target, jobs)

    def audit_log(self, count: int = 100, before: str | None = None) -> list[AuditEntry]:
        """The newest ``count`` audit entries, newest first."""
        return entries(self.client, self.keys, count, before)

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Bring one dead job (or all of them) back with fresh attempts; returns the count."""
        if job_id is not None:
            return int(self.scripts.requeue(self._k, [check_job_id(job_id)]))
        # The dead jobs of now, in pages: a job that dies again while this runs waits for
        # the next requeue instead of looping here for ever.
        return self._requeue(self.client.zrange(self.keys.dead, 0, -1))

    def requeue_dead_ids(self, ids: Sequence[str]) -> int:
        """Bring these dead jobs back (ids not dead are passed over); returns the count."""
        for job_id in ids:
            check_job_id(job_id)
        return self._requeue(ids)

    def _requeue(self, ids: Sequence[str]) -> int:
        return sum(int(self.scripts.requeue(self._k, list(ids[i:i + 500])))
                   for i in range(0, len(ids), 500))

    # -- the checker's repair (check.py) --------------------------------------------------
    def repair(self, groups: Sequence[str], rebuild: Sequence[str],
               bury: Sequence[tuple[str, str, str]], lost: Sequence[str]) -> tuple[int, int]:
        """Rebuild the derived structures of ``groups`` (deleting the ``rebuild`` keys, named
        after the base, first), bury (id, group, why) rows in dead, put back ``lost`` ids;
        returns (groups on the ring, jobs restored). lua/repair.lua."""
        flat = [x for triple in bury for x in triple]
        ringed, restored = self.scripts.repair(self._k, [
            len(groups), *groups, len(rebuild), *rebuild, len(bury), *flat, *lost])
        return int(ringed), int(restored)

    def unique_holders(self, keys: Sequence[str]) -> list[str | None]:
        """The job id each unique key (``QueueKeys.unique``'s, by the key's own name) names,
        or None (gone, or not a string): the checker's read (check.py)."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.type(self.keys.unique(key))
            pipe.get(self.keys.unique(key))
        got = pipe.execute(raise_on_error=False)
        return [v if t == "string" and isinstance(v, str) else None
                for t, v in zip(got[::2], got[1::2])]

    def drop_unique(self, key: str, holder: str) -> bool:
        """Delete unique key ``key`` if it still names ``holder`` (a key whose job is gone or
        ended: the next enqueue would take it over; repair frees it now). Fenced by WATCH: a
        key an enqueue took meanwhile stays."""
        name = self.keys.unique(key)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(name)
                if pipe.get(name) != holder:
                    return False
                pipe.multi()
                pipe.delete(name)
                pipe.execute()
                return True
            except WatchError:
                return False

    def abort_lists(self, worker_ids: Sequence[str]) -> list[tuple[bool, list[str]]]:
        """Per master id: whether its heartbeat is there (it is alive), and the tokens
        ``<job id> <nonce>`` of its abort list (lua/abort.lua): the checker's read."""
        pipe = self.client.pipeline(transaction=False)
        for wid in worker_ids:
            pipe.exists(self.keys.worker(wid))
            pipe.lrange(self.keys.aborts(wid), 0, -1)
        got = pipe.execute(raise_on_error=False)
        return [(alive == 1, tokens if isinstance(tokens, list) else [])
                for alive, tokens in zip(got[::2], got[1::2])]

    def attempts_over(self, tokens: Sequence[str]) -> list[str]:
        """The abort tokens whose attempt is not running (its row is gone, not active, or
        holds another claim's nonce): no master has anything to stop for them."""
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            pipe.hmget(self.keys.job(token.partition(" ")[0]), "state", "nonce")
        got = pipe.execute(raise_on_error=False)
        return [token for token, row in zip(tokens, got)
                if not isinstance(row, list) or row[0] != "active"
                or (row[1] or "") != token.partition(" ")[2]]

    def drop_aborts(self, worker_id: str, tokens: Sequence[str], whole: bool) -> int:
        """Repair of an abort list: ``whole``, the list of a master that is not alive is
        deleted (fenced by WATCH: not if its heartbeat came back meanwhile), else the
        ``tokens`` (attempts over: a nonce is never claimed again) are removed from it.
        Returns the tokens dropped."""
        name = self.keys.aborts(worker_id)
        if not whole:
            pipe = self.client.pipeline(transaction=False)
            for token in tokens:
                pipe.lrem(name, 0, token)
            return sum(int(n) for n in pipe.execute())
        beat = self.keys.worker(worker_id)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(name, beat)
                if pipe.exists(beat):
                    return 0
                held = int(pipe.llen(name))
                pipe.multi()
                pipe.delete(name)
                pipe.execute()
                return held
            except WatchError:
                return 0

    # -- history (history.py; the verbs count, lua/lib/history.lua) ---------------------
    def set_history(self, hours: int = DEFAULT_HOURS,
                    max_groups: int = DEFAULT_MAX_GROUPS) -> None:
        """Keep ``hours`` of per-minute history (0: count nothing), tracking at most
        ``max_groups`` groups a minute (the rest are counted together)."""
        hours = integer(hours, "history hours", 0, MAX_HOURS)
        max_groups = integer(max_groups, "max_groups", 0, MAX_COUNT)
        self.client.hset(self.keys.gdefaults, mapping={"history": hours,
                                                       "hgroups": max_groups})

    def purge(self) -> int:
        """Delete every key of the queue (jobs, lanes, books, flags) but its audit log (the
        trail of the purge outlives it); returns keys removed."""
        removed = 0
        batch: list[str] = []
        for key in self.scan(self.keys.all_pattern):
            if key == self.keys.audit:
                continue
            batch.append(key)
            if len(batch) >= 500:
                removed += self.client.unlink(*batch)
                batch = []
        if batch:
            removed += self.client.unlink(*batch)
        return removed


def rate_args(max_jobs: int | None, per: float) -> list[Any]:
    """The rate script's (max_jobs, per_ms), or ('', '') to clear."""
    if max_jobs is None:
        return ["", ""]
    count = integer(max_jobs, "a rate's max_jobs", 1)
    window = seconds(per, "a rate's per", above_low=True)
    return [count, max(1, round(window * 1000))]


def tenant_rate_arg(max_jobs: int | None, per: float = 1.0) -> str:
    """The tenant script's "max_jobs:per_ms", or '' to clear."""
    if max_jobs is None:
        return ""
    count, per_ms = rate_args(max_jobs, per)
    return f"{count}:{per_ms}"


def rate_pair(text: str) -> tuple[int, float]:
    """A stored "max_jobs:per_ms" as (max_jobs, per seconds)."""
    m, per_ms = text.split(":")
    return int(m), int(per_ms) / 1000


def default_arg(name: str, value: Any) -> Any:
    """One default as the defaults script stores it; '' clears it."""
    if value is None:
        return ""
    if name == "rate":
        if isinstance(value, str):
            parsed = parse_rate(value)
            assert parsed is not None
            value = parsed
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise InvalidArgument(f"a default rate is (max_jobs, per seconds), not {value!r}")
        count, per_ms = rate_args(value[0], value[1])
        return f"{count}:{per_ms}"
    if name == "max_size":
        return integer(value, "a default max_size", 0)
    if name in ("limit", "weight"):
        return integer(value, f"a default {name}", 1)
    raise InvalidArgument(f"unknown group default {name!r}: limit, rate, max_size or weight")


def cancel_plan(keys: QueueKeys, job_id: str) -> Steps[CancelVerdict]:
    """Admin.cancel (lua/cancel.lua)."""
    code = int((yield Script("cancel", keys.fixed, [check_job_id(job_id)])))
    try:
        return CancelVerdict.from_reply(code)
    except KeyError:  # pragma: no cover
        raise ScriptError(f"cancel answered {code}") from None

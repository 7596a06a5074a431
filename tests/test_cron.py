"""Schedule timings without a server: cron parsing, next slots across DST, intervals, and the
named errors a bad declaration gets (at import for the decorator)."""

from __future__ import annotations

import math
import random
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from emqtasks import (
    App,
    Cron,
    Every,
    InvalidCron,
    InvalidInterval,
    InvalidSchedule,
    InvalidScheduleName,
    ScheduleError,
    UnknownTimezone,
    cron,
    every,
)
from emqtasks.schedules.schedule import make_schedule, slot_id


def _ts(text: str, tz: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp())


def _local(slot: int, tz: str) -> str:
    return datetime.fromtimestamp(slot, ZoneInfo(tz)).isoformat()


def _slots(c: Cron, start: str, end: str) -> list[str]:
    lo, hi = _ts(start, c.tz), _ts(end, c.tz)
    return [_local(s, c.tz) for s in c.slots_between(lo, hi, 1000)]


# -- DST: a fixed-time job runs once on each day, shifted after a spring-forward gap --------

@pytest.mark.parametrize("tz, day, gap_time, expected", [
    # Paris: 2024-03-31 02:00 CET -> 03:00 CEST; New York: 2024-03-10 02:00 EST -> 03:00 EDT
    ("Europe/Paris", "2024-03-31", "30 2 * * *", "2024-03-31T03:00:00+02:00"),
    ("America/New_York", "2024-03-10", "30 2 * * *", "2024-03-10T03:00:00-04:00"),
])
def test_a_job_in_the_spring_forward_gap_runs_once_at_the_next_valid_time(
        tz: str, day: str, gap_time: str, expected: str) -> None:
    c = cron(gap_time, tz=tz)
    d = date.fromisoformat(day)
    before, after = (d - timedelta(days=1)).isoformat(), (d + timedelta(days=1)).isoformat()
    slots = _slots(c, f"{before}T12:00", f"{after}T12:00")
    assert slots == [expected, f"{after}T02:30:00{expected[-6:]}"]


@pytest.mark.parametrize("tz, day, expr, first", [
    # Paris: 2024-10-27 03:00 CEST -> 02:00 CET, so 02:30 happens twice
    ("Europe/Paris", "2024-10-27", "30 2 * * *", "2024-10-27T02:30:00+02:00"),
    # New York: 2024-11-03 02:00 EDT -> 01:00 EST, so 01:30 happens twice
    ("America/New_York", "2024-11-03", "30 1 * * *", "2024-11-03T01:30:00-04:00"),
])
def test_a_job_in_the_repeated_fall_back_hour_runs_once_not_twice(
        tz: str, day: str, expr: str, first: str) -> None:
    c = cron(expr, tz=tz)
    slots = _slots(c, f"{day}T00:00", f"{day}T23:59")
    assert slots == [first]
    # Asked from inside the second pass of the repeated hour (after the first run), the
    # next slot is tomorrow's, never a second one today nor one in the past.
    z = ZoneInfo(tz)
    hour = int(expr.split()[1])
    second_pass = datetime(*map(int, day.split("-")), hour, 10, fold=1, tzinfo=z)
    t = int(second_pass.timestamp())
    assert t > _ts(first[:19], tz)
    nxt = c.next_after(t)
    assert nxt > t
    assert _local(nxt, tz).startswith((date.fromisoformat(day) + timedelta(days=1)).isoformat())


@pytest.mark.parametrize("tz", ["Europe/Paris", "America/New_York"])
def test_a_daily_job_fires_once_per_local_day_through_a_whole_year(tz: str) -> None:
    c = cron("30 2 * * *", tz=tz)
    slots = c.slots_between(_ts("2024-01-01T00:00", tz), _ts("2024-12-31T23:59", tz), 1000)
    days = [datetime.fromtimestamp(s, ZoneInfo(tz)).date() for s in slots]
    assert len(days) == 366 == len(set(days))
    assert all(b > a for a, b in zip(slots, slots[1:]))


def test_wildcard_hour_jobs_follow_real_time_through_a_repeated_hour() -> None:
    c = cron("*/30 * * * *", tz="America/New_York")
    slots = c.slots_between(_ts("2024-11-03T00:50", c.tz), _ts("2024-11-03T02:10", c.tz), 20)
    assert [b - a for a, b in zip(slots, slots[1:])] == [1800] * (len(slots) - 1)
    assert len(slots) == 5   # 01:00 and 01:30 EDT, then 01:00, 01:30 and 02:00 EST


def test_weekday_names_and_macros_and_time_zones() -> None:
    c = cron("0 9 * * mon-fri", tz="Europe/Paris")
    slots = _slots(c, "2024-03-29T12:00", "2024-04-08T00:00")   # Friday noon to Monday
    assert slots[0] == "2024-04-01T09:00:00+02:00" and len(slots) == 5
    assert Cron("@hourly").next_after(_ts("2024-01-01T10:20", "UTC")) == \
        _ts("2024-01-01T11:00", "UTC")
    assert cron("0 0 * * *", tz="Asia/Tokyo").next_after(_ts("2024-01-01T12:00", "UTC")) == \
        _ts("2024-01-02T00:00", "Asia/Tokyo")


def test_latest_slot_at_or_before_agrees_with_next_after() -> None:
    rng = random.Random(7)
    for c in (cron("30 2 * * *", tz="Europe/Paris"), cron("*/7 * * * *"),
              cron("0 0 1 1 *", tz="America/New_York"), cron("0 12 * * sat,sun")):
        for _ in range(40):
            t = _ts("2024-01-01T00:00", "UTC") + rng.randrange(0, 400 * 86_400)
            latest = c.latest_at_or_before(t)
            assert latest is not None and latest <= t < c.next_after(latest)


def test_every_is_aligned_on_the_epoch() -> None:
    e = every(60)
    assert (e.next_after(119), e.next_after(120), e.latest_at_or_before(179)) == (120, 180, 120)
    assert e.slots_between(100, 300, 10) == [120, 180, 240, 300]
    assert every(timedelta(hours=1)).seconds == 3600 and every(2.0).seconds == 2
    assert slot_id("nightly", 1_700_000_000) == "sched:nightly:1700000000"


# -- bad input: a named error that quotes the value ---------------------------------------

@pytest.mark.parametrize("expr", ["* * * *", "61 * * * *", "0 0 30 2 *", "0 0 0 * * *",
                                  "a b c d e", "*/0 * * * *", "", "0 25 * * *"])
def test_a_malformed_cron_expression_is_refused_quoting_it(expr: str) -> None:
    with pytest.raises(InvalidCron) as err:
        cron(expr)
    assert repr(expr) in str(err.value)


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "localtime", "", "europe/paris", "../etc"])
def test_an_unknown_time_zone_is_refused_quoting_it(tz: str) -> None:
    with pytest.raises(UnknownTimezone) as err:
        cron("0 9 * * *", tz=tz)
    assert repr(tz) in str(err.value)


@pytest.mark.parametrize("value", [0, 0.5, 1.5, -1, True, "5", timedelta(milliseconds=500),
                                   math.nan, math.inf])
def test_every_under_one_second_or_not_whole_is_refused_quoting_it(value: object) -> None:
    with pytest.raises(InvalidInterval) as err:
        every(value)  # type: ignore[arg-type]
    assert repr(value) in str(err.value)


@pytest.mark.parametrize("name", ["with:colon", "", "x" * 65, "spa ce", "é"])
def test_a_schedule_name_that_cannot_be_part_of_a_job_id_is_refused(name: str) -> None:
    with pytest.raises(InvalidScheduleName) as err:
        make_schedule(name, "t.task", every=5)
    assert repr(name) in str(err.value)


@pytest.mark.parametrize("options", [
    {}, {"cron": "* * * * *", "every": 5}, {"every": 5, "catchup": "some"},
    {"every": 5, "jitter": -1}, {"every": 5, "overlap": "no"},
])
def test_schedule_options_that_do_not_fit_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(InvalidSchedule):
        make_schedule("ok", "t.task", **options)  # type: ignore[arg-type]


def test_the_decorator_refuses_bad_schedules_at_import_and_registers_nothing() -> None:
    app = App(redis_url="redis://127.0.0.1:1/0", queue="never-connected")
    with pytest.raises(InvalidCron):
        @app.task(name="d.bad_cron", schedule="61 * * * *")
        def bad_cron() -> None: ...
    with pytest.raises(InvalidSchedule):
        @app.task(name="d.takes_args", schedule=every(5))
        def takes_args(x: int) -> None: ...
    with pytest.raises(InvalidScheduleName):
        @app.task(name="d:colon", schedule=every(5))
        def colon() -> None: ...
    with pytest.raises(UnknownTimezone):
        @app.task(name="d.tz", schedule=cron("0 9 * * *", tz="Nowhere/City"))
        def tz() -> None: ...
    assert app.tasks == {} and app.declared_schedules == {}

    @app.task(name="d.fine", schedule=cron("0 9 * * mon-fri", tz="Europe/Paris"))
    def fine() -> None: ...
    s = app.declared_schedules["d.fine"]
    assert (s.task, s.spec, s.tz, s.catchup) == ("d.fine", "cron 0 9 * * mon-fri",
                                                 "Europe/Paris", "latest")
    assert isinstance(s.timing, Cron) and isinstance(every(3), Every)
    assert issubclass(InvalidCron, ScheduleError)


def test_a_stored_schedule_round_trips_through_json() -> None:
    s = make_schedule("r1", "t.task", cron="*/5 * * * *", tz="Europe/Paris",
                      args=(1, "a"), kwargs={"k": [1]}, group="g", catchup="all",
                      jitter=2.5, overlap=False)
    from emqtasks.schedules.schedule import Schedule

    back = Schedule.from_json(s.to_json())
    assert back == s and back.to_json() == s.to_json()

"""The chaos soak's checker (emqtasks/_dev/history_check.py) can fail: fed hand-made
histories with a lost job, a job started and acknowledged again after its ack, a stale
write, a chord's callback run early and a bad read, it reports each, with the operations
involved; a clean history gives nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emqtasks._dev import history
from emqtasks._dev.history_check import check


def _rec(t: float, op: str, type_: str, **fields: Any) -> dict[str, Any]:
    return {"op": op, "type": type_, "t": t, "pid": 1, **fields}


def _clean() -> list[dict[str, Any]]:
    """Two jobs enqueued and acknowledged; a ran (once), b was doomed and died; a chord
    whose callback started after both members ended; a get() of a."""
    return [
        _rec(1, "enqueue", "invoke", batch=1, ids=["a", "b"], doomed=["b"]),
        _rec(2, "enqueue", "ok", batch=1),
        _rec(3, "start", "invoke", id="a", run="a|1|7|x"),
        _rec(4, "end", "ok", id="a", run="a|1|7|x"),
        _rec(5, "ack", "ok", id="a", run="a|1|7|x"),
        _rec(6, "start", "invoke", id="b", run="b|1|7|y"),
        _rec(7, "get", "ok", id="a", value="a|1|7|x"),
        _rec(8, "enqueue", "invoke", batch="c1", chord="c1"),
        _rec(9, "enqueue", "ok", batch="c1"),
        _rec(10, "end", "ok", id="m1", run="m1|1|7|p"),
        _rec(11, "end", "ok", id="m2", run="m2|1|8|q"),
        _rec(12, "start", "invoke", id="cb", run="cb|1|7|r", chord="c1",
             members=["m1|1|7|p", "m2|1|8|q"]),
        _rec(20, "final", "ok", id="a", state="done", result="a|1|7|x"),
        _rec(20, "final", "ok", id="b", state="dead", result=None),
        _rec(20, "final", "ok", id="cb", state="done", result="cb|1|7|r"),
    ]


def _kinds(records: list[dict[str, Any]]) -> list[str]:
    return sorted(v.kind for v in check(records))


def test_a_clean_history_has_no_violations() -> None:
    assert check(_clean()) == []


def test_a_lost_job_is_reported_with_its_enqueue() -> None:
    # the acknowledged a never ran: its row reads waiting at the end
    records = [r for r in _clean() if r.get("id") != "a"]
    records.append(_rec(20, "final", "ok", id="a", state="waiting", result=None))
    [v] = check(records)
    assert v.kind == "lost" and "a was acknowledged but is waiting" in v.what
    assert {r["op"] for r in v.records} == {"enqueue", "final"}
    # and a job with no row at all, or a doomed one that is not dead, is lost too
    gone = [r for r in _clean() if not (r["op"] == "final" and r["id"] in ("a", "b"))]
    assert _kinds(gone) == ["lost", "lost"]


def test_a_job_started_and_acknowledged_again_after_its_ack_is_reported() -> None:
    records = _clean() + [_rec(13, "start", "invoke", id="a", run="a|2|8|z"),
                          _rec(14, "end", "ok", id="a", run="a|2|8|z"),
                          _rec(15, "ack", "ok", id="a", run="a|2|8|z")]
    violations = check(records)
    assert sorted(v.kind for v in violations) == ["acked twice", "started after ack"]
    lines = "\n".join(line for v in violations for line in v.lines())
    assert '"run":"a|1|7|x"' in lines and '"run":"a|2|8|z"' in lines   # both holders


def test_a_stale_write_is_reported() -> None:
    # the holder a|1 was fenced out (its ack refused as stale), yet its result is stored
    records = _clean()
    records[4] = _rec(5, "ack", "stale", id="a", run="a|1|7|x")
    [v] = check(records)
    assert v.kind == "stale write" and v.records[0]["type"] == "stale"


def test_a_chord_callback_that_started_before_a_member_finished_is_reported() -> None:
    records = _clean()
    records[10] = _rec(13, "end", "ok", id="m2", run="m2|1|8|q")   # after the callback
    [v] = check(records)
    assert v.kind == "chord early" and "m2" in v.what


def test_a_get_that_returned_another_result_is_reported() -> None:
    records = _clean() + [_rec(13, "get", "ok", id="a", value="a|9|9|other")]
    [v] = check(records)
    assert v.kind == "bad read" and "a|9|9|other" in v.what


def test_the_history_files_read_back_in_time_order_skipping_a_torn_line(
        tmp_path: Path) -> None:
    first, second = history.Recorder(tmp_path, "a"), history.Recorder(tmp_path, "b")
    first.record("start", "invoke", id="x", run="x|1")
    second.record("end", "ok", id="x", run="x|1")
    first.record("ack", "ok", id="x", run="x|1")
    first.close()
    second.close()
    with open(next(tmp_path.glob("b-*.jsonl")), "a") as f:
        f.write('{"op": "ack", "ty')   # a SIGKILL in the middle of a write
    assert [r["op"] for r in history.read(tmp_path)] == ["start", "end", "ack"]

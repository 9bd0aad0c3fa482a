"""The `[train]` log lines of docs/contracts.md, the view, and the summary built from them."""

from __future__ import annotations

import io

from localrun.progress import Progress, TrainEvent, parse_train_line
from localrun.summary import Summary


def test_parses_every_train_line_of_the_contract() -> None:
    assert parse_train_line("[train] step=7 world_size=3 restart=1 loss=0.25") == TrainEvent(
        "step", 7, 3, 1, 0.25
    )
    assert parse_train_line("[train] resumed step=10") == TrainEvent("resumed", 10)
    assert parse_train_line("[train] start step=10 world_size=2 restart=1") == TrainEvent(
        "start", 10, 2, 1
    )
    assert parse_train_line("[train] checkpoint step=20") == TrainEvent("checkpoint", 20)
    assert parse_train_line("[train] sigterm step=21") == TrainEvent("sigterm", 21)
    assert parse_train_line("[train] done step=60") == TrainEvent("done", 60)


def test_other_lines_are_not_events() -> None:
    for line in ("elastic-worker: waiting", "[train] started", "[train] step=x", "train step=1"):
        assert parse_train_line(line) is None


def test_plain_output_when_not_a_terminal() -> None:
    out = io.StringIO()
    p = Progress(out=out)
    assert p.live is False
    p.event("pod started")
    p.draw()
    assert out.getvalue().endswith("pod started\n")
    assert "\x1b[" not in out.getvalue()


def test_live_view_redraws_in_place() -> None:
    out = io.StringIO()
    p = Progress(out=out, live=True)
    p.state.world_size = 3
    p.draw(force=True)
    p.draw(force=True)
    assert "world size 3" in out.getvalue()
    assert "\x1b[" in out.getvalue()  # cursor moved back over the previous table


def _steps(s: Summary, t0: float, first: int, last: int, world: int, *, restart: int = 0) -> float:
    t = t0
    for n in range(first, last + 1):
        for pod in range(world):
            s.train(f"p{pod}", t, TrainEvent("step", n, world, restart))
        t += 1
    return t


def test_summary_counts_a_fault_reform_and_the_grow_back() -> None:
    s = Summary()
    s.train("p0", 0, TrainEvent("start", 0, 3, 0))
    t = _steps(s, 0, 1, 10, 3)
    s.train("p0", t, TrainEvent("checkpoint", 10))
    t = _steps(s, t, 11, 12, 3)
    s.fault(t, "kill p2")
    s.train("p0", t + 5, TrainEvent("resumed", 10))
    s.train("p1", t + 5, TrainEvent("resumed", 10))
    s.train("p0", t + 5, TrainEvent("start", 10, 2, 1))
    t2 = _steps(s, t + 8, 11, 14, 2, restart=1)
    s.pod_started("p2", t2)
    s.train("p0", t2 + 4, TrainEvent("resumed", 14))
    s.train("p0", t2 + 4, TrainEvent("start", 14, 3, 1))  # a node joined: no restart
    _steps(s, t2 + 6, 15, 20, 3, restart=1)
    s.train("p0", 100, TrainEvent("done", 20))
    d = s.as_dict()
    assert d["completed"] is True
    assert d["final_step"] == 20
    assert d["world_sizes"] == [3, 2, 3]
    assert d["rendezvous_rounds"] == 3
    assert d["checkpoint_steps"] == [10]
    kill, grow = d["reforms"]
    assert kill["cause"] == "kill p2"
    assert kill["seconds"] == 8
    assert kill["world_size"] == 2
    assert kill["resumed_step"] == 10
    assert kill["steps_lost"] == 2
    assert "p2 joined" in grow["cause"]
    assert grow["world_size"] == 3
    assert grow["seconds"] == 6
    assert d["steps_went_back_past_checkpoint"] is False


def test_summary_flags_a_resume_before_the_last_checkpoint() -> None:
    s = Summary()
    _steps(s, 0, 1, 20, 2)
    s.train("p0", 20, TrainEvent("checkpoint", 20))
    s.train("p0", 30, TrainEvent("resumed", 10))
    assert s.as_dict()["steps_went_back_past_checkpoint"] is True


def test_a_fault_without_a_reform_is_reported_unresolved() -> None:
    s = Summary()
    _steps(s, 0, 1, 3, 2)
    s.fault(5, "partition p1 for 2s")
    _steps(s, 6, 4, 5, 2)
    (r,) = s.as_dict()["reforms"]
    assert r["seconds"] is None
    assert "no training step" in r["note"]


def test_a_grow_after_a_partition_names_the_link_that_came_back() -> None:
    s = Summary()
    t = _steps(s, 0, 1, 5, 3)
    s.fault(t, "partition p1 for 20s")
    s.train("p0", t + 30, TrainEvent("resumed", 5))
    t = _steps(s, t + 31, 6, 8, 2, restart=1)
    s.pod_started("p1", t, "link up")
    s.train("p0", t + 9, TrainEvent("resumed", 8))
    _steps(s, t + 10, 9, 10, 3, restart=2)
    part, grow = s.as_dict()["reforms"]
    assert part["cause"].startswith("partition p1") and part["world_size"] == 2
    assert grow["cause"] == "world size 2 -> 3 (p1 link up)"
    assert grow["seconds"] == 10

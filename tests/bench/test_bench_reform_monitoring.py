"""scripts/bench-reform-monitoring (benches/reform_monitoring.py): which re-form of the run
summary it reports, and its per-mode lines. Each run is a minute of the local run as root;
tests/e2e covers the re-form it times."""

from __future__ import annotations

from pathlib import Path

from testlib import ROOT

from benches.reform_monitoring import MODES, VICTIM, kill_reform_seconds, mode_lines
from localrun.cli import build_parser, parse_pod_fault
from localrun.faults import FaultKind
from localrun.lines import parse_line
from localrun.render import render
from localrun.state import RunState


def attempt(nodes: int) -> str:
    return (
        f"[elastic-worker] attempt run_id=j restart=1 group_rank=0 nodes={nodes} world_size={nodes}"
    )


def test_the_figure_is_the_summarys_reform_after_the_kill_of_the_victim() -> None:
    # The summary as the local run writes it (localrun/state.py), for the bench's own fault.
    state = RunState()
    line = lambda t, text: state.line("bench-elastic-job-default-0", "worker", text, t)  # noqa: E731
    line(1.0, attempt(3))
    for n in range(1, 9):
        line(1.0 + n, f"[train] step={n} world_size=3 restart=0 loss=0.1")
    kill = parse_pod_fault(FaultKind.KILL, f"{VICTIM}@step=8:15")
    state.fault(10.0, kill.describe())
    line(14.0, attempt(2))
    line(15.0, "[train] resumed step=5")
    line(16.5, "[train] step=6 world_size=2 restart=1 loss=0.1")
    summary = state.as_dict()
    assert kill_reform_seconds(summary) == 6.5
    # another cause, or a kill that never trained again, is not the figure
    other = {"reforms": [{"cause": "scale default=2", "seconds": 1.0}]}
    assert kill_reform_seconds(other) is None
    assert kill_reform_seconds({"reforms": [{"cause": f"kill {VICTIM}", "seconds": None}]}) is None
    assert parse_line("worker", attempt(2)) is not None  # the lines above are the worker's


def test_each_mode_is_reported_with_its_median_and_spread_and_a_mode_without_runs_not() -> None:
    lines = mode_lines({"off": [3.0, 2.0, 4.5], "metrics": [], "prometheus": [3.25]})
    assert lines == [
        "off        n=3 median 3.00 s spread 2.00-4.50 s",
        "prometheus n=1 median 3.25 s spread 3.25-3.25 s",
    ]


def test_each_modes_arguments_are_ones_the_local_run_takes_and_set_the_monitoring_value(
    tmp_path: Path,
) -> None:
    parser = build_parser()
    chart = ROOT / "charts" / "elastic-job"
    for mode, extra in MODES.items():
        args = parser.parse_args(["run", "--chart", str(chart), *extra])
        rendered = render(chart, [], args.sets, release="bench", namespace="default")
        env = {
            e["name"]: e.get("value", "")
            for s in rendered.statefulsets
            if s["metadata"]["name"] == "bench-elastic-job-default"
            for e in s["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert bool(args.prometheus) == (mode == "prometheus"), mode
        if mode != "prometheus":  # --prometheus sets its own values (localrun/prometheus.py)
            assert env["ELASTIC_METRICS"] == ("true" if mode == "metrics" else "false"), mode

"""scripts/bench-spares' plumbing (benches/spares.py): each row's values reach the worker
through the chart (a spare is one replica more than job.maxNodes; reclaim on or off), its
fault is one the local run takes, the victim is a pod that trains (never the spare), and
the table says "> bound" for a slot that never came back. The runs themselves take minutes
each: tests/e2e/test_e2e_nodes.py covers the node loss they time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testlib import ROOT

from benches import spares
from benches.churn.localrun import POD, RELEASE
from localrun.cli import build_parser, config_from_args
from localrun.faults import FaultKind
from localrun.render import render


@pytest.mark.parametrize("name", list(spares.ROWS))
def test_each_rows_values_reach_the_worker_through_the_chart(tmp_path: Path, name: str) -> None:
    row = spares.ROWS[name]
    (tmp_path / "values.json").write_text(json.dumps(spares.values(row, spares.QUICK)))
    rendered = render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml", tmp_path / "values.json"],
        [],
        release=RELEASE,
        namespace="default",
    )
    sts = next(s for s in rendered.statefulsets if s["metadata"]["name"] == POD)
    assert sts["spec"]["replicas"] == spares.MAX + (1 if row.spare else 0)
    env = {
        e["name"]: e.get("value", "")
        for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["ELASTIC_MAX_NODES"] == str(spares.MAX)
    assert env["ELASTIC_RECLAIM"] == ("true" if row.reclaim else "false")
    assert env["ELASTIC_RECLAIM_AFTER"] == "5"


@pytest.mark.parametrize("name", ["kill", "node-down"])
def test_the_fault_is_one_the_local_run_takes_on_a_pod_that_trains(name: str) -> None:
    argv = spares.faults(spares.ROWS[name], spares.QUICK)
    cfg = config_from_args(
        build_parser().parse_args(
            ["run", "-f", str(ROOT / "values-examples" / "cpu-smoke.yaml"), *argv]
        )
    )
    (fault,) = cfg.faults
    assert fault.at_step == spares.FAULT_AT
    if name == "kill":
        assert (fault.kind, fault.target) == (FaultKind.KILL, "rank:1")
    else:  # the node of the pod at group rank 1, down for good
        assert (fault.kind, fault.node_of, fault.duration) == (FaultKind.NODE_DOWN, "rank:1", None)
    assert cfg.node_timings.grace_period == spares.QUICK.grace


def test_a_slot_that_never_came_back_reads_as_more_than_the_bound() -> None:
    runs = {
        "node-down": [{"back_at_max": None, "timed_out": True, "rounds_after": 0, "max_world": 3}],
        "node-down-spare": [
            {"back_at_max": 7.5, "timed_out": False, "rounds_after": 0, "max_world": 3}
        ],
    }
    lines = spares.table(runs, spares.QUICK)
    assert "> 120" in lines[1] and "(baseline)" in lines[1]
    assert "7.5 (7.5-7.5)" in lines[2]

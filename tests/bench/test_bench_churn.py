"""scripts/bench-churn's plumbing (benches/churn: the silent and goodput figures of
scripts/bench): what counts as useful work, when the survivors train again, that its
baseline is torch's own defaults through the chart, and what the table says of a wait cut at
the bound. The runs themselves take minutes each (the local run of the chart): tests/e2e's
partition scenarios cover the re-form they time."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from testlib import ROOT
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
from torch.distributed.run import get_args_parser

from benches.churn.goodput import goodput, kept_steps
from benches.churn.goodput import goodput_once as churn_goodput_once
from benches.churn.localrun import POD, RELEASE, LocalRun, pod
from benches.churn.profiles import (
    GOODPUT_PROFILES,
    SCRIPTS,
    SILENT_PROFILES,
    TORCH_DEFAULTS,
    USER_SCRIPT_DIR,
    merged,
)
from benches.churn.report import fmt_seconds, table_lines
from benches.churn.silent import first_step_at, nodes_before
from benches.snapshots.goodput import goodput_once as snap_goodput_once
from benches.stats import summary_cut
from localrun.render import render

POD0, POD1 = pod(0), pod(1)


def attempt(nodes: int) -> str:
    # docs/contracts.md, "The attempt line": what elastic-worker prints for each round
    return (
        f"[elastic-worker] attempt run_id=j restart=1 group_rank=0 nodes={nodes} world_size={nodes}"
    )


def step(n: int, world: int) -> str:
    return f"[train] step={n} world_size={world} restart=0 loss=0.1000"


def local_run(tmp_path: Path, lines: list[tuple[float, str, str]]) -> LocalRun:
    run = LocalRun(tmp_path, [])
    run.lines = lines
    return run


def test_kept_steps_drop_what_a_resume_rolled_back_and_count_each_step_once(
    tmp_path: Path,
) -> None:
    lines = []
    for n in range(1, 9):  # both pods print every step at world size 3
        lines += [(float(n), POD0, step(n, 3)), (float(n), POD1, step(n, 3))]
    # pod 1 lost after step 8: pod 0 resumes from the checkpoint of step 5 at world size 2
    lines += [(10.0, POD0, "[train] resumed step=5"), (11.0, POD0, step(6, 2))]
    kept = kept_steps(local_run(tmp_path, lines), until=11.5)
    assert [(s.step, s.world) for s in kept] == [(1, 3), (2, 3), (3, 3), (4, 3), (5, 3), (6, 2)]
    # steps 7 and 8 were done but rolled back: not useful work. Window [0, 12): 5 steps of
    # 3 ranks and one of 2, 16 samples per rank-step.
    assert goodput(kept, 0.0, 12.0) == pytest.approx((5 * 3 + 2) * 16 / 12)
    # what happens after the window's end is not looked at
    assert [s.step for s in kept_steps(local_run(tmp_path, lines), until=9.0)] == [*range(1, 9)]


def test_both_goodput_figures_read_the_window_from_the_first_loss_of_one_churn_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.monotonic() - 1000.0  # the run's window is over: nothing to wait for
    # all three before the first loss (at 60 s), then two in the window [60 s, 140 s)
    lines = [(started + 50.0 + i, POD0, step(i + 1, 3)) for i in range(10)]
    lines += [(started + 70.0 + i, POD0, step(i + 11, 2)) for i in range(8)]
    starts: list[tuple[list[str], float]] = []

    class Run(LocalRun):
        over = False

        def ended(self) -> bool:
            return self.over

        def stop(self) -> None:
            pass

    def start(workdir: Path, values: dict[str, Any], faults: list[str], timeout: float) -> Run:
        starts.append((faults, timeout))
        return Run(workdir, [], lines=lines, started=started)

    monkeypatch.setattr(LocalRun, "start", start)
    churn = (40.0, 20.0, 2)
    row = churn_goodput_once("elastic-job", churn, tmp_path)
    assert starts[-1] == ([f"--kill={pod(0)}@60:20", f"--kill={pod(1)}@100:20"], 260.0)
    assert {k: row[k] for k in ("figure", "T", "R", "losses", "kept_steps")} == {
        "figure": "goodput", "T": 40.0, "R": 20.0, "losses": 2, "kept_steps": 8,
    }  # fmt: skip
    # 8 steps of 2 ranks in 80 s; 10 steps of 3 in the 20 s before the first loss
    assert (row["goodput"], row["steady"], row["per_cycle"]) == (3.2, 24.0, [6.4, 0.0])
    snap = snap_goodput_once("snapshots", churn, tmp_path)
    assert starts[-1] == starts[0]
    assert (snap["figure"], snap["steps_per_s"], snap["steady_steps_per_s"]) == (
        "snap-goodput", 0.1, 0.5,
    )  # fmt: skip
    assert (snap["ratio"], snap["samples_per_s"]) == (0.2, 3.2)
    Run.over = True
    assert snap_goodput_once("snapshots", churn, tmp_path)["error"].startswith(
        "the run ended first"
    )


def test_the_survivors_train_again_at_their_first_step_in_a_round_of_the_smaller_size(
    tmp_path: Path,
) -> None:
    pattern = SCRIPTS["train.py"][2]
    lines = [
        (1.0, POD0, attempt(3)),
        (2.0, POD0, step(1, 3)),
        (10.0, POD0, step(2, 3)),  # after the cut, still the old round (a step in flight)
        (15.0, POD0, attempt(2)),
        (16.0, POD0, "[train] resumed step=0"),
        (17.5, POD0, step(1, 2)),
    ]
    run = local_run(tmp_path, lines)
    assert nodes_before(run, POD0, 9.0) == 3
    assert first_step_at(run, POD0, 9.0, 2, pattern) == 17.5
    assert first_step_at(run, POD0, 18.0, 2, pattern) is None


def test_the_user_scripts_step_line_is_the_one_multinode_py_prints() -> None:
    pattern = SCRIPTS["no pg timeout"][2]
    source = (USER_SCRIPT_DIR / "multinode.py").read_text()
    assert 'f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | "' in source
    assert pattern.search("[GPU1] Epoch 12 | Batchsize: 32 | Steps: 8")
    assert not pattern.search("Epoch 11 | Training snapshot saved at /checkpoints/snapshot.pt")


def worker_env(tmp_path: Path, values: dict[str, Any]) -> dict[str, str]:
    """The worker's env as the local run renders it: cpu-smoke.yaml, then `values`."""
    (tmp_path / "values.json").write_text(json.dumps(values))
    rendered = render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml", tmp_path / "values.json"],
        [],
        release=RELEASE,
        namespace="default",
    )
    sts = next(s for s in rendered.statefulsets if s["metadata"]["name"] == POD)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_silent_baseline_is_torchs_own_rendezvous_defaults_through_the_chart(
    tmp_path: Path,
) -> None:
    env = worker_env(tmp_path, TORCH_DEFAULTS)
    conf = dict(kv.split("=", 1) for kv in env["ELASTIC_RDZV_CONF"].split(","))

    class Backend:
        name = "etcd-v2"

    # torch's handler as torchrun builds it when --rdzv-conf sets nothing
    defaults = create_handler(
        dist.HashStore(), Backend(), RendezvousParameters("etcd-v2", "", "j", 2, 3)
    )._settings
    assert float(conf["last_call_timeout"]) == defaults.timeout.last_call.total_seconds()
    assert float(conf["close_timeout"]) == defaults.timeout.close.total_seconds()
    assert float(conf["join_timeout"]) == defaults.timeout.join.total_seconds()
    assert float(conf["keep_alive_interval"]) == defaults.keep_alive_interval.total_seconds()
    assert int(conf["keep_alive_max_attempt"]) == defaults.keep_alive_max_attempt
    assert (
        float(env["ELASTIC_MONITOR_INTERVAL"])
        == get_args_parser().parse_args(["x"]).monitor_interval
    )
    # no round liveness, no lifelines, a new interpreter per training process: as torchrun alone
    assert env["ELASTIC_LOSS_DETECTION"] == "false"
    assert env["ELASTIC_LIFELINE"] == "false"
    assert env["ELASTIC_WARM_START"] == "false"
    # the scripts' values layered over a profile keep both (helm's -f merge)
    command = {"job": {"command": ["python", "x.py"]}}
    both = merged(command, SCRIPTS["no pg timeout"][1], TORCH_DEFAULTS)
    assert both["job"] == {"command": ["python", "x.py"], "warmStart": {"enabled": False}}
    assert both["worker"]["extraVolumeMounts"][0]["mountPath"] == "/opt/user-script"
    # and the project's own profile is the chart's defaults, liveness on
    ours = worker_env(tmp_path, SILENT_PROFILES["elastic-job"])
    assert ours["ELASTIC_LOSS_DETECTION"] == "true"


def test_the_fixed_size_job_is_the_same_chart_at_three_of_three(tmp_path: Path) -> None:
    fixed = worker_env(tmp_path, GOODPUT_PROFILES["fixed-size 3:3"])
    assert (fixed["ELASTIC_MIN_NODES"], fixed["ELASTIC_MAX_NODES"]) == ("3", "3")
    elastic = worker_env(tmp_path, GOODPUT_PROFILES["elastic-job"])
    assert (elastic["ELASTIC_MIN_NODES"], elastic["ELASTIC_MAX_NODES"]) == ("2", "3")
    differ = {k for k in fixed if fixed[k] != elastic[k]}
    assert differ == {"ELASTIC_MIN_NODES"}, "only the size differs"


def test_the_table_says_a_cut_wait_timed_out_at_the_bound_and_the_goodput_ratio() -> None:
    summary = summary_cut
    timed_out = [{"seconds": None, "timed_out": True}]
    silent = {
        "bound": 120.0,
        "summary": {
            "no pg timeout": {
                "torch defaults": summary(timed_out, "seconds"),
                "elastic-job": summary([{"seconds": 8.0}, {"seconds": 7.0}], "seconds"),
            }
        },
    }
    goodput = {
        "T": 120.0,
        "R": 60.0,
        "summary": {
            "fixed-size 3:3": {
                **summary([{"goodput": 40.0}], "goodput"),
                "cycles": summary([{"g": 38.0}, {"g": 42.0}], "g"),
                "steady": 80.0,
            },
            "elastic-job": {
                **summary([{"goodput": 60.0}], "goodput"),
                "cycles": summary([{"g": 58.0}, {"g": 62.0}], "g"),
                "steady": 80.0,
            },
        },
    }
    rows = table_lines({"silent": silent, "goodput": goodput})
    title, base, ours, ratio = rows[0]
    assert title == "silent loss, no pg timeout"
    assert base == "> 120 s (timed out, n=1)"
    assert ours.startswith("7.5 s (7.0-8.0, n=2)")
    assert ratio == ">16x"  # at least: the real wait is the script's process-group timeout
    assert rows[1][0] == "goodput, samples/s"
    assert rows[1][1].startswith("fixed 3:3: 40/s")
    assert rows[1][3] == "1.50x"
    assert rows[2][0] == "  1 loss/120 s, back in 60 s"


def test_a_run_that_timed_out_counts_as_longer_than_any_that_finished() -> None:
    summary, fmt = summary_cut, fmt_seconds
    half = summary([{"seconds": 9.0}, {"seconds": None, "timed_out": True}], "seconds")
    assert half["median"] is None  # the upper median is the cut run: not a number
    assert fmt(half, 120.0) == "> 120 s (timed out, others 9.0-9.0, n=2)"
    most = summary(
        [{"seconds": 9.0}, {"seconds": 7.0}, {"seconds": None, "timed_out": True}], "seconds"
    )
    assert most["median"] == 9.0
    assert fmt(most, 120.0) == "9.0 s (7.0-9.0, 1 > 120 s, n=3)"


def test_bench_help_names_the_churn_figures_and_that_quick_skips_the_slow_one() -> None:
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "bench"), "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        "{kill,sigterm,scaleup,bringup,rendezvous,silent,goodput,snap-loss,snap-overhead,"
        "snap-goodput}" in "".join(result.stdout.split())
    )
    assert "silent skipped" in " ".join(result.stdout.split())

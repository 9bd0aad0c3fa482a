"""bench-recovery's reading of torchrun's output (benches/recovery): the steps, the phases
of a recovery, the table, and what its profiles run. The runs themselves are scripts/bench's
(tests/bench/test_bench.py runs one figure end to end)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from testlib import ROOT

from benches.recovery.agent import ROUND_COMPLETE, Agent
from benches.recovery.cli import main, summary_lines
from benches.recovery.profiles import MONITOR_INTERVAL, PROFILES
from benches.suite.figures import PROFILES as SUITE_PROFILES
from benches.suite.figures import last_phases, reduce
from benches.worker import BY_NAME, RDZV_CONF_DEFAULT


def step(n: int, world: int, restart: int) -> str:
    # images/worker/examples/train.py's step line
    return f"[train] step={n} world_size={world} restart={restart} loss=0.1000"


@pytest.fixture
def agent() -> Agent:
    proc = subprocess.Popen(["true"], text=True)
    proc.wait()
    return Agent("agent0", proc)


def test_the_phases_of_a_recovery_are_the_first_lines_after_the_loss(agent: Agent) -> None:
    agent.lines = [
        (1.0, step(40, 3, 0)),
        (10.0, "[default] Worker group FAILED. 1/3 attempts left; will restart worker group"),
        (10.5, step(41, 3, 0)),  # printed before the failure was seen: the old world's
        (12.0, f"INFO {ROUND_COMPLETE}. Result: restart_count=1"),
        (13.0, "[train] resumed step=41"),
        (13.6, step(42, 2, 1)),
        (13.7, step(43, 2, 1)),
        (20.0, "[default] Worker group FAILED. again"),  # a later failure: not the first
    ]
    assert agent.phases(since=9.0, world=2) == {
        "failed": 1.0,
        "rendezvous": 3.0,
        "resumed": 4.0,
        "step": 4.6,
    }
    assert agent.steps(since=11.0) == [(13.6, 42, 2, 1), (13.7, 43, 2, 1)]
    assert agent.phases(since=30.0, world=2) == {}  # nothing seen since


def test_the_table_gives_the_job_the_time_of_its_slowest_survivor() -> None:
    runs: list[dict[str, object]] = [
        {"profile": "tuned", "backend": "etcd-v2", "recovered_s": {"a": 2.0, "b": 3.0},
         "restarts_used": {"a": 1, "b": 1}},
        {"profile": "tuned", "backend": "etcd-v2", "recovered_s": {"a": 5.0, "b": 4.0},
         "restarts_used": {"a": 1, "b": 2}},
        {"profile": "tuned", "backend": "etcd-v3", "recovered_s": {"a": 2.5}, "restarts_used": {}},
        {"profile": "baseline", "backend": "etcd-v2", "recovered_s": {"a": 1.0}, "hung": ["b"]},
    ]  # fmt: skip
    lines = summary_lines(runs)
    assert lines[0].split() == ["profile", "runs", "median", "s", "min-max", "s", "restarts"]
    assert lines[1].split() == ["tuned", "2", "4.0", "3.0-5.0", "1,2"]
    assert lines[2].split() == ["tuned", "(etcd-v3)", "1", "2.5", "2.5-2.5"]
    assert lines[3].split() == ["baseline", "1", "hung"]  # a hung survivor: no time


def test_a_soak_is_reported_by_its_false_evictions() -> None:
    soak: dict[str, object] = {
        "profile": "tuned-warm", "soak_minutes": 10.0, "busy_loops": 4,
        "steps": {"a": 4204}, "restarts": {"a": 0}, "false_evictions": 0,
    }  # fmt: skip
    assert summary_lines([soak]) == [
        "soak tuned-warm: 10 min, 4 busy loops, steps {'a': 4204}, restarts {'a': 0}: "
        "0 false eviction(s)"
    ]


def test_the_project_profile_is_elastic_workers_defaults_and_the_baseline_torchs() -> None:
    ours, base = PROFILES[SUITE_PROFILES["elastic-job"]], PROFILES[SUITE_PROFILES["torch defaults"]]
    assert ours.rdzv_conf == RDZV_CONF_DEFAULT
    assert ours.monitor == MONITOR_INTERVAL == float(BY_NAME["ELASTIC_MONITOR_INTERVAL"].default)
    assert (ours.warm, ours.leave, ours.lifeline) == (True, True, True)
    assert base.rdzv_conf == "" and base.monitor == 0.1  # torchrun's own defaults
    assert not (base.warm or base.leave or base.lifeline)
    # both without torch's shared agent TCPStore: with it, losing rank 0 hangs the baseline
    assert ours.env == base.env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def test_a_run_becomes_the_suites_row_with_the_phases_of_the_node_that_trained_last() -> None:
    result: dict[str, object] = {
        "recovered_s": {"agent1": 2.9, "agent2": 3.1},
        "restarts_used": {"agent1": 1, "agent2": 1},
        "steps_lost": {"agent1": 3, "agent2": 4},
        "phases_s": {
            "agent1": {"failed": 0.4, "step": 2.9},
            "agent2": {"failed": 0.5, "step": 3.1},
        },
        "hung": [],
    }
    row = reduce("kill", "elastic-job", "other", result)
    assert row == {
        "figure": "kill", "label": "elastic-job", "victim": "other", "seconds": 3.1,
        "restarts": [1], "steps_lost": 4, "error": None, "phases": {"failed": 0.5, "step": 3.1},
    }  # fmt: skip
    assert reduce("kill", "x", "other", {**result, "hung": ["agent3"]})["error"] == "hung"
    started = {"seconds": 4.3, "phases_s": {"a": {"up": 1.0, "step": 4.0}, "b": {"step": 4.3}}}
    assert last_phases(started) == {"step": 4.3}


def test_an_unknown_profile_is_refused_by_name_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--profile", "tuned,nonsense"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--profile nonsense: not a profile; pick from baseline," in err


def test_the_script_is_a_thin_entry_point_with_the_modules_command_line() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench-recovery"), "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Measure how long a lost node costs" in result.stdout
    assert "--soak MINUTES" in result.stdout
    assert len(Path(ROOT / "scripts" / "bench-recovery").read_text().splitlines()) < 20

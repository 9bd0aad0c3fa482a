"""The plots of a bench.json (benches/suite/plots.py): what each one draws from the JSON,
that `scripts/bench --replot` draws them without running anything, and that the benchmarks
page's PNGs are what it makes of the bench.json committed beside them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from testlib import ROOT

from benches.churn.goodput import Step, series
from benches.suite.plots import caption, draw_all, goodput_series, phase_bars

DOCS = ROOT / "docs" / "benchmarks"
PNG = b"\x89PNG\r\n\x1a\n"


def kill_row(label: str, seconds: float, phases: dict[str, float]) -> dict[str, Any]:
    return {"figure": "kill", "label": label, "victim": "other", "seconds": seconds,
            "restarts": [1], "phases": phases}  # fmt: skip


RESULTS: dict[str, Any] = {
    "machine": {"cpus": 2, "torch": "2.13.0+cpu", "load_average": 0.3},
    "command": "scripts/bench --quick",
    "started": "2026-11-26T10:00:00Z",
    "kill": {
        "rows": [
            kill_row("torch defaults", 45.0, {"failed": 0.5, "rendezvous": 40.0, "step": 45.0}),
            kill_row("torch defaults", 47.0, {"failed": 0.7, "rendezvous": 42.0, "step": 47.0}),
            kill_row("elastic-job", 3.0, {"failed": 0.3, "rendezvous": 1.2, "step": 3.0}),
            kill_row(
                "elastic-job", 2.8, {"failed": 0.4, "rendezvous": 1.0, "resumed": 2.2, "step": 2.8}
            ),
        ],
        "summary": {
            "torch defaults": {"runs": 2, "median": 46.0, "min": 45.0, "max": 47.0},
            "elastic-job": {"runs": 2, "median": 2.9, "min": 2.8, "max": 3.0},
        },
    },
    "goodput": {
        "T": 40.0,
        "R": 20.0,
        "losses": 2,
        "rows": [
            {"label": "fixed-size 3:3", "series": [[-20.0, 96.0], [0.0, 0.0], [40.0, 48.0]]},
            {"label": "elastic-job", "series": [[-20.0, 96.0], [0.0, 64.0], [40.0, 80.0]]},
            {"label": "elastic-job", "series": [[-20.0, 1.0]]},  # a second run: not drawn
        ],
        "summary": {
            "fixed-size 3:3": {"median": 30.0, "cycles": {"min": 20.0, "max": 40.0}},
            "elastic-job": {"median": 60.0, "cycles": {"min": 55.0, "max": 65.0}},
        },
    },
}


def test_a_recovery_bar_is_each_phase_from_the_median_of_its_times() -> None:
    bars = dict(phase_bars(RESULTS))
    assert bars["SIGKILL 1 of 3, re-formed\ntorch defaults"] == [
        ("failed", 0.0, 0.6), ("rendezvous", 0.6, 40.4), ("step", 41.0, 5.0),
    ]  # fmt: skip
    ours = bars["SIGKILL 1 of 3, re-formed\nelastic-job"]
    assert [name for name, _, _ in ours] == ["failed", "rendezvous", "resumed", "step"]
    assert ours[-1][1] + ours[-1][2] == pytest.approx(2.9)  # the bar ends at the median
    # a phase whose median comes before the one it follows gets no width, never a negative
    odd = {"kill": {"rows": [kill_row("elastic-job", 2.0, {"rendezvous": 1.5, "resumed": 1.0,
                                                          "step": 2.0})]}}  # fmt: skip
    assert dict(phase_bars(odd))["SIGKILL 1 of 3, re-formed\nelastic-job"][1] == (
        "resumed", 1.5, 0.0,
    )  # fmt: skip


def test_goodput_over_time_is_each_profiles_first_run() -> None:
    assert goodput_series(RESULTS) == {
        "fixed-size 3:3": [[-20.0, 96.0], [0.0, 0.0], [40.0, 48.0]],
        "elastic-job": [[-20.0, 96.0], [0.0, 64.0], [40.0, 80.0]],
    }


def test_the_series_bins_kept_samples_per_second_from_the_first_loss() -> None:
    steps = [Step(at=t, step=n, world=3 if t < 10 else 2) for n, t in enumerate([1, 2, 11, 12, 13])]
    # 5 s bins from 0 to 15, the first loss at 10: 2 steps of 3 ranks, none, 3 steps of 2
    assert series(steps, 0.0, 15.0, origin=10.0) == [
        [-10.0, 2 * 3 * 16 / 5], [-5.0, 0.0], [0.0, 3 * 2 * 16 / 5],
    ]  # fmt: skip


def test_the_caption_names_the_run() -> None:
    assert caption(RESULTS) == (
        "scripts/bench --quick, 2026-11-26, 2 cores (load 0.3 at the start), torch 2.13.0+cpu"
    )


def test_every_plot_with_data_is_drawn_as_a_png(tmp_path: Path) -> None:
    drawn = draw_all(RESULTS, tmp_path)
    assert [p.name for p in drawn] == ["bench.png", "recovery-phases.png", "goodput-over-time.png"]
    for path in drawn:
        assert path.read_bytes()[:8] == PNG
    # the same JSON, the same bytes: the committed plots can be checked against their JSON
    again = draw_all(
        RESULTS, tmp_path / "again" if (tmp_path / "again").mkdir() is None else tmp_path
    )
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in drawn]
    # nothing to draw, nothing written
    assert draw_all({"command": "scripts/bench --only rendezvous"}, tmp_path / "none") == []


def test_replot_draws_again_from_a_bench_json_without_running_anything(tmp_path: Path) -> None:
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(RESULTS))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench"), "--replot", str(source),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "SIGKILL 1 of 3, re-formed" in result.stdout  # the table again
    assert "46.0 s (45.0-47.0, n=2)" in result.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "bench.png", "goodput-over-time.png", "recovery-phases.png",
    ]  # fmt: skip
    assert not (tmp_path / "out" / "bench.json").exists()  # a replot writes no results


def test_the_benchmarks_pages_plots_are_drawn_from_the_committed_bench_json(
    tmp_path: Path,
) -> None:
    drawn = draw_all(json.loads((DOCS / "bench.json").read_text()), tmp_path)
    assert {"recovery-phases.png", "goodput-over-time.png"} <= {p.name for p in drawn}
    for path in drawn:
        committed = DOCS / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is not what `scripts/bench --replot docs/benchmarks/bench.json "
            f"--out docs/benchmarks` draws: run it and commit the PNGs"
        )
    shutil.rmtree(tmp_path)

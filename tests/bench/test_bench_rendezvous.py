"""scripts/bench-rendezvous's parts that need no etcd: who holds lifelines to whom, the
reduction to medians and the table, the arguments it refuses."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from testlib import ROOT

from benches.rendezvous.figure import lifeline_holders, shares, spread
from benches.rendezvous.profiles import profile
from benches.rendezvous.report import summarize, table_lines


def _report(ranks: list[int]) -> list[dict[str, Any]]:
    """One process's report: agent i holds rank ranks[i]."""
    return [{"agents": [[i, 0.0, r, len(ranks), False, f"n{i}", 0] for i, r in enumerate(ranks)]}]


def test_torchs_backends_hold_a_lifeline_from_every_other_node_etcd_lease_from_two() -> None:
    reports = _report([2, 0, 3, 1])  # agent 1 is rank 0, agent 3 rank 1, ...
    assert sorted(lifeline_holders(profile("etcd-v3"), reports, 0)) == [1, 2, 3]
    # etcd-lease: the two before it in rank order (a ring): agent 0 is rank 2
    assert lifeline_holders(profile("etcd-lease"), reports, 0) == [3, 1]
    assert lifeline_holders(profile("etcd-lease"), reports, 1) == [2, 0]  # rank 0 wraps


def test_agents_are_shared_out_evenly() -> None:
    assert shares(10, 4) == [2, 3, 2, 3]
    assert sum(shares(1022, 16)) == 1022


def test_spread_is_first_median_last() -> None:
    reports = [{"agents": [[i, 10.0 + d, 0, 3, False, None, 0] for i, d in enumerate((1, 3, 2))]}]
    assert spread(reports, 10.0) == [1.0, 2.0, 3.0]


def _row(label: str, n: int, bringup: float | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"label": label, "agents": n, **extra}
    if bringup is None:
        row["error"] = f"bring-up: 0 of {n} ranked in 60 s"
    else:
        row.update(bringup_s=bringup, kill_s=bringup / 2, silent_s=bringup * 2)
        row["join"] = {"requests": 3.0, "written_bytes": 500}
    return row


def test_the_table_shows_medians_and_torchs_backends_as_a_ratio_to_etcd_lease() -> None:
    rows = [
        _row("etcd-v2", 256, None),
        _row("etcd-v3", 256, 8.0),
        _row("etcd-v3", 256, 10.0),
        _row("etcd-lease", 256, 2.0),
        _row("etcd-lease", 256, 2.0),
    ]
    summ = summarize(rows)
    assert summ["etcd-v3"]["256"]["bringup_s"]["median"] == 9.0
    assert summ["etcd-v2"]["256"]["failed"] == ["bring-up: 0 of 256 ranked in 60 s"]
    text = "\n".join(table_lines({"rows": rows, "summary": summ, "machine": {}}))
    line = next(ln for ln in text.splitlines() if ln.startswith("bring-up, 256 agents"))
    assert "none of 1" in line  # etcd-v2: it never formed
    assert "9.00 s 4.5x" in line
    assert "2.00 s" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agents", "2"], "--agents 2: give sizes of 3 or more"),
        (["--backends", "etcd-v9"], "--backends: unknown etcd-v9"),
    ],
)
def test_bad_arguments_are_refused_naming_the_fix(args: list[str], message: str) -> None:
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / "bench-rendezvous"), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert message in result.stderr

"""scripts/bench-render: the chart rendered with N groups beside a git revision, in one run."""

from __future__ import annotations

import subprocess
import sys

from testlib import ROOT

BENCH = ROOT / "scripts" / "bench-render"


def test_it_prints_a_row_per_revision_and_group_count_from_the_system_python() -> None:
    """The working tree beside HEAD; one worker StatefulSet is as large with 2 groups as
    with 6 (each lists no other group)."""
    result = subprocess.run(
        [sys.base_prefix + "/bin/python3", str(BENCH), "--groups", "2,6", "--baseline", "HEAD"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("worktree", "2"), ("HEAD", "2"), ("worktree", "6"), ("HEAD", "6")
    ]  # fmt: skip
    sts_kib = {(r[0], r[1]): r[6] for r in rows}
    assert sts_kib[("worktree", "2")] == sts_kib[("worktree", "6")]
    # objects: 6 groups render four more StatefulSets than 2.
    assert int(rows[2][8]) - int(rows[0][8]) == 4


def test_a_bad_memory_limit_is_refused_naming_it_before_anything_renders() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--memory-limit", "lots"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "argument --memory-limit: 'lots' is not a size: write e.g. 4G or 512M" in result.stderr
    assert "helm template" not in result.stdout

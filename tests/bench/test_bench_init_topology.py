"""scripts/bench-init-topology (benches/init_topology.py): the init container's console
script against the fake API server, its figures per node, and its CPU quota argument."""

from __future__ import annotations

import subprocess
import sys

import pytest
from testlib import ROOT

from benches.init_topology import cpu_quota, fmt
from localrun.cluster.nodes import load_nodes

SCRIPT = ROOT / "scripts" / "bench-init-topology"


def test_a_cpu_quantity_is_read_as_kubernetes_writes_it() -> None:
    assert cpu_quota("200m") == pytest.approx(0.2)
    assert cpu_quota("1") == 1.0
    assert cpu_quota("1.5") == 1.5


@pytest.mark.parametrize("bad", ["abc", "0", "-100m", "m"])
def test_a_bad_cpu_limit_is_refused_naming_it_before_anything_runs(bad: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"--cpu-limit={bad}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"argument --cpu-limit: {bad!r} is not a CPU quantity: write e.g. 200m or 1" in (
        result.stderr
    )
    assert "CPU seconds" not in result.stdout  # refused before the first measurement


def test_min_median_max_in_the_columns_of_the_table() -> None:
    assert fmt([0.5, 0.1, 0.3]) == " 0.10 /  0.30 /  0.50"


def test_one_run_per_node_prints_a_row_per_node_and_all() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", "--profile", "local"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("CPU seconds, best of 3, import init_topology.main")
    assert "no CPU limit: 1 runs per node; seconds min / median / max" in lines
    rows = {
        line.split()[0]: [f for f in line.split()[1:] if f != "/"]
        for line in lines
        if line[:1].isalnum()
    }
    for node in load_nodes("local"):
        wall, cpu, rss = rows[node][0:3], rows[node][3:6], rows[node][6]
        assert wall[0] == wall[1] == wall[2] and float(wall[0]) > 0  # one run: min = max
        assert float(cpu[0]) > 0 and float(rss) > 0
    assert "all" in rows

"""scripts/bench as the README runs it: from the system python, its figures beside torch's
defaults, a JSON a user can read back, a plot; bad arguments refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testlib import ROOT

BENCH = ROOT / "scripts" / "bench"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed: scripts/bootstrap")
def test_the_rendezvous_figure_runs_from_the_system_python_and_writes_json_and_png(
    tmp_path: Path,
) -> None:
    # The system python (no torch): the script must go on in the project's venv.
    result = subprocess.run(
        ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", sys.base_prefix + "/bin/python3", str(BENCH),
         "--only", "rendezvous", "--agents", "4", "--repeat", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bring-up, 4 agents" in result.stdout
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = data["rendezvous"]["rows"]
    assert sorted(r["label"] for r in rows) == ["etcd-lease", "etcd-v2", "etcd-v3"]
    for row in rows:
        assert "error" not in row, row
        for phase in ("bringup_s", "kill_s", "silent_s"):
            assert 0 < row[phase] < 60, row
        assert row["join"]["requests"] >= 1 and row["join"]["written_bytes"] > 0
        assert row["heartbeat"]["bytes_per_beat"] > 0
    assert data["machine"]["cpus"] >= 1
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_figure_is_refused_naming_the_choices() -> None:
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(BENCH), "--only", "nonsense"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--only: invalid choice: 'nonsense'" in result.stderr
    assert "rendezvous" in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--agents", "8,x"], "--agents 8,x: give agent counts, comma-separated, e.g. 8,32"),
        (["--replot", "/nonexistent/bench.json"], "--replot /nonexistent/bench.json: no such file"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(args: list[str], message: str) -> None:
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(BENCH), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert message in result.stderr

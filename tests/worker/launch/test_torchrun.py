"""launch/torchrun.py: torch's own torchrun, with the job's exit barrier timeout (set
through torchcompat.py's fence, pinned in tests/worker/test_torchcompat_launch.py) and the moment
its worker group succeeded reported. Real torchrun (gloo, CPU) and real etcd."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from elastic_worker.launch import argv as launch
from elastic_worker.launch import torchrun
from elastic_worker.settings import config
from testlib import EtcdServer, start_etcd

from worker.worker_helpers import PYTHON, kill_tree, worker_env


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


def test_our_options_come_first_and_the_rest_is_torchruns() -> None:
    assert torchrun.split_args(["--exit-barrier-timeout=7.5", "--report=/r", "--nnodes=2"]) == (
        7.5,
        "/r",
        ["--nnodes=2"],
    )
    assert torchrun.split_args([*torchrun.argv_prefix(60, None), "x.py"]) == (60, None, ["x.py"])
    with pytest.raises(ValueError, match="--exit-barrier-timeout="):
        torchrun.split_args(["--nnodes=2"])


# Each node's program: the round's rank 0 ends at once, the other runs on (its teardown, or
# work nobody waits for: the same to torchrun).
PROGRAM = "import os, time; time.sleep(0 if os.environ['RANK'] == '0' else 120)\n"


@pytest.mark.slow
def test_a_node_whose_workers_succeeded_waits_for_the_others_the_timeout_then_exits_0(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """Two nodes; the workers of one succeed, the other's run on. torchrun alone keeps the
    first in its exit barrier for 300 s; through torchrun.py with a timeout of 3 s it
    exits 0 about 3 s after it reported its workers' success."""
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    base = worker_env(etcd.endpoint, "barrier", ELASTIC_EXIT_BARRIER_TIMEOUT="3")
    cfg = config.load(["python", str(program)], dict(base))
    env, _ = launch.build_env(cfg, None, base)
    env["LOGLEVEL"] = "INFO"  # torch's agent says where it waits: read when this fails
    nodes = []
    for n in range(2):
        report = tmp_path / f"report-{n}"
        argv = launch.build_argv(
            cfg, "127.0.0.1", python=str(PYTHON), rdzv_id="barrier", report=str(report)
        )
        out = (tmp_path / f"node-{n}.log").open("w")
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        nodes.append((proc, report, out))
    try:
        deadline = time.monotonic() + 120
        done = None
        while done is None and time.monotonic() < deadline:
            done = next((n for n in nodes if n[0].poll() is not None), None)
            time.sleep(0.1)
        logs = "\n".join(f"node-{n}:\n" + (tmp_path / f"node-{n}.log").read_text()[-3000:]
                         for n in range(2))  # fmt: skip
        assert done is not None, f"no torchrun exited within 120 s\n{logs}"
        proc, report, _ = done
        exited = time.time()
        assert proc.returncode == 0
        lines = report.read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{torchrun.SUCCEEDED} "), lines
        waited = exited - float(lines[0].split()[1])
        assert 2.5 <= waited < 60, (
            waited
        )  # the timeout (3 s), not torch's 300 s (a loaded CI: 21 s)
        other = next(n for n in nodes if n is not done)
        assert other[0].poll() is None  # its worker still runs
        assert not other[1].exists()  # and it reported nothing
    finally:
        for proc, _, out in nodes:
            kill_tree(proc.pid)
            proc.wait(30)
            out.close()


def test_the_report_path_is_not_needed_to_run(etcd: EtcdServer, tmp_path: Path) -> None:
    """Without --report (elastic-worker always passes one) torchrun runs as torch's."""
    program = tmp_path / "program.py"
    program.write_text("print('ran')\n")
    base = worker_env(etcd.endpoint, "noreport", ELASTIC_MIN_NODES="1", ELASTIC_MAX_NODES="1")
    cfg = config.load(["python", str(program)], dict(base))
    env, _ = launch.build_env(cfg, None, base)
    argv = launch.build_argv(cfg, "127.0.0.1", python=str(PYTHON), rdzv_id="noreport")
    assert not any(a.startswith(torchrun.REPORT_OPTION) for a in argv)
    result = subprocess.run(  # noqa: PLW1510 - asserted
        argv, env=env, capture_output=True, text=True, timeout=180, cwd=os.getcwd()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ran" in result.stdout

"""Measure init-topology end to end: the real console script against the fake API server
over HTTPS, as the init container runs it. Prints figures; asserts nothing.

    scripts/bench-init-topology                 # 10 runs per Node fixture, no CPU limit
    scripts/bench-init-topology --runs 30
    scripts/bench-init-topology --cpu-limit 200m  # also under a CFS quota (root, cgroup v1/v2)

Figures per fixture: wall time (min / median / max), CPU time (user+sys) and peak RSS of
the process, and the import time of the program's modules. With --cpu-limit the runs are
repeated inside a cgroup with that CPU quota, as the chart's `initTopology.resources.limits.cpu`
would impose (the target is "well under 2 s when the API answers").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benches.cgroups import joined, own_cgroup
from benches.env import VENV_BIN
from benches.stats import min_median_max
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import load_nodes


def cpu_quota(text: str) -> float:
    """A CPU quantity as Kubernetes writes it (`200m`, `1`, `1.5`) in cores."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def cpu_limit(text: str) -> str:
    """--cpu-limit: a CPU quantity of more than 0, kept as written."""
    try:
        ok = cpu_quota(text) > 0
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU quantity: write e.g. 200m or 1")
    return text


def cpu_cgroup(cores: float) -> contextlib.AbstractContextManager[Path | None]:
    """A cgroup of our own limited to `cores` CPUs (cgroup v2, else v1); None if impossible."""
    period = 100_000
    quota = max(1000, int(cores * period))
    return own_cgroup(
        f"bench-init-topology-{os.getpid()}",
        [
            (Path("/sys/fs/cgroup"), "cpu.max", f"{quota} {period}", "cgroup.procs"),
            (Path("/sys/fs/cgroup/cpu"), "cpu.cfs_quota_us", str(quota), "tasks"),
        ],
    )


def run_once(env: dict[str, str], procs: Path | None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in KiB) of one run."""
    cmd = [str(VENV_BIN / "init-topology")]
    if procs is not None:  # the whole run counts against the cgroup
        cmd = joined(procs, cmd)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0 or "info: wrote" not in err:
        raise SystemExit(f"init-topology failed ({proc.returncode}): {err.strip()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def import_seconds(statement: str) -> float:
    code = f"import time; t = time.process_time(); {statement}; print(time.process_time() - t)"
    out = subprocess.run(
        [str(VENV_BIN / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def fmt(values: list[float]) -> str:
    return min_median_max(values, 5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per fixture (default 10)")
    parser.add_argument("--profile", default="cloud", help="node profile (cloud, local, all)")
    parser.add_argument(
        "--cpu-limit", type=cpu_limit, help="also run under this CPU quota, e.g. 200m or 1"
    )
    args = parser.parse_args(argv)

    nodes = load_nodes(args.profile)
    for what, statement in [
        ("import init_topology.main (every module it runs)", "import init_topology.main"),
    ]:
        best = min(import_seconds(statement) for _ in range(3))
        print(f"CPU seconds, best of 3, {what}: {best:.2f}")
    limits: list[str | None] = [None] + ([args.cpu_limit] if args.cpu_limit else [])
    with tempfile.TemporaryDirectory(prefix="bench-init-topology-") as tmp:
        workdir = Path(tmp)
        (workdir / "inject").mkdir()
        with FakeApiServer(nodes, workdir=workdir / "api") as api:
            for limit in limits:
                with cpu_cgroup(cpu_quota(limit)) if limit else contextlib.nullcontext() as procs:
                    if limit and procs is None:
                        print(f"--cpu-limit {limit}: no writable cgroup here; skipped")
                        continue
                    label = f"CPU limit {limit}" if limit else "no CPU limit"
                    print(f"\n{label}: {args.runs} runs per node; seconds min / median / max")
                    print(f"{'node':40} {'wall':>21} {'cpu':>21} {'rss MiB':>8}")
                    walls: list[float] = []
                    for name in nodes:
                        env = {
                            "PATH": f"{VENV_BIN}:/usr/bin:/bin",
                            "NODE_NAME": name,
                            "TOPOLOGY_OUTPUT": str(workdir / "inject" / "env"),
                            "TOPOLOGY_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir),
                            **api.env(),
                        }
                        runs = [run_once(env, procs) for _ in range(args.runs)]
                        wall = [r[0] for r in runs]
                        walls += wall
                        cpu = [r[1] for r in runs]
                        rss = max(r[2] for r in runs) / 1024
                        print(f"{name[:40]:40} {fmt(wall):>21} {fmt(cpu):>21} {rss:8.1f}")
                    print(f"{'all':40} {fmt(walls):>21}")
    return 0

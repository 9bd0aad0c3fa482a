"""Measure `helm template` of the elastic-job chart with many worker groups, beside a
baseline (the chart at another git revision) in the same run. Prints figures; asserts
nothing.

    scripts/bench-render                          # 100 and 1,000 groups, baseline main
    scripts/bench-render --groups 100,1000,10000 --baseline main
    scripts/bench-render --baseline none          # the working tree only
    scripts/bench-render --memory-limit 4G        # each render in a memory cgroup (root)
    scripts/bench-render --groups 10000 --skip-schema-validation   # past the schema's bound

Per revision and group count: wall and CPU seconds and peak RSS of helm, MiB of YAML, KiB
of the largest worker StatefulSet (it should not grow with the groups), and KiB of the
manifest gzip'd and base64'd, as Helm stores it in the release's Secret (at most 1 MiB,
with the chart and the values beside it).
A render past --timeout or --memory-limit is reported as such. Each group is
`replicas: 1`, as a values file with that many groups would say.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benches.cgroups import joined, own_cgroup
from benches.env import ROOT

HELM = {"helm3": ROOT / ".tools" / "helm3" / "helm", "helm4": ROOT / ".tools" / "helm4" / "helm"}


def chart_at(ref: str, dest: Path) -> Path:
    """charts/ of `ref` (a git revision) under dest, or the working tree's for "worktree"."""
    if ref == "worktree":
        return ROOT / "charts" / "elastic-job"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "charts"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "charts" / "elastic-job"


def values_file(groups: int, dest: Path) -> Path:
    path = dest / f"groups-{groups}.yaml"
    lines = ["workerGroups:", "  default: null"]
    lines += [f"  g{i:05d}:\n    replicas: 1" for i in range(groups)]
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_bytes(text: str) -> int:
    """A size as `4G`, `512M`, `64K` or bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def memory_limit(text: str) -> int:
    """--memory-limit: a size of more than 0 bytes."""
    try:
        size = parse_bytes(text)
    except (ValueError, IndexError):
        size = 0
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 4G or 512M")
    return size


def memory_cgroup(limit: int) -> contextlib.AbstractContextManager[Path | None]:
    """A memory cgroup of our own (v2, else v1) holding `limit` bytes; None without one."""
    return own_cgroup(
        f"bench-render-{os.getpid()}",
        [
            (Path("/sys/fs/cgroup"), "memory.max", str(limit), "cgroup.procs"),
            (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", str(limit), "cgroup.procs"),
        ],
    )


@dataclass
class Render:
    """One `helm template`: what it cost, and what it made (or why it made nothing)."""

    wall: float
    cpu: float
    rss: int  # bytes
    code: int
    error: str = ""
    bytes: int = 0  # of YAML
    largest: int = 0  # bytes of the largest worker StatefulSet
    release: int = 0  # the manifest gzip'd and base64'd, as Helm keeps it in its Secret
    objects: int = 0


def render(
    helm: Path, chart: Path, values: Path, *, timeout: float, procs: Path | None, extra: list[str]
) -> Render:
    cmd = [str(helm), "template", "run42", str(chart), "--namespace", "ml", "-f", str(values)]
    cmd += extra
    if procs is not None:  # helm's memory counts against the cgroup
        cmd = joined(procs, cmd)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="bench-render-home-") as home:
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = f"{home}/{var}"
        with tempfile.TemporaryFile() as out:
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
            timed_out = False
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() - start > timeout:
                    proc.kill()
                    _, status, usage = os.wait4(proc.pid, 0)
                    timed_out = True
                    break
                time.sleep(0.05)
            wall = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            err = proc.stderr.read().decode() if proc.stderr else ""
            out.seek(0)
            text = out.read()
    result = Render(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, proc.returncode)
    if timed_out:
        result.error = f"stopped after {timeout:.0f} s"
    elif proc.returncode != 0:
        killed = proc.returncode == -9
        result.error = "killed (memory limit)" if killed else err.strip().splitlines()[-1]
    else:
        docs = text.split(b"\n---\n")
        result.bytes = len(text)
        result.largest = max(len(d) for d in docs if b"\nkind: StatefulSet\n" in d)
        result.release = len(base64.b64encode(gzip.compress(text)))
        result.objects = len(docs) - 1
    return result


def mib(n: float) -> str:
    return f"{n / 2**20:9.1f}"


def row(label: str, groups: int, r: Render) -> str:
    """The table's line for one render."""
    head = f"{label:12} {groups:7d} {r.wall:8.2f} {r.cpu:8.2f} {mib(r.rss)}"
    if r.error:
        return f"{head}  {r.error}"
    return f"{head} {mib(r.bytes)} {r.largest / 1024:8.1f} {r.release / 1024:11.1f} {r.objects:8d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--groups", default="100,1000", help="comma-separated group counts")
    parser.add_argument("--baseline", default="main", help="git revision, or none")
    parser.add_argument("--helm", default="helm3", choices=sorted(HELM))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per render")
    parser.add_argument(
        "--memory-limit", type=memory_limit, help="cap each render's memory, e.g. 4G (root)"
    )
    parser.add_argument(
        "--skip-schema-validation",
        action="store_true",
        help="render past values.schema.json's bound on workerGroups (helm's own flag)",
    )
    args = parser.parse_args(argv)
    helm = HELM[args.helm]
    if not helm.exists():
        sys.exit(f"bench-render: {helm} is missing: run scripts/bootstrap")
    counts = [int(n) for n in args.groups.split(",")]
    refs = ["worktree"] + ([args.baseline] if args.baseline != "none" else [])
    limit: int | None = args.memory_limit
    print(f"{args.helm}: helm template of charts/elastic-job, N groups of replicas: 1")
    print(
        f"{'revision':12} {'groups':>7} {'wall s':>8} {'CPU s':>8} {'RSS MiB':>9} "
        f"{'YAML MiB':>9} {'STS KiB':>8} {'release KiB':>11} {'objects':>8}"
    )
    extra = ["--skip-schema-validation"] if args.skip_schema_validation else []
    with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        work = Path(tmp)
        charts = {}
        for ref in refs:
            (work / ref).mkdir()
            charts[ref] = chart_at(ref, work / ref)
        for n in counts:
            values = values_file(n, work)
            for ref in refs:
                with memory_cgroup(limit) if limit else contextlib.nullcontext() as procs:
                    if limit and procs is None:
                        sys.exit(
                            "bench-render: --memory-limit needs a writable memory cgroup (root)"
                        )
                    r = render(
                        helm, charts[ref], values, timeout=args.timeout, procs=procs, extra=extra
                    )
                print(row(ref[:12], n, r))
        shutil.rmtree(work, ignore_errors=True)
    return 0

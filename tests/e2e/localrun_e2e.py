"""Helpers of the end-to-end scenarios: `elastic-local run` on the chart, and what it left.

Each scenario shortens training and timeouts with --set so that the whole suite stays
within about 15 minutes on 2 cores; faults fire at a training step (`@step=N`), not a
wall-clock time, so a loaded machine shifts them with the training instead of missing it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "e2e"
POD = f"{RELEASE}-elastic-job-default"  # worker pod names: POD-0, POD-1, ...
ETCD_POD = f"{RELEASE}-etcd-rendezvous-0"
RUN_TIMEOUT = 300.0  # s: the runner's --timeout unless a scenario says


# tests/e2e/user_script mounted into the pods as /opt/user-script (a hostPath volume).
USER_SCRIPT_DIR = ROOT / "tests" / "e2e" / "user_script"
USER_SCRIPT_SETS = [
    "worker.extraVolumes[0].name=user-script",
    f"worker.extraVolumes[0].hostPath.path={USER_SCRIPT_DIR}",
    "worker.extraVolumeMounts[0].name=user-script",
    "worker.extraVolumeMounts[0].mountPath=/opt/user-script",
    "worker.extraVolumeMounts[0].readOnly=true",
]


def pod(n: int) -> str:
    return f"{POD}-{n}"


def root_with_namespaces() -> str:
    if os.geteuid() != 0:
        return "needs root for network and mount namespaces"
    for tool in ("ip", "unshare", "etcd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run scripts/bootstrap"
    return ""


@dataclass
class LocalRun:
    rc: int
    summary: dict[str, Any]
    out: Path
    stdout: str
    seconds: float

    def log(self, pod_name: str, container: str = "worker") -> str:
        path = self.out / "logs" / pod_name / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def events(self) -> str:
        return (self.out / "events.log").read_text(errors="replace")

    def timeline(self, *words: str) -> str:
        """The runner's events (faults, rounds, elastic-worker's lines) and the pods' log
        lines with any of `words`: what a failed assertion on a mechanism should show."""
        keep = ("FAULT", "link ", "rendezvous round", "elastic-worker", *words)
        lines = [ln for ln in self.events().splitlines() if any(w in ln for w in keep)]
        for pod_dir in sorted((self.out / "logs").iterdir()):
            for ln in self.log(pod_dir.name).splitlines():
                if any(w in ln for w in words):
                    lines.append(f"{pod_dir.name}: {ln}")
        return "\n".join(lines)

    def steps_of(self, pod_name: str) -> list[int]:
        return [int(n) for n in re.findall(r"^\[train\] step=(\d+)", self.log(pod_name), re.M)]

    def describe(self) -> str:
        """What a failed assertion should show: the summary and the runner's output tail."""
        tail = "\n".join(self.stdout.splitlines()[-60:])
        summary = json.dumps(self.summary, indent=1)
        return f"rc={self.rc}\nsummary={summary}\n--- output tail ---\n{tail}"


def train_command(steps: int, every: int, step_seconds: float) -> str:
    args = [
        "python",
        "/opt/elastic-worker/examples/train.py",
        "--steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        "--step-seconds",
        str(step_seconds),
    ]
    return "job.command={" + ",".join(args) + "}"


def runner_argv(release: str) -> list[str]:
    """`elastic-local run` on the chart with values-examples/cpu-smoke.yaml."""
    return [
        sys.executable,
        "-m",
        "localrun.cli",
        "run",
        "--chart",
        str(ROOT / "charts" / "elastic-job"),
        "-f",
        str(ROOT / "values-examples" / "cpu-smoke.yaml"),
        "--release",
        release,
    ]


def local_command(
    tmp_path: Path,
    *args: str,
    steps: int = 30,
    every: int = 5,
    step_seconds: float = 0.5,
    sets: Iterable[str] = (),
    timeout: float = RUN_TIMEOUT,
    command: list[str] | None = None,
) -> list[str]:
    """`elastic-local run` of values-examples/cpu-smoke.yaml with the given extra args,
    its output in tmp_path; the job runs train.py (steps, every, step_seconds) unless
    `command` is given."""
    job = "job.command={" + ",".join(command) + "}" if command else None
    cmd = [
        *runner_argv(RELEASE),
        "--set",
        job or train_command(steps, every, step_seconds),
        "--output",
        str(tmp_path / "out"),
        "--json",
        str(tmp_path / "summary.json"),
        "--timeout",
        str(timeout),
        "--plain",
        "--backoff=2:20",
        "--give-up-after=4",
    ]
    for s in sets:
        cmd += ["--set", s]
    return cmd + list(args)


def finished(tmp_path: Path, rc: int, stdout: str, seconds: float) -> LocalRun:
    """What a run of `local_command(tmp_path, ...)` left."""
    (tmp_path / "runner-output.txt").write_text(stdout)
    summary_path = tmp_path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return LocalRun(rc, summary, tmp_path / "out", stdout, seconds)


def run_local(tmp_path: Path, *args: str, timeout: float = RUN_TIMEOUT, **options: Any) -> LocalRun:
    """One `elastic-local run` (local_command: `options` are its own), to its end."""
    cmd = local_command(tmp_path, *args, timeout=timeout, **options)
    start = time.monotonic()
    # SIGTERM, never SIGKILL, when the test is stopped: the runner then cleans up.
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout + 120)
    except BaseException:
        proc.terminate()
        proc.communicate(timeout=60)
        raise
    return finished(tmp_path, proc.returncode, stdout, time.monotonic() - start)


def run_user_script(
    tmp_path: Path, *args: str, command: list[str], sets: Iterable[str] = (), **options: Any
) -> LocalRun:
    """run_local of a user's own script: tests/e2e/user_script mounted at /opt/user-script,
    where `command` finds it."""
    return run_local(tmp_path, *args, command=command, sets=[*USER_SCRIPT_SETS, *sets], **options)


def multinode_command(epochs: int, save_every: int) -> list[str]:
    """tests/e2e/user_script/multinode.py, in the style of pytorch/examples' DDP tutorial:
    gloo, `epochs` of about 1 s, a snapshot on the shared claim every `save_every` epochs,
    resumed from it after a restart; it prints no `[train]` line."""
    return [
        "python", "/opt/user-script/multinode.py", str(epochs), str(save_every),
        "--snapshot-path", "/checkpoints/snapshot.pt", "--epoch-seconds", "1",
    ]  # fmt: skip


def assert_nothing_lost(run: LocalRun, final_step: int) -> None:
    """The run completed at its final step and never resumed before its last checkpoint."""
    s = run.summary
    assert s.get("completed") is True, run.describe()
    assert s["final_step"] == final_step, run.describe()
    assert s["steps_went_back_past_checkpoint"] is False, run.describe()
    assert s["etcd_complete"] in (True, None), run.describe()
    ckpts = s["checkpoint_steps"]
    for r in s["reforms"]:
        if r["resumed_step"] is None:
            continue
        before = [c for c in ckpts if c <= r["resumed_step"]]
        assert r["resumed_step"] in ckpts or not before or r["resumed_step"] >= max(before), r
    # every worker log that trained shows steps increasing, except right after a resume
    logs = sorted((run.out / "logs").glob(f"{POD}-*/worker.log"))
    assert logs, "no worker logs"
    assert any(f"[train] done step={final_step}" in p.read_text() for p in logs), run.describe()


#: What a worker must not print at the end of a job that succeeded: its own keys removed
#: from an etcd the job has just scaled to 0 (issue 23: every pod warned so at the demo's end).
END_NOISE = ("could not remove", "could not refresh", "Temporary failure in name resolution")


def assert_clean_end(run: LocalRun) -> None:
    """No worker printed a warning of the end (END_NOISE) in a run that succeeded."""
    for path in sorted((run.out / "logs").glob("*/worker.log")):
        noise = [
            ln
            for ln in path.read_text(errors="replace").splitlines()
            if any(n in ln for n in END_NOISE)
        ]
        assert not noise, f"{path.parent.name}: {noise}"


def assert_cleaned_up(run: LocalRun) -> None:
    """No namespace, link or /etc/netns entry of this run is left."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    bridge = re.search(r"bridge (e\d+)br", run.stdout)
    assert bridge, run.describe()
    prefix = bridge.group(1)
    assert f"el-{prefix}-" not in netns.stdout
    assert f"{prefix}br" not in links.stdout and f"{prefix}v" not in links.stdout
    assert (
        not list(Path("/etc/netns").glob(f"el-{prefix}-*")) if Path("/etc/netns").exists() else True
    )


def assert_taken_out_by_lifeline(run: LocalRun, dead: str, survivors: list[str]) -> None:
    """A survivor took the SIGKILLed pod's node out of torch's round through its lifeline
    (elastic_worker/recovery/lifelines/), exactly one of them said so, and nobody took a node out
    at the job's end (the pods that end then say goodbye)."""
    placed = re.search(rf"{re.escape(dead)}: scheduled on \S+, ip (\S+)", run.events())
    assert placed, run.events()[-4000:]
    took = re.compile(rf"took {re.escape(placed[1])}:\d+ out of rendezvous")
    said = [p for p in survivors if took.search(run.log(p))]
    # On a loaded host a take-out can come later than torch's heartbeat timeout (5 s), which
    # dropped the node first: then every survivor says so (recovery/round.py), and the
    # re-form came at the keep-alive's pace (the caller bounds it).
    late = re.compile(rf"{re.escape(placed[1])}:\d+ was no longer in rendezvous .* after its")
    if said or not all(late.search(run.log(p)) for p in survivors):
        assert len(said) == 1, (placed[1], said, run.events()[-4000:])
    gone = run.events().count("is gone (its lifeline closed)")
    assert gone == len(survivors), run.events()[-4000:]


def reform(run: LocalRun, cause_prefix: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        r for r in run.summary["reforms"] if r["cause"].startswith(cause_prefix)
    ]
    assert found, f"no re-form caused by {cause_prefix!r}\n{run.describe()}"
    return found[0]


def in_order(seq: list[int], want: list[int]) -> bool:
    """`want` is a subsequence of `seq`."""
    it = iter(seq)
    return all(any(x == w for x in it) for w in want)


def worker_pods(summary: dict[str, object]) -> dict[str, dict[str, object]]:
    """The chart's worker pods in a run's summary (not the rendezvous pod)."""
    pods = summary["pods"]
    assert isinstance(pods, dict)
    return {k: v for k, v in pods.items() if "-elastic-job-" in k}

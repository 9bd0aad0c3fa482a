"""The local run's own end: interrupted or SIGKILLed, it leaves nothing behind (no pods,
network namespaces, links or temporary directories), and the next run cleans up."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from localrun_e2e import (
    ROOT,
    root_with_namespaces,
    runner_argv,
)

from localrun.host.network import _state_lock, remove_stale

# Shared scenario helpers live in localrun_e2e.py, imported by name like tests/testlib.py.
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
]


def _start_runner(tmp_path: Path, release: str) -> tuple[subprocess.Popen[str], list[str]]:
    """The runner of `release` in the background; returns it and the lines it printed until
    the worker containers started. Each test has a release of its own: tests that run at the
    same time on other pytest workers must not see each other's pods."""
    cmd = [
        *runner_argv(release),
        "--plain",
        "--output",
        str(tmp_path / "out"),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if sum("container worker started" in ln for ln in lines) >= 3:
            break
    return proc, lines


def _leftovers(prefix: str) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    found = [ln for ln in netns.stdout.splitlines() if ln.startswith(f"el-{prefix}-")]
    found += [ln for ln in links.stdout.splitlines() if f" {prefix}br" in ln or f" {prefix}v" in ln]
    etc = Path("/etc/netns")
    if etc.is_dir():
        found += [str(p) for p in etc.glob(f"el-{prefix}-*")]
    found += [str(p) for p in Path(tempfile.gettempdir()).glob(f"elastic-local-{prefix}-*")]
    return found


def _processes_of(out: Path, release: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"HOSTNAME={release}-".encode() in environ or str(out).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def _describe(pids: list[int]) -> list[str]:
    """What each leftover process is: state, parent and command line."""
    out = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = dict(ln.split(":\t", 1) for ln in status.splitlines() if ":\t" in ln)
        out.append(f"{pid} {fields.get('State', '?')} ppid={fields.get('PPid', '?')} {cmd[:200]}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_removes_everything_it_made(tmp_path: Path, signum: int) -> None:
    release = f"e2eint{int(signum)}"
    proc, lines = _start_runner(tmp_path, release)
    prefix = f"e{proc.pid}"
    try:
        assert _leftovers(prefix), "the run made namespaces and links"
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, "".join(lines) + out
    assert f"interrupted by signal {int(signum)}" in out
    assert _leftovers(prefix) == []
    left = _processes_of(tmp_path / "out", release)
    assert left == [], _describe(left)


@pytest.mark.slow
def test_sigkilled_run_takes_its_pods_along_and_the_next_run_cleans_up(tmp_path: Path) -> None:
    release = "e2ekill"
    proc, _ = _start_runner(tmp_path, release)
    prefix = f"e{proc.pid}"
    # Runs that start meanwhile (other tests, on other pytest workers) remove what a killed
    # run left, under this lock: held until the leftovers are seen, they cannot.
    with _state_lock():
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 20
        while _processes_of(tmp_path / "out", release) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _processes_of(tmp_path / "out", release)
        assert left == [], f"containers die with the runner; left: {_describe(left)}"
        assert _leftovers(prefix), "namespaces of a SIGKILLed run are left until the next run"
    remove_stale()
    remaining = [x for x in _leftovers(prefix) if "elastic-local-" not in x]
    assert remaining == []

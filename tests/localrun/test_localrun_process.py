"""The container launch command: namespaces, bind mounts, exit codes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elastic_worker import exits

from localrun.cluster.runtime import BindMount
from localrun.host import process
from localrun.host.process import container_argv, launch_script


def test_script_mounts_each_volume_then_execs_the_command() -> None:
    script = launch_script(
        [
            BindMount("/tmp/pod/inject", "/etc/inject", read_only=True),
            BindMount("", "/dev/shm", tmpfs_size="67108864"),
        ],
        "demo-w-0",
        "",
    )
    lines = script.splitlines()
    assert lines[0] == "set -e"
    assert "mount --bind /tmp/pod/inject /etc/inject" in lines
    assert "mount -o remount,bind,ro /etc/inject" in lines
    assert "mount -t tmpfs -o size=67108864 tmpfs /dev/shm" in lines
    assert "hostname demo-w-0" in lines
    assert lines[-2:] == ["cd /", 'exec "$@"']


def test_argv_wraps_in_netns_and_private_namespaces() -> None:
    argv = container_argv(["ip", "netns", "exec", "ns1"], [], "p", "/w", ["etcd", "--name=a b"])
    assert argv[:4] == ["ip", "netns", "exec", "ns1"]
    for flag in ("--mount", "--pid", "--fork", "--kill-child", "--uts"):
        assert flag in argv
    assert "--mount-proc" not in argv  # the script mounts /proc once it saw the runner alive
    assert argv[argv.index("--propagation") + 1] == "private"
    assert argv[-3:] == ["sh", "etcd", "--name=a b"]  # "$0" then the command, unquoted


def test_without_namespaces_the_command_runs_as_it_is() -> None:
    assert container_argv([], [BindMount("/a", "/b")], "p", "", ["x", "y"]) == ["x", "y"]


def test_script_keeps_arguments_intact_through_sh() -> None:
    script = launch_script([], "", "/tmp")
    out = subprocess.run(
        ["sh", "-c", script, "sh", "printf", "%s|", "a b", "$HOME", "'q'"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "a b|$HOME|'q'|"


def test_exit_codes_as_kubernetes_reports_them() -> None:
    """localrun reports a container's end with the worker's own function."""
    exit_code = exits.from_returncode
    assert exit_code(0) == 0
    assert exit_code(3) == 3
    assert exit_code(-9) == 137
    assert exit_code(-15) == 143


needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for mount and PID namespaces",
)


def _container(owner_pid: int, *command: str) -> subprocess.CompletedProcess[str]:
    """A container as the runner starts one, without the network namespace (`env` in place
    of `ip netns exec NS`), watching owner_pid."""
    argv = container_argv(["env"], [], "", "/", list(command), owner_pid=owner_pid)
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


@needs_namespaces
def test_container_is_pid_1_and_sees_only_its_own_processes() -> None:
    done = _container(os.getpid(), "sh", "-c", 'echo "$$"; ls /proc | grep -c "^[0-9]"')
    assert done.returncode == 0, done.stderr
    pid, visible = done.stdout.split()
    assert pid == "1"
    assert int(visible) <= 3  # sh, ls and grep: /proc is the container's, not the host's


@needs_namespaces
def test_container_of_a_runner_that_died_does_not_start() -> None:
    """The moment util-linux 2.38 leaves open: the runner died before unshare's child set
    its parent-death signal. The container must not run its command, or nothing would
    ever stop it."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = _container(gone.pid, "echo", "ran")
    assert done.returncode == 137
    assert "ran" not in done.stdout
    assert f"the runner (pid {gone.pid}) is gone; not starting" in done.stderr


@needs_namespaces
def test_container_of_a_runner_that_is_a_zombie_does_not_start() -> None:
    """A runner SIGKILLed but not yet reaped is still in /proc, as a zombie: gone too."""
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while _state(zombie.pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        done = _container(zombie.pid, "echo", "ran")
    finally:
        zombie.wait()
    assert done.returncode == 137
    assert "ran" not in done.stdout


def test_child_whose_runner_died_during_the_fork_exits_at_once() -> None:
    """preexec_fn's check after prctl: a child whose parent is not the runner any more
    (here: never was) exits 137 instead of running unwatched."""
    child = subprocess.Popen(["sleep", "30"], preexec_fn=process._die_with(1))  # noqa: PLW1509
    assert child.wait(timeout=10) == 137


def test_child_of_a_live_runner_runs_and_gets_sigkill_when_it_dies() -> None:
    """The parent-death signal itself: a middle process (the runner's stand-in) starts a
    child with _die_with, then is SIGKILLed; the child goes with it."""
    code = (
        "import subprocess, os, sys, time\n"
        "from localrun.host import process\n"
        "c = subprocess.Popen(['sleep', '60'], preexec_fn=process._die_with(os.getpid()))\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parents[2]
    middle = subprocess.Popen(
        [sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert middle.stdout is not None
    pid = int(middle.stdout.readline())
    assert Path(f"/proc/{pid}").exists()
    middle.kill()
    middle.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _state(pid: int) -> str:
    """The process state letter from /proc/PID/stat ("" when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z", "X")

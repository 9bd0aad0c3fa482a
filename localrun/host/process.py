"""Container processes: each runs in its pod's network namespace and in mount, PID and UTS
namespaces of its own, with every volumeMount bind-mounted at its real mountPath.

    ip netns exec NS unshare --mount --propagation private --pid --fork --kill-child \
        --uts sh -c SCRIPT sh COMMAND ARGS...

SCRIPT checks that the runner is still there, mounts /proc for the new PID namespace,
bind-mounts the pod's volumes, sets the hostname to the pod name and `exec`s the
container's command, which so becomes PID 1 of the container's PID namespace, as in a
container: SIGTERM reaches only the entrypoint (and only if it handles it), SIGKILL of
PID 1 takes every process of the container with it, whatever sessions they made.

Containers die with the runner, even when it is SIGKILLed: the runner's child gets a
parent-death SIGKILL (set before exec, then checked against a runner that died during the
fork), `unshare --kill-child` passes it on to the container's PID 1, and SCRIPT closes the
gap util-linux leaves there before 2.39 (it sets that signal after fork without checking
that its parent is still alive; Debian 12 has 2.38).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from elastic_worker.exits import from_returncode

from localrun.cluster.runtime import BindMount

log = logging.getLogger(__name__)


def launch_script(
    mounts: list[BindMount], hostname: str, workdir: str, owner_pid: int | None = None
) -> str:
    """The sh script that prepares the container's mount namespace, then execs "$@".

    With owner_pid (the runner), it first exits 137 if that process is gone or a zombie, then
    mounts /proc for the container's PID namespace: before that mount /proc is the host's,
    the only place the runner can be seen from. Run after unshare set the parent-death
    signal, the check leaves no moment in which the runner can die unnoticed."""
    q = shlex.quote
    lines = ["set -e"]
    if owner_pid is not None:
        lines += [
            f"s=$(cat /proc/{owner_pid}/stat 2>/dev/null) || s=''",
            'case "${s##*) }" in ""|Z*|X*)',
            f"  echo 'elastic-local: the runner (pid {owner_pid}) is gone; not starting' >&2",
            "  exit 137;;",
            "esac",
            "mount -t proc -o nosuid,noexec,nodev proc /proc",
        ]
    for m in mounts:
        if m.tmpfs_size:
            lines.append(f"mount -t tmpfs -o size={q(m.tmpfs_size)} tmpfs {q(m.target)}")
        else:
            lines.append(f"mount --bind {q(m.source)} {q(m.target)}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {q(m.target)}")
    if hostname:
        lines.append(f"hostname {q(hostname)}")
    lines.append(f"cd {q(workdir or '/')}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def container_argv(
    netns_prefix: list[str],
    mounts: list[BindMount],
    hostname: str,
    workdir: str,
    argv: list[str],
    *,
    owner_pid: int | None = None,
) -> list[str]:
    """Full argv for one container; without namespaces (no root) the command as it is.
    owner_pid: the runner's PID, which the container checks for at start (default: ours)."""
    if not netns_prefix:
        return list(argv)
    unshare = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork"]
    unshare += ["--kill-child", "--uts"]
    owner = os.getpid() if owner_pid is None else owner_pid
    script = launch_script(mounts, hostname, workdir, owner)
    return [*netns_prefix, *unshare, "sh", "-c", script, "sh", *argv]


PR_SET_PDEATHSIG = 1
# Loaded here, not in the child: dlopen between fork and exec can deadlock on a lock that
# another thread of the runner (a log reader) held at the fork.
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with(owner: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL when the runner dies, even by SIGKILL; and if it already died
    between fork and prctl (the child now has another parent), exit at once instead."""

    def preexec() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != owner:
            os._exit(137)

    return preexec


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


class ContainerProcess:
    """One run of one container: its process, its log and the lines it prints."""

    def __init__(
        self,
        pod: str,
        container: str,
        argv: list[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        on_line: Callable[[str, str, str, float], None],
        namespaced: bool,
    ) -> None:
        self.pod = pod
        self.container = container
        self.namespaced = namespaced
        self.started = time.monotonic()
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = open(log_path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - prctl and getppid only
        )
        self._on_line = on_line
        self._reader = threading.Thread(
            target=self._read, name=f"log-{pod}-{container}", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self._log.write(line + "\n")
            self._log.flush()
            self._on_line(self.pod, self.container, line, time.monotonic())
        self._log.close()

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        self._reader.join(timeout=2)
        return from_returncode(rc)  # as Kubernetes reports it: signal N -> 128 + N

    def init_pid(self) -> int | None:
        """PID (host view) of the container's PID 1: the child of unshare."""
        if not self.namespaced:
            return self.proc.pid
        for _ in range(50):
            kids = _children(self.proc.pid)
            if kids:
                return kids[0]
            if self.proc.poll() is not None:
                return None
            time.sleep(0.01)
        return None

    def terminate(self) -> None:
        """SIGTERM to the entrypoint only, as the kubelet does."""
        pid = self.init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the whole container."""
        pid = self.init_pid() if self.namespaced else None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # PID 1 of the namespace: all others go too
        else:
            for p in [self.proc.pid, *descendants(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _tree(self) -> list[int]:
        """Every process of the container, parents before children."""
        return [self.proc.pid, *descendants(self.proc.pid)]

    def freeze(self) -> None:
        """SIGSTOP every process of the container, again until no new one appears (a
        process may fork while the first ones stop): what a frozen node does to them."""
        stopped: set[int] = set()
        for _ in range(20):
            fresh = [p for p in self._tree() if p not in stopped]
            if not fresh:
                return
            for p in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGSTOP)
                stopped.add(p)

    def thaw(self) -> None:
        """SIGCONT every process, children first and the entrypoint (the container's PID
        1) last: whatever the entrypoint must do before its children act has to be fast
        enough to win without help (a cgroup freezer thaws all at once)."""
        for p in reversed(self._tree()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)

    def wait(self, timeout: float) -> int | None:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=2)
        return from_returncode(rc)  # as Kubernetes reports it: signal N -> 128 + N

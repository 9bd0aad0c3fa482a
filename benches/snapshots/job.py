"""A job of elastic-worker agents on this machine, as pods run it: each agent a node on an
address of its own (127.0.0.x: its lifeline can listen there) with the project's defaults
(lifelines, loss detection, warm starts) and a /dev/shm of its own (ELASTIC_SNAPSHOT_DIR: a
directory per node); a private etcd. Every line an agent prints is stamped with this
process's monotonic clock when read. A node is lost as a cluster loses one: all its
processes SIGKILLed, all frozen (SIGSTOP: no socket is reset, a silent loss), or SIGTERM
to its entrypoint (a spot reclaim)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benches.env import VENV_BIN
from benches.procs import descendants, free_port, start_etcd

LOSSES = ("kill", "silent", "sigterm")


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pump(self, log: Path) -> None:
        assert self.proc.stdout is not None
        with log.open("w") as out:
            for line in self.proc.stdout:
                now = time.monotonic()
                out.write(line)
                with self._lock:
                    self.lines.append((now, line.rstrip("\n")))

    def matches(
        self, pattern: re.Pattern[str], since: float = 0.0
    ) -> list[tuple[float, re.Match[str]]]:
        with self._lock:
            found = [(t, pattern.search(line)) for t, line in self.lines if t >= since]
        return [(t, m) for t, m in found if m is not None]

    def group_rank(self) -> int | None:
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    if item.startswith(b"GROUP_RANK="):
                        return int(item.split(b"=", 1)[1])
        return None

    def lose(self, how: str) -> None:
        if how == "sigterm":
            self.proc.send_signal(signal.SIGTERM)
            return
        sig = {"kill": signal.SIGKILL, "silent": signal.SIGSTOP}[how]
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def end(self) -> None:
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@dataclass
class Job:
    workdir: Path
    etcd: subprocess.Popen[bytes]
    nodes: list[Node]

    @classmethod
    def start(cls, workdir: Path, count: int, command: list[str], job: str, **env: str) -> Job:
        etcd, endpoint = start_etcd(workdir, who="bench-snapshots")
        (workdir / "ckpt").mkdir(exist_ok=True)
        port = str(free_port())
        nodes = []
        for i in range(count):
            name = f"n{i}"
            node_env = {
                "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": os.environ.get("HOME", "/root"),
                "ELASTIC_JOB_ID": job,
                "ELASTIC_RDZV_ENDPOINT": endpoint,
                "ELASTIC_MIN_NODES": "2",
                "ELASTIC_MAX_NODES": str(count),
                "ELASTIC_INJECT_ENV": "/nonexistent/inject/env",
                "ELASTIC_GRACE_PERIOD": "30",
                "ELASTIC_LOCAL_ADDR": f"127.0.0.{41 + i}",
                "ELASTIC_LIFELINE_PORT": port,
                "ELASTIC_SNAPSHOT_DIR": str(node_memory(workdir) / name),
                "CHECKPOINT_DIR": str(workdir / "ckpt"),  # shared by the nodes
                "POD_NAME": name,
                "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                **env,
            }
            proc = subprocess.Popen(
                [str(VENV_BIN / "elastic-worker"), *command],
                env=node_env,
                cwd=workdir,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            node = Node(name, proc)
            threading.Thread(target=node.pump, args=(workdir / f"{name}.log",), daemon=True).start()
            nodes.append(node)
        return cls(workdir, etcd, nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.end()
        shutil.rmtree(node_memory(self.workdir), ignore_errors=True)
        self.etcd.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.etcd.wait(10)


def node_memory(workdir: Path) -> Path:
    """Where the nodes of the job in `workdir` keep their snapshots: /dev/shm (a memory file
    system, as a pod's is) when there is one, a directory per node below it."""
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else workdir) / f"bench-snapshots-{workdir.name}"


def wait_for(
    what: str, predicate: Callable[[], bool], timeout: float, nodes: list[Node] | None = None
) -> str:
    """An empty string once `predicate` holds, else why not: `what` timed out, or one of
    `nodes` ended (with its last lines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return ""
        for node in nodes or []:
            if node.proc.poll() is not None:
                tail = " | ".join(line for _, line in node.lines[-5:])
                return f"{node.name} exited {node.proc.returncode} waiting for {what}: {tail}"
        time.sleep(0.2)
    return f"timed out after {timeout:g} s waiting for {what}"

"""Shared helpers for the worker tests: paths, the agents' environment, process trees."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from elastic_worker.keystore import interface as kvstore
from elastic_worker.keystore.interface import KeyStore
from elastic_worker.settings import config
from testlib import EtcdServer

from benches.procs import descendants

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
WORKER = BIN / "elastic-worker"
PYTHON = BIN / "python"
TRAIN = ROOT / "images" / "worker" / "examples" / "train.py"


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    for target in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


def worker_env(endpoint: str, job_id: str, **extra: str) -> dict[str, str]:
    """The chart's variables for a local agent on 127.0.0.1 (gloo over lo)."""
    env = {
        "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "ELASTIC_JOB_ID": job_id,
        "ELASTIC_RDZV_ENDPOINT": endpoint,
        "ELASTIC_MIN_NODES": "2",
        "ELASTIC_MAX_NODES": "3",
        "ELASTIC_NPROC_PER_NODE": "1",
        "ELASTIC_INJECT_ENV": "/nonexistent/inject/env",
        "ELASTIC_GATE_TIMEOUT": "60",
        "ELASTIC_GRACE_PERIOD": "30",
        "ELASTIC_LOCAL_ADDR": "127.0.0.1",
        # Agents here share 127.0.0.1, so they cannot each hold the lifeline port:
        # the lifeline tests give each agent an address of its own and turn it on.
        "ELASTIC_LIFELINE": "false",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    env.update(extra)
    return env


@dataclass
class Agent:
    """One elastic-worker process (a local "node"), its output captured line by line."""

    name: str
    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @classmethod
    def start(cls, name: str, args: list[str], env: dict[str, str], log: Path) -> Agent:
        proc = subprocess.Popen(
            [str(WORKER), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        agent = cls(name, proc)
        agent._reader = threading.Thread(target=agent._pump, args=(log,), daemon=True)
        agent._reader.start()
        return agent

    def _pump(self, log: Path) -> None:
        assert self.proc.stdout is not None
        with log.open("w") as out:
            for line in self.proc.stdout:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                out.write(line)
                out.flush()

    def text(self) -> str:
        return "\n".join(line for _, line in list(self.lines))

    def train_lines(self, since: float = 0.0) -> list[str]:
        return [line for t, line in list(self.lines) if t >= since and line.startswith("[train]")]

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(5)
        return code

    def kill(self) -> None:
        kill_tree(self.proc.pid)


def wait_until(
    what: str, predicate: Callable[[], bool], timeout: float, every: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


#: The rendezvous backends; the worker's own keys use the backend's etcd API.
BACKENDS = ("etcd-v2", "etcd-v3")


def backend_etcd(
    etcd_factory: Callable[..., EtcdServer], backend: str, version: str = "3.4"
) -> EtcdServer:
    """A real etcd for the backend: with the v2 API on for etcd-v2, and off for etcd-v3
    (as etcd 3.6 has none), so that a v3 test cannot lean on v2 by accident."""
    return etcd_factory(v2=backend == "etcd-v2", version=version)


def keystore(etcd: EtcdServer, backend: str, job: str = "kv") -> KeyStore:
    """The worker's client for `etcd`, made as the worker makes it (kvstore.connect)."""
    env = {
        "ELASTIC_JOB_ID": job,
        "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
        "ELASTIC_RDZV_BACKEND": backend,
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "1",
        "ELASTIC_INJECT_ENV": "/nonexistent",
    }
    return kvstore.connect(config.load(["train.py"], env))


def keystore_fixtures(job: str, *backends: str) -> tuple[Any, Any, Any]:
    """The fixtures `backend`, `etcd` and `client` of a module whose tests talk to a real
    etcd as the worker does: `backend, etcd, client = keystore_fixtures(JOB)`. `backend` is
    each of BACKENDS in turn (the test's id names it), or the one backend named; `etcd` a
    real etcd for it (backend_etcd); `client` the worker's client for it, of job `job`."""
    names = backends or BACKENDS
    each = len(names) > 1

    @pytest.fixture(name="backend", params=names if each else None)
    def backend(request: pytest.FixtureRequest) -> str:
        return str(request.param) if each else names[0]

    @pytest.fixture(name="etcd")
    def etcd(etcd_factory: Callable[..., EtcdServer], backend: str) -> EtcdServer:
        return backend_etcd(etcd_factory, backend)

    @pytest.fixture(name="client")
    def client(etcd: EtcdServer, backend: str) -> KeyStore:
        return keystore(etcd, backend, job)

    return backend, etcd, client

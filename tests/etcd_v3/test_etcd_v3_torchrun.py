"""Real torchrun agents (gloo, CPU) on `--rdzv-backend=etcd-v3` against etcd with no v2
API: three form a group, one is SIGKILLed, the other two re-form and finish; then their
keys expire from etcd."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd3_helpers import count_keys
from testlib import EtcdServer
from worker.worker_helpers import kill_tree, wait_until

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
STEP = re.compile(r"\[train\] step=(\d+) world_size=(\d+) restart=(\d+)")
LEASE_TTL = 3


class Torchrun:
    def __init__(self, name: str, etcd: EtcdServer, job: str, tmp: Path) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=2:3", "--nproc-per-node=1",
            "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={etcd.endpoint}", f"--rdzv-id={job}",
            "--rdzv-conf=last_call_timeout=2,join_timeout=120,heartbeat_timeout=5,"
            f"keep_alive_interval=1,lease_ttl={LEASE_TTL}",
            "--max-restarts=5", "--monitor-interval=0.5", "--local-addr=127.0.0.1",
            str(HERE / "train_tiny.py"), "60", str(tmp / "ckpt.json"),
        ]  # fmt: skip
        env = {
            "PATH": "/usr/bin:/bin",
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            # As elastic-worker sets it (docs/recovery.md: with the agent's shared TCPStore
            # a re-formed group can read a dead peer's gloo address and hang). Each round's
            # master address then travels through this backend's store.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def steps(self) -> list[tuple[int, int, int]]:
        text = self.log.read_text(errors="replace")
        return [(int(m[1]), int(m[2]), int(m[3])) for m in STEP.finditer(text)]


@pytest.fixture
def agents(etcd3: EtcdServer, tmp_path: Path) -> Iterator[list[Torchrun]]:
    started = [Torchrun(n, etcd3, "job-v3", tmp_path) for n in ("a", "b", "c")]
    yield started
    for agent in started:
        kill_tree(agent.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.proc.wait(10)


def test_three_agents_lose_one_to_sigkill_re_form_and_finish(
    etcd3: EtcdServer, agents: list[Torchrun]
) -> None:
    a, b, c = agents
    wait_until(
        "the three agents training together",
        lambda: any(w == 3 for _, w, _ in a.steps()) and any(w == 3 for _, w, _ in c.steps()),
        timeout=120,
    )
    assert count_keys(etcd3, b"/torch/elastic/") > 0
    kill_tree(c.proc.pid, signal.SIGKILL)
    c.proc.wait(10)
    for survivor in (a, b):
        assert survivor.proc.wait(240) == 0, survivor.log.read_text()[-3000:]
        steps = survivor.steps()
        assert steps[-1][0] == 59, "the job did not run to its last step"
        after = [s for s in steps if s[1] == 2]
        assert after, "the two survivors never trained as a group of two"
        assert all(restart >= 1 for _, _, restart in after)
    # Nothing stays behind in a shared etcd: the agents' leases lapse.
    wait_until(
        "the job's keys to expire",
        lambda: count_keys(etcd3, b"/torch/elastic/") == 0,
        timeout=LEASE_TTL * 3 + 5,
    )

"""A real torchrun agent (gloo, CPU) on an etcd-v3 API backend, for the tests of etcd-v3 and
etcd-lease: its log, and the steps its worker (train_tiny.py) reported."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from testlib import EtcdServer

HERE = Path(__file__).resolve().parent
STEP = re.compile(r"\[train\] step=(\d+) world_size=(\d+) restart=(\d+)")
#: etcd-v3's lease_ttl here (its keys lapse this long after the last agent).
TTL = 3


class Torchrun:
    def __init__(
        self,
        name: str,
        etcd: EtcdServer,
        job: str,
        tmp: Path,
        *,
        steps: int = 60,
        share_opt_out: bool = True,
        backend: str = "etcd-v3",
        max_restarts: int = 5,
    ) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        conf = "last_call_timeout=2,join_timeout=120,heartbeat_timeout=5,keep_alive_interval=1"
        if backend == "etcd-v3":
            conf += f",lease_ttl={TTL}"
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=2:3", "--nproc-per-node=1",
            f"--rdzv-backend={backend}", f"--rdzv-endpoint={etcd.endpoint}", f"--rdzv-id={job}",
            f"--rdzv-conf={conf}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "--local-addr=127.0.0.1",
            str(HERE / "train_tiny.py"), str(steps), str(tmp / f"ckpt-{job}.json"),
        ]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        if share_opt_out:
            # As elastic-worker sets it (docs/recovery.md: with the agent's shared TCPStore
            # a re-formed group can read a dead peer's gloo address and hang). Each round's
            # master address then travels through this backend's store.
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def steps(self) -> list[tuple[int, int, int]]:
        text = self.log.read_text(errors="replace")
        return [(int(m[1]), int(m[2]), int(m[3])) for m in STEP.finditer(text)]

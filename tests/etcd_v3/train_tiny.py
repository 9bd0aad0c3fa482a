"""A tiny elastic training script for the etcd-v3 torchrun test: one all_reduce per step,
resumed from a shared checkpoint file after a restart."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    steps, ckpt = int(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    for step in range(start, steps):
        world = torch.ones(1)
        dist.all_reduce(world)
        print(f"[train] step={step} world_size={int(world.item())} restart={restart}", flush=True)
        if dist.get_rank() == 0:
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step + 1}))
            tmp.replace(ckpt)
        time.sleep(0.3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
